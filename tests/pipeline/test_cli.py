"""The command line: bad input exits 2 with one line and leaves committed results untouched."""

import hashlib
import json
import re
import warnings
from pathlib import Path

import numpy as np
import pytest
import yaml
from click.testing import CliRunner

from metricpipe.cli import main
from tests.conftest import hold_lock, make_blobs


def _config(tmp_path, data, **extra):
    cfg = {
        "store": str(tmp_path / "store"),
        "workers": 1,
        "dashboard": ":0",
        "data": data,
        "methods": [{"method": "pca", "dim": 4}],
        "evaluate": {"retrieval": {"k": [5]}, "classification": {"classifiers": ["knn1"]}},
        **extra,
    }
    p = tmp_path / "cfg.yaml"
    p.write_text(yaml.safe_dump(cfg))
    return p


def _invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def _digest(root: Path) -> dict:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != ".lock"
    }  # the lock is no result


@pytest.fixture(scope="module")
def good_store(client, tmp_path_factory):
    """A store holding one finished run, shared by the bad-input cases. Its config names the session's
    cluster, so these runs start no cluster of their own (cluster start-up is tested in
    tests/integration/test_tls.py and test_scheduler.py)."""
    tmp = tmp_path_factory.mktemp("good")
    X, y = make_blobs(n=300, d=8)
    np.savez(tmp / "ok.npz", X=X, y=y)
    cfg = _config(
        tmp,
        {"path": str(tmp / "ok.npz"), "chunk_mb": 0.002},
        cluster=client.scheduler.address,
        methods=[{"method": "pca", "dim": 4}, {"method": "ncmml", "dim": 4, "iters": 20}],
    )
    res = _invoke("run", cfg)
    assert res.exit_code == 0, res.output
    return tmp


def _fits_digits() -> int:
    """The memory_limit (MB) whose task share holds digits (one block of 1,797 x 64 float32, four times)
    and the evaluation's buffers: what the refusal should name."""
    from metricpipe.budget import BLOCKS_PER_TASK, SPILL_FRACTION
    from metricpipe.stages import EVAL_BUDGET

    return int(np.ceil((BLOCKS_PER_TASK * 1797 * 64 * 4 + EVAL_BUDGET) / SPILL_FRACTION / 1e6))


def _labels_file(tmp, y):
    """Features in X.npy, labels in a file of their own: an error about the labels names that file."""
    np.save(tmp / "X.npy", X)
    np.save(tmp / "y.npy", y)
    return {"path": str(tmp / "X.npy"), "labels": str(tmp / "y.npy")}


def _bad_npz(tmp, **arrays):
    p = tmp / "bad.npz"
    np.savez(p, **arrays)
    return {"path": str(p)}


X, Y = make_blobs(n=120, d=6)
X_NAN = X.copy()
X_NAN[77, 2] = np.nan
X_INF = X.copy()
X_INF[5, 0] = np.inf
Y_ONE_MEMBER = Y.copy()
Y_ONE_MEMBER[0] = 9
X_HUGE = X.astype(np.float64)
X_HUGE[3, 1] = 1e39  # finite in float64, inf in the float32 the store keeps

BAD = {
    "nan": (lambda t: _bad_npz(t, X=X_NAN, y=Y), {}, r"non-finite value.*first at row 77, column 2"),
    "inf": (lambda t: _bad_npz(t, X=X_INF, y=Y), {}, r"non-finite value.*row 5"),
    "beyond float32": (
        lambda t: _bad_npz(t, X=X_HUGE, y=Y),
        {},
        r"bad.npz: features hold 1 value\(s\) beyond float32's range .*first 1e\+39 at row 3, column 1",
    ),
    "non-integral float labels": (
        lambda t: _bad_npz(t, X=X, y=Y + 0.5),
        {},
        r"non-integral float64 value\(s\), first \d\.5 at row 0; store class labels",
    ),
    "float labels beyond 2^53": (
        lambda t: _bad_npz(t, X=X, y=np.where(Y == 0, 1e19, 2e19)),
        {},
        r"float64 labels beyond 2\^53 are not exact integers .*classes would merge",
    ),
    "pcaw eps 0": (
        lambda t: {"source": "digits"},
        {"methods": [{"method": "pcaw", "eps": 0}]},
        r"PCAWhitening: component \d+ has variance 0 and eps=0.0; raise 'eps'",
    ),  # eps: 0 is the float 0.0
    "pcaw codes not finite": (
        lambda t: {"source": "digits", "normalize": "none"},
        {"methods": [{"method": "pcaw", "eps": 1e-300}]},
        r"methods \(pcaw\S*\): \d+ codes value\(s\) are not finite, first nan at row \d+, "
        r"column \d+ \(parameters \{dim: None, eps: 1e-300\}\).*a larger eps for pcaw",
    ),
    "object features": (
        lambda t: _bad_npz_pickled(t, X=X.astype(object), y=Y),
        {},
        r"bad.npz: array .X. \(data.features\) holds pickled Python objects",
    ),
    "pickled labels npy": (
        lambda t: {**_bad_npz(t, X=X), "labels": _pickled_labels(t)},
        {},
        r"^error: \S+labels.npy: the labels \(data.labels\) are pickled Python objects",
    ),
    "retrieval k above the database": (
        lambda t: _bad_npz(t, X=X, y=Y),
        {"evaluate": {"retrieval": {"k": [500]}}},
        r"evaluate.retrieval.k: 500 is more than the retrieval database holds "
        r"\(each test query ranks the other \d+ test rows\)",
    ),
    "selection knn above the reference rows": (
        lambda t: _bad_npz(t, X=X, y=Y),
        {"methods": [{"method": "ncmml", "dim": 4, "iters": 10, "select": {"metric": "knn500", "lr": [3, 30]}}]},
        r"methods\[0\] \(ncmml-4\S*\): select.metric knn500 votes over more neighbours than the \d+ train rows "
        r"that selection compares the validation rows with",
    ),
    "neighbours.k above the train rows": (
        lambda t: _bad_npz(t, X=X, y=Y),  # was a ~1e13 TB memory refusal
        {"neighbours": {"k": 10**18}, "methods": [{"method": "slne", "input_dim": 4, "epochs": 1}]},
        r"cfg.yaml: neighbours.k=1000000000000000000 but the train split has \d+ "
        r"samples; use k < \d+$",
    ),
    "default neighbours.k above the train rows": (
        lambda t: _bad_npz(t, X=X[:40], y=Y[:40]),  # the graph SL-NE needs
        {"methods": [{"method": "slne", "input_dim": 4, "epochs": 1}]},
        r"neighbours.k=50 but the train split has \d+ samples; use k < \d+$",
    ),
    "knn above the train rows": (
        lambda t: _bad_npz(t, X=X, y=Y),
        {"evaluate": {"classification": {"classifiers": ["knn500"]}}},
        r"knn500 votes over more neighbours than the \d+ train rows",
    ),
    "label length": (lambda t: _bad_npz(t, X=X, y=Y[:-1]), {}, r"labels have length 119 but features have 120"),
    "held-out class not a label": (
        lambda t: {**_bad_npz(t, X=X, y=Y), "split": {"classes": [0, 17]}},
        {},
        r"cfg.yaml: data.split.classes lists \[17\], which is not among the class labels "
        r"\(0, 1, 2, 3\)",
    ),
    "held-out fraction leaves one class out": (
        lambda t: {**_bad_npz(t, X=X, y=Y), "split": {"classes": 0.25}},
        {},
        r"cfg.yaml: data.split.classes: 0.25 holds out 1 and keeps 3 of the 4 "
        r"classes of \S*bad.npz; each side needs at least 2 classes: change",
    ),
    "held-out classes leave one class in": (
        lambda t: {**_bad_npz(t, X=X, y=Y), "split": {"classes": [0, 1, 2]}},
        {},
        r"data.split.classes: \(0, 1, 2\) holds out 3 and keeps 1 of the 4 .*list "
        r"between 2 and 2 labels",
    ),
    "a learner's classes name a held-out class": (
        lambda t: {**_bad_npz(t, X=X, y=Y), "split": {"classes": [0, 1]}},
        {"methods": [{"method": "ncmml", "dim": 4, "iters": 10, "classes": [1, 2]}]},
        r"cfg.yaml: methods\[0\] \(ncmml-4.*\): classes lists 1, which data.split.classes holds out \(no "
        r"learner sees its rows\); drop it from one of them",
    ),
    "held-out class named by a split column value": (
        lambda t: {
            **_bad_npz(t, X=X, y=Y, s=np.array(["train", "test", "unseen_test"] * 40)),
            "split": {"column": "s"},
        },
        {},
        r"split column holds \['unseen_test'\] \(data.split.column\); allowed values are train, test, val, "
        r"negatives \(hold classes out with data.split.classes\)",
    ),
    "group length": (
        lambda t: {**_bad_npz(t, X=X, y=Y, g=Y[:-1]), "groups": "g"},
        {},
        r"bad.npz \(data.groups\): groups have length 119 but features have 120 rows; give one group",
    ),
    "split column length": (
        lambda t: {**_bad_npz(t, X=X, y=Y, s=np.array(["train"] * 119)), "split": {"column": "s"}},
        {},
        r"bad.npz: the split column 's' has 119 values for 120 rows \(data.split.column\)",
    ),
    "groups of a one-array file": (
        lambda t: {**_labels_file(t, Y), "groups": "g"},
        {},
        r"data.groups names an array beside the features, and this format holds the "
        r"features alone; save features, labels and groups together in an .npz",
    ),
    "test and val leave no train rows": (
        lambda t: {**_bad_npz(t, X=X, y=Y), "split": {"test": 0.2, "val": 0.9}},
        {},
        r"data.split: test \+ val must be below 1, so that train rows remain; "
        r"got 0.2 \+ 0.9; lower val or test",
    ),
    "label length in a labels file": (
        lambda t: _labels_file(t, Y[:-1]),
        {},
        r"error: \S+/y.npy \(data.labels\): labels have length 119 but features have 120",
    ),
    "fractional labels in a labels file": (
        lambda t: _labels_file(t, Y + 0.5),
        {},
        r"error: \S+/y.npy \(data.labels\): labels must be integers",
    ),
    "one class": (lambda t: _bad_npz(t, X=X, y=np.zeros(120, int)), {}, r"labels hold only one class \(0\); "),
    "one member": (
        lambda t: _bad_npz(t, X=X, y=Y_ONE_MEMBER),
        {},
        r"class 9 has 1 sample\(s\); a stratified split needs at least two",
    ),
    "one member in a labels file": (
        lambda t: _labels_file(t, Y_ONE_MEMBER),
        {},  # named the features' file
        r"error: \S+/y.npy: class 9 has 1 sample\(s\); a stratified split needs",
    ),
    "1-D features": (lambda t: _bad_npz(t, X=X[:, 0], y=Y), {}, r"must be a 2-D \(sample, feature\) array"),
    "string features": (lambda t: _bad_npz(t, X=X.astype(str), y=Y), {}, r"features must be numeric"),
    "text features": (
        lambda t: _bad_npz(t, X=np.full(X.shape, "a"), y=Y),
        {},
        r"bad.npz: features must be numeric; got dtype <U1; convert to float32$",
    ),
    "complex features": (
        lambda t: _bad_npz(t, X=X.astype(np.complex64), y=Y),
        {},
        r"bad.npz: features must be real numbers; got dtype complex64",
    ),
    "missing file": (lambda t: {"path": str(t / "nope.npz")}, {}, r"nope.npz: file not found \(data.path\)"),
    "unknown key": (lambda t: {"source": "digits"}, {"methds": []}, r"methds: unknown key; did you mean 'methods'"),
    "encode.pq on too few train rows": (
        lambda t: _bad_npz(t, X=X, y=Y),
        {"encode": {"pq": [4]}},
        r"cfg.yaml: encode.pq: a product quantiser trains 256 centroids per sub-quantiser on the train rows, "
        r"and the data has \d+; give at least 256 train rows, or leave encode.pq out$",
    ),
    "bad dim": (
        lambda t: {"source": "digits"},
        {"methods": [{"method": "pca", "dim": 1000}]},
        r"methods\[0\] \(pca-1000\): The 'dim' parameter of PCA must be <= 64, the data's features",
    ),
    "sparse dim": (
        lambda t: {"source": "digits"},
        {"methods": [{"method": "sparse", "dim": 100, "max_iter": 1}]},
        r"The 'dim' parameter of SparseProjector must be <= 64",
    ),
    "slne dim": (
        lambda t: {"source": "digits"},
        {"methods": [{"method": "slne", "input_dim": 65, "epochs": 1}]},
        r"The 'input_dim' parameter of SLNE must be <= 64",
    ),
    "linear-ml dim": (
        lambda t: {"source": "digits"},
        {"methods": [{"method": "linear-ml", "dim": 65}]},
        r"methods\[0\] \(linear-ml-65\): The 'dim' parameter of LinearML must be <= 64, the data's",
    ),
    "lda dim": (
        lambda t: {"source": "digits"},
        {"methods": [{"method": "lda", "dim": 10}]},
        r"The 'dim' parameter of LDA must be <= 9",
    ),
    "classes beyond the data": (
        lambda t: {"source": "digits"},
        {"methods": [{"method": "ncmml", "classes": [0, 12]}]},
        r"The 'classes' parameter of NCMML lists \[12\], which is not among the class labels "
        r"\(0, 1, 2, 3, 4, \.\.\.\); list labels as the data holds them",
    ),
    "softvote beyond the graph": (
        lambda t: {"source": "digits"},
        {"neighbours": {"k": 5}, "evaluate": {"classification": {"classifiers": ["softvote10"]}}},
        r"softvote10 votes over more neighbours than the graph keeps \(neighbours.k = 5\)",
    ),
    "negative values for nml": (
        lambda t: _bad_npz(t, X=X - 10.0, y=Y),
        {"methods": [{"method": "pca", "dim": 2}, {"method": "nml", "dim": 2, "pairs": 10, "iters": 10}]},
        r"^error: \S+bad.npz: methods\[1\] \(nml\) needs non-negative features \(its chi2 "
        r"kernel\), but row \d+, column \d+ is -\d[\d.]* \(data.path\); use non-negative",
    ),
    "negative synthetic values for nml": (
        lambda t: {"source": "synthetic", "synthetic": {"samples": 300, "dim": 6, "classes": 3}},
        {"methods": [{"method": "nml", "dim": 2, "pairs": 10, "iters": 10}]},
        r"methods\[0\] \(nml\) needs non-negative features \(its chi2 kernel\), but "
        r"row \d+, column \d+ is -[\d.]+ \(data.synthetic\); set "
        r"data.synthetic.nonnegative: true or drop nml$",
    ),
    "one negative value for nml": (
        lambda t: _bad_npz(t, X=np.where(np.arange(720).reshape(120, 6) == 77 * 6 + 3, -0.5, np.abs(X)), y=Y),
        {"methods": [{"method": "nml", "dim": 2, "pairs": 10, "iters": 10}]},
        r"bad.npz: methods\[0\] \(nml\) needs non-negative features \(its chi2 kernel\), "
        r"but row 77, column 3 is -0.5 \(data.path\)",
    ),
    "pairs file without y": (
        lambda t: {**_bad_npz(t, X=X, y=Y), "pairs": str(_pairs_missing_y(t))},
        {},
        r"^error: \S+pairs.npz: data.pairs needs arrays i, j, y; missing \['y'\]",
    ),
    "pair index out of range": (
        lambda t: {**_bad_npz(t, X=X, y=Y), "pairs": str(_pairs(t, 500))},
        {},
        r"pair index i=500 is out of range 0..119",
    ),
    "unreadable file": (lambda t: _garbage(t), {}, r"bad.npz: cannot read"),
    "empty test split": (
        lambda t: {**_bad_npz(t, X=X, y=Y, s=np.array(["train"] * 120)), "split": {"column": "s"}},
        {},
        r"the test split is empty; mark some samples 'test' in its split column$",
    ),
    "empty train split": (
        lambda t: {**_bad_npz(t, X=X, y=Y, s=np.array(["test"] * 120)), "split": {"column": "s"}},
        {},
        r"bad.npz: the train split is empty; mark some samples 'train' in its split column$",
    ),  # val: auto carves none
    "worker memory below the task rule": (
        lambda t: {"source": "digits"},
        {"memory_limit": "400MB"},
        r"a row-block task \(4 row-blocks and the evaluation's buffers\) needs ~\d+ MB, over the 240 MB a "
        r"task may use \(60% of the smallest worker memory limit, 400 MB\); raise "
        rf"memory_limit to at least {_fits_digits()} MB \(the evaluation's buffers "
        r"alone take 250 MB\)",
    ),
    "negatives from the test split": (
        lambda t: {"source": "digits"},
        {"methods": [{"method": "slem", "negatives": {"split": "test"}}]},
        r"methods\[0\].negatives: negatives.split must name .*never test",
    ),
}


