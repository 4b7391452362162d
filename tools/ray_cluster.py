"""A real Ray cluster on this machine, run in its own process and driven over stdin/stdout
(RayRunner's tests and benchmark use it, as the Slurm ones use tools/slurm_cluster.sh).

``python tools/ray_cluster.py [CLIENT_PORT]`` starts ``ray.cluster_utils.Cluster`` with a head that
holds no CPU (so work goes only to the worker nodes a test adds) and, given a port, a Ray Client
server (``ray://``) on it; it prints ``{"address": ...}`` and then
answers one JSON line per command line:

    add CPUS [GPUS]        -> {"node_id": ...}    a worker node joins
    remove NODE_ID [crash] -> {"removed": ...}    it leaves: gracefully, or killed (a spot loss)
    nodes                  -> {"nodes": [...]}    the worker nodes still up
    actors                 -> {"actors": [...]}   actors not DEAD: name, state, node id
    quit                   -> {"bye": true}       the cluster shuts down, leaving nothing behind

It never calls ``ray.init``: the processes under test are the cluster's only drivers.  Token
authentication is off (``RAY_AUTH_MODE=disabled``): the cluster lives as long as this process.
:class:`ClusterProcess` starts that process and sends it commands (``import ray_cluster`` with
``tools/`` on ``sys.path``).
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
from typing import Any

START_TIMEOUT_S = 90.0
CALL_TIMEOUT_S = 60.0


def ray_env(extra_path: list[str] | None = None) -> dict[str, str]:
    """This process's environment for every Ray process of a test cluster: no token auth, no
    ``RAY_ADDRESS`` of another cluster, and ``extra_path`` on ``PYTHONPATH``."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["RAY_AUTH_MODE"] = "disabled"
    env["PYTHONPATH"] = os.pathsep.join([*(extra_path or []), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class ClusterProcess:
    """A test cluster in a child process (its own session), and the commands it answers."""

    def __init__(self, env: dict[str, str] | None = None) -> None:
        self.client_port = free_port()
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), str(self.client_port)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     text=True, env=env or ray_env(), start_new_session=True)
        self.address: str = self._read(START_TIMEOUT_S)["address"]  # host:port of its GCS
        self.client_address = f"ray://127.0.0.1:{self.client_port}"
        self.added: list[str] = []

    def _read(self, timeout_s: float) -> dict[str, Any]:
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout_s)
        if not ready:
            raise TimeoutError(f"the Ray test cluster did not answer within {timeout_s:g} s")
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the Ray test cluster exited (code {self.proc.poll()})")
        reply: dict[str, Any] = json.loads(line)
        if "error" in reply:
            raise RuntimeError(f"Ray test cluster: {reply['error']}")
        return reply

    def call(self, command: str, timeout_s: float = CALL_TIMEOUT_S) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self._read(timeout_s)

    def add_node(self, cpus: int = 1, gpus: int = 0) -> str:
        node_id: str = self.call(f"add {cpus} {gpus}")["node_id"]
        self.added.append(node_id)
        return node_id

    def remove_node(self, node_id: str, crash: bool = False) -> None:
        self.call(f"remove {node_id}{' crash' if crash else ''}")
        self.added.remove(node_id)

    def live_actors(self) -> list[dict[str, Any]]:
        actors: list[dict[str, Any]] = self.call("actors")["actors"]
        return actors

    def wait_no_actors(self, timeout_s: float = 15.0) -> list[dict[str, Any]]:
        """The live actors left after ``timeout_s`` (a kill takes a moment to reach the GCS)."""
        deadline = time.monotonic() + timeout_s
        while True:
            left = self.live_actors()
            if not left or time.monotonic() > deadline:
                return left
            time.sleep(0.25)

    def stop(self) -> None:
        try:
            self.call("quit", timeout_s=60)
        except (RuntimeError, TimeoutError, OSError):
            pass
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def main() -> None:
    os.environ["RAY_AUTH_MODE"] = "disabled"  # a throwaway cluster: no token to write or read
    from ray.cluster_utils import Cluster

    client_port = int(sys.argv[1]) if len(sys.argv) > 1 else None  # a Ray Client server (ray://) on the head
    head: dict[str, Any] = {"num_cpus": 0, "include_dashboard": False}
    if client_port:
        head["ray_client_server_port"] = client_port
    cluster = Cluster(initialize_head=True, head_node_args=head)
    nodes: dict[str, Any] = {}

    def reply(obj: dict[str, Any]) -> None:
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()

    reply({"address": cluster.address})
    for line in sys.stdin:
        cmd = line.split()
        if not cmd:
            continue
        try:
            if cmd[0] == "add":
                node = cluster.add_node(num_cpus=int(cmd[1]), num_gpus=int(cmd[2]) if len(cmd) > 2 else 0,
                                        object_store_memory=80 * 1024**2)
                nodes[node.node_id] = node
                reply({"node_id": node.node_id})
            elif cmd[0] == "remove":
                cluster.remove_node(nodes.pop(cmd[1]), allow_graceful=cmd[2:] != ["crash"])
                reply({"removed": cmd[1]})
            elif cmd[0] == "nodes":
                reply({"nodes": sorted(nodes)})
            elif cmd[0] == "actors":
                table = cluster.global_state.actor_table(None)
                reply({"actors": [{"name": a.get("Name", ""), "state": a["State"],
                                   "node_id": a.get("Address", {}).get("NodeID", "")}
                                  for a in table.values() if a["State"] != "DEAD"]})
            elif cmd[0] == "quit":
                break
            else:
                reply({"error": f"unknown command {cmd[0]!r}"})
        except Exception as exc:  # noqa: BLE001 - the test reads it
            reply({"error": f"{type(exc).__name__}: {exc}"})
    cluster.shutdown()
    reply({"bye": True})


if __name__ == "__main__":
    main()
