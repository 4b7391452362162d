"""SlurmRunner end to end: the real CLI, the real local Slurm cluster, both launchers.

Every run gets its own run folder, and every Slurm job of a run carries the run's name prefix
(``orc-<tag>-``), so these tests only ever look at, and cancel, their own jobs.

The time-limit runs take ~80 s (Slurm enforces limits in whole minutes and checks them about
every 30 s), so they start in the background when this module starts and are checked by the
last test, while the others run.
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from helpers import wait_for
from slurm_helpers import (
    events,
    job_headers,
    job_prefix,
    predictions,
    run_cli,
    run_dirs,
    squeue_jobs,
    start_cli,
    summary_rows,
    write_config,
)

if TYPE_CHECKING:
    from conftest import SlurmCluster

pytestmark = pytest.mark.slurm

LAUNCHERS = ["srun", "sbatch"]
FAST = "retry_backoff_s=0.1, poll_interval_s=0.2, max_num_workers=16"
GPU_MODEL = ", delay_s=0.6"  # the GPU tasks take ~3 s, so that they run at the same time


def slurm_runner(launcher: str, extra: str = "") -> str:
    return f"type=SlurmRunner, launcher={launcher!r}, partition='debug', {FAST}{extra}"


# -- the time-limit runs, started first ---------------------------------------------------------------
@pytest.fixture(scope="module", autouse=True)
def time_limit_runs(slurm_cluster: SlurmCluster, tmp_path_factory: pytest.TempPathFactory
                    ) -> Iterator[dict[str, tuple[subprocess.Popen[str], Path, float]]]:
    """One hanging task per launcher with ``time_limit=1`` (minute), running in the background."""
    runs = {}
    for launcher in LAUNCHERS:
        folder = tmp_path_factory.mktemp(f"time_limit_{launcher}")
        cfg = write_config(folder, slurm_runner(launcher, ", time_limit=1"), gpu=False, datasets=("pick",),
                           model=", hang=True")
        runs[launcher] = (start_cli(cfg), folder, time.monotonic())
    yield runs
    for proc, _, _ in runs.values():
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            proc.communicate(timeout=60)


@pytest.fixture(scope="module")
def shared_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One data folder for the LocalRunner reference and the Slurm runs, so content hashes agree."""
    return tmp_path_factory.mktemp("data")


@pytest.fixture(scope="module")
def local_reference(tmp_path_factory: pytest.TempPathFactory, shared_data: Path) -> Path:
    """The run folder of the same config through LocalRunner (4 fake GPU ids for det_gpu)."""
    folder = tmp_path_factory.mktemp("local")
    cfg = write_config(folder, "type=LocalRunner, max_num_workers=4, gpus=['0', '1', '2', '3']",
                       data_dir=shared_data, gpu_model=GPU_MODEL)
    res = run_cli(cfg)
    assert res.returncode == 0, res.stderr
    (run,) = run_dirs(folder)
    return run


def check_gpu_headers(run: Path) -> None:
    """Each GPU task saw one GPU of its own; the others saw none."""
    done = {e["task_id"]: e["ts"] for e in events(run) if e["event"] == "done" and e["stage"] == "infer"}
    gpu_tasks = []
    for log in sorted((run / "logs/infer").glob("*.log")):
        (header,) = job_headers(log)  # one attempt, one job
        if log.stem.startswith("infer_det_gpu_"):
            assert header["gpus"] in {"0", "1", "2", "3"}, (log.stem, header)
            gpu_tasks.append((float(header["started"]), done[log.stem], header["gpus"], log.stem))
        else:
            assert header["gpus"] in {"", "<unset>"}, (log.stem, header)
    assert len(gpu_tasks) == 3
    overlapping = 0
    for i, (start_a, end_a, gpu_a, name_a) in enumerate(gpu_tasks):
        for start_b, end_b, gpu_b, name_b in gpu_tasks[i + 1 :]:
            if min(end_a, end_b) - max(start_a, start_b) > 1.5:  # ran at the same time
                overlapping += 1
                assert gpu_a != gpu_b, f"{name_a} and {name_b} ran at once on GPU {gpu_a}"
    assert overlapping >= 1, "the GPU tasks never overlapped, so the test proved nothing"


def check_matches_local(run: Path, local: Path) -> None:
    assert summary_rows(run) == summary_rows(local)
    assert predictions(run) == predictions(local)
    rows = summary_rows(run)
    assert rows[("arith", "numeric_match")] == {"det": 1.0, "det_gpu": 1.0}


# -- end to end -----------------------------------------------------------------------------------------
def test_cli_slurm_switch_runs_like_local(tmp_path: Path, shared_data: Path, local_reference: Path) -> None:
    # The LocalRunner config, switched by the CLI: srun per task, GPUs from --gres.
    cfg = write_config(tmp_path, "type=LocalRunner, max_num_workers=16, gpus=['0', '1', '2', '3']",
                       data_dir=shared_data, gpu_model=GPU_MODEL)
    res = run_cli(cfg, "--slurm", "-p", "debug")
    assert res.returncode == 0, res.stderr
    (run,) = run_dirs(tmp_path)
    assert "[infer] 6 task(s)" in res.stderr
    logs = sorted((run / "logs/infer").glob("*.log"))
    assert len(logs) == 6
    assert all("srun --job-name=orc-" in log.read_text() for log in logs)
    check_gpu_headers(run)
    check_matches_local(run, local_reference)
    assert squeue_jobs(job_prefix(run)) == []