def _truncated_idx(t, gz):
    """An IDX file of X's rows (as uint8) cut 100 bytes short, labels beside it."""
    import gzip
    import struct

    body = struct.pack(">BBBBI", 0, 0, 8, 2, 120) + struct.pack(">I", 6) + np.abs(X).astype(np.uint8).tobytes()
    p = t / ("x-idx2-ubyte.gz" if gz else "x-idx2-ubyte")
    (gzip.open if gz else open)(p, "wb").write(body[:-100])
    np.save(t / "y.npy", Y)
    return {"path": str(p), "labels": str(t / "y.npy")}


def _h5_group(t, where):
    import h5py

    with h5py.File(t / "g.h5", "w") as f:
        (f.create_group("X").create_dataset("emb", data=X) if where == "features" else f.create_dataset("X", data=X))
        (f.create_group("y").create_dataset("label", data=Y) if where == "labels" else f.create_dataset("y", data=Y))
    return {"path": str(t / "g.h5")}


def _h5_unwritten(t):
    """Features chunked 20 rows at a time, rows 40-59 never written: they read as zeros."""
    import h5py

    with h5py.File(t / "holes.h5", "w") as f:
        d = f.create_dataset("X", shape=X.shape, chunks=(20, X.shape[1]), dtype="f4")
        d[:40], d[60:] = X[:40], X[60:]
        f["y"] = Y
    return {"path": str(t / "holes.h5")}


def _parquet_null(t, empty=False):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [
        (list(map(float, r[:0])) if empty else None) if i == (0 if empty else 3) else list(map(float, r))
        for i, r in enumerate(X)
    ]
    pq.write_table(pa.table({"emb": rows, "label": Y}), t / "f.parquet")
    return {"path": str(t / "f.parquet"), "features": "emb", "labels": "label"}


BAD.update(
    {
        "truncated idx": (
            lambda t: _truncated_idx(t, False),
            {},
            r"x-idx2-ubyte: 632 bytes, but its header \(120 x 6 values of 1 byte\(s\)\) needs 732; the file is "
            r"truncated",
        ),
        "truncated idx.gz": (
            lambda t: _truncated_idx(t, True),
            {},
            r"x-idx2-ubyte.gz: 632 bytes, but its header .* truncated",
        ),
        "hdf5 group as features": (
            lambda t: _h5_group(t, "features"),
            {},
            r"g.h5: 'X' is a group, not a dataset \(data.features\); name one of its datasets, e.g. X/emb",
        ),
        "hdf5 group as labels": (
            lambda t: _h5_group(t, "labels"),
            {},
            r"g.h5: 'y' is a group, not an array \(data.labels\)",
        ),
        "hdf5 unwritten chunks": (
            lambda t: _h5_unwritten(t),
            {},
            r"holes.h5: dataset 'X' \(data.features\) has 1 of its 6 chunk\(s\) never written \(the "
            r"first from row 40\), which would read as 0.0 \(its fill value\); write every row",
        ),
        "parquet empty first row": (
            lambda t: _parquet_null(t, empty=True),
            {},  # was staged as shape (120, 0)
            r"f.parquet: column 'emb' has rows of lengths \[0, 6\] in rows 0..119 against 6; every "
            r"embedding needs one length",
        ),
        "parquet null row": (
            lambda t: _parquet_null(t),
            {},
            r"f.parquet: column 'emb' \(data.features\) is null in row 3; drop or fill that row",
        ),
    }
)


def _bad_npz_pickled(t, **arrays):
    p = t / "bad.npz"
    np.savez(p, **arrays)  # object arrays are pickled inside the npz
    return {"path": str(p)}


def _pickled_labels(t):
    p = t / "labels.npy"
    np.save(p, np.array([{"c": int(v)} for v in Y], dtype=object), allow_pickle=True)
    return str(p)


def _pairs(t, bad_j):
    p = t / "pairs.npz"
    np.savez(p, i=np.array([bad_j, 1]), j=np.array([2, 3]), y=np.array([1, -1]))
    return p


def _pairs_missing_y(t):
    p = t / "pairs.npz"
    np.savez(p, i=np.array([0, 1]), j=np.array([2, 3]))
    return p


def _garbage(t):
    p = t / "bad.npz"
    p.write_bytes(b"PK\x03\x04 this is not a zip archive")
    return {"path": str(p)}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_exits_2_with_one_line_and_store_unchanged(client, good_store, tmp_path, case):
    make_data, extra, match = BAD[case]
    before = _digest(good_store / "store")
    if "memory_limit" not in extra:  # the session's cluster; a memory_limit applies to a local cluster only
        extra = {**extra, "cluster": client.scheduler.address}
    cfg = _config(tmp_path, make_data(tmp_path), **extra, store=str(good_store / "store"))
    res = CliRunner().invoke(main, ["run", str(cfg)])
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.strip().splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in res.output, res.output
    import re

    assert re.search(match, lines[0]), lines[0]
    after = _digest(good_store / "store")
    assert {k: v for k, v in after.items() if k in before} == before  # nothing committed was touched
    # and nothing half-written is left: a new file belongs to a unit committed before the refusal
    # (e.g. the statistics of a run whose encode refused a model), never to a begun one
    units = {"/".join(k.split("/")[:2]).removesuffix(".committed.json") for k in set(after) - set(before)}
    assert all(f"{u}.committed.json" in after for u in units), sorted(units)


