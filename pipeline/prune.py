"""``metricpipe gc``: find (and remove) the units of a store that its last run did not use.

Every parameter, seed or input change makes new units under new keys and leaves the old ones, so a
store that is iterated on grows with every run. The last run's manifest (``runs/latest.json``)
names every unit it used; gc keeps those, the selection candidates of its kept selections (so a
rerun of the same config reuses them), the models ``add-classes`` made from its models, and the
shuffled copies it read, and lists (or removes) the rest: units of earlier configs, and what killed
runs left without a commit marker.
"""
from metricpipe.inspect import KINDS
from metricpipe.storage import MARKER_SUFFIX, Store, Unit


def kept_units(store: Store, manifest: dict) -> set[str]:
    """Store paths (``KIND/KEY``) of the units the last run used or depends on."""
    from metricpipe.report import extended_models, run_models
    keep = set(manifest.get("evaluation_units") or [])
    for rel in (manifest.get("units") or {}).values():
        if isinstance(rel, str):
            keep.add(rel)
        elif rel:
            keep.update(rel)
    for rel in (manifest.get("units") or {}).get("selection") or []:
        unit = store.unit(*rel.split("/"))
        if unit.done():
            keep.update(f"models/{c['model']}" for c in unit.meta().get("candidates", []) if c.get("model"))
    keep.update(f"models/{m['key']}" for m in extended_models(store, run_models(store, manifest)))
    if "shuffled" not in (manifest.get("units") or {}):   # a manifest written before 0.3.6 names none: keep all
        keep.update(u.rel for u in store.units("shuffled"))
    return keep


def unused_units(store: Store) -> tuple[dict, list[tuple[Unit, str, int]]]:
    """(the last run's manifest, [(unit, why, bytes)] of every unit it neither used nor depends on)."""
    store.check_is_store()
    manifest = store.last_run(": gc keeps what the last run used, so it has nothing to go by")
    keep = kept_units(store, manifest)
    out = []
    for kind in KINDS:
        for unit in store.units(kind):
            if unit.rel in keep:
                continue
            why = "not used by the last run" if unit.done() else "unfinished (left by a killed run)"
            out.append((unit, why, unit_bytes(unit)))
    # markers whose unit directory is gone (a gc killed between its two deletions) are leftovers too
    for kind in KINDS:
        base = f"{store.root}/{kind}"
        if not store.fs.isdir(base):
            continue
        dirs = {u.key for u in store.units(kind)}
        for path in store.fs.ls(base, detail=False):
            name = path.rstrip("/").split("/")[-1]
            if name.endswith(MARKER_SUFFIX) and name[:-len(MARKER_SUFFIX)] not in dirs \
                    and f"{kind}/{name[:-len(MARKER_SUFFIX)]}" not in keep:
                out.append((store.unit(kind, name[:-len(MARKER_SUFFIX)]), "commit marker without its unit", 0))
    return manifest, out


def unit_bytes(unit: Unit) -> int:
    fs = unit.store.fs
    root = f"{unit.store.root}/{unit.rel}"
    total = sum(int(i["size"]) for i in fs.find(root, detail=True).values()) if fs.exists(root) else 0
    marker = root + MARKER_SUFFIX
    return total + (int(fs.info(marker)["size"]) if fs.exists(marker) else 0)


def remove(unit: Unit) -> None:
    """Remove one unit: its commit marker first, so that a gc killed midway leaves an unfinished unit
    (which the next run or gc wipes), never a committed one with files missing."""
    fs = unit.store.fs
    root = f"{unit.store.root}/{unit.rel}"
    unit.store.check_held(f"removing {unit.rel}")
    if fs.exists(root + MARKER_SUFFIX):
        fs.rm(root + MARKER_SUFFIX)
    if fs.exists(root):
        fs.rm(root, recursive=True)
