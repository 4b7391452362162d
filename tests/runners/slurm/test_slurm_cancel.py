"""``slurm_state.cancel_and_wait``, the Slurm backend's one cancel path: scripted squeue answers
first, then the real cluster."""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from helpers import poll_until_ended
from test_slurm_runner import context, tasks

from orchestra.cluster import slurm as slurm_state
from orchestra.cluster.slurm import SlurmCommandError, SlurmJobState, cancel_and_wait
from orchestra.runners.core.contract import Exit, Job
from orchestra.runners.slurm.runner import SlurmRunner

if TYPE_CHECKING:
    from conftest import SlurmCluster


class FakeSlurm:
    """squeue answers scripted per call (the last one repeats), and every scancel recorded."""

    def __init__(self, answers: list[dict[str, str] | None]) -> None:
        self.answers = answers
        self.calls = 0
        self.scancelled: list[list[str]] = []

    def _next(self) -> dict[str, str]:
        answer = self.answers[min(self.calls, len(self.answers) - 1)]
        self.calls += 1
        if answer is None:
            raise SlurmCommandError("squeue: slurm_load_jobs error: Unable to contact slurm controller")
        return answer

    def squeue(self, job_ids: Iterable[str]) -> dict[str, SlurmJobState]:
        return {jid: SlurmJobState(jid, state) for jid, state in self._next().items()}

    def squeue_by_name(self, names: Iterable[str]) -> dict[str, tuple[str, str]]:
        return {jid: (f"name-{jid}", state) for jid, state in self._next().items()}

    def scancel(self, job_ids: Iterable[str]) -> None:
        self.scancelled.append(sorted(job_ids))


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeSlurm:
    slurm = FakeSlurm([{}])
    for name in ("squeue", "squeue_by_name", "scancel"):
        monkeypatch.setattr(slurm_state, name, getattr(slurm, name))
    monkeypatch.setattr(slurm_state, "_CANCEL_POLL_S", 0.01)
    return slurm


def test_returns_once_squeue_shows_every_job_ended(fake: FakeSlurm) -> None:
    fake.answers = [{"5": "RUNNING", "6_1": "RUNNING"}, {"5": "CANCELLED", "6_1": "COMPLETING"},
                    {"5": "CANCELLED", "6_1": "CANCELLED"}]
    assert cancel_and_wait(["5", "6_1"], timeout_s=5) is True
    assert fake.scancelled == [["5", "6_1"]]  # sent once: no job outlived RESCANCEL_AFTER_S
    assert fake.calls == 3


def test_a_job_squeue_forgot_counts_as_gone(fake: FakeSlurm) -> None:
    fake.answers = [{"6_0": "RUNNING"}]  # other tasks of the array may be listed; 6_1 is not
    assert cancel_and_wait(["6_1"], timeout_s=5) is True


def test_nothing_to_cancel_asks_slurm_nothing(fake: FakeSlurm) -> None:
    assert cancel_and_wait([], timeout_s=5) is True
    assert fake.calls == 0 and fake.scancelled == []


