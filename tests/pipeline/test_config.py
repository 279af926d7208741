from pathlib import Path

import numpy as np
import pytest

from metricpipe.config import ConfigError, load_config, parse_config

BASE = {"data": {"source": "digits"}}


def test_an_evaluate_part_set_to_false_is_left_out():
    assert parse_config({**BASE, "evaluate": {"classification": False}}).evaluate.classifiers == ()
    cfg = parse_config({**BASE, "evaluate": {"retrieval": False}})
    assert not cfg.evaluate.retrieval and cfg.evaluate.classifiers == ("knn1", "knn10", "ncm")
    assert parse_config({**BASE, "evaluate": {"classification": True}}).evaluate.classifiers == ("knn1", "knn10", "ncm")
    assert parse_config({**BASE, "evaluate": {"retrieval": True}}).evaluate.retrieval_k == (1, 10, 100)
    from metricpipe.checks import skipped_classifiers  # turned off is not "skipped for every model"

    assert skipped_classifiers(parse_config({**BASE, "evaluate": {"classification": False}}), []) == []


def test_wait_timeout_is_seconds_from_the_config_or_the_command_line():
    assert parse_config(BASE).wait_timeout == 60.0
    cfg = parse_config({**BASE, "wait_timeout": 5})
    assert cfg.wait_timeout == 5.0 and cfg.from_command_line(wait_timeout=2.5).wait_timeout == 2.5


def test_evaluate_objective_names_the_closing_line_s_objective_and_keys_no_evaluation():
    assert parse_config(BASE).objective is None  # both objectives' lines
    cfg = parse_config({**BASE, "evaluate": {"objective": "classification"}})
    assert cfg.objective == "classification"
    assert cfg.evaluate == parse_config(BASE).evaluate  # the evaluation units' key is unchanged


def test_defaults_and_method_expansion():
    cfg = parse_config({**BASE, "methods": [{"method": "pca", "dim": [8, 16]}, {"method": "lda"}]})
    assert [(m["method"], m.get("dim")) for m in cfg.methods] == [("pca", 8), ("pca", 16), ("lda", None)]
    assert cfg.cluster == "local" and cfg.evaluate.retrieval_k == (1, 10, 100) and cfg.neighbours is None


