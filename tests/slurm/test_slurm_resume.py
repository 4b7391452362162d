"""``-r`` after a SIGKILL of the orchestrator: sbatch jobs it left running are adopted, not submitted
again (real local cluster; every job of a run carries the run's name prefix, so squeue tells them)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from helpers import jsonl
from slurm_helpers import job_prefix, run_cli, run_dirs, squeue_jobs, start_cli, summary_rows, write_config

if TYPE_CHECKING:
    from conftest import SlurmCluster

pytestmark = pytest.mark.slurm

RUNNER = "type=SlurmRunner, launcher='sbatch', partition='debug', poll_interval_s=0.2, max_num_workers=16"


def wait_for(predicate, timeout_s: float, what: str):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")


def ledger(run: Path) -> list[dict]:
    return jsonl(run / "slurm/jobs.jsonl")


def test_resume_after_sigkill_adopts_running_sbatch_jobs_without_duplicates(slurm_cluster: SlurmCluster,
                                                                          tmp_path: Path) -> None:
    cfg = write_config(tmp_path, RUNNER, gpu=False, model=", delay_s=3.0")  # 3 infer tasks of ~15 s
    proc = start_cli(cfg)
    try:
        run = wait_for(lambda: (run_dirs(tmp_path) or [None])[0], 60, "the run folder")
        prefix = job_prefix(run)
        running = wait_for(lambda: [j for j in squeue_jobs(prefix) if j[2] == "RUNNING"] if len(
            [j for j in squeue_jobs(prefix) if j[2] == "RUNNING"]) >= 3 else None, 90, "3 running jobs")
    finally:
        proc.kill()  # SIGKILL: nothing of the orchestrator runs any more
        proc.communicate(timeout=30)
    ids = sorted(j[0] for j in running)
    assert sorted(j[0] for j in squeue_jobs(prefix)) == ids  # batch jobs outlive their orchestrator
    submitted = {r["job_id"] for r in ledger(run) if r["state"] == "submitted"}
    assert submitted == set(ids)  # each recorded before anything relied on it

    res = run_cli(cfg, "-r", timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert summary_rows(run)[("arith", "numeric_match")] == {"det": 1.0}
    adopted = [r for r in ledger(run) if r["state"] == "adopted"]
    assert sorted(r["job_id"] for r in adopted) == ids
    every = squeue_jobs(prefix, all_states=True)  # finished jobs stay listed (MinJobAge)
    assert len(every) == len({j[0] for j in every}) == 3 + 2  # 3 infer jobs, once each; 2 eval jobs
    submissions = [r["job_id"] for r in ledger(run) if r["state"] == "submitted"]
    assert len(submissions) == 3 + 2 and set(ids) < set(submissions)
    log = (run / "logs/infer").glob("*.log")
    assert all("===== slurm: adopted job " in p.read_text() for p in log)
    assert squeue_jobs(prefix) == []
