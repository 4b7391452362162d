"""Process-group helpers (core/proc.py) on real child processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from orchestra.runners.core.proc import describe_status, reap_group, signal_name, start_group


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
