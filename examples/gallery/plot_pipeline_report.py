"""
A pipeline run and its report
=============================

``metricpipe run CONFIG`` stages the data into a chunked store, computes its statistics and
neighbour graph, trains every model of the config, encodes and evaluates them on Dask workers, and
writes an HTML report. Here a small config runs on the digits in a temporary store, on an
in-process Dask cluster; the figures below are the report's own plots.
"""

# sphinx_gallery_multi_image = "single"

import base64
import io
import re
import tempfile

import matplotlib.image as mpimg
import matplotlib.pyplot as plt
from distributed import Client, LocalCluster

from metricpipe.config import parse_config
from metricpipe.runner import run_pipeline

store = tempfile.mkdtemp(prefix="metricpipe-gallery-")
config = parse_config(
    {
        "store": store,
        "data": {"source": "digits", "split": {"test": 0.2, "seed": 0}},
        "methods": [
            {"method": "identity"},
            {"method": "pca", "dim": [8, 16, 32]},
            {"method": "lda"},
            {"method": "ncmml", "dim": [8, 16, 32], "iters": 500, "select": False},
        ],
        "neighbours": {"k": 10},
        "evaluate": {"retrieval": {"k": [1, 10]}, "classification": {"classifiers": ["knn1", "ncm"]}},
    }
)

# %%
# The same config as a YAML file would run with ``metricpipe run digits.yaml``; from Python,
# :func:`~metricpipe.runner.run_pipeline` takes the parsed config and, here, a client of an
# in-process cluster. It prints the report's path and the winner of each objective.

with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None) as cluster:
    with Client(cluster) as client:
        report = run_pipeline(config, client=client, log=lambda line: None, result=print)

# %%
# The report (``STORE/report/index.html``) embeds its figures; here they are, as it draws them:
# each metric against the code dimension, one colour per method, then the training curve of each
# learned model.

html = open(report).read()
for png in re.findall(r'src="data:image/png;base64,([^"]+)"', html):
    image = mpimg.imread(io.BytesIO(base64.b64decode(png)), format="png")
    height, width = image.shape[:2]
    fig = plt.figure(figsize=(width / 100, height / 100), dpi=100)
    fig.figimage(image)
