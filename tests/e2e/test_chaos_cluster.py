"""Chaos on the cluster backends: the orchestrator of a real run is SIGKILLed at seeded moments and
the run resumed with ``-r`` (``tests/e2e/chaos.py`` for the kill itself and the run folder's probes).

Cluster jobs outlive the orchestrator by design, so only the orchestrator is killed, and what the
resume must do is adopt the jobs still running rather than submit their tasks again.  Two backends:

* ``SlurmRunner(launcher='sbatch')`` on the local Slurm cluster (real sbatch, squeue, scancel);
* ``DLCRunner`` against the DLC double (``tests/runners/dlc/bin/dlc``: its jobs are real local
  processes that outlive the orchestrator too).

One clean run per backend gives the reference (results, predictions, files, the times of its
events); kill moments are drawn (fixed seed) over its event log, as in ``test_chaos_resume``, plus
an early one (the first submissions) and the moment its last task is done (its summary being
written).  After each kill the jobs of the run still
alive are noted (by the cluster's own listing); the resume must then end with exit 0, the clean
run's results and predictions and files, no temporary file, no output finished before the kill
written again, no job of the run left alive in the cluster, every job in the ledger
(``<run>/<backend>/jobs.jsonl``) over, and no task whose job was alive at the kill submitted again
(its job adopted, or recorded as ended).  Ctrl-C (Slurm): exit 130 within seconds and no job left.
Run with ``-s`` to see each kill's numbers.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from orchestra.runners.core.ledger import OVER, Ledger
from tests.e2e.chaos import (
    Point,
    after_kill,
    event_count,
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
    alive: Callable[[Path], dict[str, str]]  # the run's jobs the cluster shows alive: {job id: job name}


@dataclass
class Reference:
    """The clean run: its results, predictions, files and the times of its events."""

    rows: dict[tuple[str, str], dict]
    predictions: dict[str, list[str]]
    files: set[str]
    times: list[float]
    tasks: int  # its tasks' ``done`` events


@dataclass
class Seen:
    """One kill: the point, the ledger's length then, the jobs alive, and the run folder's state."""

    point: Point
    ledger_lines: int
    alive: dict[str, str]
    sealed: dict[str, tuple[int, int]]
    done: int


def reference_of(backend: Backend, work: Path) -> Reference:
    proc = start(backend.cfg, work)
    _, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err[-3000:]
    run = the_run(work)
    assert not backend.alive(run)
    evs = events(run)
    return Reference(summary_rows(run), predictions_of(run), outputs_of(run, backend), [e["ts"] for e in evs],
                     sum(e["event"] == "done" for e in evs))


def outputs_of(run: Path, backend: Backend) -> set[str]:
    """``chaos.files_of`` less the backend's folder (its job scripts and logs are named by job id)."""
    return {f for f in files_of(run) if not f.startswith(f"{backend.name}/")}


def points_of(ref: Reference) -> list[Point]:
    """An early point (before the first submission) and the seeded ones."""
    return [Point(1, 0.0), *kill_points(ref.times, KILLS, SEED)]


#: kill points: ("events", k) is points_of's k-th; ("last", 0) the moment the run's last task is done
#: (counted in ``done`` events, not in all events: a run's count of status events varies); ("ledger",
#: n) the moment the run's ledger has its n-th line, with no delay: 1 and 3 are the ``submitting``
#: lines of the first two jobs (inside sbatch or dlc submit), 2 is the first ``submitted`` one
WHERE = [*(("events", k) for k in range(KILLS + 1)), ("last", 0), ("ledger", 1), ("ledger", 2), ("ledger", 3)]


def point_at(ref: Reference, backend: Backend, where: tuple[str, int]) -> tuple[Point, Callable[[Path], int]]:
    """The kill point and the lines it counts."""
    if where[0] == "events":
        return points_of(ref)[where[1]], event_count
    if where[0] == "last":
        return Point(1, 0.0), all_done(ref.tasks)
    return Point(where[1], 0.0), ledger_count(backend)


def all_done(tasks: int) -> Callable[[Path], int]:
    """1 once the run's event log has ``tasks`` ``done`` events, else 0."""
    def count(work: Path) -> int:
        logs = sorted(work.glob("*/events.jsonl"))
        done = 0
        for line in logs[-1].read_text().splitlines() if logs else ():
            try:
                done += json.loads(line).get("event") == "done"
            except ValueError:
                continue  # a line being written
        return int(done >= tasks)
    return count


