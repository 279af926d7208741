"""What the commands beyond ``metricpipe run`` do (`metricpipe.cli` parses their options):

export   encode new rows with a stored model, export models (npz, faiss)
assess   evaluate embeddings a user brings (``metricpipe evaluate``)
classes  add classes to a trained NCM model, predict with it
synth    write a synthetic data set for scale tests
gc       the store's units no run or model refers to
"""
