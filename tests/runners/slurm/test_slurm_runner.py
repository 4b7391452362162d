"""SlurmRunner.launch against the real cluster, with stand-in task commands (``sleep``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from slurm_helpers import squeue_jobs

from orchestra.events import EventLog
from orchestra.paths import RunPaths
from orchestra.runners.base import RunContext, TaskState
from orchestra.runners.slurm.runner import SlurmRunner, run_tag
from orchestra.tasks.spec import TaskSpec

if TYPE_CHECKING:
    from conftest import SlurmCluster

pytestmark = pytest.mark.slurm

LAUNCHERS = ["srun", "sbatch"]


def sleeping(seconds: float) -> list[str]:
    """A template that runs ``sleep`` instead of the task (whose argv is ignored)."""
    return ["bash", "-c", f"sleep {seconds}", "_", "{task_cmd}"]


def tasks(n: int, num_gpus: int = 0) -> list[TaskSpec]:
    return [TaskSpec(stage="infer", task_id=f"infer_m_t{i}", run_dir="", model={"abbr": "m"}, model_abbr="m",
                     units=(), num_gpus=num_gpus) for i in range(n)]


def context(tmp_path: Path) -> tuple[RunContext, str]:
    paths = RunPaths(str(tmp_path / "run"))
    paths.make_dirs()
    for stage in ("infer", "eval"):  # the scheduling loop makes a job's log folder before it submits; tests
        os.makedirs(os.path.dirname(paths.task_log(stage, "x")), exist_ok=True)  # that submit themselves, here
    return RunContext(paths, EventLog(paths.events)), f"orc-{run_tag(paths.root)}-"


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_orchestrator_error_cancels_every_job(slurm_cluster: SlurmCluster, tmp_path: Path, launcher: str) -> None:
    runner = SlurmRunner(launcher=launcher, partition=slurm_cluster.default_partition, template=sleeping(60),
                         poll_interval_s=0.2)
    ctx, prefix = context(tmp_path)

    def crash_once_running(counts: dict[str, int]) -> None:
        if len([j for j in squeue_jobs(prefix) if j[2] == "RUNNING"]) >= 3:
            raise RuntimeError("orchestrator bug")

    ctx.on_change = crash_once_running
    with pytest.raises(RuntimeError, match="orchestrator bug"):
        runner.launch(tasks(3), ctx)
    assert squeue_jobs(prefix) == []
    assert len([j for j in squeue_jobs(prefix, all_states=True) if j[2] == "CANCELLED"]) == 3


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_max_num_workers_caps_jobs_in_flight(slurm_cluster: SlurmCluster, tmp_path: Path, launcher: str) -> None:
    runner = SlurmRunner(launcher=launcher, partition=slurm_cluster.default_partition, template=sleeping(0.5),
                         max_num_workers=2, poll_interval_s=0.1)
    ctx, prefix = context(tmp_path)
    seen: list[int] = []
    ctx.on_change = lambda counts: seen.append(len(squeue_jobs(prefix)))
    results = runner.launch(tasks(5), ctx)
    assert [r.state for r in results] == [TaskState.DONE] * 5
    assert max(seen) == 2
    assert len(squeue_jobs(prefix, all_states=True)) == 5


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_timeout_s_cancels_the_job(slurm_cluster: SlurmCluster, tmp_path: Path, launcher: str) -> None:
    runner = SlurmRunner(launcher=launcher, partition=slurm_cluster.default_partition, template=sleeping(60),
                         timeout_s=1.5, poll_interval_s=0.1)
    ctx, prefix = context(tmp_path)
    (result,) = runner.launch(tasks(1), ctx)
    assert result.state is TaskState.FAILED and result.reason == "timed out after 1.5 s"
    assert squeue_jobs(prefix) == []
    assert [j[2] for j in squeue_jobs(prefix, all_states=True)] in (["CANCELLED"], ["FAILED"])


def test_gpu_and_cpu_tasks_of_one_round_go_as_two_arrays(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    runner = SlurmRunner(launcher="sbatch", partition=slurm_cluster.gpu_partition, template=sleeping(0),
                         poll_interval_s=0.1, gres="gpu:{num_gpus}")
    ctx, prefix = context(tmp_path)
    gpu = [TaskSpec(**{**t.to_dict(), "task_id": t.task_id + "_gpu"}) for t in tasks(2, num_gpus=1)]
    results = runner.launch([*tasks(2), *gpu], ctx)
    assert [r.state for r in results] == [TaskState.DONE] * 4
    submitted = {}
    for r in results:
        (line,) = [ln for ln in Path(r.log_path).read_text().splitlines() if "submitted as job" in ln]
        submitted[r.task_id] = line.split("submitted as job ")[1].split()[0]
    arrays = {job.split("_")[0] for job in submitted.values()}
    assert len(arrays) == 2
    assert {submitted["infer_m_t0"].split("_")[0]} == {submitted["infer_m_t1"].split("_")[0]}
    gpu_array, cpu_array = submitted["infer_m_t0_gpu"].split("_")[0], submitted["infer_m_t0"].split("_")[0]
    script = Path(ctx.paths.slurm_dir) / f"{gpu_array}.sh"  # named by the array's job id
    assert script.read_text().startswith("#!/bin/bash\n# submitted by orchestra: sbatch --parsable ")
    assert " --gres=gpu:1 " in script.read_text().splitlines()[1]
    assert "--gres" not in (Path(ctx.paths.slurm_dir) / f"{cpu_array}.sh").read_text().splitlines()[1]
    # what Slurm itself recorded for each array: one GPU per GPU task, none for the others
    argv = ["squeue", "-h", "-t", "all", "-j", f"{gpu_array},{cpu_array}", "-O", "JobArrayID:|,tres-per-node:|"]
    rows = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=True).stdout.splitlines()
    tres = {row.split("|")[0]: row.split("|")[1] for row in rows}
    assert tres == {f"{gpu_array}_0": "gres:gpu:1", f"{gpu_array}_1": "gres:gpu:1", f"{cpu_array}_0": "N/A",
                    f"{cpu_array}_1": "N/A"}


def test_a_permanent_sbatch_refusal_fails_at_once_with_sbatchs_reason(slurm_cluster: SlurmCluster,
                                                                       tmp_path: Path) -> None:
    runner = SlurmRunner(launcher="sbatch", partition="no_such_partition", template=sleeping(0))
    ctx, _ = context(tmp_path)
    (result,) = runner.launch(tasks(1), ctx)
    assert result.state is TaskState.FAILED
    assert result.reason == ("sbatch refused the job: Invalid partition name specified "
                             "(asked: --partition=no_such_partition)")


def test_srun_allocation_failure_names_the_cause(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    runner = SlurmRunner(partition="no_such_partition", template=sleeping(0))
    ctx, _ = context(tmp_path)
    (result,) = runner.launch(tasks(1), ctx)
    assert result.state is TaskState.FAILED
    assert result.reason.startswith("srun could not allocate the job:") and "partition" in result.reason.lower()


def test_missing_slurm_commands_fail_every_task_clearly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(Path(sys.executable).parent))
    ctx, _ = context(tmp_path)
    results = SlurmRunner().launch(tasks(2), ctx)
    assert [r.state for r in results] == [TaskState.FAILED] * 2
    assert "srun, squeue, scancel not found in PATH" in results[0].reason