def test_a_job_that_stays_alive_is_scancelled_again_unless_completing(fake: FakeSlurm,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(slurm_state, "RESCANCEL_AFTER_S", 0.0)
    fake.answers = [{"5": "RUNNING", "7": "COMPLETING"}]
    t0 = time.monotonic()
    assert cancel_and_wait(["5", "7"], timeout_s=0.2) is False
    assert 0.2 <= time.monotonic() - t0 < 2
    assert fake.scancelled[0] == ["5", "7"]
    assert len(fake.scancelled) > 2 and all(ids == ["5"] for ids in fake.scancelled[1:])


def test_squeue_failing_is_no_answer_and_the_wait_goes_on(fake: FakeSlurm) -> None:
    fake.answers = [None, None, {"5": "CANCELLED"}]
    assert cancel_and_wait(["5"], timeout_s=5) is True
    assert fake.calls == 3
    fake.answers, fake.calls = [None], 0
    assert cancel_and_wait(["5"], timeout_s=0.1) is False  # never an answer: not "all gone"


def test_jobs_found_by_name_later_are_cancelled_and_busy_holds_the_wait(fake: FakeSlurm) -> None:
    # srun: job 9 appears under its name only after the first look; the local srun exits last.
    fake.answers = [{}, {"9": "RUNNING"}, {"9": "CANCELLED"}]
    polls = iter([True, True, False])  # asked only while squeue shows nothing alive
    assert cancel_and_wait([], timeout_s=5, names=["name-9"], busy=lambda: next(polls)) is True
    assert fake.scancelled == [["9"]]
    assert fake.calls == 4  # one more look after squeue showed the job gone: busy() still said so


# -- the real cluster -------------------------------------------------------------------------------
def _sbatch_sleep(name: str) -> str:
    argv = ["sbatch", "--parsable", f"--job-name={name}", "-t", "2", "-o", "/dev/null", "--wrap", "sleep 120"]
    return subprocess.run(argv, capture_output=True, text=True, timeout=30, check=True).stdout.strip()


def _states(job_ids: list[str]) -> list[str]:
    argv = ["squeue", "-h", "-t", "all", "-j", ",".join(job_ids), "-o", "%T"]
    return sorted(subprocess.run(argv, capture_output=True, text=True, timeout=30, check=True).stdout.split())


@pytest.mark.slurm
def test_cancels_real_jobs_by_id_and_by_name(slurm_cluster: SlurmCluster) -> None:
    prefix = f"orc-test-{uuid.uuid4().hex[:8]}"
    by_id = [_sbatch_sleep(f"{prefix}-a"), _sbatch_sleep(f"{prefix}-b")]
    by_name = _sbatch_sleep(f"{prefix}-c")
    before = dict(slurm_state.CLIENT.calls)
    t0 = time.monotonic()
    assert cancel_and_wait(by_id, timeout_s=30) is True
    assert cancel_and_wait([], timeout_s=30, names=[f"{prefix}-c"]) is True
    assert time.monotonic() - t0 < 15
    # every Slurm call went through the one counted client (cluster.client.CLIClient)
    assert slurm_state.CLIENT.calls["scancel"] >= before.get("scancel", 0) + 2
    assert slurm_state.CLIENT.calls["squeue"] >= before.get("squeue", 0) + 2
    assert _states([*by_id, by_name]) == ["CANCELLED"] * 3


@pytest.mark.slurm
def test_an_srun_still_waiting_for_its_allocation_is_stopped_with_sigterm(slurm_cluster: SlurmCluster,
                                                                         tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A stand-in ``srun`` that never reaches the controller (as one still asking for an allocation):
    squeue shows no job of its name, so the stop SIGTERMs it (which makes a real srun withdraw its
    request) instead of waiting ``cancel_timeout_s`` for a job that never comes and SIGKILLing it."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "srun").write_text("#!/bin/bash\nsleep 120\n")
    (fake / "srun").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}:{os.environ['PATH']}")
    ctx, _ = context(tmp_path)
    [spec] = tasks(1)
    runner = SlurmRunner(launcher="srun", cancel_timeout_s=20)
    session = runner.open(ctx, [spec])
    log = ctx.paths.task_log("infer", spec.task_id)
    Path(log).parent.mkdir(parents=True, exist_ok=True)
    job = Job(spec, 1, runner.get_command(spec, str(tmp_path / "spec.json"), {}, 1, log), log, {})
    try:
        assert session.submit([job]) == {}
        t0 = time.monotonic()
        session.cancel([job])
        ended, _ = poll_until_ended(session, [job], timeout_s=30)
        assert time.monotonic() - t0 < 10
        assert ended == {job: Exit(-1, "cancelled")}
        assert job.handle.proc.returncode == -signal.SIGTERM
    finally:
        session.close()
