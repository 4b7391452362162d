"""The one subprocess helper: real processes, real signals."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path

from orchestra.sandbox import run_process
from tests.helpers import alive

PY = sys.executable


def _wait_dead(pid: int) -> None:
    """SIGKILL is delivered when the process next runs: give it that moment (5 s at most)."""
    for _ in range(500):
        if not alive(pid):
            return
        time.sleep(0.01)
    raise AssertionError(f"process {pid} is still alive")


def _wait_file(path: Path) -> str:
    for _ in range(500):
        if path.exists() and path.read_text().strip():
            return path.read_text().strip()
        time.sleep(0.01)
    raise AssertionError(f"{path} never written")


def test_exit_code_output_and_exact_environment() -> None:
    code = "import os, sys; print(','.join(sorted(os.environ))); print('err', file=sys.stderr); sys.exit(3)"
    res = asyncio.run(run_process([PY, "-c", code], env={"ONLY": "1"}, timeout_s=30, max_output_bytes=1000))
    assert res.returncode == 3 and not res.timed_out and not res.output_exceeded
    # Python itself may add LC_CTYPE (PEP 538); nothing of ours leaks in.
    assert set(res.stdout.decode().strip().split(",")) - {"LC_CTYPE"} == {"ONLY"}
    assert res.stderr == b"err\n"


def test_timeout_kills_the_whole_group(tmp_path: Path) -> None:
    pidfile = tmp_path / "child.pid"
    # The program starts a grandchild in its own process group and then hangs.
    code = (f"import subprocess, time; p = subprocess.Popen(['sleep', '300']); "
            f"open({str(pidfile)!r}, 'w').write(str(p.pid)); time.sleep(300)")
    t0 = time.monotonic()
    res = asyncio.run(run_process([PY, "-c", code], env={"PATH": os.environ["PATH"]}, timeout_s=1.0,
                                  max_output_bytes=1000))
    assert res.timed_out and res.returncode == -9
    assert time.monotonic() - t0 >= 1.0
    _wait_dead(int(_wait_file(pidfile)))


def test_output_beyond_the_limit_is_cut_and_the_program_killed() -> None:
    code = "import sys\nwhile True: sys.stdout.write('x' * 4096)"
    res = asyncio.run(run_process([PY, "-c", code], env={}, timeout_s=60, max_output_bytes=10_000))
    assert res.output_exceeded and not res.timed_out
    assert len(res.stdout) == 10_000 and res.returncode == -9


def test_cancelling_the_awaiting_task_kills_the_program(tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    code = f"import os, time; open({str(pidfile)!r}, 'w').write(str(os.getpid())); time.sleep(300)"

    async def main() -> None:
        task = asyncio.ensure_future(run_process([PY, "-c", code], env={}, timeout_s=300, max_output_bytes=100))
        while not pidfile.exists() or not pidfile.read_text():
            await asyncio.sleep(0.01)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass

    asyncio.run(main())
    _wait_dead(int(pidfile.read_text()))


def test_after_exit_runs_once_the_program_ended() -> None:
    calls: list[float] = []
    res = asyncio.run(run_process([PY, "-c", "pass"], env={}, timeout_s=30, max_output_bytes=100,
                                  after_exit=lambda: calls.append(time.monotonic())))
    assert res.returncode == 0 and len(calls) == 1


def test_a_daemon_holding_the_pipes_does_not_keep_the_helper_waiting(tmp_path: Path) -> None:
    pidfile = tmp_path / "daemon.pid"
    # The daemon leaves the process group (setsid) and keeps stdout and stderr open.
    code = (f"import subprocess; p = subprocess.Popen(['sleep', '300'], start_new_session=True); "
            f"open({str(pidfile)!r}, 'w').write(str(p.pid)); print('bye')")
    killed: list[int] = []

    def kill_daemon() -> None:  # what a caller that can reach escaped processes does
        pid = int(_wait_file(pidfile))
        os.kill(pid, 9)
        killed.append(pid)

    res = asyncio.run(run_process([PY, "-c", code], env={"PATH": os.environ["PATH"]}, timeout_s=120,
                                  max_output_bytes=1000, after_exit=kill_daemon))
    assert res.returncode == 0 and not res.timed_out and res.stdout == b"bye\n"
    _wait_dead(killed[0])
