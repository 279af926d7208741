"""``metricpipe export --faiss PATH --pq M``: the encoded database a run stored for a model (its product
quantiser of M bytes per vector, ``encode.pq``) as a faiss index file of the ``--split`` rows, ids
the rows' positions in the staged data: the index the evaluate stage searched."""

import numpy as np

from metricpipe.commands.export import model_and_data, split_rows, written_whole
from metricpipe.stages import pq as pq_units
from metricpipe.store import Store
from metricpipe.tasks.errors import InputError


def encoded_units(store: Store, model: str) -> dict:
    """{bytes per vector (encode.pq): committed pq unit} of model ``model`` in the last run."""
    try:
        rels = store.last_run()["units"].get("pq") or []
    except InputError:  # no finished run (or a damaged record): it made none
        rels = []
    out = {}
    for rel in rels:
        unit = store.unit(*rel.split("/"))
        if unit.done() and unit.meta().get("model") == model:
            out[int(unit.meta()["pq_bytes"])] = unit
    return out


def export_encoded(store_url: str, key: str, path: str, split: str, pq_bytes: int) -> dict:
    """Write model KEY's stored encoded database of ``pq_bytes`` bytes per vector, restricted to the
    ``split`` rows, to ``path``; returns what was written."""
    import faiss  # deferred: only this command writes a faiss file

    store, unit, meta, _, _ = model_and_data(store_url, key)
    found = encoded_units(store, unit.key)
    if pq_bytes not in found:
        have = ", ".join(map(str, sorted(found)))
        raise InputError(
            f"{store.url}: --pq {pq_bytes}: model {unit.key} has no encoded database of {pq_bytes} bytes per "
            + (
                f"vector; the run's encode.pq made {have}: give one of them"
                if found
                else "vector: the last run made none for it (its encode.pq, or codes not in a vector space); "
                "export the float codes without --pq"
            )
        )
    encoded = found[pq_bytes]
    bad = encoded.verify()
    if bad:
        raise InputError(
            f"{store.url}: the encoded database of model {unit.key} is damaged: {bad[0]}; rerun the run "
            f"that made it with --repair (metricpipe run CONFIG --repair) to recompute it"
        )
    rows = split_rows(store, meta, split)
    if not len(rows):
        raise InputError(f"{store.url}: the {split} split is empty (--split); choose another split")
    index = pq_units.index_of(encoded.url, np.asarray(rows, np.int64))
    with written_whole(path, "--faiss") as tmp:
        faiss.write_index(index, tmp)
    info = encoded.meta()
    return {
        "rows": len(rows),
        "pq_bytes": pq_bytes,
        "bytes_per_vector": info["bytes_per_vector"],
        "index": info["index"],
        "metric": "inner product" if info["metric"] == "ip" else "L2",
        "model": unit.key,
        "out": path,
    }
