"""What an earlier orchestrator of this run folder left in Slurm (``-r`` after a SIGKILL).

sbatch jobs outlive the orchestrator that submitted them (srun jobs do not: each srun gets
SIGTERM when the orchestrator dies and cancels its job).  Every sbatch job is in the run
folder's ledger (``<run>/slurm/jobs.jsonl``, ``core.ledger``) before its id is relied on; a new
launch of the same stage reads it: a job still alive that runs the very spec of one of its tasks
is adopted by that task's first attempt (no second submission), any other is cancelled.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from orchestra.runners.core.ledger import JobRecord, Ledger, Seen, spec_digest, triage
from orchestra.runners.slurm.state import SlurmCommandError, cancel_and_wait, squeue, squeue_by_name
from orchestra.tasks.spec import TaskSpec


def recover(ledger: Ledger, tasks: Sequence[TaskSpec], cancel_timeout_s: float) -> dict[str, JobRecord]:
    """Adopt or cancel the jobs of this launch's stage that the ledger shows possibly alive and no
    launch of this process handles; returns the adopted ones by task id."""
    if not tasks:
        return {}
    interrupted, known = ledger.left_behind(tasks[0].stage)
    _cancel_unknown(interrupted, ledger, cancel_timeout_s)
    if not known:
        return {}
    try:
        states = squeue(r.job_id for r in known)
    except SlurmCommandError:
        states = {}
    seen: dict[str, Seen] = {r.name: None if r.job_id not in states else "over" if states[r.job_id].terminal
                             else "alive" for r in known}
    over, adopt, stop = triage(known, seen, {t.task_id: spec_digest(t) for t in tasks})
    for rec in over:
        ledger.record("ended", rec.name, job_id=rec.job_id, slurm_state=states[rec.job_id].state)
    cancel_records(stop, ledger, cancel_timeout_s, "left by an earlier orchestrator of this run folder, not needed")
    return {rec.task_id: rec for rec in adopt}


def cancel_records(records: Sequence[JobRecord], ledger: Ledger | None, timeout_s: float, why: str) -> None:
    """scancel these jobs, recorded (when there is a ledger) before (``stop_sent``) and after
    (``stopped`` once squeue agrees, else ``stop_unconfirmed``)."""
    if not records:
        return
    if ledger is not None:
        for rec in records:
            ledger.record("stop_sent", rec.name, job_id=rec.job_id, reason=why)
    gone = cancel_and_wait([r.job_id for r in records], timeout_s)
    if ledger is not None:
        for rec in records:
            ledger.record("stopped" if gone else "stop_unconfirmed", rec.name, job_id=rec.job_id)


def _cancel_unknown(records: list[JobRecord], ledger: Ledger, timeout_s: float) -> None:
    """Jobs whose sbatch call was interrupted: found by their name (single jobs) and cancelled."""
    if not records:
        return
    try:
        found = squeue_by_name(r.name for r in records)
    except SlurmCommandError:
        found = {}
    ids = {name: job_id for job_id, (name, _) in found.items()}
    cancel_and_wait(list(found), timeout_s)
    for rec in records:
        ledger.record("submit_unknown", rec.name, job_id=ids.get(rec.name, ""))
        if rec.name not in ids:
            print(f"orchestra: warning: the sbatch submission of {rec.name} was interrupted before its job id was "
                  "known; if it was a job array, cancel it with scancel --name", file=sys.stderr)
