"""Replicas placed on Slurm: each one a batch job of its own that holds the replica's GPUs.

The job runs :mod:`orchestra.serving.agent` (``sbatch`` with ``--gres`` for the replica's GPUs, a
script read from stdin that only ``exec``\\ s the agent).  The agent starts the engine on the node,
bound to the node's address, checks it as the local pool does, and writes the replica's address to
``replica-<i>.status.json`` in the run folder (which the nodes share with the orchestrator, as
``launcher='sbatch'`` needs too).  From here a :class:`SlurmReplica` looks like a local one to the
pool: ``check`` reads the status and asks the replica itself whether it refuses a request without
the key; ``stop`` is ``scancel`` (the job stops whole); ``exited`` asks ``squeue`` (at most once a
second).  The servers' ledger records every job id before it is relied on, so a later
orchestrator of the run folder cancels what a crashed one left (:func:`cancel_stale`).

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
import subprocess
import sys
import time
from dataclasses import dataclass

from orchestra import envfile
from orchestra.secretnames import secret_variables
from orchestra.serving.agent import check_placed, own_status, write_spec
from orchestra.serving.presets import KEY_FILE_ENV
from orchestra.serving.replica import Replica
from orchestra.serving.spec import ServerSpec

CALL_S = 30.0  #: the longest one Slurm client call may take
LOOK_S = 1.0  #: ``squeue`` is asked about a replica's job at most this often
_GONE = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY", "BOOT_FAIL",
         "DEADLINE")


def _client(argv: list[str], stdin: str | None = None, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """Run a Slurm client command: (exit code, stdout, stderr); (-1, '', why) when it cannot."""
    try:
        res = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=CALL_S, env=env, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return -1, "", f"{argv[0]}: {exc}"
    return res.returncode, res.stdout, res.stderr


def job_state(job: str) -> tuple[str, str, str] | None:
    """(name, user, state) of a job squeue knows; None: unknown (gone) or squeue cannot answer."""
    code, out, _ = _client(["squeue", "-h", "-t", "all", "-j", job, "-o", "%j|%u|%T"])
    parts = out.strip().split("|") if code == 0 else []
    return (parts[0], parts[1], parts[2]) if len(parts) == 3 else None


def _alive(job: str) -> bool | None:
    """Whether ``job`` still runs or waits (None: squeue did not answer)."""
    code, out, err = _client(["squeue", "-h", "-t", "all", "-j", job, "-o", "%T"])
    if code != 0:
        return False if "Invalid job id" in err else None
    states = out.split()
    return bool(states) and states[0] not in _GONE


def output_arg(path: str) -> str:
    """``sbatch --output`` for exactly ``path`` (Slurm's own messages about the job): sbatch reads
    ``%j``, ``%u``... in it as patterns (a run folder named ``a%jb`` sent the log to a folder that
    does not exist, and the job failed); ``%%`` is a plain ``%``, except in a name with a backslash,
    which Slurm expands its own way: then /dev/null (the script's redirection still logs)."""
    return "--output=/dev/null" if "\\" in path else f"--output={path.replace('%', '%%')}"


def batch_script(argv: list[str], log_path: str, env_file: str = "") -> str:
    """The job's script: ``exec`` of ``argv`` (quoted for ``sh``: spaces, quotes, newlines, ``$``
    in a path are plain characters), its output appended to ``log_path`` by the shell itself;
    ``env_file`` (``orchestra.envfile``) sourced first."""
    lines = envfile.source_lines(env_file, "the replica's private variables; deleted when it stops") if env_file else []
    return "\n".join(["#!/bin/sh", *lines, f"exec {shlex.join(argv)} >>{shlex.quote(log_path)} 2>&1"]) + "\n"


def cancel(job: str, wait_s: float = 20.0) -> bool:
    """``scancel`` a job and wait (at most ``wait_s``) until squeue shows it gone."""
    deadline = time.monotonic() + wait_s
    sent = 0.0
    while time.monotonic() < deadline:
        if time.monotonic() - sent > 2.0:  # again while it lingers
            _client(["scancel", job])
            sent = time.monotonic()
        if _alive(job) is False:
            return True
        time.sleep(0.2)
    return False


def cancel_stale(job: str, name: str) -> None:
    """Cancel a replica job a crashed orchestrator left, if it still is that job: a replica's job
    name (``orc-serve-...``, as recorded) and this user's.  The ledger is in the run folder and job
    names are anyone's to choose: as root or a Slurm operator, ``scancel`` would end another user's job."""
    found = job_state(job)
    if not name.startswith("orc-serve-") or found is None or found[2] in _GONE or found[0] != name:
        return
    if found[1] != pwd.getpwuid(os.geteuid()).pw_name:
        return
    cancel(job)


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

    @property
    def status_path(self) -> str:
        return self.log_path[: -len(".log")] + ".status.json"

    def start(self, key_file: str, socket_dir: str = "") -> None:
        """Submit the replica's job (the agent in it starts the engine); raises OSError if refused."""
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
        script = batch_script(agent, self.log_path, self.env_file)
        argv = ["sbatch", "--parsable", f"--job-name={self.job_name}", output_arg(self.log_path),
                "--open-mode=append", "--nodes=1", "--ntasks=1", "--export=ALL", *self.job_args]
        env = {k: v for k, v in os.environ.items() if k not in private}
        code, out, err = _client(argv, script, {**env, KEY_FILE_ENV: key_file})
        job = out.strip().split(";")[0]
        if code != 0 or not job.isdigit():
            raise OSError(f"sbatch refused the replica's job: {(err or out).strip()[-300:]}")
        self.job, self.gone, self.looked, self.port = job, None, 0.0, 0
        self.state, self.started, self.code = "starting", time.monotonic(), None

    def launched(self) -> bool:
        return bool(self.job)

    def ledger_fields(self) -> dict[str, object]:
        return {"slurm_job": self.job, "job_name": self.job_name}

    def _read_status(self) -> dict[str, object]:
        data = own_status(self.status_path)  # another user's file (or a link) is never believed
        return data if str(data.get("job", "")) == self.job else {}

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
            if _alive(self.job) is False:
                self.gone = 1
        return self.gone

    def check(self, key: str) -> str:
        return check_placed(self, self._read_status(), self.exited(), key)

    def ask_stop(self) -> None:
        if self.job and self.gone is None:
            _client(["scancel", self.job])

    def stop(self, grace_s: float = 5.0) -> None:
        if self.job and not cancel(self.job):
            print(f"orchestra: replica job {self.job} still listed by squeue after scancel", file=sys.stderr)
        if self.env_file:
            envfile.remove_env_file(self.env_file)
        self.state = "stopped"

    def forget(self) -> int | None:
        code, self.job = self.gone, ""
        return code
