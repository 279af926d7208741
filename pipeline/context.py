"""What every stage receives: the client, the store, the config, and helpers to submit and gather
tasks with progress and errors that name the stage and the block."""

import asyncio
import contextlib
import functools
import os
import signal
import time
import uuid
from dataclasses import dataclass, field
from typing import Callable

from distributed import Client, as_completed

from metricpipe.config import RunConfig
from metricpipe.errors import STAGES, StageError, check_terminated
from metricpipe.progress import StageProgress
from metricpipe.store import Store, size_crcs
from metricpipe.tasks.errors import InputError

# Tasks are pure and seeded, so a retry after a lost worker gives the identical result. A task whose
# worker dies is rescheduled by Dask up to distributed.scheduler.allowed-failures times (cluster/local.py
# sets it to ALLOWED_FAILURES), then fails with KilledWorker, which gather() reports with the stage
# and block; RETRIES covers exceptions raised inside a task (e.g. a flaky filesystem read).
RETRIES = 2
# Fault injection for the reliability tests: METRICPIPE_FAILPOINT="TASKNAME-PREFIX:FLAGFILE" makes the
# first task whose name starts with the prefix SIGKILL its own worker process (once: the flag file
# records that it happened; FLAGFILE "always" kills it on every attempt).
FAILPOINT = "METRICPIPE_FAILPOINT"
# Bytes of files per checksum task (files under 1/16 of this are summed on the client).
CHECKSUM_TASK_BYTES = 128 << 20


