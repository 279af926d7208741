"""SLNE, SLDE and SparseProjector as scikit-learn estimators: the common checks, the in-memory fit
against the pipeline's entry points, the stored-state round trip, and a grid search on digits."""

import json

import numpy as np
import pytest
from sklearn.base import clone

from metricpipe.tasks import slne
from metricpipe.tasks.errors import InputError
from metricpipe.tasks.slne import SLDE, SLNE
from metricpipe.tasks.sparse import SparseProjector
from tests.conftest import make_blobs

# scikit-learn's estimator checks for these classes: tests/tasks/test_estimator_checks.py


def _data(n=300, d=16, seed=0):
    X, y = make_blobs(n=n, d=d, classes=4, seed=seed, sep=0.8)
    return X + 1.0, y


def _assert_same_state(a: dict, b: dict, atol=0.0):
    """Equal fitted states: bit for bit (atol 0), or arrays within atol and the rest equal up to
    floats within atol (the histories' hinge sums)."""
    assert set(a) == set(b)
    for k in a:
        va, vb = a[k], b[k]
        if hasattr(va, "toarray"):
            va, vb = va.toarray(), vb.toarray()
        if isinstance(va, np.ndarray):
            np.testing.assert_allclose(va, vb, rtol=0, atol=atol, err_msg=k) if atol else np.testing.assert_array_equal(
                va, vb, err_msg=k
            )
        else:
            assert _close(va, vb, atol), k


def _close(a, b, atol) -> bool:
    """Equal JSON-able values, floats within atol (relative to their size)."""
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k], atol) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_close(u, v, atol) for u, v in zip(a, b))
    if isinstance(a, float):
        return a == pytest.approx(b, rel=atol, abs=atol)
    return a == b


def _blockwise(f, X, rows=70):
    """f applied row-block by row-block, as the pipeline's driver reads the rows."""
    return np.concatenate([f(X[s : s + rows]) for s in range(0, len(X), rows)])


def test_slne_fit_is_fit_space_on_the_statistics_and_graph():
    X, y = _data()
    est = SLNE(dim=6, input_dim=10, step=0.05, n_neighbors=12, random_state=3)
    a = clone(est).fit(X, y)
    mean, comps = slne.pca_statistics(X)  # what the statistics stage stores
    g = slne.knn_graph(X, 12)  # what the neighbours stage stores
    b = clone(est).fit_space(est.input_rows(X, mean, comps), y, g, mean, comps)
    _assert_same_state(a.fitted_state(), b.fitted_state())  # bit for bit
    np.testing.assert_array_equal(a.transform(X), b.transform(X))
    # the driver maps the rows block by block: float32 products of other row counts may round the
    # last bit of Z differently (the documented tolerance)
    Z = _blockwise(est.input_map(mean, comps), X)
    c = clone(est).fit_space(Z, y, g, mean, comps)
    _assert_same_state(a.fitted_state(), c.fitted_state(), atol=1e-5)
    np.testing.assert_allclose(a.transform(X), c.transform(X), rtol=0, atol=1e-5)


def test_slde_fit_is_its_members_then_assemble():
    X, y = _data()
    est = SLDE(members=3, member_dim=4, input_dim=12, refine=True, step=0.05, epochs=2, dim=9, random_state=1)
    a = clone(est).fit(X, y)
    mean, comps = slne.pca_statistics(X)
    g = slne.knn_graph(X, est.n_neighbors)
    for blocks, atol in ((len(X), 0.0), (70, 1e-5)):  # in one block: bit for bit; by blocks: see above
        members = []
        for n in reversed(range(3)):  # in any order, as workers finish
            Zn = _blockwise(est.member_map(mean, comps, n), X, blocks)
            members.append(slne.fit_member(est.member_params(), Zn, y, g, est.member_seed(n)))
        Z = _blockwise(est.input_map(mean, comps), X, blocks)
        b = clone(est).assemble(members[::-1], mean, comps, Z, y, g)
        _assert_same_state(a.fitted_state(), b.fitted_state(), atol)
        np.testing.assert_allclose(a.transform(X), b.transform(X), rtol=0, atol=atol)


@pytest.mark.parametrize("validation", [0, 40])
def test_sparse_fit_is_fit_subset_on_the_stratified_rows(validation):
    """fit holds a stratified share out of the training subset for early stopping (validation > 0)."""
    from metricpipe.tasks import stream

    X, y = _data()
    est = SparseProjector(
        dim=5, sparsity=0.7, queries=20, train_size=150, max_iter=8, validation=validation, random_state=6
    )
    a = clone(est).fit(X, y)
    mean, comps = slne.pca_statistics(X)
    held = stream.validation_split(y, validation, stream.row_keys(X), 6) if validation else np.array([], int)
    among = np.setdiff1d(np.arange(len(X)), held)
    rows = among[stream.sample(y[among], 150, stream.row_keys(X)[among], 6, stream.SUBSET)]
    assert not np.isin(rows, held).any()
    val = {"X_val": X[held], "key_val": y[held]} if validation else {}
    b = clone(est).fit_subset(X[rows], y[rows], mean, comps, **val)
    _assert_same_state(a.fitted_state(), b.fitted_state())
    np.testing.assert_array_equal(a.transform(X), b.transform(X))
    assert (a.val_map_ is None) == (validation == 0) and a.best_iter_ == b.best_iter_


