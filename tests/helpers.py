"""What the runner suites share to drive the real CLI and read a run folder back.

``run_cli`` / ``start_cli`` run ``python run.py ARGS`` from the repository root (the suites add
their own environment: a DLC double on PATH, Ray's settings); ``run_cli`` and ``run_argv`` run it to
its end in a process forked from the CLI fork server (``tests/cli_fork.py``), ``start_cli`` starts
a fresh one for the tests that signal or watch it; ``events`` reads the run's event
log through ``orchestra.events.read_events``; the rest read a run folder's outputs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from orchestra.events import read_events

REPO = Path(__file__).resolve().parents[1]


def cli_argv(*args: str | Path) -> list[str]:
    return [sys.executable, "run.py", *map(str, args)]


#: tests whose ``run_cli`` / ``run_argv`` start a fresh process, not one forked from the CLI fork
#: server (``tests/cli_fork.py``): path prefixes of test ids, and why.  A forked CLI process is
#: the child of the server's waiter, not of pytest; its ``/proc/PID/cmdline`` is the server's; it
#: runs in the server's process group.  Everything else a test can see is a fresh process's.
FRESH = {
    "tests/serving/": "serving replicas and their watchdogs find the orchestrator by parent, process "
                      "group and command line (and these files are being changed by others)",
}


def _fresh_here() -> bool:
    """Whether the test running now (``PYTEST_CURRENT_TEST``) is one of :data:`FRESH`."""
    current = os.environ.get("PYTEST_CURRENT_TEST", "")
    return current.startswith(tuple(FRESH))


def run_argv(argv: Sequence[str | Path], *, cwd: str | Path = REPO, env: Mapping[str, str] | None = None,
             timeout: float = 240) -> subprocess.CompletedProcess[str]:
    """``subprocess.run(argv, cwd=cwd, env=env, timeout=timeout, capture_output=True, text=True)``:
    a ``[sys.executable, run.py, ...]`` argv runs in a process forked from this pytest process's
    CLI fork server (``tests/cli_fork.py``: ~0.5 s less CPU a run, the same exit status, output and
    files), unless the test is one of :data:`FRESH` or the fork server would not give what a
    fresh process sees (it then starts one itself)."""
    if _fresh_here():
        return subprocess.run(list(map(str, argv)), cwd=cwd, env=env, timeout=timeout, capture_output=True,
                              text=True)
    from tests.cli_fork import shared

    return shared().run(argv, cwd=cwd, env=env, timeout=timeout)


def run_cli(*args: str | Path, timeout: float = 240, env: Mapping[str, str] | None = None
            ) -> subprocess.CompletedProcess[str]:
    """Run the CLI to its end (``env``: the whole environment, None: ours), forked (:func:`run_argv`)."""
    return run_argv(cli_argv(*args), cwd=REPO, env=env, timeout=timeout)


def start_cli(*args: str | Path, env: dict[str, str] | None = None, new_session: bool = False
              ) -> subprocess.Popen[str]:
    """Start the CLI in the background (``new_session``: in its own session, as in a terminal)."""
    return subprocess.Popen(cli_argv(*args), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, start_new_session=new_session)


def events(run: Path) -> list[dict[str, Any]]:
    """The run's events, oldest first ([] before the run wrote any)."""
    return read_events(str(run / "events.jsonl"))


def jsonl(path: Path) -> list[dict[str, Any]]:
    """The records of a JSON-lines file such as a job ledger ([] when it does not exist)."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def jsonl_so_far(path: Path) -> list[dict[str, Any]]:
    """The records of a JSON-lines file a live process appends to (a run's ``events.jsonl``, read
    before the run ended): every line up to the last newline, each parsed strictly; the bytes after
    it are a line still being written (cut before decoding: they may end inside a character).
    Once the writer has exited, read the file strictly instead."""
    data = path.read_bytes()
    return [json.loads(line) for line in data[:data.rfind(b"\n") + 1].decode().splitlines() if line.strip()]


def run_dirs(work: Path) -> list[Path]:
    """The run folders under a ``work_dir``, oldest first."""
    return sorted(p for p in work.iterdir() if p.is_dir()) if work.exists() else []


def summary_rows(run: Path) -> dict[tuple[str, str], dict]:
    summary = json.loads((run / "summary/summary.json").read_text())
    return {(r["dataset"], r["metric"]): {k: v for k, v in r.items() if k not in ("dataset", "metric")}
            for r in summary["rows"]}


def predictions(run: Path) -> dict[str, str]:
    return {str(p.relative_to(run)): p.read_text() for p in sorted((run / "predictions").rglob("*.jsonl"))}


def wait_for(check: Any, timeout_s: float, what: str, every_s: float = 0.1) -> Any:
    """Poll ``check()`` until it returns something true (returned), or fail the test after
    ``timeout_s`` naming ``what`` was awaited."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(every_s)
    raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")


def server_settled(server: Any, quiet_s: float = 0.3, timeout_s: float = 30) -> dict[str, Any]:
    """The stats of a test server (``tests/servers/openai_server.ServerThread``) once its client was
    killed and what was in flight is answered: nothing in progress and no request arrived for
    ``quiet_s`` (one still in the server's socket buffers when the client died is counted first)."""
    looks: list[dict[str, Any]] = []

    def settled() -> bool:
        looks.append(server.stats())
        return len(looks) > 1 and looks[-1]["in_progress"] == 0 and looks[-1]["requests"] == looks[-2]["requests"]

    wait_for(settled, timeout_s, "the test server to answer what was in flight", every_s=quiet_s)
    return looks[-1]


def poll_until_ended(session: Any, jobs: list[Any], timeout_s: float = 90) -> tuple[dict[Any, Any], float]:
    """Poll a runner session's ``jobs`` until each has ended or ``timeout_s`` passed: what ended
    (``{job: Exit}``) and the longest one ``poll`` call took (tests of a poll that must not block)."""
    ended: dict[Any, Any] = {}
    slowest = 0.0
    deadline = time.monotonic() + timeout_s
    while len(ended) < len(jobs) and time.monotonic() < deadline:
        t0 = time.monotonic()
        ended.update(session.poll([j for j in jobs if j not in ended]))
        slowest = max(slowest, time.monotonic() - t0)
        time.sleep(0.05)
    return ended, slowest


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie, ended but not yet reaped, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def gone_within(pid: int, within_s: float = 5.0) -> bool:
    """Whether process ``pid`` has ended within ``within_s`` seconds."""
    deadline = time.monotonic() + within_s
    while alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def born(pids: list[int]) -> dict[int, int | None]:
    """Each pid with its process's start time (clock ticks since boot), read now: with it a pid
    names one process, even after the kernel hands the pid to another (pid_max may be 32768)."""
    from orchestra.serving.replica import start_time

    return {pid: start_time(pid) for pid in pids}


def still_alive(procs: dict[int, int | None]) -> list[int]:
    """The pids of ``procs`` (``born``) whose very process still runs: a pid reused since is not."""
    from orchestra.serving.replica import start_time

    return [pid for pid, t in procs.items() if t is not None and alive(pid) and start_time(pid) == t]