@pytest.mark.parametrize("case", ["missing file", "nan"])
def test_a_refused_run_leaves_no_new_store_behind(client, tmp_path, case):
    """A store the run would have created is not left as an empty folder holding only its lock."""
    make_data, extra, _ = BAD[case]
    cfg = _config(
        tmp_path, make_data(tmp_path), **extra, cluster=client.scheduler.address, store=str(tmp_path / "new-store")
    )
    res = CliRunner().invoke(main, ["run", str(cfg)])
    assert res.exit_code == 2, res.output
    assert not (tmp_path / "new-store").exists()


def _ncm_key(store: Path) -> str:
    for marker in (store / "models").glob("*.committed.json"):
        if json.loads(marker.read_text())["spec"]["method"] == "ncmml":
            return marker.name.split(".")[0]
    raise AssertionError("no ncmml model")


def _run_model_key(store: Path) -> str:
    """A model of the last run (encoded: not a selection candidate it dropped)."""
    return json.loads((store / "runs/latest.json").read_text())["units"]["models"][0].split("/")[-1]


@pytest.mark.parametrize(
    "case",
    [
        "model dimension mismatch",
        "new classes of another dimension",
        "concurrent run",
        "predictions to a missing folder",
        "predictions to a .txt",
        "faiss index to a .npz",
        "an encoded database the run did not make",
        "k above the train rows",
        "codes into the store",
        "predictions into the store",
        "model arrays into the store",
        "codes to a URL",
        "new classes of zero rows",
        "new classes of zero rows for one model",
        "prior weight nan",
        "prior weight inf",
    ],
)
def test_bad_command_input_exits_2_with_one_line_and_store_unchanged(good_store, tmp_path, case):
    store = good_store / "store"
    before = _digest(store)
    wrong = tmp_path / "wrong.npz"
    np.savez(wrong, X=np.ones((5, 3), np.float32), y=np.array([0, 1, 0, 1, 0]))
    sleeper = None
    if case == "model dimension mismatch":
        args, match = (
            ["predict", store, wrong, "--model", _ncm_key(store)],
            r"features have 3 dimensions but model \w+ takes 8",
        )
    elif case == "predictions to a missing folder":
        right = tmp_path / "right.npz"
        np.savez(right, X=np.ones((5, 8), np.float32))
        args, match = (
            ["predict", store, right, "--model", _ncm_key(store), "--out", tmp_path / "no/p.npy"],
            r"no/p.npy: its folder does not exist \(--out\)",
        )
    elif case in ("predictions to a .txt", "k above the train rows"):
        right = tmp_path / "right.npz"
        np.savez(right, X=np.ones((5, 8), np.float32))
        args, match = (
            (
                ["predict", store, right, "--model", _ncm_key(store), "--out", tmp_path / "p.txt"],
                r"p.txt: unknown output format \(--out\); name it with one of .npy",
            )
            if "txt" in case
            else (
                ["predict", store, right, "--model", _run_model_key(store), "--k", "100000"],
                r"--k 100000 votes over more neighbours than the \d+ train rows of model \w+'s run; use --k <= \d+",
            )
        )
    elif case == "faiss index to a .npz":
        args, match = (
            ["export", store, "--model", _ncm_key(store), "--faiss", tmp_path / "x.npz"],
            r"x.npz: unknown output format \(--faiss\); name it with one of .faiss, .index",
        )
    elif case == "an encoded database the run did not make":
        args, match = (
            ["export", store, "--model", _ncm_key(store), "--faiss", tmp_path / "x.faiss", "--pq", "8"],
            r"--pq 8: model \w+ has no encoded database of 8 bytes per vector: the last run made none for it",
        )
    elif case in (
        "codes into the store",
        "predictions into the store",
        "model arrays into the store",
        "codes to a URL",
    ):
        right = tmp_path / "right.npz"
        np.savez(right, X=np.ones((5, 8), np.float32))
        inside = store / "models" / "x.npz"
        args = {
            "codes into the store": ["encode", store, right, "--model", _ncm_key(store), "--out", inside],
            "predictions into the store": [
                "predict",
                store,
                right,
                "--model",
                _ncm_key(store),
                "--out",
                store / "runs" / "p.npy",
            ],
            "model arrays into the store": ["export", store, "--model", _ncm_key(store), "--npz", inside],
            "codes to a URL": ["encode", store, right, "--model", _ncm_key(store), "--out", "s3://b/c.npz"],
        }[case]
        match = (
            r"^error: s3://b/c.npz: a URL \(--out\); this file is written on this machine: give a local path$"
            if "URL" in case
            else rf"^error: {re.escape(str(args[-1]))}: is inside the store {re.escape(str(store))} "
            rf"\({args[-2]}\); writing there would damage its results: choose a path outside it$"
        )
    elif case.startswith("new classes of zero rows"):
        np.savez(wrong, X=np.ones((0, 8), np.float32), y=np.zeros(0, int))
        args = ["add-classes", store, wrong] + (["--model", _ncm_key(store)] if "one model" in case else [])
        match = rf"^error: {re.escape(str(wrong))}: no rows \(NEW_DATA\); give a file with at least one labelled row"
    elif case.startswith("prior weight"):  # nan failed later, naming no option
        value = case.split()[-1]
        np.savez(wrong, X=np.ones((4, 8), np.float32), y=np.array([100, 101, 100, 101]))
        (tmp_path / "h.yaml").write_text("{100: a, 101: a, 0: a, 1: a, 2: a}\n")
        args = [
            "add-classes",
            store,
            wrong,
            "--prior-weight",
            value,
            "--hierarchy",
            tmp_path / "h.yaml",
            "--model",
            _ncm_key(store),
        ]
        match = rf"^error: --prior-weight {value}: expected a finite number >= 0 \(m of Eq. 34"
    elif case == "new classes of another dimension":
        args, match = ["add-classes", store, wrong], r"features have 3 dimensions but model \w+ takes 8"
    else:
        sleeper = hold_lock(store)
        args, match = ["run", good_store / "cfg.yaml"], rf"store is in use by pid {sleeper.pid}"
    try:
        res = CliRunner().invoke(main, [str(a) for a in args])
    finally:
        if sleeper:
            sleeper.kill()
            sleeper.wait()
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.strip().splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and re.search(match, lines[0]), res.output
    assert _digest(store) == before


def test_store_path_that_is_a_file(tmp_path):
    f = tmp_path / "afile"
    f.write_text("x")
    cfg = _config(tmp_path, {"source": "digits"}, store=str(f))
    res = CliRunner().invoke(main, ["run", str(cfg)])
    assert res.exit_code == 2 and "store path is a file" in res.output


@pytest.mark.parametrize("where", ["the folder itself", "a folder in it"])
def test_a_store_inside_the_folder_it_stages_is_refused(tmp_path, where):
    """A store inside its own data folder (a Zarr source) staged the data again on every run: the
    data's fingerprint lists every file of the folder, the store's among them."""
    import zarr

    X, y = make_blobs(n=120, d=6)
    data = tmp_path / "d.zarr"
    g = zarr.open_group(str(data), mode="w")
    g.create_array("X", data=X)
    g.create_array("y", data=y)
    before = _digest(data)
    store = data if where == "the folder itself" else data / "results"
    for args in (("run", _config(tmp_path, {"path": str(data)}, store=str(store))), ("stage", data, "--store", store)):
        res = _invoke(*args)
        assert res.exit_code == 2 and len(res.output.splitlines()) == 1, res.output
        said = "data.path" if args[0] == "run" else "SOURCE"  # (the stage command names its argument)
        assert f"store: {store} is inside {said} {data}, the folder it stages" in res.output, res.output
        assert _digest(data) == before and not (data / "results").exists()


@pytest.mark.integration
def test_rerun_reuses_every_stage_and_gives_the_same_report(good_store):
    cfg = good_store / "cfg.yaml"
    first = json.loads((good_store / "store/report/metrics.json").read_text())["records"]
    res = _invoke("run", cfg)
    assert res.exit_code == 0
    assert "stage: reusing data/" in res.output and "train: reusing 2 of 2 models" in res.output
    assert "encode: reusing 2 of 2 encodings" in res.output and "evaluate: reusing 2 of 2 evaluations" in res.output
    assert json.loads((good_store / "store/report/metrics.json").read_text())["records"] == first
    # the results on stdout (`metricpipe run cfg > results.txt` keeps them), the progress on stderr
    out = res.stdout.strip().splitlines()
    assert out[0].startswith("Report: ") and out[-1].startswith("Winner (classification): ")
    assert "Completed" not in res.stdout
    assert "Completed 1 of" in res.stderr and "Winner" not in res.stderr


def test_inspect_and_report_commands(good_store):
    res = _invoke("inspect", good_store / "store")
    assert res.exit_code == 0 and "features: float32 (300, 8)" in res.output and "done" in res.output
    (good_store / "store/report/index.html").unlink()
    res = _invoke("report", good_store / "store")
    assert res.exit_code == 0 and (good_store / "store/report/index.html").stat().st_size > 1000


def test_report_refuses_a_result_a_later_run_left_uncommitted(good_store, tmp_path):
    import shutil

    store = tmp_path / "copy"
    shutil.copytree(good_store / "store", store)
    rel = json.loads((store / "runs/latest.json").read_text())["evaluation_units"][0]
    (store / f"{rel}.committed.json").unlink()  # as Unit.begin() leaves it before a killed rewrite
    res = CliRunner().invoke(main, ["report", str(store)])
    assert res.exit_code == 2 and f"{rel} of the last run is not committed" in res.output


def test_inspect_missing_store(tmp_path):
    res = CliRunner().invoke(main, ["inspect", str(tmp_path / "nope")])
    assert res.exit_code == 2 and "no such store" in res.output
    (tmp_path / "afile.txt").write_text("x")  # it said "no such store" for a file too
    for cmd in ("inspect", "models", "report"):
        res = CliRunner().invoke(main, [cmd, str(tmp_path / "afile.txt")])
        assert res.exit_code == 2 and res.output.strip() == (
            f"error: {tmp_path / 'afile.txt'}: a file, not a store (a store is a folder); give the --store of a run"
        )


@pytest.mark.parametrize("command", [["models"], ["inspect"], ["inspect", "--verify"]])
def test_a_folder_that_is_not_a_store_is_refused(tmp_path, command):
    (tmp_path / "notes.txt").write_text("x")
    res = CliRunner().invoke(main, [command[0], str(tmp_path), *command[1:]])
    assert res.exit_code == 2 and res.output.strip() == (
        f"error: {tmp_path}: not a metricpipe store (no models/, data/ or runs/ in it); give the --store of a run"
    ), res.output