@pytest.mark.parametrize("d", [100, 20])
def test_sparse_default_dim_is_64_projectors_or_every_direction_when_fewer(d):
    """Without dim, R = 64 (compact codes, as the paper's 32 to 256), or D when D is smaller."""
    X, y = _data(n=200, d=d)
    est = SparseProjector(queries=10, train_size=100, max_iter=2, validation=0).fit(X, y)
    assert est.projectors_.shape == (d, min(d, 64)) and est.transform(X).shape == (200, min(d, 64))


@pytest.mark.parametrize(
    "est",
    [
        SLNE(dim=5, epochs=2),
        SLDE(members=2, member_dim=3, epochs=1, refine=True),
        SparseProjector(dim=4, max_iter=4, queries=10),
        SparseProjector(dim=3, sparsity=0.0, max_iter=3),
    ],
    ids=["slne", "slde", "sparse", "dense"],
)
def test_from_state_round_trip_gives_identical_transform(est):
    X, y = _data(n=200)
    fitted = clone(est).fit(X, y)
    state = fitted.fitted_state()
    for k, v in state.items():  # what the pipeline stores: arrays, sparse arrays, JSON
        if not (isinstance(v, np.ndarray) or hasattr(v, "tocsc")):
            json.dumps(v)
    # arrays as the store gives them back (fresh C-ordered copies)
    stored = {k: (np.array(v, order="C") if isinstance(v, np.ndarray) else v) for k, v in state.items()}
    back = type(est).from_state(fitted.get_params(), stored)
    np.testing.assert_array_equal(back.transform(X), fitted.transform(X))
    assert back.cost() == fitted.cost()
    if hasattr(fitted, "exact_views"):
        for u, v in zip(back.exact_views(X), fitted.exact_views(X)):
            np.testing.assert_array_equal(u, v)


def test_grid_search_over_slne_on_digits():
    from sklearn.datasets import load_digits
    from sklearn.model_selection import GridSearchCV
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    def nn1_accuracy(estimator, X, y):
        """1-NN accuracy within the fold by the codes' inner product (SL-NE's similarity)."""
        C = estimator.transform(X)
        S = C @ C.T
        np.fill_diagonal(S, -np.inf)
        return float(np.mean(y[np.argmax(S, axis=1)] == y))

    X, y = load_digits(return_X_y=True)
    X, y = X[:600], y[:600]
    search = GridSearchCV(
        make_pipeline(StandardScaler(), SLNE(input_dim=32, epochs=2, n_neighbors=10)),
        {"slne__input_dim": [8, 32]},
        scoring=nn1_accuracy,
        cv=3,
    )
    search.fit(X, y)
    scores = search.cv_results_["mean_test_score"]
    assert search.best_params_["slne__input_dim"] == [8, 32][int(np.argmax(scores))]
    assert np.all(scores > 0.7) and scores.max() > scores.min()
    assert search.best_estimator_.transform(X[:5]).shape[0] == 5


@pytest.mark.parametrize("train_size", [60, 10_000])
def test_sparse_refit_params_keep_the_fit_when_train_size_capped_its_subset(train_size):
    """A refit on more rows draws as many as train_size: with the subset capped, refit_params says keep
    this fit (None); else the refit repeats the kept iteration on every row, validation off."""
    X, y = _data()
    est = SparseProjector(dim=5, sparsity=0.7, queries=20, train_size=train_size, max_iter=8, validation=40)
    est.fit(X, y)
    assert est.best_iter_ is not None
    if train_size < len(X) - 40:
        assert est.subset_capped_ and est.refit_params() is None
    else:
        assert not est.subset_capped_ and est.refit_params() == {"stop_iter": est.best_iter_, "validation": 0}
    assert clone(est).set_params(validation=0).fit(X, y).refit_params() == {}  # no validation: nothing to repeat


def test_slde_refit_repeats_each_member_s_kept_epoch():
    """refit_params gives each member the epoch it kept on validation (member_epochs), and a fit with
    member_epochs trains member n for exactly member_epochs[n] epochs (fit_member with that epochs)."""
    X, y = _data()
    Xv, yv = _data(n=120, seed=5)
    est = SLDE(members=3, member_dim=4, input_dim=12, step=0.2, epochs=4, random_state=2)
    fitted = clone(est).fit(X, y, X_val=Xv, y_val=yv)
    kept = [min((h["val_error"], h["epoch"]) for h in m["history"] if "val_error" in h)[1] for m in fitted.history_]
    assert fitted.refit_params() == {"member_epochs": kept}
    assert clone(est).fit(X, y).refit_params() == {}  # no validation: nothing to repeat
    epochs = [0, 2, 1]
    a = clone(est).set_params(member_epochs=epochs).fit(X, y)
    mean, comps = slne.pca_statistics(X)
    g = slne.knn_graph(X, est.n_neighbors)
    for n, e in enumerate(epochs):
        M, _ = slne.fit_member(
            {**est.member_params(), "epochs": e}, est.member_rows(X, mean, comps, n), y, g, est.member_seed(n)
        )
        np.testing.assert_array_equal(a.member_matrices_[n], M)
    assert not np.array_equal(a.member_matrices_[1], np.eye(4, dtype=np.float32))  # the members did learn
    with pytest.raises(InputError, match="member_epochs"):
        clone(est).set_params(member_epochs=[1, 2]).check_data_shape(X.shape[1], 4)
    with pytest.raises(InputError, match="member_epochs"):
        clone(est).set_params(member_epochs=[1, 2, -1]).fit(X, y)