@dataclass
class StageContext:
    client: Client
    store: Store
    config: RunConfig
    resume: bool = True
    log: Callable[[str], None] = print
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    tasks: int = 0  # tasks submitted so far (the runner reports them per stage)
    force: str | None = None  # recompute this stage and every stage after it
    repair: bool = False  # recompute committed units whose files fail verification
    # runs of the same --force that stopped before finishing: the units they committed are already
    # recomputed, so a --force run that continues theirs reuses them (runner.forcing)
    forced_by: tuple = ()
    returning_errors: bool = False  # submit(): an InputError is the task's result, not its failure
    selections: list = field(default_factory=list)  # the train stage's selection units (store paths)
    validated: list = field(default_factory=list)  # models fitted on borrowed rows before their refit (paths)
    terminal: bool = False  # progress as one updating line per stage (stderr is a terminal)
    progress: StageProgress | None = None  # the running stage's counter (stage_progress)
    made: set = field(default_factory=set)  # units committed by this run: reused even with resume off
    repairing: set = field(default_factory=set)  # damaged units this run recomputes (each logged once)
    unfinished: set = field(default_factory=set)  # units an interrupted run left, this run recomputes (logged once)
    # seed -> rows of its shuffled copy that the train stage's SGD learners read at most (None or
    # missing: every row); the train stage sets it before the learners ask for their copy
    shuffle_rows: dict = field(default_factory=dict)
    # per stage, (the plan's seconds per task name, the names the plan expects to be submitted): the
    # train stage's fits, from which its progress tells the time left
    estimates: dict = field(default_factory=dict)
    rate: float | None = None  # the plan's multiply-adds per second per task (prices ``submit``'s madds)

    @contextlib.contextmanager
    def stage_progress(self, stage: str):
        """Count every task submitted inside the block as ``stage``'s, on one line; ``log`` goes through
        it meanwhile, so messages do not tear the line."""
        seconds, planned = self.estimates.get(stage, ({}, ()))
        progress = self.progress = StageProgress(
            stage,
            self.log,
            self.terminal,
            estimates=seconds,
            planned=planned,
            slots=self.slots(),
            running=self.processing,
        )
        log, self.log = self.log, progress.write
        finished = False
        try:
            yield progress
            finished = True
        finally:
            progress.close(finished)
            self.log, self.progress = log, None

    def slots(self) -> int:
        """Tasks the cluster runs at once (its workers' threads; the config's while none has joined)."""
        try:
            return max(1, sum(self.client.nthreads().values()))
        except Exception:  # noqa: BLE001 - a scheduler that does not answer: the config's count
            return max(1, self.config.workers * self.config.threads_per_worker)

    def skip_task(self, name: str) -> None:
        """Say that a task the plan expected will not run (its unit is reused)."""
        if self.progress is not None:
            self.progress.skip(name)

    def processing(self) -> set:
        """The keys of the tasks the workers are executing now (the scheduler's answer: a task it has
        handed to a worker may still wait there behind another)."""
        return set(self.client.run_on_scheduler(_executing))

    def reuse(self, unit, stage: str) -> bool:
        """Whether ``unit`` (of ``stage``) is committed, intact and may be reused; otherwise the caller
        recomputes it. A damaged unit is an error naming its first bad file, unless ``repair``.
        A unit this run committed is always reused (e.g. the shuffled copy shared by several NCMML
        candidates: recomputing it would rewrite it under the readers of the first)."""
        if unit.rel in self.made and unit.done():
            return True
        if not self.resume or (
            self.force is not None and STAGES.index(stage) >= STAGES.index(self.force) and not self.forced_before(unit)
        ):
            return False
        if not unit.done():
            if unit.exists() and unit.rel not in self.unfinished:
                self.unfinished.add(unit.rel)
                why = (
                    "has a damaged commit marker"
                    if unit.marker_damaged()
                    else "was left unfinished by a run that stopped (interrupted or failed)"
                )
                self.log(f"  {stage}: {unit.rel} {why}; recomputing it")
            return False
        bad = unit.verify(self.checksums(unit, list(unit.meta().get("files") or {})))
        if not bad:
            return True
        if self.repair:
            if unit.rel not in self.repairing:
                self.repairing.add(unit.rel)
                self.log(f"  {stage}: repairing {unit.rel} ({bad[0]}); recomputing it")
            return False
        raise InputError(
            f"{unit.store.url}: {bad[0]}{f' (and {len(bad) - 1} more)' if len(bad) > 1 else ''}; "
            f"rerun with --repair to recompute it, or check the disk"
        )

    def forced_before(self, unit) -> bool:
        """Whether ``unit`` was committed by an earlier, stopped run of this same --force."""
        if not self.forced_by or not unit.done():
            return False
        return unit.meta().get("run") in self.forced_by

    def commit(self, unit, meta: dict, written: dict | None = None) -> None:
        """Commit ``unit`` with its files' checksums: ``written`` (path inside the unit: [size, CRC-32])
        those its tasks took of the bytes they wrote (:func:`metricpipe.store.write_rows`), the other
        large files read back by the workers in parallel."""
        written = written or {}
        unit.commit(meta, {**self.checksums(unit, skip=set(written)), **written})
        self.made.add(unit.rel)

    def checksums(self, unit, names: list | None = None, skip: set = frozenset()) -> dict:
        """{name: [size, CRC-32]} of the unit's files of CHECKSUM_TASK_BYTES / 16 (8 MiB) or more, among
        ``names`` (all files when None), taken by tasks of about CHECKSUM_TASK_BYTES each: reading a
        1 GB unit back on the client took 0.88 s, longer than writing it on two workers. Missing
        files, and those in ``skip``, are left out (the caller reports or has them)."""
        sizes = unit.file_sizes()
        names = [
            n
            for n in (sizes if names is None else names)
            if sizes.get(n, 0) >= CHECKSUM_TASK_BYTES // 16 and n not in skip
        ]
        if not names:
            return {}
        groups, total = [[]], 0
        for n in names:
            if total >= CHECKSUM_TASK_BYTES:
                groups.append([])
                total = 0
            groups[-1].append(n)
            total += sizes[n]
        futures = [self.submit(size_crcs, unit.store.fs, unit.root, g, name="checksum") for g in groups]
        out = {}
        for part in self.client.gather(futures):
            raise_refused(part)
            out.update({k: v for k, v in part.items() if v is not None})
        return out

    def submit(self, fn, *args, name: str, madds: float | None = None, **kwargs):
        """Submit one task; ``name`` shows on the dashboard (one bar per kind of task); ``madds``: its
        work (:mod:`metricpipe.tasks.madds`'s unit), which the stage's time left counts by ``rate``."""
        self.tasks += 1
        fn = functools.partial(returning_errors if self.returning_errors else refusing, fn)
        point = os.environ.get(FAILPOINT)
        if point and name.startswith(point.split(":", 1)[0]):
            fn = functools.partial(_die_once, point.split(":", 1)[1], fn)
        future = self.client.submit(
            fn, *args, key=task_key(name, self.run_id, self.tasks), retries=RETRIES, pure=False, **kwargs
        )
        if self.progress is not None:
            seconds = None if madds is None or not self.rate else madds / self.rate
            self.progress.add(future, name, seconds)
        return future

    def gather(
        self, futures: list, stage: str, labels: list[str] | None = None, on_result=None, fetch: bool = True
    ) -> list | None:
        """Wait for ``futures``; return results in submission order. Progress is the stage's counter
        (``stage_progress``: every task of the stage, over all its gathers); outside one, this call's own.

        A failure is re-raised at once: bad input as the worker's one-line InputError, anything else
        as a StageError naming the stage and the block (a worker lost after its task finished too:
        its result cannot be read); the remaining tasks are cancelled.
        ``on_result(i, result)``, if given, is called as each task finishes, before any later failure
        or interrupt: a stage commits there what must survive one (the train stage, each model).
        Each result is read from its worker once. ``fetch=False`` waits without reading them (None):
        for tasks whose results other tasks combine on the workers (the statistics stage's D x D
        moments per block), where a Refused result reaches the last task's gather instead; each entry
        of ``futures`` is set to None as its task finishes, so that Dask frees its result once the
        tasks that consume it ran (held by the list, 128 blocks' 4,096-d moments filled 2 workers).
        """
        if on_result is not None and not fetch:
            raise ValueError("on_result needs the results: fetch=True")
        if self.progress is None:  # a stage run alone (tests, `metricpipe stage`): count this call's tasks
            with self.stage_progress(stage) as progress:
                for f in futures:
                    progress.add(f, task_name(f.key))
                return self.gather(futures, stage, labels, on_result, fetch)
        labels = labels or [f"task {i}" for i in range(len(futures))]
        where = {f.key: lab for f, lab in zip(futures, labels)}
        positions = {}
        for i, f in enumerate(futures):
            positions.setdefault(f.key, []).append(i)
        results = {}

        def failed(fut, exc):
            return StageError(f"stage {stage} failed on {where[fut.key]}: {type(exc).__name__}: {exc}".splitlines()[0])

        try:
            for fut in as_completed(futures):
                check_terminated()
                _raise_failed(fut, failed)
                if not fetch:  # released: its result lives as long as the tasks that consume it need it
                    for i in positions.get(fut.key, []):
                        futures[i] = None
                    continue
                if fut.key in results:  # a future listed twice: read once
                    continue
                try:
                    result = fut.result()
                except (Exception, asyncio.CancelledError) as exc:  # KilledWorker, cancelled, comm lost
                    raise failed(fut, exc) from exc
                raise_refused(result)  # bad input found by a task: its one line, at once
                results[fut.key] = result
                if on_result is not None:
                    for i in positions.pop(fut.key, []):  # a future listed twice is reported once per place
                        on_result(i, result)
        except BaseException:
            self.client.cancel([f for f in futures if f is not None])
            raise
        check_terminated()
        return [results[f.key] for f in futures] if fetch else None