def test_stage_command_refuses_bad_input_before_a_cluster_starts_and_leaves_no_store(tmp_path):
    (tmp_path / "X.csv").write_text("a,b\n")
    res = _invoke("stage", tmp_path / "X.csv", "--store", tmp_path / "s", "--cluster", "tcp://127.0.0.1:9")
    assert res.exit_code == 2, res.output  # the unreachable cluster is never contacted
    assert res.output.strip().splitlines() == [
        f"error: {tmp_path / 'X.csv'}: unknown format (SOURCE); use .npy, "
        ".npz, .h5, .zarr, .parquet, .fvecs, .bvecs or an IDX file/folder"
    ]
    assert not (tmp_path / "s").exists()


def test_commands_without_a_config_name_their_own_arguments_not_config_keys(tmp_path, monkeypatch):
    import numpy as np

    monkeypatch.delenv("METRICPIPE_DATA", raising=False)
    monkeypatch.setattr("metricpipe.sources.idx.FASHION_DEBIAN", str(tmp_path / "none"))
    np.save(tmp_path / "x.npy", np.ones((6, 3), np.float32))
    np.savez(tmp_path / "x.npz", X=np.ones((6, 3), np.float32), y=np.arange(6) % 2)
    cases = [
        (("stage", tmp_path / "x.npy"), r"x.npy: a .npy file holds one array; give --labels as the path"),
        (("stage", tmp_path / "none.npz"), r"none.npz: file not found \(SOURCE\); check the path$"),
        (("stage", tmp_path / "x.npz", "--split-column", "s"), r"x.npz: no array 's' \(--split-column\)"),
        (
            ("stage", tmp_path / "x.npz", "--split-column", "s", "--test", "0.3"),  # --test was ignored
            r"^error: metricpipe stage: --split-column/--test: give either column or a test fraction, not both$",
        ),
        (
            ("stage", tmp_path / "x.npz", "--labels", tmp_path / "lab.npy"),
            r"lab.npy: labels file not found "
            r"\(--labels\)",
        ),
        # a file or array named like a key keeps its name
        (
            ("stage", tmp_path / "x.npz", "--labels", tmp_path / "data.labels.npy"),
            r"/data.labels.npy: labels file not found \(--labels\)",
        ),
        (("stage", tmp_path / "x.npz", "--features", "data.features"), r"no array 'data.features' \(--features\)"),
        (
            ("stage", "fashion-mnist"),
            r"^error: SOURCE fashion-mnist: IDX files not found in .* set METRICPIPE_DATA "
            r"to a folder",
        ),
    ]
    for args, match in cases:
        res = _invoke(*args, "--store", tmp_path / "s", "--cluster", "tcp://127.0.0.1:9")
        said = res.output.replace(str(tmp_path), "").replace("data.labels.npy", "").replace("'data.features'", "")
        assert res.exit_code == 2 and "data." not in said and "config" not in said, res.output
        assert re.search(match, res.output.strip()), res.output


@pytest.mark.integration
def test_stage_command_keeps_an_idx_folder_s_own_split_without_test(client, tmp_path):
    from tests.pipeline.test_sources import _write_idx

    rng = np.random.default_rng(0)
    for s, n in (("train", 12), ("t10k", 6)):
        _write_idx(tmp_path / f"{s}-images-idx3-ubyte.gz", rng.integers(0, 255, (n, 4, 4)).astype(np.uint8))
        _write_idx(tmp_path / f"{s}-labels-idx1-ubyte.gz", (np.arange(n) % 3).astype(np.uint8))
    res = _invoke("stage", tmp_path, "--store", tmp_path / "s", "--cluster", client.scheduler.address)
    assert res.exit_code == 0, res.output
    res = _invoke("stage", tmp_path, "--store", tmp_path / "s2", "--test", "0.3", "--cluster", client.scheduler.address)
    assert res.exit_code == 2 and "comes with its own train/test split" in res.output, res.output
    # a val share is no more use there: it was ignored without a word
    (tmp_path / "v.yaml").write_text(
        yaml.safe_dump(
            {
                "store": str(tmp_path / "s3"),
                "cluster": client.scheduler.address,
                "data": {"path": str(tmp_path), "split": {"val": 0.15}},
            }
        )
    )
    res = _invoke("run", tmp_path / "v.yaml")
    assert res.exit_code == 2 and res.output.strip() == (
        f"error: {tmp_path}: this source comes with its own split, whose val rows data.split.val: 0.15 "
        f"cannot set; use val: auto (a tenth of its train split) or 0"
    ), res.output


@pytest.mark.integration
def test_stage_command_alone(client, tmp_path):
    X, y = make_blobs(n=50, d=3)
    np.save(tmp_path / "X.npy", X)
    np.save(tmp_path / "y.npy", y)
    res = _invoke(
        "stage",
        tmp_path / "X.npy",
        "--labels",
        tmp_path / "y.npy",
        "--store",
        tmp_path / "s",
        "--cluster",
        client.scheduler.address,
        "--normalize",
        "l2",
    )
    assert res.exit_code == 0, res.output
    import xarray as xr

    ds = xr.open_zarr(next((tmp_path / "s/data").glob("*/")), consolidated=False)
    np.testing.assert_allclose(np.linalg.norm(ds.features.values, axis=1), 1.0, rtol=1e-6)
    assert list(ds.label.values) == list(y)


@pytest.mark.integration
def test_groups_give_instance_relevance_and_ukb_score(client, tmp_path):
    rng = np.random.default_rng(3)
    n_groups = 40
    centres = rng.normal(0, 1, (n_groups, 5))
    g = np.repeat(np.arange(n_groups), 4)
    X = (centres[g] + rng.normal(0, 0.4, (len(g), 5))).astype(np.float32)
    y = g % 2
    split = np.where(g < 20, "train", "test")
    np.savez(tmp_path / "g.npz", X=X, y=y, g=g, split=split)
    cfg = _config(
        tmp_path,
        {"path": str(tmp_path / "g.npz"), "groups": "g", "split": {"column": "split"}},
        methods=[{"method": "identity"}],
        cluster=client.scheduler.address,
    )
    res = _invoke("run", cfg, "--performance-report", tmp_path / "perf.html")
    assert res.exit_code == 0, res.output
    records = json.loads((tmp_path / "store/report/metrics.json").read_text())["records"]
    ukb = [r["value"] for r in records if r["metric"] == "ukb4"]
    te = split == "test"
    d = ((X[te][:, None] - X[te][None]) ** 2).sum(-1)
    np.fill_diagonal(d, np.inf)
    top3 = np.argsort(d, axis=1)[:, :3]
    expected = 1 + (g[te][top3] == g[te][:, None]).sum(1).mean()
    assert ukb == [pytest.approx(expected)]
    assert (tmp_path / "perf.html").stat().st_size > 10000  # Dask's performance report was written


@pytest.mark.integration
def test_sampled_ivf_graph_trains_slne_and_the_report_says_how_it_was_built(client, tmp_path, monkeypatch):
    from metricpipe import ivf

    X, y = make_blobs(n=2000, d=16, classes=5, sep=2.0)
    np.savez(tmp_path / "d.npz", X=X, y=y)
    cfg = _config(
        tmp_path,
        {"path": str(tmp_path / "d.npz"), "chunk_mb": 0.05},
        methods=[{"method": "slne", "input_dim": 8, "epochs": 1}],
        neighbours={"k": 5, "method": "ivf", "nlist": 8, "queries": 200},
        cluster=client.scheduler.address,
    )
    res = _invoke("run", cfg)
    assert res.exit_code == 0, res.output
    html = (tmp_path / "store" / "report" / "index.html").read_text()
    assert "IVF8,Flat, nprobe 16, over the streamed rows: recall@5" in html and "sampled train rows searched" in html
    # queries too many to hold: the PQ index, re-ranked, as at millions of rows
    monkeypatch.setattr(ivf, "IVF_FLAT_BYTES", 0)
    monkeypatch.setattr(ivf, "STREAM_QUERY_BYTES", 0)
    assert _invoke("run", cfg).exit_code == 0
    html = (tmp_path / "store" / "report" / "index.html").read_text()
    assert "IVF8,PQ4, nprobe 16, rerank 4: recall@5" in html and "sampled train rows searched" in html


BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{c}: &{c} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n" for p, c in zip("abcdefgh", "bcdefghi")
)
SWEEP = {"methods": [{"method": "ncmml", "lr": [0.1 * i for i in range(1, 31)], "batch": list(range(10, 50))}]}
RAW = {
    "binary config": (b"\x00\x9f\x92\x96 binary \xff", r"cfg.yaml: not a text file; a config must be YAML text"),
    "alias bomb": (BOMB, r"cfg.yaml: YAML aliases expand to more than 100,000 values"),
    "a list": ("- data: {source: digits}\n", r"cfg.yaml: a config is a YAML mapping .* got a list"),
    "chunk_mb inf": (
        {"data": {"source": "digits", "chunk_mb": float("inf")}},
        r"data.chunk_mb: expected a finite number, got inf",
    ),
    "chunk_mb nan": (
        {"data": {"source": "digits", "chunk_mb": float("nan")}},
        r"data.chunk_mb: expected a finite number, got nan",
    ),
    "memory_limit lots": ({"memory_limit": "lots"}, r"memory_limit: expected a positive size such as 2GB .*'lots'"),
    "memory_limit -5": ({"memory_limit": -5}, r"memory_limit: expected a positive size such as 2GB or 'auto', got -5"),
    "memory_limit 3": (
        {"memory_limit": 3},
        r"memory_limit: expected at least 400MB per worker \(a worker process "
        r"holds ~250 MB before any task, and Dask pauses it at 80% of its "
        r"limit\), got 3 \(3 bytes\); e.g. 2GB",
    ),
    "memory_limit 3e8": ({"memory_limit": 3e8}, r"memory_limit: expected at least 400MB per worker .* got 300000000 "),
    "memory_limit 1e400GB": (
        {"memory_limit": "1e400GB"},
        r"memory_limit: expected a positive size such as 2GB .*'1e400GB'",
    ),
    "memory_limit 1e30GB": (
        {"memory_limit": "1e30GB"},
        r"cfg.yaml: memory_limit: 1e30GB per worker is more than this "
        r"machine's memory",
    ),
    "dashboard IPv6": (
        {"dashboard": "[::]:8787"},
        r"cfg.yaml: dashboard: an IPv6 host \('\[::\]:8787'\) is not "
        r"supported",
    ),
    "dashboard list": ({"dashboard": [1, 2]}, r"dashboard: expected \[HOST\]:PORT .* got \[1, 2\]"),
    "empty store": ({"store": ""}, r"cfg.yaml: store: empty; give a directory"),
    "methods mapping": ({"methods": {}}, r"methods: expected a non-empty list of \{method: ...\} entries, got \{\}"),
    "sweep of 1,200 models": (
        SWEEP,
        r"methods\[0\]: method ncmml sweeps 40 batch x 30 lr = 1,200 models, over the "
        r"limit of 1,000",
    ),
    "data a list": ({"data": ["digits"]}, r"data: expected a mapping \(key: value\), got \['digits'\]"),
    "verify_source text": (
        {"data": {"source": "digits", "verify_source": "yes"}},
        r"data.verify_source: expected bool, got 'yes'",
    ),
    # PyYAML kept the last of two keys: a second seed or methods further down replaced the first
    "duplicate key": (
        "seed: 0\ndata: {source: digits}\nseed: 1\n",
        r"cfg.yaml: not valid YAML at line 3: duplicate key 'seed' \(also at line 1\); keep one",
    ),
    "duplicate parameter": (
        "data: {source: digits}\nmethods:\n  - {method: pca, dim: 4, dim: 8}\n",
        r"line 3: duplicate key 'dim'",
    ),
    # PyYAML builds nested collections by recursion: RecursionError
    "nested 500 deep": (
        "data: {source: digits}\nseed: " + "[" * 500 + "]" * 500 + "\n",
        r"cfg.yaml: YAML nested more than 50 levels deep at line 2; a config is a few levels",
    ),
    "NUL in the store": (
        'data: {source: digits}\nstore: "runs/a\\0b"\n',
        r"cfg.yaml: store: 'runs/a\\x00b' holds a NUL byte \(\\0\), which no file name can; remove it",
    ),
    "NUL in data.path": ('data: {path: "d\\0.npz"}\n', r"cfg.yaml: data.path: 'd\\x00.npz' holds a NUL byte"),
    "ftp store": (
        {"store": "ftp://host/run"},
        r"store: 'ftp://host/run': ftp:// cannot hold a store .*give a local "
        r"directory or s3://BUCKET/PREFIX",
    ),
}


