"""The ``encode:`` section: what the encode stage writes besides every model's float codes (encoded
databases: a product quantiser of each size, per model and for the raw features)."""

from dataclasses import dataclass

from metricpipe.config.schema import Reading, Section, setting
from metricpipe.tasks.validate import whole_number

MAX_PQ_BYTES = 4096  # bytes per vector: past a 1,024-d float code's own size


def _sizes(v, rd: Reading, key: str) -> tuple:
    """Bytes per vector: one size or a list of distinct ones (null or []: none), sorted."""
    if v is None:
        return ()
    sizes = [whole_number(x) for x in v] if isinstance(v, list) else [whole_number(v)]
    if not all(isinstance(x, int) and not isinstance(x, bool) and 1 <= x <= MAX_PQ_BYTES for x in sizes):
        rd.fail(key, f"expected bytes per vector, integers from 1 to {MAX_PQ_BYTES} (e.g. [8, 16, 32]), got {v!r}")
    twice = sorted({x for x in sizes if sizes.count(x) > 1})
    if twice:
        rd.fail(key, f"{twice[0]} is listed twice; list each size once")
    return tuple(sorted(sizes))


@dataclass(frozen=True)
class EncodeConfig(Section):
    pq: tuple = setting(
        (),
        "Bytes per vector of the encoded databases: per size, a faiss product quantiser of each model's "
        "codes and faiss's OPQ + PQ of the raw features, searched by the evaluation ([]: none)",
        parse=_sizes,
        shown="int in [1, 4096], or a list of them",
    )