def test_sbatch_config_runs_like_local_with_job_arrays(tmp_path: Path, shared_data: Path,
                                                       local_reference: Path) -> None:
    cfg = write_config(tmp_path, slurm_runner("sbatch"), data_dir=shared_data, gpu_model=GPU_MODEL)
    res = run_cli(cfg)
    assert res.returncode == 0, res.stderr
    (run,) = run_dirs(tmp_path)
    check_gpu_headers(run)
    check_matches_local(run, local_reference)
    # one round, two resource shapes: the 3 CPU and the 3 GPU infer tasks went as two arrays of 3
    arrays = set()
    for log in (run / "logs/infer").glob("*.log"):
        (line,) = [ln for ln in log.read_text().splitlines() if "submitted as job" in ln]
        assert "(array of 3," in line
        arrays.add(line.split("submitted as job ")[1].split("_")[0])
    assert len(arrays) == 2
    scripts = {p.stem for p in (run / "slurm").glob("*.sh")}  # every job script stays in the run folder
    assert arrays <= scripts and not [name for name in scripts if name.startswith("submit-")]
    assert squeue_jobs(job_prefix(run)) == []


def test_cli_slurm_switch_keeps_a_slurm_runners_options(tmp_path: Path) -> None:
    # -p/-q override the partition and QOS; the config's other SlurmRunner options stay.
    cfg = write_config(tmp_path, "type=SlurmRunner, partition='gpu', time_limit='0:10:00', cpus_per_task=2")
    res = run_cli(cfg, "--slurm", "-p", "debug", "-q", "normal", "--dry-run")
    assert res.returncode == 0, res.stderr
    line = next(ln for ln in res.stdout.splitlines() if "$ " in ln and "srun --job-name" in ln)
    for flag in ("--partition=debug", "--qos=normal", "--time=0:10:00", "--cpus-per-task=2"):
        assert f" {flag} " in line, flag
    cfg = write_config(tmp_path / "sbatch", "type=SlurmRunner, launcher='sbatch'")
    res = run_cli(cfg, "--slurm", "-p", "debug", "--dry-run")
    assert res.returncode == 0, res.stderr
    assert "runner SlurmRunner" in res.stdout and "srun" not in res.stdout.replace(str(tmp_path), "")


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_task_failing_once_is_retried(tmp_path: Path, launcher: str) -> None:
    cfg = write_config(tmp_path, slurm_runner(launcher, ", retry=1"), gpu=False, model=", fail_attempts=1")
    res = run_cli(cfg)
    assert res.returncode == 0, res.stderr
    (run,) = run_dirs(tmp_path)
    retries = [e for e in events(run) if e["event"] == "retry"]
    assert len(retries) == 3  # every infer task failed its first attempt
    log = (run / "logs/infer/infer_det_pick.log").read_text()
    assert "configured to fail on attempt 1" in log and "attempt 2 of" in log
    assert summary_rows(run)[("pick", "accuracy")] == {"det": 1.0}


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_job_cancelled_from_outside_is_retried(tmp_path: Path, launcher: str) -> None:
    cfg = write_config(tmp_path, slurm_runner(launcher, ", retry=1"), gpu=False, datasets=("arith",),
                       model=", delay_s=0.8")
    proc = start_cli(cfg)
    run = wait_for(lambda: (run_dirs(tmp_path) or [None])[0], 30, "the run folder")
    log = run / "logs/infer/infer_det_arith_0.log"
    # the job of attempt 1 has started the task: its header is in the log
    header = wait_for(lambda: log.exists() and job_headers(log), 60, "the first job to start")[0]
    subprocess.run(["scancel", header["job"]], check=True, timeout=30)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    retry = [e for e in events(run) if e["event"] == "retry" and e["task_id"] == "infer_det_arith_0"]
    assert len(retry) == 1 and "cancelled" in retry[0]["reason"] and header["job"] in retry[0]["reason"]
    assert [h["job"] for h in job_headers(log)][0] == header["job"] and len(job_headers(log)) == 2
    assert summary_rows(run)[("arith", "numeric_match")] == {"det": 1.0}


