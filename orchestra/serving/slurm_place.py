"""Replicas placed on Slurm: each one a batch job of its own that holds the replica's GPUs.

The job runs :mod:`orchestra.serving.agent` (``sbatch`` with ``--gres`` for the replica's GPUs, a
script ``replica-<i>.sh`` beside its log that only ``exec``\\ s the agent).  The agent starts the
engine on the node, bound to the node's address, checks it as the local pool does, and writes the replica's address to
``replica-<i>.status.json`` in the run folder (which the nodes share with the orchestrator, as
``launcher='sbatch'`` needs too).  From here a :class:`SlurmReplica` looks like a local one to the
pool: ``check`` reads the status and asks the replica itself whether it refuses a request without
the key; ``stop`` is ``scancel`` until ``squeue`` agrees (the job stops whole); ``exited`` asks ``squeue``
(at most once a second).  Every call to Slurm is the one Slurm client's (``orchestra.cluster.slurm``,
as the runner's): sbatch's refusals read the same (a refusal for now waits and goes again, on the
runners' schedule), one table of finished states.  The servers' ledger records a job's name before
sbatch runs and its id once sbatch answered, so a later orchestrator of the run folder cancels what
a crashed one left, even one killed inside the sbatch call (:func:`cancel_stale`, by name then).

The key: the job gets the *path* of the run's key file (0600, in a 0700 folder of this user
under the temp folder) in its environment, never the key.  The orchestrator's variables whose
names say secret (``HF_TOKEN``, ...) reach the job through a private file of the run folder
(``orchestra.envfile``), deleted when the replica stops, not through Slurm, which stores a batch job's
environment.  The nodes must see that folder: one
machine, or ``TMPDIR`` on a filesystem the nodes share (docs/serving.md).
"""

from __future__ import annotations

import glob
import os
import pwd
import shlex
import socket
import sys
import time
from dataclasses import dataclass

from orchestra import envfile
from orchestra.cluster.refusal import SUBMIT_WAIT_S, backoff_after
from orchestra.cluster.slurm import (
    TERMINAL_STATES,
    SbatchError,
    SbatchRefused,
    SlurmCommandError,
    cancel_and_wait,
    job_state,
    output_arg,
    scancel,
    squeue,
    squeue_by_name,
    submit_batch,
)
from orchestra.fileio import atomic_write_text
from orchestra.secretnames import secret_variables
from orchestra.serving.agent import check_placed, own_status, write_spec
from orchestra.serving.presets import KEY_FILE_ENV
from orchestra.serving.replica import Replica
from orchestra.serving.spec import ServerSpec

LOOK_S = 1.0  #: ``squeue`` is asked about a replica's job at most this often
CANCEL_WAIT_S = 20.0  #: how long a stop waits for squeue to show a replica's job gone

__all__ = ["SlurmPlacement", "SlurmReplica", "batch_script", "cancel_stale", "job_state", "output_arg",
           "remove_private_files"]


def batch_script(argv: list[str], log_path: str, env_file: str = "") -> str:
    """The job's script: ``exec`` of ``argv`` (quoted for ``sh``: spaces, quotes, newlines, ``$``
    in a path are plain characters), its output appended to ``log_path`` by the shell itself;
    ``env_file`` (``orchestra.envfile``) sourced first."""
    lines = envfile.source_lines(env_file, "the replica's private variables; deleted when it stops") if env_file else []
    return "\n".join(["#!/bin/sh", *lines, f"exec {shlex.join(argv)} >>{shlex.quote(log_path)} 2>&1"]) + "\n"


def cancel_stale(job: str, name: str) -> None:
    """Cancel a replica job a crashed orchestrator left, if it still is that job: a replica's job
    name (``orc-serve-...``, as recorded) and this user's.  The ledger is in the run folder and job
    names are anyone's to choose: as root or a Slurm operator, ``scancel`` would end another user's job.
    ``job`` empty: the ledger holds the intent (recorded before sbatch) but no id (the orchestrator
    died in or right after the sbatch call): the job, if sbatch made one, is found by its name."""
    if not name.startswith("orc-serve-"):
        return
    me = pwd.getpwuid(os.geteuid()).pw_name
    if job:
        found = job_state(job)
        if found is None or found[2] in TERMINAL_STATES or found[0] != name or found[1] != me:
            return
        cancel_and_wait([job], CANCEL_WAIT_S)
        return
    try:
        named = squeue_by_name([name], user=me)
    except SlurmCommandError:
        return
    alive = [jid for jid, (jname, state) in named.items() if jname == name and state not in TERMINAL_STATES]
    if alive:
        cancel_and_wait(alive, CANCEL_WAIT_S)


