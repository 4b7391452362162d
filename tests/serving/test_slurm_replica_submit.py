"""A replica's Slurm job is submitted and watched as the runner's jobs are (one Slurm client): its
name is in the servers' ledger before sbatch runs, so an orchestrator killed inside the sbatch call
leaves a job the next one cancels; a submission the cluster refuses for now waits and goes again
instead of failing the model (both against the real test cluster); and a job in any of Slurm's
finished states, ``SPECIAL_EXIT`` and ``REVOKED`` too, is over for the replica as for the runner."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from orchestra.serving.pool import ServerPool, reap
from orchestra.serving.slurm_place import SlurmPlacement, SlurmReplica, job_state
from orchestra.serving.spec import ServerSpec
from tests.helpers import jsonl, start_cli, wait_for
from tests.runners.slurm.conftest import (  # noqa: F401 - the fixtures
    SlurmCluster,
    drained_partition,
    scontrol,
    slurm_cluster,
)
from tests.serving.test_managed_runs import the_run
from tests.serving.test_slurm_replicas import slurm_config

#: a server that never gets ready (its job runs on until stopped) and costs nothing on a shared machine
COMMAND = [sys.executable, "-c", "import time, sys; time.sleep(300)", "{port}"]
ALIVE = ("PENDING", "CONFIGURING", "RUNNING")
SERVER = dict(engine="command", model="m", command=COMMAND, max_restarts=0)


@pytest.mark.slurm
def test_an_orchestrator_killed_inside_the_sbatch_call_leaves_no_replica_job_after_reap(
        tmp_path: Path, slurm_cluster: SlurmCluster) -> None:  # noqa: F811
    """The real sbatch makes the job, then the orchestrator is SIGKILLed before sbatch's answer is
    back (a stand-in on PATH runs the real one and kills its caller): the ledger holds the job's
    name only, and ``reap`` (what the next orchestrator of the run folder runs first) cancels it."""
    real = shutil.which("sbatch")
    assert real is not None
    shims, answer = tmp_path / "bin", tmp_path / "sbatch.out"
    shims.mkdir()
    (shims / "sbatch").write_text(f'#!/bin/bash\nout=$({real} "$@")\nprintf "%s\\n" "$out" > {answer}\n'
                                  "kill -KILL $PPID\n")
    (shims / "sbatch").chmod(0o755)
    env = {**os.environ, "PATH": f"{shims}:{os.environ['PATH']}"}
    proc = start_cli(slurm_config(tmp_path, SERVER, rows=2), env=env, new_session=True)
    job = ""
    try:
        run = the_run(tmp_path)
        proc.communicate(timeout=120)
        assert proc.returncode == -signal.SIGKILL
        job = answer.read_text().strip().split(";")[0]
        assert job.isdigit(), job
        found = job_state(job)
        assert found is not None and found[2] in ALIVE, found  # nothing stopped it yet
        ledger = jsonl(run / "servers/ledger.jsonl")
        assert [r["state"] for r in ledger] == ["submitting"] and ledger[0]["job_name"] == found[0]
        reap(str(run / "servers"))
        after = job_state(job)
        assert after is not None and after[2] == "CANCELLED", after
        assert [r["state"] for r in jsonl(run / "servers/ledger.jsonl")] == ["submitting", "reaped"]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        if job:
            subprocess.run(["scancel", job], capture_output=True, timeout=30, check=False)


@pytest.mark.slurm
def test_a_replica_job_the_cluster_refuses_for_now_waits_and_is_submitted_again(
        tmp_path: Path, drained_partition: str) -> None:  # noqa: F811
    """A drained partition refuses the replica's job for now: the model does not fail, the
    replica's log says it waits (the runners' schedule: 5 s first), and once the partition takes
    jobs again the job is submitted and recorded."""
    servers = tmp_path / "servers"
    events: list[dict[str, object]] = []
    pool = ServerPool(str(servers), lambda event, **fields: events.append({"event": event, **fields}),
                      lambda n: [], lambda ids: None,
                      placement=SlurmPlacement(tmp_path.name[-8:], partition=drained_partition))
    log = servers / "m" / "replica-0.log"
    try:
        spec = ServerSpec("command", "m", command=COMMAND, max_restarts=0)
        assert pool.want("m", spec, "m") == (False, "")
        wait_for(lambda: log.exists() and "refused the replica's job for now" in log.read_text(), 60,
                 "the refusal in the replica's log")
        line = log.read_text()
        assert ("===== slurm: the cluster refused the replica's job for now (Required partition not available "
                "(inactive or drain)); submitting again in 5 s (waited 0 s so far)") in line
        assert pool.want("m", spec, "m") == (False, "")  # waiting, not failed
        scontrol("update", f"PartitionName={drained_partition}", "State=UP")
        started = wait_for(lambda: [r for r in jsonl(servers / "ledger.jsonl") if r["state"] == "started"], 60,
                           "the replica's job to be submitted")
        assert pool.want("m", spec, "m")[1] == ""
        states = [r["state"] for r in jsonl(servers / "ledger.jsonl")]
        assert states[:2] == ["submitting", "submit_failed"] and states[-2:] == ["submitting", "started"], states
        job = str(started[0]["slurm_job"])
        # the pool's thread records the job in the ledger, then emits server_started: wait for the event too
        # (one look right after the ledger line failed once in a clean-clone run)
        wait_for(lambda: any(e["event"] == "server_started" for e in events), 30, "the server_started event")
        assert [e["slurm_job"] for e in events if e["event"] == "server_started"] == [job]
    finally:
        pool.close()
    found = job_state(job)
    assert found is None or found[2] == "CANCELLED", found  # close cancelled it


@pytest.mark.parametrize("state", ["SPECIAL_EXIT", "REVOKED"])
def test_a_replica_job_in_any_finished_state_is_gone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     state: str) -> None:
    """squeue (a stand-in on PATH: no cluster reaches these states on demand) lists the replica's job
    as ``state``, which the runner's table counts finished: the replica sees its job gone."""
    fake = tmp_path / "bin"
    fake.mkdir()
    answer = f'case "$*" in *-O*) echo "42|{state}|0|None|" ;; *) echo {state} ;; esac'  # either format asked
    (fake / "squeue").write_text(f"#!/bin/bash\n{answer}\n")
    (fake / "squeue").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}:{os.environ['PATH']}")
    replica = SlurmReplica(ServerSpec("command", "m", command=COMMAND), "m", 0, str(tmp_path / "replica-0.log"),
                           job="42")
    assert replica.exited() == 1
