import numpy as np
import pytest

from metricpipe.config import ConfigError, parse_config
from metricpipe.stages import run_encode, run_evaluate, run_train
from metricpipe.stages.train.pool import negative_rows
from metricpipe.store import load_arrays, open_array
from metricpipe.tasks import slem
from tests.conftest import make_blobs, staged


def _data(tmp_path, n=600, D=12):
    X, y = make_blobs(n, D, 4, seed=3)
    np.savez(tmp_path / "d.npz", X=X.astype(np.float32), y=y)
    return X, y


@pytest.mark.integration
def test_slem_models_train_encode_and_match_their_definitions(client, tmp_path):
    X, y = _data(tmp_path)
    neg = {"split": "train", "count": 200, "seed": 1}
    ctx, data, stats = staged(
        client,
        tmp_path / "s",
        {
            "data": {"path": str(tmp_path / "d.npz"), "chunk_mb": 0.005, "split": {"test": 0.25, "seed": 0}},
            "methods": [
                {"method": "slem", "lam": 0.1, "negatives": {"split": "train", "count": None}},
                {"method": "slem", "lam": 0.1, "negatives": neg},
                {"method": "slem", "kernel": "gaussian", "gamma": 0.05, "lam": 0.1, "negatives": neg},
                {
                    "method": "slem",
                    "kernel": "poly",
                    "gamma": 0.1,
                    "lam": 0.1,
                    "rank": 8,
                    "decomposition": "icd",
                    "negatives": neg,
                },
                {"method": "esvm", "lam": 0.01, "epochs": 3, "negatives": neg},
            ],
            "evaluate": {"retrieval": {"k": [10]}, "classification": {"classifiers": ["knn1"]}},
        },
    )
    assert len(data.chunks) > 3
    split = open_array(f"{data.url}/split")[:]
    Xs = open_array(f"{data.url}/features")[:].astype(np.float64)
    pool = negative_rows(split, neg, "t")
    assert len(pool) == 200 and np.all(split[pool] == 0)  # train rows only, never test
    models = run_train(ctx, data, stats, None)
    codes = run_encode(ctx, data, models)
    test = np.flatnonzero(split == 1)
    got = {i: open_array(f"{cunit.url}/codes")[:][test] for i, (_, cunit, _) in enumerate(codes)}
    train = Xs[split == 0]
    # linear SLEM on the whole train split: A^-1 (x - mu) normalised, mu and A from numpy (lam for rows
    # of unit RMS norm: the ridge is lam times the pool's mean squared norm)
    A = np.cov(train.T, bias=True) + 0.1 * (train * train).sum(1).mean() * np.eye(X.shape[1])
    ref = slem.unit_rows(np.linalg.solve(A, (Xs[test] - train.mean(0)).T).T)
    np.testing.assert_allclose(got[0], ref, atol=2e-5)
    # the same on a sampled pool, whose moments were streamed block by block
    P = Xs[pool]
    A = np.cov(P.T, bias=True) + 0.1 * (P * P).sum(1).mean() * np.eye(X.shape[1])
    ref = slem.unit_rows(np.linalg.solve(A, (Xs[test] - P.mean(0)).T).T)
    np.testing.assert_allclose(got[1], ref, atol=2e-5)
    # kernel SLEM: the stored code is [beta_hat, v, u, x0] of a model fitted on the pool in memory
    m = slem.KernelSLEM(lam=0.1, kernel="gaussian", gamma=0.05, negatives=neg).fit_pool(P)
    np.testing.assert_allclose(got[2], m.transform(Xs[test]), rtol=1e-4, atol=1e-4)
    assert got[3].shape[1] == 2 * 8 + 1 + X.shape[1]
    # fit records: offline and online costs
    for spec, unit, _ in models:
        fit = unit.meta()
        assert fit["offline_seconds"] >= 0 and fit["online_seconds_per_image"] > 0
    attrs = load_arrays(models[2][1].url)[1]
    assert attrs["method"] == "slem" and attrs["score"].startswith("slem:gaussian")
    assert models[0][1].meta()["moments"] == "statistics stage" and models[1][1].meta()["moments"] == "pool, streamed"
    # evaluation uses Eq. 16 for the kernel model: its kNN-1 error equals a brute-force check
    evals = run_evaluate(ctx, data, codes)
    recs = evals[2][1].read_json("records.json")
    err = next(r["value"] for r in recs if r["classifier"] == "knn1" and r["metric"] == "top1_error")
    trc = open_array(f"{codes[2][1].url}/codes")[:][split == 0]
    S = slem.similarity(got[2], trc, attrs["score"])
    labels = open_array(f"{data.url}/label")[:]
    assert err == pytest.approx(np.mean(labels[split == 0][S.argmax(1)] != labels[test]), abs=1e-9)
    # ESVM codes are unit vectors that score their own image above the pool
    E = got[4].astype(np.float64)
    np.testing.assert_allclose(np.linalg.norm(E, axis=1), 1.0, atol=1e-5)