def ledger_of(run: Path, backend: Backend) -> list[dict[str, Any]]:
    path = run / backend.name / "jobs.jsonl"
    return jsonl(path) if path.exists() else []


def ledger_count(backend: Backend) -> Callable[[Path], int]:
    """The lines of the run's ledger: a point counted in them lands between a job's ``submitting``
    and ``submitted`` lines, inside the submission call."""
    def count(work: Path) -> int:
        runs = sorted(p for p in work.iterdir() if p.is_dir()) if work.is_dir() else []
        return len(ledger_of(runs[-1], backend)) if runs else 0
    return count


def kill_and_resume(backend: Backend, ref: Reference, work: Path, point: Point,
                    count: Callable[[Path], int] = event_count, tries: int = 1,
                    on_start: Callable[[], None] = lambda: None) -> tuple[Seen, list[dict]]:
    """Kill the orchestrator of a fresh run at ``point`` (of the lines ``count`` counts), note what
    it left, resume to the end.  A point that the run may outpace (its last task done: the run ends
    milliseconds later) gets ``tries`` fresh runs to land in; ``on_start`` is called before each."""
    kill = None
    for _ in range(tries):
        if work.exists():
            shutil.rmtree(work)
        on_start()
        proc = start(backend.cfg, work)
        kill = kill_at(proc, work, point, "orchestrator", count)
        if kill is not None:
            break
    assert kill is not None, f"the run ended before the kill at {point} in {tries} tries ({len(ref.times)} events)"
    after_kill(kill, work, jobs_outlive=True)
    run = the_run(work)
    seen = Seen(point, len(ledger_of(run, backend)), backend.alive(run), sealed_outputs(run),
                len(kill.done) if kill.done else 0)
    res = start(backend.cfg, work, "-r")
    _, err = res.communicate(timeout=180)
    assert res.returncode == 0, err[-3000:]
    assert summary_rows(run) == ref.rows
    assert predictions_of(run) == ref.predictions
    left = temporary_files(run) + [str(p.relative_to(run)) for p in (run / backend.name).glob("submit-*")]
    assert not left, f"left behind: {left}"
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


def check_no_resubmission(seen: Seen, ledger: list[dict[str, Any]], finds_by_name: bool) -> dict[str, str]:
    """No task whose job was alive at the kill is submitted again after it; what became of each
    such job in the resume (``adopted``, ``ended``, or ``stopped`` when its task's output was sealed
    already).  A job whose submission the kill cut short
    (the ledger has its name, not its id) is not adoptable: with ``finds_by_name`` (Slurm) it must
    be found and cancelled, else (DLC) recorded ``submit_unknown``, which the run warns about."""
    task_of = {r["name"]: r["task_id"] for r in ledger if "task_id" in r}
    name_of = {r["job_id"]: r["name"] for r in ledger[:seen.ledger_lines] if r.get("job_id")}
    fate: dict[str, str] = {}
    for job_id, name in seen.alive.items():
        if job_id not in name_of:  # the kill came inside its submission call (name: the job's, or its array's)
            mine = {r["name"] for r in ledger if name in (r["name"], r.get("submitted_as"))}
            assert mine, f"job {job_id} ({name}) alive at the kill at {seen.point} is not in the ledger"
            later = [(r["state"], r.get("job_id")) for r in ledger[seen.ledger_lines:] if r["name"] in mine]
            if finds_by_name:  # Slurm: squeue --name finds it, and it is cancelled
                assert ("stopped", job_id) in later, f"job {job_id} ({name}), cut short at {seen.point}: {later}"
                fate[job_id] = "cut short, stopped"
            else:  # DLC: nothing lists jobs by name; -r records it unknown and warns (a known gap)
                assert any(st == "submit_unknown" for st, _ in later), f"job {job_id} ({name}): {later}"
                fate[job_id] = "cut short, unknown"
            continue
        name = name_of[job_id]
        later = [r for r in ledger[seen.ledger_lines:] if r["name"] == name or task_of.get(r["name"]) == task_of[name]]
        again = [r["name"] for r in later if r["state"] == "submitting"]
        assert not again, f"task {task_of[name]} (job {job_id} alive at the kill at {seen.point}) submitted " \
                          f"again: {again}"
        # adopted; or over; or cancelled as not needed, its task's output sealed already (not submitted again)
        fate[job_id] = next((r["state"] for r in later if r["name"] == name and r["state"] in
                             ("adopted", "ended", "stopped")), "?")
        assert fate[job_id] != "?", f"job {job_id} alive at the kill at {seen.point}: {[r['state'] for r in later]}"
    return fate


