"""No DLC job is left behind: Ctrl-C, SIGTERM, timeouts and orchestrator errors stop every job this
run submitted; after a SIGKILL of the orchestrator, ``-r`` adopts or stops what it had submitted."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest
from dlc_helpers import Double, dlc_runner, events, ledger, run_cli, run_dirs, start_cli, summary_rows, write_config

from orchestra.events import EventLog
from orchestra.paths import RunPaths
from orchestra.runners import DLCRunner
from orchestra.runners.base import RunContext
from orchestra.runners.core.ledger import Ledger
from orchestra.runners.dlc.runner import dlc_job_name, spec_digest
from orchestra.tasks.spec import TaskSpec


def running_jobs(double: Double, count: int, timeout_s: float = 30) -> list[str]:
    return double.wait_for(lambda: [j for j, d in double.jobs().items() if d["Status"] == "Running"]
                           if len([d for d in double.jobs().values() if d["Status"] == "Running"]) >= count
                           else None, timeout_s, f"{count} running DLC jobs")


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 130)])
def test_a_signal_stops_every_job_within_seconds(double: Double, tmp_path: Path, sig: int, code: int) -> None:
    cfg = write_config(tmp_path, dlc_runner(tmp_path), tasks=3, model=", hang=True")
    proc = start_cli(double.state, cfg)
    try:
        jobs = running_jobs(double, 3)
        t0 = time.monotonic()
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=30)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == code, err[-2000:]
    # within seconds: each stop is a `dlc stop` and confirming `dlc get`s, one Python start each in the
    # double, which a loaded 2-core machine (load 7-14, a whole test suite beside) stretches to ~9 s
    assert took < 12, f"the signal took {took:.1f} s to stop the run and its jobs"
    assert not double.alive() and all(double.status(j)["Status"] == "Stopped" for j in jobs)
    (run,) = run_dirs(tmp_path / "out")
    stopped = {r["job_id"]: r for r in ledger(run) if r["state"] == "stopped"}
    assert set(stopped) == set(jobs)
    assert all(r["reason"] == "the run was stopped (Ctrl-C, SIGTERM or SIGHUP)" for r in stopped.values())
    assert {e["job_id"] for e in events(run) if e["event"] == "dlc_stopped" and e["confirmed"]} == set(jobs)
    assert err.count("CANCELLED: infer task") == 3
    log = (run / "logs/infer/infer_det_rows_0.log").read_text()
    assert "===== dlc: stopped job dlc" in log and "the service shows it Stopped" in log


def test_ctrl_c_with_fifty_dlc_jobs_returns_within_seconds_and_leaves_none(double: Double, tmp_path: Path) -> None:
    """50 jobs in flight: the stops go out together and are confirmed beside the loop; the CLI exits
    130 within seconds, the service shows every job over and the ledger records each stop."""
    cfg = write_config(tmp_path, dlc_runner(tmp_path, max_num_workers=64), tasks=50, model=", hang=True")
    proc = start_cli(double.state, cfg)
    try:
        double.wait_for(lambda: len(double.job_ids()) >= 50 or None, 120, "50 submitted DLC jobs")
        running_jobs(double, 2, timeout_s=120)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err[-2000:]
    assert took < 15, f"Ctrl-C took {took:.1f} s"
    jobs = double.job_ids()
    assert len(jobs) == 50 and not double.alive()
    (run,) = run_dirs(tmp_path / "out")
    assert {r["job_id"] for r in ledger(run) if r["state"] == "stopped"} == set(jobs)
    assert err.count("CANCELLED: infer task") == 50


def test_timeout_stops_the_job(double: Double, tmp_path: Path) -> None:
    cfg = write_config(tmp_path, dlc_runner(tmp_path, timeout_s=2.0, retry=0), tasks=1, model=", hang=True")
    res = run_cli(double.state, cfg)
    assert res.returncode == 1
    assert "FAILED: infer task infer_det_rows (timed out after 2 s)" in res.stderr
    (job,) = double.job_ids()
    assert double.status(job)["Status"] == "Stopped"
    (run,) = run_dirs(tmp_path / "out")
    assert [(r["state"], r.get("reason")) for r in ledger(run) if r["state"].startswith("stop")] == \
        [("stop_sent", "timeout_s"), ("stopped", "timeout_s")]


def test_an_orchestrator_error_stops_every_job(double: Double, tmp_path: Path) -> None:
    """An exception in the orchestrator (here: the progress display) ends the launch; no job stays."""
    cfg = write_config(tmp_path, dlc_runner(tmp_path), tasks=1)  # for the aliyun.json
    paths = RunPaths(str(tmp_path / "run"))
    paths.make_dirs()
    ctx = RunContext(paths, EventLog(paths.events))
    tasks = [TaskSpec(stage="infer", task_id=f"t{i}", run_dir=paths.root, model={}, model_abbr="m", units=())
             for i in range(2)]
    runner = DLCRunner(str(tmp_path / "aliyun.json"), poll_interval_s=0.1, max_calls_per_s=100,
                       template=["bash", "-c", "sleep 600", "x", "{task_cmd}"])

    def explode(counts: dict[str, int]) -> None:
        if len(double.alive()) == 2 and all(d["Status"] == "Running" for d in double.jobs().values()):
            raise RuntimeError("display broke")

    ctx.on_change = explode
    with pytest.raises(RuntimeError, match="display broke"):
        runner.launch(tasks, ctx)
    assert cfg.exists() and len(double.job_ids()) == 2 and not double.alive()
    reasons = {r["reason"] for r in ledger(Path(paths.root)) if r["state"] == "stopped"}
    assert reasons == {"orchestrator error: RuntimeError"}


def test_sigkill_then_resume_adopts_the_running_jobs(double: Double, tmp_path: Path) -> None:
    cfg = write_config(tmp_path, dlc_runner(tmp_path), tasks=3, model=", load_s=4")
    proc = start_cli(double.state, cfg)
    try:
        jobs = running_jobs(double, 3)
    finally:
        proc.kill()  # SIGKILL: nothing of the orchestrator runs any more
        proc.communicate(timeout=30)
    assert sorted(double.alive()) == sorted(jobs)  # cloud jobs outlive their orchestrator
    (run,) = run_dirs(tmp_path / "out")
    assert {r["job_id"] for r in ledger(run) if r["state"] == "submitted"} == set(jobs)  # recorded before use
    res = run_cli(double.state, cfg, "-r")
    assert res.returncode == 0, res.stderr[-3000:]
    assert summary_rows(run)[("rows", "numeric_match")] == {"det": 1.0}
    submits = double.calls("submit")
    assert len(submits) == 4  # 3 infer jobs before the kill, the eval job after: no duplicate
    adopted = [r for r in ledger(run) if r["state"] == "adopted"]
    assert sorted(r["job_id"] for r in adopted) == sorted(jobs)
    log = (run / "logs/infer/infer_det_rows_0.log").read_text()
    assert "===== dlc: adopted job dlc" in log and log.rstrip().endswith("task exit code 0")
    assert not double.alive()


def test_sigkill_then_resume_records_a_job_that_ended_meanwhile(double: Double, tmp_path: Path) -> None:
    """The job outlives the killed orchestrator and ends on its own: -r records its end in the ledger
    (so no later -r asks about it again) and reuses its outputs instead of running the task again."""
    cfg = write_config(tmp_path, dlc_runner(tmp_path), tasks=1, model=", load_s=1")
    proc = start_cli(double.state, cfg)
    try:
        (job,) = running_jobs(double, 1)
    finally:
        proc.kill()
        proc.communicate(timeout=30)
    double.wait_for(lambda: not double.alive(), 30, "the job to end on its own")
    res = run_cli(double.state, cfg, "-r")
    assert res.returncode == 0, res.stderr[-3000:]
    (run,) = run_dirs(tmp_path / "out")
    assert [r["status"] for r in ledger(run) if r["state"] == "ended" and r["job_id"] == job] == ["Succeeded"]
    assert len(double.calls("submit")) == 2  # the infer job before the kill, the eval job after


def test_sigkill_then_resume_with_another_config_stops_the_old_jobs(double: Double, tmp_path: Path) -> None:
    cfg = write_config(tmp_path, dlc_runner(tmp_path), tasks=2, model=", hang=True")
    proc = start_cli(double.state, cfg)
    try:
        old = running_jobs(double, 2)
    finally:
        proc.kill()
        proc.communicate(timeout=30)
    cfg = write_config(tmp_path, dlc_runner(tmp_path), tasks=2, model=", max_out_len=7")  # a new spec hash
    res = run_cli(double.state, cfg, "-r")
    assert res.returncode == 0, res.stderr[-3000:]
    assert all(double.status(j)["Status"] == "Stopped" for j in old) and not double.alive()
    (run,) = run_dirs(tmp_path / "out")
    stopped = [r for r in ledger(run) if r["state"] == "stopped" and r["job_id"] in old]
    assert len(stopped) == 2 and all("left by an earlier orchestrator" in r["reason"] for r in stopped)
    assert not [r for r in ledger(run) if r["state"] == "adopted"]
    names = list(double.names().values())
    assert len(names) == len(set(names)) == 5  # the new attempts are named on from the old ones (-a2)
    assert sorted(n.rsplit("-", 1)[1] for n in names) == ["a1", "a1", "a1", "a2", "a2"]


def test_an_interrupted_submission_is_reported_once(double: Double, tmp_path: Path) -> None:
    """A ledger that says 'submitting' and nothing more (killed inside ``dlc submit``): the job may
    exist without an id; -r says so once, and the task runs."""
    cfg = write_config(tmp_path, dlc_runner(tmp_path), tasks=1)
    res = run_cli(double.state, cfg, "--mode", "infer")
    assert res.returncode == 0, res.stderr[-3000:]
    (run,) = run_dirs(tmp_path / "out")
    task = TaskSpec(stage="eval", task_id="eval_det_rows", run_dir=str(run), model={}, model_abbr="m", units=())
    Ledger(str(run / "dlc")).record("submitting", dlc_job_name(task, 1), task_id="eval_det_rows", stage="eval",
                                    attempt=1, seq=1, digest=spec_digest(task))
    first = run_cli(double.state, cfg, "-r")
    assert first.returncode == 0, first.stderr[-3000:]
    assert first.stderr.count("was interrupted before its id was known") == 1
    second = run_cli(double.state, cfg, "-r", "--mode", "eval")
    assert "was interrupted before its id was known" not in second.stderr
    assert [r["state"] for r in ledger(run) if r["name"] == dlc_job_name(task, 1)][:2] == \
        ["submitting", "submit_unknown"]



def test_a_job_whose_record_cannot_be_written_is_stopped(double: Double, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The disk fills between ``dlc submit`` and recording its id: the attempt fails and its job,
    which the ledger could not record, is stopped at once rather than left running."""
    write_config(tmp_path, dlc_runner(tmp_path), tasks=1)  # for the aliyun.json
    paths = RunPaths(str(tmp_path / "run"))
    paths.make_dirs()
    ctx = RunContext(paths, EventLog(paths.events))
    task = TaskSpec(stage="infer", task_id="t0", run_dir=paths.root, model={}, model_abbr="m", units=())
    real = Ledger.record

    def record(self: Ledger, state: str, name: str, **fields: object) -> None:
        if state == "submitted":
            raise OSError(28, "No space left on device")
        real(self, state, name, **fields)

    monkeypatch.setattr(Ledger, "record", record)
    runner = DLCRunner(str(tmp_path / "aliyun.json"), poll_interval_s=0.1, max_calls_per_s=100,
                       template=["bash", "-c", "sleep 600", "x", "{task_cmd}"])
    (result,) = runner.launch([task], ctx)
    assert result.state.value == "failed" and "internal error: OSError" in result.reason
    (job,) = double.job_ids()
    assert double.status(job)["Status"] == "Stopped"
