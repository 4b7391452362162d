"""The run folder's record of every cluster job a backend started: ``<run>/<backend>/jobs.jsonl``
(Slurm's sbatch jobs, DLC jobs, Ray actors).

A line is appended (and fsynced) *before* each step that the record must survive: ``submitting``
before the submit call (``dlc submit``, ``sbatch``), ``submitted`` with the job id before the id is
used for anything, ``stop_sent`` before a stop, then ``stopped`` / ``ended`` once the cluster shows
the job over (``record_stop`` writes a stop's lines for every backend; a full disk never keeps a
stop from going out).  A later orchestrator on the same run folder (``-r``, even after a SIGKILL) folds the
lines into one state per job name (:meth:`Ledger.jobs`) and stops or adopts every job not known to
be over (a job still running the very spec of a task it runs is adopted: ``spec_digest``).
The file is an :class:`orchestra.journal.Journal` (append and fsync, fold, the words of
:data:`STATES` and their phases).

Within one process several launches may share a run folder at once (the eval stage runs beside the
infer stage): each job name is *claimed* (:meth:`Ledger.claim`) by the launch that submits, adopts
or stops it, and a launch only ever handles jobs no launch of this process has claimed.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from orchestra.fileio import stable_hash
from orchestra.journal import Journal, Phase, words_in
from orchestra.tasks.spec import TaskSpec

#: the ledger's words and their phase in :mod:`orchestra.journal` (what a run folder of any version holds)
STATES: dict[str, Phase] = {
    "submitting": "intent", "submitted": "started", "adopted": "started",
    "stop_sent": "stop_sent", "stop_acknowledged": "stop_sent", "stop_unconfirmed": "stop_sent",
    "stopped": "ended", "ended": "ended", "submit_failed": "failed", "submit_unknown": "failed"}
#: states after which a job needs nothing more from anyone
OVER = words_in(STATES, "ended", "failed")
#: states of a job that may still be alive (it has an id and was not seen over)
MAYBE_ALIVE = words_in(STATES, "started", "stop_sent")

#: what a backend says of a job an earlier orchestrator left: over, alive, being stopped, or no answer
Seen = Literal["over", "alive", "ending"] | None

_claimed: dict[str, set[str]] = {}  # ledger path -> job names some launch of this process handles
_claim_lock = threading.Lock()


def spec_digest(task: TaskSpec) -> str:
    """The content hash of a task spec: a job is adopted only by a task with the same spec."""
    return stable_hash(task.to_dict())


@dataclass
class JobRecord:
    """What the ledger says about one job (one attempt of one task)."""

    name: str
    task_id: str = ""
    stage: str = ""
    attempt: int = 0
    seq: int = 0  # the number in the job's name (unique per task across orchestrators of the run folder)
    digest: str = ""  # the task spec's content hash: an adopted job must run the same spec
    job_id: str = ""
    namespace: str = ""  # where the backend finds the job by its name (a Ray actor's namespace)
    submitted_as: str = ""  # the name the submission call gave, when not ``name`` (a Slurm array's)
    state: str = ""
    ts: float = 0.0


class Ledger(Journal):
    """Append-only job records of one run folder (thread-safe): the run folder's journal of its backend."""

    def __init__(self, folder: str) -> None:
        super().__init__(os.path.join(folder, "jobs.jsonl"), "name", STATES, mode=0o644)

    def record(self, state: str, name: str, **fields: Any) -> None:
        """Append ``{ts, state, name, ...}`` and fsync it before returning (a torn earlier line, a
        full disk's, never spoils this one; a torn one raises)."""
        self.append(state, name, **fields)

    def record_anyway(self, state: str, name: str, what: str, **fields: Any) -> None:
        """``record``, for a line that must not hold up what follows it (a stop goes out even when
        the ledger cannot be written, e.g. a full disk): a failure is one warning naming ``what``."""
        try:
            self.record(state, name, **fields)
        except OSError as exc:
            print(f"orchestra: warning: cannot record {state} of {what} in {self.path}: {exc}", file=sys.stderr)

    def claim(self, names: list[str]) -> list[str]:
        """Claim these job names for the caller; the ones no launch of this process had claimed yet."""
        with _claim_lock:
            mine = _claimed.setdefault(os.path.realpath(self.path), set())
            new = [n for n in dict.fromkeys(names) if n not in mine]
            mine.update(new)
            return new

    def unclaimed(self, records: dict[str, JobRecord]) -> dict[str, JobRecord]:
        """The records whose jobs no launch of this process handles (an earlier orchestrator's)."""
        with _claim_lock:
            mine = _claimed.get(os.path.realpath(self.path), set())
            return {n: r for n, r in records.items() if n not in mine}

    def jobs(self) -> dict[str, JobRecord]:
        """Every job name's latest state (fields carried over from its earlier lines)."""
        out: dict[str, JobRecord] = {}
        for name, rec in self.fold().items():
            job = out[name] = JobRecord(name, state=str(rec.get("state", "")), ts=float(rec.get("ts") or 0.0))
            for key in ("task_id", "stage", "digest", "job_id", "namespace", "submitted_as"):
                if rec.get(key):
                    setattr(job, key, str(rec[key]))
            for key in ("attempt", "seq"):
                if isinstance(rec.get(key), int):
                    setattr(job, key, rec[key])
        return out

    def left_behind(self, stage: str | None = None) -> tuple[list[JobRecord], list[JobRecord]]:
        """Claim the jobs of ``stage`` (None: of every stage) that an earlier orchestrator of this run
        folder may have left alive and no launch of this process handles.  Returns ``(interrupted,
        known)``: submissions killed before the job's id was recorded, and jobs with an id."""
        mine = [r for r in self.unclaimed(self.jobs()).values() if (stage is None or r.stage == stage)
                and (r.state == "submitting" or (r.job_id and r.state in MAYBE_ALIVE))]
        claimed = set(self.claim([r.name for r in mine]))
        mine = [r for r in mine if r.name in claimed]
        return [r for r in mine if r.state == "submitting"], [r for r in mine if r.state != "submitting"]


