"""The double keeps the documented ``dlc`` contract (so tests against it mean something)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

from dlc_helpers import DLC, Double
from helpers import alive

from orchestra.runners.dlc.cli import format_time, parse_job_id, parse_job_info

SUBMIT = ["submit", "pytorchjob", "--workspace_id", "ws", "--resource_id=q", "--priority", "1", "--workers", "1",
          "--worker_cpu", "12", "--worker_gpu", "0", "--worker_memory", "192Gi", "--worker_image", "img"]


def dlc(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(DLC), *args], capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)


def submit(command: str, name: str = "t") -> str:
    res = dlc(*SUBMIT, "--command", command, "--name", name)
    assert res.returncode == 0, res.stdout
    job_id = parse_job_id(res.stdout)
    assert job_id
    return job_id


def wait_status(double: Double, job_id: str, wanted: set[str], timeout_s: float = 10) -> dict:
    return double.wait_for(lambda: double.status(job_id) if double.status(job_id)["Status"] in wanted else None,
                           timeout_s, f"{job_id} in {wanted}")


def test_states_logs_and_a_bare_container(double: Double) -> None:
    job_id = submit("echo one; echo 'two\tтри'; pwd; echo HOME=$HOME; echo PYTHONPATH=${PYTHONPATH-unset}; exit 3")
    assert double.status(job_id)["Status"] == "Creating"
    doc = wait_status(double, job_id, {"Failed"})
    assert (doc["ReasonCode"], doc["Pods"][0]["PodId"]) == ("JobFailed", f"{job_id}-master-0")
    info = parse_job_info(dlc("get", "job", job_id).stdout, job_id)
    assert info.status == "Failed" and info.finish_time is not None
    lines = dlc("logs", job_id, f"{job_id}-master-0").stdout.splitlines()
    assert lines[:3] == ["one", "two\tтри", "/"] and lines[4] == "PYTHONPATH=unset"  # nothing inherited
    # windows are half-open in whole seconds: [t, t) is empty, [create-1, finish+2) has everything
    t = int(info.create_time)
    empty = dlc("logs", job_id, f"{job_id}-master-0", "--start_time", format_time(t), "--end_time", format_time(t))
    assert empty.stdout.strip() == "[WARN] No logs found for the pod"
    everything = dlc("logs", job_id, f"{job_id}-master-0", "--start_time", format_time(t - 1),
                     f"--end_time={format_time(int(info.finish_time) + 2)}", "--max_events_num", "2")
    assert everything.stdout.splitlines() == ["one", "two\tтри"]  # capped
    assert "[FAILED] code: 404" in dlc("logs", job_id, f"{job_id}-worker-0").stdout
    stop = dlc("stop", "job", job_id, "--force")
    assert stop.returncode == 1 and "[FAILED] code: 400" in stop.stdout


def test_stop_needs_force_and_stops_the_process(double: Double, tmp_path: Path) -> None:
    marker = tmp_path / "alive"
    job_id = submit(f"while true; do date +%s%N > {marker}; sleep 0.05; done")
    wait_status(double, job_id, {"Running"})
    assert dlc("stop", "job", job_id).returncode == 1  # asks for confirmation; no answer: not stopped
    assert double.status(job_id)["Status"] == "Running"
    res = dlc("stop", "job", job_id, "--force")
    assert res.returncode == 0 and res.stdout.strip() == f"[OK] Job [{job_id}] was stopped successfully"
    doc = wait_status(double, job_id, {"Stopped"})
    assert doc["ReasonCode"] == "JobStoppedByUser"
    before = marker.read_text()
    time.sleep(0.3)
    assert marker.read_text() == before  # the command really stopped


def test_the_contract_is_enforced(double: Double) -> None:
    assert "unknown flag: --kind" in dlc(*SUBMIT, "--kind", "PyTorchJob", "--command", "true", "--name", "x").stdout
    assert "unknown flag: --bogus" in dlc(*SUBMIT, "--bogus", "1", "--command", "true", "--name", "x").stdout
    assert "required flag" in dlc(*SUBMIT, "--name", "x").stdout
    assert "512" in dlc(*SUBMIT, "--command", "true", "--name", "n" * 513).stdout
    assert "no such file" in dlc(*SUBMIT, "--command", "true", "--name", "x", "--config", "/nope").stdout
    assert "invalid worker_memory" in dlc(*SUBMIT[:-4], "--worker_memory", "192", "--worker_image", "i",
                                          "--command", "true", "--name", "x").stdout
    old = dlc("create", "job", "--kind", "PyTorchJob", "--worker_count", "1", "--name", "x", "--command", "true",
              "--workspace_id", "ws", "--worker_image", "img")
    assert old.returncode == 0 and parse_job_id(old.stdout)
    assert "[FAILED] code: 404" in dlc("get", "job", "dlc0000000000000").stdout
    assert double.job_ids() == [parse_job_id(old.stdout)]  # only the valid submission made a job


def test_faults(double: Double) -> None:
    double.faults(get_ok_prefix=True, get_garbled_every=2, submit_layout="plain",
                  rules=[{"match": "bad", "times": 1, "submit": "fail"}, {"match": "slow", "queue_s": 30}])
    res = dlc(*SUBMIT, "--command", "true", "--name", "bad-1")
    assert res.returncode == 1 and res.stdout.startswith("[FAILED] code: 500")
    job_id = submit("true", "bad-2")  # the rule fired once
    assert dlc(*SUBMIT, "--command", "true", "--name", "x").stdout.startswith("Job created. JobId: dlc")
    first, second = dlc("get", "job", job_id).stdout, dlc("get", "job", job_id).stdout
    assert first.startswith("[OK]\n") and json.loads(first[5:])["JobId"] == job_id
    assert "{" not in second  # every 2nd get is garbage
    slow = submit("true", "slow-1")
    wait_status(double, slow, {"Queuing"})
    time.sleep(0.5)
    assert double.status(slow)["Status"] == "Queuing"
    assert dlc("stop", "job", slow, "--force").returncode == 0
    wait_status(double, slow, {"Stopped"})


def test_clean_up_signals_only_the_processes_the_jobs_recorded(double: Double) -> None:
    """``kill_all`` (every DLC test's teardown) reads pids and process groups from job folders that
    may be long finished; the kernel hands those numbers out again (pid_max 32768 here), so a
    number another process got since is left alone: only a live job's own processes end."""
    job_id = submit("sleep 120", "alive")
    wait_status(double, job_id, {"Running"})
    folder = double.state / "jobs" / job_id

    def recorded() -> tuple[int, int] | None:
        """The job's driver pid and task group once written (the driver says Running a moment before
        it starts the task and writes its group; a file being written may still be empty)."""
        try:
            return int((folder / "driver.pid").read_text()), int((folder / "task.pgid").read_text())
        except (FileNotFoundError, ValueError):
            return None

    driver, group = double.wait_for(recorded, 10, "the job's driver pid and task group")
    stranger = subprocess.Popen(["sleep", "120"], start_new_session=True)  # has a number a finished job had
    try:
        stale = double.state / "jobs" / "dlc-finished-long-ago"
        stale.mkdir(parents=True)
        for name in ("driver.pid", "task.pgid"):
            (stale / name).write_text(str(stranger.pid))
            os.utime(stale / name, (time.time() - 60, time.time() - 60))  # written before that process started
        double.kill_all()
        double.wait_for(lambda: not alive(driver) and not alive(group), 10, "the live job's driver and task to end")
        time.sleep(0.5)  # a SIGKILL sent to it would have landed by now
        assert stranger.poll() is None, "kill_all signalled a process no job of this cloud started"
    finally:
        stranger.kill()
        stranger.wait()
