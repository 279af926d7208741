import pytest

from metricpipe.config import ConfigError, load_config, parse_config

BASE = {"data": {"source": "digits"}}


def test_defaults_and_method_expansion():
    cfg = parse_config({**BASE, "methods": [{"method": "pca", "dim": [8, 16]}, {"method": "lda"}]})
    assert [(m["method"], m.get("dim")) for m in cfg.methods] == [("pca", 8), ("pca", 16), ("lda", None)]
    assert cfg.cluster == "local" and cfg.evaluate.retrieval_k == (1, 10, 100) and cfg.neighbours is None


@pytest.mark.parametrize("raw, match", [
    ({**BASE, "methds": []}, r"cfg.yaml: methds: unknown key; did you mean 'methods'\?"),
    ({"data": {"source": "digits", "normalise": "l2"}}, r"data.normalise: unknown key; did you mean 'data.normalize'"),
    ({"data": {"source": "digits", "normalize": "l3"}}, r"data.normalize: must be one of none, l1, l2, power"),
    ({"data": {"source": "mnist"}}, r"data.source: must be one of digits, fashion-mnist, synthetic"),
    ({"data": {}}, r"give exactly one of data.source"),
    ({"data": {"source": "digits", "split": {"test": 1.5}}}, r"data.split.test: must be <= 1.0"),
    ({**BASE, "workers": 0}, r"workers: must be >= 1"),
    ({**BASE, "workers": "two"}, r"workers: expected int"),
    ({**BASE, "methods": [{"method": "pca", "dim": -1}]}, r"methods\[0\]: The 'dim' parameter of PCA must be an int in the range \[1, inf\) or None. Got -1 instead"),
    ({**BASE, "methods": [{"dim": 3}]}, r"methods\[0\]: expected a mapping with a 'method' key"),
    ({**BASE, "evaluate": {"classification": {"classifiers": ["svm"]}}}, r"unknown classifier 'svm'"),
    ({**BASE, "neighbours": {"k": 0}}, r"neighbours.k: must be >= 1"),
    ({**BASE, "neighbours": {"queries": 0}}, r"neighbours.queries: must be >= 1"),
    ({**BASE, "neighbours": {"queries": 100}, "evaluate": {"classification": {"classifiers": ["softvote5"]}}},
     r"classifiers: softvote votes over the test rows' neighbourhoods, which neighbours.queries leaves out"),
    ({**BASE, "methods": [{"method": "ncmml", "classes": [0, -1]}]},
     r"methods\[0\]: The 'classes' parameter of NCMML must be a non-empty list of class indices"),
    ({**BASE, "methods": [{"method": "ncmml", "classes": 3}]}, r"The 'classes' parameter of NCMML must be an array-like or None. Got 3 instead"),
    ({**BASE, "methods": [{"method": "knnml", "targets": "closest"}]},
     r"The 'targets' parameter of KNNML must be a str among .*'dynamic'.*Got 'closest' instead"),
    ({**BASE, "methods": [{"method": "ncmc", "train_centroids": 2}]}, r"'train_centroids' parameter of NCMC must be a int among \{1\} or None"),
    ({**BASE, "cluster": "slurm"}, r"cluster: expected local, tcp://HOST:PORT, tls://HOST:PORT or a cluster spec .yaml"),
])
def test_bad_config_is_one_line_naming_the_key(raw, match):
    with pytest.raises(ConfigError, match=match) as e:
        parse_config(raw, where="cfg.yaml")
    assert "\n" not in str(e.value)


def test_load_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("data: [unclosed\n")
    with pytest.raises(ConfigError, match="bad.yaml: not valid YAML at line"):
        load_config(bad)


def test_example_configs_are_valid():
    from pathlib import Path
    for p in Path(__file__).parents[2].joinpath("examples").glob("*.yaml"):
        assert load_config(p).methods


def test_readme_config_reference_is_valid():
    """The README's config block lists every key; it must parse (source and path are alternatives)."""
    import re
    from pathlib import Path

    import yaml

    text = Path(__file__).parents[2].joinpath("README.md").read_text()
    block = re.search(r"## Config reference\s+```yaml\n(.*?)```", text, re.S).group(1)
    raw = yaml.safe_load(block)
    raw["data"].pop("path")
    cfg = parse_config(raw, where="README.md")
    assert {m["method"] for m in cfg.methods} >= {"identity", "pca", "pcaw", "lda", "random", "slne", "slde"}
    assert "softvote3" in cfg.evaluate.classifiers


def test_alias_expansion_is_counted_without_expanding():
    """The bomb guard counts the nodes aliases imply, memoised per node: a small document's count
    equals that of its fully expanded copy, and the test file's bomb (9 levels of 9) is counted as
    hundreds of millions without building it."""
    import json
    import yaml
    from metricpipe.config import _expanded_size
    from tests.pipeline.test_cli import BOMB

    def nodes(x):
        if isinstance(x, list):
            return 1 + sum(nodes(v) for v in x)
        if isinstance(x, dict):
            return 1 + sum(1 + nodes(v) for v in x.values())
        return 1
    small = "a: &a [1, 2, {x: 3}]\nb: [*a, *a]\nc: {p: *a, q: [*a]}\n"
    expanded = json.loads(json.dumps(yaml.safe_load(small)))       # aliases written out in full
    assert _expanded_size(yaml.compose(small, Loader=yaml.SafeLoader), {}) == nodes(expanded)
    assert _expanded_size(yaml.compose(BOMB, Loader=yaml.SafeLoader), {}) > 9 ** 9
