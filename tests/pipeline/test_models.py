"""Stored models load as fitted estimators that reproduce the stored codes from raw features."""

import re

import numpy as np
import pytest
from click.testing import CliRunner

import metricpipe
from metricpipe.cli import main
from metricpipe.stages import run_encode, run_train
from metricpipe.store import open_array
from metricpipe.tasks.errors import InputError
from tests.conftest import make_blobs, staged

METHODS = [
    {"method": "identity"},
    {"method": "pca", "dim": 4},
    {"method": "lda"},  # fixed: no selection
    {"method": "ncmml", "dim": 4, "iters": 30, "batch": 50, "validate_every": 10, "validation": 50, "select": False},
    {"method": "slne", "dim": 3, "input_dim": 6, "epochs": 1, "select": False},
    {"method": "slde", "dim": 3, "input_dim": 6, "epochs": 1, "select": False},  # members: the rule's
    {"method": "sparse", "dim": 3, "sparsity": 0.5, "train_size": 100, "max_iter": 3, "queries": 10, "select": False},
    {"method": "nml", "dim": 3, "pairs": 500, "iters": 1000, "select": False},
    {"method": "slem", "lam": 0.1, "negatives": {"count": 100}},
    {"method": "slem", "kernel": "gaussian", "lam": 0.1, "gamma": 1.0, "negatives": {"count": 100}},
    {"method": "esvm", "lam": 0.1, "epochs": 1, "negatives": {"count": 100}},
    {"method": "linear-ml", "dim": 3, "pairs": 500, "iters": 1000, "select": False},
]


