"""One progress counter per stage, over every task the stage submits: how many are done, which are
running, and a steady estimate of the time left.

A stage gathers its tasks in several calls (one per model in evaluate, the models then the selection
scores in train, ...), and some tasks are never gathered themselves (partial moments feeding a combine).
So the count is kept by the tasks, not by the gathers: each task submitted while the stage runs adds
one to the total, and its Dask done-callback one to the count. On a terminal the stage is one line,
rewritten in place (tqdm); elsewhere (a log file, a CI job) a plain line
``  train: 12/40 tasks done (3 min 5 s; about 6 min left; running ncmml-32-lr30.0, knnml-32)`` at most
every PLAIN_SECONDS when tasks finish, and at least every HEARTBEAT_SECONDS while none does, and one
when the stage ends.

The time left is not the rate of the last few tasks, nor the count's pace (one long model after many
short ones swung it from 1 to 22 minutes; 5 kNN searches among 128 quick writes said 2 h 40 min for a
5 min stage): with an estimate of each task (the plan's by task name, ``estimates``: the train
stage's models; or the task's own, from the multiply-adds its stage gave ``StageContext.submit``) it
is the estimates of the unfinished tasks, run ``slots`` at a time, times the pace the finished ones
kept against their estimates (starting from the plan's own, PRIOR_SECONDS of weight); tasks without
one (writes, combines) count for nothing. With no estimate at all, the stage's average pace per task
since it began. Either counts down between finished tasks and is smoothed (SMOOTHING of each new
value).
"""

import os
import sys
import threading
import time
from typing import Callable

# A plain line at most this often when tasks finish (seconds), so a log stays readable ...
PLAIN_SECONDS = 5.0
# ... and at least this often while none does (a heartbeat naming what runs), so that a log shows the
# run is alive; the clock is read every TICK_SECONDS.
HEARTBEAT_SECONDS = 25.0
TICK_SECONDS = 1.0
# The terminal line: "  train:  45%|████▌     | 18/40 tasks [03:05, 5.20task/s, about 6 min left; running ...]".
BAR = "{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} tasks [{elapsed}, {rate_fmt}{postfix}]"
# When a stage ends, how long to wait for the done-callbacks of its finished tasks to arrive (they run
# on Dask's callback thread, a moment after gather has the results).
SETTLE_SECONDS = 2.0
# The plan's pace counts as this many seconds of observation before the finished tasks correct it.
PRIOR_SECONDS = 60.0
# The share of a new estimate of the time left taken into the one shown.
SMOOTHING = 0.5
# Running tasks named at most (the rest as "+N"), asked of the scheduler at most this often.
NAMES_SHOWN = 3
NAMES_SECONDS = 5.0


def _sized(file) -> bool:
    """Whether the terminal of ``file`` reports its size (columns and rows above 0)."""
    try:
        size = os.get_terminal_size(file.fileno())
    except (AttributeError, OSError, ValueError):
        return False
    return size.columns > 0 and size.lines > 0


