"""What the chaos tests share: start the CLI in a session of its own, kill it at a moment said in
events and seconds (a whole node, the orchestrator alone, Ctrl-C), and read a run folder back
(its processes, its finished samples, its sealed outputs, what writes cut short left)."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tests.helpers import REPO, born, still_alive


@dataclass(frozen=True)
class Point:
    """When to kill: once the process has added ``events`` lines to the event log, ``delay_s`` later."""

    events: int
    delay_s: float

    def __str__(self) -> str:
        return f"{self.events}+{self.delay_s:.2f}s"


@dataclass
class Kill:
    """What one kill left: the run's processes, and what the server and the run folder held."""

    how: str
    point: Point
    pids: dict[int, int | None]
    sent: Counter[str] = field(default_factory=Counter)
    done: set[str] = field(default_factory=set)
    sealed: dict[str, tuple[int, int]] = field(default_factory=dict)


def start(cfg: Path, work: Path, *args: str) -> subprocess.Popen[str]:
    """``python run.py CFG -w WORK ARGS`` in a session of its own (its own process group)."""
    return subprocess.Popen([sys.executable, "run.py", str(cfg), "-w", str(work), *args], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def run_processes(work: Path) -> list[int]:
    """Every live process whose command line names the work folder: the orchestrator and its tasks."""
    needle = str(work).encode()
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                if needle in Path(f"/proc/{entry}/cmdline").read_bytes():
                    out.append(int(entry))
            except OSError:
                continue
    return out


def the_run(work: Path) -> Path:
    (run,) = sorted(p for p in work.iterdir() if p.is_dir())
    return run


def event_count(work: Path) -> int:
    logs = sorted(work.glob("*/events.jsonl"))
    if not logs:
        return 0
    with open(logs[-1], "rb") as f:
        return sum(1 for _ in f)


def files_of(run: Path) -> set[str]:
    """The run folder's files but task specs and logs (a resume packs the shards left into new tasks)."""
    return {str(p.relative_to(run)) for p in run.rglob("*") if p.is_file() and p.relative_to(run).parts[0]
            not in ("tasks", "logs")}


def temporary_files(run: Path) -> list[str]:
    """Files of writes that never finished: an atomic write's, a task spec's."""
    return [str(p.relative_to(run)) for p in run.rglob("*") if ".tmp-" in p.name]


def predictions_of(run: Path) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for path in sorted((run / "predictions").rglob("*.jsonl")):
        recs = [json.loads(x) for x in path.read_text().splitlines()[1:]]
        out[str(path.relative_to(run))] = [f"{r['prompt']} -> {r['prediction']}" for r in recs]
    return out


def finished_prompts(run: Path, timeout_s: float = 30) -> set[str]:
    """The prompts whose answers the run folder holds, in a checkpoint or a sealed prediction file,
    read in one whole pass.  Cluster jobs outlive a killed orchestrator (``after_kill`` with
    ``jobs_outlive``) and write on: a task that seals its prediction file deletes its checkpoint,
    so a file listed may be gone when read; then the folder is read again (a pass that skipped it
    could miss the sealed file that replaced it)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            return _finished_prompts(run)
        except FileNotFoundError:
            time.sleep(0.05)
    raise AssertionError(f"no whole read of {run / 'predictions'} in {timeout_s:g} s: its files kept going")


def _finished_prompts(run: Path) -> set[str]:
    """:func:`finished_prompts` in one pass; raises ``FileNotFoundError`` if a file listed went."""
    done: set[str] = set()
    for path in (run / "predictions").rglob("*"):
        if path.name.endswith((".jsonl", ".jsonl.ckpt")) and not path.name.startswith("."):
            for line in path.read_text().splitlines()[1:]:
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue  # a line torn by the kill: that sample was not finished
                if isinstance(rec, dict) and rec.get("error") is None and "prediction" in rec:
                    done.add(rec["prompt"])
    return done


def sealed_outputs(run: Path) -> dict[str, tuple[int, int]]:
    """Finished outputs (prediction files, results) with their inode and mtime: a rewrite changes them."""
    paths = [*(run / "predictions").rglob("*.jsonl"), *(run / "results").rglob("*.json")]
    return {str(p.relative_to(run)): (p.stat().st_ino, p.stat().st_mtime_ns)
            for p in paths if not p.name.startswith(".")}


def kill_at(proc: subprocess.Popen[str], work: Path, point: Point, how: str,
            count: Callable[[Path], int] = event_count) -> Kill | None:
    """Kill the run ``how`` at ``point`` (None: it ended by itself first); ``count`` tells the
    lines ``point.events`` counts (the event log's, or e.g. a cluster ledger's)."""
    target = count(work) + point.events
    deadline = time.monotonic() + 60
    while count(work) < target:
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.communicate()
            return None
        time.sleep(0.002)
    # the delay after that line, or less when the run's next line comes first: a run faster than the
    # reference (a loaded machine's timings vary) must not end before its kill
    until = time.monotonic() + point.delay_s
    while time.monotonic() < until and count(work) <= target:
        time.sleep(0.002)
    if proc.poll() is not None:
        proc.communicate()
        return None
    if how == "node":  # the whole tree frozen first, so nobody sees another die, then killed
        for pid in [proc.pid, *run_processes(work)]:
            _signal(pid, signal.SIGSTOP)
        kill = Kill(how, point, born([proc.pid, *run_processes(work)]))
        for pid in kill.pids:
            _signal(pid, signal.SIGKILL)
    elif how == "orchestrator":
        kill = Kill(how, point, born([proc.pid, *run_processes(work)]))
        _signal(proc.pid, signal.SIGKILL)
    else:
        kill = Kill(how, point, born([proc.pid, *run_processes(work)]))
        os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
    t0 = time.monotonic()
    try:
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    if how == "sigint":
        assert proc.returncode == 130, (proc.returncode, err[-2000:])
        assert time.monotonic() - t0 < 10, f"Ctrl-C took {time.monotonic() - t0:.1f} s"
        # a SIGKILL sent at the end of the stop's grace ends a process when the kernel next runs it:
        # on a busy machine that may be seconds later (the deadline was 2 s)
        deadline = time.monotonic() + 30
        while still_alive(kill.pids) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not still_alive(kill.pids), f"Ctrl-C left {still_alive(kill.pids)} running"
    else:
        assert proc.returncode == -signal.SIGKILL
    return kill


def _signal(pid: int, sig: signal.Signals) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def kill_points(times: list[float], n: int, seed: int) -> list[Point]:
    """``n`` moments spread over a run whose events came at ``times``, from its first event to
    its last, one at random in each ``n``-th, each said as the events before it and the time
    since the last of them."""
    rng = random.Random(seed)
    span = times[-1] - times[0]
    points = []
    for k in range(n):
        moment = times[0] + (k + rng.random()) * span / n
        before = sum(1 for t in times if t <= moment)
        points.append(Point(before, round(moment - times[before - 1], 3)))
    return points


def after_kill(kill: Kill, work: Path, jobs_outlive: bool = False) -> Kill:
    """Check that the run's processes all ended (with ``jobs_outlive``, as cluster jobs do the
    orchestrator they outlive: only the orchestrator); note what the run folder held."""
    if jobs_outlive:
        orchestrator = next(iter(kill.pids))
        kill.pids = {orchestrator: kill.pids[orchestrator]}
    left = lambda: still_alive(kill.pids) + ([] if jobs_outlive else run_processes(work))  # noqa: E731
    deadline = time.monotonic() + 10
    while left() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not left(), f"{kill.how} kill at {kill.point} left {left()} running"
    kill.done = finished_prompts(the_run(work))
    kill.sealed = sealed_outputs(the_run(work))
    return kill
