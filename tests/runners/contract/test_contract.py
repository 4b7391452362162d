"""The conformance suite: the same scenarios over every backend (local, srun and sbatch on the real
local Slurm cluster, the DLC double, the example backend of ``examples/``).

A backend passes when it does what the loop needs of any backend: a batch of jobs submitted and
polled to their ends, each exit code carried through, a job over its time limit stopped, a stop
(Ctrl-C) leaving nothing running, the loss of a job's infrastructure retried without spending
``retry``, and a SIGKILLed orchestrator's jobs adopted or stopped by the next one on the run folder,
never run twice at once.  What a backend cannot do it declares on its runner class
(``outlives_orchestrator``, ``reports_infra_loss``, ``carries_exit_codes``: ``core/hooks.py``), and
the suite checks that it then does the declared thing instead, clearly.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from contract_backends import Backend, pids, running
from helpers import REPO, alive, wait_for

from orchestra.events import EventLog, read_events
from orchestra.paths import RunPaths
from orchestra.runners.base import RunContext, TaskResult, TaskState
from orchestra.tasks.spec import TaskSpec

HERE = Path(__file__).resolve().parent
END_S = 300  # the longest a scenario may wait on a loaded machine (each ends in seconds; Ray in tens)


def context(tmp_path: Path) -> RunContext:
    paths = RunPaths(str(tmp_path / "run"))
    paths.make_dirs()
    return RunContext(paths, EventLog(paths.events))


def tasks(backend: Backend, ctx: RunContext, *ids: str) -> list[TaskSpec]:
    folder = Path(ctx.paths.root).parent / "markers"
    return [TaskSpec(stage="infer", task_id=t, run_dir=ctx.paths.root, model=backend.model(folder, t), model_abbr="m",
                     units=()) for t in ids]


def markers(tmp_path: Path) -> Path:
    folder = tmp_path / "markers"
    folder.mkdir(exist_ok=True)
    return folder


def events(ctx: RunContext, kind: str) -> list[dict[str, Any]]:
    return [e for e in read_events(ctx.paths.events) if e["event"] == kind]


def in_thread(runner: Any, specs: list[TaskSpec], ctx: RunContext) -> tuple[threading.Thread, list[TaskResult]]:
    """``runner.launch`` in a thread of its own (the test acts on the backend meanwhile)."""
    out: list[TaskResult] = []
    thread = threading.Thread(target=lambda: out.extend(runner.launch(specs, ctx)), daemon=True)
    thread.start()
    return thread, out


def nothing_left(backend: Backend, folder: Path) -> None:
    """No task process of the test runs, and the backend's platform holds no job of it."""
    wait_for(lambda: not running(folder) and not backend.leftovers(), 60, "nothing of the run left running")


def test_a_batch_of_jobs_ends_with_each_exit_code(backend: Backend, tmp_path: Path) -> None:
    folder, ctx = markers(tmp_path), context(tmp_path)
    runner = backend.runner(folder, max_num_workers=5, retry=0)
    results = {r.task_id: r for r in runner.launch(tasks(backend, ctx, "ok0", "ok1", "ok2", "ok3", "exit3"), ctx)}
    assert {t: (r.state, r.attempts) for t, r in results.items()} == {
        **{f"ok{i}": (TaskState.DONE, 1) for i in range(4)}, "exit3": (TaskState.FAILED, 1)}
    assert all(len(pids(folder, t)) == 1 for t in results)  # each job ran once
    (failed,) = events(ctx, "failed")
    if runner.carries_exit_codes:
        assert failed["exit_code"] == 3, failed
    else:  # declared: a failure reaches the loop as failed, not as its code
        assert failed["exit_code"] != 0, failed
    assert len(events(ctx, "started")) == 5
    nothing_left(backend, folder)


def test_a_job_over_its_time_limit_is_stopped(backend: Backend, tmp_path: Path) -> None:
    folder, ctx = markers(tmp_path), context(tmp_path)
    runner = backend.runner(folder, timeout_s=2, retry=0)
    (result,) = runner.launch(tasks(backend, ctx, "hang0"), ctx)
    assert (result.state, result.reason) == (TaskState.FAILED, "timed out after 2 s")
    (failed,) = events(ctx, "failed")
    assert failed["timed_out"] is True
    nothing_left(backend, folder)