@pytest.mark.parametrize("case", list(RAW))
def test_bad_config_files_exit_2_with_one_line(tmp_path, case):
    content, match = RAW[case]
    cfg = tmp_path / "cfg.yaml"
    if isinstance(content, dict):
        content = yaml.safe_dump({"store": str(tmp_path / "s"), "data": {"source": "digits"}, **content})
    cfg.write_bytes(content if isinstance(content, bytes) else content.encode())
    res = CliRunner().invoke(main, ["run", str(cfg)])
    assert res.exit_code == 2 and "Traceback" not in res.output, res.output
    [line] = res.output.strip().splitlines()
    import re

    assert line.startswith("error: ") and re.search(match, line), line
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize(
    "flag, value, match",
    [
        ("--store", "memory://x", r"--store: 'memory://x' is in-memory, invisible to the workers"),
        ("--store", "simplecache::/tmp/x", r"--store: 'simplecache::/tmp/x' is a chained fsspec URL"),
        ("--store", " ", r"--store: empty"),
        # tracebacks, or a local folder written where S3 was meant
        (
            "--store",
            "ftp://h/run",
            r"--store: 'ftp://h/run': ftp:// cannot hold a store \(metricpipe keeps them in local "
            r"folders, S3, GCS or Azure\); give a local directory or s3://BUCKET/PREFIX$",
        ),
        ("--store", "zip://a.zip", r"--store: 'zip://a.zip': zip:// cannot hold a store"),
        ("--store", "http://h/run", r"--store: 'http://h/run': http:// cannot hold a store"),
        ("--store", "hdfs://h/run", r"--store: 'hdfs://h/run': hdfs:// cannot hold a store"),
        ("--store", "github://o/r", r"--store: 'github://o/r': github:// cannot hold a store"),
        (
            "--store",
            "S3://bucket/run",
            r"--store: 'S3://bucket/run': URL schemes are lower case here; write s3://bucket/run$",
        ),
        ("--store", "s3://", r"--store: 's3://' names no bucket; give s3://BUCKET/PREFIX$"),
        ("--store", "s3:///run", r"--store: 's3:///run' names no bucket"),
        (
            "--store",
            "s3:/bucket/run",
            r"--store: 's3:/bucket/run' is neither a URL \(s3: takes //\) nor meant as a local "
            r"folder; write s3://bucket/run$",
        ),
        ("--store", "s3:bucket", r"write s3://bucket$"),
        ("--store", "runs/a\0b", r"^error: --store: 'runs/a\\x00b' holds a NUL byte \(\\0\), which no file name can"),
        ("--performance-report", "r\0.html", r"^error: --performance-report: 'r\\x00.html' holds a NUL byte"),
        ("--cluster", "ucx://127.0.0.1:1", r"--cluster: ucx:// is not supported"),
        ("--cluster", "spec:- kind: slurm\n", r"spec.yaml: a cluster spec is a YAML mapping .* got a list"),
        # dask-jobqueue's refusals were ValueErrors of several lines (a traceback)
        (
            "--cluster",
            "spec:kind: slurm\nqueue: debug\n",
            r"spec.yaml: cores: missing; a SLURM spec gives each job's "
            r"cores and memory \(e.g. cores: 4, memory: 16GB",
        ),
        ("--cluster", "spec:kind: slurm\ncores: 1\n", r"spec.yaml: memory: missing"),
        (
            "--cluster",
            "spec:kind: slurm\ncores: 1\nmemory: 1GB\nbogus: 3\n",
            r"spec.yaml: bogus: unknown key of a SLURM "
            r"spec .*; see cluster/slurm.yaml",
        ),
        (
            "--cluster",
            "spec:kind: slurm\ncores: 1\nmemroy: 1GB\n",
            r"spec.yaml: memroy: unknown key .*did you mean "
            r"'memory'\?",
        ),
        (
            "--cluster",
            "spec:kind: slurm\ncores: 1\nmemory: lots\n",
            r"spec.yaml: memory: expected each job's memory as a "
            r"size such as 16GB, got 'lots'",
        ),
        (
            "--cluster",
            "spec:kind: slurm\ncores: two\nmemory: 1GB\n",
            r"spec.yaml: cores: expected a whole number >= 1, "
            r"got 'two'",
        ),
    ],
)
def test_bad_store_and_cluster_options_exit_2_with_one_line(tmp_path, monkeypatch, flag, value, match):
    import re

    monkeypatch.chdir(tmp_path)  # s3:/bucket/run was a folder s3: here
    if value.startswith("spec:"):
        (tmp_path / "spec.yaml").write_text(value.removeprefix("spec:"))
        value = str(tmp_path / "spec.yaml")
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump({"store": str(tmp_path / "s"), "data": {"source": "digits"}, "dashboard": ":0"}))
    res = CliRunner().invoke(main, ["run", str(cfg), flag, value])
    assert res.exit_code == 2 and "Traceback" not in res.output, res.output
    lines = [ln for ln in res.output.strip().splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and re.search(match, lines[0]), res.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cfg.yaml"] + (["spec.yaml"] if "spec" in value else [])
    if flag == "--store":  # a command's STORE argument: the same check (Store's), naming the argument
        res = CliRunner().invoke(main, ["models", value])
        assert res.exit_code == 2 and "Traceback" not in res.output, res.output
        assert re.search(match.replace("--store", "(STORE|metricpipe models)"), res.output.strip()), res.output
        assert len(res.output.strip().splitlines()) == 1, res.output


@pytest.mark.parametrize("value", ["lots", "-1GB", "0", "3", "1e400GB", "1e30GB"])
@pytest.mark.parametrize("command", ["run", "demo"])
def test_a_bad_memory_limit_option_is_refused_before_anything_starts(tmp_path, command, value):
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump({"data": {"source": "digits"}, "dashboard": ":0"}))
    args = [command, *([str(cfg)] if command == "run" else []), "--store", str(tmp_path / "s"), "--memory-limit", value]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 2 and "Traceback" not in res.output, res.output
    assert (
        f"Invalid value for '--memory-limit': expected a positive size such as 2GB or 'auto', got '{value}'"
        in res.output
        or value == "3"
        and "Invalid value for '--memory-limit': expected at least 400MB" in res.output
        or value == "1e30GB"
        and res.output.startswith("error: --memory-limit: 1e30GB per worker is more than this machine's memory")
    )
    assert not (tmp_path / "s").exists()


@pytest.mark.integration
@pytest.mark.parametrize("dense", [True, False])
def test_the_top_level_seed_keys_statistics_and_evaluation(client, tmp_path, dense):
    """Issue 19 item 7: changing ``seed`` must not reuse the seed-0 sampled queries or randomized SVD;
    dense statistics do not depend on it, and are reused (with every model made from them)."""
    store = tmp_path / "s"
    units = []
    for seed in (0, 1, 0):
        cfg = tmp_path / f"c{seed}.yaml"
        cfg.write_text(
            yaml.safe_dump(
                {
                    "store": str(store),
                    "seed": seed,
                    "cluster": client.scheduler.address,
                    "statistics": {"max_dense_dim": 64 if dense else 32},
                    "data": {"source": "digits"},
                    "methods": [{"method": "pca", "dim": 8}],
                    "evaluate": {"retrieval": {"k": [5], "queries": 50}, "classification": {"classifiers": ["knn1"]}},
                }
            )
        )
        res = CliRunner().invoke(main, ["run", str(cfg)])
        assert res.exit_code == 0, res.output
        manifest = json.loads((store / "runs/latest.json").read_text())["units"]
        evaluations = sorted(p.name for p in (store / "evaluation").glob("*.committed.json"))
        units.append((manifest["statistics"], evaluations, manifest["data"]))
    assert units[0][2] == units[1][2]  # the same staged data (its split has its own seed)
    assert (units[0][0] == units[1][0]) == dense and len(units[0][1]) == 1 and len(units[1][1]) == 2  # a new evaluation
    assert units[2] == (units[0][0], units[1][1], units[0][2])  # back to seed 0: the seed-0 units, reused


@pytest.mark.parametrize("args", [["--verbose", "run", "{cfg}"], ["run", "{cfg}", "--verbose"], ["run", "-v", "{cfg}"]])
def test_verbose_before_or_after_the_subcommand_shows_the_traceback_and_dask_logs(tmp_path, args):
    import logging
    import os

    missing = tmp_path / "missing.yaml"
    quiet = CliRunner().invoke(main, ["run", str(missing)])
    assert quiet.exit_code == 2 and quiet.output.startswith("error: ") and quiet.exception.__class__ is SystemExit
    assert logging.getLogger("distributed").level == logging.ERROR
    # the client's logger has a level of its own in distributed's config: its warnings reached the terminal
    assert logging.getLogger("distributed.client").getEffectiveLevel() == logging.ERROR
    loud = CliRunner().invoke(main, [a.format(cfg=missing) for a in args])
    assert loud.exit_code == 2 and loud.exception.__class__ is SystemExit  # a script's test of the code holds
    assert "Traceback (most recent call last)" in loud.output and "ConfigError" in loud.output
    assert loud.output.rstrip().splitlines()[-1] == quiet.output.strip()  # then the same one line
    assert logging.getLogger("distributed").level == logging.INFO
    assert logging.getLogger("distributed.client").getEffectiveLevel() == logging.INFO
    assert os.environ["DASK_LOGGING__DISTRIBUTED"] == "info"  # what the workers started later inherit
    CliRunner().invoke(main, ["run", str(missing)])  # the next command is quiet again
    assert logging.getLogger("distributed").level == logging.ERROR


VERBOSITY_IN_A_FRESH_PROCESS = """
import logging, sys
from metricpipe.cli import main
try:
    main(sys.argv[2:] + ["models", sys.argv[1]], standalone_mode=False)
except (Exception, SystemExit):   # no such store: exit 2
    pass
import distributed   # its import sets the loggers' levels from dask's config
print(*(logging.getLevelName(logging.getLogger(n).getEffectiveLevel()) for n in ("distributed", "distributed.client")))
"""


