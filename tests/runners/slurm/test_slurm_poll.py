"""The sbatch launcher's poll against a slow controller: squeue runs off the scheduling loop."""

from __future__ import annotations

import re
import shutil
import subprocess
import threading
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from helpers import poll_until_ended
from slurm_helpers import squeue_jobs
from test_slurm_runner import context, tasks

from orchestra.runners.core.command import Command
from orchestra.runners.core.contract import Exit, Job
from orchestra.runners.slurm.runner import SlurmRunner

if TYPE_CHECKING:
    from conftest import SlurmCluster

pytestmark = pytest.mark.slurm


def slow_squeue(tmp_path: Path, calls: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Put first on PATH a ``squeue`` that notes each call in ``calls``, then sleeps 3 s before the real one."""
    real = shutil.which("squeue")
    assert real is not None
    slow = tmp_path / "bin"
    slow.mkdir()
    (slow / "squeue").write_text(f'#!/bin/bash\necho x >> {calls}\nsleep 3\nexec {real} "$@"\n')
    (slow / "squeue").chmod(0o755)
    monkeypatch.setenv("PATH", f"{slow}:{Path(real).parent}:/usr/bin:/bin")


def test_poll_never_waits_on_a_slow_squeue(slurm_cluster: SlurmCluster, tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Each ``squeue`` takes 3 s: every poll still returns at once, the jobs end with their own codes."""
    ctx, _ = context(tmp_path)
    specs = tasks(2)
    runner = SlurmRunner(launcher="sbatch", partition=slurm_cluster.default_partition, poll_interval_s=0.2)
    session = runner.open(ctx, specs)
    calls = tmp_path / "squeue.calls"
    try:
        jobs = [Job(t, 1, Command(("bash", "-c", f"sleep 1; exit {code}")), ctx.paths.task_log("infer", t.task_id),
                    {}) for t, code in zip(specs, (3, 5))]
        assert session.submit(jobs) == {}
        slow_squeue(tmp_path, calls, monkeypatch)
        ended, slowest = poll_until_ended(session, jobs)
        assert slowest < 1.0, slowest  # a poll that runs squeue itself takes 3 s
        assert calls.read_text().count("x") >= 2  # the looks did happen, slowly
        assert {ended.get(j, Exit(-99)).code for j in jobs} == {3, 5}, ended
        assert [ended[j].code for j in jobs] == [3, 5], ended  # each job its own code
    finally:
        session.close()


def test_srun_poll_never_waits_on_a_slow_squeue(slurm_cluster: SlurmCluster, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """srun exits 3 and 5 (a plain non-zero code, so squeue is asked how the job ended), each ``squeue``
    takes 3 s: every poll returns at once, each job ends with its own code and its log's reason."""
    ctx, _ = context(tmp_path)
    specs = tasks(2)
    runner = SlurmRunner(launcher="srun", partition=slurm_cluster.default_partition, poll_interval_s=0.1)
    session = runner.open(ctx, specs)
    calls = tmp_path / "squeue.calls"
    try:
        jobs = []
        for task, code in zip(specs, (3, 5)):
            log = ctx.paths.task_log("infer", task.task_id)
            Path(log).parent.mkdir(parents=True, exist_ok=True)
            runner.template = ["bash", "-c", f"sleep 1; exit {code}", "_", "{task_cmd}"]
            jobs.append(Job(task, 1, runner.get_command(task, str(tmp_path / "spec.json"), {}, 1, log), log, {}))
        slow_squeue(tmp_path, calls, monkeypatch)
        assert session.submit(jobs) == {}
        ended, slowest = poll_until_ended(session, jobs)
        assert slowest < 1.0, slowest  # a poll that runs squeue itself takes 3 s
        assert calls.exists() and calls.read_text().count("x") >= 1  # Slurm was asked, slowly
        assert [ended[j].code for j in jobs if j in ended] == [3, 5], ended
        for job, code in zip(jobs, (3, 5)):
            assert re.fullmatch(rf"exit code {code} \(Slurm job \d+\)", ended[job].reason), ended[job]
    finally:
        session.close()


def test_ctrl_c_while_close_waits_for_its_stops_still_ends_the_watcher(slurm_cluster: SlurmCluster, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A KeyboardInterrupt out of ``close``'s wait for the stops in flight: the squeue watcher's thread
    ends all the same, and a job the loop left running is cancelled before the wait."""
    ctx, _ = context(tmp_path)
    [spec] = tasks(1)
    session = SlurmRunner(launcher="sbatch", partition=slurm_cluster.default_partition).open(ctx, [spec])
    job = Job(spec, 1, Command(("sleep", "300")), ctx.paths.task_log("infer", spec.task_id), {})
    assert session.submit([job]) == {}
    session.poll([job])  # the first look starts the watcher's thread
    assert [t for t in threading.enumerate() if t.name.startswith("slurm-look")]

    def interrupted(timeout_s: float) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(session.stops, "wait", interrupted)
    try:
        with pytest.raises(KeyboardInterrupt):
            session.close()
        assert not [t for t in threading.enumerate() if t.name.startswith("slurm-look")]
        assert squeue_jobs(job.handle.name) == [], "the job left running was not cancelled"
    finally:
        subprocess.run(["scancel", "--name", job.handle.name], timeout=30, check=False)