def triage(known: Sequence[JobRecord], seen: Mapping[str, Seen], wanted: Mapping[str, str]
           ) -> tuple[list[JobRecord], list[JobRecord], list[JobRecord]]:
    """Sort the jobs an earlier orchestrator may have left: ``(over, adopt, stop)``.

    ``seen``: what the cluster says of each job, by name.  ``wanted``: task id -> spec digest of the
    tasks this launch runs.  A job is adopted when it is alive or over, was not being stopped and
    runs the very spec of one of those tasks, one job per task (its latest): a job that ended after
    this launch planned its task to do (between the plan and this look) is that task's attempt,
    whose end the attempt reports, rather than a reason to submit the task again.  Every other job
    not seen over is stopped (no answer included: a stop of a job that is over is harmless).
    """
    over, adopt, stop = [], [], []
    taken: set[str] = set()
    for rec in sorted(known, key=lambda r: (r.task_id, -r.seq, -r.attempt)):
        state = seen.get(rec.name)
        if (state in ("alive", "over") and rec.state in ("submitted", "adopted")
                and wanted.get(rec.task_id) == rec.digest and rec.task_id not in taken):
            taken.add(rec.task_id)
            adopt.append(rec)
        elif state == "over":
            over.append(rec)
        else:
            stop.append(rec)
    return over, adopt, stop


def record_stop(ledger: Ledger | None, jobs: Mapping[str, tuple[str, Mapping[str, Any]]], reason: str,
                stop: Callable[[], Mapping[str, tuple[str, Mapping[str, Any]]]]) -> dict[str, str]:
    """Stop jobs with the ledger's lines around the stop: ``stop_sent`` (with ``reason``) for every
    job before ``stop`` runs, then the outcome ``stop`` gives each (``stopped``, ``stop_acknowledged``
    or ``stop_unconfirmed``: ``core.stop_each.outcome``).  A line that cannot be written is a warning.

    Args:
        ledger: where to record (None: nowhere; the stop still runs).
        jobs: job name -> (what warnings call it, the fields every line of it carries).
        stop: stops them all; job name -> (its outcome, more fields of that line).

    Returns:
        each job's outcome by name (``stop_unconfirmed`` where ``stop`` gave none).
    """
    if ledger is not None:
        for name, (what, fields) in jobs.items():
            ledger.record_anyway("stop_sent", name, what, **fields, reason=reason)
    outcomes = stop()
    words = {name: outcomes[name][0] if name in outcomes else "stop_unconfirmed" for name in jobs}
    if ledger is not None:
        for name, (what, fields) in jobs.items():
            more = outcomes[name][1] if name in outcomes else {}
            ledger.record_anyway(words[name], name, what, **fields, **more)
    return words

