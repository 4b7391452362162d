"""The one scheduling loop (``BaseRunner.launch``), driven through a scripted in-process backend.

Every runner (local processes, warm workers, Slurm, ``--debug``) shares this loop; these tests pin
its contract with ``FakeBackend``, which runs nothing and decides each attempt's fate from a
script, so they need no processes, threads or sleeps and never depend on how fast the machine is.
Time is asserted only from below (a backoff or a timeout was waited for), never from above.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from fake_backend import (
    HANG,
    BackendFailure,
    FakeBackend,
    eval_task,
    exits,
    infer_task,
    make_context,
    submit_fails,
    write_output,
    writes,
)

from orchestra.events import read_events
from orchestra.runners.base import RunContext, TaskResult, TaskState
from orchestra.tasks.spec import output_done

OK = exits(0)


def by_id(results: list[TaskResult]) -> dict[str, TaskResult]:
    return {r.task_id: r for r in results}


def events_of(ctx: RunContext, task_id: str) -> list[dict[str, Any]]:
    return [e for e in read_events(ctx.paths.events) if e.get("task_id") == task_id]


def assert_slots_balanced(backend: FakeBackend) -> None:
    """Every slot ``acquire`` handed out came back through ``release`` exactly once."""
    assert sorted(backend.released) == backend.acquired
    assert sorted(backend.free_gpus) == list(range(backend.num_gpus))


# -- concurrency ---------------------------------------------------------------------------------
def test_max_num_workers_caps_running_jobs_and_is_reached(tmp_path: Path) -> None:
    ctx = make_context(tmp_path)
    script = {f"t{i}": [exits(0, polls=1 + i % 4)] for i in range(8)}
    backend = FakeBackend(script, max_num_workers=3)
    results = backend.launch([infer_task(t) for t in script], ctx)
    assert [(r.state, r.attempts) for r in results] == [(TaskState.DONE, 1)] * 8
    assert backend.peak_running == 3
    assert sorted(backend.submitted) == sorted((t, 1) for t in script)
    assert_slots_balanced(backend)


# -- retries -------------------------------------------------------------------------------------
def test_task_failing_twice_then_succeeding_is_done_after_three_attempts(tmp_path: Path) -> None:
    ctx = make_context(tmp_path)
    backend = FakeBackend({"t": [exits(3), exits(4, reason="CUDA error"), OK]}, retry=2)
    (result,) = backend.launch([infer_task("t")], ctx)
    assert (result.state, result.attempts, result.reason) == (TaskState.DONE, 3, "")
    assert backend.submitted == [("t", 1), ("t", 2), ("t", 3)]
    retries = [e for e in events_of(ctx, "t") if e["event"] == "retry"]
    assert [(e["attempt"], e["reason"]) for e in retries] == [(1, "exit code 3"), (2, "CUDA error")]
    log = Path(result.log_path).read_text()
    assert "attempt 1 failed: exit code 3" in log and "attempt 2 failed: CUDA error" in log
    assert_slots_balanced(backend)


def test_task_out_of_retries_fails_with_its_last_reason(tmp_path: Path) -> None:
    ctx = make_context(tmp_path)
    backend = FakeBackend({"t": [exits(3), exits(4)]}, retry=1)
    (result,) = backend.launch([infer_task("t")], ctx)
    assert (result.state, result.attempts, result.reason) == (TaskState.FAILED, 2, "exit code 4")
    assert backend.submitted == [("t", 1), ("t", 2)]
    assert [e["event"] for e in events_of(ctx, "t")][-1] == "failed"
    assert_slots_balanced(backend)


def test_retry_waits_its_doubling_backoff(tmp_path: Path) -> None:
    ctx = make_context(tmp_path)
    backoff_s = 0.05
    backend = FakeBackend({"a": [exits(1), exits(1), OK]}, retry=2, retry_backoff_s=backoff_s)
    (result,) = backend.launch([infer_task("a")], ctx)
    assert (result.state, result.attempts) == (TaskState.DONE, 3)
    # the delay is retry_backoff_s * 2**(attempt-1), jittered by +-20 %
    delays = [e["delay_s"] for e in events_of(ctx, "a") if e["event"] == "retry"]
    assert 0.8 * backoff_s - 1e-3 <= delays[0] <= 1.2 * backoff_s + 1e-3
    assert 0.8 * 2 * backoff_s - 1e-3 <= delays[1] <= 1.2 * 2 * backoff_s + 1e-3
    # ... and it was waited for: no attempt starts before its not_before
    assert backend.submit_times[("a", 2)] - backend.end_times[("a", 1)] >= delays[0] - 1e-3
    assert backend.submit_times[("a", 3)] - backend.end_times[("a", 2)] >= delays[1] - 1e-3


def test_backoff_holds_neither_the_loop_nor_a_worker(tmp_path: Path) -> None:
    """While ``a`` waits to retry, its worker goes to ``c`` and ``b`` is still polled to its end."""
    ctx = make_context(tmp_path)
    script = {"a": [exits(1), OK], "b": [exits(0, polls=3)], "c": [OK]}
    backend = FakeBackend(script, retry=1, retry_backoff_s=0.1, max_num_workers=2)
    results = backend.launch([infer_task(t) for t in script], ctx)
    assert [(r.state, r.attempts) for r in results] == [(TaskState.DONE, 2), (TaskState.DONE, 1), (TaskState.DONE, 1)]
    assert backend.submitted == [("a", 1), ("b", 1), ("c", 1), ("a", 2)]
    # b needs two more rounds after a's failure; a loop that slept through the backoff would
    # start a's 2nd attempt first
    assert backend.end_times[("b", 1)] < backend.submit_times[("a", 2)]


# -- timeouts ------------------------------------------------------------------------------------
def test_hanging_job_is_cancelled_once_reported_timed_out_and_retried(tmp_path: Path) -> None:
    ctx = make_context(tmp_path)
    backend = FakeBackend({"t": [HANG, OK]}, retry=1, timeout_s=0.02)
    (result,) = backend.launch([infer_task("t")], ctx)
    assert (result.state, result.attempts) == (TaskState.DONE, 2)
    assert backend.cancelled == [[("t", 1)]]
    # not cancelled before its limit, counted from the loop's mark, which is set at the submit: compared with
    # the backend's own clock read inside the submit, a loaded machine's scheduling put 1 ms between them once
    mark = backend.started_marks[("t", 1)]
    assert mark <= backend.submit_times[("t", 1)] and backend.cancel_times[("t", 1)] - mark >= 0.02
    (retry,) = [e for e in events_of(ctx, "t") if e["event"] == "retry"]
    assert retry["reason"] == "timed out after 0.02 s"
    assert_slots_balanced(backend)


def test_hanging_job_without_retries_fails_as_timed_out(tmp_path: Path) -> None:
    ctx = make_context(tmp_path)
    backend = FakeBackend({"t": [HANG], "u": [exits(0, polls=2)]}, timeout_s=0.02)
    results = by_id(backend.launch([infer_task("t"), infer_task("u")], ctx))
    assert (results["t"].state, results["t"].attempts) == (TaskState.FAILED, 1)
    assert results["t"].reason == "timed out after 0.02 s"
    assert results["u"].state == TaskState.DONE
    assert backend.cancelled == [[("t", 1)]]
    assert_slots_balanced(backend)


# -- cancellation --------------------------------------------------------------------------------
def test_stop_cancels_running_jobs_in_one_call_and_records_pending_tasks(tmp_path: Path) -> None:
    ctx = make_context(tmp_path)
    # round 1: t0, t1 start; t1 fails and backs off (10 s).  round 2: t2 starts; the 3rd poll sets stop.
    script = {"t0": [HANG], "t1": [exits(1)], "t2": [HANG], "t3": [HANG]}
    backend = FakeBackend(script, ctx=ctx, stop_after_polls=3, max_num_workers=2, retry=1, retry_backoff_s=10.0)
    results = by_id(backend.launch([infer_task(t) for t in script], ctx))
    assert backend.submitted == [("t0", 1), ("t1", 1), ("t2", 1)]
    assert backend.cancelled == [[("t0", 1), ("t2", 1)]]
    assert {t: (r.state, r.attempts, r.reason) for t, r in results.items()} == {
        "t0": (TaskState.CANCELLED, 1, "cancelled"),
        "t1": (TaskState.CANCELLED, 1, "cancelled before it started"),  # waiting for its 2nd attempt
        "t2": (TaskState.CANCELLED, 1, "cancelled"),
        "t3": (TaskState.CANCELLED, 0, "cancelled before it started"),
    }
    for t in script:
        assert [e["event"] for e in events_of(ctx, t)][-1] == "cancelled"
    assert backend.calls["close"] == 1
    assert_slots_balanced(backend)


def test_stop_set_before_launch_starts_nothing(tmp_path: Path) -> None:
    ctx = make_context(tmp_path)
    ctx.stop.set()
    backend = FakeBackend({"t0": [OK], "t1": [OK]})
    results = backend.launch([infer_task("t0"), infer_task("t1")], ctx)
    assert [(r.state, r.attempts) for r in results] == [(TaskState.CANCELLED, 0)] * 2
    assert backend.submitted == [] and backend.acquired == [] and "cancel" not in backend.calls
    assert backend.calls["close"] == 1


def test_stop_during_a_round_of_submits_cancels_that_round_and_starts_no_further_one(tmp_path: Path) -> None:
    """A Ctrl-C that lands while the loop submits (a slow ``sbatch`` call): the round's jobs went in
    one ``submit``; they are cancelled together and nothing more starts."""
    ctx = make_context(tmp_path)
    script = {"t0": [HANG], "t1": [HANG], "t2": [HANG], "t3": [HANG]}
    backend = FakeBackend(script, ctx=ctx, stop_on_submit="t0", max_num_workers=3)
    results = backend.launch([infer_task(t) for t in script], ctx)
    assert backend.submitted == [("t0", 1), ("t1", 1), ("t2", 1)]
    assert [r.state for r in results] == [TaskState.CANCELLED] * 4
    assert backend.cancelled == [[("t0", 1), ("t1", 1), ("t2", 1)]]
    assert [kind for kind, _ in backend.batches].count("submit") == 1
    assert_slots_balanced(backend)


def test_a_slow_cancel_does_not_hold_the_loop(tmp_path: Path) -> None:
    """``cancel`` returns at once: while a timed-out job is being stopped (its session reports it
    gone only many polls later) the other jobs are polled, end and are replaced."""
    ctx = make_context(tmp_path)
    script = {"slow": [HANG], "a": [exits(0, polls=3)], "b": [OK], "c": [OK]}
    backend = FakeBackend(script, ctx=ctx, max_num_workers=2, cancel_polls=50, timeout_s=0.05,
                          poll_interval_s=0.005)
    results = {r.task_id: r for r in backend.launch([infer_task(t) for t in script], ctx)}
    assert results["slow"].state == TaskState.FAILED and "timed out" in results["slow"].reason
    assert all(results[t].state == TaskState.DONE for t in "abc")
    ended = [backend.end_times[(t, 1)] for t in "bc"]
    assert max(ended) < backend.end_of_cancel, "the other jobs waited for the cancel to end"
    assert_slots_balanced(backend)


# -- resources -----------------------------------------------------------------------------------
def test_task_waits_for_a_taken_gpu_while_cpu_tasks_go_ahead(tmp_path: Path) -> None:
    ctx = make_context(tmp_path)
    script = {"g0": [exits(0, polls=3)], "g1": [exits(0, polls=3)], "c0": [exits(0, polls=2)]}
    tasks = [infer_task("g0", num_gpus=1), infer_task("g1", num_gpus=1), infer_task("c0")]
    backend = FakeBackend(script, gpus=1, max_num_workers=3)
    results = backend.launch(tasks, ctx)
    assert [r.state for r in results] == [TaskState.DONE] * 3
    assert backend.submitted == [("g0", 1), ("c0", 1), ("g1", 1)]
    assert backend.submit_times[("g1", 1)] >= backend.end_times[("g0", 1)]
    assert backend.trace.count(("acquire", "g1")) > 1  # asked, refused, asked again
    started = {e["task_id"]: e["resources"] for e in read_events(ctx.paths.events) if e["event"] == "started"}
    assert started["g0"]["gpus"] == [0] and started["g1"]["gpus"] == [0] and started["c0"]["gpus"] == []
    assert_slots_balanced(backend)


def test_unfit_task_fails_at_once_and_is_never_submitted(tmp_path: Path) -> None:
    ctx = make_context(tmp_path)
    backend = FakeBackend({"big": [OK], "small": [OK]}, gpus=1, retry=3)
    results = by_id(backend.launch([infer_task("big", num_gpus=2), infer_task("small", num_gpus=1)], ctx))
    assert (results["big"].state, results["big"].attempts) == (TaskState.FAILED, 0)
    assert results["big"].reason == "needs 2 GPU(s) but this runner has 1"
    assert results["small"].state == TaskState.DONE
    assert ("acquire", "big") not in backend.trace and backend.submitted == [("small", 1)]
    assert [e["event"] for e in events_of(ctx, "big")] == ["failed"]
    assert_slots_balanced(backend)


# -- start failures ------------------------------------------------------------------------------
def test_submit_oserror_is_a_failed_attempt_and_is_retried(tmp_path: Path) -> None:
    ctx = make_context(tmp_path)
    backend = FakeBackend({"t": [submit_fails("sbatch: not found"), OK]}, retry=1)
    (result,) = backend.launch([infer_task("t")], ctx)
    assert (result.state, result.attempts) == (TaskState.DONE, 2)
    events = events_of(ctx, "t")
    assert [e["event"] for e in events] == ["queued", "retry", "started", "done"]
    assert events[1]["reason"] == "could not start: sbatch: not found"
    assert_slots_balanced(backend)


def test_submit_oserror_without_retries_fails(tmp_path: Path) -> None:
    ctx = make_context(tmp_path)
    backend = FakeBackend({"t": [submit_fails("sbatch: not found")], "u": [OK]})
    results = by_id(backend.launch([infer_task("t"), infer_task("u")], ctx))
    assert (results["t"].state, results["t"].attempts) == (TaskState.FAILED, 1)
    assert results["t"].reason == "could not start: sbatch: not found"
    assert results["u"].state == TaskState.DONE
    assert_slots_balanced(backend)


# -- outputs -------------------------------------------------------------------------------------
def test_exit_zero_without_outputs_is_a_failure(tmp_path: Path) -> None:
    ctx = make_context(tmp_path)
    backend = FakeBackend({"t": [OK, OK]}, retry=1)
    (result,) = backend.launch([infer_task("t", ctx, shards=2)], ctx)
    assert (result.state, result.attempts) == (TaskState.FAILED, 2)
    assert result.reason == "exited 0 but did not write " + os.path.join("predictions", "m", "ds_0.jsonl")


def test_exit_zero_with_an_output_from_other_settings_is_a_failure(tmp_path: Path) -> None:
    ctx = make_context(tmp_path)
    task = infer_task("t", ctx, shards=2)
    (first, h0), (second, _) = task.outputs
    write_output(first, h0)
    write_output(second, "hash-of-an-older-config")
    (result,) = FakeBackend({"t": [OK]}).launch([task], ctx)
    assert result.state == TaskState.FAILED
    assert result.reason == "exited 0 but did not write " + os.path.join("predictions", "m", "ds_1.jsonl")


def test_exit_zero_with_every_output_written_is_done(tmp_path: Path) -> None:
    ctx = make_context(tmp_path)
    infer = infer_task("infer_t", ctx, shards=2)
    (result,) = FakeBackend({"infer_t": [writes(polls=2)]}).launch([infer], ctx)
    assert (result.state, result.attempts, result.reason) == (TaskState.DONE, 1, "")
    assert all(output_done(path, h) for path, h in infer.outputs)
    # the eval stage's results file (.json, hash as a key) counts the same way
    ev = eval_task("eval_t", ctx, inputs=tuple(infer.outputs))
    (result,) = FakeBackend({"eval_t": [writes()]}).launch([ev], ctx)
    assert result.state == TaskState.DONE


def test_eval_task_with_missing_or_stale_predictions_is_skipped_unsubmitted(tmp_path: Path) -> None:
    ctx = make_context(tmp_path)
    shard0, shard1 = ctx.paths.predictions("m", "ds", 0), ctx.paths.predictions("m", "ds", 1)
    write_output(shard0, "h0")
    tasks = [
        eval_task("missing", ctx, inputs=((shard0, "h0"), (shard1, "h1"))),
        eval_task("stale", ctx, inputs=((shard0, "h0-of-another-model"),)),
        eval_task("ready", ctx, inputs=((shard0, "h0"),)),
    ]
    backend = FakeBackend({"missing": [OK], "stale": [OK], "ready": [writes()]}, retry=2)
    results = by_id(backend.launch(tasks, ctx))
    assert (results["missing"].state, results["missing"].attempts) == (TaskState.SKIPPED, 0)
    assert results["missing"].reason == "predictions missing: " + os.path.join("predictions", "m", "ds_1.jsonl")
    assert results["stale"].state == TaskState.SKIPPED
    assert results["stale"].reason == "predictions missing: " + os.path.join("predictions", "m", "ds_0.jsonl")
    assert results["ready"].state == TaskState.DONE
    assert backend.submitted == [("ready", 1)]
    assert [t for method, t in backend.trace if method in ("acquire", "submit")] == ["ready", "ready"]
    assert [e["event"] for e in events_of(ctx, "missing")] == ["skipped"]


# -- flush, close, exceptions --------------------------------------------------------------------
def test_each_round_submits_its_jobs_in_one_call_and_polls_every_job_once(tmp_path: Path) -> None:
    ctx = make_context(tmp_path)
    script = {"a": [exits(1), exits(0, polls=2)], "b": [exits(0, polls=3)], "c": [OK], "d": [exits(0, polls=2)]}
    backend = FakeBackend(script, max_num_workers=2, retry=1)
    results = backend.launch([infer_task(t) for t in script], ctx)
    assert [r.state for r in results] == [TaskState.DONE] * 4
    assert backend.trace[-1] == ("close", "") and backend.calls["close"] == 1
    assert backend.batches[0] == ("submit", ["a", "b"])  # the first round's two jobs, together
    assert backend.batches[1] == ("poll", ["a", "b"])
    for kind, ids in backend.batches:
        assert len(ids) == len(set(ids)) and len(ids) <= 2, (kind, ids)
    assert backend.calls["poll"] == sum(len(ids) for kind, ids in backend.batches if kind == "poll")


# (method, which call raises): with the script below, each is reached once the loop is under way
RAISING = [("acquire", 2), ("submit", 2), ("flush", 2), ("poll", 2), ("release", 1),
           ("cancel", 1), ("release", 3)]  # the last two: inside launch's own clean-up after stop


def _raising_launch(tmp_path: Path, method: str, n: int) -> FakeBackend:
    """Round 1 starts t0 and t1; t0 ends in round 2, t2 starts in round 3 and its poll sets stop."""
    ctx = make_context(tmp_path)
    script = {"t0": [exits(0, polls=2)], "t1": [HANG], "t2": [OK]}
    backend = FakeBackend(script, ctx=ctx, stop_after_polls=6, max_num_workers=2, raise_on={method: n})
    with pytest.raises(BackendFailure, match=f"fake {method} failure"):
        backend.launch([infer_task(t) for t in script], ctx)
    return backend


@pytest.mark.parametrize(("method", "n"), RAISING, ids=[f"{m}{n}" for m, n in RAISING])
def test_close_is_called_once_even_when_a_backend_method_raises(tmp_path: Path, method: str, n: int) -> None:
    backend = _raising_launch(tmp_path, method, n)
    assert backend.calls[method] >= n  # the n-th call raised: the failure did happen
    assert backend.calls.get("close") == 1


@pytest.mark.parametrize("method", ["submit", "flush", "poll"])
def test_slots_come_back_and_jobs_stop_when_a_backend_method_raises(tmp_path: Path, method: str) -> None:
    backend = _raising_launch(tmp_path, method, 2)
    assert backend.running == set()  # every job it started was cancelled
    assert_slots_balanced(backend)


# -- the event log -------------------------------------------------------------------------------
def test_events_of_a_task_retried_once(tmp_path: Path) -> None:
    ctx = make_context(tmp_path)
    backend = FakeBackend({"t": [exits(2), OK]}, retry=1)
    backend.launch([infer_task("t")], ctx)
    events = events_of(ctx, "t")
    assert [(e["event"], e.get("attempt")) for e in events] == [
        ("queued", None), ("started", 1), ("retry", 1), ("started", 2), ("done", 2),
    ]
    assert events[2]["reason"] == "exit code 2"
    assert events[1]["log"] == events[3]["log"] == ctx.paths.task_log("infer", "t")
    assert all(e["stage"] == "infer" for e in events)
