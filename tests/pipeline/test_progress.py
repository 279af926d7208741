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
        counts = [m for m in logs if re.match(rf"  {stage}: \d+/\d+ tasks done", m)]
        if n <= 4:  # a stage of a few tasks says nothing until it completes (as before)
            assert not counts
            continue
        assert counts and counts[-1].startswith(f"  {stage}: {n}/{n} tasks done ("), (stage, counts)
        assert len(counts) <= 3, counts  # at most every few seconds: not one line per model or per task


def test_a_plain_count_is_not_written_twice(monkeypatch):
    """The last task's own line (the 5 s timer) and the stage's final line both said 'train: 95/95'."""
    from metricpipe import progress

    lines, clock = [], [0.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: clock[0])
    p = progress.StageProgress("train", lines.append, heartbeat=False)

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
    assert [ln.split(" (")[0] for ln in lines] == [f"  train: {i}/6 tasks done" for i in range(1, 7)]


class _Task:
    """A fake future: a key, and the done-callback the progress gives it (called to finish it)."""

    def __init__(self, key):
        self.key = key

    def add_done_callback(self, fn):
        self.fn = fn

    def finish(self):
        self.fn(self)


def _progress(clock, lines, **kw):
    from metricpipe.progress import StageProgress

    return StageProgress("train", lines.append, clock=lambda: clock[0], heartbeat=False, **kw)


def test_without_a_terminal_a_heartbeat_names_what_runs_at_least_every_30_s_while_no_task_finishes():
    """A run printed 'train: 26/49 tasks done' and then nothing for over 6 minutes."""
    from metricpipe.progress import HEARTBEAT_SECONDS

    lines, clock = [], [0.0]
    p = _progress(clock, lines, slots=2)
    tasks = [_Task(f"k{i}") for i in range(3)]
    for t, name in zip(tasks, ["train-ncmml-32", "train-knnml-32-lr0.1", "train-nml-64"]):
        p.add(t, name)
    for second in range(1, 91):  # 90 s of ticks (one a second), no task finishing
        clock[0] = float(second)
        p.tick()
    assert HEARTBEAT_SECONDS <= 30
    assert [ln.split(" (")[0] for ln in lines] == ["  train: 0/3 tasks done"] * 3  # at 25, 50, 75 s
    assert lines[0] == "  train: 0/3 tasks done (25 s; running ncmml-32, knnml-32-lr0.1)", lines[0]
    assert "1 min 15 s" in lines[2]  # the elapsed time
    p.close(finished=False)


def test_the_running_tasks_are_those_the_scheduler_says_execute():
    lines, clock = [], [0.0]
    tasks = [_Task(f"k{i}") for i in range(3)]
    p = _progress(clock, lines, slots=2, running=lambda: {"k2"})
    for t, name in zip(tasks, ["train-a", "train-b", "train-c"]):
        p.add(t, name)
    assert p.running_names() == ["c"]
    p.close(finished=False)


def _eta_run(estimates: dict, order: list, durations: dict, slots: int = 1) -> list:
    """(the time left shown after each task finishes, the true time left then) for tasks run one at a
    time in ``order``, each taking ``durations`` seconds."""
    lines, clock = [], [0.0]
    p = _progress(clock, lines, slots=slots, estimates={f"train-{k}": v for k, v in estimates.items()})
    tasks = {k: _Task(k) for k in order}
    for k in order:
        p.add(tasks[k], f"train-{k}")
    out, total = [], sum(durations.values())
    for k in order:
        clock[0] += durations[k]
        tasks[k].finish()
        out.append((p.seconds_left(), total - clock[0]))
    p.close(finished=False)
    return out


def test_the_time_left_follows_the_plan_not_the_pace_of_the_last_tasks():
    """Short tasks first, then long ones: a rate of the last few tasks said 1 minute, then 22."""
    estimates = {"a": 2.0, "b": 2.0, "c": 2.0, "d": 100.0, "e": 100.0, "f": 2.0}
    for slower in (1.3, 0.7):  # the machine runs slower (faster) than planned
        shown = _eta_run(estimates, list(estimates), {k: slower * v for k, v in estimates.items()})
        for left, true in shown[:4]:  # while a long task remains
            assert 0.6 * true <= left <= 1.5 * true, shown
        # what the pace of the finished tasks alone would say after the short ones: 3 tasks x 2.6 s
        assert shown[2][0] > 10 * 3 * 2.0 * slower


