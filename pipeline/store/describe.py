"""``metricpipe inspect``: a plain-text description of a store."""

from metricpipe.store import KINDS, Store
from metricpipe.tasks.errors import InputError


def describe(url: str) -> str:
    store = Store(url)
    store.check_is_store()
    lines = [f"store {store.url}"]
    if not store.fs.exists(store.inside("runs/latest.json")):
        lines.append("last run: none finished")
    else:
        try:
            latest = store.last_run()
            lines.append(
                f"last run: {latest['dataset'].get('source')}, {len(latest['evaluation_units'])} models "
                f"evaluated, {latest['seconds']:.1f} s"
            )
        except (InputError, KeyError):  # truncated or hand-edited: the units are still listed
            lines.append("last run: runs/latest.json is corrupt (rerun the config to rewrite it)")
    for kind in KINDS:
        units = store.units(kind)
        if not units:
            continue
        lines.append(f"{kind}/")
        for u in units:
            odd = u.tree()[1] if u.done() else {}  # a link or a FIFO in it: not read (it could hang or leave the store)
            state = (
                "done"
                if u.done()
                else "INCOMPLETE (commit marker damaged; recomputed by a run that needs it)"
                if u.marker_damaged()
                else "INCOMPLETE (no commit marker; ignored and rewritten on the next run)"
            )
            if odd:
                name, what = next(iter(odd.items()))
                state = f"DAMAGED ({u.rel}/{name}: {what}; `metricpipe inspect --verify` lists every problem)"
            meta = u.meta() if u.done() else {}
            facts = ", ".join(
                f"{k}={v}"
                for k, v in meta.items()
                if k not in ("key", "kind", "committed", "spec") and not isinstance(v, (dict, list))
            )
            spec = meta.get("spec")
            lines.append(f"  {u.key}  {state}" + (f"  {spec}" if spec else "") + (f"  [{facts}]" if facts else ""))
            if u.done() and not odd:
                lines += [f"    {a}" for a in _arrays(u.url)]
    return "\n".join(lines)


def verify_store(url: str) -> tuple[int, list[str]]:
    """(committed units checked, problems): every file each marker lists, present and unchanged."""
    store = Store(url)
    store.check_is_store()
    checked, problems = 0, []
    for kind in KINDS:
        for u in store.units(kind):
            if u.done():
                checked += 1
                problems += u.verify()
            elif u.marker_damaged():
                checked += 1
                problems.append(
                    f"{u.rel}.committed.json: commit marker damaged (truncated, edited or not this unit's "
                    f"record); the unit counts as unfinished: a run that needs it recomputes it, and "
                    f"run --repair recomputes every damaged selection candidate too"
                )
    if store.fs.exists(store.inside("runs/latest.json")):  # gc and report read it
        try:
            store.last_run()
        except InputError as e:
            problems.append(str(e).removeprefix(f"{store.url}: "))
    return checked, problems


def _arrays(url: str) -> list[str]:
    import zarr

    try:
        g = zarr.open_group(store=url, mode="r")
    except Exception:  # a unit without arrays (evaluation) is fine
        return []
    return [f"{name}: {a.dtype} {a.shape} chunks {a.chunks}" for name, a in sorted(g.arrays())]
