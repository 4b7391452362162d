"""What an earlier orchestrator of this run folder left in Slurm (``-r`` after a SIGKILL).

sbatch jobs outlive the orchestrator that submitted them (srun jobs do not: each srun gets
SIGTERM when the orchestrator dies and cancels its job).  Every sbatch job is in the run
folder's ledger (``<run>/slurm/jobs.jsonl``, ``core.ledger``) before its id is relied on; a new
launch of the same stage reads it (``core.recovery.recover_left``: the steps and the rule every
backend shares): a job still alive that runs the very spec of one of its tasks is adopted by that
task's first attempt (no second submission), any other is cancelled.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from orchestra.runners.core.ledger import JobRecord, Ledger, Seen, record_stop
from orchestra.runners.core.recovery import recover_left
from orchestra.runners.slurm.state import SlurmCommandError, SlurmJobState, cancel_and_wait, squeue, squeue_by_name
from orchestra.tasks.spec import TaskSpec


def recover(ledger: Ledger, tasks: Sequence[TaskSpec], cancel_timeout_s: float) -> dict[str, JobRecord]:
    """Adopt or cancel the jobs of this launch's stage that the ledger shows possibly alive and no
    launch of this process handles (``core.recovery``); returns the adopted ones by task id."""
    if not tasks:
        return {}
    states: dict[str, SlurmJobState] = {}

    def see(known: list[JobRecord]) -> dict[str, Seen]:
        try:
            states.update(squeue(r.job_id for r in known))
        except SlurmCommandError:
            pass  # no answer: those jobs are cancelled
        return {r.name: None if r.job_id not in states else "over" if states[r.job_id].terminal else "alive"
                for r in known}

    adopt = recover_left(
        ledger, tasks[0].stage, tasks, see,
        interrupted=lambda records: _cancel_unknown(records, ledger, cancel_timeout_s),
        ended=lambda rec: ledger.record("ended", rec.name, job_id=rec.job_id, slurm_state=states[rec.job_id].state),
        stop=lambda records, why: cancel_records(records, ledger, cancel_timeout_s, why))
    return {rec.task_id: rec for rec in adopt}


def cancel_records(records: Sequence[JobRecord], ledger: Ledger | None, timeout_s: float, why: str) -> None:
    """scancel these jobs, recorded (when there is a ledger) before (``stop_sent``) and after
    (``stopped`` once squeue agrees, else ``stop_unconfirmed``): ``core.ledger.record_stop``."""
    if not records:
        return

    def stop() -> dict[str, tuple[str, dict[str, object]]]:
        gone = cancel_and_wait([r.job_id for r in records], timeout_s)
        return {r.name: ("stopped" if gone else "stop_unconfirmed", {}) for r in records}

    record_stop(ledger, {r.name: (f"Slurm job {r.job_id}", {"job_id": r.job_id}) for r in records}, why, stop)


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
