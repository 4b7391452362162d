"""Managed llama.cpp replicas on the local Slurm cluster, through ``run.py``: each replica a job of
its own (``orc-serve-...``) running the node agent.  Two replicas serve one run; a replica's job
cancelled mid-run is restarted without spending ``retry``; Ctrl-C leaves no replica job; after a
SIGKILL of the orchestrator ``-r`` cancels the jobs it left and finishes; a replica refuses
requests without the key."""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import events, jsonl, run_cli, run_dirs, start_cli, wait_for
from tests.runners.slurm.conftest import SlurmCluster, slurm_cluster  # noqa: F401 - the fixture
from tests.serving.test_managed_runs import config, llama, predictions, served_requests, status, the_run

pytestmark = [pytest.mark.slow, pytest.mark.slurm]
SLURM = "dict(type='SlurmRunner', task=dict(type='InferTask'))"


def slurm_config(tmp_path: Path, server: dict[str, Any], rows: int, out_len: int = 8, launcher: str = "srun") -> Path:
    cfg = config(tmp_path, server, rows=rows, out_len=out_len)
    runner = SLURM.replace("type='SlurmRunner'", f"type='SlurmRunner', launcher={launcher!r}")
    cfg.write_text(cfg.read_text().replace("dict(type='LocalRunner', task=dict(type='InferTask'), gpus=[])", runner))
    assert runner in cfg.read_text()
    return cfg


