"""Encoded databases: a faiss product quantiser of M bytes per vector trained on a sample of codes,
every row's PQ code, and retrieval and kNN scored through the index, uncompressed queries against
the compressed database (asymmetric distances, as a retrieval system searches it).

An index is made of two parts the pipeline stores apart: the trained, empty quantiser
(``faiss.serialize_index`` bytes, :func:`train`) and the rows' codes (``sa_encode``, :func:`encode`).
:func:`filled` puts the codes of some rows back into a copy of the quantiser, with the rows as ids:
the index a search reads, and the one ``metricpipe export --faiss --pq`` writes.

Sizes: M sub-quantisers of 8 bits each (256 centroids) make M bytes per vector. Codes whose dimension
d is not a multiple of M are padded with zero columns (``Pad``: the padded columns are zero in every
row and centroid, so a code's decoding is the quantised vector itself); the unsupervised anchor rotates
raw features with OPQ first (OPQ also balances the variance of the sub-quantisers), onto 4 dimensions
per byte as faiss's guidelines advise, or onto all of d when d is smaller (:func:`rotation_dim`).
faiss is the standard library for this, as numpy is for the rest.
"""

import contextlib
import time

import numpy as np

from metricpipe.tasks import evaluation, madds
from metricpipe.tasks.errors import InputError

BITS = 8  # bits per sub-quantiser: M sub-quantisers, M bytes per vector
CENTROIDS = 1 << BITS
#: Rows a quantiser trains on at most: faiss's k-means samples 256 rows per centroid anyway
#: (``max_points_per_centroid``), and OPQ 256 x 256 rows, so more rows would not be read.
TRAIN_ROWS = CENTROIDS * 256
#: The unsupervised anchor's name in the records: faiss's OPQ + PQ of the raw (staged) features.
ANCHOR = "opq-pq"


#: faiss's k-means iterations (ClusteringParameters.niter) and OPQ's (OPQMatrix: niter outer
#: iterations of niter_pq k-means iterations each, after niter_pq_0 for its first quantiser).
KMEANS_ITERS, OPQ_ITERS, OPQ_PQ_ITERS, OPQ_PQ_ITERS_0 = 25, 50, 4, 40
#: Multiply-adds per d^2 D' of an OPQ iteration's SVD (faiss's sgesvd of a D' x d matrix, "All" of
#: both factors). Measured on one core of an AMD EPYC VM (one-thread float64 GEMM 8.8 G/s): OPQ onto
#: D' = 32, 64, 128 of 3,000 rows at 4,096-d trained in 42.7, 78.9 and 145.4 CPU s, and onto 32 at
#: 1,024 and 2,048-d in 10.6 and 16.6 s: a d-free 8.5 s plus 6.4e-8 s per d^2 D' (within 3 %) over
#: OPQ's 50 iterations, 11 GEMM multiply-adds there. LAPACK is slower against the GEMM on the Intel
#: VM with AVX-512 this module's constants come from: the rotation onto all 4,096 dimensions ran 57
#: CPU minutes there without finishing, which takes at least 28; the plan counts 30.
OPQ_SVD = 30.0


#: Dimensions OPQ rotates onto per byte of code: faiss's guideline for ``OPQ{M}_{D'}`` (D' = 4M, at
#: most d). Each of OPQ's iterations costs OPQ_SVD x d^2 D', so a rotation onto all of d costs d^3 an
#: iteration: over an hour at 4,096-d, against minutes onto 4M, for a kNN-1 error within two standard
#: errors on validation splits of Fashion-MNIST and digits (benchmarks/bench_anchor_dims.py;
#: benchmarks/README.md, "Encoded databases").
OPQ_DIMS_PER_BYTE = 4


