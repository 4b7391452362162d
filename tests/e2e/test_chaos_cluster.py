"""Chaos on the cluster backends: the orchestrator of a real run is SIGKILLed at seeded moments and
the run resumed with ``-r`` (``tests/e2e/chaos.py`` for the kill itself and the run folder's probes).

Cluster jobs outlive the orchestrator by design, so only the orchestrator is killed, and what the
resume must do is adopt the jobs still running rather than submit their tasks again.  Two backends:

* ``SlurmRunner(launcher='sbatch')`` on the local Slurm cluster (real sbatch, squeue, scancel);
* ``DLCRunner`` against the DLC double (``tests/runners/dlc/bin/dlc``: its jobs are real local
  processes that outlive the orchestrator too).

One clean run per backend gives the reference (results, predictions, files, the times of its
events); kill moments are drawn (fixed seed) over its event log, as in ``test_chaos_resume``, plus
an early one (the first submissions) and the last event.  After each kill the jobs of the run still
alive are noted (by the cluster's own listing); the resume must then end with exit 0, the clean
run's results and predictions and files, no temporary file, no output finished before the kill
written again, no job of the run left alive in the cluster, every job in the ledger
(``<run>/<backend>/jobs.jsonl``) over, and no task whose job was alive at the kill submitted again
(its job adopted, or recorded as ended).  Ctrl-C (Slurm): exit 130 within seconds and no job left.
Run with ``-s`` to see each kill's numbers.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from orchestra.runners.core.ledger import OVER, Ledger
from tests.e2e.chaos import (
    Point,
    after_kill,
    files_of,
    kill_at,
    kill_points,
    predictions_of,
    run_processes,
    sealed_outputs,
    start,
    temporary_files,
    the_run,
)
from tests.helpers import events, jsonl, summary_rows
from tests.runners.dlc import dlc_helpers
from tests.runners.slurm import slurm_helpers
from tests.runners.slurm.conftest import slurm_cluster  # noqa: F401 - the fixture

pytestmark = [pytest.mark.slow, pytest.mark.slurm]

SEED = 20261126
KILLS = 4  # seeded kill points over the clean run's event log
SLURM_RUNNER = "type=SlurmRunner, launcher='sbatch', partition='debug', poll_interval_s=0.2, max_num_workers=16"


@dataclass
class Backend:
    """What differs between the backends: how the run is configured, and what its cluster holds."""

    name: str  # the run folder's ledger folder as well
    cfg: Path
    alive: Callable[[Path], set[str]]  # the ids of the run's jobs the cluster shows alive


@dataclass
class Reference:
    """The clean run: its results, predictions, files and the times of its events."""

    rows: dict[tuple[str, str], dict]
    predictions: dict[str, list[str]]
    files: set[str]
    times: list[float]


@dataclass
class Seen:
    """One kill: the point, the ledger's length then, the jobs alive, and the run folder's state."""

    point: Point
    ledger_lines: int
    alive: set[str]
    sealed: dict[str, tuple[int, int]]
    done: int


def reference_of(backend: Backend, work: Path) -> Reference:
    proc = start(backend.cfg, work)
    _, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err[-3000:]
    run = the_run(work)
    assert not backend.alive(run)
    return Reference(summary_rows(run), predictions_of(run), outputs_of(run, backend), [e["ts"] for e in events(run)])


def outputs_of(run: Path, backend: Backend) -> set[str]:
    """``chaos.files_of`` less the backend's folder (its job scripts and logs are named by job id)."""
    return {f for f in files_of(run) if not f.startswith(f"{backend.name}/")}


def points_of(ref: Reference) -> list[Point]:
    """An early point (the first submissions), the seeded ones, and the last event (the summary)."""
    return [Point(1, 0.0), *kill_points(ref.times, KILLS, SEED), Point(len(ref.times), 0.0)]


def ledger_of(run: Path, backend: Backend) -> list[dict[str, Any]]:
    path = run / backend.name / "jobs.jsonl"
    return jsonl(path) if path.exists() else []


def kill_and_resume(backend: Backend, ref: Reference, work: Path, point: Point) -> tuple[Seen, list[dict]]:
    """Kill the orchestrator of a fresh run at ``point``, note what it left, resume to the end."""
    proc = start(backend.cfg, work)
    kill = kill_at(proc, work, point, "orchestrator")
    assert kill is not None, f"the run ended before the kill at {point} ({len(ref.times)} events)"
    after_kill(kill, work, jobs_outlive=True)
    run = the_run(work)
    seen = Seen(point, len(ledger_of(run, backend)), backend.alive(run), sealed_outputs(run),
                len(kill.done) if kill.done else 0)
    res = start(backend.cfg, work, "-r")
    _, err = res.communicate(timeout=180)
    assert res.returncode == 0, err[-3000:]
    assert summary_rows(run) == ref.rows
    assert predictions_of(run) == ref.predictions
    assert not temporary_files(run), f"left behind: {temporary_files(run)}"
    files = outputs_of(run, backend)
    assert files == ref.files, f"left behind: {sorted(files - ref.files)}, missing: {sorted(ref.files - files)}"
    redone = {p for p, st in seen.sealed.items() if sealed_outputs(run).get(p) != st}
    assert not redone, f"finished outputs written again after the kill at {point}: {redone}"
    assert not backend.alive(run), f"jobs of the run left alive: {backend.alive(run)}"
    assert not run_processes(work), f"processes of the run left: {run_processes(work)}"
    jobs = Ledger(str(run / backend.name)).jobs()
    assert all(rec.state in OVER for rec in jobs.values()), \
        f"ledger entries not over: {[(n, r.state) for n, r in jobs.items() if r.state not in OVER]}"
    return seen, ledger_of(run, backend)