@pytest.mark.parametrize(
    "raw, match",
    [
        ({**BASE, "methds": []}, r"cfg.yaml: methds: unknown key; did you mean 'methods'\?"),
        (
            {"data": {"source": "digits", "normalise": "l2"}},
            r"data.normalise: unknown key; did you mean 'data.normalize'",
        ),
        ({"data": {"source": "digits", "normalize": "l3"}}, r"data.normalize: must be one of none, l1, l2, power"),
        ({"data": {"source": "mnist"}}, r"data.source: must be one of digits, fashion-mnist, synthetic"),
        ({"data": {}}, r"give exactly one of data.source"),
        (
            {"data": {"source": "digits", "split": {"test": 1.5}}},
            r"data.split.test: must be a share in \(0, 1\) of the rows .*got 1.5",
        ),
        (
            {"data": {"source": "digits", "split": {"test": 1.0}}},
            r"data.split.test: must be a share in \(0, 1\) of the rows",
        ),
        (
            {"data": {"source": "digits", "split": {"test": 0}}},
            r"data.split.test: must be a share in \(0, 1\) of the rows",
        ),
        (
            {"data": {"source": "digits", "split": {"classes": 1.5}}},
            r"cfg.yaml: data.split.classes: a fraction of the classes to hold out must be in \(0, 1\), got 1.5",
        ),
        ({"data": {"source": "digits", "split": {"classes": 0}}}, r"data.split.classes: a fraction .* got 0"),
        (
            {"data": {"source": "digits", "split": {"classes": True}}},
            r"data.split.classes: expected a fraction in \(0, 1\) of the classes or a list of class labels .*got True",
        ),
        (
            {"data": {"source": "digits", "split": {"classes": []}}},
            r"data.split.classes: expected a fraction .*got \[\]",
        ),
        (
            {"data": {"source": "digits", "split": {"classes": [0, [1]]}}},
            r"data.split.classes: expected .*got \[0, \[1\]\]",
        ),
        (
            {"data": {"source": "digits", "split": {"clases": [0, 1]}}},
            r"data.split.clases: unknown key; did you mean 'data.split.classes'\?",
        ),
        ({**BASE, "workers": 0}, r"workers: must be >= 1"),
        (
            {**BASE, "dashboard": ":99999"},
            r"cfg.yaml: dashboard: expected \[HOST\]:PORT .*got ':99999'",
        ),  # was an OverflowError
        (
            {**BASE, "dashboard": "[::]:8787"},
            r"cfg.yaml: dashboard: an IPv6 host \('\[::\]:8787'\) is not supported "
            r"by Dask's dashboard address; give 0.0.0.0:PORT",
        ),  # was a RuntimeError
        ({**BASE, "dashboard": "::1:8787"}, r"cfg.yaml: dashboard: an IPv6 host"),
        ({**BASE, "workers": "two"}, r"workers: expected int"),
        ({**BASE, "wait_timeout": 0}, r"cfg.yaml: wait_timeout: must be >= 1.0, got 0.0"),
        ({**BASE, "wait_timeout": "1m"}, r"cfg.yaml: wait_timeout: expected float, got '1m'"),
        (
            {**BASE, "memory_limit": "1e400GB"},
            r"cfg.yaml: memory_limit: expected a positive size such as 2GB or 'auto', "
            r"got '1e400GB'",
        ),  # was an OverflowError
        (
            {**BASE, "memory_limit": "1e30GB"},
            r"cfg.yaml: memory_limit: 1e30GB per worker is more than this machine's "
            r"memory \(\d.*\); give a smaller size",
        ),  # was accepted (Dask used less)
        (
            {**BASE, "methods": [{"method": "pca", "dim": -1}]},
            r"methods\[0\]: The 'dim' parameter of PCA must be an int in the range \[1, inf\) or None. Got -1 instead",
        ),
        ({**BASE, "methods": [{"dim": 3}]}, r"methods\[0\]: expected a mapping with a 'method' key"),
        ({**BASE, "evaluate": {"classification": {"classifiers": ["svm"]}}}, r"unknown classifier 'svm'"),
        ({**BASE, "evaluate": {"classification": "knn1"}}, r"evaluate.classification: got 'knn1'; give a map"),
        ({**BASE, "evaluate": False}, r"evaluate: got False; give a map .*a run always evaluates"),
        ({**BASE, "evaluate": 0}, r"evaluate: got 0; give a map"),
        (
            {**BASE, "data": {"source": "digits", "groups": "g"}},
            r"data.groups: names an array or column of a "
            r"data.path file; data.source: digits has its own",
        ),
        ({**BASE, "data": {"source": "digits", "features": "pixels"}}, r"data.features: names an array"),
        (
            {**BASE, "data": {"path": "x.npz", "synthetic": {"samples": 50}}},
            r"data.synthetic: is read only with "
            r"data.source: synthetic",
        ),
        (
            {**BASE, "data": {"source": "digits", "root": "/data"}},
            r"data.root: is read only with data.source: "
            r"fashion-mnist",
        ),
        ({**BASE, "evaluate": "all"}, r"evaluate: expected a mapping \(key: value\), got 'all'"),
        (
            {**BASE, "evaluate": {"retrieval": False, "classification": False}},
            r"evaluate: retrieval is false and no "
            r"classifier is left",
        ),
        (
            {**BASE, "evaluate": {"retrieval": False, "classification": {"classifiers": []}}},
            r"nothing would be evaluated",
        ),
        (
            {**BASE, "evaluate": {"objective": "speed"}},
            r"cfg.yaml: evaluate.objective: must be one of retrieval, "
            r"classification, got 'speed'",
        ),
        (
            {**BASE, "evaluate": {"objective": "retrieval", "retrieval": False}},
            r"evaluate.objective: retrieval, but evaluate.retrieval is off: nothing to report a winner on",
        ),
        (
            {**BASE, "evaluate": {"objective": "classification", "classification": False}},
            r"evaluate.objective: classification, but evaluate.classification is off",
        ),
        (
            {**BASE, "evaluate": {"objectives": "retrieval"}},
            r"evaluate.objectives: unknown key; did you mean "
            r"'evaluate.objective'",
        ),
        ({**BASE, "repeats": 0}, r"cfg.yaml: repeats: must be >= 1, got 0"),
        ({**BASE, "neighbours": {"k": 0}}, r"neighbours.k: must be >= 1"),
        ({**BASE, "neighbours": {"queries": 0}}, r"neighbours.queries: must be >= 1"),
        (
            {**BASE, "neighbours": {"queries": 100}, "evaluate": {"classification": {"classifiers": ["softvote5"]}}},
            r"classifiers: softvote votes over the test rows' neighbourhoods, which neighbours.queries leaves out",
        ),
        (
            {**BASE, "methods": [{"method": "ncmml", "classes": [0, [1, 2]]}]},
            r"methods\[0\]: The 'classes' parameter of NCMML must be a non-empty list of class labels \(as in y\)",
        ),
        (
            {**BASE, "methods": [{"method": "ncmml", "classes": 3}]},
            r"The 'classes' parameter of NCMML must be an array-like or None. Got 3 instead",
        ),
        (
            {**BASE, "methods": [{"method": "knnml", "targets": "closest"}]},
            r"The 'targets' parameter of KNNML must be a str among .*'dynamic'.*Got 'closest' instead",
        ),
        (
            {**BASE, "methods": [{"method": "ncmc", "train_centroids": 2}]},
            r"'train_centroids' parameter of NCMC must be a int among \{1\} or None",
        ),
        (
            {**BASE, "cluster": "slurm"},
            r"cluster: expected local, tcp://HOST:PORT, tls://HOST:PORT or a cluster spec .yaml",
        ),
        (
            {**BASE, "cluster": {"n_workers": 1}},
            r"cluster: expected local, .*the local cluster's size is set by workers",
        ),
        ({**BASE, "encode": {"pq": [8, 0]}}, r"cfg.yaml: encode.pq: expected bytes per vector, integers from 1"),
        ({**BASE, "encode": {"pq": "8"}}, r"encode.pq: expected bytes per vector, .* got '8'"),
        ({**BASE, "encode": {"pq": [16, 8, 16]}}, r"encode.pq: 16 is listed twice; list each size once"),
        ({**BASE, "encode": {"pqs": [8]}}, r"encode.pqs: unknown key; did you mean 'encode.pq'"),
        ({**BASE, "encode": [8, 16]}, r"encode: expected a mapping \(key: value\), got \[8, 16\]"),
        (
            {**BASE, "methods": [{"method": "slem", "kernel": "rbf"}]},  # (KernelSLEM's own list left out linear)
            r"The 'kernel' parameter of slem must be a str among \{'linear', 'gaussian', 'poly'\}.*Got 'rbf' instead",
        ),
    ],
)
def test_bad_config_is_one_line_naming_the_key(raw, match):
    with pytest.raises(ConfigError, match=match) as e:
        parse_config(raw, where="cfg.yaml")
    assert "\n" not in str(e.value)


