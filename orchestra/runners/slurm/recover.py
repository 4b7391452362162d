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

from orchestra.cluster.slurm import SlurmCommandError, SlurmJobState, cancel_and_wait, squeue, squeue_by_name
from orchestra.runners.core.ledger import JobRecord, Ledger, Seen, record_stop
from orchestra.runners.core.recovery import recover_left
from orchestra.tasks.spec import TaskSpec


def recover(ledger: Ledger, tasks: Sequence[TaskSpec], cancel_timeout_s: float,
            adopt: dict[str, JobRecord], stage: str | None = None) -> None:
    """Adopt or cancel the jobs of this launch's stage that the ledger shows possibly alive and no
    launch of this process handles (``core.recovery``); the adopted ones go into ``adopt`` (by task
    id, the launcher's: its ``close`` cancels any no attempt took) before any cancel.  With no
    ``tasks``, the jobs of ``stage`` (a stage this run launches nothing of) are recorded or cancelled."""
    stage = tasks[0].stage if tasks else stage
    if stage is None:
        return
    states: dict[str, SlurmJobState] = {}

    def see(known: list[JobRecord]) -> dict[str, Seen]:
        try:
            states.update(squeue(r.job_id for r in known))
        except SlurmCommandError:
            pass  # no answer: those jobs are cancelled
        return {r.name: None if r.job_id not in states else "over" if states[r.job_id].terminal else "alive"
                for r in known}

    recover_left(
        ledger, stage, tasks, see,
        interrupted=lambda records: _cancel_unknown(records, ledger, cancel_timeout_s),
        ended=lambda rec: ledger.record("ended", rec.name, job_id=rec.job_id, slurm_state=states[rec.job_id].state),
        keep=lambda records: adopt.update({rec.task_id: rec for rec in records}),
        stop=lambda records, why: cancel_records(records, ledger, cancel_timeout_s, why))


def cancel_records(records: Sequence[JobRecord], ledger: Ledger | None, timeout_s: float, why: str) -> None:
    """scancel these jobs, recorded (when there is a ledger) before (``stop_sent``) and after
    (``stopped`` once squeue agrees, else ``stop_unconfirmed``: ``core.ledger.record_stop``, which a
    later ``-r`` looks at again).  Jobs not shown gone are named in one warning."""
    if not records:
        return

    def stop() -> dict[str, tuple[str, dict[str, object]]]:
        gone = cancel_and_wait([r.job_id for r in records], timeout_s)
        return {r.name: ("stopped" if gone else "stop_unconfirmed", {}) for r in records}

    words = record_stop(ledger, {r.name: (f"Slurm job {r.job_id}", {"job_id": r.job_id}) for r in records}, why, stop)
    alive = [f"{r.job_id} ({r.name})" for r in records if words[r.name] != "stopped"]
    if alive:
        print(f"orchestra: warning: Slurm job(s) {', '.join(alive)} not shown gone {timeout_s:g} s after scancel: "
              "they may still be alive (orchestra -r on this run folder cancels them again)", file=sys.stderr)


def _cancel_unknown(records: list[JobRecord], ledger: Ledger, timeout_s: float) -> None:
    """Jobs whose sbatch call was interrupted before its answer was read: looked for by the name the
    call gave (a job's own, or its array's, recorded as ``submitted_as``) and cancelled like any
    other (``cancel_records``: a cancel squeue does not confirm stays ``stop_unconfirmed``, for the
    next ``-r``).  When squeue cannot be asked, nothing is recorded: the ledger still says
    ``submitting`` and the next ``-r`` looks again."""
    if not records:
        return
    asked = {rec.name: rec.submitted_as or rec.name for rec in records}
    try:
        found = squeue_by_name(asked.values())
    except SlurmCommandError as exc:
        print(f"orchestra: warning: the sbatch submission(s) of {', '.join(r.name for r in records)} were "
              f"interrupted before their job id was known and squeue cannot say whether they exist ({exc}): "
              "they may still be alive; orchestra -r on this run folder looks for them again "
              "(or scancel --name NAME)", file=sys.stderr)
        return
    calls: dict[str, list[str]] = {}  # each array call's jobs, in the order the call listed them
    for _, line in ledger.entries():
        if isinstance(line, dict) and line.get("state") == "submitting" and line.get("submitted_as"):
            calls.setdefault(str(line["submitted_as"]), []).append(str(line.get("name")))
    ids: dict[str, list[str]] = {}
    for job_id, (name, _) in sorted(found.items()):
        ids.setdefault(name, []).append(job_id)
    stop: list[JobRecord] = []
    for rec in records:
        of_call = ids.get(asked[rec.name], [])
        if not of_call:  # squeue answered and has no job of that name
            ledger.record("submit_unknown", rec.name, job_id="")
            print(f"orchestra: warning: the sbatch submission of {rec.name} was interrupted before its job id was "
                  "known, and Slurm has no job of that name", file=sys.stderr)
        elif rec.submitted_as:  # an array: its element for this job is the one at its place in the call
            # its place among *all* the call's jobs (the ledger's order), not among those still unknown: a kill
            # between two of the call's `submitted` lines leaves the later ones unknown, the earlier ones known
            mine = calls.get(rec.submitted_as) or [rec.name]
            element = f"_{mine.index(rec.name)}"
            stop += [JobRecord(rec.name, job_id=j) for j in of_call if j.endswith(element)] or \
                [JobRecord(rec.name, job_id=j) for j in of_call if rec.name == mine[0]]
        else:
            stop += [JobRecord(rec.name, job_id=job_id) for job_id in of_call]
    cancel_records(stop, ledger, timeout_s, "its sbatch call was interrupted before the job id was read")
