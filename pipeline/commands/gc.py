"""``metricpipe gc``: find (and remove) the units of a store that its last run did not use.

Every parameter, seed or input change makes new units under new keys and leaves the old ones, so a
store that is iterated on grows with every run. The last finished run's manifest
(``runs/latest.json``) names every unit it used; gc keeps those, the selection candidates of its
kept selections (so a rerun of the same config reuses them), the models ``add-classes`` made from
its models, the shuffled copies of its staged data, and every unit committed after it started (by a
run that did not finish, whose ``--resume`` reuses them, or by ``add-classes`` / ``stage``). It
lists (or removes) the rest: units of earlier configs, and what killed runs left unfinished.
"""

from metricpipe.report import extended_models, run_models
from metricpipe.store import KINDS, MARKER_SUFFIX, Store, Unit, is_key, read_attrs


def kept_units(store: Store, manifest: dict) -> set[str]:
    """Store paths (``KIND/KEY``) of the units the last run used or depends on."""
    units = manifest.get("units") or {}
    keep = set(manifest.get("evaluation_units") or [])
    for rel in units.values():
        if isinstance(rel, str):
            keep.add(rel)
        elif rel:
            keep.update(rel)
    candidates = []
    for rel in units.get("selection") or []:
        unit = store.unit(*rel.split("/"))
        if unit.done():
            candidates += [c["model"] for c in unit.meta().get("candidates", []) if c.get("model")]
    keep.update(f"models/{key}" for key in candidates)
    # models add-classes made from the run's models, or from a candidate (kept above)
    cand_models = [
        {"key": key, "spec": store.unit("models", key).meta().get("spec"), "dim": None}
        for key in candidates
        if store.unit("models", key).done()
    ]
    keep.update(f"models/{m['key']}" for m in extended_models(store, run_models(store, manifest) + cand_models))
    # the copies of its data (a run that reused every model read none, and a later one may need them)
    data = (units.get("data") or "").split("/")[-1]
    for unit in store.units("shuffled"):
        if unit.done() and _data_of(unit) in (data, None):  # unreadable: kept, gc decides nothing on it
            keep.add(unit.rel)
    return keep


def _data_of(unit: Unit) -> str | None:
    if unit.tree()[1]:  # a link or a FIFO in it: not read (kept, as unreadable)
        return None
    try:
        return read_attrs(unit.url).get("data")
    except Exception:  # a damaged copy (its zarr.json gone): `inspect --verify` names it, a run repairs it
        return None


def unused_units(store: Store) -> tuple[dict, list[tuple[Unit, str, int]], int]:
    """(the last run's manifest, [(unit, why, bytes)] of every unit it neither used nor depends on,
    the number of units kept because they were committed after it started)."""
    store.check_is_store()
    manifest = store.last_run(": gc keeps what the last run used, so it has nothing to go by")
    keep = kept_units(store, manifest)
    started = float(manifest.get("started") or 0)
    out, later = [], 0
    for kind in KINDS:
        for unit in store.units(kind):
            if unit.rel in keep:
                continue
            if unit.done():
                if float(unit.meta().get("committed") or 0) > started:
                    later += 1
                    continue
                why = "not used by the last run"
            else:
                why = "unfinished (left by a killed run; a rerun recomputes it)"
            out.append((unit, why, unit.nbytes()))
    # markers whose unit directory is gone (a gc killed between its two deletions) are leftovers too
    for kind in KINDS:
        base = f"{store.root}/{kind}"
        if not store.fs.isdir(base):
            continue
        dirs = {u.key for u in store.units(kind)}
        for path in store.fs.ls(base, detail=False):
            name = path.rstrip("/").split("/")[-1]
            key = name[: -len(MARKER_SUFFIX)]
            if name.endswith(MARKER_SUFFIX) and is_key(key) and key not in dirs and f"{kind}/{key}" not in keep:
                out.append((store.unit(kind, key), "commit marker without its unit", 0))
    return manifest, out, later
