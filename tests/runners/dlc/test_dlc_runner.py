"""DLCRunner through the real CLI against the double: results, logs, and every fault of the contract."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from dlc_helpers import (
    Double,
    aliyun_cfg,
    dlc_runner,
    events,
    ledger,
    predictions,
    run_cli,
    run_dirs,
    summary_rows,
    write_aliyun_file,
    write_config,
)

REPO = Path(__file__).resolve().parents[3]
MANY_LINES = ["bash", "-c", 'seq 1 5000 | sed s/^/line-/; printf "tab\\there\\n"; exec "$@"', "x", "{task_cmd}"]


def only_run(folder: Path) -> Path:
    (run,) = run_dirs(folder / "out")
    return run


def task_events(run: Path, event: str) -> list[dict]:
    return [e for e in events(run) if e["event"] == event]


# -- results ----------------------------------------------------------------------------------------
def test_demo_through_dlc_equals_local_runner(double: Double, tmp_path: Path) -> None:
    """configs/eval_demo.py with --dlc (an aliyun config file, as OpenCompass users pass it) gives the
    very same predictions and table as with its own LocalRunner."""
    aliyun = write_aliyun_file(tmp_path, dlc_sleep_time=0.2)
    res = run_cli(double.state, "configs/eval_demo.py", "--dlc", "--aliyun-cfg", aliyun, "-w", tmp_path / "dlc")
    assert res.returncode == 0, res.stderr[-3000:]
    local = run_cli(double.state, "configs/eval_demo.py", "-w", tmp_path / "local")
    assert local.returncode == 0, local.stderr[-3000:]
    (dlc_run,), (local_run,) = run_dirs(tmp_path / "dlc"), run_dirs(tmp_path / "local")
    assert summary_rows(dlc_run) == summary_rows(local_run)
    assert predictions(dlc_run) == predictions(local_run)
    names = double.names()
    assert len(names) == 4 and all(n.startswith("orc-") for n in names.values())  # 2 infer + 2 eval jobs
    assert not double.alive() and not double.calls("stop")  # the eval stage beside infer stopped nothing
    assert {e["state"] for e in ledger(dlc_run)} == {"submitting", "submitted", "ended"}
    started = [e for e in events(dlc_run) if e["event"] == "started"]
    assert all(e["where"]["dlc_job_name"] in names.values() for e in started)
    for spec in map(double.spec, double.job_ids()):
        flags = spec["flags"]
        assert (flags["workspace_id"], flags["resource_id"], flags["data_sources"]) == ("ws1", "quota1", "d-shared")
        assert flags["config"].endswith("dlc config.ini")
    saved = (dlc_run / "config.py").read_text()
    assert "orchestra.runners.dlc.DLCRunner" in saved and "quota1" in saved


def test_gpus_cpus_memory_and_the_older_client(double: Double, tmp_path: Path) -> None:
    (tmp_path / "aliyun.json").write_text(json.dumps(aliyun_cfg(tmp_path, dlc_job_cmd="create", priority=4)))
    cfg = write_config(tmp_path, dlc_runner(tmp_path), tasks=1, gpus=2)
    res = run_cli(double.state, cfg)
    assert res.returncode == 0, res.stderr[-3000:]
    flags = {double.spec(j)["flags"]["name"].split("-", 2)[2]: double.spec(j)["flags"] for j in double.job_ids()}
    infer, ev = flags["infer_det_rows-a1"], flags["eval_det_rows-a1"]
    assert (infer["worker_gpu"], infer["worker_cpu"], infer["worker_memory"]) == ("2", "16", "256Gi")
    assert (ev["worker_gpu"], ev["worker_cpu"], ev["worker_memory"]) == ("0", "12", "192Gi")
    assert infer["kind"] == "PyTorchJob" and infer["worker_count"] == "1" and infer["priority"] == "4"
    assert {c["verb"] for c in double.calls("create")} == {"create job"}


def test_paths_with_spaces_quotes_and_dollars(double: Double, tmp_path: Path) -> None:
    folder = tmp_path / "a b'c $HOME; d"
    folder.mkdir()
    cfg = write_config(folder, dlc_runner(folder), tasks=2)
    res = run_cli(double.state, cfg)
    assert res.returncode == 0, res.stderr[-3000:]
    assert summary_rows(only_run(folder))[("rows", "numeric_match")] == {"det": 1.0}


@pytest.mark.parametrize("skew_s", [-30.0, 30.0])
def test_logs_are_copied_whole_and_once(double: Double, tmp_path: Path, skew_s: float) -> None:
    """5,000 lines in one second (the CLI caps an answer at 2,000), ingested 0.4 s late, on a service
    whose clock is 30 s off ours: the task log holds each line once, in order, up to the last."""
    double.faults(log_lag_s=0.4, skew_s=skew_s)
    cfg = write_config(tmp_path, dlc_runner(tmp_path, log_settle_s=1.0, template=MANY_LINES), tasks=1,
                       model=", load_s=1.5")
    res = run_cli(double.state, cfg)
    assert res.returncode == 0, res.stderr[-3000:]
    log = (only_run(tmp_path) / "logs/infer/infer_det_rows.log").read_text().splitlines()
    numbered = [line for line in log if line.startswith("line-")]
    assert numbered == [f"line-{i}" for i in range(1, 5001)]
    assert "tab\there" in log
    end = log.index("===== orchestra: task exited with code 0")
    assert log[end - 1] == "[infer_det_rows] done" and log[end + 1].startswith("===== dlc: job dlc")
    assert "ended Succeeded" in log[end + 1]
    logs_calls = double.calls("logs")
    assert any(c["argv"][c["argv"].index("--max_events_num") + 1] == "100000" for c in logs_calls)


# -- faults -------------------------------------------------------------------------------------------
def test_failing_and_garbled_submits_are_retried_without_spending_retries(double: Double, tmp_path: Path) -> None:
    double.faults(rules=[{"match": "rows_0", "times": 2, "submit": "fail"},
                         {"match": "rows_1", "times": 1, "submit": "garbled"}])
    cfg = write_config(tmp_path, dlc_runner(tmp_path, retry=0), tasks=2)
    res = run_cli(double.state, cfg)
    assert res.returncode == 0, res.stderr[-3000:]
    run = only_run(tmp_path)
    done = {e["task_id"]: e["attempt"] for e in task_events(run, "done")}
    assert done == {"infer_det_rows_0": 3, "infer_det_rows_1": 2, "eval_det_rows": 1}
    retries = task_events(run, "retry")
    assert len(retries) == 3 and all(e["infra"] for e in retries)
    assert any("no job id" in e["reason"] for e in retries)
    assert any("[FAILED] code: 500" in e["reason"] for e in retries)
    assert len(task_events(run, "dlc_submit_failed")) == 3
    assert Counter(c["verb"] for c in double.calls("submit"))["submit pytorchjob"] == 6  # 3 tasks + 3 failed
    assert len(double.job_ids()) == 3 and not double.alive()


def test_transient_get_answers_are_tolerated(double: Double, tmp_path: Path) -> None:
    double.faults(get_ok_prefix=True, get_garbled_every=3, get_failed_every=4)
    cfg = write_config(tmp_path, dlc_runner(tmp_path, retry=0, infra_retry=0), tasks=3, model=", load_s=1")
    res = run_cli(double.state, cfg)
    assert res.returncode == 0, res.stderr[-3000:]
    run = only_run(tmp_path)
    assert not task_events(run, "retry") and len(task_events(run, "done")) == 4
    assert len(double.job_ids()) == 4


def test_failing_log_reads_are_read_again_not_the_tasks_failure(double: Double, tmp_path: Path) -> None:
    """Regression: a ``dlc logs`` failing while the job ran ended the attempt as an internal error
    (and stopped its job); the same windows are now read again at the next look."""
    double.faults(logs_failed_every=2)
    cfg = write_config(tmp_path, dlc_runner(tmp_path, retry=0, infra_retry=0), tasks=1, model=", load_s=2")
    res = run_cli(double.state, cfg)
    assert res.returncode == 0, res.stderr[-3000:]
    run = only_run(tmp_path)
    assert not task_events(run, "retry") and len(double.job_ids()) == 2
    log = (run / "logs/infer/infer_det_rows.log").read_text().splitlines()
    assert log.count("[infer_det_rows] done") == log.count("===== orchestra: task exited with code 0") == 1
    # every 2nd read failed (two jobs read at least once each: at least one failure, however few looks
    # a loaded machine makes), and every failure was read again: both logs are whole
    assert double.counter("logs_failed") >= 1
    eval_log = (run / "logs/eval/eval_det_rows.log").read_text().splitlines()
    assert eval_log.count("===== orchestra: task exited with code 0") == 1


def test_a_failing_log_read_after_the_job_ended_is_read_again(double: Double, tmp_path: Path) -> None:
    """Regression: a ``dlc logs`` failing once the job had ended concluded the attempt without the
    rest of its log (the task's own lines and its exit line lost from the task log); the same
    window is now read again until it answers."""
    double.faults(logs_failed_after_end=3)
    cfg = write_config(tmp_path, dlc_runner(tmp_path, retry=0, infra_retry=0), tasks=1)
    res = run_cli(double.state, cfg)
    assert res.returncode == 0, res.stderr[-3000:]
    run = only_run(tmp_path)
    assert double.counter("logs_after_end") > 3  # three failed, then read
    for log in ("infer/infer_det_rows", "eval/eval_det_rows"):
        lines = (run / f"logs/{log}.log").read_text().splitlines()
        assert lines.count("===== orchestra: task exited with code 0") == 1, lines
        assert not any("could not read the job's log" in line for line in lines), lines
    assert "[infer_det_rows] done" in (run / "logs/infer/infer_det_rows.log").read_text().splitlines()


def test_a_log_service_that_keeps_failing_ends_the_attempt_on_its_exit_code(double: Double, tmp_path: Path) -> None:
    """The final window is tried again for ``lost_after_s`` at most (30 s if that is longer): then the
    attempt ends on the job's state and exit code file, and the log says what could not be read."""
    double.faults(logs_failed_after_end=10_000)
    cfg = write_config(tmp_path, dlc_runner(tmp_path, retry=0, infra_retry=0, lost_after_s=1.5), tasks=1)
    res = run_cli(double.state, cfg)
    assert res.returncode == 0, res.stderr[-3000:]
    lines = (only_run(tmp_path) / "logs/infer/infer_det_rows.log").read_text().splitlines()
    (gave_up,) = [line for line in lines if line.startswith("===== dlc: could not read the job's log")]
    assert gave_up.startswith("===== dlc: could not read the job's log for 1.5 s: dlc logs "), gave_up
    assert lines[-1].startswith("===== dlc: job ") and lines[-1].endswith("ended Succeeded (JobSucceeded: Job "
                                                                         "succeeded), task exit code 0"), lines


def test_a_log_service_that_keeps_failing_is_reported_once_however_long_the_drain(double: Double,
                                                                                   tmp_path: Path) -> None:
    """Regression: once the final window had been given up on, each further look of the drain (one
    a second until two settle periods have passed) wrote the same 'could not read' line again."""
    double.faults(logs_failed_after_end=10_000)
    runner = dlc_runner(tmp_path, retry=0, infra_retry=0, lost_after_s=1.0, log_settle_s=4.0)
    res = run_cli(double.state, write_config(tmp_path, runner, tasks=1))
    assert res.returncode == 0, res.stderr[-3000:]
    lines = (only_run(tmp_path) / "logs/infer/infer_det_rows.log").read_text().splitlines()
    assert len([line for line in lines if line.startswith("===== dlc: could not read the job's log")]) == 1, lines
    assert lines[-1].endswith("task exit code 0"), lines


def test_a_job_stuck_in_the_queue_is_stopped_and_resubmitted(double: Double, tmp_path: Path) -> None:
    double.faults(rules=[{"match": "rows_1", "times": 1, "queue_s": 3600}])
    cfg = write_config(tmp_path, dlc_runner(tmp_path, queue_timeout_s=1.0), tasks=2)
    res = run_cli(double.state, cfg)
    assert res.returncode == 0, res.stderr[-3000:]
    run = only_run(tmp_path)
    (retry,) = task_events(run, "retry")
    assert retry["infra"] and "still Queuing after queue_timeout_s=1 s; stopped it" in retry["reason"]
    (stopped,) = task_events(run, "dlc_stopped")
    assert stopped["reason"].startswith("queue_timeout_s") and stopped["status"] == "Stopped"
    assert [s["Status"] for s in double.jobs().values()].count("Stopped") == 1
    states = [r["state"] for r in ledger(run) if r["job_id"] == stopped["job_id"]]
    assert states == ["submitted", "stop_sent", "stopped"]


def test_queue_timeouts_fail_the_task_once_the_budget_is_spent(double: Double, tmp_path: Path) -> None:
    double.faults(rules=[{"match": "infer", "queue_s": 3600}])
    cfg = write_config(tmp_path, dlc_runner(tmp_path, queue_timeout_s=0.5, infra_retry=1, retry=0), tasks=1)
    res = run_cli(double.state, cfg)
    assert res.returncode == 1
    assert "FAILED: infer task infer_det_rows (DLC job dlc" in res.stderr
    assert "still Queuing after queue_timeout_s=0.5 s; stopped it" in res.stderr
    assert len(double.job_ids()) == 2 and not double.alive()  # one infra retry, then failed; eval skipped


def test_a_job_the_service_stops_answering_for_is_lost_and_stopped(double: Double, tmp_path: Path) -> None:
    """``dlc get job`` failing for ``lost_after_s``: the job counts as lost (an infrastructure exit), is
    stopped, and a stop no answer confirms is recorded and named as such."""
    double.faults(get_failed_every=1)
    cfg = write_config(tmp_path, dlc_runner(tmp_path, lost_after_s=1.0, cancel_timeout_s=1.0, infra_retry=0, retry=0),
                       tasks=1, model=", hang=True")
    res = run_cli(double.state, cfg)
    assert res.returncode == 1
    (job,) = double.job_ids()
    assert f"FAILED: infer task infer_det_rows (DLC job {job} lost: dlc get job failed for 1 s" in res.stderr
    assert f"DLC job(s) {job} not shown over 1 s after 'dlc stop job --force'" in res.stderr
    run = only_run(tmp_path)
    stops = [(r["state"], r.get("reason")) for r in ledger(run) if r["state"].startswith("stop")]
    assert stops[:2] == [("stop_sent", "lost: dlc get job kept failing"),
                         ("stop_unconfirmed", "lost: dlc get job kept failing")]
    double.wait_for(lambda: not double.alive(), 30, "the stopped job to end")  # the stop was sent


@pytest.mark.parametrize("fault", [{"preempt_after_s": 0.6, "reason_code": "PodPreempted"}, {"env_fail": True}])
def test_platform_failures_are_retried_without_spending_retries(double: Double, tmp_path: Path,
                                                                fault: dict) -> None:
    double.faults(rules=[{"match": "infer", "times": 1, **fault}])
    cfg = write_config(tmp_path, dlc_runner(tmp_path, retry=0), tasks=1, model=", load_s=1.5")
    res = run_cli(double.state, cfg)
    assert res.returncode == 0, res.stderr[-3000:]
    run = only_run(tmp_path)
    (retry,) = task_events(run, "retry")
    code = "PodPreempted" if "preempt_after_s" in fault else "ImagePullBackOff"
    assert retry["infra"] and f"Failed ({code}" in retry["reason"] and "before the task finished" in retry["reason"]
    (first, *_) = [e for e in task_events(run, "dlc_ended") if e["attempt"] == 1]
    assert (first["status"], first["reason_code"], first["exit_code"]) == ("Failed", code, None)
    log = (run / "logs/infer/infer_det_rows.log").read_text()
    assert "no task exit code recorded" in log and "attempt 1 failed (infrastructure)" in log


def test_a_task_that_fails_for_real_names_its_log_tail(double: Double, tmp_path: Path) -> None:
    cfg = write_config(tmp_path, dlc_runner(tmp_path, retry=1, infra_retry=3), tasks=1,
                       model=", fail_always=True")
    res = run_cli(double.state, cfg)
    assert res.returncode == 1
    line = next(x for x in res.stderr.splitlines() if x.startswith("FAILED: infer task"))
    assert "exit code 1; DLC job dlc" in line and "Failed (JobFailed" in line
    assert "log tail:" in line and "configured to fail (fail_always=True)" in line
    run = only_run(tmp_path)
    (retry,) = task_events(run, "retry")
    assert "infra" not in retry  # a real failure spends the task's retry
    assert [e["exit_code"] for e in task_events(run, "dlc_ended")] == [1, 1]
    assert len(double.job_ids()) == 2 and not double.alive()


def test_no_dlc_client_fails_every_task_with_the_reason(double: Double, tmp_path: Path) -> None:
    cfg = write_config(tmp_path, dlc_runner(tmp_path, dlc_bin="/nonexistent/dlc"), tasks=1)
    res = run_cli(double.state, cfg)
    assert res.returncode == 1
    assert "'/nonexistent/dlc' not found or not executable" in res.stderr


# -- the command line -----------------------------------------------------------------------------------
def test_dlc_switch_errors_are_one_line(double: Double, tmp_path: Path) -> None:
    cases = [
        (["--dlc", "--aliyun-cfg", tmp_path / "none.cfg"], "--dlc needs an aliyun config file"),
        (["--aliyun-cfg", tmp_path / "x.cfg"], "--aliyun-cfg needs --dlc"),
        (["--dlc", "--slurm", "-p", "x"], "--dlc and --slurm exclude each other"),
    ]
    bad = tmp_path / "bad.cfg"
    bad.write_text("workspace_id = 'w'\nresource_id = 'r'\nworker_image = 'i'\nconda_env = 'x'\n")
    cases.append((["--dlc", "--aliyun-cfg", bad], "aliyun_cfg: unknown key 'conda_env'; valid keys: "))
    for args, words in cases:
        res = run_cli(double.state, "configs/eval_demo.py", *args, "-w", tmp_path / "w")
        assert res.returncode == 2, (args, res.stderr)
        assert words in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert not double.calls()


def test_dry_run_prints_the_submissions_and_calls_nothing(double: Double, tmp_path: Path) -> None:
    aliyun = write_aliyun_file(tmp_path)
    res = run_cli(double.state, "configs/eval_demo.py", "--dlc", "--aliyun-cfg", aliyun, "--dry-run",
                  "-w", tmp_path / "w")
    assert res.returncode == 0, res.stderr
    assert res.stdout.count("$ dlc submit pytorchjob --command ") == 4 and "runner DLCRunner" in res.stdout
    assert not double.calls()
