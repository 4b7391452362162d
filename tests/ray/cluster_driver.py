"""A real Ray cluster on this machine, run in its own process and driven over stdin/stdout.

``python cluster_driver.py [CLIENT_PORT]`` starts ``ray.cluster_utils.Cluster`` with a head that
holds no CPU (so work goes only to the worker nodes a test adds) and, given a port, a Ray Client
server (``ray://``) on it; it prints ``{"address": ...}`` and then
answers one JSON line per command line:

    add CPUS [GPUS]        -> {"node_id": ...}    a worker node joins
    remove NODE_ID [crash] -> {"removed": ...}    it leaves: gracefully, or killed (a spot loss)
    nodes                  -> {"nodes": [...]}    the worker nodes still up
    actors                 -> {"actors": [...]}   actors not DEAD: name, state, node id
    quit                   -> {"bye": true}       the cluster shuts down, leaving nothing behind

It never calls ``ray.init``: the processes under test are the cluster's only drivers.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

os.environ["RAY_AUTH_MODE"] = "disabled"  # a throwaway cluster: no token to write or read

from ray.cluster_utils import Cluster  # noqa: E402


def main() -> None:
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
