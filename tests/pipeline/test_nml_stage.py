"""NML and linear ML through the pipeline: the driver feeds the estimator the pools of the shuffled
copy (pairs from labels) or the user's pairs by layout blocks, and learns what the estimator learns
in memory on the training rows."""

import re

import numpy as np
import pytest

from metricpipe.config import parse_config
from metricpipe.stages import prepare_data, run_encode, run_train
from metricpipe.store import Store, load_arrays, load_estimator, open_array
from metricpipe.tasks import moments, nml
from metricpipe.tasks.errors import InputError
from metricpipe.tasks.nml import NML, LinearML
from metricpipe.tasks.splits import check_pairs
from tests.conftest import make_blobs, staged


def _data(tmp_path):
    X, y = make_blobs(n=500, d=10, classes=4, sep=1.0, seed=2)
    X = np.abs(X)
    np.savez(tmp_path / "d.npz", X=X, y=y)
    return X, y


@pytest.mark.parametrize(
    "i,j,y,match",
    [
        ([0, 1], [2, 3], [1], "equal, non-zero length"),
        ([0, 99], [2, 3], [1, -1], "index i=99 is out of range"),
        ([0, 1], [2, 5], [1, -1], "uses row 5, which is in the test split, not train; .* give the data a split column"),
        ([0, 1], [2, 3], [1, 0], "must be \\+1 \\(similar\\) or -1"),
        ([0.0, 1.0], [2, 3], [1, -1], "'i' must hold integer row indices"),
    ],
)
def test_bad_user_pairs_are_refused(i, j, y, match):
    split = np.zeros(10, np.int8)
    split[5] = 1
    with pytest.raises(InputError, match=match):
        check_pairs(np.array(i), np.array(j), np.array(y), split, "pairs.npz")


def test_val_auto_leaves_the_rows_user_pairs_join_in_train(tmp_path):
    """The validation split val: auto carves from the train rows took rows the user's pairs join, and the
    pairs were then refused as joining rows 'not in the train split' of the user's own split column."""
    from metricpipe.config import parse_config
    from metricpipe.stages import prepare_data
    from metricpipe.store import Store

    X, y = make_blobs(n=3000, d=6, classes=4, sep=1.0, seed=2)
    split = np.where(np.arange(3000) % 5 == 0, "test", "train")
    train = np.flatnonzero(split == "train")
    i, j = train[:1000], train[1000:2000]  # 2,000 of the 2,400 train rows join a pair
    np.savez(tmp_path / "d.npz", X=X, y=y, split=split)
    np.savez(tmp_path / "p.npz", i=i, j=j, y=np.where(y[i] == y[j], 1, -1))
    cfg = parse_config(
        {
            "store": str(tmp_path / "s"),
            "data": {"path": str(tmp_path / "d.npz"), "split": {"column": "split"}, "pairs": str(tmp_path / "p.npz")},
        }
    )
    info = prepare_data(cfg, Store(cfg.store)).info
    assert (info.split[np.concatenate([i, j])] == 0).all()
    assert (info.split[split == "test"] == 1).all()
    # the other train rows give the validation rows a selection borrows
    from metricpipe.tasks import splits

    keys = np.random.default_rng(0).integers(0, 2**63, len(y), dtype=np.uint64)
    val = np.flatnonzero(splits.borrow(info.split, info.labels, keys, 0, keep=np.concatenate([i, j])) == 2)
    assert len(val) > 0 and not np.isin(val, np.concatenate([i, j])).any()


