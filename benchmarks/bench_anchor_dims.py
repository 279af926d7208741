"""The unsupervised anchor's OPQ output dimension (issue 48): faiss's OPQ{M}_{D'},PQ{M} of the raw
features for D' = 4M (the pipeline's rule, ``pq.rotation_dim``), 8M, 16M and all of d, on a validation
split of the train rows only: the quantiser trains on the rest of the train rows, at most 2,000 of the
held-out rows (a fifth of the train rows, at most 10,000) are classified by kNN-1 against them, and at
most 1,000 rank the held-out rows (mAP), through the index as the evaluate stage does. Prints each
training's CPU seconds (one thread) and the kNN-1 error's standard error; asserts nothing.

    python benchmarks/bench_anchor_dims.py                          # Fashion-MNIST, M = 8, 16, 32
    python benchmarks/bench_anchor_dims.py --data '{source: digits}' --sizes 8,16
    python benchmarks/bench_anchor_dims.py --dims 4,8,16 --rows 60000 --data '{path: S.zarr}'
                                             # the first 60,000 rows of bench_imagenet_shape.py's synth file
"""

import argparse
import time

import faiss
import numpy as np
import yaml

from metricpipe.config import parse_config
from metricpipe.sources import open_source
from metricpipe.tasks import pq


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default="{source: fashion-mnist}", help="a config's data: block (YAML)")
    ap.add_argument("--sizes", default="8,16,32", help="bytes per vector M")
    ap.add_argument("--dims", default="4,8,16,0", help="D' per byte (0: all of d)")
    ap.add_argument("--plain", action="store_true", help="also PQ without a rotation (PQ{M} of the features)")
    ap.add_argument("--rows", type=int, default=0, help="read only the first ROWS rows (0: all)")
    args = ap.parse_args()
    # the project's own readers (data.root, $METRICPIPE_DATA or Debian's package for Fashion-MNIST)
    src = open_source(parse_config({"data": yaml.safe_load(args.data)}).data)
    n = args.rows or src.reader.shape[0]
    train = np.arange(n) if src.split is None else np.flatnonzero(np.asarray(src.split)[:n] == "train")
    X = src.reader.read(0, n)[train].astype(np.float32)  # the test rows are never used here
    _, y = np.unique(np.asarray(src.labels)[:n][train], return_inverse=True)  # class codes 0..C-1
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    n_val = min(10000, len(train) // 5)
    perm = np.random.default_rng(0).permutation(len(train))
    tr, va = np.sort(perm[:-n_val]), np.sort(perm[-n_val:])  # rows of X: to train, to validate
    d, n_knn, n_map = X.shape[1], min(2000, n_val), min(1000, n_val)
    print(f"{src.name}: {len(tr):,} train rows of {d} dimensions, {n_val:,} validation rows")

    def scores(db, vdb):
        """(kNN-1 error, its standard error, mAP) of the validation queries through the indexes."""
        errs, _ = pq.knn_errors(db, X[va[:n_knn]], y[va[:n_knn]], y, [1], int(y.max()) + 1)
        err = float(np.mean(errs["knn1"][0]))
        r = pq.retrieval(vdb, X[va[:n_map]], va[:n_map], va, y, (10,))
        return err, np.sqrt(err * (1 - err) / n_knn), float(np.nanmean(r["ap"]))

    def exact(rows):
        index = faiss.IndexIDMap2(faiss.IndexFlatL2(d))
        index.add_with_ids(X[rows], rows.astype(np.int64))
        return index

    # the uncompressed features, searched exactly: what the quantisers lose is measured from here
    print("raw features, exact: kNN-1 err %.4f (SE %.4f), mAP %.4f" % scores(exact(tr), exact(va)), flush=True)
    for M in [int(a) for a in args.sizes.split(",")]:
        outs = {d - d % M if k == 0 else min(k * M, d - d % M) for k in map(int, args.dims.split(","))}
        for dout in ([None] if args.plain else []) + sorted(outs):
            t = time.process_time()
            trained = pq.train(X[tr], M, "l2", rotate=dout is not None, seed=0, rotate_dim=dout)
            secs = time.process_time() - t
            err, se, ap = scores(
                pq.filled(trained, pq.encode(trained, X[tr]), tr), pq.filled(trained, pq.encode(trained, X[va]), va)
            )
            what = "PQ, no rotation" if dout is None else f"OPQ out {dout:4d}"
            what += " (the rule)" if dout == pq.rotation_dim(d, M) else ""
            print(
                f"M {M:2d} {what}: train {secs:7.1f} CPU s, kNN-1 err {err:.4f} (SE {se:.4f}), mAP {ap:.4f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
