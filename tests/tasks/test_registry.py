import pytest

from metricpipe.tasks import registry
from metricpipe.tasks.errors import InputError
from metricpipe.tasks.registry import expand_method


def test_registry_expands_sweeps_and_rejects_unknown_parameters():
    assert [m["dim"] for m in expand_method({"method": "pca", "dim": [8, 16]})] == [8, 16]
    with pytest.raises(InputError, match="unknown parameter 'dimm' for method pca; did you mean 'dim'"):
        expand_method({"method": "pca", "dimm": 8})
    with pytest.raises(InputError, match="did you mean 'pca'"):
        expand_method({"method": "pcca"})
    with pytest.raises(InputError, match=r"The 'dim' parameter of PCA must be an int in the range \[1, inf\) or None"):
        expand_method({"method": "pca", "dim": 0})


def test_a_list_parameter_is_one_value_not_a_sweep():
    [spec] = expand_method({"method": "ncmml", "classes": [0, 2, 3]})
    assert spec["classes"] == [0, 2, 3]


def test_config_names_are_the_python_names():
    with pytest.raises(InputError, match="'lam' .Python reserves the word lambda"):
        expand_method({"method": "slem", "lambda": 0.1})
    with pytest.raises(InputError, match="called 'random_state'"):
        expand_method({"method": "ncmml", "seed": 1})
    for name, cls in registry.methods().items():
        spec = expand_method({"method": name})[0]
        est = registry.make(spec)
        assert isinstance(est, cls)
        assert est.get_params() == registry.params_of(spec)
        assert est.method == name


def test_kernel_slem_entries_build_kernel_slem():
    specs = expand_method({"method": "slem", "kernel": ["linear", "gaussian"]})
    assert [type(registry.make(s)).__name__ for s in specs] == ["SLEM", "KernelSLEM"]


def test_fit_refuses_a_boolean_for_a_number_but_takes_one_for_a_boolean():
    from sklearn.datasets import load_digits
    from sklearn.utils._param_validation import InvalidParameterError

    from metricpipe import PCA, LinearML

    X, y = load_digits(return_X_y=True)
    with pytest.raises(InvalidParameterError, match="'dim' parameter of PCA must be a number, not a boolean"):
        PCA(dim=True).fit(X, y)
    assert PCA(dim=1).fit(X, y).transform(X).shape == (len(X), 1)
    assert LinearML(dim=4, learn_bias=True, iters=5, random_state=0).fit(X[:300], y[:300]).transform(X).shape[1] == 4


def test_a_model_s_spec_does_not_depend_on_how_a_value_is_spelled():
    """lr: 30 and lr: 30.0, random_state: 0 and the default None (seed 0) are one model: one key, trained
    once, one row of the report."""
    one = expand_method({"method": "ncmml", "dim": 8, "lr": 30})
    assert (
        one
        == expand_method({"method": "ncmml", "dim": 8, "lr": 30.0})
        == expand_method({"method": "ncmml", "dim": 8, "lr": 30, "random_state": 0})
    )
    assert type(one[0]["lr"]) is float and one[0]["random_state"] is None
    assert expand_method({"method": "random", "dim": 8, "random_state": 3})[0]["random_state"] == 3
    [grid] = expand_method({"method": "ncmml", "dim": 8, "select": {"lr": [30, 3]}})
    assert grid["select"]["grid"] == {"lr": [30.0, 3.0]} and grid["lr"] == 30.0
    assert expand_method({"method": "nml", "iters": 1e4})[0]["iters"] == 10000  # a count stays an int


def test_an_unset_lr_stays_unset_unless_the_selection_searches_it():
    """The config filled an unset lr (NCMML, NML, linear ML, k-NN ML) with its grid's first value, so
    select: false trained at a fixed rate and never backed off as the same learner does in memory:
    k-NN ML at 0.1 diverged on 4,096-d rows and stopped the run. Unset, it stays None (the learner
    starts at that value and backs off); a selection's candidates try their stated rates."""
    for entry in (
        {"method": "ncmml"},
        {"method": "ncmml", "objective": "dot"},
        {"method": "nml", "optimizer": "sgd"},
        {"method": "linear-ml", "optimizer": "adam"},
        {"method": "knnml"},
    ):
        [plain] = expand_method({**entry, "select": False})
        [chosen] = expand_method(entry)
        assert plain["lr"] is None and registry.candidates(plain) == [plain], entry
        first = registry.candidates(chosen)[0]
        assert first["lr"] == registry.make(plain)._searched("lr"), entry  # the rate None starts at
        assert registry.model_name(plain) == registry.model_name(first), entry  # named alike: the same start
    [partial] = expand_method({"method": "knnml", "select": {"margin": [0.1, 1.0]}})  # lr not searched
    assert all(c["lr"] is None for c in registry.candidates(partial))