def test_a_memory_limit_above_the_machine_is_refused_for_a_local_cluster_only():
    """Dask caps a local worker's limit at the machine's memory, silently; a remote cluster's
    workers are not this machine's (the setting does not apply to them)."""
    assert parse_config({**BASE, "memory_limit": "1e30GB", "cluster": "tcp://127.0.0.1:8786"}).memory_limit == "1e30GB"
    cfg = parse_config({**BASE, "cluster": "tcp://127.0.0.1:8786", "memory_limit": "1e30GB"}, where="cfg.yaml")
    with pytest.raises(ConfigError, match=r"^cfg.yaml: memory_limit: 1e30GB per worker is more than"):
        cfg.from_command_line(cluster="local")
    with pytest.raises(ConfigError, match=r"^--memory-limit: 1e30GB per worker is more than"):
        parse_config(BASE, where="cfg.yaml").from_command_line(memory_limit="1e30GB")


def test_held_out_classes_are_a_fraction_or_a_list_of_labels():
    split = parse_config({"data": {"source": "digits", "split": {"classes": 0.2, "seed": 3}}}).data.split
    assert (split.classes, split.seed) == (0.2, 3)
    assert parse_config({"data": {"source": "digits", "split": {"classes": [3, "a"]}}}).data.split.classes == (3, "a")
    assert parse_config(BASE).data.split.classes is None


