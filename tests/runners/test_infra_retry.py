"""``Exit(infra=True)``: an attempt the platform ended is retried without spending the task's ``retry``,
at most ``max_infra_retries`` times per task; after that it counts like any failure."""

from __future__ import annotations

from pathlib import Path

from fake_backend import HANG, FakeBackend, exits, infer_task, make_context

from orchestra.events import read_events
from orchestra.runners.base import Exit, Job, TaskState

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
    backend = InfraBackend({"t": [INFRA, INFRA, exits(1), exits(0)]}, retry=1, max_num_workers=1)
    backend.max_infra_retries = 2
    (result,) = backend.launch([infer_task("t")], ctx)
    assert (result.state, result.attempts) == (TaskState.DONE, 4)  # 2 infra + 1 failure (retry=1) + success
    retries = [e for e in read_events(ctx.paths.events) if e["event"] == "retry"]
    assert [e.get("infra", False) for e in retries] == [True, True, False]
    assert [e.get("infra_retries") for e in retries] == [1, 2, None]


def test_infra_budget_spent_then_counts_like_any_failure(tmp_path: Path) -> None:
    ctx = make_context(tmp_path)
    backend = InfraBackend({"t": [INFRA, INFRA, INFRA]}, retry=1)
    backend.max_infra_retries = 1
    (result,) = backend.launch([infer_task("t")], ctx)
    # attempt 1: infra retry; attempt 2: budget spent, counts (retry=1 left); attempt 3: fails for good
    assert (result.state, result.attempts, result.reason) == (TaskState.FAILED, 3, "infra: node lost")
    log = Path(ctx.paths.task_log("infer", "t")).read_text()
    assert log.count("failed (infrastructure): infra: node lost") == 3


def test_no_infra_budget_by_default(tmp_path: Path) -> None:
    ctx = make_context(tmp_path)
    backend = InfraBackend({"t": [INFRA]})  # BaseRunner.max_infra_retries = 0
    (result,) = backend.launch([infer_task("t")], ctx)
    assert (result.state, result.attempts) == (TaskState.FAILED, 1)


def test_infra_flag_on_a_success_is_ignored(tmp_path: Path) -> None:
    ctx = make_context(tmp_path)
    backend = InfraBackend({"t": [exits(0, reason="infra: odd")]}, retry=0)
    backend.max_infra_retries = 3
    (result,) = backend.launch([infer_task("t")], ctx)
    assert (result.state, result.attempts) == (TaskState.DONE, 1)


def test_stop_during_infra_backoff_cancels(tmp_path: Path) -> None:
    ctx = make_context(tmp_path)
    script = {"t": [INFRA, exits(0)], "h": [HANG]}  # h keeps being polled until the stop
    backend = InfraBackend(script, ctx=ctx, stop_after_polls=4, retry_backoff_s=30.0)
    backend.max_infra_retries = 3
    results = backend.launch([infer_task("t"), infer_task("h")], ctx)
    assert [(r.state, r.attempts) for r in results] == [(TaskState.CANCELLED, 1), (TaskState.CANCELLED, 1)]
    assert backend.submitted == [("t", 1), ("h", 1)]
