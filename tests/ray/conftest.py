"""A real Ray cluster for the RayRunner tests, and the orchestrator run against it as the CLI.

The cluster (``cluster_driver.py``) lives in its own process for the whole session: a head that
holds no CPU, to which each test adds the worker nodes it needs, and removes or kills them while
a run goes on.  After each test the nodes it added are removed and the cluster must hold no live
actor: whatever a run started is gone.  Memory: the head ~560 MiB, each node ~230 MiB, each
worker ~150 MiB; the tests keep at most three nodes at once.
"""

from __future__ import annotations

import json
import os
import select
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
START_TIMEOUT_S = 90.0
CALL_TIMEOUT_S = 60.0


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "ray: starts real Ray clusters on this machine (still runs in CI)")


def ray_env() -> dict[str, str]:
    """The environment of every Ray process of these tests (cluster, orchestrator, workers)."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["RAY_AUTH_MODE"] = "disabled"  # throwaway clusters: no token in ~/.ray
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class RayCluster:
    """Commands to the cluster process (see ``cluster_driver.py``)."""

    def __init__(self) -> None:
        self.client_port = free_port()
        self.proc = subprocess.Popen([sys.executable, str(HERE / "cluster_driver.py"), str(self.client_port)],
                                     stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=ray_env(),
                                     start_new_session=True)
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
            os.killpg(self.proc.pid, 9)
            self.proc.wait()


@pytest.fixture(scope="session")
def ray_session_cluster() -> Iterator[RayCluster]:
    cluster = RayCluster()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def cluster(ray_session_cluster: RayCluster) -> Iterator[RayCluster]:
    """The session's cluster with no worker node; the nodes a test adds are removed after it,
    and no actor may be left alive by the run."""
    yield ray_session_cluster
    left = ray_session_cluster.wait_no_actors()  # before the nodes go: their removal would kill them
    for node_id in list(ray_session_cluster.added):
        ray_session_cluster.remove_node(node_id)
    assert not left, f"actors left alive on the cluster after the test: {left}"
