"""One progress counter per stage, over every task the stage submits.

A stage gathers its tasks in several calls (one per model in evaluate, the models then the selection
scores in train, ...), and some tasks are never gathered themselves (partial moments feeding a combine).
So the count is kept by the tasks, not by the gathers: each task submitted while the stage runs adds
one to the total, and its Dask done-callback one to the count. On a terminal the stage is one line,
rewritten in place, with the count, rate and ETA (tqdm); elsewhere (a log file, a CI job) a plain line
``  stage: 12/40 tasks done`` at most every PLAIN_SECONDS, and one when the stage ends.
"""

import os
import sys
import threading
import time
from typing import Callable

# A plain line at most this often (seconds), so a log stays readable.
PLAIN_SECONDS = 5.0
# The terminal line: "  train:  45%|████▌     | 18/40 tasks [00:03<00:04, 5.20task/s]".
BAR = "{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} tasks [{elapsed}<{remaining}, {rate_fmt}]"
# When a stage ends, how long to wait for the done-callbacks of its finished tasks to arrive (they run
# on Dask's callback thread, a moment after gather has the results).
SETTLE_SECONDS = 2.0


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


class StageProgress:
    """The counter of stage ``stage``: ``add`` each submitted future, ``write`` log lines through it
    while it is shown, ``close`` it when the stage returns. ``terminal`` picks the updating line."""

    def __init__(self, stage: str, log: Callable[[str], None], terminal: bool = False, file=None):
        self.stage, self.log = stage, log
        self.total = self.done = 0
        self._lock = threading.RLock()
        self._last = time.monotonic()
        self._closed = False
        self._terminal, self._file = terminal, file
        self._bar = None  # drawn from the first task on: a stage that reuses everything shows no line
        self._said = None  # the last (done, total) written as a plain line

    def add(self, future) -> None:
        with self._lock:
            self.total += 1
            if self._terminal and self._bar is None and not self._closed:
                from tqdm import tqdm

                file = self._file or sys.stderr
                # a terminal that reports no size (a pty nobody sized, e.g. under `script`) would make tqdm
                # draw nothing at all (0 rows): it gets 100 x 24
                sized = _sized(file)
                self._bar = tqdm(
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
        future.add_done_callback(self._finished)

    def _finished(self, future) -> None:
        with self._lock:
            if self._closed:
                return
            self.done += 1
            self._show()

    def _show(self, final: bool = False) -> None:
        if self._bar is not None:
            self._bar.total = self.total
            self._bar.update(self.done - self._bar.n)  # tqdm redraws at most every mininterval
            if final:
                self._bar.refresh()
            return
        now = time.monotonic()
        if (now - self._last > PLAIN_SECONDS or final and self.total > 4) and self._said != (self.done, self.total):
            self.log(f"  {self.stage}: {self.done}/{self.total} tasks done")
            self._last, self._said = now, (self.done, self.total)  # the final count, once

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