@pytest.mark.integration
def test_val_auto_without_a_class_next_to_user_pairs_trains_and_says_why(client, tmp_path):
    """Pairs joining all but 2 train rows of class 3 leave val: auto no row of it to carve. NCMML's
    early stopping scores the classes that have val rows (it stopped with 'give the data's val rows',
    which the user never set, after training every other candidate); the log says which and why."""
    X, y = make_blobs(n=800, d=6, classes=4, sep=1.0, seed=2)
    np.savez(tmp_path / "d.npz", X=np.abs(X), y=y)
    cfg = parse_config({"data": {"path": str(tmp_path / "d.npz")}})
    split = prepare_data(cfg, Store(str(tmp_path / "probe"))).info.split
    three = np.flatnonzero((y == 3) & (split != 1))[2:]  # class 3's train + val rows, all but 2
    others = np.flatnonzero((y != 3) & (split != 1))[: len(three)]
    np.savez(tmp_path / "p.npz", i=three, j=others, y=-np.ones(len(three), np.int64))
    ctx, data, stats = staged(
        client,
        tmp_path / "s",
        {
            "data": {"path": str(tmp_path / "d.npz"), "pairs": str(tmp_path / "p.npz")},
            "methods": [{"method": "ncmml", "dim": 2, "iters": 200, "lr": 3.0}],
        },
    )
    from metricpipe.folds import Fold, fold_split

    borrowed = fold_split(data.url, Fold(0))  # the staged pairs' rows stay train
    assert not ((data.labels == 3) & (borrowed == 2)).any() and ((data.labels == 0) & (borrowed == 2)).any()
    logs = []
    ctx.log = logs.append
    [(_, unit, _)] = run_train(ctx, data, stats, None)
    assert load_estimator(unit.url).classes_.tolist() == [0, 1, 2, 3]
    assert any(
        re.search(
            r"methods\[0\] \(ncmml-2-iters200-lr3.0\): the val split holds no row of 1 of the 4 classes it trains on "
            r"\(3; data.split.val: auto borrows val rows only from train rows that no pair of data.pairs "
            r"joins\); its early stopping scores the others",
            m,
        )
        for m in logs
    ), logs


@pytest.mark.integration
def test_nml_and_linear_ml_train_encode_and_match_their_definitions(client, tmp_path):
    X, y = _data(tmp_path)
    ctx, data, stats = staged(
        client,
        tmp_path / "s",
        {
            "data": {"path": str(tmp_path / "d.npz"), "chunk_mb": 0.005},
            "methods": [
                {
                    "method": "nml",
                    "dim": 3,
                    "pairs": 2000,
                    "iters": 4000,
                    "lr": 30.0,
                    "optimizer": "sgd",
                    "validation": 0,
                },
                {"method": "linear-ml", "dim": 3, "pairs": 2000, "iters": 4000, "validation": 0, "select": False},
            ],
        },
    )
    assert len(data.chunks) > 3
    models = run_train(ctx, data, stats, None)
    codes = run_encode(ctx, data, models)
    split, lab = open_array(f"{data.url}/split")[:], open_array(f"{data.url}/label")[:]
    train = np.flatnonzero(split == 0)
    i, j, yy = nml.sample_pairs(lab[train], 2000, np.random.default_rng(0))  # fixed label pairs to score on
    i, j = train[i], train[j]
    Xs = open_array(f"{data.url}/features")[:].astype(np.float64)
    for (spec, unit, _), (_, cunit, dim) in zip(models, codes):
        meta = unit.meta()
        m = load_estimator(unit.url)
        Z = open_array(f"{cunit.url}/codes")[:]
        assert m.n_pairs_ == 4000 and m.pair_source_ == "labels"  # 2 passes of 2000 pairs drawn from the labels
        L = m.L_.astype(np.float64)
        if spec["method"] == "nml":  # the objective (Eq. 9) over label pairs falls from the start
            X1 = X / X.sum(1, keepdims=True)
            L0 = np.random.default_rng([0, 19]).uniform(-0.5, 0.5, L.shape)
            f = lambda M: nml.nml_loss_and_gradient(M, X1[i], X1[j], yy, 0.1, 0.02)[0]  # noqa: E731
        else:
            st = load_arrays(stats.url)[0]  # L starts at the PCA directions over the rows' RMS norm
            assert st["mean_sq_norm"] == pytest.approx((Xs[train] ** 2).sum(1).mean(), rel=1e-6)
            L0 = st["pca_components"][:3] / moments.row_scale(st)
            f = lambda M: nml.linear_loss_and_gradient(M, Xs[i], Xs[j], yy, 1.0, 0.2)[0]  # noqa: E731
        assert f(L) < 0.9 * f(L0)
        if spec["method"] == "nml":  # Eq. 7 on l1-normalised rows
            np.testing.assert_allclose(Z, nml.chi2_kernel(X1, L), rtol=1e-4, atol=1e-6)
        else:
            np.testing.assert_allclose(Z, X @ L.T, rtol=1e-4, atol=1e-5)
        assert meta["samples_per_second"] > 0 and dim == 3


