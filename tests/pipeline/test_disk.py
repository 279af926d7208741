"""The disk rule: what a run writes to its store, checked against the store's free space before
staging (less what the store's committed units already hold) and, exactly, before each stage writes."""

import json
import shutil

import pytest
import yaml
from click.testing import CliRunner

from metricpipe import budget
from metricpipe.cli import main
from metricpipe.store import Store

ROWS, D = 1797, 64  # digits
EVAL = {"retrieval": {"k": [5]}, "classification": {"classifiers": ["knn1"]}}


def _run(client, tmp, methods, **extra):
    cfg = {
        "store": str(tmp / "store"),
        "cluster": client.scheduler.address,
        "data": {"source": "digits"},
        "methods": methods,
        "evaluate": EVAL,
        **extra,
    }
    (tmp / "cfg.yaml").write_text(yaml.safe_dump(cfg))
    return CliRunner().invoke(main, ["run", str(tmp / "cfg.yaml")])


def _free(monkeypatch, spare: float) -> None:
    """The store's file system has ``spare`` bytes free beyond the rule's fixed margin."""
    monkeypatch.setattr(budget, "disk_free", lambda store: budget.DISK_MARGIN + spare)


def _committed(tmp, kind: str) -> list:
    return [u for u in Store(str(tmp / "store")).units(kind) if u.done()]


@pytest.mark.integration
def test_a_run_that_would_fill_the_disk_is_refused_before_staging(client, tmp_path, monkeypatch):
    _free(monkeypatch, 1e6)  # 1 MB: the staged features (0.46 MB) fit, with two 64-d codes they do not
    res = _run(client, tmp_path, [{"method": "identity"}, {"method": "pca", "dim": 64, "select": False}])
    assert res.exit_code == 2, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), res.output
    need = 3 * 4.0 * ROWS * D + 8.0 * D * (4 * D + 10)  # the features and two codes of 64 floats a row; statistics
    assert (
        f"cfg.yaml: the run writes ~{need / 1e6:.1f} MB to the store {tmp_path / 'store'} (and keeps "
        f"{budget.disk_margin(need) / 1e6:.1f} MB for models, logs and the report), but its file system has "
        f"{budget.disk_margin(need) / 1e6 + 1:.1f} MB free; the most is the staged features (1,797 x 64 float32) "
        f"(~0.5 MB): free space there or use a store on a larger disk"
    ) in lines[0]
    assert not _committed(tmp_path, "data")  # nothing staged


@pytest.mark.integration
def test_a_resume_is_credited_what_it_reuses_and_encode_checks_exactly(client, tmp_path, monkeypatch):
    # a first run on a roomy disk: features, and the codes of identity, LDA (9-d) and PCA-16
    first = [{"method": "identity"}, {"method": "lda"}, {"method": "pca", "dim": 16, "select": False}]
    assert _run(client, tmp_path, first).exit_code == 0
    wide = {"method": "pca", "dim": 48, "select": False}
    codes = 4.0 * ROWS * 48
    # a second run drops identity and LDA and adds PCA-48: before staging it needs the features, PCA-16
    # and PCA-48 less what the store holds (at least identity's, LDA's and PCA-16's codes), under 48
    # floats a row; the encode stage then needs PCA-48's codes whole, more than is free
    _free(monkeypatch, codes - 1)
    res = _run(client, tmp_path, [first[2], wide])
    assert res.exit_code == 2, res.output
    last = res.output.strip().splitlines()[-1]
    assert last.startswith("error: ") and "cfg.yaml: the encode stage writes ~0.3 MB" in last, res.output
    assert "the most is the codes of pca-48 (1,797 x 48 float32) (~0.3 MB): lower its dim, or leave it out" in last
    runs = json.loads((tmp_path / "store/runs/latest.json").read_text())
    assert runs  # (the first run's)
    # the train stage's PCA-48 is kept; no codes of it were begun
    assert any(u.meta().get("spec", {}).get("dim") == 48 for u in _committed(tmp_path, "models"))
    assert len(_committed(tmp_path, "codes")) == 3
    assert len(Store(str(tmp_path / "store")).units("codes")) == 3  # no half-written unit either
    # with the bytes it lacked, the same command resumes and encodes it
    _free(monkeypatch, codes * (1 + budget.DISK_SHARE) + 1)
    res = _run(client, tmp_path, [first[2], wide])
    assert res.exit_code == 0, res.output
    assert len(_committed(tmp_path, "codes")) == 4


def test_the_rule_says_nothing_for_object_storage_and_measures_a_store_not_made_yet(tmp_path):
    class Remote:
        local = False

    assert budget.disk_free(Remote()) is None
    budget.check_disk(Remote(), None, [("everything", 1e18, "")])  # object storage: not checked

    class Local:
        local = True
        root = str(tmp_path / "not" / "made" / "yet")

    free = budget.disk_free(Local())  # the file system of the nearest folder that exists
    assert free is not None and free == pytest.approx(shutil.disk_usage(tmp_path).free, rel=0.01)
