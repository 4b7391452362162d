"""A warm worker that dies during a task (the OOM killer, a crash in native code) while a process
it started still runs: real worker processes, a real run."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

import orchestra
from orchestra.models.fake import DeterministicModel
from tests.api.test_python_api import config
from tests.helpers import alive

PID_FILE = "ORCHESTRA_TEST_CHILD_PID_FILE"


class SpawnsThenDies(DeterministicModel):
    """Loads by starting a helper process (as vLLM starts its engine), then its process is killed."""

    def load(self) -> None:
        child = subprocess.Popen(["sleep", "300"])
        Path(os.environ[PID_FILE]).write_text(str(child.pid))
        os.kill(os.getpid(), signal.SIGKILL)


class ClosesTheReplyPipe(DeterministicModel):
    """Closes the worker's answer pipe as it loads (a task that closes descriptors it does not know),
    then runs on."""

    def load(self) -> None:
        os.close(int(os.environ["ORCHESTRA_WORKER_FD"]))
        time.sleep(300)


def test_what_a_dead_warm_worker_left_running_is_stopped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The helper, in the worker's process group, held the GPU after the worker was gone and
    outlived the run: the detached worker was never stopped, only forgotten."""
    pid_file = tmp_path / "child.pid"
    monkeypatch.setenv(PID_FILE, str(pid_file))
    cfg = config()
    cfg["models"] = [{"type": "tests.runners.local.test_warm_leftovers.SpawnsThenDies", "abbr": "dies"}]
    cfg["infer"]["runner"]["reuse_workers"] = True
    try:
        run = orchestra.run(cfg, work_dir=str(tmp_path / "out"), quiet=True)
        (failed,) = [r for r in run.failed if r.stage == "infer"]
        assert "warm worker exited with code" in failed.reason
        child = int(pid_file.read_text())
        deadline = time.monotonic() + 5
        while alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(child), "the dead worker's helper process still runs after the run"
    finally:
        if pid_file.exists() and alive(int(pid_file.read_text())):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)


def test_a_worker_whose_answer_pipe_closed_is_stopped_after_the_grace(tmp_path: Path) -> None:
    """The pool reads end of file on the pipe while the worker still runs: it waits the kill grace
    for it to exit, then stops it (it waited for the process without limit: the run hung)."""
    cfg = config()
    cfg["models"] = [{"type": "tests.runners.local.test_warm_leftovers.ClosesTheReplyPipe", "abbr": "closes"}]
    cfg["infer"]["runner"].update(reuse_workers=True, kill_grace_s=1.0)
    started = time.monotonic()
    run = orchestra.run(cfg, work_dir=str(tmp_path / "out"), quiet=True)
    assert time.monotonic() - started < 60
    (failed,) = [r for r in run.failed if r.stage == "infer"]
    assert failed.reason.startswith("warm worker exited with code -") and "during the task" in failed.reason