def test_the_time_left_counts_down_between_tasks_and_without_estimates_uses_the_stage_pace():
    lines, clock = [], [0.0]
    p = _progress(clock, lines, estimates={"train-a": 60.0, "train-b": 60.0})
    a, b = _Task("a"), _Task("b")
    p.add(a, "train-a")
    p.add(b, "train-b")
    assert p.seconds_left() == 120.0  # the plan's, before anything finished
    clock[0] = 30.0
    assert p.seconds_left() == pytest.approx(90.0)  # counting down
    p.close(finished=False)
    lines, clock = [], [0.0]
    p = _progress(clock, lines)  # no estimates: nothing to say until a task finished, then its pace
    tasks = [_Task(i) for i in range(4)]
    for t in tasks:
        p.add(t, "encode-block")
    assert p.seconds_left() is None and "left" not in p.status()
    clock[0] = 10.0
    tasks[0].finish()
    assert p.seconds_left() == pytest.approx(30.0)
    p.close(finished=False)


def test_a_stage_of_a_few_long_searches_and_many_quick_writes_counts_the_searches():
    """The neighbours stage of 500,000 x 4,096 rows: 5 kNN searches (about 60 s each, 2 at once) and
    128 writes (0.1 s each) that finish as the searches do. Counting tasks, 106 done of 133 after 4 min
    43 s said 19 min left (2 h 40 min earlier) for a stage that ended 47 s later."""
    lines, clock = [], [0.0]
    p = _progress(clock, lines, slots=2)
    searches = [_Task(f"s{i}") for i in range(5)]
    writes = [_Task(f"w{i}") for i in range(128)]
    for t in searches:
        p.add(t, "knn-piece", seconds=50.0)  # the plan's estimate: the machine is 1.2x slower
    for t in writes:
        p.add(t, "knn-write")  # no estimate: bookkeeping
    assert p.seconds_left() == pytest.approx(125.0)  # 5 x 50 s shared by 2 slots
    true_end = 180.0  # 60 s each: (s0, s1), (s2, s3), s4
    for i, (t, end) in enumerate(zip(searches, [60.0, 60.0, 120.0, 120.0, 180.0])):
        clock[0] = end
        t.finish()
        for w in writes[i * 25 : (i + 1) * 25]:  # the writes of the rows this search finished
            w.finish()
        if i < 4:
            left = p.seconds_left()
            assert 0.6 * (true_end - end) <= left <= 1.5 * (true_end - end), (i, left)
    p.close(finished=False)


def test_tasks_without_an_estimate_before_the_fits_do_not_slow_their_pace():
    """The 500,000-row train stage shuffled its rows for 3 min (tasks without an estimate), then fitted:
    the pace counted those 3 minutes against the fits' 13 s and said 3 h 18 min for 51 min of fits."""
    lines, clock = [], [0.0]
    plan = {"train-lda": 10.0, "train-ncmml": 600.0}
    p = _progress(clock, lines, slots=1, estimates=plan, planned=set(plan))
    lda = _Task("lda")
    p.add(lda, "train-lda")
    shuffle = [_Task(f"s{i}") for i in range(50)]
    for t in shuffle:
        p.add(t, "shuffle-scatter")
    clock[0] = 12.0
    lda.finish()
    for i, t in enumerate(shuffle):
        clock[0] = 12.0 + 3.5 * (i + 1)  # 175 s of shuffling
        t.finish()
        assert 0.8 * 600.0 <= p.seconds_left() <= 1.5 * 600.0  # the fit still to come, all along
    fit = _Task("ncmml")
    p.add(fit, "train-ncmml")
    assert 0.8 * 600.0 <= p.seconds_left() <= 1.5 * 600.0
    clock[0] += 300.0
    assert 0.8 * 300.0 <= p.seconds_left() <= 1.5 * 300.0  # counting down as it runs
    p.close(finished=False)


def test_the_fits_the_plan_expects_count_as_left_until_submitted_unless_reused():
    """The first tasks of the train stage copy the rows; the models come after: the time left counts
    them from the start, and not those the run reuses."""
    plan = {"train-a": 50.0, "train-b": 30.0, "train-c": 20.0}
    for reused, left in (((), 100.0), (("train-c",), 80.0)):
        lines, clock = [], [0.0]
        p = _progress(clock, lines, estimates=plan, planned=set(plan))
        for name in reused:
            p.skip(name)
        p.add(_Task("copy"), "shuffle-scatter")  # no estimate
        assert p.seconds_left() == left
        p.add(_Task("a"), "train-a")  # submitted: counted once
        assert p.seconds_left() == left
        p.close(finished=False)


def test_without_a_terminal_a_run_names_its_stage_and_the_models_it_trains(client, tmp_path, monkeypatch):
    from metricpipe import progress

    monkeypatch.setattr(progress, "PLAIN_SECONDS", 0.0)  # a line for every finished task
    monkeypatch.setattr(progress, "NAMES_SECONDS", 0.0)
    logs = []
    run_pipeline(parse_config(_raw(tmp_path), where="cfg.yaml"), client=client, log=logs.append)
    train = [m for m in logs if m.startswith("  train: ") and "tasks done" in m]
    assert train, logs
    named = [m for m in train if re.search(r"running .*(identity|pca-4|pca-6|random-4)", m)]
    assert named, train


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
