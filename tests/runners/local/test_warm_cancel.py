"""LocalRunner's warm workers while one is being stopped: real worker processes behind real pipes."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from orchestra.runners.core.command import Command
from orchestra.runners.core.contract import Job
from orchestra.runners.local.runner import LocalRunner, LocalSession
from orchestra.runners.local.warm import PipePool
from orchestra.tasks.spec import TaskSpec


def _job(tmp_path: Path, task_id: str) -> Job:
    task = TaskSpec(stage="infer", task_id=task_id, run_dir=str(tmp_path), model={"abbr": "m"}, model_abbr="m",
                    units=())
    # a spec that does not exist: the worker answers with a failure, which is all this needs
    return Job(task, 0, Command(("python", str(tmp_path / f"{task_id}.py"))), str(tmp_path / f"{task_id}.log"), {})


def test_wait_between_rounds_does_not_spin_while_a_warm_worker_is_stopped(tmp_path: Path) -> None:
    """A cancelled warm job's reply pipe is closed at once, while its process is stopped in the
    background; the loop keeps waiting on it between rounds until the stop ends.  That wait must
    still wait (it returned at once: select() on the closed pipe failed, so the loop spun a core
    for the whole kill grace)."""
    runner = LocalRunner(max_num_workers=2, reuse_workers=True, kill_grace_s=2.0, gpus=[])
    pool = PipePool(2, 2.0, str(tmp_path / "workers"))
    session = LocalSession(runner, pool)
    try:
        job = _job(tmp_path, "t0")
        assert session.submit([job]) == {}
        session.cancel([job])
        stop = threading.Event()
        started = time.monotonic()
        rounds = 0
        while time.monotonic() - started < 0.5:
            session.wait([job], 0.1, stop)
            rounds += 1
        assert rounds <= 6, f"{rounds} rounds in 0.5 s: wait() returned at once instead of waiting"
    finally:
        session.close()


def _open_fds() -> int:
    import os

    return len(os.listdir("/proc/self/fd"))


def test_a_worker_that_cannot_start_leaves_no_pipe_open(tmp_path: Path) -> None:
    """The worker log folder cannot be made (a file is in the way): the job cannot start, said
    once, and neither end of the pipe made for the worker stays open (both leaked, two per try)."""
    (tmp_path / "file").write_text("")
    runner = LocalRunner(max_num_workers=2, reuse_workers=True, kill_grace_s=1.0, gpus=[])
    session = LocalSession(runner, PipePool(2, 1.0, str(tmp_path / "file" / "workers")))
    try:
        before = _open_fds()
        for i in range(3):
            job = _job(tmp_path, f"t{i}")
            refused = session.submit([job])
            assert list(refused) == [job] and "could not start" in refused[job].reason
        assert _open_fds() == before
    finally:
        session.close()
