"""Managed llama.cpp replicas on a local Ray cluster (started here), through ``run.py``: each
replica an actor running the node agent.  Two replicas serve one run and refuse requests without
the key; a replica's engine SIGKILLed mid-run is restarted without spending ``retry``; Ctrl-C
leaves no replica actor; after a SIGKILL of the orchestrator no actor is left and ``-r`` finishes."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import REPO, events, jsonl, run_cli, start_cli, wait_for
from tests.serving.test_managed_runs import (
    alive,
    config,
    llama,
    predictions,
    served_requests,
    status,
    the_run,
)

sys.path.insert(0, str(REPO / "tools"))
from ray_cluster import ClusterProcess, ray_env  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.ray]


@pytest.fixture(scope="module")
def cluster() -> Iterator[ClusterProcess]:
    """A Ray cluster of one node with 4 CPUs (two replicas and the task), for this module."""
    env = ray_env([str(REPO)])
    cluster = ClusterProcess(env)
    try:
        cluster.add_node(cpus=4)
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def ray_cluster(cluster: ClusterProcess) -> Iterator[ClusterProcess]:
    yield cluster
    assert not cluster.wait_no_actors(), "a run left actors alive"


def ray_config(tmp_path: Path, cluster: ClusterProcess, server: dict[str, Any], rows: int, out_len: int = 8) -> Path:
    cfg = config(tmp_path, server, rows=rows, out_len=out_len)
    runner = f"dict(type='RayRunner', address={cluster.address!r}, task=dict(type='InferTask'))"
    cfg.write_text(cfg.read_text().replace("dict(type='LocalRunner', task=dict(type='InferTask'), gpus=[])", runner))
    assert "RayRunner" in cfg.read_text()
    return cfg


def env() -> dict[str, str]:
    return ray_env([str(REPO)])


def engine_pids(run: Path) -> list[int]:
    """The agents (from their status files) and engines (from the replicas' logs) of the run."""
    pids = [json.loads(p.read_text())["agent"] for p in (run / "servers/smol").glob("replica-*.status.json")]
    for log in (run / "servers").rglob("replica-*.log"):
        pids += [int(line.split()[-1]) for line in log.read_text(errors="replace").splitlines()
                 if line.startswith("watchdog: server pid ")]
    return pids


def replica_actors(cluster: ClusterProcess) -> list[dict[str, Any]]:
    return [a for a in cluster.live_actors() if a["name"].startswith("orc-serve-")]


def test_two_replica_actors_serve_one_run_and_refuse_requests_without_the_key(
        tmp_path: Path, ray_cluster: ClusterProcess) -> None:
    proc = start_cli(ray_config(tmp_path, ray_cluster, llama(replicas=2), rows=24), env=env(), new_session=True)
    try:
        run = the_run(tmp_path)
        listed = wait_for(lambda: (run / "servers/smol/replicas.json").exists()
                          and len(json.loads((run / "servers/smol/replicas.json").read_text())["replicas"]) == 2
                          and json.loads((run / "servers/smol/replicas.json").read_text())["replicas"], 120,
                          "two ready replicas")
        assert len(replica_actors(ray_cluster)) == 2
        started = jsonl(run / "servers/ledger.jsonl")[0]
        key = Path(started["key_file"]).read_text().strip()
        body = {"model": "smollm2", "prompt": "Question: What is 2+3?\nAnswer:", "max_tokens": 2}
        for replica in listed:
            assert status(replica["url"] + "/completions", body, None) == 401
            assert status(replica["url"] + "/completions", body, "not-the-key") == 401
        assert status(listed[0]["url"] + "/completions", body, key) == 200
        out, err = proc.communicate(timeout=400)
        assert proc.returncode == 0, err[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    rows = predictions(run)
    assert len(rows) == 24 and all(isinstance(r["prediction"], str) and r["prediction"] for r in rows)
    counts = [served_requests(run / f"servers/smol/replica-{i}.log") for i in (0, 1)]
    assert sum(counts) >= 24 and min(counts) >= 3, counts
    assert all(e.get("ray_actor") for e in events(run) if e["event"] == "server_started")
    for path in run.rglob("*"):
        if path.is_file():
            assert key.encode() not in path.read_bytes(), path
    assert not [p for p in engine_pids(run) if alive(p)]


def parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as fh:
        return int(fh.read().rsplit(")", 1)[1].split()[1])


@pytest.mark.parametrize("victim", ["engine", "actor"])
def test_a_replica_killed_mid_run_is_restarted_without_spending_retry(
        tmp_path: Path, ray_cluster: ClusterProcess, victim: str) -> None:
    """SIGKILL of the engine (the agent reports its exit) or of the actor's process (Ray reports
    the actor dead; the agent stops its engine on its parent's death)."""
    proc = start_cli(ray_config(tmp_path, ray_cluster, llama(replicas=2), rows=100), env=env(), new_session=True)
    try:
        run = the_run(tmp_path)
        log = run / "servers/smol/replica-0.log"
        wait_for(lambda: served_requests(log) >= 3, 200, "replica 0 serving")
        (engine,) = [int(line.split()[-1]) for line in log.read_text().splitlines()
                     if line.startswith("watchdog: server pid ")]
        agent = json.loads((run / "servers/smol/replica-0.status.json").read_text())["agent"]
        os.kill(engine if victim == "engine" else parent(agent), signal.SIGKILL)
        if victim == "actor":
            wait_for(lambda: not alive(engine) and not alive(agent), 15, "the agent and engine to follow the actor")
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
    assert not [e for e in evs if e["event"] in ("retry", "failed")]


def test_ctrl_c_leaves_no_replica_actor(tmp_path: Path, ray_cluster: ClusterProcess) -> None:
    proc = start_cli(ray_config(tmp_path, ray_cluster, llama(replicas=2), rows=60, out_len=16), env=env(),
                     new_session=True)
    try:
        run = the_run(tmp_path)
        wait_for(lambda: sum(e["event"] == "server_ready" for e in events(run)) == 2, 120, "two ready replicas")
        pids = engine_pids(run)
        assert len(pids) == 4  # two agents, two engines
        proc.send_signal(signal.SIGINT)
        t0 = time.monotonic()
        proc.communicate(timeout=60)
        assert proc.returncode == 130 and time.monotonic() - t0 < 20
        wait_for(lambda: not replica_actors(ray_cluster), 10, "the replica actors to be gone")
        assert not [p for p in pids if alive(p)]  # stopped before the orchestrator exited
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_after_sigkill_of_the_orchestrator_no_actor_is_left_and_r_finishes(
        tmp_path: Path, ray_cluster: ClusterProcess) -> None:
    cfg = ray_config(tmp_path, ray_cluster, llama(replicas=2), rows=30)
    proc = start_cli(cfg, env=env(), new_session=True)
    run = the_run(tmp_path)
    wait_for(lambda: sum(e["event"] == "server_ready" for e in events(run)) == 2, 120, "two ready replicas")
    pids = engine_pids(run)
    assert len(pids) == 4
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    wait_for(lambda: not replica_actors(ray_cluster), 30, "the replica actors to die with their owner")
    wait_for(lambda: not [p for p in pids if alive(p)], 15, "the engines to be gone")
    res = run_cli(cfg, "-r", timeout=400, env=env())
    assert res.returncode == 0, res.stderr[-3000:]
    assert len(predictions(run)) == 30
