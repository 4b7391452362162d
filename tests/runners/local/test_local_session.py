"""LocalRunner's plain (not warm) processes, each a real subprocess in its own process group, and
how the runner finds and hands out GPUs."""

from __future__ import annotations

import os
import signal
import stat
import sys
import time
from pathlib import Path

import pytest
from helpers import alive, gone_within

from orchestra.events import read_events
from orchestra.runners.core.command import Command
from orchestra.runners.core.contract import Exit, Job
from orchestra.runners.local.runner import DEFAULT_WORKERS, LocalRunner, LocalSession, detect_gpus
from orchestra.tasks.spec import TaskSpec
from tests.runners.core.fake_backend import infer_task, make_context


def _job(tmp_path: Path, task_id: str, code: str) -> Job:
    task = TaskSpec(stage="infer", task_id=task_id, run_dir=str(tmp_path), model={"abbr": "m"}, model_abbr="m",
                    units=())
    return Job(task, 1, Command((sys.executable, "-c", code)), str(tmp_path / f"{task_id}.log"), {})


def _ended(session: LocalSession, job: Job, within_s: float = 30.0) -> Exit:
    deadline = time.monotonic() + within_s
    while not (answer := session.poll([job])):
        assert time.monotonic() < deadline, "the process never ended"
        time.sleep(0.02)
    return answer[job]


def _session(grace_s: float = 1.0) -> LocalSession:
    return LocalSession(LocalRunner(max_num_workers=2, gpus=[], kill_grace_s=grace_s), None)


def test_a_task_killed_by_a_signal_says_which(tmp_path: Path) -> None:
    session = _session()
    try:
        job = _job(tmp_path, "t0", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)")
        assert session.submit([job]) == {}
        ended = _ended(session, job)
        assert (ended.code, ended.reason) == (-signal.SIGSEGV, "killed by signal SIGSEGV")
    finally:
        session.close()


LEAVES_A_CHILD = ("import subprocess, sys; child = subprocess.Popen(['sleep', '300']); "
                  "open(sys.argv[1], 'w').write(str(child.pid)); raise SystemExit(3)")


def test_what_an_ended_task_left_running_in_its_group_is_stopped(tmp_path: Path) -> None:
    """A task process that ends (a crash, the OOM killer) while a process it started still runs (a
    vLLM engine, a tokenizer pool): that child, in the task's process group, holds the GPU the
    runner hands to the next task, and outlives the run (only the task itself dies with us)."""
    session = _session()
    pid_file = tmp_path / "child.pid"
    job = _job(tmp_path, "t0", LEAVES_A_CHILD)
    job.command = Command((*job.command.argv, str(pid_file)))
    try:
        assert session.submit([job]) == {}
        assert _ended(session, job).code == 3
        child = int(pid_file.read_text())
        assert gone_within(child), "the task's child still runs after the task ended"
    finally:
        session.close()
        if pid_file.exists() and alive(int(pid_file.read_text())):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)


