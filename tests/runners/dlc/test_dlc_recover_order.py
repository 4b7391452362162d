"""``-r``'s order: the jobs it will adopt are kept before it stops the ones no task needs, so neither
a SIGKILL nor an error in the middle of those stops loses, duplicates or leaves a job running
(the DLC double; real orchestrator processes)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from dlc_helpers import (
    REPO,
    Double,
    dlc_runner,
    env_with_double,
    ledger,
    run_cli,
    run_dirs,
    start_cli,
    summary_rows,
    write_config,
)

#: the orchestrator's CLI with a fault at the -r step between keeping and stopping: the stop of the
#: jobs no task needs goes out, then raises (as writing its event would on a full disk)
FAULTY_CLI = """
import errno, runpy, sys
from orchestra.runners.core.recovery import NOT_NEEDED
from orchestra.runners.dlc.track import Tracker
real = Tracker.stop
def stop(self, handles, reason):
    real(self, handles, reason)
    if reason == NOT_NEEDED:
        raise OSError(errno.ENOSPC, "No space left on device (injected)")
Tracker.stop = stop
sys.argv = ["run.py", *sys.argv[1:]]
runpy.run_path("run.py", run_name="__main__")
"""


def two_models(folder: Path, other: str, job: str) -> Path:
    """Models ``det`` and ``other`` (``other``: more of its fields), one task each per stage."""
    cfg = write_config(folder, dlc_runner(folder), tasks=1, model=job)
    text = cfg.read_text()
    (line,) = [x for x in text.splitlines() if x.startswith("models = [")]
    det = line[len("models = ["):-1]  # dict(type=DeterministicModel, abbr='det', ...)
    more = det.replace("abbr='det'", "abbr='other'")[:-1] + other + ")"
    cfg.write_text(text.replace(line, f"models = [{det}, {more}]"))
    return cfg


def running(double: Double, count: int) -> list[str]:
    return double.wait_for(lambda: (lambda r: r if len(r) >= count else None)(
        [j for j, d in double.jobs().items() if d["Status"] == "Running"]), 30, f"{count} running DLC jobs")


def killed_leaving_two_jobs(double: Double, tmp_path: Path, job: str) -> tuple[Path, dict[str, str]]:
    """A run SIGKILLed while the infer jobs of ``det`` and ``other`` run: (run folder, model -> job id)."""
    proc = start_cli(double.state, two_models(tmp_path, "", job))
    try:
        running(double, 2)
    finally:
        proc.kill()
        proc.communicate(timeout=30)
    (run,) = run_dirs(tmp_path / "out")
    return run, {r["task_id"].split("_")[1]: r["job_id"] for r in ledger(run) if r["state"] == "submitted"}


def test_sigkill_while_resume_stops_an_unneeded_job_loses_and_duplicates_nothing(double: Double,
                                                                                 tmp_path: Path) -> None:
    """The second run (``other`` changed) is SIGKILLed by the double inside its ``dlc stop`` of
    ``other``'s old job, before that stop's outcome is recorded; a third run adopts ``det``'s job
    (not submitted again) and submits ``other`` once, and leaves nothing running."""
    run, old = killed_leaving_two_jobs(double, tmp_path, ", load_s=15")
    cfg = two_models(tmp_path, ", max_out_len=7", ", load_s=15")  # a new spec for other's task only
    double.faults(kill_caller_on_stop=True)
    res = run_cli(double.state, cfg, "-r")
    assert res.returncode == -9, res.stderr[-3000:]  # killed by the double, in the stop
    states = {r["job_id"]: r["state"] for r in ledger(run) if r.get("job_id")}
    assert states == {old["det"]: "submitted", old["other"]: "stop_sent"}
    double.faults()
    res = run_cli(double.state, cfg, "-r")
    assert res.returncode == 0, res.stderr[-3000:]
    assert summary_rows(run)[("rows", "numeric_match")] == {"det": 1.0, "other": 1.0}
    assert [r["job_id"] for r in ledger(run) if r["state"] == "adopted"] == [old["det"]]
    assert double.status(old["other"])["Status"] == "Stopped"
    assert len(double.calls("submit")) == 5  # 2 infer before the kill; other's infer, 2 eval after
    assert not double.alive()


def test_an_error_in_resumes_stops_still_stops_the_job_kept_for_adoption(double: Double, tmp_path: Path) -> None:
    """The stop of the unneeded job raises after it went out: the run fails, and the job kept for
    ``det``'s task (which no attempt took) is stopped by the launch's close, not left running."""
    run, old = killed_leaving_two_jobs(double, tmp_path, ", hang=True")
    cfg = two_models(tmp_path, ", max_out_len=7", ", hang=True")
    res = subprocess.run([sys.executable, "-c", FAULTY_CLI, str(cfg), "-r"], cwd=REPO, capture_output=True,
                         text=True, timeout=240, env=env_with_double(double.state))
    assert res.returncode != 0 and "No space left on device (injected)" in res.stderr, res.stderr[-3000:]
    assert double.status(old["other"])["Status"] == "Stopped"
    assert double.status(old["det"])["Status"] == "Stopped", "the job kept for adoption was left running"
    assert not double.alive()
    stops = [r for r in ledger(run) if r["state"] == "stopped"]
    assert sorted(r["job_id"] for r in stops) == sorted(old.values())


def test_a_job_that_ends_between_the_plan_and_the_look_is_adopted_not_submitted_again(double: Double,
                                                                                      tmp_path: Path) -> None:
    """``-r`` plans both infer tasks to do while their jobs still run; the jobs end before ``dlc get``
    answers its first look (a slow service): each task's attempt takes its job's end rather than
    paying for the task again."""
    run, old = killed_leaving_two_jobs(double, tmp_path, ", load_s=8")
    gets = lambda: double.counter("get")  # noqa: E731  (the double's count of `dlc get` calls)
    before = gets()
    double.faults(get_slow_s=12)  # each look now answers after the job ended (8 s of loading)
    proc = start_cli(double.state, two_models(tmp_path, "", ", load_s=8"), "-r")
    try:
        double.wait_for(lambda: gets() >= before + 2, 60, "-r's two looks at the jobs left")
        double.faults()  # the looks after those two answer at once
        _, err = proc.communicate(timeout=240)
    finally:
        proc.kill()
    assert proc.returncode == 0, err[-3000:]
    assert summary_rows(run)[("rows", "numeric_match")] == {"det": 1.0, "other": 1.0}
    adopted = [r for r in ledger(run) if r["state"] == "adopted"]
    assert sorted(r["job_id"] for r in adopted) == sorted(old.values())
    assert [d["Status"] for d in map(double.status, old.values())] == ["Succeeded", "Succeeded"]
    assert len(double.calls("submit")) == 4  # 2 infer before the kill, 2 eval after: no infer paid twice
    assert not double.alive()
