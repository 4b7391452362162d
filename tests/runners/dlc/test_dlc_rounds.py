"""DLCRunner on the one loop's contract: ``submit`` submits the round's attempts itself, one ``poll``
starts a look at every due job (in the session's pool, no thread of its own per job) and never
waits on the CLI, ``cancel`` returns at once and ``poll`` reports each stopped job."""

from __future__ import annotations

import time
from pathlib import Path

from dlc_helpers import Double, dlc_runner, write_config
from helpers import poll_until_ended

from orchestra.events import EventLog
from orchestra.paths import RunPaths
from orchestra.runners import DLCRunner
from orchestra.runners.core.contract import Exit, Job
from orchestra.runners.core.run import RunContext
from orchestra.tasks.spec import TaskSpec

INTERVAL_S = 3.0


def wait_for_calls(double: Double, verb: str, count: int, timeout_s: float = 10.0) -> int:
    """How many ``verb`` calls the double saw, once there are ``count`` (or ``timeout_s`` passed)."""
    deadline = time.monotonic() + timeout_s
    while len(double.calls(verb)) < count and time.monotonic() < deadline:
        time.sleep(0.05)
    return len(double.calls(verb))


def test_submit_poll_and_cancel_are_rounds_of_the_loop(double: Double, tmp_path: Path) -> None:
    write_config(tmp_path, dlc_runner(tmp_path), tasks=1)  # for the aliyun.json
    paths = RunPaths(str(tmp_path / "run"))
    paths.make_dirs()
    ctx = RunContext(paths, EventLog(paths.events))
    tasks = [TaskSpec(stage="infer", task_id=f"t{i}", run_dir=paths.root, model={}, model_abbr="m", units=())
             for i in range(3)]
    runner = DLCRunner(str(tmp_path / "aliyun.json"), poll_interval_s=INTERVAL_S, max_poll_interval_s=INTERVAL_S,
                       max_calls_per_s=100, template=["bash", "-c", "sleep 600", "x", "{task_cmd}"])
    session = runner.open(ctx, tasks)
    try:
        jobs = [Job(t, 1, runner.get_command(t, paths.task_spec(t.task_id), {}, 1), paths.task_log("infer", t.task_id),
                    {}) for t in tasks]
        assert session.submit(jobs) == {}
        assert len(double.job_ids()) == 3 and len(double.calls("submit")) == 3  # submitted by the call itself
        assert not double.calls("get")  # nothing looks at a job between two rounds
        time.sleep(INTERVAL_S + 0.3)  # every job is due
        assert session.poll(jobs) == {}
        assert wait_for_calls(double, "get", 3) == 3  # one round: one look at each job (made off the loop)
        assert session.poll(jobs) == {} and len(double.calls("get")) == 3  # none due again yet
        t0 = time.monotonic()
        session.cancel(jobs)
        assert time.monotonic() - t0 < 1.0  # the stops run beside the loop
        ended: dict[Job, Exit] = {}
        deadline = time.monotonic() + 60
        while len(ended) < 3 and time.monotonic() < deadline:
            ended.update(session.poll(jobs))
            time.sleep(0.05)
        assert set(ended) == set(jobs) and all(e.code == -1 and e.reason == "cancelled" for e in ended.values())
        assert not double.alive()
    finally:
        session.close()
    assert not double.alive()


def test_poll_never_waits_on_a_slow_dlc_get(double: Double, tmp_path: Path) -> None:
    """Each ``dlc get job`` takes 3 s: every poll still returns at once, the jobs end all the same."""
    write_config(tmp_path, dlc_runner(tmp_path), tasks=1)
    paths = RunPaths(str(tmp_path / "run"))
    paths.make_dirs()
    ctx = RunContext(paths, EventLog(paths.events))
    tasks = [TaskSpec(stage="infer", task_id=f"t{i}", run_dir=paths.root, model={}, model_abbr="m", units=())
             for i in range(2)]
    runner = DLCRunner(str(tmp_path / "aliyun.json"), poll_interval_s=0.2, max_poll_interval_s=0.2,
                       max_calls_per_s=100, log_settle_s=0.2, template=["bash", "-c", "exit 3", "x", "{task_cmd}"])
    session = runner.open(ctx, tasks)
    try:
        jobs = [Job(t, 1, runner.get_command(t, paths.task_spec(t.task_id), {}, 1), paths.task_log("infer", t.task_id),
                    {}) for t in tasks]
        assert session.submit(jobs) == {}
        double.faults(get_slow_s=3.0)
        ended, slowest = poll_until_ended(session, jobs)
        assert slowest < 1.0, slowest  # a blocking poll takes 3 s (a get) in the rounds that look
        assert len(double.calls("get")) >= 2  # the looks did happen, slowly
        assert set(ended) == set(jobs) and all(e.code == 3 for e in ended.values()), ended
    finally:
        session.close()
    assert not double.alive()