def test_load_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("data: [unclosed\n")
    with pytest.raises(ConfigError, match="bad.yaml: not valid YAML at line"):
        load_config(bad)


def test_exponent_floats_without_a_dot_are_numbers_and_booleans_are_not(tmp_path):
    """YAML 1.1 (PyYAML) reads 1e-3 as text and true as 1; a config means what it looks like."""
    p = tmp_path / "cfg.yaml"
    p.write_text(
        "data: {source: digits, split: {test: 2e-1}}\nmemory_limit: 2e9\nneighbours: {k: 1e1}\n"
        "methods: [{method: pcaw, dim: 8, eps: 1e-6}, {method: ncmml, dim: 8, lr: [3E1, +1.5e+0, .5e1]},\n"
        "          {method: linear-ml, dim: 8, learn_bias: true, pairs: 1e3, iters: [1e4, 2e4]}]\n"
    )
    cfg = load_config(p)
    assert cfg.data.split.test == 0.2
    assert cfg.memory_limit == 2_000_000_000 and cfg.neighbours.k == 10  # whole numbers where counts go
    assert cfg.methods[0]["eps"] == 1e-6
    assert [m["lr"] for m in cfg.methods[1:4]] == [30.0, 1.5, 5.0]
    assert [(m["learn_bias"], m["pairs"], m["iters"]) for m in cfg.methods[4:]] == [
        (True, 1000, 10000),
        (True, 1000, 20000),
    ]
    assert all(type(m["pairs"]) is int for m in cfg.methods[4:])  # a boolean parameter still takes true
    p.write_text("data: {source: digits}\nmethods: [{method: pca, dim: 1e3x}]\n")  # not a number: text
    with pytest.raises(ConfigError, match="'dim' parameter of PCA must be an int"):
        load_config(p)
    p.write_text("data: {source: digits}\nmethods: [{method: pca, dim: true}]\n")
    with pytest.raises(
        ConfigError,
        match=r"cfg.yaml: methods\[0\]: The 'dim' parameter of PCA must be a number, "
        r"not a boolean. Got True instead.",
    ):
        load_config(p)


def test_example_configs_are_valid_and_keep_their_stores_and_data_where_the_readme_says(tmp_path, monkeypatch):
    repo = Path(__file__).parents[2]
    monkeypatch.chdir(tmp_path)  # wherever they are run from
    for p in repo.joinpath("examples").glob("*.yaml"):
        cfg = load_config(p)
        assert cfg.methods
        assert Path(cfg.store).resolve().parent == repo / "runs", p  # the repository's runs/NAME
        if cfg.data.path:
            assert Path(cfg.data.path).resolve().parent == repo / "runs", p  # made by `metricpipe synth`
        assert cfg.data.root is None  # built-in sources look in $METRICPIPE_DATA, not a path of ours


