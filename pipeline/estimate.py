"""What a run will train and roughly how long it takes, known before any work (`metricpipe plan`, and
the first lines of `metricpipe run`).

Every fit of the train stage (:func:`metricpipe.stages.train.fits`: each config entry's candidates,
per repeat, and the refit of the chosen one) with the cost its learner states from the data's shape
(``Learner.fit_cost``, in multiply-adds of a float64 GEMM), and each other stage's work, which the
stage states the same way. :func:`gemm_rate` times a GEMM on one core of this machine, now, to turn
them into seconds; the run's workers take the fits ``slots`` at a time.
"""

import os
import time
from dataclasses import dataclass

import numpy as np

from metricpipe import stages
from metricpipe.config import RunConfig
from metricpipe.progress import human_seconds
from metricpipe.tasks import registry

# The GEMM timed (its side), for this long in CPU time: a core's speed, whatever else runs on it.
CALIBRATION_SIZE = 256
CALIBRATION_SECONDS = 0.3
# The stages whose work is estimated besides train, in run order.
STAGE_WORK = ("stage", "statistics", "neighbours", "encode", "evaluate")
# A rate timed is reused this long by the plans of one process (a run's tests start hundreds of runs).
RATE_REUSE_SECONDS = 300.0
# A fit under this many seconds is shown as such: below it, timing noise is larger than the fit.
SHORT = 0.1


def gemm_rate(seconds: float = CALIBRATION_SECONDS) -> float:
    """Multiply-adds per second of a float64 GEMM on one BLAS thread of this machine, in CPU time (the
    core's speed; :func:`machine_share` says how much of it a task gets now)."""
    from threadpoolctl import threadpool_limits  # deferred: only a plan times a GEMM

    a = np.random.default_rng(0).standard_normal((CALIBRATION_SIZE, CALIBRATION_SIZE))
    with threadpool_limits(1, user_api="blas"):
        a @ a  # (warm: the first call loads the kernels)
        n, t0 = 0, time.process_time()
        while time.process_time() - t0 < seconds:
            a @ a
            n += 1
        elapsed = time.process_time() - t0
    return n * CALIBRATION_SIZE**3 / elapsed