def rotation_dim(d: int, M: int, dim: int | None = None) -> int:
    """The dimension OPQ rotates d-dimensional vectors onto for M bytes: ``dim`` if given (a multiple
    of M), else OPQ_DIMS_PER_BYTE x M, or the multiple of M at or below d when that is smaller (M when
    d < M)."""
    if dim is not None:
        if dim % M or dim <= 0:
            raise InputError(f"an OPQ rotation onto {dim} dimensions for {M} bytes; give a positive multiple of {M}")
        return int(dim)
    return max(M, min(OPQ_DIMS_PER_BYTE * M, d - d % M))


def train_cost(n: int, d: int, M: int, rotate: bool = False, rotate_dim: int | None = None) -> float:
    """Multiply-adds of :func:`train` on ``n`` rows of ``d`` dimensions (:mod:`metricpipe.tasks.madds`'s
    unit): each k-means iteration finds every row's nearest of CENTROIDS centroids in each of the M
    sub-spaces (n x 256 x d multiply-adds and n x 256 x M distances in all); with OPQ (onto D' =
    :func:`rotation_dim` dimensions) the k-means runs in D', OPQ starts from a random d x d rotation
    (a QR), and each of its iterations encodes the rows, rotates them (two n x d x D' GEMMs) and takes
    the SVD of a D' x d matrix, asking LAPACK for all of its d x d right factor (OPQ_SVD x d^2 D')."""
    n = min(n, TRAIN_ROWS)
    # each (row, centroid) distance of each sub-space is also written and scanned for the nearest: a
    # pass per pair (measured, one core: 20,000 x 64 rows, M = 16, 5.9 CPU s, 2.1x this estimate;
    # 31,250 x 512, M = 32, 3.5 s, 0.35x: faiss's k-means is not a GEMM at 4 to 16 dimensions)
    if not rotate:
        return KMEANS_ITERS * (madds.gemm(n, CENTROIDS, d, float32=True) + madds.passes(n * CENTROIDS * M))
    r = rotation_dim(d, M, rotate_dim)
    step = madds.gemm(n, CENTROIDS, r, float32=True) + madds.passes(n * CENTROIDS * M)
    rotation = 2 * madds.gemm(n, d, r, float32=True) + OPQ_SVD * d * d * r
    start = 4 / 3 * d**3 * madds.GEMM32  # the random rotation's QR (LAPACK sgeqrf and sorgqr)
    return start + (KMEANS_ITERS + OPQ_PQ_ITERS_0) * step + OPQ_ITERS * ((OPQ_PQ_ITERS + 1) * step + rotation)


def encode_cost(n: int, d: int, M: int, rotate: bool = False) -> float:
    """Multiply-adds of :func:`encode` of ``n`` rows (each row's nearest centroid in each sub-space,
    after OPQ's rotation onto :func:`rotation_dim` dimensions)."""
    if not rotate:
        return madds.gemm(n, CENTROIDS, d, float32=True)
    r = rotation_dim(d, M)
    return madds.gemm(n, CENTROIDS, r, float32=True) + madds.gemm(n, d, r, float32=True)


def _faiss():
    import faiss  # deferred: a run without encode.pq never loads it

    return faiss


def factory(d: int, M: int, rotate: bool = False, rotate_dim: int | None = None) -> str:
    """The faiss index_factory string of an M-byte quantiser of d-dimensional vectors: ``PQ{M}``,
    zero-padded to a multiple of M (``Pad{d2},PQ{M}``), or with ``rotate`` faiss's OPQ rotation onto
    :func:`rotation_dim` dimensions first: ``OPQ{M}_{D'},PQ{M}``."""
    if rotate:
        return f"OPQ{M}_{rotation_dim(d, M, rotate_dim)},PQ{M}"
    d2 = -(-d // M) * M
    return f"PQ{M}" if d2 == d else f"Pad{d2},PQ{M}"


def _metric(metric: str):
    faiss = _faiss()
    if metric not in ("l2", "ip"):
        raise InputError(f"metric: got {metric!r}; a quantiser compares vectors by 'l2' or 'ip'")
    return faiss.METRIC_INNER_PRODUCT if metric == "ip" else faiss.METRIC_L2


def _quantiser(index):
    """The IndexPQ of an index (behind its padding or rotation, and its id map)."""
    faiss = _faiss()
    index = faiss.downcast_index(index)
    if isinstance(index, faiss.IndexIDMap2):
        index = faiss.downcast_index(index.index)
    return faiss.downcast_index(index.index) if isinstance(index, faiss.IndexPreTransform) else index


@contextlib.contextmanager
def one_thread():
    """faiss on one OpenMP thread inside the block (a Dask worker's share; the measured search speed
    is a single thread's)."""
    faiss = _faiss()
    before = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)
    try:
        yield
    finally:
        faiss.omp_set_num_threads(before)


