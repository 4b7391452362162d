"""RayRunner on a real Ray cluster: the orchestrator is the real CLI, the cluster a real one whose
nodes join, leave and crash while the run goes on (see conftest.py)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import RayCluster, ray_env
from ray_helpers import (
    events,
    outputs,
    run_cli,
    run_dir,
    stage_events,
    start_cli,
    wait_for_event,
    write_config,
)

from tests.helpers import born, still_alive, wait_for

pytestmark = pytest.mark.ray


def ray_runner(cluster: RayCluster, extra: str = "") -> str:
    return f"type=RayRunner, address={cluster.address!r}, retry_backoff_s=0.1{extra}"


def ran_on(run: Path, stage: str = "infer") -> dict[str, str]:
    """task id -> node id of its last started attempt."""
    return {e["task_id"]: e["resources"]["node_id"] for e in stage_events(run, stage, "started")}


def load_times(run: Path) -> dict[str, float]:
    """task id -> the seconds its log says the model took to be ready (0 when a worker had it)."""
    found = {}
    for log in (run / "logs" / "infer").glob("*.log"):
        m = re.search(r"model det ready in ([0-9.]+) s", log.read_text())
        assert m, log.read_text()[-2000:]
        found[log.stem] = float(m.group(1))
    return found


def test_results_equal_local_runners_and_each_worker_loads_its_model_once(
        cluster: RayCluster, tmp_path: Path) -> None:
    cluster.add_node(cpus=1)
    cluster.add_node(cpus=1)
    model = ", load_s=0.6, delay_s=0.02"
    on_ray = write_config(tmp_path / "ray", ray_runner(cluster, ", max_num_workers=4"), model=model,
                          eval_runner=f"dict({ray_runner(cluster)}, task=dict(type=EvalTask))")
    local = write_config(tmp_path / "local", "type=LocalRunner, max_num_workers=2", model=model)
    res = run_cli(on_ray)
    assert res.returncode == 0, res.stderr[-3000:]
    assert run_cli(local).returncode == 0
    run = run_dir(tmp_path / "ray")
    assert outputs(run) == outputs(run_dir(tmp_path / "local"))
    assert len(outputs(run)) == 7  # 4 + 1 prediction files, 2 results
    # both nodes worked, and each worker paid for the model once: later tasks found it loaded
    started = stage_events(run, "infer", "started")
    assert len({e["resources"]["node_id"] for e in started}) == 2
    workers = {e["resources"]["actor_id"] for e in started}
    loads = load_times(run)
    assert sum(1 for s in loads.values() if s >= 0.5) == len(workers) < len(started) == 5
    # every attempt's event says where it ran; the eval stage ran on Ray too
    assert all({"node_id", "node_ip", "actor_id", "pid"} <= e["resources"].keys() for e in started)
    assert len(stage_events(run, "eval", "done")) == 2
    assert all("actor_id" in e["resources"] for e in stage_events(run, "eval", "started"))


def test_pool_grows_as_nodes_join_and_shrinks_to_the_remaining_work(cluster: RayCluster, tmp_path: Path) -> None:
    first = cluster.add_node(cpus=1)
    # 15 tasks of ~1.5 s and one log-lik task: the first node alone would need over 20 s, so work is
    # left for it after the new nodes took theirs, however slow the machine is to add them
    cfg = write_config(tmp_path, ray_runner(cluster, ", max_num_workers=3, idle_timeout_s=0.5"),
                       model=", delay_s=0.5", rows=150, task_rows=10)
    proc = start_cli(cfg)
    try:
        wait_for_event(tmp_path, lambda e: e["event"] == "done" and e.get("stage") == "infer", proc=proc)
        joined = {cluster.add_node(cpus=1), cluster.add_node(cpus=1)}
        for node in joined:  # each new node gets a worker, which takes a task
            wait_for_event(tmp_path, lambda e, n=node: e["event"] == "started" and e["resources"]["node_id"] == n,
                           proc=proc)
        # then the first node leaves in the middle of a task (an autoscaler scaling in, a drained spot node)
        since = time.time()
        ev = wait_for_event(tmp_path, lambda e: e["event"] == "started" and e["ts"] >= since
                            and e["resources"]["node_id"] == first, proc=proc)
        cluster.remove_node(first)
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 0, err[-3000:]
    run = run_dir(tmp_path)
    evs = events(run)
    # the nodes that joined mid-run were noticed and used; the one that left was noticed
    assert joined <= {e["node_id"] for e in evs if e["event"] == "node_joined"}
    assert first in {e["node_id"] for e in evs if e["event"] == "node_lost"}
    # the task it was running went to another worker without spending a retry (retry=0)
    retry = [e for e in stage_events(run, "infer", "retry") if e["task_id"] == ev["task_id"]]
    assert [e.get("infra") for e in retry] == [True], retry
    assert ran_on(run)[ev["task_id"]] in joined
    assert len(stage_events(run, "infer", "done")) == 16
    # never more workers than max_num_workers, and never more than the work left to do
    alive: set[str] = set()
    peak = 0
    remaining = len(stage_events(run, "infer", "queued"))
    for e in evs:
        if e["event"] == "worker_requested":
            alive.add(e["actor_id"])
            peak = max(peak, len(alive))
            assert len(alive) <= remaining, e
        elif e["event"] == "worker_stopped":
            alive.discard(e["actor_id"])
        elif e["event"] == "done" and e.get("stage") == "infer":
            remaining -= 1
    assert peak == 3
    idle = [e for e in evs if e["event"] == "worker_stopped" and e["reason"].startswith("idle")]
    last_done = max(e["ts"] for e in stage_events(run, "infer", "done"))
    assert any(e["ts"] < last_done for e in idle), "no idle worker was released before the last task ended"


def test_crashed_node_mid_task_is_survived_without_spending_retries(cluster: RayCluster, tmp_path: Path) -> None:
    first, second = cluster.add_node(cpus=1), cluster.add_node(cpus=1)
    gate = tmp_path / "gate"  # every batch waits for it: the task on `first` is still running at the crash
    cfg = write_config(tmp_path, ray_runner(cluster, ", max_num_workers=2, retry=0"), rows=60, task_rows=10,
                       model=f", delay_s=0.3, gate={str(gate)!r}", model_type="gated_model.GatedModel")
    proc = start_cli(cfg)  # 6 tasks of ~0.9 s + one log-lik task
    try:
        ev = wait_for_event(tmp_path, lambda e: e["event"] == "started" and e.get("attempt") == 1
                            and e["resources"].get("node_id") == first, proc=proc)
        worker = born([ev["where"]["pid"]])
        cluster.remove_node(first, crash=True)  # the raylet and its workers die at once: a spot loss
        wait_for(lambda: not still_alive(worker), 30, "the crashed node's worker to end")
        gate.touch()
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 0, err[-3000:]
    run = run_dir(tmp_path)
    retry = [e for e in stage_events(run, "infer", "retry") if e["task_id"] == ev["task_id"]]
    assert len(retry) == 1 and retry[0]["infra"] is True and "worker lost" in retry[0]["reason"], retry
    assert first[:12] in retry[0]["reason"]
    assert set(ran_on(run).values()) >= {second}
    assert ran_on(run)[ev["task_id"]] != first  # its rerun went elsewhere
    assert len(stage_events(run, "infer", "done")) == 7
    log = (run / "logs" / "infer" / f"{ev['task_id']}.log").read_text()
    assert "failed (infrastructure): worker lost" in log
    started = [e for e in stage_events(run, "infer", "started") if e["task_id"] == ev["task_id"]]
    assert started[0]["where"]["node_id"] == first and started[1]["where"]["node_id"] != first
    assert all(e["where"]["actor_id"] == e["resources"]["actor_id"] for e in started)


def test_task_that_keeps_killing_its_worker_fails_with_that_reason(cluster: RayCluster, tmp_path: Path) -> None:
    cluster.add_node(cpus=1)
    cfg = write_config(tmp_path, ray_runner(cluster, ", max_num_workers=1, infra_retry=1"),
                       model_type="killer_model.WorkerKillerModel", rows=10, task_rows=10)
    res = run_cli(cfg, "--mode", "infer")
    assert res.returncode == 1
    run = run_dir(tmp_path)
    failed = stage_events(run, "infer", "failed")
    assert failed and all("worker lost" in e["reason"] and "lost its worker 2 times" in e["reason"] for e in failed)
    assert all(e["attempt"] == 2 for e in failed)
    assert "FAILED: infer task" in res.stderr and "lost its worker 2 times" in res.stderr
    # each attempt had a worker of its own: the dead one was replaced
    started = stage_events(run, "infer", "started")
    assert len({e["where"]["actor_id"] for e in started}) == len(started) == 2 * len(failed)
    lost = [e for e in events(run) if e["event"] == "worker_stopped" and e["reason"].startswith("lost")]
    assert len(lost) == len(started)


def test_killed_worker_is_replaced_and_its_task_rerun_without_spending_retries(
        cluster: RayCluster, tmp_path: Path) -> None:
    cluster.add_node(cpus=2)
    gate = tmp_path / "gate"  # every batch waits for it: the task is still running when its worker is killed
    cfg = write_config(tmp_path, ray_runner(cluster, ", max_num_workers=2, retry=0"), rows=60, task_rows=10,
                       model=f", delay_s=0.3, gate={str(gate)!r}", model_type="gated_model.GatedModel")
    proc = start_cli(cfg)  # 6 tasks of ~0.9 s + one log-lik task
    try:
        ev = wait_for_event(tmp_path, lambda e: e["event"] == "started" and e.get("attempt") == 1, proc=proc)
        worker = born([ev["where"]["pid"]])
        os.kill(ev["where"]["pid"], signal.SIGKILL)  # what the kernel's OOM killer does to a worker
        wait_for(lambda: not still_alive(worker), 30, "the killed worker to end")
        gate.touch()
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 0, err[-3000:]
    run = run_dir(tmp_path)
    assert len(stage_events(run, "infer", "done")) == 7
    (retry,) = stage_events(run, "infer", "retry")
    assert (retry["task_id"], retry["infra"], retry["delay_s"]) == (ev["task_id"], True, 0.0)
    assert "worker lost" in retry["reason"]
    rerun = [e for e in stage_events(run, "infer", "started") if e["task_id"] == ev["task_id"]][-1]
    assert rerun["attempt"] == 2 and rerun["where"]["actor_id"] != ev["where"]["actor_id"]
    evs = events(run)
    killed = ev["where"]["actor_id"]
    assert [e["reason"][:5] for e in evs if e["event"] == "worker_stopped" and e["actor_id"] == killed] == ["lost:"]
    # a replacement was requested after the loss (the pool was at max_num_workers before it)
    loss_at = next(e["ts"] for e in evs if e["event"] == "worker_stopped" and e["actor_id"] == killed)
    assert [e for e in evs if e["event"] == "worker_requested" and e["ts"] >= loss_at]


@pytest.mark.parametrize("how", ["ctrl-c", "sigterm"])
def test_interrupt_kills_every_worker_within_seconds(cluster: RayCluster, tmp_path: Path, how: str) -> None:
    cluster.add_node(cpus=2)
    cfg = write_config(tmp_path, ray_runner(cluster, ", max_num_workers=2"), model=", delay_s=5")
    proc = start_cli(cfg)
    try:
        wait_for_event(tmp_path, lambda e: e["event"] == "started", proc=proc)
        wait_for(lambda: len(cluster.live_actors()) >= 1, 30, "the task's worker actor on the cluster")
        if how == "ctrl-c":
            os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the whole group
        else:
            proc.terminate()  # `kill PID`: the orchestrator's own handler, not the one ray.init installs
        out, err = proc.communicate(timeout=60)  # a hang guard: the stop takes a few seconds
    finally:
        proc.kill()
    assert proc.returncode == 130, err[-3000:]
    assert f"{'SIGINT' if how == 'ctrl-c' else 'SIGTERM'} received, stopping every task" in err
    assert cluster.wait_no_actors(timeout_s=30) == []  # none left on the cluster, detached or not
    run = run_dir(tmp_path)
    assert stage_events(run, "infer", "cancelled")
    # a worker is stopped by the cancel or the launch's end, or before the signal as idle (under load its
    # task can end first, and the pool gives back a worker no remaining task needs)
    reasons = {e["reason"] for e in events(run) if e["event"] == "worker_stopped"}
    assert reasons & {"cancelled", "the launch ended"}, reasons
    assert reasons <= {"cancelled", "the launch ended", "idle: no remaining task needs it"}, reasons


def test_orchestrator_killed_outright_leaves_no_worker_behind(cluster: RayCluster, tmp_path: Path) -> None:
    cluster.add_node(cpus=2)
    cfg = write_config(tmp_path, ray_runner(cluster, ", max_num_workers=2"), model=", delay_s=5")
    proc = start_cli(cfg)
    try:
        wait_for_event(tmp_path, lambda e: e["event"] == "started", proc=proc)
        assert cluster.live_actors()
        os.killpg(proc.pid, signal.SIGKILL)  # no clean-up of its own: Ray ends what its driver owned
        proc.wait(timeout=10)
    finally:
        proc.kill()
    assert cluster.wait_no_actors(timeout_s=30) == []
    # the run folder named every worker before it was used, for whoever looks afterwards
    requested = {e["actor_id"] for e in events(run_dir(tmp_path)) if e["event"] == "worker_requested"}
    started = {e["resources"]["actor_id"] for e in stage_events(run_dir(tmp_path), "infer", "started")}
    assert started and started <= requested


def test_attempt_over_its_timeout_kills_its_worker(cluster: RayCluster, tmp_path: Path) -> None:
    cluster.add_node(cpus=1)
    # address='auto' joins the cluster RAY_ADDRESS names
    cfg = write_config(tmp_path, "type=RayRunner, address='auto', max_num_workers=1, timeout_s=2",
                       model=", hang=True", rows=10, task_rows=10)
    res = run_cli(cfg, "--mode", "infer", env={"RAY_ADDRESS": cluster.address})
    assert res.returncode == 1
    run = run_dir(tmp_path)
    assert {e["reason"] for e in stage_events(run, "infer", "failed")} == {"timed out after 2 s"}
    assert [e for e in events(run) if e["event"] == "worker_stopped" and e["reason"] == "cancelled"]


def test_task_no_node_can_hold_fails_at_planning(cluster: RayCluster, tmp_path: Path) -> None:
    cluster.add_node(cpus=1)
    cfg = write_config(tmp_path, ray_runner(cluster), model=", run_cfg=dict(num_gpus=1)", rows=10, task_rows=10)
    res = run_cli(cfg, "--mode", "infer")
    assert res.returncode == 1
    run = run_dir(tmp_path)
    (failed, *_) = stage_events(run, "infer", "failed")
    assert failed["reason"].startswith("needs 1 CPU, 1 GPU per worker but no node of the Ray cluster can hold that")
    assert not [e for e in events(run) if e["event"] == "worker_requested"]


def test_without_reuse_every_task_gets_a_fresh_worker_through_ray_client(cluster: RayCluster, tmp_path: Path) -> None:
    cluster.add_node(cpus=2)
    cfg = write_config(tmp_path, f"type=RayRunner, address={cluster.client_address!r}, reuse_workers=False",
                       model=", load_s=0.3", rows=30, task_rows=10)
    res = run_cli(cfg, "--mode", "infer")
    assert res.returncode == 0, res.stderr[-3000:]
    run = run_dir(tmp_path)
    started = stage_events(run, "infer", "started")
    assert len({e["resources"]["actor_id"] for e in started}) == len(started) == 4
    assert all(s >= 0.3 for s in load_times(run).values())  # every task loaded the model itself


def test_stages_at_once_on_different_clusters_is_one_line(cluster: RayCluster, tmp_path: Path) -> None:
    """One process holds one Ray connection: the eval stage, which runs beside the infer stage, must
    name the same cluster (here the same one, once through Ray Client: different connections)."""
    cluster.add_node(cpus=1)
    cfg = write_config(tmp_path, ray_runner(cluster), model=", delay_s=0.5",
                       eval_runner=f"dict(type=RayRunner, address={cluster.client_address!r}, "
                                   "task=dict(type=EvalTask))")
    res = run_cli(cfg)
    assert res.returncode == 2, res.stderr[-3000:]
    (line,) = [x for x in res.stderr.splitlines() if "orchestra: error:" in x]
    assert "two stages running at once ask for different Ray clusters or runtime_env" in line
    assert "eval=dict(overlap=False)" in line
    assert cluster.wait_no_actors(timeout_s=30) == []


def test_resume_after_sigkill_kills_the_actors_the_killed_orchestrator_left(cluster: RayCluster,
                                                                          tmp_path: Path) -> None:
    """Ray Client keeps a dead driver's actors for its reconnect grace period: ``-r`` finds them in
    the run folder's ledger (``<run>/ray/jobs.jsonl``) and kills them before it starts its own.

    The killed orchestrator asks for a grace of 600 s (the client sets it): with Ray's 30 s, the
    actors could go on their own before a ``-r`` that starts slowly on a loaded machine looks."""
    from helpers import jsonl, wait_for

    cluster.add_node(cpus=2)
    cfg = write_config(tmp_path, f"type=RayRunner, address={cluster.client_address!r}, max_num_workers=2",
                       model=", delay_s=5")
    proc = start_cli(cfg, "--mode", "infer", env={"RAY_CLIENT_RECONNECT_GRACE_PERIOD": "600"})
    try:
        # a hang guard, not a bound: a worker's first start on a loaded 2-core machine can take a minute
        wait_for_event(tmp_path, lambda e: e["event"] == "started", timeout_s=180, proc=proc)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        proc.kill()
    run = run_dir(tmp_path)
    # every actor it recorded, created or still being created (``submitting``) when it was killed
    first = {r["name"] for r in jsonl(run / "ray" / "jobs.jsonl")}
    left = first & {a["name"] for a in cluster.live_actors()}
    assert left, "the killed orchestrator's actors were gone at once: nothing for -r to do"
    res = run_cli(cfg, "-r", "--mode", "infer", timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    stopped = {r["name"] for r in jsonl(run / "ray" / "jobs.jsonl")
               if r["state"] == "stopped" and r.get("reason") == "left by an earlier orchestrator"}
    assert stopped >= left and stopped <= first
    # a kill takes a moment to reach the GCS
    assert wait_for(lambda: not first & {a["name"] for a in cluster.live_actors()}, 30, "the old actors to go")
    (recovered,) = [e for e in events(run) if e["event"] == "ray_recovered"]
    assert set(recovered["stopped"]) == stopped


def test_workers_that_cannot_start_fail_their_tasks_with_rays_reason(cluster: RayCluster, tmp_path: Path) -> None:
    # a runtime_env Ray cannot set up on any node: every actor's start fails the same way, so the
    # pool gives up on their kind and its tasks fail with Ray's words instead of waiting for ever
    cluster.add_node(cpus=1)
    cfg = write_config(tmp_path, ray_runner(cluster, ", runtime_env={'conda': 'orchestra-no-such-env'}"),
                       rows=10, task_rows=10)
    t0 = time.monotonic()
    res = run_cli(cfg, "--mode", "infer")
    assert res.returncode == 1, res.stderr[-3000:]
    assert time.monotonic() - t0 < 90
    run = run_dir(tmp_path)
    failed = stage_events(run, "infer", "failed")
    assert len(failed) == 2, failed
    assert all(e["reason"].startswith("a Ray worker could not start") and "runtime env" in e["reason"] for e in failed)
    assert not stage_events(run, "infer", "started")  # no task ran: each failed before a worker took it
    assert "FAILED: infer task" in res.stderr


def publish_node_types(cluster: RayCluster, groups: list[tuple[dict[str, int], int]] | None) -> None:
    """What an autoscaler publishes to the head: the node types it may add (resources, max count),
    as Ray's ``ClusterConfig`` in the GCS's key-value store; None withdraws them."""
    code = (
        "import ray\n"
        "from ray._raylet import GCS_AUTOSCALER_STATE_NAMESPACE as NS, GCS_AUTOSCALER_CLUSTER_CONFIG_KEY as KEY\n"
        "from ray.core.generated.autoscaler_pb2 import ClusterConfig, NodeGroupConfig\n"
        "from ray.experimental.internal_kv import _internal_kv_del, _internal_kv_put\n"
        f"ray.init(address={cluster.address!r}, log_to_driver=False)\n"
        f"groups = {groups!r}\n"
        "if groups is None:\n"
        "    _internal_kv_del(KEY, namespace=NS)\n"
        "else:\n"
        "    config = ClusterConfig(node_group_configs=[NodeGroupConfig(name=f'type{i}', resources=r, max_count=n)\n"
        "                                               for i, (r, n) in enumerate(groups)])\n"
        "    _internal_kv_put(KEY, config.SerializeToString(), namespace=NS)\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=ray_env())
    assert res.returncode == 0, res.stderr[-3000:]


def test_task_a_node_type_of_the_autoscaler_can_hold_waits_for_it(cluster: RayCluster, tmp_path: Path) -> None:
    # no node holds a GPU now, but the autoscaler may add one with a GPU: the task is not refused at
    # planning (as without it, test_task_no_node_can_hold_fails_at_planning) and its worker waits in
    # Ray's queue, where an autoscaler sees the demand; a node type of max count 0 is never added
    cluster.add_node(cpus=1)
    publish_node_types(cluster, [({"CPU": 1, "GPU": 1}, 2), ({"CPU": 1, "GPU": 8}, 0)])
    try:
        cfg = write_config(tmp_path, ray_runner(cluster), model=", run_cfg=dict(num_gpus=1)", rows=10, task_rows=10)
        proc = start_cli(cfg, "--mode", "infer")
        try:
            requested = wait_for_event(tmp_path, lambda e: e["event"] == "worker_requested", proc=proc)
            assert requested["num_gpus"] == 1.0
            time.sleep(1.0)  # a few rounds: nothing fails while the worker waits for its node
            os.killpg(proc.pid, signal.SIGINT)
            out, err = proc.communicate(timeout=60)
        finally:
            proc.kill()
        assert proc.returncode == 130, err[-3000:]
        run = run_dir(tmp_path)
        (info,) = [e for e in events(run) if e["event"] == "ray_cluster"]
        assert info["node_types"] == [{"CPU": 1, "GPU": 1}]
        assert not stage_events(run, "infer", "failed") and not stage_events(run, "infer", "started")
    finally:
        publish_node_types(cluster, None)


def test_mem_gb_is_reserved_in_rays_accounting(cluster: RayCluster, tmp_path: Path) -> None:
    # mem_gb becomes the actors' Ray ``memory`` option: more than any node has is refused at planning
    cluster.add_node(cpus=1)
    cfg = write_config(tmp_path, ray_runner(cluster, ", mem_gb=100000"), rows=10, task_rows=10)
    res = run_cli(cfg, "--mode", "infer")
    assert res.returncode == 1, res.stderr[-3000:]
    (failed, *_) = stage_events(run_dir(tmp_path), "infer", "failed")
    assert failed["reason"].startswith(f"needs 1 CPU, {100000 * 1024**3:g} memory per worker but no node of the Ray "
                                       "cluster can hold that"), failed["reason"]
