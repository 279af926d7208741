"""The unsupervised anchor's OPQ output dimension (issue 48): faiss's OPQ{M}_{D'},PQ{M} of the raw
Fashion-MNIST pixels for D' = 4M, 8M, 16M and all of d (the pipeline's anchor today), on a validation
split of the train rows only: the quantiser trains on 50,000 train rows, 2,000 of the 10,000 held-out
rows are classified by kNN-1 against them, and 1,000 rank the 10,000 held-out rows (mAP), through the
index as the evaluate stage does. Prints each training's CPU seconds (one thread); asserts nothing.

    python benchmarks/bench_anchor_dims.py [8,16,32]
"""

import sys
import time

import numpy as np

from metricpipe.config import parse_config
from metricpipe.sources import open_source
from metricpipe.tasks import pq


def main():
    # the project's own reader of the IDX files (data.root, $METRICPIPE_DATA or Debian's package)
    src = open_source(parse_config({"data": {"source": "fashion-mnist"}}).data)
    train = np.flatnonzero(np.asarray(src.split) == "train")  # the test images are never read here
    X = src.reader.read(0, src.reader.shape[0])[train].astype(np.float32)
    y = np.asarray(src.labels)[train].astype(np.int64)
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    rng = np.random.default_rng(0)
    perm = rng.permutation(len(train))
    tr, va = np.sort(perm[:-10000]), np.sort(perm[-10000:])  # rows of X: 50,000 to train, 10,000 to validate
    real = pq.factory
    Ms = [int(a) for a in sys.argv[1].split(",")] if len(sys.argv) > 1 else [8, 16, 32]
    for M in Ms:
        for mult in (4, 8, 16, None):
            d = X.shape[1]
            dout = d - d % M if mult is None else mult * M
            pq.factory = lambda d, M_, rotate=False, _o=dout: f"OPQ{M_}_{_o},PQ{M_}" if rotate else real(d, M_, rotate)
            t = time.process_time()
            trained = pq.train(X[tr], M, "l2", rotate=True, seed=0)
            secs = time.process_time() - t
            db = pq.filled(trained, pq.encode(trained, X[tr]), tr)
            errs, _ = pq.knn_errors(db, X[va[:2000]], y[va[:2000]], y, [1], 10)
            vdb = pq.filled(trained, pq.encode(trained, X[va]), va)
            r = pq.retrieval(vdb, X[va[:1000]], va[:1000], va, y, (10,))
            print(
                f"M {M:2d} OPQ out {dout:3d}: train {secs:6.1f} CPU s, kNN-1 err {np.mean(errs['knn1'][0]):.4f}, mAP {np.mean(r['ap']):.4f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