# ---------------------------------------------------------------- Slurm (sbatch)

def squeue_alive(run: Path) -> dict[str, str]:
    """The run's jobs squeue shows alive, an array's pending elements (``12_[0-2]``) one by one."""
    from orchestra.cluster.slurm import TERMINAL_STATES
    out = {}
    for job_id, name, state in slurm_helpers.squeue_jobs(slurm_helpers.job_prefix(run)):
        if state not in TERMINAL_STATES:
            base, _, spans = job_id.partition("_[")
            for span in spans.rstrip("]").split(",") if spans else ():
                lo, _, hi = span.split("%")[0].partition("-")
                out.update({f"{base}_{i}": name for i in range(int(lo), int(hi or lo) + 1)})
            if not spans:
                out[job_id] = name
    return out


@pytest.fixture(scope="module")
def slurm_setup(slurm_cluster: Any, tmp_path_factory: pytest.TempPathFactory  # noqa: F811
                ) -> tuple[Backend, Reference]:
    folder = tmp_path_factory.mktemp("chaos_slurm")
    cfg = slurm_helpers.write_config(folder, SLURM_RUNNER, gpu=False, model=", delay_s=0.6")
    backend = Backend("slurm", cfg, squeue_alive)
    return backend, reference_of(backend, folder / "clean")


def where_id(where: tuple[str, int]) -> str:
    return f"{where[0]}{where[1]}"


@pytest.mark.parametrize("where", WHERE, ids=where_id)
def test_slurm_orchestrator_killed_then_resumed(slurm_setup: tuple[Backend, Reference], tmp_path: Path,
                                                 where: tuple[str, int]) -> None:
    backend, ref = slurm_setup
    point, count = point_at(ref, backend, where)
    seen, ledger = kill_and_resume(backend, ref, tmp_path / "out", point, count, tries=3 if where[0] == "last" else 1)
    fate = check_no_resubmission(seen, ledger, finds_by_name=True)
    print(f"\nchaos slurm: kill at {where[0]} {point} of {len(ref.times)} events: alive {len(seen.alive)}, "
          f"{sorted(fate.values())}, submissions {sum(r['state'] == 'submitting' for r in ledger)}")


def test_slurm_ctrl_c_stops_the_run_and_its_jobs(slurm_setup: tuple[Backend, Reference], tmp_path: Path) -> None:
    backend, ref = slurm_setup
    work = tmp_path / "out"
    point = points_of(ref)[2]  # while the jobs run
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

    def alive(run: Path) -> dict[str, str]:
        names, prefix = dlc_cloud.names(), slurm_helpers.job_prefix(run)  # one job-name prefix per run folder
        return {j: names[j] for j in dlc_cloud.alive() if names.get(j, "").startswith(prefix)}

    backend = Backend("dlc", cfg, alive)
    return backend, reference_of(backend, folder / "clean")


@pytest.mark.parametrize("where", WHERE, ids=where_id)
def test_dlc_orchestrator_killed_then_resumed(dlc_setup: tuple[Backend, Reference], dlc_cloud: dlc_helpers.Double,
                                              tmp_path: Path, where: tuple[str, int]) -> None:
    backend, ref = dlc_setup
    point, count = point_at(ref, backend, where)
    before: list[int] = []  # the double's submissions before the run that was killed
    seen, ledger = kill_and_resume(backend, ref, tmp_path / "out", point, count, tries=3 if where[0] == "last" else 1,
                                   on_start=lambda: before.append(len(dlc_cloud.calls("submit"))))
    fate = check_no_resubmission(seen, ledger, finds_by_name=False)
    submits = len(dlc_cloud.calls("submit")) - before[-1]
    assert submits <= sum(r["state"] == "submitting" for r in ledger)  # each recorded before its dlc submit
    print(f"\nchaos dlc: kill at {where[0]} {point} of {len(ref.times)} events: alive {len(seen.alive)}, "
          f"{sorted(fate.values())}, submissions {submits}")
