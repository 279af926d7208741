"""Parameter selection on the validation split: the split, the scores, the choice, and that the test
split never enters it."""

import json
import re

import numpy as np
import pytest
from sklearn.datasets import load_digits
from sklearn.neighbors import KNeighborsClassifier

from metricpipe.config import parse_config
from metricpipe.folds import Fold, fold_split
from metricpipe.runner import run_pipeline
from metricpipe.stages.data import prepare_data
from metricpipe.stages.train.select import selection_rows
from metricpipe.store import Store, load_estimator, open_array
from metricpipe.tasks import evaluation, registry, splits
from metricpipe.tasks.baselines import PCA
from metricpipe.tasks.errors import InputError
from metricpipe.tasks.ncmml import NCMML
from metricpipe.tasks.splits import auto_val_size

TRAIN, TEST, VAL = 0, 1, 2


# ---- the validation split ---------------------------------------------------------------------


def _plan(tmp_path, split):
    cfg = parse_config({"store": str(tmp_path / "s"), "data": {"source": "digits", "split": split}})
    return prepare_data(cfg, Store(cfg.store)).info


def _keys(n):
    return np.random.default_rng(5).integers(0, 2**63, n, dtype=np.uint64)


def test_auto_val_borrows_a_stratified_tenth_of_train_leaving_two_train_rows_per_class(tmp_path):
    info = _plan(tmp_path, {"test": 0.2, "seed": 0})
    assert not (info.split == VAL).any()  # the staged split is the user's: every train row is train
    n_pool = int((info.split == TRAIN).sum())
    split = splits.borrow(info.split, info.labels, _keys(len(info.split)), 0)
    val, train = split == VAL, split == TRAIN
    assert (info.split[val] == TRAIN).all() and (split[info.split == TEST] == TEST).all()
    assert val.sum() == pytest.approx(auto_val_size(n_pool), abs=len(info.classes))
    assert auto_val_size(n_pool) == int(min(10000, max(0.1 * n_pool, min(500, 0.2 * n_pool))))
    share = np.bincount(info.labels[val]) / np.bincount(info.labels[info.split != TEST])
    assert share.min() > 0.1 and share.max() < 0.3  # stratified: every class gives its share
    assert np.bincount(info.labels[train]).min() >= 2
    # the same seed, the same rows; another seed (a repeat), other rows
    assert np.array_equal(splits.borrow(info.split, info.labels, _keys(len(info.split)), 0), split)
    assert not np.array_equal(splits.borrow(info.split, info.labels, _keys(len(info.split)), 1) == VAL, val)


def test_borrowed_rows_follow_the_rows_content_not_where_they_are_stored():
    rng = np.random.default_rng(0)
    labels, keys = rng.integers(0, 5, 3000), _keys(3000)
    split = np.where(rng.random(3000) < 0.2, TEST, TRAIN).astype(np.int8)
    order = rng.permutation(3000)
    a = splits.borrow(split, labels, keys, 3)
    b = splits.borrow(split[order], labels[order], keys[order], 3)
    assert np.array_equal(a[order], b)


def test_val_zero_keeps_every_non_test_row_for_training(tmp_path):
    info = _plan(tmp_path, {"test": 0.2, "val": 0})
    assert not (info.split == VAL).any() and (info.split == TRAIN).sum() > 1400


def test_a_column_split_without_val_rows_borrows_them_from_train(tmp_path):
    X, y = load_digits(return_X_y=True)
    split = np.where(np.arange(len(y)) % 5 == 0, "test", "train")
    np.savez(tmp_path / "d.npz", X=X, y=y, split=split)
    cfg = parse_config(
        {"store": str(tmp_path / "s"), "data": {"path": str(tmp_path / "d.npz"), "split": {"column": "split"}}}
    )
    info = prepare_data(cfg, Store(cfg.store)).info
    assert np.array_equal(info.split == TEST, split == "test") and np.array_equal(info.split == TRAIN, split == "train")
    borrowed = splits.borrow(info.split, info.labels, _keys(len(y)), 0)
    assert (borrowed[split == "test"] == TEST).all()  # the user's test rows are untouched
    assert (borrowed == VAL).sum() == pytest.approx(auto_val_size(int((split == "train").sum())), abs=10)


