import numpy as np
import pytest

from metricpipe.tasks import registry
from metricpipe.tasks.errors import InputError
from metricpipe.tasks.ncmml import KNNML, NCMC, NCMML
from metricpipe.tasks.nml import LinearML
from metricpipe.tasks.normalize import normalize_rows
from metricpipe.tasks.synthetic import SyntheticSpec
from metricpipe.tasks.validate import check_feature_block, check_split, encode_labels


def test_normalizations():
    X = np.array([[3.0, -4.0], [0.0, 0.0]], np.float32)
    np.testing.assert_allclose(normalize_rows(X, "l2"), [[0.6, -0.8], [0, 0]])
    np.testing.assert_allclose(normalize_rows(X, "l1"), [[3 / 7, -4 / 7], [0, 0]])
    p = normalize_rows(X, "power")
    np.testing.assert_allclose(p[0], np.array([np.sqrt(3), -2]) / np.sqrt(7), rtol=1e-6)
    assert np.array_equal(normalize_rows(X, "none"), X)
    big = np.full((2, 6), 1e38, np.float32)  # the l1 norm (6e38) overflows float32, the result does not
    np.testing.assert_allclose(normalize_rows(big, "l1"), np.full((2, 6), 1 / 6), rtol=1e-6)
    np.testing.assert_allclose(normalize_rows(big, "l2"), np.full((2, 6), 1 / np.sqrt(6)), rtol=1e-6)


def test_float_labels_are_exact_integers_or_refused():
    from metricpipe.tasks.validate import label_values

    assert label_values(np.array([3.0, -1.0]), "f").tolist() == [3, -1] and label_values([True], "f").dtype == np.int64
    with pytest.raises(InputError, match=r"f: float64 labels beyond 2\^53 .*first 1e\+19 at row 1"):
        encode_labels(np.array([1.0, 1e19, 2e19]), 3, "f")  # int64 would merge 1e19 and 2e19
    with pytest.raises(InputError, match=r"f: labels must be integers .*2 non-integral float64 value\(s\), first nan"):
        encode_labels(np.array([np.nan, 0.0, 0.25]), 3, "f")


def test_non_finite_block_names_row_and_column():
    X = np.zeros((4, 3), np.float32)
    X[2, 1] = np.nan
    with pytest.raises(InputError, match=r"feats.npy: .*first at row 12, column 1"):
        check_feature_block(X, 10, "feats.npy")


def test_labels():
    codes, classes = encode_labels(np.array(["b", "a", "b"]), 3, "f")
    assert list(codes) == [1, 0, 1] and classes == ["a", "b"]
    with pytest.raises(InputError, match="labels have length 2 but features have 3 rows"):
        encode_labels(np.array([0, 1]), 3, "f")
    with pytest.raises(InputError, match="only one class"):
        encode_labels(np.zeros(3), 3, "f")
    with pytest.raises(InputError, match="non-integral"):
        encode_labels(np.array([0.5, 1.0, 0.0]), 3, "f")


def test_split_checks():
    names = ("train", "test", "val", "negatives")
    codes = np.array([0, 0, 1, 1, 1])
    with pytest.raises(InputError, match="class\\(es\\) 'a' have fewer than two training samples"):
        check_split(codes, np.array([0, 1, 0, 0, 1]), names, ["a", "b"], "f")
    with pytest.raises(InputError, match="test split is empty; raise data.split.test$"):
        check_split(codes, np.zeros(5, int), names, ["a", "b"], "f")
    with pytest.raises(InputError, match="train split is empty; lower data.split.test$"):
        check_split(codes, np.ones(5, int), names, ["a", "b"], "f")


def test_synthetic_rows_do_not_depend_on_chunking():
    s = SyntheticSpec(3000, 16, 5, seed=3)
    whole = s.rows(0, 3000)
    np.testing.assert_array_equal(whole, np.vstack([s.rows(a, min(a + 777, 3000)) for a in range(0, 3000, 777)]))
    # class structure is real: class means differ far more than the noise of a mean
    y = s.labels()
    means = np.stack([whole[y == c].mean(0) for c in range(5)])
    assert np.linalg.norm(means[0] - means[1]) > 1.0


