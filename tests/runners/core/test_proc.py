"""Process-group helpers (core/proc.py) on real child processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from orchestra.runners.core.proc import describe_status, reap_group, signal_name, start_group
from tests.helpers import born, gone_within, still_alive, wait_for


def _raw_status(code: str) -> int:
    """The raw wait status of a real child running ``code``, as sacct/srun wrappers report it."""
    proc = subprocess.Popen([sys.executable, "-c", code])
    _, status = os.waitpid(proc.pid, 0)
    proc.returncode = 0  # reaped here: keep Popen from waiting again
    return status


def test_a_wait_status_in_words() -> None:
    assert describe_status(_raw_status("raise SystemExit(3)")) == (3, "exit code 3")
    assert describe_status(_raw_status("import os, signal; os.kill(os.getpid(), signal.SIGKILL)")) == (
        -9, "signal SIGKILL")
    assert describe_status(None) == (-1, "exit status unknown")
    assert signal_name(15) == "SIGTERM" and signal_name(0) == "0" and signal_name(200) == "200"


def test_reap_group_reports_once_ended_and_again_after(tmp_path: Path) -> None:
    proc = start_group([sys.executable, "-c", "import time; time.sleep(30)"], {}, str(tmp_path / "log"))
    try:
        assert reap_group(proc) is None
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(10)
        assert reap_group(proc) == -signal.SIGTERM  # reaped already: its code, no signal sent
    finally:
        proc.kill()
        proc.wait()


_SLOW_START = """
import os, subprocess, sys, time
from orchestra.runners.core.proc import die_with_parent
import signal
setup = die_with_parent(signal.SIGKILL)
def slow_setup():
    with open(sys.argv[1] + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.rename(sys.argv[1] + ".tmp", sys.argv[1])
    time.sleep(1.0)  # the orchestrator is SIGKILLed here, between the fork and the prctl
    setup()
subprocess.Popen(["sleep", "30"], preexec_fn=slow_setup, start_new_session=True).wait()
"""


def test_a_child_whose_parent_died_before_the_prctl_dies_too(tmp_path: Path) -> None:
    """The parent-death signal is set after the fork: a SIGKILL of the orchestrator in between
    left the task running, adopted by init, holding its checkpoint's lock (found by the chaos test)."""
    marker = tmp_path / "child"
    parent = subprocess.Popen([sys.executable, "-c", _SLOW_START, str(marker)])
    started: dict[int, int | None] = {}
    try:
        wait_for(marker.exists, 30, "the child's start")
        started = born([int(marker.read_text())])
        parent.kill()
        parent.wait()
        assert gone_within(next(iter(started)), 5), "the child outlived its parent"
    finally:
        parent.kill()
        parent.wait()
        for pid in still_alive(started):
            os.kill(pid, signal.SIGKILL)