def check_no_resubmission(seen: Seen, ledger: list[dict[str, Any]]) -> dict[str, str]:
    """No task whose job was alive at the kill is submitted again after it; what became of each
    such job in the resume (``adopted`` or ``ended``)."""
    task_of = {r["name"]: r["task_id"] for r in ledger if "task_id" in r}
    name_of = {r["job_id"]: r["name"] for r in ledger[:seen.ledger_lines] if r.get("job_id")}
    fate: dict[str, str] = {}
    for job_id in seen.alive:
        assert job_id in name_of, f"job {job_id} alive at the kill at {seen.point} is not in the ledger"
        name = name_of[job_id]
        later = [r for r in ledger[seen.ledger_lines:] if r["name"] == name or task_of.get(r["name"]) == task_of[name]]
        again = [r["name"] for r in later if r["state"] == "submitting"]
        assert not again, f"task {task_of[name]} (job {job_id} alive at the kill at {seen.point}) submitted again: {again}"
        fate[job_id] = next((r["state"] for r in later if r["name"] == name and r["state"] in ("adopted", "ended")),
                            "?")
        assert fate[job_id] != "?", f"job {job_id} alive at the kill at {seen.point}: {[r['state'] for r in later]}"
    return fate


# ---------------------------------------------------------------- Slurm (sbatch)

def squeue_alive(run: Path) -> set[str]:
    from orchestra.runners.slurm.state import TERMINAL_STATES
    return {j[0] for j in slurm_helpers.squeue_jobs(slurm_helpers.job_prefix(run)) if j[2] not in TERMINAL_STATES}


@pytest.fixture(scope="module")
def slurm_setup(slurm_cluster: Any, tmp_path_factory: pytest.TempPathFactory  # noqa: F811
                ) -> tuple[Backend, Reference]:
    folder = tmp_path_factory.mktemp("chaos_slurm")
    cfg = slurm_helpers.write_config(folder, SLURM_RUNNER, gpu=False, model=", delay_s=0.6")
    backend = Backend("slurm", cfg, squeue_alive)
    return backend, reference_of(backend, folder / "clean")


SLURM_POINTS = range(KILLS + 2)


@pytest.mark.parametrize("k", SLURM_POINTS)
def test_slurm_orchestrator_killed_then_resumed(slurm_setup: tuple[Backend, Reference], tmp_path: Path,
                                                 k: int) -> None:
    backend, ref = slurm_setup
    point = points_of(ref)[k]
    seen, ledger = kill_and_resume(backend, ref, tmp_path / "out", point)
    fate = check_no_resubmission(seen, ledger)
    print(f"\nchaos slurm: kill at {point} of {len(ref.times)} events: alive {len(seen.alive)}, "
          f"{sorted(fate.values())}, submissions {sum(r['state'] == 'submitting' for r in ledger)}")


def test_slurm_ctrl_c_stops_the_run_and_its_jobs(slurm_setup: tuple[Backend, Reference], tmp_path: Path) -> None:
    backend, ref = slurm_setup
    work = tmp_path / "out"
    point = points_of(ref)[2]
    proc = start(backend.cfg, work)
    kill = kill_at(proc, work, point, "sigint")  # exit 130 within 10 s, its processes gone: checked there
    assert kill is not None
    after_kill(kill, work)
    assert not squeue_alive(the_run(work))
    jobs = Ledger(str(the_run(work) / "slurm")).jobs()
    assert all(rec.state in OVER for rec in jobs.values())


# ---------------------------------------------------------------- DLC (the double)

@pytest.fixture(scope="module")
def dlc_cloud(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dlc_helpers.Double]:
    cloud = dlc_helpers.Double(tmp_path_factory.mktemp("dlc_cloud"))
    with pytest.MonkeyPatch.context() as mp:  # start() passes its environment on to the CLI
        mp.setenv("FAKE_DLC_STATE", str(cloud.state))
        mp.setenv("PATH", f"{dlc_helpers.BIN}{os.pathsep}{os.environ.get('PATH', '')}")
        yield cloud
    cloud.kill_all()


@pytest.fixture(scope="module")
def dlc_setup(dlc_cloud: dlc_helpers.Double, tmp_path_factory: pytest.TempPathFactory) -> tuple[Backend, Reference]:
    folder = tmp_path_factory.mktemp("chaos_dlc")
    cfg = dlc_helpers.write_config(folder, dlc_helpers.dlc_runner(folder), tasks=4, model=", load_s=1.5")

    def alive(run: Path) -> set[str]:
        ours = {r["job_id"] for r in ledger_of(run, backend) if r.get("job_id")}
        return set(dlc_cloud.alive()) & ours

    backend = Backend("dlc", cfg, alive)
    return backend, reference_of(backend, folder / "clean")


@pytest.mark.parametrize("k", range(KILLS + 2))
def test_dlc_orchestrator_killed_then_resumed(dlc_setup: tuple[Backend, Reference], dlc_cloud: dlc_helpers.Double,
                                              tmp_path: Path, k: int) -> None:
    backend, ref = dlc_setup
    point = points_of(ref)[k]
    before = len(dlc_cloud.calls("submit"))
    seen, ledger = kill_and_resume(backend, ref, tmp_path / "out", point)
    fate = check_no_resubmission(seen, ledger)
    submits = len(dlc_cloud.calls("submit")) - before
    assert submits == sum(r["state"] == "submitting" for r in ledger)  # every dlc submit is in the ledger
    print(f"\nchaos dlc: kill at {point} of {len(ref.times)} events: alive {len(seen.alive)}, "
          f"{sorted(fate.values())}, submissions {submits}")
