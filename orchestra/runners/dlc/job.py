"""One attempt as a DLC job (``DLCJob``), its name, and the decisions ``DLCRunner`` takes about it:
how an attempt ended (``attempt_exit``).  Pure functions of what the service and the run folder say."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from orchestra.fileio import stable_hash
from orchestra.runners.base import Exit
from orchestra.runners.core.ledger import JobRecord
from orchestra.runners.core.naming import job_name, run_tag
from orchestra.runners.dlc.cli import SUCCEEDED, DLCJobStatus
from orchestra.runners.dlc.logs import LogCursor
from orchestra.tasks.spec import TaskSpec

MAX_NAME = 512  # DLC's limit on a job name


@dataclass(frozen=True)
class Timings:
    """The runner's clocks (see ``DLCRunner`` for each)."""

    poll_interval_s: float
    max_poll_interval_s: float
    queue_timeout_s: float | None
    log_settle_s: float
    lost_after_s: float
    cancel_timeout_s: float


class JobNumbers:
    """The number in each attempt's job name, counted on from every name an earlier orchestrator of
    this run folder used (its ledger), so that a name is never given twice."""

    def __init__(self) -> None:
        self.base: dict[str, int] = {}  # task id -> the highest job name number in the ledger

    def seen(self, task_id: str, seq: int) -> None:
        """An earlier job of ``task_id`` had the number ``seq``."""
        self.base[task_id] = max(self.base.get(task_id, 0), seq)

    def seq(self, task: TaskSpec, attempt: int) -> int:
        """The number of ``attempt`` of ``task``."""
        return self.base.get(task.task_id, 0) + attempt


@dataclass
class DLCJob:
    """One attempt as a DLC job: what the runner knows and has decided about it."""

    name: str
    task_id: str
    stage: str
    attempt: int
    digest: str
    log_path: str
    exit_file: str
    argv: list[str]
    seq: int = 0  # the number in the job's name: attempts of every orchestrator of the run folder, counted on
    job_id: str | None = None
    adopted: bool = False
    submitted_wall: float = 0.0  # local clock when submit returned
    info: DLCJobStatus | None = None
    waiting_since: float | None = None  # monotonic: first seen waiting for resources
    next_check: float = 0.0  # monotonic: when a poll round next looks at it
    interval: float = 0.0
    exit_seen: bool = False  # the command's exit code file appeared: the job is ending, ask now
    get_error_since: float | None = None  # monotonic: ``dlc get job`` has failed since
    final_log_error_since: float | None = None  # monotonic: the read of its last log window has failed since
    final_log_given_up: bool = False  # that read was given up on (and the log says so)
    cursor: LogCursor | None = None
    drain_at: float | None = None  # service clock: when the final log window is read again
    over: bool = False  # the service showed it over (or it was never created)
    stop_reason: str = ""
    verdict: Exit | None = None  # how the attempt ended, once the stop this runner decided is over
    lock: threading.Lock = field(default_factory=threading.Lock)


def dlc_job_name(task: TaskSpec, seq: int) -> str:
    """``orc-<run tag>-<task_id>-a<seq>``, cut to DLC's 512 characters (a hash keeps it unique)."""
    name = job_name(run_tag(task.run_dir), task.task_id, seq)
    if len(name) <= MAX_NAME:
        return name
    suffix = f"-{stable_hash(name, 10)}-a{seq}"
    return name[: MAX_NAME - len(suffix)] + suffix


def orphan(record: JobRecord) -> DLCJob:
    """A job known only from the ledger (an earlier orchestrator's), to stop or record."""
    return DLCJob(record.name, record.task_id, record.stage, record.attempt, record.digest, "", "", [], record.seq,
                  job_id=record.job_id)


def attempt_exit(job_id: str, info: DLCJobStatus, code: int | None, tail: str) -> Exit:
    """How an attempt ended, from the job's final state and the exit code its command recorded.

    A recorded code is the task's own verdict (0: its outputs decide).  Without one the command
    never finished: ``Stopped`` (by someone else: this runner records its own stops) counts as a
    failure; anything else (node lost, preempted, image not pulled) is the platform's failure,
    ``Exit(infra=True)``.
    """
    why = f"DLC job {job_id} {info.describe()}"
    tail_part = f"; log tail: {tail}" if tail else ""
    if code == 0 or (code is None and info.status in SUCCEEDED):
        return Exit(0)
    if code is not None:
        return Exit(code, f"exit code {code}; {why}{tail_part}")
    if info.status == "Stopped":
        return Exit(-1, f"{why}: stopped from outside orchestra before the task finished")
    return Exit(-1, f"{why} before the task finished{tail_part}", infra=True)
