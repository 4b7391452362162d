"""Two pieces of runners/core that backends share: stop-and-confirm (Slurm's scancel + squeue, DLC's
dlc stop + get) and the warm-pool policy (local workers, Ray actors)."""

from __future__ import annotations

from dataclasses import dataclass

from orchestra.cluster.confirm import stop_and_confirm
from orchestra.runners.core import warm


def test_stop_and_confirm_resends_to_a_job_still_running_but_not_to_one_ending() -> None:
    sent: list[list[str]] = []
    answers = iter([{"a": "RUNNING", "b": "STOPPING"}, {"a": "RUNNING", "b": "STOPPING"}, {"a": "RUNNING"}, {}])
    left = stop_and_confirm(["a", "b"], sent.append, lambda _: next(answers), timeout_s=5, resend_after_s=0.0,
                            poll_s=0.001, ending={"STOPPING"})
    assert left == {}
    assert sent[0] == ["a", "b"] and all(again == ["a"] for again in sent[1:]) and len(sent) == 4


def test_stop_and_confirm_names_what_it_never_saw_gone() -> None:
    assert stop_and_confirm(["a"], lambda _: None, lambda ids: dict.fromkeys(ids, "RUNNING"), timeout_s=0.05,
                            resend_after_s=10, poll_s=0.01) == {"a": "RUNNING"}
    assert stop_and_confirm(["a"], lambda _: None, lambda _: None, timeout_s=0.05, resend_after_s=10,
                            poll_s=0.01) is None  # never an answer: not "all gone"


def test_stop_and_confirm_stops_jobs_found_later_and_waits_while_busy() -> None:
    sent: list[list[str]] = []
    answers = iter([{"late": "PENDING"}, {}, {}])
    busy = iter([True, False])
    assert stop_and_confirm([], sent.append, lambda _: next(answers), timeout_s=5, resend_after_s=10, poll_s=0.001,
                            busy=lambda: next(busy)) == {}
    assert sent == [["late"]]


@dataclass
class W:
    key: str
    busy: bool = False
    ready: bool = True
    idle_since: float = 0.0


def test_warm_policy() -> None:
    old, recent, other, starting = W("m", idle_since=1), W("m", idle_since=5), W("n", idle_since=2), W("n", ready=False)
    workers = [old, recent, other, starting, W("m", busy=True, idle_since=9)]
    assert warm.pick(workers, "m") is recent and warm.pick(workers, "x") is None
    assert warm.victim(workers) is starting  # a worker still starting goes first, then the one idle longest
    assert warm.victim(workers, lambda key: key == "n") is old
    assert warm.victim([W("m", busy=True)]) is None
    # idle for the timeout since it was last wanted, or starting for nobody
    expired = warm.expired(workers, now=10, idle_timeout_s=6, wanted=lambda k: False, last_wanted={"n": 8})
    assert expired == [old, starting]


def test_a_background_stop_that_fails_is_reported_once_and_a_job_is_stopped_once() -> None:
    """A stop that raises (a cloud CLI that crashed) must reach the loop as the job's end, naming
    the error, not die in its thread leaving the job 'stopping' for ever; a second cancel of a job
    being stopped starts no second stop."""
    import threading
    import time

    from orchestra.runners.core.command import Command
    from orchestra.runners.core.contract import Exit, Job
    from orchestra.runners.core.stopping import BackgroundStops
    from orchestra.tasks.spec import TaskSpec

    task = TaskSpec(stage="infer", task_id="t", run_dir="/nonexistent", model={}, model_abbr="m", units=())
    job = Job(task, 1, Command(("true",)), "/nonexistent/t.log", {})
    stops = BackgroundStops("test")
    calls: list[int] = []
    release = threading.Event()

    def failing_stop(jobs: list[Job]) -> None:
        calls.append(len(jobs))
        release.wait(10)
        raise RuntimeError("dlc stop: connection reset")

    stops.start([job], failing_stop)
    stops.start([job], failing_stop)  # cancelled again while its stop runs
    assert stops.stopping(job) and stops.ended([job]) == {}
    release.set()
    deadline = time.monotonic() + 10
    while not (ended := stops.poll_each([job], lambda j: None)):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert ended == {job: Exit(-1, "cancelled; stopping it failed: RuntimeError: dlc stop: connection reset")}
    assert calls == [1] and stops.ended([job]) == {} and not stops.stopping(job)
    stops.wait(1)