@pytest.mark.parametrize("cls,default", [(NCMML, 32), (NCMC, 32), (KNNML, 32), (LinearML, 64)])
def test_dim_left_unset_is_capped_at_the_features_a_set_dim_is_not(cls, default):
    """The default code width was a fixed 32 / 64, which refused any data of fewer features
    (scikit-learn's wine: 13, breast cancer: 30) run with the defaults; unset, it is now
    min(default, n_features), and a dim set above n_features is still refused."""
    rng = np.random.default_rng(0)
    small = {"iters": 30} if cls is not LinearML else {"iters": 30, "pairs": 200}
    for d in (7, default + 3):
        X = np.abs(rng.normal(size=(120, d))).astype(np.float32)
        y = np.arange(120) % 3
        est = cls(validation=30, **small).fit(X, y)
        assert est.transform(X).shape == (120, min(d, default))
    with pytest.raises(InputError, match=rf"The 'dim' parameter of {cls.__name__} must be <= 7"):
        cls(dim=8, validation=30, **small).fit(X[:, :7], y)


def test_few_shot_data_that_validation_cannot_score_trains_on_every_row():
    """Three images per class: the held-out fifth has one row per class, so no validation row has
    another of its class and early stopping is off; those rows used to stay out of training anyway
    (NML, linear ML, sparse projectors). Now the model is the one trained with validation off."""
    from metricpipe.tasks.sparse import SparseProjector

    rng = np.random.default_rng(0)
    y = np.repeat(np.arange(60), 3)
    X = np.abs(rng.normal(size=(60, 10))[y] + rng.normal(size=(180, 10))).astype(np.float32)
    for cls, small in ((LinearML, {"iters": 100, "pairs": 200}), (SparseProjector, {"max_iter": 5})):
        off = cls(validation=0, **small).fit(X, y)
        default = cls(**small).fit(X, y)
        assert default.best_iter_ is None
        assert np.array_equal(default.transform(X), off.transform(X)), cls


def test_lr_left_unset_is_the_first_value_of_the_grid_the_objective_or_optimizer_selects():
    """NCMML(objective='dot') diverged at the class's lr 30 (the Euclidean form's), though its own
    selection grid starts at 1 and the README called 1 its default; NML's SGD and linear ML's Adam
    had the same mismatch. lr None now stands for the first value of the applicable grid, and a
    model's name and the report omit it there as at any default."""
    from sklearn.datasets import load_digits

    from metricpipe.stages.train import model_id
    from metricpipe.tasks.nml import NML

    X, y = load_digits(return_X_y=True)
    dot = NCMML(dim=16, objective="dot", iters=300, validate_every=50).fit(X[:1200], y[:1200])  # lr 30: diverged
    assert dot.score(X[1200:], y[1200:]) > 0.8
    for est, want in (
        (NCMML(), 30.0),
        (NCMML(objective="dot"), 1.0),
        (NML(), 0.001),
        (NML(optimizer="sgd"), 10.0),
        (LinearML(), 0.1),
        (LinearML(optimizer="adam"), 0.01),
        (NCMML(objective="dot", lr=3.0), 3.0),
    ):
        assert est._searched("lr") == want
    assert model_id({"method": "ncmml", "dim": 8, "objective": "dot", "lr": 1.0}) == "ncmml-8-objectivedot"
    assert model_id({"method": "ncmml", "dim": 8, "objective": "dot", "lr": 30.0}) == "ncmml-8-lr30.0-objectivedot"


