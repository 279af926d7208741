"""SL-NE against metric-learn's LMNN on a 5,000-sample subset of Fashion-MNIST PCA-64 features.
Prints top-1 errors and the fit-time ratio measured in one run; asserts nothing about time.

    pip install "scikit-learn<1.6" "metric-learn==0.7.0"   # 0.7.0 calls check_X_y(force_all_finite=...)
    METRICPIPE_DATA=/path/to/fashion-mnist python benchmarks/bench_lmnn.py

Protocol: 5,000 training images and 2,000 test images (seeded), l2-normalised pixels, PCA to 64
dimensions fitted on the training images. LMNN learns a 32-d projection with k = 3 target
neighbours and classifies by 3-NN. SL-NE learns its similarity on the same 64-d features from the
k = 50 Euclidean neighbourhood and classifies by the soft vote of Eq. 9 over the 3 most similar of
the test image's 50 Euclidean neighbours. SL-NE's time includes building its neighbour graph.
"""

import os
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402
from sklearn.decomposition import PCA  # noqa: E402
from sklearn.neighbors import KNeighborsClassifier  # noqa: E402
from timing import fashion_subset  # noqa: E402

from metricpipe.tasks import knn, metrics, slne  # noqa: E402


def load(n_train=5000, n_test=2000, seed=0):
    Xtr, ytr, Xte, yte = fashion_subset(n_train, n_test, seed)
    pca = PCA(64, svd_solver="full", random_state=0).fit(Xtr)
    return pca.transform(Xtr).astype(np.float32), ytr, pca.transform(Xte).astype(np.float32), yte


def main():
    Xtr, ytr, Xte, yte = load()
    from metric_learn import LMNN

    t = time.perf_counter()
    lmnn = LMNN(n_components=32, n_neighbors=3, random_state=0).fit(Xtr, ytr)
    t_lmnn = time.perf_counter() - t
    err_lmnn = 1 - KNeighborsClassifier(3).fit(lmnn.transform(Xtr), ytr).score(lmnn.transform(Xte), yte)
    base = 1 - KNeighborsClassifier(3).fit(Xtr, ytr).score(Xte, yte)

    t = time.perf_counter()
    Ztr = slne.preprocess(Xtr, Xtr.mean(0), np.eye(64, dtype=np.float32))
    _, graph = knn.block_topk(Ztr, Ztr, 50, q_ids=np.arange(len(Ztr)), x_ids=np.arange(len(Ztr)), exclude_self=True)
    M, history = slne.learn_similarity(Ztr, ytr, graph, step=0.02, epochs=3)
    t_slne = time.perf_counter() - t
    Zte = slne.preprocess(Xte, Xtr.mean(0), np.eye(64, dtype=np.float32))
    _, nbr = knn.block_topk(Zte, Ztr, 50)
    sims = np.einsum("qd,qkd->qk", Zte @ M, Ztr[nbr])
    err_slne = metrics.topk_errors(metrics.softvote_ranking(ytr[nbr], sims, 10, 3), yte)[1].mean()
    print(f"Euclidean 3-NN on PCA-64: top-1 error {base:.4f}")
    print(f"metric-learn LMNN (d=32, k=3): top-1 error {err_lmnn:.4f}, fit {t_lmnn:.1f} s")
    print(
        f"SL-NE (soft vote, top 3 of 50): top-1 error {err_slne:.4f}, fit {t_slne:.2f} s (graph + SGD, {history[-1]})"
    )
    print(
        f"SL-NE / LMNN fit time = {t_slne / t_lmnn:.4f}; error difference (SL-NE - LMNN) = {err_slne - err_lmnn:+.4f}"
    )


if __name__ == "__main__":
    main()