def test_relative_paths_in_a_config_resolve_against_its_folder_not_the_working_directory(tmp_path, monkeypatch):
    import yaml

    conf = tmp_path / "project" / "conf"
    conf.mkdir(parents=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    p = conf / "run.yaml"
    p.write_text(
        yaml.safe_dump(
            {
                "store": "../runs/x",
                "cluster": "slurm.yaml",
                "tls": {"ca_file": "pem/ca.pem", "cert": "/etc/cert.pem", "key": "~/key.pem"},
                "data": {
                    "path": "feats/x.npz",
                    "labels": "labels/y.npy",
                    "pairs": "pairs.npz",
                    "groups": "g",
                    "ids": "i",
                    "split": {"column": "split"},
                },
            }
        )
    )
    cfg = load_config(p)
    assert cfg.store == str(conf / "../runs/x") and cfg.cluster == str(conf / "slurm.yaml")
    assert cfg.data.path == str(conf / "feats/x.npz") and cfg.data.labels == str(conf / "labels/y.npy")
    assert cfg.data.pairs == str(conf / "pairs.npz")
    assert cfg.tls == (str(conf / "pem/ca.pem"), "/etc/cert.pem", str(Path("~/key.pem").expanduser()))
    # array names inside the data file are not paths; nor are URLs, schedulers or built-in sources
    assert (cfg.data.groups, cfg.data.ids, cfg.data.split.column, cfg.data.features) == ("g", "i", "split", "X")
    p.write_text(
        yaml.safe_dump(
            {
                "store": "s3://bucket/run",
                "cluster": "tcp://127.0.0.1:8786",
                "data": {"source": "fashion-mnist", "labels": "y"},
            }
        )
    )
    cfg = load_config(p)
    assert (cfg.store, cfg.cluster, cfg.data.labels, cfg.data.root) == (
        "s3://bucket/run",
        "tcp://127.0.0.1:8786",
        "y",
        None,
    )
    p.write_text(yaml.safe_dump({"data": {"source": "fashion-mnist", "root": "idx"}}))
    assert load_config(p).data.root == str(conf / "idx")
    # a store the config does not name is the default, under the working directory as before
    p.write_text(yaml.safe_dump({"data": {"source": "digits"}}))
    assert load_config(p).store == "runs/metricpipe"


def test_a_missing_relative_data_path_names_where_it_was_looked_for(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from metricpipe.cli import main

    (tmp_path / "conf").mkdir()
    monkeypatch.chdir(tmp_path)
    (tmp_path / "conf/run.yaml").write_text("store: store\ndata: {path: x.npz}\n")
    res = CliRunner().invoke(main, ["run", "conf/run.yaml"])
    assert res.exit_code == 2 and "Traceback" not in res.output
    assert res.output == (
        f"error: {tmp_path / 'conf/x.npz'}: file not found (data.path); check the path (a "
        f"config's relative paths are read from its folder)\n"
    )


def _yaml_blocks(relpath: str) -> list:
    """The ```yaml blocks of a documentation file, parsed."""
    import re

    import yaml

    text = Path(__file__).parents[2].joinpath(relpath).read_text()
    return [yaml.safe_load(b) for b in re.findall(r"```yaml\n(.*?)```", text, re.S)]


def test_readme_config_example_parses_as_a_file_would():
    """The README's config example is a valid config: parsed, its list expanded, its set step kept."""
    (raw,) = _yaml_blocks("README.md")
    cfg = parse_config(raw, where="README.md")
    assert cfg.data.source == "fashion-mnist" and cfg.data.normalize == "l2"
    assert [m.get("dim") for m in cfg.methods if m["method"] == "pca"] == [16, 32, 64]
    assert "softvote3" in cfg.evaluate.classifiers


def test_learners_page_lists_every_parameter_of_every_learner_at_its_default():
    """docs/guide/learners.md shows a methods entry per learner with every parameter at its default (a
    kernel SLEM's smaller pool excepted): a parameter added, renamed or given another default fails here
    until the page says so, and the entries must parse as a config's methods."""
    from metricpipe.tasks import registry
    from metricpipe.tasks.slem import KernelSLEM

    entries = [e for block in _yaml_blocks("docs/guide/learners.md") for e in block["methods"]]
    shown = {}
    for e in entries:
        cls = registry.estimator_class(e["method"], e)
        defaults = cls().get_params()
        params = {k: v for k, v in e.items() if k != "method"}
        assert set(params) == set(defaults), (cls.__name__, set(params) ^ set(defaults))
        differ = {k for k, v in params.items() if v != defaults[k] and k != "negatives"}
        assert not differ, (cls.__name__, {k: (params[k], defaults[k]) for k in differ})
        shown[cls] = e
    assert set(shown) == set(registry.BUILTIN.values()) | {KernelSLEM}
    assert len(parse_config({**BASE, "methods": entries}).methods) == len(entries)


def test_alias_expansion_is_counted_without_expanding():
    """The bomb guard counts the nodes aliases imply, memoised per node: a small document's count
    equals that of its fully expanded copy, and the test file's bomb (9 levels of 9) is counted as
    hundreds of millions without building it."""
    import json

    import yaml

    from metricpipe.config.files import _expanded_size
    from tests.pipeline.test_cli import BOMB

    def nodes(x):
        if isinstance(x, list):
            return 1 + sum(nodes(v) for v in x)
        if isinstance(x, dict):
            return 1 + sum(1 + nodes(v) for v in x.values())
        return 1

    small = "a: &a [1, 2, {x: 3}]\nb: [*a, *a]\nc: {p: *a, q: [*a]}\n"
    expanded = json.loads(json.dumps(yaml.safe_load(small)))  # aliases written out in full
    assert _expanded_size(yaml.compose(small, Loader=yaml.SafeLoader), {}) == nodes(expanded)
    assert _expanded_size(yaml.compose(BOMB, Loader=yaml.SafeLoader), {}) > 9**9


def test_a_hierarchy_file_is_read_as_configs_are(tmp_path):
    """add-classes --hierarchy: its own YAML reading had no alias-bomb guard and named only the
    exception's type; it is read by the config reader now."""
    from metricpipe.commands.classes import _parents
    from metricpipe.tasks.errors import InputError
    from tests.pipeline.test_cli import BOMB

    cases = {
        "bomb.yaml": (BOMB, r"YAML aliases expand to more than 100,000 values; the hierarchy \(--hierarchy\)"),
        "bad.yaml": ("a: [1,\n", r"not valid YAML at line \d+"),
        "bin.yaml": (b"\xff\xfe\x00", r"not a text file; the hierarchy \(--hierarchy\) must be YAML text"),
    }
    for name, (content, words) in cases.items():
        p = tmp_path / name
        p.write_bytes(content if isinstance(content, bytes) else content.encode())
        with pytest.raises(InputError, match=words) as e:
            _parents(str(p))
        assert "\n" not in str(e.value) and str(e.value).startswith(str(p))
    with pytest.raises(InputError, match=r"file not found \(--hierarchy\)"):
        _parents(str(tmp_path / "none.yaml"))
    (tmp_path / "h.yaml").write_text("40: 1\n41: 1\n1: 0\n")
    assert _parents(str(tmp_path / "h.yaml")) == {"40": "1", "41": "1", "1": "0"}


def _info(n_features, classes, split):
    """A stand-in for the staged data's DataInfo: what the checks before staging read."""
    from types import SimpleNamespace

    return SimpleNamespace(
        n_features=n_features, classes=classes, split=split, groups=None, labels=np.arange(len(split)) % len(classes)
    )


def test_default_knn_above_the_train_rows_is_dropped_with_a_note_but_a_listed_one_is_refused():

    from metricpipe.checks import check_methods, skipped_classifiers
    from metricpipe.tasks.errors import InputError

    info = _info(n_features=8, classes=[0, 1], split=np.array([0] * 6 + [1] * 20, np.int8))  # 6 train
    logs = []
    cfg = check_methods(
        parse_config({**BASE, "evaluate": {"retrieval": {"k": [5]}}}, where="cfg.yaml"), info, logs.append
    )
    assert cfg.evaluate.classifiers == ("knn1", "ncm") and any("classifiers ['knn1', 'ncm']" in m for m in logs)
    assert skipped_classifiers(cfg, cfg.methods) == [
        {
            "model": "every model",
            "classifier": "knn10",
            "reason": "votes over more neighbours than the train split holds",
        }
    ]
    listed = parse_config(
        {**BASE, "evaluate": {"retrieval": {"k": [5]}, "classification": {"classifiers": ["knn10"]}}}, where="cfg.yaml"
    )
    with pytest.raises(InputError, match=r"cfg.yaml: evaluate.classification.classifiers: knn10 votes over more"):
        check_methods(listed, info)


def test_a_sparsity_rounded_to_one_non_zero_is_noted_before_staging():
    """tau = 0.995 at D = 64 leaves 0.32 non-zeros per column: the run goes on with 1, and says so."""

    from metricpipe.checks import check_methods

    info = _info(n_features=64, classes=[0, 1], split=np.array([0] * 20 + [1] * 20, np.int8))
    logs = []
    methods = [{"method": "sparse", "sparsity": 0.995}, {"method": "sparse", "sparsity": 0.98}]
    check_methods(parse_config({**BASE, "methods": methods}, where="cfg.yaml"), info, logs.append)
    notes = [m for m in logs if "non-zeros per column" in m]
    assert notes == [
        "  methods[0] (sparse-sparsity0.995): sparsity 0.995 leaves 0.32 non-zeros per column of the "
        "data's 64 features; 1 is kept (sparsity 0.984375)"
    ]


def test_an_slde_dim_beyond_its_members_dimensions_is_refused_before_staging():
    """It failed in the train stage, after staging, statistics, neighbours and every member had run."""

    from metricpipe.checks import check_methods
    from metricpipe.tasks.errors import InputError

    info = _info(n_features=50, classes=[0, 1], split=np.array([0] * 20 + [1] * 20, np.int8))
    graph = {"neighbours": {"k": 5}}  # below the 20 train rows (the default 50 is refused there too)
    check_methods(parse_config({**BASE, **graph, "methods": [{"method": "slde", "dim": 48}]}, where="cfg.yaml"), info)
    with pytest.raises(InputError, match=r"cfg.yaml: methods\[0\].*must be <= members x member_dim = 3 x 16 = 48"):
        check_methods(
            parse_config({**BASE, **graph, "methods": [{"method": "slde", "dim": 50}]}, where="cfg.yaml"), info
        )


def test_methods_that_need_the_dense_covariance_are_refused_before_staging_above_max_dense_dim():
    """LDA and linear SLEM are fitted from the D x D covariance, which statistics keeps only up to
    max_dense_dim features: refused with the data's shape, not in the train stage after staging and
    statistics had run and been committed."""

    from metricpipe.checks import check_methods
    from metricpipe.tasks.errors import InputError

    info = _info(n_features=64, classes=[0, 1, 2], split=np.array([0] * 20 + [1] * 20, np.int8))
    for method in ({"method": "lda"}, {"method": "slem", "lam": 1.0}):
        methods = [{"method": "pca"}, {"method": "slem", "kernel": "poly"}, method]
        for dense in (64, 1000):  # D = 64 keeps its covariance at max_dense_dim 64
            check_methods(
                parse_config({**BASE, "methods": methods, "statistics": {"max_dense_dim": dense}}, where="cfg.yaml"),
                info,
            )
        with pytest.raises(InputError) as e:
            check_methods(
                parse_config({**BASE, "methods": methods, "statistics": {"max_dense_dim": 32}}, where="cfg.yaml"), info
            )
        msg = str(e.value)
        assert (
            msg.startswith(f"cfg.yaml: methods[2] ({method['method']}")
            and "needs the D x D covariance, but "
            "D = 64 is above statistics.max_dense_dim (32); raise statistics.max_dense_dim"
            in msg
        ), msg
        assert ("a kernel SLEM does without" in msg) == (method["method"] == "slem") and "\n" not in msg


def test_a_random_projection_above_the_features_is_a_note_not_a_worker_warning():
    """The run says it once before any work; a process that runs the train stage's tasks does not print
    the warning again (it reached the terminal as a raw 'stages/train.py:31: UserWarning' line); the
    library alone still warns."""
    import subprocess
    import sys

    from metricpipe.checks import check_methods

    info = _info(n_features=40, classes=[0, 1], split=np.array([0] * 20 + [1] * 20, np.int8))
    logs = []
    check_methods(
        parse_config(
            {**BASE, "methods": [{"method": "random", "dim": 100}, {"method": "random", "dim": 8}]}, where="cfg.yaml"
        ),
        info,
        logs.append,
    )
    assert [m for m in logs if "random" in m] == [
        "  methods[0] (random-100): dim 100 > the 40 features: a random projection to more dimensions adds no "
        "information (its codes are the features, mixed)"
    ]
    fit = (
        "import warnings, numpy as np{}\nfrom metricpipe.tasks.baselines import RandomProjection\n"
        "with warnings.catch_warnings(record=True) as w:\n"
        "    RandomProjection(dim=100).fit_statistics({{'mean': np.zeros(40)}})\n"
        "print(sum('random projection to dim=100 > n_features=40' in str(x.message) for x in w))"
    )
    worker = subprocess.run(
        [sys.executable, "-c", fit.format(", metricpipe.stages.train")], capture_output=True, text=True, timeout=120
    )
    library = subprocess.run([sys.executable, "-c", fit.format("")], capture_output=True, text=True, timeout=120)
    assert (worker.stdout.strip(), library.stdout.strip()) == ("0", "1"), (worker.stderr, library.stderr)


def test_errors_and_notes_name_the_entry_of_the_config_not_the_model_after_a_sweep():
    """methods: [pca with 3 dims, ncmml dim 100, sparse]: the second entry is methods[1], though it
    is the fourth model."""

    from metricpipe.checks import check_methods
    from metricpipe.tasks.errors import InputError

    info = _info(n_features=64, classes=[0, 1], split=np.array([0] * 20 + [1] * 20, np.int8))
    methods = [{"method": "pca", "dim": [8, 16, 32]}, {"method": "ncmml", "dim": 100}]
    with pytest.raises(InputError, match=r"cfg.yaml: methods\[1\] \(ncmml-100.*\): The 'dim' parameter of NCMML"):
        check_methods(parse_config({**BASE, "methods": methods}, where="cfg.yaml"), info)
    logs = []
    methods = [{"method": "pca", "dim": [8, 16]}, {"method": "sparse", "dim": [4, 8], "sparsity": 0.995}]
    check_methods(parse_config({**BASE, "methods": methods}, where="cfg.yaml"), info, logs.append)
    assert [m.split(": ")[0] for m in logs if "non-zeros per column" in m] == ["  methods[1] (sparse-4-sparsity0.995)"]


@pytest.mark.parametrize("name", sorted(p.name for p in (Path(__file__).parents[2] / "examples").glob("*.yaml")))
def test_every_example_config_loads(name):
    """The shipped examples (the quick start's demo among them) stay valid as the config grows."""
    cfg = load_config(Path(__file__).parents[2] / "examples" / name)
    assert cfg.methods


def test_yaml_merge_keys_may_be_overridden_but_plain_keys_not_repeated(tmp_path):
    from metricpipe.config import ConfigError, read_yaml

    p = tmp_path / "m.yaml"
    p.write_text("base: &b {dim: 4, lr: 1}\nm:\n  <<: *b\n  dim: 8\n")
    assert read_yaml(p, "a config")["m"] == {"dim": 8, "lr": 1}
    p.write_text("m: {a: 1}\nm: {a: 2}\n")
    with pytest.raises(ConfigError, match="duplicate key 'm'"):
        read_yaml(p, "a config")


def test_a_negative_pool_asked_above_its_split_is_noted_and_the_default_pool_is_not():
    """negatives.count 5,000 on 4,499 train rows took them all without a word, while the model's
    parameters still say 5,000 (a new-user trial)."""
    from metricpipe.checks import check_methods

    info = _info(n_features=16, classes=[0, 1], split=np.array([0] * 30 + [1] * 20, np.int8))  # 30 train rows
    logs = []
    methods = [
        {"method": "slem", "negatives": {"count": 40}, "lam": 1.0},
        {"method": "slem", "lam": 1.0},
        {"method": "slem", "negatives": {"count": 20}, "lam": 0.1},
    ]
    check_methods(parse_config({**BASE, "methods": methods}, where="cfg.yaml"), info, logs.append)
    notes = [m for m in logs if "negatives.count" in m]
    assert (
        len(notes) == 1
        and notes[0].startswith("  methods[0] ")
        and notes[0].endswith("negatives.count 40 is more than the 30 train rows: the pool is all of them")
    ), logs