@pytest.mark.integration
def test_negative_features_are_a_one_line_error_for_nml(client, tmp_path):
    X, y = make_blobs(n=200, d=6, classes=2, seed=1)
    np.savez(tmp_path / "neg.npz", X=X, y=y)
    ctx, data, stats = staged(
        client,
        tmp_path / "s",
        {
            "data": {"path": str(tmp_path / "neg.npz")},
            "methods": [{"method": "nml", "dim": 2, "pairs": 100, "iters": 100}],
        },
    )
    with pytest.raises(InputError, match="needs non-negative features"):
        run_train(ctx, data, stats, None)


def _train_rows(data):
    train = np.flatnonzero(open_array(f"{data.url}/split")[:] == 0)
    return train, open_array(f"{data.url}/features")[:][train], open_array(f"{data.url}/label")[:][train]


@pytest.mark.integration
def test_the_pipeline_learns_the_in_memory_model_from_labels(client, tmp_path):
    """Pools of the shuffled copy = tasks.stream.pools on the training rows with block_rows = the
    row-block: NML's model is the same bit for bit; LinearML's starts from the statistics stage's
    PCA instead of the in-memory one (the same basis to rounding)."""
    _data(tmp_path)
    specs = [
        {"method": "nml", "dim": 3, "pairs": 1500, "iters": 3000, "lr": 0.01, "random_state": 5},
        {"method": "linear-ml", "dim": 3, "pairs": 1500, "iters": 3000, "random_state": 5, "select": False},
    ]
    ctx, data, stats = staged(
        client,
        tmp_path / "s",
        {"data": {"path": str(tmp_path / "d.npz"), "chunk_mb": 0.005, "split": {"val": 0}}, "methods": specs},
    )
    models = run_train(ctx, data, stats, None)
    train, Xt, yt = _train_rows(data)
    assert data.chunk_rows < len(train) / 3  # several pools
    for (spec, unit, _), cls in zip(models, (NML, LinearML)):
        got = load_estimator(unit.url)
        params = {k: v for k, v in spec.items() if k != "method"}
        mem = cls(**params).fit(Xt, yt, block_rows=data.chunk_rows)
        # with early stopping on the same held-out rows, both stop at the same pair
        assert got.pairs_seen_ == mem.pairs_seen_ and got.n_steps_ == mem.n_steps_ and got.best_iter_ == mem.best_iter_
        if cls is NML:
            assert np.array_equal(got.L_, mem.L_)
        else:
            np.testing.assert_allclose(got.L_, mem.L_, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(got.transform(Xt), mem.transform(Xt), rtol=1e-3, atol=1e-4)


@pytest.mark.integration
def test_user_pairs_in_the_pipeline_are_fit_pairs_in_memory(client, tmp_path):
    """User pairs (global staged rows) visit the layout blocks of the shuffled copy as fit_pairs visits
    them on the training rows, given the same block_rows: the same model."""
    X, y = _data(tmp_path)
    spec = {"method": "nml", "dim": 2, "iters": 1500, "lr": 0.01, "random_state": 1}
    ctx, data, stats = staged(client, tmp_path / "plain", {"data": {"path": str(tmp_path / "d.npz")}})
    train = np.flatnonzero(open_array(f"{data.url}/split")[:] == 0)
    rng = np.random.default_rng(0)
    i, j = rng.choice(train, 1000), rng.choice(train, 1000)
    s = np.where(y[i] == y[j], 1, -1)
    np.savez(tmp_path / "pairs.npz", i=i, j=j, y=s)
    ctx, data, stats = staged(
        client,
        tmp_path / "user",
        {
            "data": {"path": str(tmp_path / "d.npz"), "chunk_mb": 0.005, "pairs": str(tmp_path / "pairs.npz")},
            "methods": [spec],
        },
    )
    [(_, unit, _)] = run_train(ctx, data, stats, None)
    got = load_estimator(unit.url)
    assert got.pair_source_ == "user" and got.n_pairs_ == 1000 and got.pairs_seen_ == 1500
    train, Xt, _ = _train_rows(data)
    local = np.searchsorted(train, np.stack([i, j], axis=1))
    mem = NML(dim=2, iters=1500, lr=0.01, random_state=1).fit_pairs(local, s, X=Xt, block_rows=data.chunk_rows)
    assert np.array_equal(got.L_, mem.L_)


def test_bad_pairs_file_is_refused_at_staging(tmp_path):
    _data(tmp_path)
    np.savez(tmp_path / "p.npz", i=np.array([0, 1]), j=np.array([2, 10_000]), y=np.array([1, -1]))
    cfg = parse_config({"data": {"path": str(tmp_path / "d.npz"), "pairs": str(tmp_path / "p.npz")}})
    with pytest.raises(InputError, match=r"p.npz \(data.pairs\): pair index j=10000 is out of range"):
        prepare_data(cfg, Store(str(tmp_path / "s")))


def test_pairs_file_that_is_not_an_npz_is_a_one_line_error(tmp_path):
    _data(tmp_path)
    np.save(tmp_path / "p.npy", np.zeros(3))
    cfg = parse_config({"data": {"path": str(tmp_path / "d.npz"), "pairs": str(tmp_path / "p.npy")}})
    with pytest.raises(InputError, match=r"p.npy: data.pairs must be an .npz file with arrays i, j, y"):
        prepare_data(cfg, Store(str(tmp_path / "s")))


def test_nml_encoder_refuses_negative_features():
    m = NML.from_state(NML(dim=2).get_params(), {"L_": np.ones((2, 3), np.float32), "n_features_in_": 3})
    with pytest.raises(InputError, match="needs non-negative features"):
        m.transform(np.array([[0.1, -0.2, 0.3]]))


@pytest.mark.integration
def test_val_rows_of_a_split_column_missing_a_class_are_named_as_the_column_s(client, tmp_path):
    """A new-user trial: val rows from the data's split column that lack classes were blamed on
    'data.split.val: auto' (the default the user never relied on), and integer classes were quoted."""
    X, y = make_blobs(n=400, d=6, classes=4, sep=1.0, seed=2)
    split = np.where(np.arange(400) % 5 == 0, "test", "train").astype("<U5")
    split[(np.arange(400) % 5 == 1) & (y < 2)] = "val"  # val rows of classes 0 and 1 only
    np.savez(tmp_path / "d.npz", X=X, y=y, split=split)
    ctx, data, stats = staged(
        client,
        tmp_path / "s",
        {
            "data": {"path": str(tmp_path / "d.npz"), "split": {"column": "split"}},
            "methods": [{"method": "ncmml", "dim": 2, "iters": 50, "lr": 3.0}],
        },
    )
    logs = []
    ctx.log = logs.append
    run_train(ctx, data, stats, None)
    assert any(
        "holds no row of 2 of the 4 classes it trains on (2, 3; the val rows of data.split.column" in m for m in logs
    ), logs