def train(
    X: np.ndarray, M: int, metric: str = "l2", rotate: bool = False, seed: int = 0, rotate_dim: int | None = None
) -> np.ndarray:
    """The trained, empty quantiser of M bytes per vector for rows like ``X`` (n, d), as
    ``faiss.serialize_index`` bytes (uint8).

    Parameters
    ----------
    X : array of shape (n_samples, d)
        The training sample (at least 256 rows: k-means' centroids per sub-quantiser).
    M : int
        Bytes per vector (sub-quantisers of 8 bits).
    metric : {"l2", "ip"}
        Squared Euclidean distance or inner product (:func:`~metricpipe.tasks.code_metric.vector_metric`).
    rotate : bool
        OPQ's learned rotation first (the unsupervised anchor), see :func:`factory`.
    seed : int
        The seed of faiss's k-means.
    rotate_dim : int, optional
        The dimension OPQ rotates onto (a multiple of M); by default :func:`rotation_dim`'s rule.

    Returns
    -------
    ndarray of uint8
    """
    faiss = _faiss()
    X = np.ascontiguousarray(X, np.float32)
    if len(X) < CENTROIDS:
        raise InputError(
            f"a product quantiser trains {CENTROIDS} centroids per sub-quantiser and got {len(X)} rows; "
            f"give at least {CENTROIDS} train rows"
        )
    index = faiss.index_factory(X.shape[1], factory(X.shape[1], M, rotate, rotate_dim), _metric(metric))
    quantiser = _quantiser(index)
    # the factory turns on polysemous training (Hamming filtering, which search never uses): 12 s of
    # a 12.02 s training of PQ4 on 500 x 16 rows
    quantiser.do_polysemous_training = False
    quantiser.pq.cp.seed = int(seed)
    quantiser.pq.cp.min_points_per_centroid = 1  # a small sample is legal: no warning on stderr
    rotation = faiss.downcast_VectorTransform(index.chain.at(0)) if rotate else None
    if rotation is not None:  # OPQ's own k-means, as it makes it but seeded and quiet on a small sample
        inner = faiss.ProductQuantizer(rotation.d_out, M, BITS)
        inner.cp.seed, inner.cp.min_points_per_centroid = int(seed), 1
        rotation.pq = inner
    with one_thread():  # bit-reproducible: faiss's k-means sums in thread order
        index.train(X)
    if rotation is not None:
        rotation.pq = None  # (``inner`` goes with this call)
    return faiss.serialize_index(index)


def code_size(trained: np.ndarray) -> int:
    """Bytes of one vector's code (faiss's ``sa_code_size``)."""
    return int(_faiss().deserialize_index(trained).sa_code_size())


def encode(trained: np.ndarray, X: np.ndarray) -> np.ndarray:
    """The PQ codes (n, code_size) uint8 of the rows of ``X`` (faiss's ``sa_encode``)."""
    index = _faiss().deserialize_index(trained)
    with one_thread():
        return index.sa_encode(np.ascontiguousarray(X, np.float32))