def human_bytes(n: float) -> str:
    """A size as people read it: 1.2 GB, 34.5 MB, 6.7 kB or 89 B."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{int(n)} B"


def human_seconds(s: float) -> str:
    """A duration as people read it: 45 s, 6 min 10 s, 2 h 5 min."""
    s = max(0.0, float(s))
    if s < 60:
        return f"{s:.0f} s" if s >= 1 else f"{s:.1f} s"
    if s < 3600:
        return f"{int(s // 60)} min {int(s % 60)} s"
    return f"{int(s // 3600)} h {int(s % 3600 // 60)} min"


def _key(future):
    """A future's Dask key (a plain future's identity in tests)."""
    return getattr(future, "key", None) or id(future)


class StageProgress:
    """The counter of stage ``stage``: ``add`` each submitted future (with its task name), ``write`` log
    lines through it while it is shown, ``close`` it when the stage returns. ``terminal`` picks the
    updating line. ``estimates``: the plan's seconds per task name; ``slots``: tasks that run at once;
    ``planned``: the names of the tasks the plan expects (counted as left until submitted or
    skipped); ``running``: a callable giving the keys of the tasks the workers are processing (None:
    the oldest unfinished ones, ``slots`` of them); ``clock``: seconds (tests give a fake one); ``heartbeat``: a
    thread that calls :meth:`tick` every TICK_SECONDS (tests call it themselves)."""

    def __init__(
        self,
        stage: str,
        log: Callable[[str], None],
        terminal: bool = False,
        file=None,
        estimates: dict | None = None,
        planned=(),
        slots: int = 1,
        running: Callable[[], set] | None = None,
        clock: Callable[[], float] | None = None,
        heartbeat: bool = True,
    ):
        self.stage, self.log = stage, log
        self.total = self.done = 0
        self._lock = threading.RLock()
        self._clock = clock or time.monotonic
        self._start = self._last = self._last_finish = self._clock()
        self._closed = False
        self._terminal, self._file = terminal, file
        self._bar = None  # drawn from the first task on: a stage that reuses everything shows no line
        self._said = None  # the last (done, total) written as a plain line
        self._estimates, self._slots, self._running = estimates or {}, max(1, int(slots)), running
        self._planned = {n for n in planned if n in self._estimates}  # expected, not submitted yet
        self._pending = {}  # key -> task name, in submission order
        self._seconds = {}  # key -> estimated seconds, of the unfinished tasks that have an estimate
        self._names, self._names_at = None, None  # the running tasks' names, and when they were asked
        self._finished_known = 0.0  # the estimated seconds of the finished tasks that have one
        self._busy, self._busy_at = 0.0, self._start  # seconds during which such a task was unfinished
        self._busy_done = 0.0  # ... until the last of them finished
        self._eta = None  # (seconds left shown, when)
        self._stop = threading.Event()
        self._thread = None
        if heartbeat:
            self._thread = threading.Thread(target=self._beat, name=f"progress-{stage}", daemon=True)
            self._thread.start()

    # -- the count ---------------------------------------------------------------------------------------
    def add(self, future, name: str | None = None, seconds: float | None = None) -> None:
        """Count ``future`` (its task ``name`` says which model it trains) as one of the stage's tasks;
        ``seconds``: its estimate (default: the plan's for its name, if any)."""
        with self._lock:
            self.total += 1
            self._pending[_key(future)] = name or ""
            if seconds is None:
                seconds = self._estimates.get(name)
            if seconds is not None:
                self._busy_until(self._clock())
                self._seconds[_key(future)] = float(seconds)
            self._planned.discard(name)
            if self._terminal and self._bar is None and not self._closed:
                self._bar = self._new_bar()
        future.add_done_callback(self._finished)

    def _new_bar(self):
        from tqdm import tqdm  # deferred: only a terminal draws it

        file = self._file or sys.stderr
        # a terminal that reports no size (a pty nobody sized, e.g. under `script`) would make tqdm draw
        # nothing at all (0 rows): it gets 100 x 24
        sized = _sized(file)
        return tqdm(
            total=self.total,
            desc=f"  {self.stage}",
            unit="task",
            file=file,
            bar_format=BAR,
            leave=True,
            dynamic_ncols=sized,
            ncols=None if sized else 100,
            nrows=None if sized else 24,
            mininterval=0.2,
        )

    def _finished(self, future) -> None:
        with self._lock:
            if self._closed:
                return
            self._pending.pop(_key(future), None)
            self._last_finish = self._clock()
            self._busy_until(self._last_finish)
            if _key(future) in self._seconds:
                self._finished_known += self._seconds.pop(_key(future))
                self._busy_done = self._busy
            self.done += 1
            self._show()

    def _busy_until(self, now: float) -> None:
        """Count the time since the last event towards the estimated tasks' time if any was unfinished
        (the tasks without an estimate, a train stage's row shuffle, do not slow the pace)."""
        if self._seconds:
            self._busy += now - self._busy_at
        self._busy_at = now

    # -- what runs, and the time left ----------------------------------------------------------------------
    def running_names(self) -> list[str]:
        """The names of the tasks running now (the stage's name taken off), each once, oldest first."""
        keys = None
        if self._running is not None:
            try:
                keys = self._running()  # (a scheduler call: never under the lock)
            except Exception:  # noqa: BLE001 - a scheduler that does not answer: the oldest unfinished
                keys = None
        with self._lock:
            items = list(self._pending.items())
        names = [n for k, n in items if k in keys] if keys else []
        if not names:  # none said to run (yet): the oldest unfinished ones, as many as run at once
            names = [n for _, n in items[: self._slots]]
        out = []
        for n in names:
            n = n.removeprefix(f"{self.stage}-")
            if n and n not in out:
                out.append(n)
        return out

    def skip(self, name: str) -> None:
        """A task the plan expected that will not be submitted (its result is reused)."""
        with self._lock:
            self._planned.discard(name)

    def _refresh_names(self, now: float) -> None:
        if self._names_at is None or now - self._names_at >= NAMES_SECONDS:
            self._names, self._names_at = self.running_names(), now

    def seconds_left(self) -> float | None:
        """The smoothed estimate of the stage's time left (None before there is anything to go on)."""
        now = self._clock()
        with self._lock:
            new = self._raw_left(now)
            if new is None:
                return None
            if self._eta is None:
                self._eta = (new, now)
            else:
                shown, then = self._eta
                shown = max(0.0, shown - (now - then))
                self._eta = (shown + SMOOTHING * (new - shown), now)
            return self._eta[0]

    def _raw_left(self, now: float) -> float | None:
        left = [*self._seconds.values(), *(self._estimates[n] for n in self._planned)]
        if left:
            # the plan's seconds run `slots` at a time (the longest one alone at least), at the pace the
            # finished tasks kept against their estimates (over the time some estimated task was
            # unfinished, until the last of them finished; the plan's own pace counting PRIOR_SECONDS),
            # less such time since then (the running tasks' progress); a tenth of it at least
            planned = max(max(left), sum(left) / self._slots)
            pace = (self._busy_done + PRIOR_SECONDS) / (self._finished_known / self._slots + PRIOR_SECONDS)
            busy = self._busy + (now - self._busy_at if self._seconds else 0.0)
            return max(planned * pace - (busy - self._busy_done), 0.1 * planned * pace)
        if not self.done:
            return None
        return (self._last_finish - self._start) * (self.total - self.done) / self.done  # the stage's pace per task

    def status(self) -> str:
        """What the plain line and the terminal line add to the count: elapsed, time left, what runs."""
        parts = []
        left = self.seconds_left()
        if left is not None and self.done < self.total:
            parts.append(f"about {human_seconds(left)} left")
        names = (self._names or []) if self.done < self.total else []
        if names:
            more = f" +{len(names) - NAMES_SHOWN}" if len(names) > NAMES_SHOWN else ""
            parts.append("running " + ", ".join(names[:NAMES_SHOWN]) + more)
        return "; ".join(parts)

    # -- the lines ---------------------------------------------------------------------------------------------
    def _show(self, final: bool = False) -> None:
        if self._bar is not None:
            self._bar.total = self.total
            self._bar.update(self.done - self._bar.n)  # tqdm redraws at most every mininterval
            if final:
                self._bar.set_postfix_str("", refresh=False)
                self._bar.refresh()
            return
        now = self._clock()
        if (now - self._last > PLAIN_SECONDS or final and self.total > 4) and self._said != (self.done, self.total):
            self._plain(now, final)

    def _plain(self, now: float, final: bool = False) -> None:
        if not final:
            self._refresh_names(now)
        elapsed = human_seconds(now - self._start)
        extra = "" if final else self.status()
        self.log(f"  {self.stage}: {self.done}/{self.total} tasks done ({elapsed}{'; ' + extra if extra else ''})")
        self._last, self._said = now, (self.done, self.total)  # the final count, once

    def tick(self) -> None:
        """Called every TICK_SECONDS: on a terminal, the line's time left and running tasks brought up
        to date; elsewhere, a heartbeat line when none was written for HEARTBEAT_SECONDS."""
        if self._closed or not self.total:
            return
        now = self._clock()
        self._refresh_names(now)
        with self._lock:
            if self._closed:
                return
            if self._bar is not None:
                self._bar.set_postfix_str(self.status(), refresh=True)
            elif now - self._last >= HEARTBEAT_SECONDS:
                self._plain(now)

    def _beat(self) -> None:
        while not self._stop.wait(TICK_SECONDS):
            try:
                self.tick()
            except Exception:  # noqa: BLE001 - progress must never stop the run
                pass

    def write(self, msg: str) -> None:
        """A log line that does not tear the progress line: the line is cleared, the message written,
        the line drawn again below it."""
        with self._lock:
            if self._bar is None or self._closed:
                self.log(msg)
                return
            self._bar.clear()
            self.log(msg)
            self._bar.refresh()

    def close(self, finished: bool = True) -> None:
        """End the stage's line: the last count (the stage's own tasks all done when it ``finished``)."""
        self._stop.set()
        if finished:
            deadline = time.monotonic() + SETTLE_SECONDS
            while self.done < self.total and time.monotonic() < deadline:
                time.sleep(0.02)
        with self._lock:
            if self._closed:
                return
            if finished:
                self._show(final=True)
            self._closed = True
            if self._bar is not None:
                self._bar.close()