def test_dict_parameters_read_as_key_value_pairs_in_names_and_labels():
    """SLEM's negatives showed as a Python repr in model names, logs and the report's legends
    ("slem-negatives{'split': 'train', 'count': 2000}")."""
    from metricpipe.stages.train import model_id

    assert registry.param_text({"split": "train", "count": 2000}) == "(count=2000,split=train)"
    # in key order: a name from a config and one from a stored record (JSON, keys sorted) agree
    assert registry.param_text({"count": 2000, "split": "train"}) == registry.param_text(
        {"split": "train", "count": 2000}
    )
    assert registry.param_text(0.5) == "0.5" and registry.param_text([1, 2]) == "[1, 2]"
    name = model_id({"method": "slem", "lam": 1.0, "negatives": {"split": "train", "count": 2000}})
    assert name == "slem-lam1.0-negatives(count=2000,split=train)", name
    # the kernel picks the class: kernel SLEM is named so even with KernelSLEM's own default kernel
    assert model_id({"method": "slem", "kernel": "gaussian"}) == "slem-kernelgaussian" != model_id({"method": "slem"})


def test_a_swept_parameter_that_changes_the_grid_gives_each_model_its_own_selection():
    """The selection was worked out once per entry, with the swept list in place of each value: a
    sweep of objective [euclidean, dot] searched the dot form over the Euclidean lr grid (30 to 300,
    where it diverges), optimizer [adam, sgd] NML's SGD over Adam's rates, and the dense member of
    sparsity [0.0, 0.99] searched an anneal it does not have (4 identical models; a new-user trial)."""

    def grids(entry):
        return {
            next(v for k, v in s.items() if k in entry and isinstance(entry[k], list)): (s.get("select") or {}).get(
                "grid"
            )
            for s in expand_method(entry)
        }

    assert grids({"method": "ncmml", "objective": ["euclidean", "dot"]}) == {
        "euclidean": {"lr": [30.0, 3.0, 10.0, 100.0, 300.0]},
        "dot": {"lr": [1.0, 0.3, 3.0, 10.0, 0.1]},
    }
    assert grids({"method": "nml", "optimizer": ["adam", "sgd"]}) == {
        "adam": {"lr": [0.001, 0.0001, 0.01]},
        "sgd": {"lr": [10.0, 1.0, 100.0, 1000.0]},
    }
    assert grids({"method": "sparse", "dim": 16, "sparsity": [0.0, 0.99]}) == {
        0.0: None,
        0.99: {"anneal": [0.5, 0.25, 0.9, 0.0]},
    }
    # and each is the grid the entry without a sweep gets
    for entry in ({"method": "ncmml", "objective": "dot"}, {"method": "nml", "optimizer": "sgd"}):
        [one] = expand_method(entry)
        assert (
            one["select"]["grid"]
            == grids({**entry, **{k: [v] for k, v in entry.items() if k != "method"}})[
                next(v for k, v in entry.items() if k != "method")
            ]
        )


def test_the_default_methods_are_valid_entries():
    """A config without methods: trains these (the config reads them from here, not a literal of its own)."""
    assert [s["method"] for e in registry.DEFAULT_METHODS for s in expand_method(dict(e))] == [
        e["method"] for e in registry.DEFAULT_METHODS
    ]
    assert all(registry.BUILTIN[e["method"]] in registry.ESTIMATORS for e in registry.DEFAULT_METHODS)


@pytest.mark.parametrize(
    "name, ok",
    [
        ("knn1", True),
        ("knn10", True),
        ("softvote3", True),
        ("ncm", True),
        ("ncmc", True),
        ("knn0", False),
        ("knn", False),
        ("softvote", False),
        ("svm", False),
        ("knn-1", False),
        (3, False),
        (None, False),
    ],
)
def test_classifier_names(name, ok):
    from metricpipe.tasks.evaluation import is_classifier

    assert is_classifier(name) is ok