@pytest.mark.parametrize("user, flags, level", [("warning", ["-v"], "INFO"), ("debug", [], "ERROR")])
def test_the_command_s_level_holds_over_a_user_s_dask_logging_variable_in_a_fresh_process(tmp_path, user, flags, level):
    """The command line no longer imports dask before the command runs, so the level is set when it does
    (the variable still reaches the workers)."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "DASK_LOGGING__DISTRIBUTED": user}
    proc = subprocess.run(
        [sys.executable, "-c", VERBOSITY_IN_A_FRESH_PROCESS, str(tmp_path / "none"), *flags],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    # the client's logger too: its own default (warning) came back with the import
    assert proc.stdout.split() == [level, level], proc.stdout + proc.stderr


HALF_BUILT = """
import click
from metricpipe.cli import handle_errors
keep = []
class Half:
    def __init__(self, late):
        keep.append(self)
        self.late = late
        raise KeyboardInterrupt()      # before self.ok is set: a signal landing inside a constructor
    def __del__(self):
        if self.late:
            raise ValueError("a finaliser's own bug")
        self.ok
@click.command()
@click.option("--late", is_flag=True)
@handle_errors
def cmd(late):
    Half(late)
cmd()
"""


@pytest.mark.parametrize("late", [False, True])
def test_an_interrupt_leaves_the_resume_hint_last_not_a_finalisers_error(tmp_path, late):
    """Ctrl-C or SIGTERM inside a constructor leaves an object whose finaliser fails on the attribute
    never set (distributed's Future: "no attribute '_cleared'", once after the SIGTERM test's hint).
    That is dropped; a finaliser's other errors are still shown."""
    import subprocess
    import sys

    script = tmp_path / "half.py"
    script.write_text(HALF_BUILT)
    proc = subprocess.run(
        [sys.executable, str(script)] + (["--late"] if late else []), capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 130
    lines = proc.stderr.strip().splitlines()
    assert lines[0] == "interrupted; rerun the command to start again"  # a command without --resume
    assert (len(lines) == 1) != late and ("ValueError: a finaliser's own bug" in proc.stderr) == late


def test_version_is_the_code_s():
    """From the package, not the installed metadata (an editable install kept its first version's)."""
    import metricpipe

    res = CliRunner().invoke(main, ["--version"])
    assert res.exit_code == 0 and res.output.strip() == f"metricpipe, version {metricpipe.__version__}"


def test_the_package_s_estimators_and_modules_load_on_first_use():
    import subprocess
    import sys

    probe = (
        "import sys, metricpipe\nprint('sklearn' in sys.modules, metricpipe.NCMML.__module__, "
        "metricpipe.tasks.nml.NML.__name__, 'SLEM' in dir(metricpipe), hasattr(metricpipe, 'nosuch'))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["False", "metricpipe.tasks.ncmml", "NML", "True", "False"], out.stdout + out.stderr


CTRL_C_IN_IMPORT = """
import sys
class CtrlC:   # the Ctrl-C lands while scikit-learn is being imported
    def find_spec(self, name, path=None, target=None):
        if name == "sklearn":
            raise KeyboardInterrupt
import metricpipe.cli
heavy = sorted(m for m in ("numpy", "scipy", "sklearn", "dask", "distributed", "zarr") if m in sys.modules)
print("loaded:", heavy, flush=True)
sys.meta_path.insert(0, CtrlC())
metricpipe.cli.main(["run", *sys.argv[1:]])
"""


@pytest.mark.parametrize(
    "extra",
    [
        [],
        ["--store", "other store", "--workers", "1", "--repeats", "3"],
        ["--force", "train", "--repair"],
        ["--no-resume"],
        ["--no-resume", "--force", "train"],
        ["--memory-limit", "2GB"],
    ],
)  # the latter is read before the command
def test_a_ctrl_c_while_a_command_imports_its_libraries_gives_the_hint_not_a_traceback(tmp_path, extra):
    """The command line loads click and its error types only; each command imports the rest inside
    its error handler. Before, importing metricpipe.cli took 2 s of scikit-learn and distributed, and a
    Ctrl-C then printed a 30-line traceback."""
    import subprocess
    import sys

    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {"data": {"source": "digits"}, "methods": [{"method": "pca", "dim": 4}], "store": str(tmp_path / "s")}
        )
    )
    proc = subprocess.run(
        [sys.executable, "-c", CTRL_C_IN_IMPORT, str(cfg), *extra], capture_output=True, text=True, timeout=120
    )
    assert proc.stdout.strip() == "loaded: []", proc.stdout
    # the hint repeats the options (without --store it would resume the config's own store)
    hint = {
        (): f"to resume: metricpipe run {cfg} --resume",
        (
            "--store",
            "other store",
            "--workers",
            "1",
            "--repeats",
            "3",
        ): f"to resume: metricpipe run {cfg} --store 'other store' --workers 1 --repeats 3 --resume",
        ("--force", "train", "--repair"): f"to resume: metricpipe run {cfg} --force train --repair --resume",
        # --no-resume recomputes every stage: its continuation forces them all, keeping what it did
        ("--no-resume",): f"to resume: metricpipe run {cfg} --force stage --resume",
        ("--no-resume", "--force", "train"): f"to resume: metricpipe run {cfg} --force stage --resume",
    }.get(tuple(extra), "rerun with --resume to continue")  # --memory-limit: read before the command had its options
    assert proc.returncode == 130 and proc.stderr.strip().splitlines() == [
        f"interrupted; finished stages are kept{'; ' if 'metricpipe' in hint else ', '}{hint}"
    ], proc.stderr
    assert not (tmp_path / "s").exists()


SIGTERM_IN_IMPORT = CTRL_C_IN_IMPORT.replace(
    "raise KeyboardInterrupt", "from metricpipe.errors import Terminated; raise Terminated"
).replace('"run", ', "")


@pytest.mark.parametrize("command", ["encode", "evaluate", "demo"])
def test_a_sigterm_hint_names_resume_only_for_a_command_that_has_it(tmp_path, command):
    """encode and evaluate advised '--resume', which they do not take."""
    import subprocess
    import sys

    args = {
        "encode": ["encode", str(tmp_path / "s"), "digits", "--model", "ab", "--out", str(tmp_path / "c.npy")],
        "evaluate": ["evaluate", str(tmp_path / "e.npz")],
        "demo": ["demo", "--store", str(tmp_path / "s")],
    }
    proc = subprocess.run(
        [sys.executable, "-c", SIGTERM_IN_IMPORT, *args[command]], capture_output=True, text=True, timeout=120
    )
    hint = (
        "finished stages are kept, rerun with --resume to continue"
        if command == "demo"
        else "rerun the command to start again"
    )
    assert proc.returncode == 143 and proc.stderr.strip().splitlines() == [f"terminated (SIGTERM); {hint}"], proc.stderr
    assert sorted(tmp_path.iterdir()) == []


def test_a_slurm_run_keeps_ctrl_c_a_keyboard_interrupt():
    """Importing dask-jobqueue replaces the process's SIGINT handler with one that calls sys.exit():
    a Ctrl-C then ended a SLURM run with exit status 0 and no resume hint (and, in the tests, left
    the handler behind for every later test of the process)."""
    import subprocess
    import sys

    probe = (
        "import signal, sys\nfrom metricpipe import cluster\nbefore = signal.getsignal(signal.SIGINT)\n"
        "cluster.slurm_cluster_class()\n"
        "print('dask_jobqueue' in sys.modules, signal.getsignal(signal.SIGINT) is before)\n"
        "signal.raise_signal(signal.SIGINT)\n"
    )
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert proc.stdout.split() == ["True", "True"], proc.stdout + proc.stderr
    assert proc.returncode != 0 and "KeyboardInterrupt" in proc.stderr  # not SystemExit with status 0
    # outside the main thread dask-jobqueue cannot be imported at all (its signal.signal fails): one line
    thread = (
        "import threading, sys\nfrom metricpipe import cluster\nout = []\n"
        "def go():\n    try:\n        cluster.connect(sys.argv[1], 1).__enter__()\n"
        "    except Exception as e:\n        out.append(f'{type(e).__name__}: {e}')\n"
        "t = threading.Thread(target=go); t.start(); t.join(); print(out[0])\n"
    )
    spec = Path(__file__).resolve().parents[2] / "cluster/slurm.yaml"
    proc = subprocess.run([sys.executable, "-c", thread, str(spec)], capture_output=True, text=True, timeout=120)
    assert proc.stdout.startswith(f"InputError: {spec}: dask-jobqueue cannot be imported outside the main thread"), (
        proc.stdout + proc.stderr
    )


def test_a_ctrl_c_while_the_local_cluster_starts_waits_for_it_then_stops_the_run(monkeypatch):
    """A Ctrl-C during a local cluster's start (the whole process group gets it) used to kill the
    half-started workers with their own tracebacks and fail the cluster's close on a worker still
    starting (AssertionError: Status.init). It is held until the cluster is up, then raised; workers
    spawned meanwhile ignore SIGINT from their first import of metricpipe."""
    import os
    import signal
    import subprocess
    import sys

    from metricpipe import cluster

    probe = [
        sys.executable,
        "-c",
        "import os, signal, metricpipe; "
        "print(signal.getsignal(signal.SIGINT) == signal.SIG_IGN, 'METRICPIPE_STARTING_WORKER' in os.environ)",
    ]
    handlers = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    pending = []
    with cluster.interrupts_deferred(pending):
        os.kill(os.getpid(), signal.SIGINT)  # recorded, not raised
        child = subprocess.run(probe, capture_output=True, text=True, timeout=120).stdout.strip()
    assert pending == [signal.SIGINT] and child == "True False"  # ignores Ctrl-C; passes the variable on to no one
    assert "METRICPIPE_STARTING_WORKER" not in os.environ
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == handlers
    assert subprocess.run(probe, capture_output=True, text=True, timeout=120).stdout.strip() == "False False"
    with pytest.raises(KeyboardInterrupt):
        cluster.raise_pending(pending)
    with pytest.raises(KeyboardInterrupt):  # a start that fails with an interrupt held
        with cluster.interrupts_deferred(pending):
            raise RuntimeError("Nanny failed to start.")
    with pytest.raises(KeyboardInterrupt):  # a second Ctrl-C is not held: a hung start stops
        with cluster.interrupts_deferred([]):
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGINT)
            pytest.fail("a second Ctrl-C was held")
    assert signal.getsignal(signal.SIGINT) == handlers[0]

    class Terminated(BaseException):
        pass

    def on_term(signum, frame):
        raise Terminated

    signal.signal(signal.SIGTERM, on_term)
    try:
        held = []
        with cluster.interrupts_deferred(held):
            os.kill(os.getpid(), signal.SIGTERM)
        with pytest.raises(Terminated):  # raised through the handler the caller had
            cluster.raise_pending(held)
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a process started with Ctrl-C ignored
        ignored = []
        with cluster.interrupts_deferred(ignored):
            os.kill(os.getpid(), signal.SIGINT)
        assert ignored == [] and signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGTERM, handlers[1])
        signal.signal(signal.SIGINT, handlers[0])
    built = []

    class Interrupted(cluster.local.LocalCluster):
        def __init__(self, **kw):
            os.kill(os.getpid(), signal.SIGINT)  # the Ctrl-C lands as the start begins
            super().__init__(**kw)
            built.append(self)

    monkeypatch.setattr(cluster.local, "LocalCluster", Interrupted)
    with pytest.raises(KeyboardInterrupt):
        with cluster.connect("local", 1, dashboard=None):
            pytest.fail("the run went on after the Ctrl-C")
    assert len(built) == 1 and built[0].status.name == "closed"  # started whole, then closed


