"""A real single-node Slurm cluster for tests, started by tools/slurm_cluster.sh.

The `slurm_cluster` fixture reuses a cluster that already answers, or starts one. It never
stops a cluster it did not start, and by default it also leaves running one it did start:
other test sessions on the same machine may be using it (it costs ~20 MiB and restarts in
under a second). Set ORCHESTRA_SLURM_STOP=1 to stop the cluster this session started.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[3] / "tools" / "slurm_cluster.sh"
DEFAULT_STATE_DIR = Path("/tmp/orchestra-slurm")
START_TIMEOUT_S = 300  # a first start may install the apt packages


@dataclasses.dataclass(frozen=True)
class SlurmCluster:
    """Where the test cluster lives and what it offers."""

    state_dir: Path
    conf: Path
    partitions: tuple[str, ...]
    default_partition: str
    gpu_partition: str
    num_gpus: int
    started_here: bool

    def saved_state(self, timeout_s: float = 30) -> dict[Path, bytes]:
        """Every file of slurmctld's StateSaveLocation (the jobs it holds: batch scripts, environments)
        with its bytes, read in one whole pass.  slurmctld saves a file by writing ``<name>.new`` and
        renaming it over ``<name>``, so a file listed may be gone when read; then the folder is read
        again (a pass that skipped it would miss what the rename put in place)."""
        line = next(x for x in self.conf.read_text().splitlines() if x.startswith("StateSaveLocation="))
        folder = Path(line.split("=", 1)[1].strip())
        assert folder.is_dir(), f"{self.conf}: StateSaveLocation {folder} is no folder"  # else nothing to read
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                return {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()}
            except FileNotFoundError:
                time.sleep(0.05)
        raise AssertionError(f"no whole read of {folder} in {timeout_s:g} s: its files kept going")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slurm: needs the local Slurm cluster (tools/slurm_cluster.sh, root)")


def _script(command: str, env: dict[str, str], timeout_s: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SCRIPT), command], env=env, capture_output=True, text=True, timeout=timeout_s, check=False
    )


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[SlurmCluster]:
    """The local Slurm cluster, with SLURM_CONF exported to this process and its children."""
    if os.geteuid() != 0:
        pytest.fail(f"the slurm tests need root to run {SCRIPT} (munged, slurmctld, slurmd); uid={os.geteuid()}")
    state_dir = Path(os.environ.get("ORCHESTRA_SLURM_DIR", DEFAULT_STATE_DIR)).absolute()
    env = {**os.environ, "ORCHESTRA_SLURM_DIR": str(state_dir)}
    started_here = False
    if _script("status", env, timeout_s=30).returncode != 0:
        result = _script("start", env, timeout_s=START_TIMEOUT_S)
        if result.returncode != 0:
            pytest.fail(
                f"{SCRIPT} start failed (exit {result.returncode}); logs in {state_dir / 'log'}\n"
                f"{result.stdout}{result.stderr}"
            )
        started_here = True
    cluster = SlurmCluster(
        state_dir=state_dir,
        conf=state_dir / "slurm.conf",
        partitions=("debug", "gpu"),
        default_partition="debug",
        gpu_partition="gpu",
        num_gpus=4,
        started_here=started_here,
    )
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SLURM_CONF", str(cluster.conf))
        mp.setenv("ORCHESTRA_SLURM_DIR", str(state_dir))
        yield cluster
    if started_here and os.environ.get("ORCHESTRA_SLURM_STOP") == "1":
        _script("stop", env, timeout_s=60)


@pytest.fixture(autouse=True)
def _no_job_outlives_its_test(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test that fails half-way (its orchestrator killed by the test's own clean-up) may leave
    sbatch jobs of its run folder, some of them hanging on purpose: cancel every job whose batch
    script lies under the test's tmp_path, so that they do not hold the cluster's CPUs for the
    tests after it.  A passing test asserts on its own that it left none."""
    yield
    if "tmp_path" not in request.fixturenames or not os.environ.get("SLURM_CONF"):
        return
    folder = str(request.getfixturevalue("tmp_path"))
    try:  # a test may have left a PATH without Slurm's commands (its monkeypatch may be undone later)
        listed = subprocess.run(["squeue", "-h", "-o", "%i|%o"], capture_output=True, text=True, timeout=30,
                                check=False)
        rows = (line.partition("|") for line in listed.stdout.splitlines())
        left = [job_id for job_id, _, script in rows if script.startswith(folder + os.sep)]
        if left:
            subprocess.run(["scancel", *left], capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.SubprocessError):
        return


def scontrol(*args: str) -> None:
    """Run ``scontrol`` (it must succeed)."""
    subprocess.run(["scontrol", *args], check=True, capture_output=True, text=True, timeout=30)


@pytest.fixture
def drained_partition(slurm_cluster: SlurmCluster) -> Iterator[str]:
    """A partition of this test alone, on the cluster's node, refusing submissions (DRAIN)."""
    name = f"orc_drain_{uuid.uuid4().hex[:8]}"
    scontrol("create", f"PartitionName={name}", "Nodes=localhost", "State=DRAIN", "MaxTime=10")
    try:
        yield name
    finally:
        subprocess.run(["scancel", f"--partition={name}"], capture_output=True, timeout=30, check=False)
        scontrol("delete", f"PartitionName={name}")