def test_a_cancelled_task_that_ignores_sigterm_is_killed_with_its_children_after_the_grace(tmp_path: Path) -> None:
    session = _session(grace_s=0.5)
    pid_file = tmp_path / "child.pid"
    code = ("import signal, subprocess, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "child = subprocess.Popen(['sleep', '300']); open(sys.argv[1], 'w').write(str(child.pid)); time.sleep(300)")
    job = _job(tmp_path, "t0", code)
    job.command = Command((*job.command.argv, str(pid_file)))
    try:
        assert session.submit([job]) == {}
        deadline = time.monotonic() + 30
        while not pid_file.exists() or not pid_file.read_text():
            assert time.monotonic() < deadline
            time.sleep(0.02)
        child = int(pid_file.read_text())
        started = time.monotonic()
        session.cancel([job])
        ended = _ended(session, job)
        assert ended == Exit(-1, "cancelled") and 0.4 < time.monotonic() - started < 10
        assert gone_within(child) and not alive(job.handle.pid)
    finally:
        session.close()


def test_gpus_come_from_cuda_visible_devices_first(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2, 5,")
    assert detect_gpus() == ["2", "5"]
    runner = LocalRunner(max_workers_per_gpu=3)
    assert runner.gpus == ["2", "5"] and runner.max_num_workers == 6  # every slot of the box used
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "-1")
    assert detect_gpus() == [] and LocalRunner().max_num_workers == DEFAULT_WORKERS
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert detect_gpus() == []


def _fake_nvidia_smi(folder: Path, body: str) -> None:
    exe = folder / "nvidia-smi"
    exe.write_text(f"#!/bin/sh\n{body}\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)


def test_gpus_from_nvidia_smi_without_cuda_visible_devices(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``nvidia-smi -L`` lists one ``GPU n: ...`` line per GPU (a stand-in prints two, and a MIG line);
    a tool that fails or prints nothing means no GPUs, never a traceback."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert detect_gpus() == []  # no tool at all
    _fake_nvidia_smi(tmp_path, 'echo "GPU 0: NVIDIA H100 (UUID: GPU-a)"; echo "  MIG 1g.10gb Device 0: (UUID: MIG-b)"; '
                               'echo "GPU 1: NVIDIA H100 (UUID: GPU-c)"')
    assert detect_gpus() == ["0", "1"]
    _fake_nvidia_smi(tmp_path, 'echo "NVIDIA-SMI has failed" >&2; exit 9')
    assert detect_gpus() == []
    (tmp_path / "nvidia-smi").write_bytes(b"\x7fELF-not-really")  # exists, cannot be executed
    assert detect_gpus() == []


def test_gpus_given_as_text_and_the_gpu_ids_a_task_sees(tmp_path: Path) -> None:
    runner = LocalRunner(gpus="0, 3", max_num_workers=2)
    assert runner.gpus == ["0", "3"]
    ctx = make_context(tmp_path)
    runner.open(ctx, []).close()
    gpu_task, cpu_task = infer_task("g", ctx, num_gpus=2), infer_task("c", ctx)
    env = runner.task_env(gpu_task, runner.acquire(gpu_task) or {}, 1)
    assert env["CUDA_VISIBLE_DEVICES"] == "0,3" and "OMP_NUM_THREADS" not in env
    cpu_env = runner.task_env(cpu_task, runner.acquire(cpu_task) or {}, 1)
    assert cpu_env["CUDA_VISIBLE_DEVICES"] == ""  # a CPU task cannot grab a GPU by accident
    assert runner.acquire(infer_task("g2", ctx, num_gpus=1)) is None  # both held: it waits


def test_a_task_needing_more_gpus_than_the_runner_has_fails_at_once_saying_how_to_fix_it(tmp_path: Path) -> None:
    ctx = make_context(tmp_path)
    task = infer_task("big", ctx, num_gpus=2)
    (result,) = LocalRunner(gpus=["0"], gpu_sample_s=0).launch([task], ctx)
    assert result.state.value == "failed" and result.attempts == 0
    assert result.reason == ("needs 2 GPU(s) but this runner has 1 "
                             "(set CUDA_VISIBLE_DEVICES or the runner's gpus=[...])")
    assert not [e for e in read_events(ctx.paths.events) if e["event"] == "started"]


def test_warm_workers_and_a_template_are_refused_together() -> None:
    with pytest.raises(ValueError, match="reuse_workers=True cannot be combined with a template"):
        LocalRunner(reuse_workers=True, template="numactl -N 0 {task_cmd}")


def test_a_task_past_its_timeout_is_stopped_retried_and_fails_as_timed_out(tmp_path: Path) -> None:
    """A real run whose model loads for a minute, under ``timeout_s=1``: each attempt is stopped
    (its process group gone), retried once, and the task fails saying it timed out, in seconds."""
    import orchestra
    from tests.api.test_python_api import config

    cfg = config(load_s=60)
    cfg["models"] = cfg["models"][:1]
    cfg["infer"]["runner"].update(timeout_s=1, retry=1, retry_backoff_s=0.1, kill_grace_s=1)
    started = time.monotonic()
    run = orchestra.run(cfg, work_dir=str(tmp_path / "out"), quiet=True)
    assert time.monotonic() - started < 30
    infer = {r.task_id: r for r in run.results}["infer_good_arith"]
    assert (infer.state.value, infer.attempts, infer.reason) == ("failed", 2, "timed out after 1 s")
    events = [e for e in read_events(Path(run.run_dir) / "events.jsonl") if e.get("task_id") == "infer_good_arith"]
    assert [e["event"] for e in events] == ["queued", "started", "retry", "started", "failed"]
    assert events[2]["timed_out"] is True and events[4]["timed_out"] is True
    assert all(not alive(e["where"]["pid"]) for e in events if e["event"] == "started")
