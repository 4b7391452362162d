"""``cluster.cli.call``, the one external-client call of the Slurm and DLC backends: real processes."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from orchestra.cluster.cli import CallError, CallTimeout, call
from tests.helpers import alive, wait_for


def test_an_answer_comes_back_with_its_code_and_both_streams() -> None:
    res = call(["sh", "-c", "echo out; echo err >&2; exit 3"], 10)
    assert (res.returncode, res.stdout, res.stderr) == (3, "out\n", "err\n")


def test_a_client_that_cannot_start_is_one_error() -> None:
    with pytest.raises(CallError, match="cannot run /nonexistent/sbatch"):
        call(["/nonexistent/sbatch"], 10)


def test_past_its_deadline_the_whole_process_group_is_killed(tmp_path: Path) -> None:
    pidfile = tmp_path / "grandchild"
    t0 = time.monotonic()
    with pytest.raises(CallTimeout) as info:  # a wrapper whose child hangs: both must go
        call(["sh", "-c", f"sleep 300 & echo $! > {pidfile}; wait"], 0.5)
    assert not info.value.aborted and time.monotonic() - t0 < 5
    grandchild = int(pidfile.read_text())  # SIGKILL is sent; its delivery may take a moment on a busy box
    wait_for(lambda: not alive(grandchild), 5, f"the grandchild {grandchild} to be killed")


def test_a_stop_kills_the_call_after_its_grace() -> None:
    stop = threading.Event()
    threading.Timer(0.2, stop.set).start()
    t0 = time.monotonic()
    with pytest.raises(CallTimeout) as info:
        call(["sleep", "300"], 60, abort=stop, abort_grace_s=0.3)
    assert info.value.aborted and time.monotonic() - t0 < 5


def test_a_stop_on_line_kills_the_group_at_once_and_returns_what_it_printed(tmp_path: Path) -> None:
    pidfile = tmp_path / "grandchild"
    script = (f"sleep 300 & echo $! > {pidfile}; echo 'job 1'; echo 'note' >&2; "
              "echo 'busy, sleeping and retrying' >&2; sleep 30; echo 'job 2'")
    t0 = time.monotonic()
    res = call(["sh", "-c", script], 20, stop_on=("sleeping and retrying",))
    assert time.monotonic() - t0 < 5  # not the client's own 30 s sleep
    assert (res.returncode, res.stdout, res.stderr) == (-9, "job 1\n", "note\nbusy, sleeping and retrying\n")
    wait_for(lambda: not alive(int(pidfile.read_text())), 5, "the grandchild killed with its group")


def test_stop_on_that_never_shows_changes_nothing_and_the_deadline_holds() -> None:
    res = call(["sh", "-c", "echo out; echo err >&2; exit 3"], 10, stop_on=("retrying",))
    assert (res.returncode, res.stdout, res.stderr) == (3, "out\n", "err\n")
    t0 = time.monotonic()
    with pytest.raises(CallTimeout):
        call(["sh", "-c", "sleep 300"], 0.5, stop_on=("retrying",))
    assert time.monotonic() - t0 < 5


def test_a_stop_ends_a_call_watching_for_a_line_too() -> None:
    """With ``stop_on`` the stop was not watched: Ctrl-C waited for the client's whole deadline."""
    stop = threading.Event()
    threading.Timer(0.2, stop.set).start()
    t0 = time.monotonic()
    with pytest.raises(CallTimeout) as info:
        call(["sleep", "300"], 20, abort=stop, abort_grace_s=0.3, stop_on=("retrying",))
    assert info.value.aborted and time.monotonic() - t0 < 5


@pytest.mark.parametrize("stop_on", [(), ("retrying",)])
def test_a_grandchild_holding_the_pipes_is_killed_at_the_deadline(tmp_path: Path, stop_on: tuple[str, ...]) -> None:
    """The client ends but leaves a child that keeps its output open: both ways of calling wait for
    the output to end until the deadline, then kill the group (with ``stop_on`` the call returned
    after 10 s of joins and left the grandchild running)."""
    pidfile = tmp_path / "grandchild"
    t0 = time.monotonic()
    with pytest.raises(CallTimeout) as info:
        call(["sh", "-c", f"sleep 300 & echo $! > {pidfile}; echo started"], 1.5, stop_on=stop_on)
    assert not info.value.aborted and time.monotonic() - t0 < 8
    wait_for(lambda: not alive(int(pidfile.read_text())), 5, "the grandchild killed with its group")