def test_a_stop_cancels_every_job_and_leaves_nothing_running(backend: Backend, tmp_path: Path) -> None:
    folder, ctx = markers(tmp_path), context(tmp_path)
    runner = backend.runner(folder, max_num_workers=3)
    thread, results = in_thread(runner, tasks(backend, ctx, "hang0", "hang1", "hang2", "ok_queued"), ctx)
    wait_for(lambda: all(pids(folder, f"hang{i}") for i in range(3)), END_S, "the three jobs running")
    assert not backend.platform or backend.leftovers(), "the platform shows no job of the run"  # the check sees
    ctx.stop.set()  # what Ctrl-C does
    thread.join(END_S)
    assert not thread.is_alive(), "the launch did not end after the stop"
    assert {r.task_id: r.state for r in results} == {t: TaskState.CANCELLED for t in
                                                     ("hang0", "hang1", "hang2", "ok_queued")}
    assert not pids(folder, "ok_queued")  # a stop starts nothing more
    nothing_left(backend, folder)


def test_infrastructure_loss_is_retried_without_spending_retry(backend: Backend, tmp_path: Path) -> None:
    folder, ctx = markers(tmp_path), context(tmp_path)
    runner = backend.runner(folder, retry=0, **backend.infra_options)
    if backend.infra_before is not None:
        backend.infra_before()
    thread, results = in_thread(runner, tasks(backend, ctx, "flaky0"), ctx)
    if backend.infra_after is not None:
        backend.infra_after(folder, Path(ctx.paths.events))
    thread.join(END_S)
    assert not thread.is_alive(), "the launch did not end"
    (result,) = results
    infra = [e for e in events(ctx, "retry") if e.get("infra")]
    if runner.reports_infra_loss and backend.infra_inflicted:
        assert (result.state, len(infra)) == (TaskState.DONE, 1), (result, infra)
        assert result.attempts == 2 and not [e for e in events(ctx, "retry") if not e.get("infra")]
    else:  # declared (or not inflictable here): a job killed from outside is its task's failure, named,
        # and spends retry (0 here)
        assert (result.state, result.attempts, infra) == (TaskState.FAILED, 1, [])
        # the signal, or the code a shell between the job and its task gives for it (128 + 9: srun's wrapper)
        assert "SIGKILL" in result.reason or "exit code 137" in result.reason, result.reason
    nothing_left(backend, folder)


def test_a_sigkilled_orchestrators_jobs_are_adopted_or_stopped_never_run_twice(backend: Backend,
                                                                                tmp_path: Path) -> None:
    """The orchestrator (a process of its own) is SIGKILLed while its jobs run; another one on the
    same run folder (what ``-r`` hands the backend: ``open`` over the ledger) ends the tasks."""
    folder, ctx = markers(tmp_path), context(tmp_path)
    ids = ["gate0", "gate1"]
    spec = tmp_path / "orchestrator.json"
    kwargs = backend.kwargs(folder, max_num_workers=2, **backend.killed_options)
    spec.write_text(json.dumps({"type": backend.type, "kwargs": kwargs,
                                "run": ctx.paths.root, "tasks": {t: backend.model(folder, t) for t in ids}}))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    argv = [sys.executable, str(HERE / "orchestrator.py"), str(spec)]
    first = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        # both running, and both started events written (a task may run before its event is)
        wait_for(lambda: all(pids(folder, t) for t in ids) and len(events(ctx, "started")) == 2, END_S,
                 "both jobs running")
    finally:
        first.kill()
        first.communicate(timeout=60)
    runner = backend.runner(folder)
    left = [pid for t in ids for pid in pids(folder, t)]
    if runner.outlives_orchestrator:
        assert all(alive(pid) for pid in left), "a job of this backend died with its orchestrator"
    else:  # declared: its jobs die with the orchestrator
        wait_for(lambda: not any(alive(pid) for pid in left), 60, "the jobs gone with their orchestrator")
    second = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: len(events(ctx, "started")) == 4, END_S, "the second orchestrator's attempts")
        (folder / "gate").touch()
        out, err = second.communicate(timeout=END_S)
    finally:
        if second.poll() is None:
            second.send_signal(signal.SIGINT)
            second.communicate(timeout=60)
    assert second.returncode == 0, err[-3000:]
    assert {t: state for t, (state, _) in json.loads(out).items()} == {t: "done" for t in ids}
    runs = {t: pids(folder, t) for t in ids}
    if backend.adopts:  # the jobs the killed orchestrator left ran on, and were not started again
        assert runner.outlives_orchestrator and all(len(r) == 1 for r in runs.values()), runs
    else:  # each task ran again, once, and only after its first run was gone
        assert all(len(r) == 2 for r in runs.values()), runs
        assert not any(alive(pid) for pid in left)
    nothing_left(backend, folder)