def test_negatives_must_not_be_the_test_split_and_need_a_valid_count(tmp_path):
    for neg, msg in (
        ({"split": "test"}, "never test"),
        ({"split": "holdout"}, "must name the split"),
        ({"count": 1}, "integer >= 2"),
        ({"size": 5}, "keys among"),
    ):
        with pytest.raises(ConfigError, match=msg):
            parse_config({"data": {"source": "digits"}, "methods": [{"method": "slem", "negatives": neg}]})


def test_an_empty_negative_split_is_a_one_line_error_naming_the_splits():
    from metricpipe.tasks.errors import InputError

    split = np.array([0, 0, 1, 1, 0], np.int8)
    with pytest.raises(InputError, match=r"negatives.split 'negatives' holds 0 image\(s\).*train \(3\), test \(2\)"):
        negative_rows(split, {"split": "negatives", "count": None, "seed": 0}, "c.yaml: slem")


@pytest.mark.parametrize(
    "method,classifiers,match",
    [
        (
            {"kernel": "poly", "rank": 4, "decomposition": "kpca"},
            ["knn1", "ncm"],
            r"evaluate.classification.classifiers: ncm cannot be served by methods\[0\]: kernel SLEM \(poly\) compares "
            r"images by Eq. 16 only; ncm needs codes in a vector space",
        ),
        (
            {"kernel": "gaussian", "rank": 16, "decomposition": "cholesky"},
            ["knn1"],
            r"decomposition cholesky is full rank, but rank is 16",
        ),
    ],
)
def test_kernel_slem_contradictions_are_refused_before_any_work(method, classifiers, match):
    with pytest.raises(ConfigError, match=match):
        parse_config(
            {
                "data": {"source": "digits"},
                "methods": [{"method": "slem", **method}],
                "evaluate": {"classification": {"classifiers": classifiers}},
            }
        )
    # linear SLEM codes live in a vector space: every classifier is allowed
    parse_config(
        {
            "data": {"source": "digits"},
            "methods": [{"method": "slem"}],
            "evaluate": {"classification": {"classifiers": classifiers}},
        }
    )


@pytest.mark.integration
def test_linear_slem_without_a_dense_covariance_is_a_one_line_error(client, tmp_path):
    from metricpipe.tasks.errors import InputError

    _data(tmp_path)
    ctx, data, stats = staged(
        client,
        tmp_path / "s",
        {
            "data": {"path": str(tmp_path / "d.npz"), "split": {"test": 0.25, "seed": 0}},
            "statistics": {"max_dense_dim": 8, "components": 4},
            "methods": [{"method": "slem", "negatives": {"count": None}}],
        },
    )
    with pytest.raises(
        InputError,
        match=r"linear slem needs the D x D covariance, but D = 12 is above "
        r"statistics.max_dense_dim",
    ):
        run_train(ctx, data, stats, None)


@pytest.mark.integration
def test_default_classifiers_skip_what_kernel_slem_cannot_serve_and_the_report_says_so(client, tmp_path):
    """Default evaluation (knn1, knn10, ncm) with a kernel SLEM model: the model skips ncm with a note in
    the run manifest and the report; the other models keep every classifier."""
    import json
    from pathlib import Path

    from metricpipe.runner import run_pipeline

    _data(tmp_path, n=300, D=8)
    cfg = parse_config(
        {
            "store": str(tmp_path / "s"),
            "data": {"path": str(tmp_path / "d.npz"), "split": {"test": 0.25, "seed": 0}},
            "methods": [
                {"method": "pca", "dim": 4},
                {"method": "slem", "kernel": "gaussian", "gamma": 0.05, "lam": 0.1, "negatives": {"count": 100}},
            ],
        },
        where="cfg.yaml",
    )
    logs = []
    report = Path(run_pipeline(cfg, client=client, log=logs.append))
    skipped = json.loads((tmp_path / "s/runs/latest.json").read_text())["skipped"]
    assert [(s["model"].split("-")[0], s["classifier"]) for s in skipped] == [("slem", "ncm")]
    assert "Eq. 16" in skipped[0]["reason"]
    assert any("skips ncm" in m for m in logs)
    records = json.loads(report.with_name("metrics.json").read_text())["records"]
    served = {(r["method"], r["classifier"]) for r in records if r["metric"] == "top1_error"}
    assert served == {("pca", "knn1"), ("pca", "knn10"), ("pca", "ncm"), ("slem", "knn1"), ("slem", "knn10")}
    assert "Skipped: ncm for slem" in report.read_text()


def test_a_classifier_listed_for_kernel_slem_is_still_refused_in_one_line(tmp_path):
    from click.testing import CliRunner

    from metricpipe.cli import main

    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(
        "data: {source: digits}\nmethods: [{method: slem, kernel: gaussian}]\n"
        "evaluate: {classification: {classifiers: [knn1, ncm]}}\n"
    )
    res = CliRunner().invoke(main, ["run", str(cfg)])
    assert res.exit_code == 2
    assert res.output.count("\n") == 1 and "Traceback" not in res.output
    assert (
        f"{cfg}: evaluate.classification.classifiers: ncm cannot be served by methods[0]: kernel SLEM "
        f"(gaussian) compares images by Eq. 16 only; ncm needs codes in a vector space" in res.output
    )