def remove_private_files(servers_dir: str) -> None:
    """Delete the private files of secret-looking variables (``<model>/private/replica-<i>.env``)
    that a SIGKILLed orchestrator's replica jobs left in ``servers_dir``: for the orchestrator that
    holds the run lock, before it starts replicas (those jobs are cancelled, or run on with what
    they read at their start)."""
    for path in glob.glob(os.path.join(glob.escape(servers_dir), "*", "private", "replica-*.env")):
        envfile.remove_env_file(path)


@dataclass
class SlurmPlacement:
    """Where a :class:`~orchestra.serving.pool.ServerPool` puts replicas on a Slurm cluster: what
    every replica job asks for besides its GPUs (from the ``SlurmRunner``)."""

    tag: str  # the run's tag: job names are ``orc-serve-<tag>-<model>-<i>``
    partition: str | None = None
    qos: str | None = None
    gres: str = "gpu:{num_gpus}"

    def __call__(self, spec: ServerSpec, served_name: str, index: int, log_path: str,
                 servers_dir: str) -> Replica:
        model = os.path.basename(os.path.dirname(log_path))
        args = [f"--partition={self.partition}"] if self.partition else []
        args += [f"--qos={self.qos}"] if self.qos else []
        if spec.gpus_per_replica:
            args.append(f"--gres={self.gres.format(num_gpus=spec.gpus_per_replica)}")
        if spec.engine in ("llama.cpp", "command"):
            args.append(f"--cpus-per-task={spec.threads}")
        return SlurmReplica(spec, served_name, index, log_path, job_name=f"orc-serve-{self.tag}-{model}-{index}",
                            job_args=tuple(args), servers_dir=servers_dir)