@pytest.fixture(scope="module")
def stored(client, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("models")
    X, y = make_blobs(n=500, d=10, classes=4, sep=1.0, seed=2)
    X = np.abs(X) * 3.0  # raw features, non-negative (NML), far from unit norm
    np.savez(tmp / "d.npz", X=X, y=y)
    raw = {
        "data": {"path": str(tmp / "d.npz"), "chunk_mb": 0.002, "normalize": "l2"},
        "methods": METHODS,
        "neighbours": {"k": 5},
        "evaluate": {"classification": {"classifiers": ["knn1"]}},
    }  # kernel SLEM serves no ncm
    ctx, data, stats = staged(client, tmp / "s", raw)
    from metricpipe.stages import run_neighbours

    graph = run_neighbours(ctx, data)
    models = run_train(ctx, data, stats, graph)
    codes = run_encode(ctx, data, models)
    return ctx, data, X, models, codes


@pytest.mark.integration
def test_load_model_reproduces_the_stored_codes_from_raw_features(stored):
    ctx, data, X, models, codes = stored
    assert len(data.chunks) > 5
    for (spec, unit, _), (_, cunit, dim) in zip(models, codes):
        est = metricpipe.load_model(ctx.store.url, unit.key)
        assert est.steps[0][0] == "normalize" and type(est[-1]).method == spec["method"]
        stored_codes = open_array(f"{cunit.url}/codes")[:]
        mine = np.concatenate([est.transform(X[a:b]) for a, b in data.chunks])  # the encode stage's blocks
        np.testing.assert_array_equal(mine, stored_codes, err_msg=spec["method"])
        assert mine.shape[1] == dim
        if (
            hasattr(est[-1], "get_feature_names_out") and spec["method"] != "slem"
        ):  # (kernel SLEM's codes: Eq. 16's parts)
            assert list(est.get_feature_names_out()) == list(est[-1].get_feature_names_out()), spec["method"]


@pytest.mark.integration
def test_load_model_by_key_prefix_and_its_errors(stored):
    ctx, _, X, models, _ = stored
    key = models[1][1].key
    assert metricpipe.load_model(ctx.store.url, key[:6])[-1].get_params()["dim"] == 4
    with pytest.raises(InputError, match="no committed model 'zzz'"):
        metricpipe.load_model(ctx.store.url, "zzz")
    n_units = len([u for u in ctx.store.units("models") if u.done()])  # finals and the fits they refit
    assert n_units > len(models)
    with pytest.raises(InputError, match=f"matches {n_units} models"):
        metricpipe.load_model(ctx.store.url, "")
    assert metricpipe.load_model(ctx.store.url, key[:6].upper())[-1].get_params()["dim"] == 4  # hex, any case
    with pytest.raises(InputError, match=r"a model key is text, .* got 123"):
        metricpipe.load_model(ctx.store.url, 123)
    with pytest.raises(InputError, match=r"/models: not a metricpipe store"):  # STORE/models for STORE
        metricpipe.load_model(f"{ctx.store.url}/models", key)


@pytest.mark.integration
def test_an_edited_or_truncated_commit_record_is_a_damaged_model(stored, tmp_path):
    """The marker's class names were not checked: reversed, load_model predicted other labels
    (accuracy 0.004 instead of 0.99) without a word; a truncated marker said 'no committed model'."""
    import json
    import shutil

    ctx, _, _, models, _ = stored
    copy = tmp_path / "s"
    shutil.copytree(ctx.store.url, copy)
    key = next(u.key for spec, u, _ in models if spec["method"] == "ncmml")
    marker = copy / "models" / f"{key}.committed.json"
    meta = json.loads(marker.read_text())
    assert meta["class_names"] and meta["record"]
    meta["class_names"] = meta["class_names"][::-1]
    marker.write_text(json.dumps(meta))
    with pytest.raises(InputError, match=f"model {key} is damaged: its commit record"):
        metricpipe.load_model(str(copy), key)
    marker.write_text(json.dumps(meta)[:40])
    with pytest.raises(InputError, match=f"model {key} is damaged: its commit record .* --repair"):
        metricpipe.load_model(str(copy), key[:8])
    res = CliRunner().invoke(main, ["models", str(copy)])  # (click >= 8.2: output holds stderr too)
    assert res.exit_code == 0 and f"1 model(s) with a damaged commit marker, not listed: {key}" in res.output
    assert not any(line.startswith(key) for line in res.output.splitlines())
    marker.write_bytes(b'{"key": "\xb1"}')  # not UTF-8 (a flipped high bit); then not a mapping
    for body in (None, b"null", b"[]"):
        if body:
            marker.write_bytes(body)
        with pytest.raises(InputError, match=f"model {key} is damaged"):
            metricpipe.load_model(str(copy), key)


@pytest.mark.integration
def test_models_command_lists_every_model_with_its_method_and_parameters(stored):
    ctx, _, _, models, _ = stored
    res = CliRunner().invoke(main, ["models", ctx.store.url])
    assert res.exit_code == 0, res.output
    header, *lines = res.output.strip().splitlines()
    assert header.split()[:3] == ["key", "method", "codes"]
    lines = [ln for ln in lines if ln.strip() and not ln.startswith("encoded no")]  # the footnote aside
    assert len(lines) == len([u for u in ctx.store.units("models") if u.done()])  # the fits refitted too
    for spec, unit, _ in models:
        [line] = [ln for ln in lines if ln.startswith(unit.key)]
        assert f" {spec['method']} " in line and line.split()[3] == "yes"
        # which data and normalisation: two models of the same method and size from different runs differ here
        meta = unit.meta()
        assert line.split()[4:6] == [meta["data"][:8], meta["normalize"]], line
    assert any("input_dim=6" in ln and " slne " in ln for ln in lines)
    # SL-DE's member count, unset in the config, as the rule resolved it (1 block of 6 PCA directions)
    assert any(" slde " in ln and "members=1 (rule)" in ln for ln in lines), lines
    # random_state: 0 and unset are one model (seed 0): listed as the seed, not as None
    assert not any("random_state=None" in ln for ln in lines) and any("random_state=0" in ln for ln in lines)


@pytest.mark.integration
def test_a_model_its_run_did_not_encode_is_marked_and_named_as_such(stored, tmp_path):
    """A selection candidate that was not kept has no codes: `models` says encoded no, and the
    commands that need its codes say why rather than suggesting a rerun that would not encode it."""
    import os
    import shutil

    ctx, _, _, models, codes = stored
    store = tmp_path / "store"
    shutil.copytree(ctx.store.url, store)
    dropped = models[1][1].key  # pca-4 stands in for a candidate
    os.remove(store / f"codes/{codes[1][1].key}.committed.json")
    res = CliRunner().invoke(main, ["models", str(store)])
    assert res.exit_code == 0, res.output
    flags = {
        ln.split()[0]: ln.split()[3] for ln in res.output.splitlines()[1:] if ln.split() and len(ln.split()[0]) == 16
    }
    assert flags[dropped] == "no" and sum(v == "yes" for v in flags.values()) == len(models) - 1
    assert "encoded no: a candidate that parameter selection did not keep" in res.output
    res = CliRunner().invoke(main, ["export", str(store), "--model", dropped, "--faiss", str(tmp_path / "x.faiss")])
    assert (
        res.exit_code == 2
        and f"model {dropped} was not encoded by its run (a candidate that parameter selection did not keep"
        in res.output
    ), res.output
    (store / "runs").mkdir(exist_ok=True)  # in its run's list: the codes were lost, a rerun makes them
    (store / "runs/latest.json").write_text('{"units": {"models": ["models/%s"]}}' % dropped)
    res = CliRunner().invoke(main, ["export", str(store), "--model", dropped, "--faiss", str(tmp_path / "x.faiss")])
    assert res.exit_code == 2 and "has no committed codes; rerun 'metricpipe run CONFIG --resume'" in res.output, (
        res.output
    )
    # a model add-classes made has no codes of its own: the message names the model it extends
    from metricpipe.commands.classes import add_classes

    ncm = next(u.key for s, u, _ in models if s["method"] == "ncmml")
    np.savez(tmp_path / "new.npz", X=np.ones((4, 10), np.float32), y=np.array([11, 11, 12, 12]))
    [info] = add_classes(str(store), str(tmp_path / "new.npz"), model=ncm, log=lambda m: None)
    ext = info["model"].split("/")[-1]
    res = CliRunner().invoke(main, ["export", str(store), "--model", ext, "--faiss", str(tmp_path / "x.faiss")])
    assert res.exit_code == 2 and f"was made by add-classes from model {ncm}, which has the codes" in res.output, (
        res.output
    )


@pytest.mark.integration
def test_a_loaded_classifier_predicts_the_data_s_own_labels(client, tmp_path):
    """Class names of any type (here strings) come back from predict, not the stored class codes."""
    X, y = make_blobs(n=300, d=6, classes=3, sep=3.0, seed=1)
    names = np.array(["ant", "bee", "cat"])[y]
    np.savez(tmp_path / "d.npz", X=X, y=names)
    ctx, data, stats = staged(
        client,
        tmp_path / "s",
        {
            "data": {"path": str(tmp_path / "d.npz"), "chunk_mb": 0.002},
            "methods": [
                {
                    "method": "ncmml",
                    "dim": 3,
                    "iters": 20,
                    "batch": 50,
                    "validate_every": 10,
                    "validation": 30,
                    "lr": 0.1,
                }
            ],
        },
    )
    [(_, unit, _)] = run_train(ctx, data, stats, None)
    est = metricpipe.load_model(ctx.store.url, unit.key)
    assert list(est.classes_) == ["ant", "bee", "cat"]
    assert set(est.predict(X)) <= {"ant", "bee", "cat"} and est.score(X, names) > 0.9


def test_a_model_stored_before_estimators_is_a_one_line_error(tmp_path):
    from metricpipe.store import load_estimator, save_arrays

    save_arrays(str(tmp_path / "old"), {"W": np.eye(3, dtype=np.float32)}, {"spec": {"method": "pca"}, "dim": 3})
    with pytest.raises(InputError, match="stored by metricpipe before 0.2.*rerun its config"):
        load_estimator(str(tmp_path / "old"))


# -- results that leave the run: encode, export, predict ------------------------------------------------------


def _stored_codes(cunit):
    return open_array(f"{cunit.url}/codes")[:]


def _by(models, codes, method, **params):
    """((spec, model unit), (spec, codes unit, dim)) of the stored model of this method (and params)."""
    [i] = [
        i
        for i, (spec, _, _) in enumerate(models)
        if spec["method"] == method and all(spec.get(k) == v for k, v in params.items())
    ]
    return models[i], codes[i]


@pytest.mark.integration
def test_encode_reproduces_the_stored_codes_bit_for_bit_for_every_model_kind(stored, tmp_path):
    ctx, data, X, models, codes = stored
    src = ctx.config.data.path
    y = np.load(src)["y"]
    for (spec, unit, _), (_, cunit, _) in zip(models, codes):
        out = tmp_path / f"{spec['method']}-{unit.key}.npz"
        res = CliRunner().invoke(main, ["encode", ctx.store.url, src, "--model", unit.key, "--out", str(out)])
        assert res.exit_code == 0, res.output
        with np.load(out) as z:
            np.testing.assert_array_equal(z["X"], _stored_codes(cunit), err_msg=spec["method"])
            np.testing.assert_array_equal(z["y"], y)
        assert f"Encoded 500 rows with model {unit.key}" in res.output


@pytest.mark.parametrize("fmt", [".npy", ".zarr", ".parquet"])
@pytest.mark.integration
def test_encode_writes_every_format_with_labels_and_ids(stored, tmp_path, fmt):
    ctx, data, X, models, codes = stored
    d = np.load(ctx.config.data.path)
    ids = np.arange(1000, 1000 + len(X)) * 7
    src = tmp_path / "with_ids.npz"
    np.savez(src, X=d["X"], y=np.array(["a", "b", "c", "d"])[d["y"]], rid=ids)
    (spec, unit, _), (_, cunit, dim) = _by(models, codes, "slne")  # inner-product codes
    out = tmp_path / f"codes{fmt}"
    res = CliRunner().invoke(
        main, ["encode", ctx.store.url, str(src), "--model", unit.key[:8], "--out", str(out), "--ids", "rid"]
    )
    assert res.exit_code == 0, res.output
    want = _stored_codes(cunit)
    labels = np.array(["a", "b", "c", "d"])[d["y"]]
    if fmt == ".npy":
        np.testing.assert_array_equal(np.load(out), want)
    elif fmt == ".zarr":
        import zarr

        g = zarr.open_group(str(out), mode="r")
        np.testing.assert_array_equal(g["X"][:], want)
        assert list(g["y"][:]) == list(labels) and list(g["ids"][:]) == list(ids)
    else:
        import pyarrow.parquet as pq

        t = pq.read_table(out)
        assert t.column_names == ["id", "label", "code"]
        np.testing.assert_array_equal(np.stack(t.column("code").to_numpy(zero_copy_only=False)), want)
        assert t.column("label").to_pylist() == list(labels) and t.column("id").to_pylist() == list(ids)
    assert not list(tmp_path.glob("*.partial*"))


def _codes_in(out):
    if out.suffix == ".npy":
        return np.load(out)
    if out.suffix == ".npz":
        with np.load(out) as z:
            return z["X"]
    if out.suffix == ".zarr":
        import zarr

        return zarr.open_group(str(out), mode="r")["X"][:]
    import pyarrow.parquet as pq

    return np.stack(pq.read_table(out).column("code").to_numpy(zero_copy_only=False))


@pytest.mark.parametrize("fmt", [".npy", ".npz", ".zarr", ".parquet"])
@pytest.mark.integration
def test_two_encodes_to_one_out_at_once_leave_one_model_s_codes_whole(stored, tmp_path, monkeypatch, fmt):
    """Both wrote the fixed temporary name OUT.partial.npy: one failed with a traceback, or both said
    they succeeded and OUT held the second model's codes (or a mix)."""
    import threading

    import metricpipe.commands.export as export

    ctx, data, X, models, codes = stored
    (_, pca, _), (_, pca_codes, _) = _by(models, codes, "pca")
    (_, ncm, _), (_, ncm_codes, _) = _by(models, codes, "ncmml")
    out = tmp_path / f"codes{fmt}"
    both_open, real = threading.Barrier(2, timeout=60), export.encode_rows

    def in_step(model_url, data, features, normalize, start, stop):
        if start == 0:
            both_open.wait()  # each has opened its output before either writes a block
        return real(model_url, data, features, normalize, start, stop)

    monkeypatch.setattr(export, "encode_rows", in_step)
    results = {}

    def one(key):
        try:
            results[key] = export.encode(ctx.store.url, key, ctx.config.data.path, str(out), log=lambda m: None)
        except BaseException as e:  # noqa: BLE001 - what the command would have met
            results[key] = e

    threads = [threading.Thread(target=one, args=(u.key,)) for u in (pca, ncm)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    refused = [r for r in results.values() if isinstance(r, BaseException)]
    assert len(results) == 2 and len(refused) <= 1, results
    assert all(
        isinstance(e, InputError) and "was written by another command meanwhile (--out)" in str(e) for e in refused
    ), refused
    got = _codes_in(out)
    assert any(
        got.shape == _stored_codes(c).shape and np.array_equal(got, _stored_codes(c)) for c in (pca_codes, ncm_codes)
    )
    assert [p.name for p in tmp_path.iterdir()] == [out.name]  # no temporary left


@pytest.mark.integration
def test_encode_on_the_cluster_gives_the_same_codes_in_row_order(stored, client, tmp_path):
    import contextlib

    from metricpipe.commands.export import encode

    ctx, data, X, models, codes = stored
    (spec, unit, _), (_, cunit, _) = _by(models, codes, "sparse")
    out = tmp_path / "c.npz"
    lines = []
    r = encode(
        ctx.store.url,
        unit.key,
        ctx.config.data.path,
        str(out),
        client_factory=lambda: contextlib.nullcontext(client),
        cluster_given=True,
        log=lines.append,
    )
    assert r["rows"] == len(X) and any(ln.startswith("  encode: 500/500 rows") for ln in lines)
    np.testing.assert_array_equal(np.load(out)["X"], _stored_codes(cunit))


def _apply_model_from_docs():
    """The user guide's numpy-only apply_model (docs/guide/index.md), executed with numpy alone in its
    namespace."""
    from pathlib import Path

    text = (Path(__file__).parents[2] / "docs" / "guide" / "index.md").read_text()
    block = text.split("(apply-model)=\n```python\n", 1)[1].split("```", 1)[0]
    ns = {}
    exec(compile(block, "docs/guide/index.md", "exec"), ns)
    assert not {k for k, v in ns.items() if getattr(v, "__name__", "").startswith("metricpipe")}
    return ns["apply_model"]


@pytest.mark.integration
def test_npz_export_applied_with_numpy_alone_reproduces_the_codes(stored, tmp_path):
    ctx, data, X, models, codes = stored
    apply_model = _apply_model_from_docs()
    kinds = set()
    for (spec, unit, _), (_, cunit, _) in zip(models, codes):
        out = tmp_path / f"{unit.key}.npz"
        res = CliRunner().invoke(main, ["export", ctx.store.url, "--model", unit.key, "--npz", str(out)])
        if spec["method"] == "esvm":
            assert res.exit_code == 2 and "ESVM codes have no closed form" in res.output and not out.exists()
            continue
        assert res.exit_code == 0, res.output
        want = _stored_codes(cunit)
        got = apply_model(str(out), X)
        kinds.add(str(np.load(out)["model_json"]))
        assert got.shape == want.shape, spec
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * np.abs(want).max(), err_msg=spec["method"])
    assert len(kinds) == len(models) - 1


@pytest.fixture(scope="module")
def retrieval_run(client, tmp_path_factory):
    """A run with 1,250 test rows: PCA (L2 codes) and SL-NE (inner-product codes), encoded."""
    from metricpipe.stages import run_neighbours

    tmp = tmp_path_factory.mktemp("retrieval")
    X, y = make_blobs(n=5000, d=16, classes=8, sep=1.0, seed=5)
    np.savez(tmp / "d.npz", X=X, y=y)
    ctx, data, stats = staged(
        client,
        tmp / "s",
        {
            "data": {"path": str(tmp / "d.npz"), "split": {"test": 0.25}},
            "methods": [
                {"method": "pca", "dim": 8},
                {"method": "slne", "dim": 6, "input_dim": 8, "epochs": 1, "select": False},
            ],
            "neighbours": {"k": 10},
        },
    )
    models = run_train(ctx, data, stats, run_neighbours(ctx, data))
    return ctx, data, models, run_encode(ctx, data, models)


@pytest.mark.integration
def test_faiss_export_returns_the_pipeline_s_retrieval_top10_for_1000_queries(retrieval_run, tmp_path):
    import faiss

    from metricpipe.stages.common import TEST
    from metricpipe.tasks.evaluation import scores

    ctx, data, models, codes = retrieval_run
    test = data.rows(TEST)
    queries = test[:1000]
    for method in ("pca", "slne"):  # L2 and inner product
        (spec, unit, _), (_, cunit, _) = _by(models, codes, method)
        out = tmp_path / f"{method}.faiss"
        res = CliRunner().invoke(main, ["export", ctx.store.url, "--model", unit.key, "--faiss", str(out)])
        assert res.exit_code == 0, res.output
        assert ("inner product" if method == "slne" else "L2") in res.output
        C = _stored_codes(cunit)
        index = faiss.read_index(str(out))
        assert index.ntotal == len(test)
        _, ids = index.search(C[queries], 11)
        d = scores(C[queries], C[test], "inner" if method == "slne" else "euclidean")  # the evaluate stage's scores
        d[np.arange(len(queries)), np.arange(len(queries))] = np.inf  # a query is not its own hit
        same = 0
        for q, row in enumerate(ids):
            mine = [r for r in row if r != queries[q]][:10]
            theirs = test[np.argsort(d[q], kind="stable")[:10]]
            same += set(mine) == set(theirs)
            # any difference is only in the order of exactly tied scores
            np.testing.assert_allclose(
                np.sort(d[q][np.searchsorted(test, mine)]),
                np.sort(d[q][np.searchsorted(test, theirs)]),
                rtol=1e-5,
                atol=1e-6,
            )
        assert same >= 995, (method, same)


@pytest.mark.integration
def test_faiss_export_is_ivf_past_the_threshold_and_refuses_kernel_slem(stored, tmp_path, monkeypatch):
    import faiss

    import metricpipe.commands.export as ex

    ctx, data, X, models, codes = stored
    monkeypatch.setattr(ex, "IVF_ABOVE", 50)
    r = ex.export_faiss(ctx.store.url, _by(models, codes, "pca")[0][1].key, str(tmp_path / "ivf.faiss"), split="all")
    assert r["index"] == "IVF" and r["rows"] == len(X)
    index = faiss.extract_index_ivf(faiss.read_index(str(tmp_path / "ivf.faiss")))
    assert index.nlist == int(4 * np.sqrt(len(X)))
    res = CliRunner().invoke(
        main,
        [
            "export",
            ctx.store.url,
            "--model",
            _by(models, codes, "slem", kernel="gaussian")[0][1].key,
            "--faiss",
            str(tmp_path / "k.faiss"),
        ],
    )
    assert res.exit_code == 2 and "which faiss has no index for" in res.output and "Traceback" not in res.output


@pytest.mark.integration
def test_export_faiss_and_predict_refuse_damaged_codes_in_one_line(stored, tmp_path):
    """Both read the stored codes (not the model): a flipped byte there would give a wrong index or
    wrong neighbours without a word."""
    from pathlib import Path

    ctx, data, X, models, codes = stored
    (_, unit, _), (_, cunit, _) = _by(models, codes, "pca")
    chunk = sorted(p for p in Path(cunit.url, "codes").rglob("*") if p.is_file() and p.name != "zarr.json")[0]
    good = chunk.read_bytes()
    chunk.write_bytes(good[:-1] + bytes([good[-1] ^ 0xFF]))
    try:
        for args in (
            ["export", ctx.store.url, "--model", unit.key, "--faiss", str(tmp_path / "x.faiss")],
            ["predict", ctx.store.url, ctx.config.data.path, "--model", unit.key, "--k", "1"],
        ):
            res = CliRunner().invoke(main, args)
            assert res.exit_code == 2 and res.output.count("\n") == 1, res.output
            assert (
                f"the codes of model {unit.key} are damaged: codes/{cunit.key}/codes/" in res.output
                and "checksum differs" in res.output
                and "--repair" in res.output
            ), res.output
        assert not (tmp_path / "x.faiss").exists()
    finally:
        chunk.write_bytes(good)


@pytest.mark.integration
def test_codes_check_reads_only_the_chunks_of_the_rows_it_serves(stored, monkeypatch):
    """On object storage each checked chunk is a download: a split's rows check the chunks that hold
    them (and the metadata), not the whole array, and a damaged one among them is still caught."""
    from pathlib import Path

    import metricpipe.commands.export as ex
    from metricpipe.store import Store

    ctx, data, X, models, codes = stored
    (_, unit, _), (_, cunit, _) = _by(models, codes, "pca")
    meta = unit.meta()
    step = open_array(f"{cunit.url}/codes").chunks[0]
    monkeypatch.setattr(ex, "split_rows", lambda store, meta, split: np.arange(step + 1))  # chunks 0 and 1
    chunks = {int(p.parent.name): p for p in Path(cunit.url, "codes", "c").rglob("*") if p.is_file()}
    assert len(chunks) > 2
    import metricpipe.store.units as st

    read, size_crc = [], st.size_crc
    monkeypatch.setattr(st, "size_crc", lambda fs, path: read.append(path) or size_crc(fs, path))
    for i, expect_bad in ((len(chunks) - 1, False), (1, True)):
        good = chunks[i].read_bytes()
        chunks[i].write_bytes(good[:-1] + bytes([good[-1] ^ 0xFF]))
        try:
            if expect_bad:
                with pytest.raises(InputError, match=f"codes/{cunit.key}/codes/c/1/0: checksum differs"):
                    ex.codes_unit(Store(ctx.store.url), unit, meta, "test")
            else:
                cu, rows = ex.codes_unit(Store(ctx.store.url), unit, meta, "test")
                assert cu.key == cunit.key and list(rows) == list(range(step + 1))
                assert sorted(p.split("/codes/c/")[1] for p in read if "/codes/c/" in p) == ["0/0", "1/0"]
        finally:
            chunks[i].write_bytes(good)


@pytest.mark.integration
def test_predict_classifies_with_any_model_by_the_nearest_train_codes(stored, tmp_path):
    from sklearn.neighbors import KNeighborsClassifier

    from metricpipe.stages.common import TRAIN

    ctx, data, X, models, codes = stored
    src = ctx.config.data.path
    y = np.load(src)["y"]
    train = data.rows(TRAIN)
    (spec, unit, _), (_, cunit, _) = _by(models, codes, "pca")  # no class means of its own
    out = tmp_path / "pred.npy"
    res = CliRunner().invoke(
        main, ["predict", ctx.store.url, src, "--model", unit.key, "--labels", "y", "--k", "1", "--out", str(out)]
    )
    assert res.exit_code == 0, res.output
    C = _stored_codes(cunit)
    ref = KNeighborsClassifier(n_neighbors=1, algorithm="brute").fit(C[train], y[train]).predict(C)
    pred = np.load(out)
    assert pred.dtype == np.int64 and np.mean(pred == ref) >= 0.998  # equal up to exactly tied distances
    assert f"top-1 error {np.mean(pred != y):.4f}" in res.output
    res = CliRunner().invoke(main, ["predict", ctx.store.url, src, "--model", unit.key, "--k", "1"])
    assert res.exit_code == 0 and f"top-1 error {np.mean(pred != y):.4f}" in res.output, res.output  # its y, unnamed
    y_new = y.copy()
    y_new[:7] = y.max() + 1  # a class the model never saw: 7 certain errors, said so
    np.save(tmp_path / "y_new.npy", y_new)
    res = CliRunner().invoke(
        main, ["predict", ctx.store.url, src, "--model", unit.key, "--k", "1", "--labels", str(tmp_path / "y_new.npy")]
    )
    assert res.exit_code == 0, res.output
    assert (
        f"top-1 error {np.mean(pred != y_new):.4f} (7 rows whose label is not a class of the model count as errors)"
    ) in res.output
    # the default k (10) and a kernel SLEM model, whose codes compare by Eq. 16's similarity
    from metricpipe.tasks.slem import similarity

    (kspec, kunit, _), (_, kcu, _) = _by(models, codes, "slem", kernel="gaussian")
    res = CliRunner().invoke(main, ["predict", ctx.store.url, src, "--model", kunit.key, "--k", "1", "--out", str(out)])
    assert res.exit_code == 0, res.output
    K = _stored_codes(kcu)
    ref = y[train][np.argmax(similarity(K, K[train], ctx.store.unit("models", kunit.key).meta()["score"]), axis=1)]
    assert np.mean(np.load(out) == ref) >= 0.998


@pytest.mark.parametrize(
    "args, message",
    [
        (["--out", "{tmp}/c.txt"], "unknown output format (--out); name it with one of .npy, .npz, .zarr, .parquet"),
        (["--out", "{tmp}/nowhere/c.npy"], "its folder does not exist (--out)"),
        (["--out", "{tmp}/c.npy", "--labels", "nope"], "no array 'nope'"),
        (["--out", "{tmp}/c.npy", "--model", "zzz"], "no committed model 'zzz'"),
    ],
)
@pytest.mark.integration
def test_encode_bad_input_is_one_line(stored, tmp_path, args, message):
    ctx, data, X, models, codes = stored
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    if "--model" not in args:
        args += ["--model", models[0][1].key]
    res = CliRunner().invoke(main, ["encode", ctx.store.url, ctx.config.data.path, *args])
    assert res.exit_code == 2 and message in res.output, res.output
    assert len(res.output.strip().splitlines()) == 1 and not list(tmp_path.iterdir())


@pytest.mark.integration
def test_encode_refuses_bad_rows_and_the_wrong_width_without_leaving_a_file(stored, tmp_path):
    ctx, data, X, models, codes = stored
    bad = X.copy()
    bad[3, 2] = np.nan
    np.savez(tmp_path / "nan.npz", X=bad)
    np.savez(tmp_path / "wide.npz", X=np.ones((5, 11), np.float32))
    key = _by(models, codes, "pca")[0][1].key
    np.savez(tmp_path / "ids.npz", X=X, rid=np.arange(7))
    np.savez(tmp_path / "empty.npz", X=np.zeros((0, 10), np.float32))
    import h5py

    with h5py.File(tmp_path / "holes.h5", "w") as f:  # rows 100-199 never written: zeros
        f.create_dataset("X", shape=X.shape, chunks=(100, 10), dtype="f4")[:100] = X[:100]
        f["X"][200:] = X[200:]
    for f, msg in (
        ("nan.npz", "row 3"),
        ("wide.npz", "features have 11 dimensions but model"),
        ("holes.h5", "dataset 'X' (--features) has 1 of its 5 chunk(s) never written (the first from row 100)"),
        ("ids.npz", "(--ids rid): 7 ids for 500 rows; give one id per row"),
        ("empty.npz", "no rows to encode (DATA)"),
    ):
        res = CliRunner().invoke(
            main,
            [
                "encode",
                ctx.store.url,
                str(tmp_path / f),
                "--model",
                key,
                "--out",
                str(tmp_path / "c.npz"),
                "--ids",
                "rid",
            ]
            if f == "ids.npz"
            else ["encode", ctx.store.url, str(tmp_path / f), "--model", key, "--out", str(tmp_path / "c.npz")],
        )
        assert res.exit_code == 2 and msg in res.output and "Traceback" not in res.output, res.output
        assert not (tmp_path / "c.npz").exists() and not list(tmp_path.glob("*partial*"))
    res = CliRunner().invoke(main, ["export", ctx.store.url, "--model", key])
    assert res.exit_code == 2 and "nothing to write; give --faiss PATH and/or --npz PATH" in res.output


@pytest.mark.parametrize("fmt", [".npz", ".zarr", ".parquet"])
@pytest.mark.integration
def test_encode_refuses_labels_or_ids_that_are_not_one_per_row(stored, tmp_path, fmt):
    """2-D ids were an ArrowInvalid (parquet) or a zarr ValueError, and .npz stored a 2-D y."""
    ctx, data, X, models, codes = stored
    key = _by(models, codes, "pca")[0][1].key
    np.savez(
        tmp_path / "d.npz", X=X, y2=np.zeros((len(X), 2), int), rid2=np.zeros((len(X), 3), int), y=np.arange(len(X)) % 3
    )
    out = tmp_path / f"c{fmt}"
    for extra, msg in (
        (
            ["--labels", "y2"],
            r"d.npz \(--labels y2\): labels of shape \(500, 2\); give a 1-D array "
            r"with one label per row$",
        ),
        (
            ["--ids", "rid2"],
            r"d.npz \(--ids rid2\): ids of shape \(500, 3\); give a 1-D array with one "
            r"id per row$",
        ),
    ):
        res = CliRunner().invoke(
            main, ["encode", ctx.store.url, str(tmp_path / "d.npz"), "--model", key, "--out", str(out), *extra]
        )
        assert res.exit_code == 2 and "Traceback" not in res.output, res.output
        [line] = res.output.strip().splitlines()
        assert re.search(r"^error: \S+" + msg, line), line
        assert sorted(p.name for p in tmp_path.iterdir()) == ["d.npz"]


@pytest.mark.integration
def test_outputs_never_destroy_the_input_or_an_existing_folder(stored, tmp_path):
    ctx, data, X, models, codes = stored
    key = _by(models, codes, "pca")[0][1].key
    import zarr

    g = zarr.open_group(str(tmp_path / "in.zarr"), mode="w")
    g.create_array("X", shape=X.shape, dtype="float32")[:] = X
    (tmp_path / "other.zarr").mkdir()
    (tmp_path / "other.zarr" / "notes.txt").write_text("mine")
    np.save(tmp_path / "in.npy", X)
    np.save(tmp_path / "labs.npy", np.arange(len(X)) % 3)
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    for cmd, msg in (
        (
            ["encode", ctx.store.url, str(tmp_path / "in.zarr"), "--model", key, "--out", str(tmp_path / "in.zarr")],
            "is the input DATA (--out)",
        ),
        (
            ["encode", ctx.store.url, str(tmp_path / "in.npy"), "--model", key, "--out", str(tmp_path / "other.zarr")],
            "a folder that already exists (--out)",
        ),
        (
            ["predict", ctx.store.url, str(tmp_path / "in.npy"), "--model", key, "--out", str(tmp_path / "in.npy")],
            "is the input DATA (--out)",
        ),
        (
            [
                "encode",
                ctx.store.url,
                str(tmp_path / "in.npy"),
                "--model",
                key,
                "--labels",
                str(tmp_path / "labs.npy"),
                "--out",
                str(tmp_path / "labs.npy"),
            ],
            "is the input --labels (--out)",
        ),
        (
            [
                "evaluate",
                str(tmp_path / "in.npy"),
                "--labels",
                str(tmp_path / "labs.npy"),
                "--out",
                str(tmp_path / "labs.npy"),
            ],
            "is the input --labels (--out)",
        ),
    ):
        res = CliRunner().invoke(main, cmd)
        assert res.exit_code == 2 and msg in res.output and len(res.output.strip().splitlines()) == 1, res.output
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before
    # an existing file is replaced (atomically), as before
    out = tmp_path / "c.npy"
    np.save(out, np.zeros(3))
    res = CliRunner().invoke(
        main, ["encode", ctx.store.url, str(tmp_path / "in.npy"), "--model", key, "--out", str(out)]
    )
    assert res.exit_code == 0 and np.load(out).shape[0] == len(X), res.output


@pytest.mark.integration
def test_predict_refuses_a_row_that_found_no_labelled_neighbour(stored, monkeypatch):
    """kNN rankings leave classes without a vote unranked (-1); a row whose code is not finite finds no
    neighbour at all, and names[-1] would have labelled it with the last class."""
    import metricpipe.commands.classes as predicting

    ctx, data, X, models, codes = stored
    (_, unit, _), _ = _by(models, codes, "pca")
    real = predicting.knn_predict
    monkeypatch.setattr(
        predicting, "knn_predict", lambda *a, **k: np.where(np.arange(len(a[0])) == 3, -1, real(*a, **k))
    )
    res = CliRunner().invoke(main, ["predict", ctx.store.url, ctx.config.data.path, "--model", unit.key, "--k", "1"])
    assert (
        res.exit_code == 2
        and res.output.count("\n") == 1
        and "row 3 has no neighbour among the train codes" in res.output
    ), res.output


def test_encode_in_this_process_runs_blas_on_one_thread_as_the_workers_do(tmp_path, monkeypatch):
    """A product's bits depend on BLAS's thread count: kernel SLEM's codes from `metricpipe encode`
    differed from the stored ones by up to 6e-8 on a 2-thread BLAS (workers run one thread)."""
    from threadpoolctl import threadpool_info, threadpool_limits

    from metricpipe.commands import export

    seen = []

    class Probe:
        def transform(self, X):
            seen.append({p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"})
            return X[:, :2]

    np.save(tmp_path / "X.npy", np.ones((4, 3), np.float32))
    monkeypatch.setattr(export, "_model", lambda url: Probe())
    with threadpool_limits(2, user_api="blas"):
        codes = export.encode_rows("m", str(tmp_path / "X.npy"), "X", "none", 0, 4)
        assert {p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"} == {2}  # restored
    assert seen == [{1}] and codes.shape == (4, 2)


@pytest.mark.integration
def test_after_an_upgrade_the_store_s_models_keep_their_codes(stored, monkeypatch, tmp_path):
    """The codes key holds the release: after a version bump `models` said 'encoded no' for every model
    of an older run and export --faiss / predict refused them. Markers now name their release."""
    from metricpipe.store.models import describe

    ctx, _, _, models, codes = stored
    before = {r["key"]: r["encoded"] for r in describe(ctx.store.url)}
    assert all(before[u.key] for _, u, _ in models)
    monkeypatch.setattr(metricpipe, "__version__", "99.0.0")
    assert {r["key"]: r["encoded"] for r in describe(ctx.store.url)} == before
    key = models[0][1].key
    res = CliRunner().invoke(main, ["export", ctx.store.url, "--model", key, "--faiss", str(tmp_path / "i.faiss")])
    assert res.exit_code == 0, res.output
    # a store made before markers named their release: its last run's release is the guess
    import json
    import shutil

    old = tmp_path / "old"
    shutil.copytree(ctx.store.url, old)
    for marker in (old / "models").glob("*.committed.json"):
        meta = json.loads(marker.read_text())
        del meta["version"], meta["record"]  # (nor their own digest)
        marker.write_text(json.dumps(meta))
    (old / "runs").mkdir(exist_ok=True)
    (old / "runs/latest.json").write_text(json.dumps({"versions": {"metricpipe": meta_version(ctx)}}))
    assert {r["key"]: r["encoded"] for r in describe(str(old))} == before


def meta_version(ctx):
    import json
    from pathlib import Path

    return json.loads(next(Path(ctx.store.url, "models").glob("*.committed.json")).read_text())["version"]


@pytest.mark.integration
def test_the_disk_rule_prices_every_learners_codes_as_encode_writes_them(stored):
    """``stages.encode.stored_bytes`` (each learner's ``stored_width``: codes, and a bilinear
    learner's two exact views) against the bytes of the chunks the encode stage wrote."""
    from metricpipe.stages import encode

    ctx, data, _, models, codes = stored
    specs = [spec for spec, *_ in models]
    needs = encode.stored_bytes(data, ctx.config, specs)
    assert len(needs) == len(specs)  # (no encode.pq here)
    for spec, (what, need, _), (_, cunit, _) in zip(specs, needs, codes):
        sizes = cunit.file_sizes()
        views = {"codes", "query", "base"} & {name.split("/")[0] for name in sizes}
        chunks = sum(size for name, size in sizes.items() if name.split("/")[0] in views and "/c/" in name)
        assert chunks > 0 and need >= chunks, (spec["method"], need, chunks)
        # exact but for SL-NE and SL-DE, whose codes are the positive part of M (``dim`` at most)
        assert need == chunks or spec["method"] in ("slne", "slde"), (spec["method"], need, chunks)
        assert ("query" in views) == (spec["method"] in ("slne", "slde")), spec["method"]


@pytest.mark.integration
def test_an_slde_model_keeps_none_of_its_members_scratch_rows(stored):
    """SL-DE's training rows are written once in every member's subspace into its unit
    (``member_rows``) for the member tasks to read; the committed model holds none of them."""
    from metricpipe.stages.train.neighbours import SCRATCH

    ctx, _, _, models, _ = stored
    [unit] = [u for spec, u, _ in models if spec["method"] == "slde"]
    assert unit.done() and not any(name.startswith(SCRATCH) for name in unit.file_sizes())
    assert not unit.verify()  # every file is the commit's (no scratch left beside it)
