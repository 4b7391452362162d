"""The conformance suite's fixtures: the real local Slurm cluster and the DLC double, as their own
suites make them (their conftest and helpers, loaded by path), and one harness per backend."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from contract_backends import (
    REPO,
    Backend,
    dlc_backend,
    dlc_helpers,
    load,
    local_backends,
    ray_backend,
    slurm_backend,
    slurm_conftest,
)

from tests.unit_end import at_unit_end

slurm_cluster = slurm_conftest.slurm_cluster  # the session's cluster: reused if it answers, else started
_no_job_outlives_its_test = slurm_conftest._no_job_outlives_its_test  # a failed test's sbatch jobs cancelled

BACKENDS = [
    pytest.param("local", id="local"),
    pytest.param("srun", id="srun", marks=pytest.mark.slurm),
    pytest.param("sbatch", id="sbatch", marks=pytest.mark.slurm),
    pytest.param("dlc", id="dlc"),
    pytest.param("ray", id="ray", marks=pytest.mark.ray),
    pytest.param("example", id="example"),
]


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[Any]:
    """A real local Ray cluster (``tools/ray_cluster.py``, as the Ray suite's), the repository on its
    ``PYTHONPATH`` (the suite's model); a head with no CPU and one node of 3 CPUs, for the session
    (a node costs seconds to add: the scenarios share it, each leaving no actor behind)."""
    tools = load("contract_ray_cluster", REPO / "tools" / "ray_cluster.py")
    cluster = tools.ClusterProcess(tools.ray_env([str(REPO)]))
    at_unit_end("ray", cluster.stop)  # not idle until the session ends
    try:
        cluster.add_node(cpus=3)
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def ray_node(ray_cluster: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The session's cluster for this test; no actor may be left alive after it."""
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert not ray_cluster.live_actors(), "an earlier test left actors on the cluster"
    yield ray_cluster
    left = ray_cluster.wait_no_actors(60)  # a kill takes a moment to reach the GCS (more on a loaded machine)
    assert not left, f"actors left alive on the cluster after the test: {left}"


@pytest.fixture
def double(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The DLC double's cloud in ``tmp_path / 'cloud'``, its ``dlc`` first on PATH (as the DLC suite's)."""
    cloud = dlc_helpers.Double(tmp_path / "cloud")
    monkeypatch.setenv("FAKE_DLC_STATE", str(cloud.state))
    monkeypatch.setenv("PATH", f"{dlc_helpers.BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    yield cloud
    cloud.kill_all()


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    """The backend under test, with what it needs running (the Slurm cluster, the DLC double)."""
    name = request.param
    if name in ("srun", "sbatch"):
        made = slurm_backend(name, name, request.getfixturevalue("slurm_cluster"), tmp_path)
    elif name == "ray":
        made = ray_backend(request.getfixturevalue("ray_node"))
    elif name == "dlc":
        made = dlc_backend(request.getfixturevalue("double"), tmp_path)
    else:
        made = next(b for b in local_backends() if b.name == name)
    try:
        yield made
    finally:
        for undo in made.teardown:
            undo()