def decode(trained: np.ndarray, codes: np.ndarray) -> np.ndarray:
    """The vectors (n, d) that PQ codes stand for (faiss's ``sa_decode``)."""
    return _faiss().deserialize_index(trained).sa_decode(np.ascontiguousarray(codes, np.uint8))


def filled(trained: np.ndarray, codes: np.ndarray, ids: np.ndarray):
    """The searchable index of the rows ``ids`` (int64, their ids) given their PQ ``codes``: a copy of
    the trained quantiser holding the codes (faiss's ``IndexIDMap2``: search returns the ids)."""
    faiss = _faiss()
    codes, ids = np.ascontiguousarray(codes, np.uint8), np.ascontiguousarray(ids, np.int64)
    if codes.ndim != 2 or len(codes) != len(ids):
        raise InputError(f"codes of shape {codes.shape} for {len(ids)} ids; give one code per id")
    inner = faiss.deserialize_index(trained)
    out = faiss.IndexIDMap2(inner)  # (it takes an empty index: the codes go below it)
    pq = _quantiser(inner)
    pq.add_sa_codes(codes)
    inner.ntotal = pq.ntotal  # the rotation or padding in front counts them too
    faiss.copy_array_to_vector(ids, out.id_map)
    out.ntotal = len(ids)
    out.construct_rev_map()
    return out


def serialized(index) -> np.ndarray:
    """``faiss.serialize_index``: the bytes ``faiss.read_index`` reads back from a file."""
    return _faiss().serialize_index(index)


def search(index, Q: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(distances, ids) (n, k) of the k nearest indexed rows of each query, nearest first: squared
    Euclidean distances, or minus the inner product for an inner-product index (lower is nearer in
    both, as the evaluation ranks); ids -1 past the indexed rows."""
    faiss = _faiss()
    D, ids = index.search(np.ascontiguousarray(Q, np.float32), int(k))
    if index.metric_type == faiss.METRIC_INNER_PRODUCT:
        D = -D
    return D.astype(np.float32), ids.astype(np.int64)


def retrieval(
    index,
    Q: np.ndarray,
    q_idx: np.ndarray,
    db_idx: np.ndarray,
    rel_key: np.ndarray,
    ks: tuple,
    accuracy_k: int | None = None,
    group: int = 256,
) -> dict:
    """Per-query retrieval scores (:func:`metricpipe.tasks.evaluation.ranked`: ``ap``, ``prec``,
    ``recall``, ``map@r``, ...) of the queries ``Q`` (rows ``q_idx``) against the database ``index``
    of the rows ``db_idx`` (sorted; its ids), each query ranking the whole database by its asymmetric
    distances, ``group`` queries at a time."""
    n_db, parts = len(db_idx), []
    if index.ntotal != n_db:
        raise InputError(f"the index holds {index.ntotal} rows, the database {n_db}; give the index of db_idx")
    for s in range(0, len(q_idx), group):
        D, ids = search(index, Q[s : s + group], n_db)  # every row, ranked: the full-ranking mAP
        d = np.empty_like(D)
        d[np.arange(len(D))[:, None], np.searchsorted(db_idx, ids)] = D
        parts.append(evaluation.ranked(d, q_idx[s : s + group], db_idx, rel_key, ks, False, accuracy_k))
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def knn_errors(index, Q: np.ndarray, y: np.ndarray, labels: np.ndarray, ks: list, n_classes: int) -> tuple[dict, float]:
    """({knnK: (top-1, top-5 errors per query)}, seconds): kNN classification of the queries ``Q``
    (labels ``y``) by the indexed rows (``labels`` by id), and the wall time of the search itself on
    one thread (the k nearest of every query, k the largest of ``ks``, or 1 without any)."""
    with one_thread():
        t0 = time.perf_counter()
        ids = search(index, Q, max(ks, default=1))[1]
        seconds = time.perf_counter() - t0
    if not ks:
        return {}, seconds
    return evaluation.knn_errors_from(evaluation.neighbour_labels(ids, labels), y, ks, n_classes), seconds