def test_selection_rows_are_val_and_train_rows_only():
    rng = np.random.default_rng(0)
    split = rng.choice([TRAIN, TEST, VAL], 5000, p=[0.6, 0.3, 0.1]).astype(np.int8)
    labels = rng.integers(0, 7, 5000)
    val, ref = selection_rows(split, labels, 64, seed=0)
    assert (split[val] == VAL).all() and (split[ref] == TRAIN).all()
    assert len(val) == (split == VAL).sum() and len(ref) == (split == TRAIN).sum()
    val2, ref2 = selection_rows(split, labels, 200_000, seed=0)  # wide rows: the budget shrinks both
    assert len(val2) + len(ref2) <= max(200, 2.5e8 // (4 * 200_000)) + 100
    assert set(np.unique(labels[ref2])) == set(range(7))


# ---- the score ----------------------------------------------------------------------------------


def test_validation_scores_match_scikit_learn_and_brute_force():
    X, y = load_digits(return_X_y=True)
    X = X.astype(np.float32)
    Xr, yr, Xv, yv = X[:1200], y[:1200], X[1200:], y[1200:]
    est = PCA(dim=12).fit(Xr, yr)
    Zr, Zv = est.transform(Xr), est.transform(Xv)
    knn = KNeighborsClassifier(n_neighbors=1, algorithm="brute").fit(Zr, yr)
    assert evaluation.validation_score(est, "knn1", Xv, yv, Xr, yr) == pytest.approx(1 - knn.score(Zv, yv), abs=1e-9)
    # mAP: each validation row ranks every reference row by distance
    d = ((Zv[:, None, :] - Zr[None]) ** 2).sum(-1)
    aps = []
    for q in range(len(Zv)):
        rel = yr[np.argsort(d[q], kind="stable")] == yv[q]
        hits = np.cumsum(rel)
        aps.append((hits[rel] / (np.flatnonzero(rel) + 1)).mean())
    assert evaluation.validation_score(est, "map", Xv, yv, Xr, yr) == pytest.approx(np.mean(aps), abs=1e-5)
    # ncm of a model that is not an NCM classifier: nearest mean of the reference codes
    means = np.stack([Zr[yr == c].mean(0) for c in range(10)])
    pred = ((Zv[:, None, :] - means[None]) ** 2).sum(-1).argmin(1)
    assert evaluation.validation_score(est, "ncm", Xv, yv, Xr, yr) == pytest.approx(np.mean(pred != yv), abs=1e-9)
    # an NCM classifier is scored by its own predict
    ncm = NCMML(dim=8, iters=30, lr=0.001, random_state=0).fit(Xr, yr)
    assert evaluation.validation_score(ncm, "ncm", Xv, yv, Xr, yr) == pytest.approx(np.mean(ncm.predict(Xv) != yv))


# ---- config -----------------------------------------------------------------------------------


def test_unset_parameters_are_searched_set_ones_never():
    [spec] = registry.expand_method({"method": "slne"})
    assert spec["select"] == {"metric": "softvote10", "grid": {"step": [0.2, 0.05, 0.02, 0.005]}}
    assert [c["step"] for c in registry.candidates(spec)] == [0.2, 0.05, 0.02, 0.005]
    assert "select" not in registry.expand_method({"method": "slne", "step": 0.01})[0]
    assert "select" not in registry.expand_method({"method": "slne", "select": False})[0]
    [spec] = registry.expand_method({"method": "ncmml", "select": {"metric": "knn1", "lr": [0.1, 1.0], "dim": [8, 16]}})
    assert spec["select"]["metric"] == "knn1" and len(registry.candidates(spec)) == 4
    assert all("select" not in c for c in registry.candidates(spec))
    assert registry.expand_method({"method": "pca"}) == [{"method": "pca", "dim": None}]  # nothing to search
    assert "select" not in registry.expand_method({"method": "sparse", "sparsity": 0.0})[0]  # no support to anneal
    assert "select" in registry.expand_method({"method": "sparse", "sparsity": 0.9})[0]


@pytest.mark.parametrize(
    "method, key, value",
    [("nml", "optimizer", "sgd"), ("linear-ml", "optimizer", "adam"), ("ncmml", "objective", "dot")],
)
def test_the_lr_grid_follows_the_optimizer_and_the_objective(method, key, value):
    """A step size means another thing under Adam, plain SGD or the dot form: the grid of the one the
    entry sets (Adam's lr 0.001 left Algorithm 1's NML at its start; lr 30 diverged for the dot form)."""
    cls = registry.estimator_class(method, {})
    other, default = cls.search_space_when[(key, value)]["lr"], cls.search_space["lr"]
    assert other != default and cls().get_params()[key] != value  # the set value is not the default one
    for entry, grid in (({"method": method}, default), ({"method": method, key: value}, other)):
        [spec] = registry.expand_method(entry)
        assert spec["select"]["grid"] == {"lr": grid}
        assert [c["lr"] for c in registry.candidates(spec)] == grid
    [spec] = registry.expand_method({"method": method, key: value, "lr": 0.5})  # set: never searched
    assert "select" not in spec


@pytest.mark.parametrize(
    "entry, words",
    [
        ({"method": "slne", "step": 0.1, "select": {"step": [0.1, 0.2]}}, "both set"),
        ({"method": "slne", "select": {"stpe": [0.1, 0.2]}}, "did you mean 'step'"),
        ({"method": "slne", "select": {"metric": "accuracy"}}, "not a selection metric"),
        ({"method": "slne", "select": {"step": 0.1}}, "non-empty list"),
        ({"method": "ncmml", "select": {"metric": "ncmc"}}, "needs an NCMC model"),
        ({"method": "slne", "select": "yes"}, "true, false or a mapping"),
        ({"method": "ncmml", "select": {"lr": [1.0, -1.0]}}, "'lr' parameter"),
    ],
)
def test_bad_select_entries_are_one_line_errors(entry, words):
    with pytest.raises(InputError, match=words) as e:
        registry.expand_method(entry)
    assert "\n" not in str(e.value)


# ---- the pipeline ---------------------------------------------------------------------------------


def _digits_npz(path, poison_test: bool):
    X, y = load_digits(return_X_y=True)
    split = np.where(np.arange(len(y)) % 5 == 0, "test", "train")
    y = y.copy()
    if poison_test:  # every test label wrong: a selection that read them would change its mind
        t = split == "test"
        y[t] = (y[t] + 1 + np.arange(t.sum()) % 9) % 10
    np.savez(path, X=X.astype(np.float32), y=y, split=split)


def _run(tmp_path, name, client, poison=False, methods=None, again=False):
    if not again:  # (a rerun reads the same file: rewriting it would be new data)
        _digits_npz(tmp_path / f"{name}.npz", poison)
    raw = {
        "store": str(tmp_path / name),
        "data": {"path": str(tmp_path / f"{name}.npz"), "split": {"column": "split"}, "chunk_mb": 0.05},
        # lr 1e4 diverges (a failed candidate to record); the rest are the default grid's top
        "methods": methods
        or [
            {
                "method": "ncmml",
                "dim": 8,
                "iters": 150,
                "validate_every": 50,
                "select": {"lr": [30.0, 1e4, 10.0, 100.0]},
            },
            {"method": "slem"},
        ],
        "evaluate": {"retrieval": {"k": [10]}, "classification": {"classifiers": ["knn1", "ncm"]}},
    }
    logs = []
    path = run_pipeline(parse_config(raw), client=client, log=logs.append)
    return json.loads(open(path.replace("index.html", "metrics.json")).read()), logs


@pytest.mark.integration
def test_selection_keeps_the_best_validation_score_and_ignores_the_test_labels(client, tmp_path):
    clean, logs = _run(tmp_path, "clean", client)
    poisoned, _ = _run(tmp_path, "poisoned", client, poison=True)
    assert [s["method"] for s in clean["selection"]] == ["ncmml", "slem"]
    for a, b in zip(clean["selection"], poisoned["selection"]):
        assert a["chosen"] == b["chosen"]
        assert [c["params"] for c in a["candidates"]] == [c["params"] for c in b["candidates"]]
        assert [c["score"] for c in a["candidates"]] == [c["score"] for c in b["candidates"]]
    # the choice is the best score; diverged candidates are recorded as failed and never chosen
    ncm, slem = clean["selection"]
    scores = [c["score"] for c in ncm["candidates"]]
    assert any(s is None for s in scores) and ncm["candidates"][ncm["chosen"]]["score"] is not None
    assert ncm["chosen"] == min((s, i) for i, s in enumerate(scores) if s is not None)[1]
    assert all("diverged" in c["error"] for c in ncm["candidates"] if c["score"] is None)
    failed = [c["model"] for c in ncm["candidates"] if c["score"] is None]
    assert failed and not any((tmp_path / "clean" / "models" / key).exists() for key in failed)  # nothing half-written
    why = [
        line
        for line in logs
        if re.match(
            rf"  train: ncmml\S*: {len(failed)} of {len(scores)} candidates failed, "
            r"the selection compares the others; lr \S+: metric learning diverged after",
            line,
        )
    ]
    assert why and "lower 'lr'" not in why[0], logs  # and the log says why, with no advice for a searched lr
    assert slem["candidates"][slem["chosen"]]["score"] == max(c["score"] for c in slem["candidates"])
    # the test metrics are the chosen model's, and its stored score is reproduced from the stored model
    lr = ncm["candidates"][ncm["chosen"]]["params"]["lr"]
    assert {r["params"]["lr"] for r in clean["records"] if r["method"] == "ncmml"} == {lr}
    store = tmp_path / "clean"
    data = next(p for p in (store / "data").iterdir() if p.is_dir())
    labels = open_array(f"{data}/label")[:]
    X = open_array(f"{data}/features")[:]
    val, ref = selection_rows(fold_split(str(data), Fold(0)), labels, X.shape[1], seed=0)  # the rows it borrowed
    est = load_estimator(str(store / "models" / ncm["candidates"][ncm["chosen"]]["model"]))
    assert evaluation.validation_score(est, "ncm", X[val], labels[val], X[ref], labels[ref]) == pytest.approx(
        ncm["candidates"][ncm["chosen"]]["score"], abs=1e-12
    )
    # the log line and the report name the config entry, its searched parameter aside
    assert clean["selection"][0]["label"] == "ncmml-8-iters150-validate_every50"
    assert clean["selection"][1]["label"].startswith("slem")
    assert any(line.startswith("  train: ncmml-8-iters150-validate_every50 selected lr ") for line in logs)
    assert "<p>ncmml-8-iters150-validate_every50: ncm on " in (store / "report/index.html").read_text()


@pytest.mark.integration
def test_a_selection_that_chooses_another_entry_s_model_encodes_and_evaluates_it_once(client, tmp_path):
    """The second entry's only candidate is the first entry's model: it was encoded twice (the second
    encode wiped the unit the first was writing) and listed twice in the report."""
    fixed = {"method": "ncmml", "dim": 8, "iters": 150, "validate_every": 50, "lr": 10.0}
    searched = {"method": "ncmml", "dim": 8, "iters": 150, "validate_every": 50, "select": {"lr": [10.0, 1e4]}}
    report, logs = _run(tmp_path, "dup", client, methods=[fixed, searched])
    [sel] = report["selection"]
    assert sel["candidates"][sel["chosen"]]["params"] == {"lr": 10.0}
    [model] = report["models"]  # the chosen candidate's refit, which the fixed entry's is too
    assert (
        Store(str(tmp_path / "dup")).unit("models", model["key"]).meta()["refit_of"]
        == sel["candidates"][sel["chosen"]]["model"]
    )
    facts = [(r["model"], r["metric"], r["classifier"]) for r in report["records"]]
    assert len(facts) == len(set(facts)), facts  # each of its figures once
    assert any("1 entry ended with the model another entry has" in line for line in logs), logs
    assert not any("left unfinished" in line for line in logs), logs


@pytest.mark.integration
def test_every_candidate_failing_is_a_one_line_error(client, tmp_path):
    with pytest.raises(InputError, match=r"methods\[0\] \(ncmml-8\S*\): every candidate failed") as e:
        _run(
            tmp_path, "bad", client, methods=[{"method": "ncmml", "dim": 8, "iters": 150, "select": {"lr": [1e4, 1e5]}}]
        )
    assert "\n" not in str(e.value)
    # a model without selection that diverges is named by its config entry too
    with pytest.raises(InputError, match=r"methods\[1\] \(ncmml-8\S*\): metric learning diverged after") as e:
        _run(
            tmp_path,
            "bad2",
            client,
            methods=[
                {"method": "pca", "dim": 4},
                {"method": "ncmml", "dim": 8, "iters": 150, "lr": 1e5, "select": False},
                # a fit that ends after the other one diverged: kept, not cancelled (a k-NN ML that
                # diverged cancelled an NCMC 80 minutes into its fit)
                {"method": "ncmml", "dim": 8, "iters": 4000, "select": False, "early_stopping": False},
            ],
        )
    assert "\n" not in str(e.value)
    from metricpipe.store import Store
    from metricpipe.store.models import model_units
    from metricpipe.tasks import registry

    kept = {registry.model_name(m["spec"]) for _, m in model_units(Store(str(tmp_path / "bad2")))}
    assert {"pca-4", "ncmml-8-early_stoppingFalse-iters4000"} <= kept, kept
    assert not any("1e+05" in k or "100000" in k for k in kept), kept  # the diverged one is not


@pytest.mark.integration
def test_an_unset_lr_backs_off_in_the_pipeline_as_in_memory(client, tmp_path):
    """The config filled an unset lr with its grid's first value, so select: false trained at a fixed
    rate: k-NN ML at 0.1 diverged on 4,096-d rows and stopped the run, where KNNML() in memory backs
    off. On 120 classes of 10 rows (where KNNML(lr=0.1) diverges) the pipeline now backs off too."""
    from sklearn.datasets import make_classification

    from metricpipe import load_model
    from metricpipe.store.models import model_units

    X, y = make_classification(1200, 100, n_informative=40, n_classes=120, n_clusters_per_class=1, random_state=0)
    np.savez(tmp_path / "d.npz", X=X.astype(np.float32), y=y, split=np.where(np.arange(1200) % 10, "train", "test"))
    logs = []

    def run(name, **knnml):
        raw = {
            "store": str(tmp_path / name),
            "data": {"path": str(tmp_path / "d.npz"), "split": {"column": "split"}},
            "methods": [{"method": "knnml", "select": False, "random_state": 0, **knnml}],
            "evaluate": {"retrieval": {"k": [5]}, "classification": {"classifiers": ["knn1"]}},
        }
        return run_pipeline(parse_config(raw), client=client, log=logs.append)

    with pytest.raises(InputError, match=r"methods\[0\] \(knnml\): metric learning diverged .*\(now 0.1\)"):
        run("set", lr=0.1)  # a rate the user sets is theirs
    run("unset")
    [(key, meta)] = [(k, m) for k, m in model_units(Store(str(tmp_path / "unset"))) if not m.get("refit_of")]
    est = load_model(str(tmp_path / "unset"), key.key)  # (no data.normalize: the learner itself)
    drops = [h["lr"] for h in est.history_ if "lr" in h]
    assert drops and drops[0] == pytest.approx(0.01) and est.lr_ == drops[-1], est.history_
    assert np.isfinite(est.components_).all() and est.best_iter_ > 0
    assert not any("lr=None" in line for line in logs), [line for line in logs if "lr=None" in line]


@pytest.mark.integration
def test_a_damaged_candidate_is_refused_on_load_and_retrained_by_repair(client, tmp_path):
    """A candidate the selection did not keep is still a model of the store (encode, export, predict,
    load_model take it): a damaged one is named on load, and --repair recomputes it."""
    from metricpipe import load_model
    from metricpipe.store.describe import verify_store

    methods = [{"method": "ncmml", "dim": 8, "iters": 150, "validate_every": 50, "select": {"lr": [30.0, 10.0]}}]
    report, _ = _run(tmp_path, "s", client, methods=methods)
    sel = report["selection"][0]
    unkept = sel["candidates"][1 - sel["chosen"]]["model"]
    unit = tmp_path / "s" / "models" / unkept
    chunk = sorted(p for p in unit.rglob("*") if p.is_file() and p.name != "zarr.json")[0]
    intact = chunk.read_bytes()
    chunk.write_bytes(intact[:-2] + bytes(b ^ 0xFF for b in intact[-2:]))
    with pytest.raises(
        InputError,
        match=rf"model {unkept} is damaged: models/{unkept}/\S+: checksum differs"
        r".*--repair",
    ) as e:
        load_model(str(tmp_path / "s"), unkept[:8])
    assert "\n" not in str(e.value)
    assert load_model(str(tmp_path / "s"), sel["candidates"][sel["chosen"]]["model"]) is not None  # intact: loads
    assert len(verify_store(str(tmp_path / "s"))[1]) == 1
    raw = {
        "store": str(tmp_path / "s"),
        "data": {"path": str(tmp_path / "s.npz"), "split": {"column": "split"}, "chunk_mb": 0.05},
        "methods": methods,
        "evaluate": {"retrieval": {"k": [10]}, "classification": {"classifiers": ["knn1", "ncm"]}},
    }
    logs = []
    marker = next((tmp_path / "s" / "selection").glob("*.committed.json"))
    before = marker.read_text()
    run_pipeline(parse_config(raw), client=client, log=logs.append, repair=True)
    assert sum(f"repairing models/{unkept}" in line for line in logs) == 1, logs
    assert chunk.read_bytes() == intact and verify_store(str(tmp_path / "s"))[1] == []  # retrained, same bits
    assert marker.read_text() == before and not any("selected lr" in line for line in logs)  # the selection stands
    assert load_model(str(tmp_path / "s"), unkept).transform(np.zeros((1, 64))).shape == (1, 8)


@pytest.mark.integration
def test_a_model_that_kept_its_start_says_so_and_a_selection_candidate_does_not(client, tmp_path):
    """A model trained with parameters that do not suit the data ended at its PCA start without a
    word (a library trial: NCMML and k-NN ML on unscaled wine kept best_iter_ 0)."""
    report, logs = _run(
        tmp_path,
        "start",
        client,
        methods=[
            {"method": "ncmml", "dim": 8, "iters": 100, "validate_every": 50, "lr": 1e-9},
            {"method": "ncmml", "dim": 8, "iters": 100, "validate_every": 50, "select": {"lr": [1e-9, 10.0]}},
        ],
    )
    kept = [line for line in logs if "early stopping kept the model it starts from" in line]
    assert len(kept) == 1 and kept[0].startswith("  train: ncmml-8-iters100-lr1e-09-validate_every50: "), logs


# ---- a choice at the edge of its grid ------------------------------------------------------------


def test_outward_steps_beyond_the_edge_the_choice_sits_on_by_the_grid_s_own_ratio():
    from metricpipe.stages.train.select import EDGE_STEPS, at_edge, outward

    grid = {"lr": [3.0, 10.0, 30.0]}
    tried = [{"lr": v} for v in grid["lr"]]
    assert outward(grid, tried, {"lr": 30.0}, {}) == {"lr": ("upper", 90.0)}
    assert outward(grid, tried, {"lr": 3.0}, {}) == {"lr": ("lower", 0.9)}
    assert outward(grid, tried, {"lr": 10.0}, {}) == {}  # inside
    assert outward(grid, tried, {"lr": 30.0}, {("lr", "upper"): EDGE_STEPS}) == {}  # bounded
    assert at_edge(grid, tried, {"lr": 30.0}) == {"lr": "upper"} and at_edge(grid, tried, {"lr": 10.0}) == {}
    # a larger value that was tried and failed still bounds the choice
    assert at_edge(grid, tried + [{"lr": 90.0}], {"lr": 30.0}) == {}
    assert outward({"anneal": [0.0, 0.5]}, [{"anneal": 0.0}, {"anneal": 0.5}], {"anneal": 0.0}, {}) == {}  # not log


@pytest.mark.integration
def test_a_choice_at_either_edge_is_searched_beyond_it_and_said_when_it_stays(client, tmp_path):
    """NCMML's lr 0.01 and 0.03 both barely move W in 100 steps, so the larger wins: the search steps up
    twice (0.09, 0.27) and says the best may lie further; lr 1,000 diverges on digits, so lr 100 is
    the lower edge of what trains: the search steps down."""
    up = {"method": "ncmml", "dim": 8, "iters": 100, "validate_every": 50, "select": {"lr": [0.01, 0.03]}}
    down = {"method": "ncmml", "dim": 8, "iters": 100, "validate_every": 50, "select": {"lr": [100.0, 1000.0]}}
    report, logs = _run(tmp_path, "edge", client, methods=[up, down])
    first, second = report["selection"]
    lrs = [c["params"]["lr"] for c in first["candidates"]]
    assert lrs[:2] == [0.01, 0.03] and first["extended"] == len(lrs) - 2 >= 1 and min(lrs[2:]) > 0.03
    if first["extended"] == 2:  # still rising: said, in the log and the report
        assert first["edge"] == {"lr": "upper"}
        assert any("lr 0.27 is still the largest value tried" in line for line in logs), logs
    low = [c["params"]["lr"] for c in second["candidates"]]
    assert second["extended"] >= 1 and max(low[2:]) < 100.0
    assert any("is at the edge of its grid; also trying lr " in line for line in logs), logs
    # a rerun reuses the selections, their choice beyond the grid included (it indexed past the grid)
    again, logs = _run(tmp_path, "edge", client, methods=[up, down], again=True)
    assert again["selection"] == report["selection"] and any("train: reusing 2 of 2 models" in m for m in logs), logs