def test_batch_job_that_dies_without_a_result_is_retried(tmp_path: Path) -> None:
    # Attempt 1 kills the batch job's own script (the task's parent) with SIGKILL: the job dies
    # without writing its exit code, and there is no accounting database; squeue's FAILED
    # (signal 9) is the answer.
    template = ('["bash", "-c", "if [ \\"$ORCHESTRA_ATTEMPT\\" = 1 ]; then kill -9 $PPID; exit 0; fi; '
                'exec \\"$@\\"", "_", "{task_cmd}"]')
    cfg = write_config(tmp_path, slurm_runner("sbatch", f", retry=1, template={template}"), gpu=False,
                       datasets=("pick",))
    res = run_cli(cfg)
    assert res.returncode == 0, res.stderr
    (run,) = run_dirs(tmp_path)
    retries = {e["stage"]: e["reason"] for e in events(run) if e["event"] == "retry"}
    assert set(retries) == {"infer", "eval"}  # the template wraps both stages' tasks
    for reason in retries.values():
        assert reason.startswith("Slurm job ") and reason.endswith("failed with signal SIGKILL"), reason
    first, second = (run / "logs/infer/infer_det_pick.log").read_text().split("===== orchestra: attempt 2 of")
    assert "ended with exit code" not in first and "ended with exit code 0" in second
    assert summary_rows(run)[("pick", "accuracy")] == {"det": 1.0}


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_sigint_exits_130_and_leaves_no_job_in_squeue(tmp_path: Path, launcher: str) -> None:
    cfg = write_config(tmp_path, slurm_runner(launcher), model=", delay_s=1.0", gpu_model=", delay_s=1.0")
    proc = start_cli(cfg)
    run = wait_for(lambda: (run_dirs(tmp_path) or [None])[0], 30, "the run folder")
    prefix = job_prefix(run)
    wait_for(lambda: len([j for j in squeue_jobs(prefix) if j[2] == "RUNNING"]) >= 2, 60, "running jobs")
    time.sleep(0.5)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert squeue_jobs(prefix) == [], "a job of the run is still in squeue"
    assert time.monotonic() - t0 < 10
    assert any(e["event"] == "cancelled" for e in events(run))
    cancelled = [j for j in squeue_jobs(prefix, all_states=True) if j[2] == "CANCELLED"]
    assert len(cancelled) >= 2
    time.sleep(1.0)
    assert squeue_jobs(prefix) == []  # and nothing was submitted after the exit


def test_sigkill_of_orchestrator_ends_its_srun_jobs(tmp_path: Path) -> None:
    # Nothing of the orchestrator runs after SIGKILL; each srun gets SIGTERM from the kernel
    # (PDEATHSIG) and takes its job down.  (sbatch jobs are detached by design: see docs/slurm.md.)
    cfg = write_config(tmp_path, slurm_runner("srun"), gpu=False, model=", delay_s=1.0")
    proc = start_cli(cfg)
    run = wait_for(lambda: (run_dirs(tmp_path) or [None])[0], 30, "the run folder")
    prefix = job_prefix(run)
    wait_for(lambda: len([j for j in squeue_jobs(prefix) if j[2] == "RUNNING"]) >= 2, 60, "running jobs")
    proc.kill()
    proc.communicate(timeout=30)
    wait_for(lambda: squeue_jobs(prefix) == [], 15, "the jobs of a killed orchestrator to end")


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_paths_with_spaces_and_quotes(tmp_path: Path, launcher: str) -> None:
    odd = tmp_path / "a b'c\"d $x;"
    cfg = write_config(tmp_path / "cfg", slurm_runner(launcher), data_dir=odd / "data", work_dir=odd / "out",
                       model=f", path={str(odd / 'model dir')!r}")
    res = run_cli(cfg)
    assert res.returncode == 0, res.stderr
    (run,) = run_dirs(tmp_path, work_dir=odd / "out")
    assert summary_rows(run)[("arith", "numeric_match")] == {"det": 1.0, "det_gpu": 1.0}
    assert len(list((run / "predictions").rglob("*.jsonl"))) == 6


# -- last: the time-limit runs started at the top ----------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_job_over_its_time_limit_is_reported(time_limit_runs: dict, launcher: str) -> None:
    proc, folder, started = time_limit_runs[launcher]
    out, err = proc.communicate(timeout=max(10.0, 200 - (time.monotonic() - started)))
    assert proc.returncode == 1, err
    (run,) = run_dirs(folder)
    reason = "Slurm time limit (time_limit=1) reached by Slurm job"
    assert f"FAILED: infer task infer_det_pick ({reason}" in err
    assert f"det / pick: infer task infer_det_pick failed ({reason}" in out  # the summary
    (failed,) = [e for e in events(run) if e["event"] == "failed"]
    job_id = failed["reason"].split("Slurm job ")[1].split()[0]

    def final_state() -> list[str] | None:  # COMPLETING while slurmd still cleans up after the kill
        states = subprocess.run(["squeue", "-h", "-t", "all", "-j", job_id, "-o", "%T"], capture_output=True,
                                text=True, timeout=30, check=True).stdout.split()
        return None if states == ["COMPLETING"] else states

    assert wait_for(final_state, 30, f"Slurm job {job_id} to leave COMPLETING") == ["TIMEOUT"]
    assert squeue_jobs(job_prefix(run)) == []
    if launcher == "sbatch":  # the batch job's own output (--output, slurmstepd's words) joins the log
        log = (run / "logs/infer/infer_det_pick.log").read_text()
        assert f"===== slurm: the batch job's own output ({run / 'slurm' / job_id}.out):" in log
        assert "DUE TO TIME LIMIT" in log