@dataclass
class SlurmReplica(Replica):
    """A replica in a Slurm job of its own (see the module's docstring)."""

    job: str = ""
    job_name: str = ""
    job_args: tuple[str, ...] = ()
    servers_dir: str = ""
    looked: float = 0.0
    gone: int | None = None  # the job's end, once seen (1: it ended without telling its code)
    env_file: str = ""  # the private file of the job's secret-looking variables ("" when none)
    refused_since: float = 0.0  # when the cluster began refusing this replica's job for now (0: it does not)
    refusals: int = 0  # refusals for now in a row
    retry_at: float = 0.0  # the next sbatch of a refused job is not due before this

    @property
    def status_path(self) -> str:
        return self.log_path[: -len(".log")] + ".status.json"

    def start(self, key_file: str, socket_dir: str = "") -> None:
        """Submit the replica's job (the agent in it starts the engine); the job's name is in the
        servers' ledger (``record``) before sbatch runs.  A refusal for now (the cluster's job
        limits, a drained partition, a busy controller) leaves the replica ``waiting``: it is
        submitted again on the runners' schedule (``orchestra.cluster.refusal``), not yet launched.
        Raises OSError when sbatch refuses for good, or the cluster kept refusing for ``SUBMIT_WAIT_S``."""
        if time.monotonic() < self.retry_at:
            return  # refused for now: the next try is not due
        folder = os.path.dirname(self.log_path)
        os.makedirs(folder, exist_ok=True)
        try:
            os.unlink(self.status_path)
        except FileNotFoundError:
            pass
        spec_path = self.log_path[: -len(".log")] + ".spec.json"
        write_spec(spec_path, self.spec)
        agent = [sys.executable, "-m", "orchestra.serving.agent", "--spec", spec_path, "--name", self.served_name,
                 "--index", str(self.index), "--log", self.log_path, "--status", self.status_path,
                 "--heartbeat", os.path.join(self.servers_dir, "heartbeat"), "--owner-host", socket.gethostname()]
        # slurmctld stores a batch job's environment: secret-looking variables (HF_TOKEN for the
        # weights, ...) go through a private file the script sources, never through Slurm.
        private = secret_variables(os.environ)
        self.env_file = os.path.join(folder, "private", f"replica-{self.index}.env") if private else ""
        if self.env_file:
            envfile.write_env_file(self.env_file, private)
        script = self.log_path[: -len(".log")] + ".sh"
        atomic_write_text(script, batch_script(agent, self.log_path, self.env_file))
        argv = ["sbatch", "--parsable", f"--job-name={self.job_name}", output_arg(self.log_path),
                "--open-mode=append", "--nodes=1", "--ntasks=1", "--export=ALL", *self.job_args, script]
        env = {k: v for k, v in os.environ.items() if k not in private}
        self.record("submitting", job_name=self.job_name)  # before sbatch: a crash in it leaves the name
        try:
            job, _ = submit_batch(argv, env={**env, KEY_FILE_ENV: key_file})
        except SbatchRefused as exc:
            self.record("submit_failed", job_name=self.job_name, error=str(exc))
            self._drop_env_file()
            if not exc.transient:
                raise OSError(f"sbatch refused the replica's job: {exc}") from None
            self._refused(str(exc))
            return
        except SbatchError as exc:  # whether a job came of it may be unknown: the intent stays recorded
            self._drop_env_file()
            raise OSError(f"sbatch failed for the replica's job: {exc}") from None
        self.job, self.gone, self.looked, self.port = job, None, 0.0, 0
        self.refused_since, self.refusals, self.retry_at = 0.0, 0, 0.0
        self.state, self.started, self.code = "starting", time.monotonic(), None

    def _refused(self, reason: str) -> None:
        """The cluster refused the job for now: wait (``waiting``) and say so in the replica's log."""
        now = time.monotonic()
        self.refused_since = self.refused_since or now
        waited = now - self.refused_since
        if waited >= SUBMIT_WAIT_S:
            raise OSError(f"the Slurm cluster refused the replica's job for {waited:.0f} s: {reason}")
        self.refusals += 1
        delay = backoff_after(self.refusals)
        self.retry_at, self.state = now + delay, "waiting"
        with open(self.log_path, "a", encoding="utf-8") as log:
            log.write(f"===== slurm: the cluster refused the replica's job for now ({reason}); submitting again "
                      f"in {delay:g} s (waited {waited:.0f} s so far)\n")

    def _drop_env_file(self) -> None:
        if self.env_file:
            envfile.remove_env_file(self.env_file)

    def launched(self) -> bool:
        return bool(self.job)

    def ledger_fields(self) -> dict[str, object]:
        return {"slurm_job": self.job, "job_name": self.job_name}

    def _read_status(self) -> dict[str, object]:
        data = own_status(self.status_path)  # another user's file (or a link) is never believed
        return data if str(data.get("job", "")) == self.job else {}

    def _alive(self) -> bool | None:
        """Whether the job still runs or waits (None: squeue did not answer)."""
        try:
            info = squeue([self.job]).get(self.job)
        except SlurmCommandError:
            return None
        return info is not None and not info.terminal

    def exited(self) -> int | None:
        if not self.job:
            return None
        if self.gone is not None:
            return self.gone
        status = self._read_status()
        if status.get("state") in ("exited", "failed"):
            code = status.get("code")
            self.gone = code if isinstance(code, int) else 1
            return self.gone
        now = time.monotonic()
        if now - self.looked >= LOOK_S:
            self.looked = now
            if self._alive() is False:
                self.gone = 1
        return self.gone

    def check(self, key: str) -> str:
        return check_placed(self, self._read_status(), self.exited(), key)

    def ask_stop(self) -> None:
        if self.job and self.gone is None:
            scancel([self.job])

    def stop(self, grace_s: float = 5.0) -> None:
        if self.job and not cancel_and_wait([self.job], CANCEL_WAIT_S):
            print(f"orchestra: replica job {self.job} still listed by squeue after scancel", file=sys.stderr)
        self._drop_env_file()
        self.state = "stopped"

    def forget(self) -> int | None:
        code, self.job = self.gone, ""
        return code
