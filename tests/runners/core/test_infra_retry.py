"""``Exit(infra=True)``: an attempt the platform ended is retried without spending the task's ``retry``,
at most ``infra_retry`` times per task; after that it counts like any failure."""

from __future__ import annotations

from pathlib import Path

import pytest
from fake_backend import HANG, FakeBackend, exits, infer_task, make_context

from orchestra.cluster.slurm import SlurmJobState
from orchestra.events import read_events
from orchestra.runners.base import Exit, Job, TaskState
from orchestra.runners.slurm.runner import SlurmRunner
from orchestra.runners.slurm.state import exit_of

INFRA = exits(1, reason="infra: node lost")


class InfraBackend(FakeBackend):
    """FakeBackend whose exits with a reason starting ``infra:`` are infrastructure failures."""

    def poll(self, job: Job) -> Exit | None:
        ended = super().poll(job)
        if ended is not None and ended.reason.startswith("infra:"):
            return Exit(ended.code, ended.reason, infra=True)
        return ended


def test_infra_failures_do_not_spend_retries(tmp_path: Path) -> None:
    ctx = make_context(tmp_path)
    backend = InfraBackend({"t": [INFRA, INFRA, exits(1), exits(0)]}, retry=1, max_num_workers=1, infra_retry=2)
    (result,) = backend.launch([infer_task("t")], ctx)
    assert (result.state, result.attempts) == (TaskState.DONE, 4)  # 2 infra + 1 failure (retry=1) + success
    retries = [e for e in read_events(ctx.paths.events) if e["event"] == "retry"]
    assert [e.get("infra", False) for e in retries] == [True, True, False]
    assert [e.get("infra_retries") for e in retries] == [1, 2, None]


def test_infra_budget_spent_then_counts_like_any_failure(tmp_path: Path) -> None:
    ctx = make_context(tmp_path)
    backend = InfraBackend({"t": [INFRA, INFRA, INFRA]}, retry=1, infra_retry=1)
    (result,) = backend.launch([infer_task("t")], ctx)
    # attempt 1: infra retry; attempt 2: budget spent, counts (retry=1 left); attempt 3: fails for good
    assert (result.state, result.attempts, result.reason) == (TaskState.FAILED, 3, "infra: node lost")
    log = Path(ctx.paths.task_log("infer", "t")).read_text()
    assert log.count("failed (infrastructure): infra: node lost") == 3


def test_no_infra_budget_by_default(tmp_path: Path) -> None:
    ctx = make_context(tmp_path)
    backend = InfraBackend({"t": [INFRA]})  # infra_retry=0 by default
    (result,) = backend.launch([infer_task("t")], ctx)
    assert (result.state, result.attempts) == (TaskState.FAILED, 1)


def test_infra_flag_on_a_success_is_ignored(tmp_path: Path) -> None:
    ctx = make_context(tmp_path)
    backend = InfraBackend({"t": [exits(0, reason="infra: odd")]}, retry=0, infra_retry=3)
    (result,) = backend.launch([infer_task("t")], ctx)
    assert (result.state, result.attempts) == (TaskState.DONE, 1)


def test_stop_during_infra_backoff_cancels(tmp_path: Path) -> None:
    ctx = make_context(tmp_path)
    script = {"t": [INFRA, exits(0)], "h": [HANG]}  # h keeps being polled until the stop
    backend = InfraBackend(script, ctx=ctx, stop_after_polls=4, retry_backoff_s=30.0, infra_retry=3)
    results = backend.launch([infer_task("t"), infer_task("h")], ctx)
    assert [(r.state, r.attempts) for r in results] == [(TaskState.CANCELLED, 1), (TaskState.CANCELLED, 1)]
    assert backend.submitted == [("t", 1), ("h", 1)]


class AtOnceBackend(InfraBackend):
    """A warm pool's view: a lost attempt goes to another worker at once, ahead of the queue."""

    infra_retry_at_once = True


def test_at_once_reruns_without_backoff_ahead_of_the_queue(tmp_path: Path) -> None:
    ctx = make_context(tmp_path)
    script = {"a": [INFRA, exits(0)], "b": [exits(0)], "c": [exits(0)]}
    backend = AtOnceBackend(script, max_num_workers=1, retry_backoff_s=60.0, infra_retry=1)
    results = backend.launch([infer_task(t) for t in script], ctx)
    assert [r.state for r in results] == [TaskState.DONE] * 3
    assert backend.submitted == [("a", 1), ("a", 2), ("b", 1), ("c", 1)]  # a's rerun did not wait 60 s
    (retry,) = [e for e in read_events(ctx.paths.events) if e["event"] == "retry"]
    assert (retry["infra"], retry["delay_s"]) == (True, 0.0)


def test_at_once_only_for_infrastructure_failures(tmp_path: Path) -> None:
    ctx = make_context(tmp_path)
    backend = AtOnceBackend({"t": [INFRA, exits(1), exits(0)]}, retry=1, retry_backoff_s=0.05, infra_retry=1)
    (result,) = backend.launch([infer_task("t")], ctx)
    assert (result.state, result.attempts) == (TaskState.DONE, 3)
    retries = [e for e in read_events(ctx.paths.events) if e["event"] == "retry"]
    assert [e["delay_s"] for e in retries][0] == 0.0 and retries[1]["delay_s"] >= 0.8 * 0.05 - 1e-3


class SlurmStateBackend(FakeBackend):
    """A backend whose jobs end in a Slurm state: an outcome's reason names it (``slurm:PREEMPTED``)
    and the Exit is what the Slurm backend makes of that state (``slurm_state.exit_of``)."""

    def poll(self, job: Job) -> Exit | None:
        ended = super().poll(job)
        if ended is not None and ended.reason.startswith("slurm:"):
            state = ended.reason.removeprefix("slurm:")
            return exit_of(SlurmJobState(f"7{job.attempt}", state, 15 if state != "COMPLETED" else 0), None, None)
        return ended


@pytest.mark.parametrize("state", ["PREEMPTED", "NODE_FAIL", "BOOT_FAIL"])
def test_a_preempted_slurm_job_does_not_spend_retry(tmp_path: Path, state: str) -> None:
    ctx = make_context(tmp_path)
    backend = SlurmStateBackend({"t": [exits(1, reason=f"slurm:{state}"), exits(0)]}, retry=0,
                                infra_retry=SlurmRunner().max_infra_retries)
    (result,) = backend.launch([infer_task("t")], ctx)
    assert (result.state, result.attempts) == (TaskState.DONE, 2)  # retry=0, and still a second attempt
    (retry,) = [e for e in read_events(ctx.paths.events) if e["event"] == "retry"]
    assert retry["infra"] is True and "Slurm job 71 " in retry["reason"]


def test_a_task_cancelled_in_slurm_still_spends_retry(tmp_path: Path) -> None:
    ctx = make_context(tmp_path)
    backend = SlurmStateBackend({"t": [exits(1, reason="slurm:CANCELLED")]}, retry=0, infra_retry=3)
    (result,) = backend.launch([infer_task("t")], ctx)
    assert (result.state, result.attempts) == (TaskState.FAILED, 1)
    assert "cancelled (scancel)" in result.reason
