"""What a runner declares: every hook that the loop, the stages, the API and serving call on a
runner, each with its default, on one screen (``contract.py`` holds the session's side).

A backend must write one hook, ``open``; it overrides the others only where its default is wrong
for it.  Nothing outside this module and ``contract.py`` looks a hook up by name: a caller calls it.
The three capabilities at the end are what the conformance suite (``tests/runners/contract/``)
checks each backend against.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import ClassVar

from orchestra.runners.core.contract import Session
from orchestra.runners.core.run import RunContext
from orchestra.serving.pool import Placement
from orchestra.tasks.spec import TaskSpec


class RunnerHooks(abc.ABC):
    """The hooks of a runner (``BaseRunner`` adds the one loop that drives them)."""

    # -- what the loop asks ---------------------------------------------------------------------------
    #: names this backend adds to the template's fields (for error messages and docs)
    template_fields: ClassVar[tuple[str, ...]] = ("task_id", "stage", "num_gpus", "num_procs", "log_path")
    #: rerun an infrastructure failure at once, ahead of the queue, instead of after the backoff:
    #: for a backend whose other workers are ready to take it (a warm pool that replaces a dead worker)
    infra_retry_at_once: bool = False
    #: start the next round at once when a job ended and tasks wait: for a backend whose ``poll``
    #: costs nothing (local processes); one that asks a scheduler keeps one poll per interval
    refill_at_once: bool = False

    @abc.abstractmethod
    def open(self, ctx: RunContext, tasks: Sequence[TaskSpec]) -> Session:
        """Start one launch of ``tasks`` (connect, check tools, adopt what an earlier orchestrator
        of this run folder left running); the session the loop drives."""

    def settle_left(self, ctx: RunContext, stage: str) -> None:
        """Sort out what an earlier orchestrator of this run folder left of ``stage`` when this run
        launches none of its tasks (every output reused): ``open`` never runs then, so a backend
        whose jobs outlive the orchestrator records the ones over and stops the others here.
        Nothing by default: a local task dies with its orchestrator."""

    # -- what the API and the stages ask ----------------------------------------------------------
    #: this machine's GPUs the runner hands its tasks (None: it hands out none; a cluster places them)
    gpus: list[str] | None = None
    #: its warm workers may serve both stages of a run (``RunContext.shared``): when the infer and
    #: the eval stage's runners both say so, eval tasks borrow the infer stage's warm workers
    shares_warm_workers: bool = False

    def preflight(self) -> None:
        """A cheap check of what the runner will reach, asked once the plan is made and before any
        stage starts (raise ``UserError``: the run's one line).  Nothing by default."""

    # -- managed servers (``runners/core/served.py``) -----------------------------------------------
    #: replicas of served models run on this machine, on GPUs of ``gpus``
    serves_locally: bool = False
    #: why served models cannot run on this backend ("": the general sentence)
    serves_nowhere: str = ""

    def serve_placement(self) -> Placement | None:
        """Where this backend's cluster runs a replica (a Slurm job, a Ray actor); None: nowhere."""
        return None

    # -- what the backend can do (checked by tests/runners/contract/) -----------------------------
    #: its jobs outlive a SIGKILLed orchestrator, recorded first, and ``-r`` adopts or stops them
    #: (False: a job dies with its orchestrator, and ``-r`` starts it again)
    outlives_orchestrator: bool = False
    #: it tells the platform's failures (a lost node, a preemption) from the task's: ``Exit(infra=True)``
    #: (False: a job killed from outside is a failure of its task, named by its signal)
    reports_infra_loss: bool = False
    #: a task's own exit code reaches the loop (False: only done (0) or failed (1), e.g. warm actors)
    carries_exit_codes: bool = True
