"""A real Ray cluster for the RayRunner tests, and the orchestrator run against it as the CLI.

The cluster (``tools/ray_cluster.py``) lives in its own process for the whole session: a head that
holds no CPU, to which each test adds the worker nodes it needs, and removes or kills them while
a run goes on.  After each test the cluster must hold no live actor (whatever a run started is
gone) and the nodes it added are removed.  Memory: the head ~560 MiB, each node ~230 MiB, each
worker ~150 MiB; the tests keep at most three nodes at once.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.unit_end import at_unit_end

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
sys.path.insert(0, str(REPO / "tools"))

from ray_cluster import ClusterProcess  # noqa: E402

RayCluster = ClusterProcess


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "ray: starts real Ray clusters on this machine (still runs in CI)")


def ray_env() -> dict[str, str]:
    """The environment of every Ray process of these tests (cluster, orchestrator, workers): this
    folder (test models) and the repository on ``PYTHONPATH``."""
    import ray_cluster

    return ray_cluster.ray_env([str(HERE), str(REPO)])


@pytest.fixture(scope="session")
def ray_session_cluster() -> Iterator[RayCluster]:
    cluster = RayCluster(ray_env())
    at_unit_end("ray", cluster.stop)  # not idle until the session ends
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
