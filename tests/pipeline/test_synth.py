"""metricpipe synth writes the generator's rows blockwise; a run reads the store back by data.path and
can evaluate retrieval on a seeded sample of queries."""

import json
import os

import numpy as np
import pytest
import yaml
from click.testing import CliRunner

from metricpipe.cli import main
from metricpipe.store import open_array
from metricpipe.tasks.synthetic import GENERATION, SyntheticSpec


def _synth(path, chunk_mb, cluster, *extra):
    """``metricpipe synth`` on the session's cluster (``cluster``: its scheduler's address)."""
    return CliRunner().invoke(
        main,
        [
            "synth",
            "--samples",
            "3000",
            "--dim",
            "16",
            "--classes",
            "5",
            "--seed",
            "4",
            "--store",
            str(path),
            "--chunk-mb",
            str(chunk_mb),
            "--cluster",
            cluster,
            *extra,
        ],
    )


@pytest.fixture
def address(client):
    return client.scheduler.address


@pytest.mark.integration
def test_synth_store_holds_the_generators_rows_whatever_the_chunking(tmp_path, address):
    res = _synth(tmp_path / "a.zarr", 0.01, address)
    assert res.exit_code == 0, res.output
    spec = SyntheticSpec(3000, 16, 5, seed=4)
    X = open_array(str(tmp_path / "a.zarr/X"))
    assert X.chunks[0] < 3000  # written in several blocks
    assert X.compressors == ()  # dense floats: stored bare (row_codecs)
    np.testing.assert_array_equal(X[:], spec.rows(0, 3000))
    np.testing.assert_array_equal(open_array(str(tmp_path / "a.zarr/y"))[:], spec.labels())
    assert _synth(tmp_path / "b.zarr", 0.05, address).exit_code == 0
    np.testing.assert_array_equal(open_array(str(tmp_path / "b.zarr/X"))[:], X[:])
    again = _synth(tmp_path / "a.zarr", 0.01, address)
    assert again.exit_code == 2 and "already exists" in again.output
    assert not (tmp_path / "a.zarr.partial").exists()
    # a Zarr folder named like a file of another format: refused by synth, read as Zarr by the stage
    # (a new-user trial: synth wrote x.npz/, which staging then opened as an npz file, IsADirectoryError)
    named = _synth(tmp_path / "x.npz", 0.01, address)
    assert named.exit_code == 2 and "synth writes a Zarr folder" in named.output and not (tmp_path / "x.npz").exists()
    os.rename(tmp_path / "b.zarr", tmp_path / "b.npz")
    from metricpipe.config import parse_config
    from metricpipe.sources import open_source

    src = open_source(parse_config({"data": {"path": str(tmp_path / "b.npz")}}).data)
    np.testing.assert_array_equal(src.reader.read(0, 3000), X[:])


@pytest.mark.integration
def test_synth_knobs_reach_the_generator_and_the_store_attributes(tmp_path, address):
    import zarr

    res = _synth(tmp_path / "k.zarr", 0.05, address, "--separation", "2.0", "--nuisance", "0")
    assert res.exit_code == 0, res.output
    spec = SyntheticSpec(3000, 16, 5, seed=4, separation=2.0, nuisance=0.0)
    np.testing.assert_array_equal(open_array(str(tmp_path / "k.zarr/X"))[:], spec.rows(0, 3000))
    assert not np.array_equal(spec.rows(0, 3000), SyntheticSpec(3000, 16, 5, seed=4, separation=2.0).rows(0, 3000))
    attrs = zarr.open_group(store=str(tmp_path / "k.zarr"), mode="r").attrs["synthetic"]
    assert attrs["separation"] == 2.0 and attrs["nuisance"] == 0.0


@pytest.mark.integration
def test_synth_overlap_reaches_the_generator_and_the_store_attributes(tmp_path, address):
    import zarr

    res = _synth(tmp_path / "o.zarr", 0.05, address, "--overlap", "0.5")
    assert res.exit_code == 0, res.output
    spec = SyntheticSpec(3000, 16, 5, seed=4, overlap=0.5)
    np.testing.assert_array_equal(open_array(str(tmp_path / "o.zarr/X"))[:], spec.rows(0, 3000))
    assert not np.array_equal(spec.rows(0, 3000), SyntheticSpec(3000, 16, 5, seed=4).rows(0, 3000))
    attrs = zarr.open_group(store=str(tmp_path / "o.zarr"), mode="r").attrs["synthetic"]
    assert attrs["overlap"] == 0.5 and attrs["generation"] == GENERATION


def test_config_synthetic_overlap_is_read_checked_and_keys_the_staged_data():
    from metricpipe.config import ConfigError, parse_config
    from metricpipe.sources import open_source

    def source(**synthetic):
        return open_source(parse_config({"data": {"source": "synthetic", "synthetic": synthetic}}).data)

    inside, default = source(overlap=1.0, samples=100, dim=16), source(samples=100, dim=16)
    assert inside.reader.spec.overlap == 1.0 and default.reader.spec.overlap == 0.0
    # rows made by another generation of the generator are another data unit, never reused
    assert default.fingerprint["generation"] == GENERATION and inside.fingerprint != default.fingerprint
    with pytest.raises(ConfigError, match=r"data.synthetic.overlap: must be <= 1.0, got 1.5"):
        parse_config({"data": {"source": "synthetic", "synthetic": {"overlap": 1.5}}})


def test_config_synthetic_nuisance_is_read_and_checked():
    from metricpipe.config import ConfigError, parse_config

    cfg = parse_config({"data": {"source": "synthetic", "synthetic": {"nuisance": 0}}})
    assert cfg.data.synthetic.nuisance == 0.0 and cfg.data.synthetic.separation == 1.0
    with pytest.raises(ConfigError, match="data.synthetic.nuisance: must be >= 0.0"):
        parse_config({"data": {"source": "synthetic", "synthetic": {"nuisance": -1.0}}})


@pytest.mark.integration
def test_run_on_a_synth_store_with_sampled_queries_matches_numpy(tmp_path, address):
    from sklearn.metrics import average_precision_score

    assert _synth(tmp_path / "s.zarr", 0.02, address).exit_code == 0
    cfg = {
        "store": str(tmp_path / "store"),
        "cluster": address,
        "seed": 7,
        "data": {"path": str(tmp_path / "s.zarr"), "split": {"test": 0.2, "seed": 0}, "chunk_mb": 0.05},
        "methods": [{"method": "identity"}],
        "evaluate": {"retrieval": {"k": [10], "queries": 40}, "classification": {"classifiers": []}},
    }
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    res = CliRunner().invoke(main, ["run", str(tmp_path / "c.yaml")])
    assert res.exit_code == 0, res.output
    store = tmp_path / "store"
    data = json.loads((store / "runs/latest.json").read_text())["units"]["data"]
    split = open_array(str(store / data / "split"))[:]
    label = open_array(str(store / data / "label"))[:]
    assert open_array(str(store / data / "features")).compressors == ()  # staged bare too
    X = open_array(str(store / data / "features"))[:].astype(np.float64)
    test = np.flatnonzero(split == 1)
    queries = np.sort(np.random.default_rng([7, 31]).choice(test, 40, replace=False))
    aps = []
    for q in queries:
        db = test[test != q]
        d = ((X[db] - X[q]) ** 2).sum(1)
        aps.append(average_precision_score(label[db] == label[q], -d))
    records = json.loads((store / "report/metrics.json").read_text())["records"]
    got = next(r["value"] for r in records if r["metric"] == "map")
    assert abs(got - np.mean(aps)) < 1e-6