def test_local_cluster_options_with_a_running_scheduler_are_named_as_unused(client, tmp_path):
    X, y = make_blobs(n=200, d=6)
    np.savez(tmp_path / "d.npz", X=X, y=y)
    cfg = {
        "store": str(tmp_path / "s"),
        "dashboard": ":0",
        "cluster": client.scheduler.address,
        "data": {"path": str(tmp_path / "d.npz")},
        "methods": [{"method": "pca", "dim": 2}],
        "evaluate": {"retrieval": {"k": [5]}, "classification": {"classifiers": ["knn1"]}},
    }
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    res = _invoke("run", tmp_path / "c.yaml", "--workers", "2", "--memory-limit", "1GB")
    assert res.exit_code == 0, res.output
    assert (
        f"  note: --workers and --memory-limit apply to a local cluster only; the scheduler at "
        f"{client.scheduler.address} runs on its own workers" in res.output
    )
    res = _invoke("run", tmp_path / "c.yaml")
    assert res.exit_code == 0 and "apply to a local cluster only" not in res.output, res.output


@pytest.mark.parametrize(
    "stderr, words",
    [
        (
            "sbatch: fatal: Could not establish a configuration source\n",
            "SLURM's controller cannot be reached from this "
            "machine (sbatch: fatal: Could not establish a configuration source); run on a login node",
        ),
        (
            "sbatch: error: Batch job submission failed: Invalid account or account/partition combination specified\n",
            "SLURM refuses the worker job: Batch job submission failed: Invalid account or account/partition combination "
            "specified; check the spec's queue, account",
        ),
    ],
)
def test_sbatch_s_refusal_names_the_spec_only_when_the_spec_can_fix_it(monkeypatch, stderr, words):
    import subprocess

    from metricpipe import cluster
    from metricpipe.tasks.errors import InputError

    monkeypatch.setattr(subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 1, "", stderr))
    with pytest.raises(InputError, match=re.escape(words)) as e:
        cluster.check_slurm_job("cluster/slurm.yaml", "#!/bin/bash\n")
    assert "\n" not in str(e.value)


@pytest.mark.integration
def test_no_dashboard_means_no_dashboard_and_port_8787_left_alone(monkeypatch):
    """dashboard: false passed no address, and Dask's scheduler then served its HTTP routes on
    127.0.0.1:8787 anyway (a user's trial: 'ss -ltnp' showed it): now a free loopback port, no
    dashboard routes; with a dashboard, the given port."""
    import urllib.request

    from metricpipe import cluster

    with cluster.connect("local", 1, dashboard=None) as client:
        http = client.cluster.scheduler.http_server
        host, port = http.address, http.port
        assert host == "127.0.0.1" and port != 8787
        assert urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10).read() == b"ok"
        with pytest.raises(urllib.error.HTTPError):  # no dashboard behind it
            urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=10)
    with cluster.connect("local", 1, dashboard="127.0.0.1:0") as client:
        link = client.dashboard_link
        assert link.startswith("http://127.0.0.1:") and urllib.request.urlopen(link, timeout=30).status == 200


@pytest.mark.integration
def test_a_local_worker_drops_the_heartbeat_error_of_a_closing_scheduler_and_nothing_else():
    """A heartbeat racing the cluster's close printed ~30 lines of CommClosedError after a successful
    run (a new-user trial); the local workers' filter drops that record only."""
    import logging

    from metricpipe import cluster

    def filtered(message):
        rec = logging.LogRecord("distributed.worker", logging.ERROR, __file__, 1, message, None, None)
        return all(f.filter(rec) for f in logging.getLogger("distributed.worker").filters)

    with cluster.connect("local", 1, dashboard=None) as client:
        kept = client.run(
            lambda: [
                filtered("Failed to communicate with scheduler during heartbeat."),
                filtered("Compute Failed"),
                filtered("Failed to communicate with x"),
            ]
        )
    assert list(kept.values()) == [[False, True, True]]


def test_a_dashboard_host_that_is_not_this_machine_is_one_line_naming_the_config(tmp_path):
    """'myhost.invalid:8792' passed the config's pattern, then socket.gaierror reached the terminal."""
    cfg = {
        "store": str(tmp_path / "s"),
        "dashboard": "myhost.invalid:8792",
        "data": {"source": "digits"},
        "methods": [{"method": "pca", "dim": 2}],
    }
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    res = _invoke("run", tmp_path / "c.yaml")
    assert res.exit_code == 2 and res.output.strip().splitlines()[-1] == (
        f"error: {tmp_path / 'c.yaml'}: dashboard: myhost.invalid is not an address of this machine (or does not "
        f"resolve); give 127.0.0.1:PORT, 0.0.0.0:PORT to open it to the network, or false"
    ), res.output


def test_a_performance_report_path_that_cannot_be_written_is_refused_before_the_run(tmp_path):
    """It was found after every stage had run: a traceback and exit 1 at the end."""
    (tmp_path / "afile").write_text("x")
    cfg = {"store": str(tmp_path / "s"), "data": {"source": "digits"}, "methods": [{"method": "pca", "dim": 2}]}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    res = _invoke("run", tmp_path / "c.yaml", "--performance-report", tmp_path / "afile" / "r.html")
    assert res.exit_code == 2 and res.output.strip() == (
        f"error: {tmp_path / 'afile' / 'r.html'}: {tmp_path / 'afile'} is a file, not a folder "
        f"(--performance-report); choose another path"
    ), res.output
    # a missing folder is refused as for every other output option (Dask's report would make it)
    res = _invoke("run", tmp_path / "c.yaml", "--performance-report", tmp_path / "no" / "sub" / "r.html")
    assert res.exit_code == 2 and res.output.strip() == (
        f"error: {tmp_path / 'no' / 'sub' / 'r.html'}: its folder does not exist (--performance-report); create "
        f"it or choose another path"
    ), res.output
    assert not (tmp_path / "s").exists() and not (tmp_path / "no").exists()


@pytest.mark.parametrize("target", ["the data", "the config", "a commit marker", "runs/latest.json", "the store"])
def test_a_performance_report_over_an_input_or_the_store_is_refused(good_store, target):
    """--performance-report wrote anywhere: over data.path (the next run blamed 'pickled data'), a
    unit's marker (the unit then damaged), runs/latest.json; it now goes through --out's guard."""
    store = good_store / "store"
    path = {
        "the data": good_store / "ok.npz",
        "the config": good_store / "cfg.yaml",
        "a commit marker": next((store / "models").glob("*.committed.json")),
        "runs/latest.json": store / "runs/latest.json",
        "the store": store / "report" / "perf.html",
    }[target]
    before, data = _digest(good_store), (good_store / "ok.npz").read_bytes()
    res = CliRunner().invoke(main, ["run", str(good_store / "cfg.yaml"), "--performance-report", str(path)])
    assert res.exit_code == 2 and "Traceback" not in res.output, res.output
    said = "is inside the store" if target not in ("the data", "the config") else "is the input"
    assert res.output.strip().splitlines() == [next(ln for ln in res.output.splitlines() if ln.startswith("error:"))]
    assert res.output.startswith(f"error: {path}: {said}") and "(--performance-report)" in res.output, res.output
    assert _digest(good_store) == before and (good_store / "ok.npz").read_bytes() == data


def test_a_dashboard_address_of_another_machine_is_the_same_one_line():
    """An IP this machine does not have (EADDRNOTAVAIL), like an unknown name (gaierror), is the host's
    fault; a taken port is not (swapped for a free one)."""
    import socket

    from metricpipe import cluster

    with pytest.raises(cluster.DashboardHostError, match=r"^dashboard: 192\.0\.2\.7 is not an address of this machine"):
        cluster.dashboard_address("192.0.2.7:8792")  # TEST-NET-1: never local
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        taken = s.getsockname()[1]
        assert cluster.dashboard_address(f"127.0.0.1:{taken}") == "127.0.0.1:0"


def test_add_classes_takes_a_model_key_in_any_case(tmp_path):
    """Model keys are hex: find_model (load_model, encode, export, predict) reads them in any case;
    add-classes --model matched case-sensitively."""
    from metricpipe.commands.classes import ncm_models
    from metricpipe.store import Store
    from metricpipe.tasks.errors import InputError

    st = Store(str(tmp_path / "s"))
    for key, method in (("ab12cd34ef567890", "ncmml"), ("ab99000000000000", "pca")):
        u = st.unit("models", key)
        u.begin()
        u.commit({"spec": {"method": method}})
    assert [u.key for u, _ in ncm_models(st, "AB12")] == ["ab12cd34ef567890"]
    # --model names one model, as for predict, encode and export: a prefix of two is refused (it
    # extended both, a selection candidate that was not kept among them)
    u = st.unit("models", "ab12ffff00000000")
    u.begin()
    u.commit({"spec": {"method": "ncmml"}})
    with pytest.raises(InputError, match=r"model 'ab12' matches 2 models .*give more of the key"):
        ncm_models(st, "ab12")


def test_demo_takes_resume_and_repair_as_run_does(monkeypatch, tmp_path):
    """A damaged demo store's error says 'rerun with --repair'; demo had no such option."""
    import metricpipe.runner

    seen = {}
    monkeypatch.setattr(metricpipe.runner, "run_pipeline", lambda cfg, **kw: seen.update(kw, store=cfg.store))
    res = _invoke("demo", "--store", tmp_path / "d", "--repair", "--resume")
    assert res.exit_code == 0, res.output
    assert seen["repair"] is True and seen["resume"] is True and seen["store"] == str(tmp_path / "d")
    res = _invoke("demo", "--store", tmp_path / "d")  # resumes by default, as run does
    assert seen["repair"] is False and seen["resume"] is True
    res = _invoke("demo", "--store", tmp_path / "d", "--no-resume")
    assert seen["resume"] is False


@pytest.mark.parametrize(
    "args, option",
    [
        (["stage", "digits", "--store", "{tmp}/s", "--features", "pixels"], "--features"),
        (["predict", "{tmp}/s", "digits", "--model", "ab", "--labels", "klass"], "--labels"),
        (["encode", "{tmp}/s", "digits", "--model", "ab", "--out", "{tmp}/c.npy", "--ids", "rid"], "--ids"),
    ],
)
def test_a_built_in_data_set_refuses_array_names_it_would_ignore(tmp_path, args, option):
    """digits and fashion-mnist have their own arrays: a name given for them was ignored (a second staged
    copy under another key, or no ids in the output, with exit 0)."""
    res = _invoke(*[a.replace("{tmp}", str(tmp_path)) for a in args])
    assert res.exit_code == 2 and len(res.output.strip().splitlines()) == 1, res.output
    assert option in res.output and "has its own" in res.output, res.output
    assert not (tmp_path / "s").exists() and not (tmp_path / "c.npy").exists()


