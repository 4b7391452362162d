"""A submission the cluster refuses: for now (wait, submit again, never spend ``retry``) or for good.

The transient refusal here is a real one: a partition of this test's own, created with
``scontrol create PartitionName=...`` in state DRAIN (slurmctld then refuses every submission to it with
``Required partition not available (inactive or drain)``) and resumed while the run waits.  So is a
controller that does not answer (the real sbatch pointed at a port nobody listens on).  The
cluster's other limits (``MaxJobCount``, a QOS's ``MaxSubmitJobs``) cannot be reached on the shared
test cluster without refusing every other session's jobs too; their messages are checked as text.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from helpers import jsonl
from test_slurm_runner import context, sleeping, tasks

from orchestra.cluster.slurm import SbatchError, SbatchRefused, refusal, submit_batch
from orchestra.events import read_events
from orchestra.runners.base import TaskState
from orchestra.runners.core.command import Command
from orchestra.runners.core.contract import Exit, Job
from orchestra.runners.slurm.runner import SlurmRunner
from tests.runners.slurm.conftest import scontrol

if TYPE_CHECKING:
    from conftest import SlurmCluster

# What sbatch 22.05 prints (sbatch.c's retry messages, slurm_errno.c's reasons).  The first is the
# line slurmctld's "_slurm_rpc_submit_batch_job: Resource temporarily unavailable" (MaxJobCount
# reached) made sbatch print on this cluster during the 10,000-task run of docs/benchmarks.md.
TRANSIENT = [
    "sbatch: error: Slurm temporarily unable to accept job, sleeping and retrying",
    "sbatch: error: Slurm job queue full, sleeping and retrying",
    "sbatch: Job creation temporarily disabled, retrying",
    "sbatch: error: Batch job submission failed: Resource temporarily unavailable",
    "sbatch: error: Batch job submission failed: Unable to create job record, try again",
    "sbatch: error: Batch job submission failed: Job violates accounting/QOS policy (job submit limit, user's "
    "size and/or time limits)",
    "sbatch: error: Batch job submission failed: Required partition not available (inactive or drain)",
    "sbatch: error: Batch job submission failed: Unable to contact slurm controller (connect failure)",
]
PERMANENT = [
    ("sbatch: error: Batch job submission failed: Invalid partition name specified",
     "Invalid partition name specified"),
    ("sbatch: error: Batch job submission failed: Invalid job array specification", "Invalid job array specification"),
    ("sbatch: error: Invalid --time specification", "Invalid --time specification"),
    ("sbatch: unrecognized option '--bogus'\nTry \"sbatch --help\" for more information",
     "sbatch: unrecognized option '--bogus'"),
    ("sbatch: error: Batch job submission failed: Requested node configuration is not available",
     "Requested node configuration is not available"),
]


@pytest.mark.parametrize("stderr", TRANSIENT)
def test_the_clusters_limits_and_a_busy_controller_are_refusals_for_now(stderr: str) -> None:
    refused = refusal(stderr)
    assert refused.transient, stderr
    assert "\n" not in str(refused) and not str(refused).startswith("sbatch: error:")


@pytest.mark.parametrize("stderr, reason", PERMANENT)
def test_anything_else_is_permanent_and_says_why_in_one_line(stderr: str, reason: str) -> None:
    refused = refusal(stderr)
    assert not refused.transient
    assert str(refused) == reason


def test_sbatch_that_cannot_start_or_does_not_answer_is_an_error_that_says_so(tmp_path: Path) -> None:
    with pytest.raises(SbatchError, match="cannot run .*no-sbatch"):
        submit_batch([str(tmp_path / "no-sbatch"), "--parsable", "job.sh"])
    slow = tmp_path / "sbatch"  # a stand-in for an sbatch whose controller does not answer
    slow.write_text("#!/bin/bash\nsleep 30\n")
    slow.chmod(0o755)
    start = time.monotonic()
    with pytest.raises(SbatchError, match=r"no answer within 0.5 s \(whether it created a job is unknown\)"):
        submit_batch([str(slow), "--parsable", "job.sh"], timeout_s=0.5)
    assert time.monotonic() - start < 5


def test_an_sbatch_answer_that_is_not_a_job_id_fails_the_jobs_and_says_what_it_was(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "bin"  # a stand-in sbatch (no job reaches a cluster); squeue and scancel are checked for
    fake.mkdir()
    for tool, text in (("sbatch", "echo 'Submitted batch job 17'"), ("squeue", "exit 0"), ("scancel", "exit 0")):
        (fake / tool).write_text(f"#!/bin/bash\n{text}\n")
        (fake / tool).chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}:/usr/bin:/bin")
    ctx, _ = context(tmp_path)
    [spec] = tasks(1)
    session = SlurmRunner(launcher="sbatch").open(ctx, [spec])
    job = Job(spec, 1, Command(("true",)), ctx.paths.task_log("infer", spec.task_id), {})
    try:
        failed = session.submit([job])
    finally:
        session.close()
    assert failed == {job: Exit(-1, "sbatch failed: unexpected sbatch --parsable output 'Submitted batch job 17'")}
    assert "===== slurm: sbatch did not take " in Path(job.log_path).read_text()
    assert [r["state"] for r in jsonl(Path(ctx.paths.slurm_dir) / "jobs.jsonl")] == ["submitting", "submit_failed"]


def test_an_srun_that_cannot_start_fails_its_job_at_once_with_the_reason(tmp_path: Path) -> None:
    ctx, _ = context(tmp_path)
    specs = tasks(2)
    session = SlurmRunner(launcher="srun").open(ctx, specs)
    missing, started = (Job(t, 1, Command(argv), ctx.paths.task_log("infer", t.task_id), {})
                        for t, argv in zip(specs, [(str(tmp_path / "no-srun"),), ("true",)]))
    Path(started.log_path).parent.mkdir(parents=True, exist_ok=True)
    try:
        failed = session.submit([missing, started])
    finally:
        session.close()
    assert list(failed) == [missing]  # the other job of the batch started all the same
    assert failed[missing].reason.startswith("could not start: [Errno 2] No such file or directory"), failed


@pytest.mark.parametrize("bad", [0, -1, True, "60"])
def test_submit_wait_s_must_be_a_positive_number(bad: object) -> None:
    with pytest.raises(ValueError, match=f"submit_wait_s must be a number of seconds > 0, got {bad!r}"):
        SlurmRunner(launcher="sbatch", submit_wait_s=bad)  # type: ignore[arg-type]


def test_sbatch_that_is_about_to_retry_by_itself_is_stopped_before_it_asks_again(tmp_path: Path) -> None:
    # A stand-in for sbatch (a unit test of submit_batch alone): it prints sbatch's retry line,
    # sleeps as sbatch does, then would create a job.  It must be killed in its sleep.
    created = tmp_path / "created"
    fake = tmp_path / "sbatch"
    fake.write_text("#!/bin/bash\n"
                    "echo 'sbatch: error: Slurm temporarily unable to accept job, sleeping and retrying' >&2\n"
                    f"sleep 1; touch {created}; echo 4242\n")
    fake.chmod(0o755)
    start = time.monotonic()
    with pytest.raises(SbatchRefused) as info:
        submit_batch([str(fake), "--parsable", "job.sh"])
    assert info.value.transient
    assert str(info.value) == "Slurm temporarily unable to accept job, sleeping and retrying"
    assert time.monotonic() - start < 5  # not sbatch's 120 s of retries
    time.sleep(1.5)
    assert not created.exists()  # killed in its sleep: the "job" was never created


@pytest.mark.slurm
def test_the_real_clusters_permanent_refusals(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\ntrue\n")
    base = ["sbatch", "--parsable", f"--output={tmp_path}/%j.out", "--hold"]
    # an array larger than the cluster's MaxArraySize (1001 by default): refused at once
    for args, reason in ((["--array=0-5000"], "Invalid job array specification"),
                         (["--partition=no_such_partition"], "Invalid partition name specified")):
        with pytest.raises(SbatchRefused) as info:
            submit_batch([*base, *args, str(script)])
        assert (str(info.value), info.value.transient) == (reason, False)


@pytest.mark.slurm
def test_a_controller_that_does_not_answer_is_a_refusal_for_now(slurm_cluster: SlurmCluster, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    # the real sbatch, pointed at a controller port nobody listens on (a copy of the cluster's config)
    conf = slurm_cluster.conf.read_text().replace("SlurmctldPort=6817", "SlurmctldPort=6899")
    assert "SlurmctldPort=6899" in conf
    (tmp_path / "slurm.conf").write_text(conf)
    (tmp_path / "gres.conf").write_text((slurm_cluster.conf.parent / "gres.conf").read_text())
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "slurm.conf"))
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\ntrue\n")
    with pytest.raises(SbatchRefused) as info:
        submit_batch(["sbatch", "--parsable", f"--output={tmp_path}/%j.out", str(script)])
    assert (str(info.value), info.value.transient) == ("Unable to contact slurm controller (connect failure)", True)


@pytest.mark.slurm
def test_a_refused_submission_waits_and_goes_again_without_spending_retry(drained_partition: str,
                                                                          tmp_path: Path) -> None:
    runner = SlurmRunner(launcher="sbatch", partition=drained_partition, template=sleeping(0), retry=0,
                         infra_retry=0, poll_interval_s=0.2)
    ctx, _ = context(tmp_path)
    resume = threading.Timer(2.0, scontrol, ("update", f"PartitionName={drained_partition}", "State=UP"))
    resume.start()
    try:
        results = runner.launch(tasks(5), ctx)
    finally:
        resume.cancel()
    assert [(r.state, r.attempts) for r in results] == [(TaskState.DONE, 1)] * 5
    refused = [e for e in read_events(ctx.paths.events) if e["event"] == "slurm_submit_refused"]
    assert refused and refused[0]["tasks"] == 5 and refused[0]["retry_in_s"] == 5.0
    assert refused[0]["reason"] == "Required partition not available (inactive or drain)"
    log = Path(results[0].log_path).read_text()
    assert "the cluster refused the submission for now (Required partition not available" in log
    # the refused array of 5 went again as two arrays (3 + 2): a nearly full cluster may take part of it
    assert "(array of 3," in log and "(array of 2," in Path(results[4].log_path).read_text()


@pytest.mark.slurm
def test_a_cluster_that_keeps_refusing_ends_the_tasks_after_submit_wait_s(drained_partition: str,
                                                                           tmp_path: Path) -> None:
    runner = SlurmRunner(launcher="sbatch", partition=drained_partition, template=sleeping(0), retry=2,
                         infra_retry=0, poll_interval_s=0.2, submit_wait_s=3)
    ctx, _ = context(tmp_path)
    start = time.monotonic()
    (result,) = runner.launch(tasks(1), ctx)
    assert time.monotonic() - start >= 3
    assert result.state is TaskState.FAILED
    assert result.reason.startswith("the Slurm cluster refused the submission for ")
    assert result.reason.endswith("s: Required partition not available (inactive or drain)")
    # infra_retry=0: the infrastructure failure then counts like any other, so retry=2 gives 3 attempts
    assert result.attempts == 3
    assert os.path.getsize(ctx.paths.events) > 0
