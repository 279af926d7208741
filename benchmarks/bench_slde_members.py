"""SL-DE's member rule on low-dimensional sets: 8 members (the default before 0.3.8) against the rule
(members: null, blocks of at least 16 PCA directions), softvote10 error on a validation share carved
from the training images (never the test split; another share stops early), mean of 3 seeds.

    METRICPIPE_DATA=... python benchmarks/bench_slde_members.py
"""

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from bench_defaults import fashion_arrays
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

from metricpipe import SLDE
from metricpipe.tasks import evaluation


def l2(X):
    return X / np.maximum(np.linalg.norm(X, axis=1, keepdims=True), 1e-12)


sets = {}
X, y = load_digits(return_X_y=True)
sets["digits-l2 (p=64)"] = (l2(X.astype(np.float32)), y, None)
F, yf, sp = fashion_arrays()
tr = np.flatnonzero(sp == "train") if sp.dtype.kind in "US" else np.flatnonzero(sp == 0)
rng = np.random.default_rng(0)
tr = rng.choice(tr, 6000, replace=False)
F7 = F[tr].reshape(-1, 7, 4, 7, 4).mean((2, 4)).reshape(len(tr), -1)
sets["fashion 7x7 (p=49)"] = (l2(F7), yf[tr], None)
F14 = F[tr].reshape(-1, 14, 2, 14, 2).mean((2, 4)).reshape(len(tr), -1)
sets["fashion 14x14, input_dim 96"] = (l2(F14), yf[tr], 96)
for name, (X, y, idim) in sets.items():
    X = X.astype(np.float32)
    Xtr, Xv, ytr, yv = train_test_split(X, y, test_size=0.3, stratify=y, random_state=1)
    Xes, Xsc, yes, ysc = train_test_split(
        Xv, yv, test_size=0.5, stratify=yv, random_state=2
    )  # early stopping / scoring
    p = min(idim or X.shape[1], X.shape[1])
    from sklearn.neighbors import NearestNeighbors

    nbr = NearestNeighbors(n_neighbors=50).fit(Xtr).kneighbors(Xsc, return_distance=False)
    for label, members in (("8 members (old)", 8), ("rule (new)", None)):
        errs = []
        for seed in range(3):
            for step in (0.05, 0.02):
                est = SLDE(members=members, input_dim=idim, step=step, random_state=seed).fit(
                    Xtr, ytr, X_val=Xes, y_val=yes
                )
                errs.append((step, seed, evaluation.validation_score(est, "softvote10", Xsc, ysc, Xtr, ytr, nbr)))
        by_step = {s: np.mean([e for st, _, e in errs if st == s]) for s in (0.05, 0.02)}
        print(
            f"{name}: {label} ({SLDE(members=members).n_members(p)} x {SLDE(members=members, input_dim=idim).member_size(p)}): "
            + ", ".join(f"step {s}: {v:.4f}" for s, v in by_step.items()),
            flush=True,
        )
