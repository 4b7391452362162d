"""The sbatch launcher's poll against a slow controller: squeue runs off the scheduling loop."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import threading
import time
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


def test_jobs_squeue_forgot_end_by_accounting_by_their_footer_or_as_lost(slurm_cluster: SlurmCluster,
                                                                        tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """squeue (a stand-in) knows none of three real jobs, as after ``MinJobAge``: the one accounting
    (a stand-in sacct) knows ends as sacct says, the one that wrote its footer with its code, the
    one nothing knows is lost after ``LOST_AFTER_MISSES`` looks."""
    ctx, _ = context(tmp_path)
    specs = tasks(3)
    session = SlurmRunner(launcher="sbatch", partition=slurm_cluster.default_partition, array=False).open(ctx, specs)
    argvs = [("sleep", "300"), ("bash", "-c", "exit 3"), ("sleep", "300")]
    jobs = [Job(t, 1, Command(argv), ctx.paths.task_log("infer", t.task_id), {}) for t, argv in zip(specs, argvs)]
    try:
        assert session.submit(jobs) == {}
        footer = Path(jobs[1].log_path)
        deadline = time.monotonic() + 30
        while "ended with exit code 3" not in (footer.read_text() if footer.exists() else ""):
            assert time.monotonic() < deadline, "the job script wrote no footer"
            time.sleep(0.1)
        fake = tmp_path / "bin"
        fake.mkdir()
        (fake / "squeue").write_text("#!/bin/bash\nexit 0\n")  # knows no job
        (fake / "sacct").write_text(f"#!/bin/bash\necho '{jobs[0].handle.job_id}|CANCELLED by 0|0:15'\n")
        for tool in ("squeue", "sacct"):
            (fake / tool).chmod(0o755)
        monkeypatch.setenv("PATH", f"{fake}:{os.environ['PATH']}")
        ended, _ = poll_until_ended(session, jobs, timeout_s=30)
        assert ended[jobs[0]] == Exit(-1, f"Slurm job {jobs[0].handle.job_id} was cancelled (scancel) after it "
                                          "was submitted"), ended
        assert ended[jobs[1]].code == 3, ended
        assert ended[jobs[2]] == Exit(-1, f"Slurm job {jobs[2].handle.job_id} was lost: squeue and sacct no "
                                          "longer know it and its log has no end"), ended
    finally:
        monkeypatch.undo()
        session.close()
        for job in (jobs[0], jobs[2]):
            subprocess.run(["scancel", "--name", job.handle.name], timeout=30, check=False)
