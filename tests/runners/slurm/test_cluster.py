"""The local Slurm cluster itself behaves as the Slurm backend expects."""

from __future__ import annotations

import subprocess
import threading
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from tests.slurm.conftest import SlurmCluster

pytestmark = pytest.mark.slurm

TIMEOUT_S = 60


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)


def test_srun_passes_exit_code_through(slurm_cluster: SlurmCluster) -> None:
    assert _run(["srun", "-t", "1", "true"]).returncode == 0
    assert _run(["srun", "-t", "1", "sh", "-c", "exit 7"]).returncode == 7


@pytest.mark.parametrize("num_gpus", [1, 2])
def test_gres_sets_cuda_visible_devices(slurm_cluster: SlurmCluster, num_gpus: int) -> None:
    argv = ["srun", "-t", "1", "-p", slurm_cluster.gpu_partition, f"--gres=gpu:{num_gpus}"]
    result = _run([*argv, "sh", "-c", 'echo "$CUDA_VISIBLE_DEVICES"'])
    assert result.returncode == 0, result.stderr
    ids = result.stdout.strip().split(",")
    assert len(set(ids)) == num_gpus
    assert all(0 <= int(i) < slurm_cluster.num_gpus for i in ids)


def test_concurrent_gpu_jobs_get_distinct_devices(slurm_cluster: SlurmCluster) -> None:
    # Both jobs hold their GPU for a second, so they overlap.
    seen: list[str] = []

    def one_job() -> None:
        cmd = 'echo "$CUDA_VISIBLE_DEVICES"; sleep 1'
        seen.append(_run(["srun", "-t", "1", "--gres=gpu:1", "sh", "-c", cmd]).stdout.strip())

    threads = [threading.Thread(target=one_job) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(seen) == 2 and all(seen)
    assert seen[0] != seen[1]


def test_finished_job_state_is_visible_without_accounting(slurm_cluster: SlurmCluster) -> None:
    # No slurmdbd: sacct fails, but squeue keeps finished jobs for MinJobAge seconds,
    # with the raw wait status as exit_code (exit 3 -> 3 << 8).
    submitted = _run(["sbatch", "--parsable", "--wait", "-t", "1", "-o", "/dev/null", "--wrap", "exit 3"])
    assert submitted.returncode == 3, submitted.stderr
    job_id = submitted.stdout.strip().split(";")[0]
    assert _run(["sacct", "-j", job_id]).returncode != 0
    shown = _run(["squeue", "-h", "-t", "all", "-j", job_id, "-O", "JobArrayID:20,State:16,exit_code:8"])
    assert shown.stdout.split() == [job_id, "FAILED", str(3 << 8)]
