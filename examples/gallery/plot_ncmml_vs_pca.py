"""
NCMML codes against PCA codes
=============================

A learned projection puts images of a class together where an unsupervised one keeps whatever
varies most. Here both map scikit-learn's 8 x 8 digits (64 features) to a few dimensions: PCA keeps
the directions of largest variance, NCMML (nearest-class-mean metric learning, Mensink et al.)
learns W so that each image is closest to its own class mean. Every metricpipe learner is a
scikit-learn estimator, so this runs in memory, without Dask.
"""

import matplotlib.pyplot as plt
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from sklearn.neighbors import KNeighborsClassifier

from metricpipe import LDA, NCMML, PCA

X, y = load_digits(return_X_y=True)
X_train, X_test, y_train, y_test = train_test_split(X, y, test_size=0.3, stratify=y, random_state=0)

# %%
# Two-dimensional codes
# ---------------------
# ``fit`` learns the projection from the training images, ``transform`` gives the codes of any
# images: shape (n_samples, dim).

models = {
    "PCA": PCA(dim=2),
    "NCMML": NCMML(dim=2, iters=500, random_state=0),
}
fig, axes = plt.subplots(1, 2, figsize=(10, 4.6), layout="constrained")
for ax, (name, model) in zip(axes, models.items()):
    codes = model.fit(X_train, y_train).transform(X_test)
    points = ax.scatter(codes[:, 0], codes[:, 1], c=y_test, cmap="tab10", s=12)
    ax.set_title(f"{name}: test images, 2-D codes {codes.shape}")
    ax.set_xticks([])
    ax.set_yticks([])
fig.colorbar(points, ax=axes, label="digit", ticks=range(10))

# %%
# Nearest-neighbour accuracy against the code dimension
# -----------------------------------------------------
# The codes of these learners are compared by Euclidean distance (their ``code_metric``), so
# scikit-learn's default ``KNeighborsClassifier`` ranks them as the pipeline does. LDA has at most
# n_classes - 1 = 9 directions.

dims = [2, 4, 8, 16, 32]
learners = {
    "PCA": lambda d: PCA(dim=d),
    "LDA": lambda d: LDA(dim=min(d, 9)),
    "NCMML": lambda d: NCMML(dim=d, iters=500, random_state=0),
}
fig, ax = plt.subplots(figsize=(7, 4.2), layout="constrained")
for (name, make), marker in zip(learners.items(), "osD"):
    accuracy = []
    for d in dims:
        model = make(d).fit(X_train, y_train)
        knn = KNeighborsClassifier(n_neighbors=1).fit(model.transform(X_train), y_train)
        accuracy.append(knn.score(model.transform(X_test), y_test))
    ax.plot(dims, accuracy, marker=marker, label=name)
    print(f"{name:6s} 1-NN accuracy at dim {dims}: {[round(a, 3) for a in accuracy]}")
ax.set_xscale("log", base=2)
ax.set_xticks(dims, [str(d) for d in dims])
ax.set_xlabel("code dimension")
ax.set_ylabel("1-NN accuracy on the test images")
ax.legend()
ax.grid(alpha=0.3)
