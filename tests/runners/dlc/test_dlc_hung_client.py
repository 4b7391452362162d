"""A hung ``dlc`` client: its whole process group is killed on cli_timeout_s, the error names the call,
and SIGTERM / Ctrl-C during a hung submit ends the run within seconds."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from dlc_helpers import Double, dlc_runner, run_cli, run_dirs, start_cli, write_config
from helpers import alive

HANG_S = 90  # the double's hung submit: its child sleeps this long (longer than any bound below)


def hung_pids(double: Double) -> list[int]:
    path = double.state / "hung.pids"
    return [int(x) for x in path.read_text().split()] if path.exists() else []


def wait_gone(pids: list[int], timeout_s: float) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(map(alive, pids)):
        time.sleep(0.05)
    return [p for p in pids if alive(p)]


@pytest.fixture
def cleanup(double: Double):  # type: ignore[no-untyped-def]
    yield
    for pid in hung_pids(double):  # only what the double started for this test
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_timed_out_call_is_killed_with_its_children_and_named(double: Double, tmp_path: Path, cleanup: None) -> None:
    double.faults(submit_hang_s=HANG_S)
    cfg = write_config(tmp_path, dlc_runner(tmp_path, cli_timeout_s=1.5, infra_retry=0), tasks=1)
    res = run_cli(double.state, cfg, "--mode", "infer", timeout=HANG_S - 10)  # old code: waits on the child
    assert res.returncode == 1, res.stderr[-3000:]
    pids = hung_pids(double)
    assert len(pids) == 2 and wait_gone(pids, 5) == []  # the client and the child it started
    assert "dlc submit (job orc-" in res.stderr and "did not answer within cli_timeout_s=1.5 s" in res.stderr, \
        res.stderr[-3000:]
    (run,) = run_dirs(tmp_path / "out")
    assert "killed it and its child processes" in next((run / "logs" / "infer").glob("*.log")).read_text()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_during_a_hung_submit_returns_within_seconds(double: Double, tmp_path: Path, cleanup: None,
                                                            sig: signal.Signals) -> None:
    double.faults(submit_hang_s=HANG_S)
    cfg = write_config(tmp_path, dlc_runner(tmp_path, cli_timeout_s=60), tasks=1)
    proc = start_cli(double.state, cfg, "--mode", "infer")
    try:
        deadline = time.monotonic() + 60
        while len(hung_pids(double)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(hung_pids(double)) == 2, "the submit never started"
        sent = time.monotonic()
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=30)  # a hang guard: the bound is ABORT_GRACE_S plus clean-up
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, err[-3000:]
    assert took < 20, took
    assert wait_gone(hung_pids(double), 5) == []
    assert "Traceback" not in err


def test_the_double_hangs_as_configured(double: Double) -> None:
    """The fault itself: a submit that hangs while its child sleeps (so the tests above test something)."""
    double.faults(submit_hang_s=HANG_S)
    proc = subprocess.Popen(["dlc", "submit", "pytorchjob", "--name", "x", "--command", "true", "--workspace_id", "w",
                             "--worker_image", "i", "--workers", "1"], start_new_session=True,
                            env={**os.environ, "FAKE_DLC_STATE": str(double.state)})
    try:
        # the double's start (a Python process) can take seconds under load: wait for its pids to appear
        deadline = time.monotonic() + 60
        while len(hung_pids(double)) < 2 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        assert len(hung_pids(double)) == 2, "the submit never started its child"
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(timeout=2)  # and it hangs there
        assert all(map(alive, hung_pids(double)))
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