def agents_holding(name: str, value: str, run: Path) -> int:
    """How many node agents of this run have ``name=value`` in their environment (root reads any /proc)."""
    count = 0
    for proc_dir in Path("/proc").glob("[0-9]*"):
        try:
            argv = (proc_dir / "cmdline").read_bytes().split(b"\0")
            if b"orchestra.serving.agent" in argv and any(str(run).encode() in a for a in argv):
                count += f"{name}={value}".encode() in (proc_dir / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
    return count


def replica_jobs(run: Path) -> dict[str, str]:
    """The run's replica jobs from its ledger: ``{job id: job name}``."""
    return {r["slurm_job"]: r["job_name"] for r in jsonl(run / "servers/ledger.jsonl") if r["state"] == "started"}


def job_states(jobs: dict[str, str]) -> dict[str, str]:
    """``{job id: state}`` of these jobs as squeue lists them (every state; finished ones stay listed)."""
    res = subprocess.run(["squeue", "-h", "-t", "all", "-j", ",".join(jobs), "-o", "%i|%j|%T"], capture_output=True,
                         text=True, timeout=30, check=True)
    rows = [line.split("|") for line in res.stdout.split()]
    return {r[0]: r[2] for r in rows if len(r) == 3 and jobs.get(r[0]) == r[1]}


def alive_jobs(jobs: dict[str, str]) -> list[str]:
    return [j for j, s in job_states(jobs).items() if s in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING")]


@pytest.mark.parametrize("launcher", ["srun", "sbatch"])
def test_two_replica_jobs_serve_one_run_and_refuse_requests_without_the_key(
        tmp_path: Path, slurm_cluster: SlurmCluster, launcher: str, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    """The task reaches the replicas by address with the key, as an srun step or a batch job.  A secret of
    the orchestrator's environment (``HF_TOKEN``-like) reaches each replica's agent, but not Slurm's
    saved state of its batch job (before: the replica jobs' saved 'environment' held it)."""
    canary = f"hf_replica-{secrets.token_hex(6)}"
    monkeypatch.setenv("ORC_REPLICA_HF_TOKEN", canary)
    proc = start_cli(slurm_config(tmp_path, llama(replicas=2), rows=24, launcher=launcher), new_session=True)
    try:
        run = the_run(tmp_path)
        listed = wait_for(lambda: (run / "servers/smol/replicas.json").exists()
                          and len(json.loads((run / "servers/smol/replicas.json").read_text())["replicas"]) == 2
                          and json.loads((run / "servers/smol/replicas.json").read_text())["replicas"], 120,
                          "two ready replicas")
        jobs = replica_jobs(run)
        assert len(jobs) == 2 and sorted(job_states(jobs).values()) == ["RUNNING", "RUNNING"]
        assert agents_holding("ORC_REPLICA_HF_TOKEN", canary, run) == 2
        assert [p for p, data in slurm_cluster.saved_state().items() if canary.encode() in data] == []
        started = jsonl(run / "servers/ledger.jsonl")[0]
        key = Path(started["key_file"]).read_text().strip()
        body = {"model": "smollm2", "prompt": "Question: What is 2+3?\nAnswer:", "max_tokens": 2}
        for replica in listed:
            assert status(replica["url"] + "/completions", body, None) == 401
            assert status(replica["url"] + "/completions", body, "not-the-key") == 401
        out, err = proc.communicate(timeout=400)
        assert proc.returncode == 0, err[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    rows = predictions(run)
    assert len(rows) == 24 and all(isinstance(r["prediction"], str) and r["prediction"] for r in rows)
    counts = [served_requests(run / f"servers/smol/replica-{i}.log") for i in (0, 1)]
    assert sum(counts) >= 24 and min(counts) >= 3, counts  # both replicas served a share
    assert not alive_jobs(jobs)
    for path in run.rglob("*"):  # the key is in no file of the run (the job's own output included)
        if path.is_file():
            assert key.encode() not in path.read_bytes(), path
    evs = events(run)
    assert all(e.get("slurm_job") for e in evs if e["event"] == "server_started")
    assert not [e for e in evs if e["event"] == "started" and e["task_id"].startswith("infer")
                and e["runner"] != "SlurmRunner"]


def test_a_replica_job_cancelled_mid_run_is_restarted_without_spending_retry(
        tmp_path: Path, slurm_cluster: SlurmCluster) -> None:  # noqa: F811
    proc = start_cli(slurm_config(tmp_path, llama(replicas=2), rows=100), new_session=True)
    try:
        run = the_run(tmp_path)
        wait_for(lambda: served_requests(run / "servers/smol/replica-0.log") >= 3, 200, "replica 0 serving")
        (victim,) = [r["slurm_job"] for r in jsonl(run / "servers/ledger.jsonl")
                     if r["state"] == "started" and r["replica"] == 0]
        subprocess.run(["scancel", victim], check=True, timeout=30)
        out, err = proc.communicate(timeout=400)
        assert proc.returncode == 0, err[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    rows = predictions(run)
    assert len(rows) == 100 and all(r["prediction"] is not None for r in rows)
    evs = events(run)
    (exited,) = [e for e in evs if e["event"] == "server_exited"]
    assert exited["replica"] == 0 and exited["infra"] and exited["restart"]
    assert sum(e["event"] == "server_ready" and e["replica"] == 0 for e in evs) == 2
    assert not [e for e in evs if e["event"] in ("retry", "failed")]  # the task never noticed
    jobs = replica_jobs(run)
    assert len(jobs) == 3 and job_states(jobs)[victim] == "CANCELLED" and not alive_jobs(jobs)


def test_ctrl_c_leaves_no_replica_job(tmp_path: Path, slurm_cluster: SlurmCluster) -> None:  # noqa: F811
    proc = start_cli(slurm_config(tmp_path, llama(replicas=2), rows=60, out_len=16), new_session=True)
    try:
        run = the_run(tmp_path)
        wait_for(lambda: sum(e["event"] == "server_ready" for e in events(run)) == 2, 120, "two ready replicas")
        jobs = replica_jobs(run)
        proc.send_signal(signal.SIGINT)
        t0 = time.monotonic()
        proc.communicate(timeout=60)
        assert proc.returncode == 130 and time.monotonic() - t0 < 20
        assert not alive_jobs(jobs)  # gone before the orchestrator exited
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_after_sigkill_of_the_orchestrator_r_cancels_the_replica_jobs_and_finishes(
        tmp_path: Path, slurm_cluster: SlurmCluster) -> None:  # noqa: F811
    cfg = slurm_config(tmp_path, llama(replicas=2), rows=30)
    proc = start_cli(cfg, new_session=True)
    run = the_run(tmp_path)
    wait_for(lambda: sum(e["event"] == "server_ready" for e in events(run)) == 2, 120, "two ready replicas")
    jobs = replica_jobs(run)
    os.killpg(proc.pid, signal.SIGKILL)  # the orchestrator and its srun processes
    proc.wait()
    assert len(alive_jobs(jobs)) == 2  # nothing stopped them yet: only their heartbeat goes stale
    res = run_cli(cfg, "-r", timeout=400)
    assert res.returncode == 0, res.stderr[-3000:]
    assert len(predictions(run)) == 30
    assert {job_states(jobs)[j] for j in jobs} == {"CANCELLED"}  # -r cancelled them (not their own end)
    ledger = jsonl(run / "servers/ledger.jsonl")
    assert sum(r["state"] == "reaped" for r in ledger) == 2
    assert not alive_jobs(replica_jobs(run))
    assert len(run_dirs(tmp_path / "out")) == 1



def test_a_replica_job_that_serves_without_the_key_fails_in_one_line(
        tmp_path: Path, slurm_cluster: SlurmCluster) -> None:  # noqa: F811
    """The agent's checks run on the node: a server there that answers without the key is refused
    (never listed), its job ends, and the task fails with the pool's one line."""
    import sys

    command = [sys.executable, "-m", "http.server", "{port}", "--bind", "{host}"]
    server = dict(engine="command", model="m", command=command, ready_path="/", max_restarts=0)
    res = run_cli(slurm_config(tmp_path, server, rows=4), timeout=180)
    assert res.returncode == 1, res.stderr[-2000:]
    (line,) = [ln for ln in res.stderr.splitlines() if ln.startswith("FAILED: infer task")]
    assert "command replica 0 of smol answers without the key (refused" in line, line
    (run,) = run_dirs(tmp_path / "out")
    assert json.loads((run / "servers/smol/replica-0.status.json").read_text())["why"] == "open"
    assert not alive_jobs(replica_jobs(run))
    listed = run / "servers/smol/replicas.json"
    assert not listed.exists() or json.loads(listed.read_text())["replicas"] == []  # never offered to a task


def test_each_replica_job_holds_its_own_gpus(tmp_path: Path, slurm_cluster: SlurmCluster) -> None:  # noqa: F811
    """``gpus=1`` per replica: each job asks ``--gres=gpu:1`` of the cluster's (fake) GPUs and its
    server sees only the one Slurm gave it (the ``command`` engine runs the xllamacpp launcher)."""
    from tests.serving.test_managed_runs import PY, gguf

    command = [PY, "-m", "orchestra.serving.xllama", "--model", "{model}", "--host", "{host}", "--port", "{port}",
               "--alias", "{name}", "--parallel", "2"]
    server = dict(engine="command", model=gguf(), command=command, replicas=2, gpus=1)
    cfg = slurm_config(tmp_path, server, rows=6)
    gpu_runner = f"type='SlurmRunner', partition={slurm_cluster.gpu_partition!r}"
    cfg.write_text(cfg.read_text().replace("type='SlurmRunner'", gpu_runner))
    assert gpu_runner in cfg.read_text()
    res = run_cli(cfg, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    (run,) = run_dirs(tmp_path / "out")
    assert len(predictions(run)) == 6
    seen = []
    for i in (0, 1):
        (line,) = [ln for ln in (run / f"servers/smol/replica-{i}.log").read_text().splitlines()
                   if ln.startswith("agent: ")]
        seen.append(line.split("GPUs ")[1])
    assert all(len(g.strip("[]").split(",")) == 1 and g != "[]" for g in seen) and seen[0] != seen[1], seen


def test_replica_jobs_end_by_themselves_once_the_orchestrators_heartbeat_is_stale(
        tmp_path: Path, slurm_cluster: SlurmCluster) -> None:  # noqa: F811
    """Without ``-r``: after a SIGKILL of the orchestrator the agents see its heartbeat go stale
    (30 s) and end their jobs themselves (COMPLETED: nobody cancelled them)."""
    proc = start_cli(slurm_config(tmp_path, llama(replicas=2), rows=60, out_len=16), new_session=True)
    run = the_run(tmp_path)
    wait_for(lambda: sum(e["event"] == "server_ready" for e in events(run)) == 2, 120, "two ready replicas")
    jobs = replica_jobs(run)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    t0 = time.monotonic()
    wait_for(lambda: not alive_jobs(jobs), 60, "the replica jobs to end")
    assert 25 < time.monotonic() - t0 < 45
    assert set(job_states(jobs).values()) == {"COMPLETED"}
    assert {json.loads((run / f"servers/smol/replica-{i}.status.json").read_text())["state"] for i in (0, 1)} == {
        "exited"}


def test_a_replica_job_sbatch_refuses_fails_the_run_in_one_line(tmp_path: Path,
                                                                 slurm_cluster: SlurmCluster) -> None:  # noqa: F811
    """More GPUs per replica than any node has: sbatch refuses the job at once (the cluster places
    replicas, so nothing counts GPUs at config time); the task fails with sbatch's reason (a refusal
    for good: not waited on)."""
    import sys

    command = [sys.executable, "-m", "http.server", "{port}", "--bind", "{host}"]
    server = dict(engine="command", model="m", command=command, gpus=64, max_restarts=0)
    res = run_cli(slurm_config(tmp_path, server, rows=2), timeout=180)
    assert res.returncode == 1, res.stderr[-2000:]
    (line,) = [ln for ln in res.stderr.splitlines() if ln.startswith("FAILED: infer task")]
    # sbatch's reason in one line, read by the one Slurm client as the runner's task jobs' refusals are
    assert ("command replica 0 of smol could not start: sbatch refused the replica's job: Requested node "
            "configuration is not available") in line, line
    (run,) = run_dirs(tmp_path / "out")
    assert not [r for r in jsonl(run / "servers/ledger.jsonl") if r["state"] == "started"]


def test_a_node_agent_whose_port_is_never_its_replicas_gives_up_in_one_line(
        tmp_path: Path, slurm_cluster: SlurmCluster) -> None:  # noqa: F811
    """On the node, as on this machine: a server that hands its port to a process outside its
    group (``setsid``) is not a race lost three times over (before: the agent tried ports until
    the pool's startup timeout and queue allowance, 20 minutes)."""
    import sys

    from tests.serving.test_serving_ports import STUB

    server = dict(engine="command", model="m", command=["setsid", sys.executable, STUB, "{port}"], max_restarts=0)
    t0 = time.monotonic()
    res = run_cli(slurm_config(tmp_path, server, rows=2), timeout=240)
    assert res.returncode == 1, res.stderr[-2000:]
    assert time.monotonic() - t0 < 180
    (line,) = [ln for ln in res.stderr.splitlines() if ln.startswith("FAILED: infer task")]
    assert "command replica 0 of smol exited with code 1 before it was ready" in line, line  # the status's code
    assert "was held by a process outside the replica's own group 3 times in a row" in line, line
    (run,) = run_dirs(tmp_path / "out")
    assert json.loads((run / "servers/smol/replica-0.status.json").read_text())["why"] == "foreign"
    assert not alive_jobs(replica_jobs(run))