def machine_share() -> tuple[float, float, int]:
    """(the share of a core a task gets now, the load average, the cores): on a machine whose
    processes that want a core (the 1-minute load average) outnumber its cores, each gets cores /
    load of one. A timed GEMM alone cannot tell: a process that has just woken runs at once."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # (macOS, Windows)
        cores = os.cpu_count() or 1
    try:
        load = os.getloadavg()[0]
    except OSError:  # not on this platform: an idle machine
        load = 0.0
    return min(1.0, cores / max(load, 1e-9)), load, cores


_timed: list = []  # [(rate, when)] of this process's last timing


def machine_rate() -> float:
    """Multiply-adds per second a task gets on a core of this machine now: :func:`gemm_rate` (timed
    again after RATE_REUSE_SECONDS) times :func:`machine_share`."""
    now = time.monotonic()
    if not _timed or now - _timed[0][1] > RATE_REUSE_SECONDS:
        _timed[:] = [(gemm_rate(), now)]
    return _timed[0][0] * machine_share()[0]


@dataclass
class Estimate:
    """The fits (``stages.train.fits``'s), each stage's work (multiply-adds; None: not estimated), the
    machine's ``rate`` (multiply-adds per second per core) and the ``slots`` that run tasks at once."""

    cfg: RunConfig
    info: object
    rows: object
    fits: list
    work: dict
    rate: float
    slots: int
    measured: bool = True  # the rate was timed here (not given)

    def seconds(self, madds: float | None) -> float | None:
        return None if madds is None else madds / self.rate

    def fit_seconds(self, fit) -> float | None:
        return None if fit.cost is None else self.seconds(fit.cost.madds)

    def progress_estimates(self) -> dict:
        """{stage: (estimated seconds per task name, the names expected)} from which progress tells the
        time left: the train stage's fits (a refit is named after the candidate it refits, which is
        chosen later: each candidate's name has one, none expected)."""
        seconds, planned = {}, set()
        for f in self.fits:
            s = self.fit_seconds(f)
            if s is None or f.same_as_earlier:
                continue
            if f.role == "refit":
                for c in self._candidates(f):
                    seconds[f"train-{registry.model_name(c.spec)}-refit"] = s
            else:
                seconds[f"train-{registry.model_name(f.spec)}"] = s
                planned.add(f"train-{registry.model_name(f.spec)}")
        return {"train": (seconds, planned)}

    def _candidates(self, refit) -> list:
        return [f for f in self.fits if (f.n, f.repeat) == (refit.n, refit.repeat) and f.role == "candidate"]

    def train_wall(self) -> float | None:
        """Seconds of the train stage on ``slots``: the candidates and models, then the refits (each
        phase its work shared out, its longest fit at least)."""
        total = 0.0
        for refits in (False, True):
            times = [self.fit_seconds(f) for f in self.fits if (f.role == "refit") == refits and not f.same_as_earlier]
            known = [t for t in times if t is not None]
            total += max(max(known, default=0.0), sum(known) / self.slots)
        return total

    def stage_wall(self, stage: str) -> float | None:
        s = self.seconds(self.work.get(stage))
        return None if s is None else s / self.slots

    def run_wall(self) -> float:
        return sum(self.stage_wall(s) or 0.0 for s in STAGE_WORK) + (self.train_wall() or 0.0)


def estimate(cfg: RunConfig, info, rate: float | None = None, slots: int | None = None) -> Estimate:
    """The plan of a run of ``cfg`` on data ``info`` (:func:`metricpipe.stages.prepare_data`'s):
    ``rate`` multiply-adds per second per task, or timed now (:func:`machine_rate`); ``slots`` tasks
    at once (default: the config's workers and threads)."""
    rows, fits = stages.train.fits(info, cfg)
    specs = stages.train.final_specs(fits)
    names = set(stages.stage_names(cfg))
    modules = {
        "stage": stages.data,
        "statistics": stages.statistics,
        "neighbours": stages.neighbours,
        "encode": stages.encode,
        "evaluate": stages.evaluate,
    }
    work = {s: modules[s].work(info, cfg, specs) for s in STAGE_WORK if s in names}
    slots = max(1, slots or cfg.workers * cfg.threads_per_worker)
    return Estimate(cfg, info, rows, fits, work, rate or machine_rate(), slots, measured=rate is None)


# -- what a person reads ---------------------------------------------------------------------------------
def _time(seconds: float | None, at_most: bool = False) -> str:
    if seconds is None:
        return "unknown"
    text = f"<{SHORT:g} s" if seconds < SHORT else human_seconds(seconds)
    return f"at most {text}" if at_most else text


def _fit_time(est: Estimate, fit) -> str:
    return _time(est.fit_seconds(fit), fit.cost is not None and fit.cost.at_most)


def header(est: Estimate) -> list[str]:
    """The data, the rows the fits see and the machine's rate."""
    info, rows = est.info, est.rows
    C = len(info.classes or [])
    fold = (
        f"; candidates fit {rows.fit:,} rows and validate on {rows.val:,}"
        + (" borrowed from train" if rows.borrowed else "")
        if rows.val
        else ""
    )
    if est.measured:
        share, load, cores = machine_share()
        busy = f", {share:.0%} of a core free: load {load:.1f} on {cores} cores" if share < 1 else ""
        how = f"a GEMM timed now{busy}"
    else:
        how = "given"
    return [
        f"Plan: {info.n_samples:,} x {info.n_features:,} rows, {C} classes, {rows.train:,} train rows{fold}",
        f"  machine: {est.rate / 1e9:.1f} G multiply-adds/s per task ({how}); {est.slots} task(s) at once",
    ]


def _searched(spec: dict) -> dict:
    return (spec.get("select") or {}).get("grid") or {}


def _grid(spec: dict) -> str:
    """'lr 30, 3, 10 x margin 0.1, 1': the values a selection tries."""
    text = {k: ", ".join(f"{v:g}" if isinstance(v, float) else str(v) for v in vs) for k, vs in _searched(spec).items()}
    return " x ".join(f"{k} {v}" for k, v in text.items())


def entry_lines(est: Estimate) -> list[str]:
    """One line per config entry and repeat: its candidates (their parameters), its refit, their time."""
    out, cfg = [], est.cfg
    groups = {}
    for f in est.fits:
        groups.setdefault((f.repeat, f.n), []).append(f)
    for (r, n), fits in groups.items():
        entry = cfg.methods[n]
        again = f" (repeat {r})" if cfg.repeats > 1 else ""
        label = f"  {cfg.entry(n)} {registry.model_name(entry)}{again}"
        cands = [f for f in fits if f.role == "candidate"]
        refit = any(f.role == "refit" for f in fits)
        if all(f.same_as_earlier for f in fits):
            out.append(f"{label}: the model an earlier line trains (trained once)")
            continue
        times = [est.fit_seconds(f) for f in fits if not f.same_as_earlier]
        total = None if any(t is None for t in times) else sum(times)
        at_most = any(f.cost is not None and f.cost.at_most for f in fits)
        if len(cands) > 1:
            what = f"{len(cands)} candidates ({_grid(entry)})" + (", then the chosen one refitted" if refit else "")
        elif cands:
            what = "1 fit stopped early on validation rows" + (", then refitted" if refit else "")
        else:
            what = "1 model"
        out.append(f"{label}: {what}: {_time(total, at_most)}")
    return out


def fit_lines(est: Estimate) -> list[str]:
    """One line per fit: entry, repeat, model, role, rows and estimated time (the plan command's table)."""
    cfg = est.cfg
    rows = [("entry", *(("repeat",) if cfg.repeats > 1 else ()), "model", "fit", "rows", "estimate")]
    for f in est.fits:
        name = registry.model_name(f.spec) + (" (as above)" if f.same_as_earlier else "")
        rows.append(
            (
                cfg.entry(f.n),
                *((str(f.repeat),) if cfg.repeats > 1 else ()),
                name,
                f.role,
                f"{f.rows:,}",
                "trained once" if f.same_as_earlier else _fit_time(est, f),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]


def footer(est: Estimate) -> list[str]:
    """The stages' times and the totals."""
    parts = []
    for s in STAGE_WORK:
        if s in est.work:
            wall = est.stage_wall(s)
            parts.append(f"{s} {'not estimated' if wall is None else human_seconds(wall)}")
    fits = [f for f in est.fits if not f.same_as_earlier]
    known = [est.fit_seconds(f) for f in fits if f.cost is not None]
    unknown = len(fits) - len(known)
    at_most = any(f.cost.at_most for f in fits if f.cost is not None)
    bound = "at most " if at_most else ""
    work = f"{bound}{human_seconds(sum(known))} of work" + (f" and {unknown} fit(s) of unknown cost" if unknown else "")
    return [
        f"  train stage: {len(fits)} fit(s), {work}; {bound}{human_seconds(est.train_wall())} on {est.slots} at once",
        f"  other stages: {', '.join(parts)} (on {est.slots} at once)",
        f"  the run: {bound}about {human_seconds(est.run_wall())}"
        + (" (more if a selection searches past the edge of its grid)" if _floats_searched(fits) else ""),
    ]


def _floats_searched(fits: list) -> bool:
    return any(all(isinstance(v, float) for v in vs) for f in fits for vs in _searched(f.spec).values())


def run_lines(est: Estimate) -> list[str]:
    """What a run prints before any work: the data and rate, each config entry's fits and time, the totals."""
    return [
        *header(est),
        *entry_lines(est),
        *footer(est),
        "  (metricpipe plan CONFIG lists every fit with its estimate)",
    ]
