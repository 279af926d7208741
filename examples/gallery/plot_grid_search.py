"""
Choosing a learning rate with GridSearchCV
==========================================

A metricpipe learner fits in a scikit-learn ``Pipeline`` and in ``GridSearchCV`` like any
estimator. NCMML classifies by the nearest class mean under the learned metric, so ``score`` is its
accuracy and the search can rank candidates with no extra classifier. The class attribute
``search_space`` holds the values ``metricpipe run`` would try on its validation split.
"""

import matplotlib.pyplot as plt
import numpy as np
from sklearn.datasets import load_digits
from sklearn.model_selection import GridSearchCV, train_test_split
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from metricpipe import NCMML

X, y = load_digits(return_X_y=True)
X_train, X_test, y_train, y_test = train_test_split(X, y, test_size=0.25, stratify=y, random_state=0)

# the pipeline's candidates are 3 to 300; on standardised pixels (a larger RMS norm than the raw
# ones) 100 and more diverge, and a rate you set is yours: its divergence is an error, not a back-off
print("the pipeline's candidates for lr:", NCMML.search_space["lr"])
rates = [1.0, 3.0, 10.0, 30.0]
search = GridSearchCV(
    make_pipeline(StandardScaler(), NCMML(dim=16, iters=300, random_state=0)),
    {"ncmml__lr": rates},
    cv=3,
).fit(X_train, y_train)
print("chosen:", search.best_params_, f"cross-validated accuracy {search.best_score_:.3f}")
print(f"test accuracy of the refitted pipeline: {search.score(X_test, y_test):.3f}")

# %%
# The cross-validated accuracy of each candidate, with its spread over the three folds.

mean = search.cv_results_["mean_test_score"]
std = search.cv_results_["std_test_score"]
fig, ax = plt.subplots(figsize=(7, 4.2), layout="constrained")
ax.errorbar(rates, mean, yerr=std, marker="o", capsize=4)
best = int(np.argmax(mean))
ax.annotate("chosen", (rates[best], mean[best]), textcoords="offset points", xytext=(0, 12), ha="center")
ax.set_xscale("log")
ax.set_xlabel("NCMML lr (the step for rows of unit RMS norm)")
ax.set_ylabel("nearest-class-mean accuracy (3-fold CV)")
ax.set_title("GridSearchCV over NCMML's lr on digits")
ax.grid(alpha=0.3)
