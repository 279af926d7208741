"""Progress a person can follow: one counter per stage over all its tasks (not one per gather, which
restarted for every model), an updating line on a terminal, plain lines elsewhere."""

import fcntl
import json
import os
import pty
import re
import struct
import subprocess
import sys
import termios

import numpy as np
import pytest
import yaml

from metricpipe.config import parse_config
from metricpipe.runner import run_pipeline
from tests.conftest import make_blobs

# Several models, so evaluate and encode gather once per model, and several row-blocks per stage.
METHODS = [
    {"method": "identity"},
    {"method": "pca", "dim": 4},
    {"method": "pca", "dim": 6},
    {"method": "random", "dim": 4},
]


def _raw(tmp_path, **extra) -> dict:
    X, y = make_blobs(n=400, d=8)
    np.savez(tmp_path / "d.npz", X=X, y=y)
    return {
        "store": str(tmp_path / "store"),
        "data": {"path": str(tmp_path / "d.npz"), "chunk_mb": 0.004},
        "methods": METHODS,
        "evaluate": {"retrieval": {"k": [5]}, "classification": {"classifiers": ["knn1"]}},
        **extra,
    }


pytestmark = pytest.mark.integration


def _stage_tasks(store) -> dict:
    timings = json.loads((store / "runs/latest.json").read_text())["timings"]
    return {t["stage"]: t["tasks"] for t in timings if t.get("tasks")}


def test_without_a_terminal_each_stage_logs_plain_lines_of_one_count_over_all_its_tasks(client, tmp_path):
    logs = []
    run_pipeline(parse_config(_raw(tmp_path), where="cfg.yaml"), client=client, log=logs.append)
    assert not any("\r" in m for m in logs)
    tasks = _stage_tasks(tmp_path / "store")
    assert tasks["evaluate"] >= 2 * len(METHODS) and tasks["encode"] >= len(METHODS)  # gathered per model
    for stage, n in tasks.items():
        counts = [m for m in logs if m.startswith(f"  {stage}: ") and m.endswith(" tasks done")]
        if n <= 4:  # a stage of a few tasks says nothing until it completes (as before)
            assert not counts
            continue
        assert counts and counts[-1] == f"  {stage}: {n}/{n} tasks done", (stage, counts)
        assert len(counts) <= 3, counts  # at most every few seconds: not one line per model or per task


def test_a_plain_count_is_not_written_twice(monkeypatch):
    """The last task's own line (the 5 s timer) and the stage's final line both said 'train: 95/95'."""
    from metricpipe import progress

    lines, clock = [], [0.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: clock[0])
    p = progress.StageProgress("train", lines.append)

    class Done:
        def add_done_callback(self, fn):
            self.fn = fn

    tasks = [Done() for _ in range(6)]
    for t in tasks:
        p.add(t)
    for i, t in enumerate(tasks):
        clock[0] = 6.0 * (i + 1)  # each finishes past the plain line's interval
        t.fn(t)
    p.close()
    assert lines == [f"  train: {i}/6 tasks done" for i in range(1, 7)]


def test_on_a_terminal_each_stage_is_one_line_rewritten_in_place_up_to_its_total(tmp_path):
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump(_raw(tmp_path, workers=1, dashboard=":0")))
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    proc = subprocess.Popen(
        [sys.executable, "-m", "metricpipe.cli", "run", str(cfg)],
        stdin=subprocess.DEVNULL,
        stdout=follower,
        stderr=follower,
        env={**os.environ, "TERM": "xterm"},
    )
    os.close(follower)
    out = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # EIO: the process closed the terminal
            break
        if not chunk:
            break
        out += chunk
    os.close(leader)
    assert proc.wait(timeout=60) == 0, out.decode(errors="replace")
    text = out.decode()
    tasks = _stage_tasks(tmp_path / "store")
    lines = text.replace("\r\n", "\n").split("\n")
    for stage, n in tasks.items():
        mine = [ln for ln in lines if re.search(rf"(^|\r) *{stage}: ", ln)]
        assert len(mine) == 1, (stage, mine)  # one line per stage, not one per model
        frames = [f for f in mine[0].split("\r") if f.strip()]
        counts = [tuple(map(int, m.groups())) for f in frames if (m := re.search(r"\| (\d+)/(\d+) tasks", f))]
        assert counts[-1] == (n, n), (stage, frames[-1])  # the stage's total reached
        assert [d for d, _ in counts] == sorted(d for d, _ in counts)  # never restarts
        assert "task/s" in frames[-1] or "s/task" in frames[-1]  # with a rate (and an ETA while running)
    assert "Completed" in text and "Report:" in text


@pytest.mark.parametrize("size", [(0, 0), (30, 90)])
def test_a_terminal_that_reports_no_size_still_shows_the_line(size):
    """A pty nobody sized (0 x 0, e.g. under `script` started from a job) made tqdm draw nothing."""
    from concurrent.futures import Future

    from metricpipe.progress import StageProgress

    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", *size, 0, 0))
    with os.fdopen(follower, "w") as term:
        p = StageProgress("train", lambda m: None, terminal=True, file=term)
        futures = [Future() for _ in range(3)]
        for f in futures:
            p.add(f)
        for f in futures:
            f.set_result(None)
        p.close()
        term.flush()
        out = _drain(leader)
    os.close(leader)
    assert re.search(r"train: 100%\|.*\| 3/3 tasks", out), out


def _drain(fd: int) -> str:
    """Everything written to a pty so far: one read returns only what has reached the leader side yet
    (a single read saw just the first draw, '0/1 tasks', on a loaded machine)."""
    import select

    out = b""
    while select.select([fd], [], [], 0.5)[0]:
        out += os.read(fd, 65536)
    return out.decode()


def test_peak_rss_of_a_spawned_process_is_its_own_not_its_parents():
    """A worker spawned by a large client reports its own peak: getrusage's ru_maxrss carries the
    parent's over fork and exec (checked here too, so the test shows what it guards against)."""
    import subprocess
    import sys

    child = (
        "import resource; from metricpipe.runner import max_rss_mb; "
        "print(max_rss_mb(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)"
    )
    parent = (
        "import numpy as np, subprocess, sys; a = np.ones(125_000_000); a += 1; "  # 1 GB resident
        f"sys.stdout.write(subprocess.run([sys.executable, '-c', {child!r}], capture_output=True, "
        "text=True, check=True).stdout)"
    )
    out = subprocess.run([sys.executable, "-c", parent], capture_output=True, text=True, check=True).stdout
    own, inherited = map(float, out.split())
    assert inherited > 950 and own < 500, (own, inherited)  # importing metricpipe.runner: ~210 MB
