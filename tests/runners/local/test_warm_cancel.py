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


def _warm_session(workers: int, grace_s: float, folder: Path) -> tuple[LocalSession, PipePool]:
    """A LocalRunner session over a pool of ``workers`` warm worker processes logging under ``folder``."""
    runner = LocalRunner(max_num_workers=workers, reuse_workers=True, kill_grace_s=grace_s, gpus=[])
    pool = PipePool(workers, grace_s, str(folder))
    return LocalSession(runner, pool), pool


def test_wait_between_rounds_does_not_spin_while_a_warm_worker_is_stopped(tmp_path: Path) -> None:
    """A cancelled warm job's reply pipe is closed at once, while its process is stopped in the
    background; the loop keeps waiting on it between rounds until the stop ends.  That wait must
    still wait (it returned at once: select() on the closed pipe failed, so the loop spun a core
    for the whole kill grace)."""
    session, _ = _warm_session(2, 2.0, tmp_path / "workers")
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
    session, _ = _warm_session(2, 1.0, tmp_path / "file" / "workers")
    try:
        before = _open_fds()
        for i in range(3):
            job = _job(tmp_path, f"t{i}")
            refused = session.submit([job])
            assert list(refused) == [job] and "could not start" in refused[job].reason
        assert _open_fds() == before
    finally:
        session.close()


def _ended(session: LocalSession, job: Job) -> None:
    deadline = time.monotonic() + 60
    while not session.poll([job]):
        assert time.monotonic() < deadline, "the warm worker never answered"
        time.sleep(0.02)


def test_a_worker_that_died_as_it_was_handed_a_task_does_not_hold_its_slot(tmp_path: Path) -> None:
    """An idle worker dies between the pool's check and the write of the next request (the write
    fails: broken pipe).  That task cannot start, said once; the dead worker must not stay in the
    pool marked busy, where it held one of ``max_workers`` slots for ever and the next task found
    no room (an AssertionError out of the loop)."""
    import os
    import signal

    session, pool = _warm_session(1, 1.0, tmp_path / "workers")
    try:
        first = _job(tmp_path, "t0")
        assert session.submit([first]) == {}
        _ended(session, first)
        (worker,) = pool.pool.workers.values()
        proc = worker.handle.proc
        os.kill(proc.pid, signal.SIGKILL)
        os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)  # dead, not reaped yet
        # the death lands after the pool's check: while another thread reaps, poll() says "running"
        with proc._waitpid_lock:
            second = _job(tmp_path, "t1")
            refused = session.submit([second])
        assert list(refused) == [second] and "could not start" in refused[second].reason
        third = _job(tmp_path, "t2")
        assert session.submit([third]) == {}
        _ended(session, third)
    finally:
        session.close()