def _raise_failed(fut, failed) -> None:
    """Raise for a finished future that failed: its InputError as it is, else ``failed(fut, exc)``."""
    if fut.status == "error":
        exc = fut.exception()
        if isinstance(exc, InputError):
            raise exc
        raise failed(fut, exc) from exc
    if fut.status == "cancelled":
        exc = asyncio.CancelledError(f"{fut.key} was cancelled")
        raise failed(fut, exc) from exc


def _executing(dask_scheduler) -> list:
    """On the scheduler: the keys its workers have said they are executing."""
    return [ts.key for ws in dask_scheduler.workers.values() for ts in ws.executing]


def task_key(name: str, run_id: str, number: int) -> str:
    """The Dask key of a run's ``number``-th task: unique by construction. (Keys ended in 6 random hex
    digits: two tasks of one name drew the same key about once in 10^4 runs, and Dask then hands the
    second submit the first task's future, so a class-means tree summed two models' moments.)"""
    return f"{name}-{run_id}-{number}"


def task_name(key) -> str:
    """The name :meth:`StageContext.submit` gave a task, from its key (:func:`task_key`)."""
    return str(key).rsplit("-", 2)[0] if isinstance(key, str) and key.count("-") >= 2 else str(key)


class Refused:
    """The result of a task that found bad input: carried back as a value, so Dask neither retries
    the task (RETRIES is for flaky reads) nor logs a "Compute Failed" block with a worker traceback;
    a task given a Refused input passes it on, and ``gather`` raises its InputError."""

    def __init__(self, error: InputError):
        self.error = error


def raise_refused(result) -> None:
    if isinstance(result, Refused):
        raise result.error


def _refused_input(args, kwargs) -> InputError | None:
    """The error an earlier task handed on as its result (a Refused, or an InputError returned by
    ``returning_errors``), among a task's inputs and the items of list or tuple inputs."""
    for a in list(args) + list(kwargs.values()):
        for x in a if isinstance(a, (list, tuple)) else (a,):
            if isinstance(x, Refused):
                return x.error
            if isinstance(x, InputError):
                return x
    return None


def refusing(fn, *args, **kwargs):
    error = _refused_input(args, kwargs)
    if error is not None:
        return Refused(error)
    try:
        return fn(*args, **kwargs)
    except InputError as e:
        return Refused(e)


def returning_errors(fn, *args, **kwargs):
    """A candidate's task: bad input or a diverged fit (InputError) is returned as its result, so the
    selection records it beside the other candidates' scores and no worker logs a failure; a task
    given such a result (an SL-DE member's, to the task assembling the members) passes it on."""
    error = _refused_input(args, kwargs)
    if error is not None:
        return error
    try:
        return fn(*args, **kwargs)
    except InputError as e:
        return e


def _die_once(flag: str, fn, *args, **kwargs):
    if flag != "always":
        try:
            fd = os.open(flag, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return fn(*args, **kwargs)
        os.close(fd)
    time.sleep(0.2)  # let the task be seen running
    os.kill(os.getpid(), signal.SIGKILL)
