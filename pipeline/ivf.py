"""Approximate neighbours for large N: a faiss IVF index, built on a sample and searched by the workers.

The index is IVF-Flat when the train rows' vectors fit in IVF_FLAT_BYTES, else IVF-PQ (D/4 bytes per
vector at most 64 sub-quantizers), so one worker holds it whatever N. Steps: one task trains the
coarse quantizer (and PQ) on a seeded sample of train rows; one task per row-block encodes its
train rows (``sa_encode``: the list number and the code); the client appends the codes in block
order (``add_sa_codes``, cheap) and stores the index in the neighbours unit; then query pieces are
searched by the workers, each loading the stored index once (cached per worker). Recall@k against
exact search is measured on a seeded sample of train queries and recorded with the graph.

faiss (faiss-cpu) is the standard library for this; it runs single-threaded in a Dask worker.
"""
from functools import lru_cache

import numpy as np

from pipeline.storage import create_array, open_array, read_rows

IVF_FLAT_BYTES = 512e6
RECALL_QUERIES = 1000


def nlist_for(n_train: int) -> int:
    """About 2 sqrt(n) lists (a power of two), with at least 39 training points per list: training
    (k-means on 39 points per list) grows as nlist^2, a query scans nprobe n / nlist vectors."""
    target = 2 * np.sqrt(n_train)
    nlist = 1 << int(round(np.log2(max(target, 16))))
    return int(max(1, min(nlist, n_train // 39, 65536)))


def factory_string(n_train: int, dim: int, nlist: int) -> str:
    if n_train * dim * 4 <= IVF_FLAT_BYTES:
        return f"IVF{nlist},Flat"
    m = max(d for d in range(1, min(64, dim) + 1) if dim % d == 0 and d <= max(1, dim // 4))
    return f"IVF{nlist},PQ{m}"


def _faiss():
    try:
        import faiss
    except ImportError:  # pragma: no cover - faiss-cpu is a dependency
        from tasks.errors import InputError
        raise InputError("neighbours.method ivf needs faiss-cpu; pip install faiss-cpu") from None
    return faiss


def train(data_url: str, rows: np.ndarray, factory: str, seed: int) -> np.ndarray:
    """The trained, empty index (serialized) from the sample ``rows``."""
    faiss = _faiss()
    X = np.ascontiguousarray(read_rows(f"{data_url}/features", rows), dtype=np.float32)
    index = faiss.index_factory(X.shape[1], factory)
    ivf = faiss.extract_index_ivf(index)
    ivf.cp.seed = seed
    index.train(X)
    return faiss.serialize_index(index)


def encode(data_url: str, trained: np.ndarray, a: int, b: int) -> tuple[np.ndarray, np.ndarray]:
    """(codes, global ids) of the train rows of block a:b."""
    faiss = _faiss()
    split = open_array(f"{data_url}/split")[a:b]
    local = np.flatnonzero(split == 0)
    X = np.ascontiguousarray(open_array(f"{data_url}/features")[a:b][local], dtype=np.float32)
    index = faiss.deserialize_index(trained)
    return index.sa_encode(X), (local + a).astype(np.int64)


def build(unit_url: str, trained: np.ndarray, *parts) -> int:
    """Append every block's codes in block order and store the index as the unit's ``ivf_index``."""
    faiss = _faiss()
    index = faiss.deserialize_index(trained)
    for codes, ids in parts:
        if len(ids):
            index.add_sa_codes(codes, ids)
    blob = faiss.serialize_index(index)
    create_array(f"{unit_url}/ivf_index", blob.shape, (max(1, min(len(blob), 1 << 26)),), np.uint8)[:] = blob
    return int(index.ntotal)


@lru_cache(maxsize=2)
def _load(unit_url: str):
    faiss = _faiss()
    return faiss.deserialize_index(open_array(f"{unit_url}/ivf_index")[:])


def search(data_url: str, unit_url: str, q_rows: np.ndarray, k: int, nprobe: int) -> tuple[np.ndarray, np.ndarray]:
    """Top-k train rows (itself excluded) of the global rows ``q_rows``: (squared distances, ids)."""
    faiss = _faiss()
    index = _load(unit_url)
    faiss.extract_index_ivf(index).nprobe = nprobe
    Q = np.ascontiguousarray(read_rows(f"{data_url}/features", q_rows), dtype=np.float32)
    dist, idx = index.search(Q, k + 1)
    own = idx == np.asarray(q_rows)[:, None]
    keep = np.where(own.any(1)[:, None], ~own, np.arange(k + 1)[None, :] < k)  # drop self, else the last
    dist = dist[keep].reshape(len(Q), k).astype(np.float32)
    idx = idx[keep].reshape(len(Q), k).astype(np.int64)
    dist[idx < 0] = np.inf
    return dist, idx


def recall(exact: tuple, approx: tuple, k: int) -> float:
    """Mean share of each query's exact k neighbours that the approximate list also holds."""
    e, a = exact[1], approx[1]
    hits = [len(np.intersect1d(e[i][e[i] >= 0], a[i][a[i] >= 0])) / max(1, (e[i] >= 0).sum()) for i in range(len(e))]
    return float(np.mean(hits))
