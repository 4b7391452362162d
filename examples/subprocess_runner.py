"""A backend to copy: each attempt one plain subprocess of this machine, under the one loop.

It shows the whole contract a backend writes (``docs/runners.md``, "Writing a backend"):
``open`` gives a ``Session`` with ``submit`` / ``poll`` / ``cancel`` / ``close``, and everything
else (queue, retries, timeouts, Ctrl-C, events) is the loop's.  Its jobs outlive the orchestrator,
as an ssh or a Kubernetes Job backend's do, so it records each job in the run folder's ledger
*before* it starts it, and an orchestrator on the same run folder (``-r``) stops what a killed one
left (adopting instead is what SlurmRunner and DLCRunner do, through ``core/recovery.py``).

To write an ssh backend, replace ``Popen`` by ``ssh HOST -- setsid ...`` and ``_stop_named`` by
``ssh HOST pkill -f JOBNAME``; for Kubernetes, ``kubectl create job NAME`` / ``get job`` /
``delete job``, one ``get`` per poll round for all jobs.  Use it from a config::

    from examples.subprocess_runner import SubprocessRunner
    infer = dict(runner=dict(type=SubprocessRunner, max_num_workers=4, task=dict(type=InferTask)), ...)

``tests/runners/contract/`` runs it through the conformance suite beside the real backends.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from typing import Unpack

from orchestra.runners.base import BaseRunner, CommandLoopOptions, Exit, Job, RunContext, Session
from orchestra.runners.core.ledger import Ledger, spec_digest
from orchestra.runners.core.proc import reap_group, signal_group, signal_name
from orchestra.tasks.spec import TaskSpec

JOB_ENV = "ORCHESTRA_EXAMPLE_JOB"  # the job's name, in its environment: how a later orchestrator finds it


class SubprocessRunner(BaseRunner):
    """Each attempt a subprocess in a session of its own; ``kill_grace_s`` between SIGTERM and SIGKILL."""

    outlives_orchestrator = True  # its jobs run on after a SIGKILL of the orchestrator; -r stops them

    def __init__(self, kill_grace_s: float = 3.0, **loop: Unpack[CommandLoopOptions]) -> None:
        super().__init__(**loop)  # the loop's options (max_num_workers, retry, timeout_s, ...), as given
        self.kill_grace_s = kill_grace_s

    def open(self, ctx: RunContext, tasks: Sequence[TaskSpec]) -> Session:
        session = SubprocessSession(Ledger(os.path.join(ctx.paths.root, "subprocess")), self.kill_grace_s)
        session.stop_left(tasks[0].stage if tasks else None)
        return session

    def settle_left(self, ctx: RunContext, stage: str) -> None:
        SubprocessSession(Ledger(os.path.join(ctx.paths.root, "subprocess")), self.kill_grace_s).stop_left(stage)


class SubprocessSession(Session):
    """One launch: its processes by job, and when each cancelled one gets SIGKILL."""

    def __init__(self, ledger: Ledger, kill_grace_s: float) -> None:
        self.ledger, self.grace_s = ledger, kill_grace_s
        self.procs: dict[Job, subprocess.Popen[bytes]] = {}
        self.kill_at: dict[Job, float] = {}

    def submit(self, jobs: Sequence[Job]) -> Mapping[Job, Exit]:
        refused: dict[Job, Exit] = {}
        for job in jobs:
            job.handle = name = f"{job.task.task_id}.{job.attempt}.{secrets.token_hex(3)}"
            self.ledger.claim([name])  # this launch's: another launch on the run folder leaves it alone
            self.ledger.record("submitting", name, task_id=job.task.task_id, stage=job.task.stage,
                               attempt=job.attempt, digest=spec_digest(job.task))  # before it can run
            try:
                with open(job.log_path, "ab") as log:
                    self.procs[job] = subprocess.Popen(
                        job.command.argv, env={**os.environ, **job.command.env, JOB_ENV: name},
                        stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            except OSError as exc:
                self.ledger.record("submit_failed", name)
                refused[job] = Exit(-1, f"could not start: {exc}")
        return refused

    def poll(self, jobs: Sequence[Job]) -> Mapping[Job, Exit]:
        ended: dict[Job, Exit] = {}
        for job in jobs:
            proc = self.procs[job]
            if time.monotonic() > self.kill_at.get(job, float("inf")):
                signal_group(proc.pid, signal.SIGKILL)  # cancelled and still there after its grace
            if (code := reap_group(proc)) is not None:  # what it left in its group is killed first
                self.ledger.record("ended", job.handle)
                del self.procs[job]
                self.kill_at.pop(job, None)
                ended[job] = Exit(code, f"killed by signal {signal_name(-code)}" if code < 0 else "")
        return ended

    def cancel(self, jobs: Sequence[Job]) -> None:
        for job in jobs:  # returns at once: poll reports each once it is gone
            signal_group(self.procs[job].pid, signal.SIGTERM)
            self.kill_at[job] = time.monotonic() + self.grace_s

    def placement(self, job: Job) -> dict[str, object]:
        return {"pid": self.procs[job].pid, "job": job.handle}

    def close(self) -> None:
        for job, proc in list(self.procs.items()):  # the net under an unexpected exit: nothing stays
            signal_group(proc.pid, signal.SIGKILL)
            proc.wait()
            self.ledger.record("stopped", job.handle)

    def stop_left(self, stage: str | None) -> None:
        """Stop every job of ``stage`` that an earlier orchestrator of this run folder left running."""
        interrupted, known = self.ledger.left_behind(stage)
        for record in [*interrupted, *known]:
            _stop_named(record.name)
            self.ledger.record("stopped", record.name, reason="left by an earlier orchestrator")


def _stop_named(name: str) -> None:
    """SIGKILL the process groups of the processes whose environment names job ``name``."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if f"{JOB_ENV}={name}".encode() in f.read().split(b"\0"):
                    signal_group(os.getpgid(int(pid)), signal.SIGKILL)
        except OSError:  # gone meanwhile, or not ours
            continue