def test_unlock_of_a_missing_store_says_so(tmp_path):
    res = _invoke("unlock", tmp_path / "nope")
    assert res.exit_code == 2 and "no such store" in res.output and len(res.output.strip().splitlines()) == 1


def test_an_object_store_refusal_that_s3fs_raises_as_oserror_is_one_line(monkeypatch, tmp_path):
    """s3fs turns botocore's refusals (a wrong key, access denied) into PermissionError and the like:
    those were re-raised as tracebacks; an OSError from elsewhere still is."""
    from botocore.exceptions import ClientError
    from s3fs.errors import translate_boto_error

    import metricpipe.store.models

    def refused(store):
        try:
            raise ClientError(
                {"Error": {"Code": "InvalidAccessKeyId", "Message": "The key does not exist"}}, "ListObjectsV2"
            )
        except ClientError as e:
            raise translate_boto_error(e) from e

    monkeypatch.setattr(metricpipe.store.models, "describe", refused)
    monkeypatch.setattr(metricpipe.store.models, "damaged_models", lambda store: [])
    res = _invoke("models", "s3://bucket/run")
    assert res.exit_code == 2 and len(res.output.strip().splitlines()) == 1, res.output
    assert res.output.startswith(
        "error: s3://bucket/run: the object store refused the request: An error occurred (InvalidAccessKeyId)"
    ), res.output
    monkeypatch.setattr(
        metricpipe.store.models, "describe", lambda store: (_ for _ in ()).throw(PermissionError(13, "x"))
    )
    with pytest.raises(PermissionError):  # not an object store's: raised as it was
        _invoke("models", str(tmp_path))


@pytest.mark.integration
def test_a_test_split_of_one_row_per_class_is_noted_not_warned_about(client, tmp_path):
    """No retrieval query has a relevant image: every retrieval figure is NaN. The run said nothing,
    and numpy's 'Mean of empty slice' warnings reached the terminal."""
    X, y = make_blobs(n=80, d=6, classes=20)
    order = np.argsort(y, kind="stable")
    X, y = X[order], y[order]
    split = np.tile(["train", "train", "train", "test"], 20)
    np.savez(tmp_path / "d.npz", X=X, y=y, split=split)
    cfg = _config(
        tmp_path,
        {"path": str(tmp_path / "d.npz"), "split": {"column": "split"}},
        cluster=client.scheduler.address,
        methods=[{"method": "pca", "dim": 4}],
        evaluate={"retrieval": {"k": [1]}, "classification": {"classifiers": ["knn1"]}},
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # none may escape to the terminal
        res = _invoke("run", cfg)
    assert res.exit_code == 0, res.output
    assert "evaluate: no class has two of the 20 test rows, so no retrieval query has a relevant image" in res.output
    assert "RuntimeWarning" not in res.output and "Mean of empty slice" not in res.output


@pytest.mark.integration
@pytest.mark.parametrize("dashboard", ["0:0", "0.0.0.0:0"])
def test_a_dashboard_on_every_interface_prints_its_real_link_and_a_warning(dashboard):
    """'0:8787' and '0.0.0.0:8791' bound every interface, and the link printed was 127.0.0.1's with no
    word that the dashboard was open to the network."""
    import urllib.request

    from distributed.utils import get_ip

    from metricpipe import cluster

    with cluster.connect("local", 1, dashboard=dashboard) as client:
        http = client.cluster.scheduler.http_server
        assert http.address == "0.0.0.0"
        link, warning = cluster.dashboard_lines(client)
        assert link == f"Dashboard: http://{get_ip()}:{http.port}/status"
        assert urllib.request.urlopen(link.split(" ", 1)[1], timeout=30).status == 200
        assert warning == (
            f"warning: the dashboard listens on every interface of this machine (0.0.0.0:{http.port}): "
            f"whoever can reach it can watch the run and stop its tasks; dashboard: "
            f"127.0.0.1:{http.port} keeps it to this machine"
        )
    with cluster.connect("local", 1, dashboard="127.0.0.1:0") as client:  # the default host: no warning
        assert cluster.dashboard_lines(client) == [f"Dashboard: {client.dashboard_link}"]


class _Silent:
    """A port that accepts connections and never answers (an idle TCP service)."""

    def __enter__(self):
        import socket

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)  # the kernel accepts the connections; nobody reads or writes
        return self.sock.getsockname()[1]

    def __exit__(self, *exc):
        self.sock.close()


class _Http:
    """Python's HTTP server, which waits for a request line that Dask's handshake never ends."""

    def __enter__(self):
        import http.server
        import threading

        class Quiet(http.server.SimpleHTTPRequestHandler):
            def log_message(self, *args):  # its stderr is the command's in CliRunner
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self.server.server_address[1]

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize("listener", [_Silent, _Http], ids=["silent listener", "HTTP server"])
def test_a_port_that_does_not_speak_dask_is_one_line_within_the_wait_timeout(tmp_path, listener):
    """distributed's connect timeout covers the TCP connect only: Client() then waited for ever on a
    handshake that never came."""
    import time

    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump({"store": str(tmp_path / "s"), "data": {"source": "digits"}, "dashboard": ":0"}))
    with listener() as port:
        t0 = time.monotonic()
        res = _invoke("run", cfg, "--cluster", f"tcp://127.0.0.1:{port}", "--wait-timeout", "2")
        seconds = time.monotonic() - t0
    assert res.exit_code == 2 and "Traceback" not in res.output, res.output
    assert res.output.strip() == (
        f"error: cluster tcp://127.0.0.1:{port}: a program listens there but it is not a "
        f"Dask scheduler (no Dask handshake within 2 s); check the address and port "
        f"('dask scheduler' prints its address)"
    ), res.output
    assert seconds < 20, seconds
    assert not (tmp_path / "s").exists()


def test_a_wait_timeout_option_below_one_second_is_refused():
    res = _invoke("evaluate", "x.npy", "--wait-timeout", "0")
    assert res.exit_code == 2 and "Invalid value for '--wait-timeout': 0.0 is not in the range x>=1." in res.output, (
        res.output
    )


class _Scheduler:
    """A client's two calls the worker watch makes, answering from ``workers()`` (raising: no answer)."""

    def __init__(self, workers):
        self.workers, self.scheduler = workers, type("S", (), {"address": "tcp://127.0.0.1:8786"})()

    def nthreads(self, **kw):
        return self.workers()


def _watched(workers, seconds: float, bound: float = 0.4):
    """Wait ``seconds`` in a blocking lock wait under a WorkerWatch of ``bound``; the seconds it took."""
    import signal
    import threading
    import time

    from metricpipe import cluster

    before, t0 = signal.getsignal(cluster.WATCH_SIGNAL), time.monotonic()
    try:
        with cluster.WorkerWatch(_Scheduler(workers), "tcp://127.0.0.1:8786", bound, interval=0.05):
            threading.Event().wait(seconds)
    finally:
        assert signal.getsignal(cluster.WATCH_SIGNAL) == before  # the handler is the watch's only meanwhile
    return time.monotonic() - t0


def test_busy_workers_keep_the_worker_watch_quiet_and_a_short_gap_too():
    """The bound is on having no worker, not on a slow task: a task longer than the bound, with its
    worker there, runs on; a worker that comes back within the bound (a nanny's restart) is fine."""
    import time

    assert _watched(lambda: {"tcp://w:1": 1}, 1.5) >= 1.5
    back = time.monotonic() + 0.25
    assert _watched(lambda: {"tcp://w:1": 1} if time.monotonic() > back else {}, 1.5) >= 1.5


@pytest.mark.parametrize(
    "gone, words",
    [
        (
            lambda: {},
            "error: cluster tcp://127.0.0.1:8786: no worker for 0.4 s (wait_timeout): the scheduler's workers "
            "are gone; start workers ('dask worker tcp://127.0.0.1:8786') and run again",
        ),
        (
            lambda: (_ for _ in ()).throw(OSError("closed")),
            "error: cluster tcp://127.0.0.1:8786: the scheduler has not answered for 0.4 s (wait_timeout); restart it and "
            "its workers, or check the network, and run again",
        ),
    ],
    ids=["no worker", "no scheduler"],
)
def test_the_worker_watch_stops_a_blocked_wait_with_one_line(gone, words):
    """A run whose only worker was killed waited for ever (train: 24/42 tasks done); the watch raises
    WorkersGone in the main thread, even in a wait blocked in a lock, and the command line prints it
    as an error."""
    import time

    from metricpipe.errors import WorkersGone

    t0 = time.monotonic()
    with pytest.raises(WorkersGone) as e:
        _watched(gone, 30)
    assert time.monotonic() - t0 < 5 and f"error: {e.value}" == words


def test_repeats_on_the_command_line_overrides_the_config_for_run_and_demo(monkeypatch, tmp_path):
    import metricpipe.runner

    seen = {}
    monkeypatch.setattr(
        metricpipe.runner,
        "run_pipeline",
        lambda cfg, **kw: seen.update(repeats=cfg.repeats, setting=cfg.setting("repeats")),
    )
    cfg = _config(tmp_path, {"source": "digits"}, repeats=2)
    assert _invoke("run", cfg).exit_code == 0 and seen == {"repeats": 2, "setting": "repeats"}
    assert _invoke("run", cfg, "--repeats", "5").exit_code == 0 and seen == {"repeats": 5, "setting": "--repeats"}
    assert _invoke("demo", "--store", tmp_path / "d", "--repeats", "3").exit_code == 0 and seen["repeats"] == 3
    res = _invoke("run", cfg, "--repeats", "0")
    assert res.exit_code == 2 and "Invalid value for '--repeats': 0 is not in the range x>=1" in res.output
    res = _invoke("run", cfg, "--repeats", "101")
    assert res.exit_code == 2 and res.output.splitlines() == [
        "error: --repeats: must be <= 100 (every repeat trains every learned model again), got 101"
    ]
    assert not (tmp_path / "store").exists()


def test_an_interrupt_leaves_no_coroutine_warning_after_its_one_line():
    """After the resume hint, a coroutine the interrupt cut short ("was never awaited", at exit) stays
    quiet; other runtime warnings still show."""
    import warnings

    from metricpipe.cli.errors import stop_interrupted

    with warnings.catch_warnings():
        with pytest.raises(SystemExit):
            stop_interrupted(KeyboardInterrupt(), None)
        with warnings.catch_warnings(record=True) as seen:
            warnings.warn("coroutine 'open_array' was never awaited", RuntimeWarning, stacklevel=1)
            warnings.warn("something else", RuntimeWarning, stacklevel=1)
        assert [str(w.message) for w in seen] == ["something else"]
