"""The ``-r`` steps after a SIGKILL of the orchestrator, the same for every backend that records its
jobs in the run folder's ledger (``core.ledger``): Slurm's sbatch jobs, DLC jobs.

``recover_left`` claims the jobs of a stage that an earlier orchestrator may have left (no launch of
this process handles them), hands the submissions killed before their id was known to the backend,
asks the backend what the cluster says of the others, records the ones that are over, hands the
adoptable ones (alive, not being stopped, running the very spec of one of this launch's tasks, one
per task) to the backend to keep, and only then stops (and records) every job that is neither over
nor adoptable.  Keeping first means no step can lose an adoptable job: a stop that raises leaves it
where the launch's ``close`` stops it, and a SIGKILL anywhere leaves it ``submitted`` or
``adopted`` in the ledger, which the next ``-r`` adopts.  What a backend asks, records, keeps and
stops with stays in the backend; the order of the steps and the rule live here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from orchestra.runners.core.ledger import JobRecord, Ledger, Seen, spec_digest, triage
from orchestra.tasks.spec import TaskSpec

#: the reason recorded for a job an earlier orchestrator left that no task of this launch adopts
NOT_NEEDED = "left by an earlier orchestrator of this run folder, not needed"


def recover_left(ledger: Ledger, stage: str | None, tasks: Sequence[TaskSpec],
                 see: Callable[[list[JobRecord]], Mapping[str, Seen]], *,
                 interrupted: Callable[[list[JobRecord]], None], ended: Callable[[JobRecord], None],
                 keep: Callable[[list[JobRecord]], None], stop: Callable[[list[JobRecord], str], None]) -> None:
    """Sort out what an earlier orchestrator left of ``stage`` (None: of every stage).

    Args:
        ledger: the run folder's ledger of this backend.
        stage: the stage whose jobs to claim; ``tasks``: the tasks this launch runs (may adopt).
        see: what the cluster says of these jobs (with an id), by job name; a name it leaves out
            is no answer (such a job is stopped).
        interrupted: handles the submissions killed before their job id was recorded.
        ended: records a job the cluster shows over.
        keep: takes the jobs to adopt, at most one per task (each for its task's first attempt),
            where the launch's ``close`` stops any no attempt took; called before ``stop``.
        stop: stops (and records) the jobs no task adopts, with the reason to record.
    """
    lost, known = ledger.left_behind(stage)
    if lost:
        interrupted(lost)
    if not known:
        return
    over, adopt, to_stop = triage(known, see(known), {t.task_id: spec_digest(t) for t in tasks})
    for rec in over:
        ended(rec)
    if adopt:
        keep(adopt)
    if to_stop:
        stop(to_stop, NOT_NEEDED)