@pytest.mark.parametrize("method", ["pca", "lda", "slne", "sparse", "slem", "ncmml", "nml", "linear-ml"])
def test_non_finite_input_is_one_line_naming_the_first_bad_row_and_column(method):
    """scikit-learn's own message is several lines, names no row and suggests other estimators."""
    from metricpipe.tasks import registry

    rng = np.random.default_rng(0)
    X, y = np.abs(rng.normal(size=(60, 6))), np.arange(60) % 3
    bad = X.copy()
    bad[41, 4] = np.inf
    est = registry.make({"method": method})
    name = type(est).__name__
    with pytest.raises(
        InputError,
        match=rf"^{name}: X: Input contains 1 non-finite value\(s\) \(NaN or inf\), first "
        r"inf at row 41, column 4; drop or impute those rows[^\n]*$",
    ):
        est.fit(bad, y)
    if method in ("ncmml", "nml", "linear-ml", "sparse"):  # the learners that take validation rows
        with pytest.raises(InputError, match=rf"^{name}: X_val: Input contains 1 non-finite value"):
            est.fit(X, y, X_val=bad, y_val=y)


def test_slem_with_a_kernel_names_kernel_slem():
    """The user guide says the estimators' parameters mirror the config, where {method: slem, kernel:
    gaussian} is kernel SLEM; SLEM(kernel='gaussian') said only "must be among {'linear'}"."""
    from metricpipe.tasks.slem import SLEM

    with pytest.raises(
        InputError, match=r"^SLEM is the linear form; for kernel 'gaussian' use KernelSLEM\(kernel='gaussian'\)"
    ):
        SLEM(kernel="gaussian").fit(np.random.default_rng(0).normal(size=(20, 3)), np.arange(20) % 2)


def test_can_rank_needs_a_row_with_another_of_its_key_and_with_negatives_another_key():
    from metricpipe.tasks.evaluation import can_rank

    assert not can_rank([]) and not can_rank([1, 2, 3]) and can_rank([1, 2, 2])
    assert can_rank([4, 4]) and not can_rank([4, 4], negatives=True) and can_rank([4, 4, 5], negatives=True)


@pytest.mark.parametrize("cls", registry.ESTIMATORS, ids=lambda c: c.__name__)
def test_a_1d_x_is_one_line_naming_its_shape_and_the_reshape(cls):
    """scikit-learn's message for a 1-D X runs to 30 lines: it prints the whole array."""
    x = np.arange(200.0)
    with pytest.raises(
        InputError,
        match=rf"^{cls.__name__}: X: expected a 2-D array \(n_samples, n_features\), got "
        r"1-D of shape \(200,\); Reshape your data with X.reshape\(-1, 1\)[^\n]*$",
    ):
        cls().fit(x, np.arange(200) % 2)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_all_finite_finds_any_non_finite_value_without_a_mask(bad):
    from metricpipe.tasks.validate import all_finite

    X = np.random.default_rng(0).standard_normal((300, 7)).astype(np.float32)
    assert all_finite(X) and all_finite(X[:0])
    X[123, 4] = bad
    assert not all_finite(X)
    with pytest.raises(InputError, match=r"first at row 1123, column 4"):
        check_feature_block(X, 1000, "f.npy")


def test_row_keys_are_each_row_s_own_hash_whatever_the_slab():
    """Slabs of 4,096 rows share one buffer: each key is still that of its row alone."""
    from metricpipe.tasks import stream

    X = np.random.default_rng(1).standard_normal((9000, 11)).astype(np.float32)
    keys = stream.row_keys(X)
    rows = [0, 4095, 4096, 4097, 8191, 8192, 8999]
    np.testing.assert_array_equal(keys[rows], [stream.row_keys(X[r : r + 1])[0] for r in rows])
    assert len(np.unique(keys)) == len(keys)


def test_take_rows_takes_positions_or_a_mask():
    from metricpipe.tasks.rows import take_rows

    X = np.arange(20.0, dtype=np.float32).reshape(10, 2)
    np.testing.assert_array_equal(take_rows(X, np.array([7, 2, 2])), X[[7, 2, 2]])
    mask = np.zeros(10, bool)
    mask[[1, 8]] = True
    np.testing.assert_array_equal(take_rows(X, mask), X[mask])
