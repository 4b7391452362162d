"""Replicas placed on Ray: each one an actor holding the replica's GPUs (``num_gpus``).

The actor runs :mod:`orchestra.serving.agent` as a child process with a parent-death signal: the
agent starts the engine on the actor's node, bound to the node's address, checks it as the local
pool does and writes its address to a status file; the actor hands that status back to the
orchestrator (:meth:`ReplicaActor.look`), so the run folder need not be shared with the nodes for
it.  Killing the actor (``ray.kill``, its node lost, the driver gone: it is not detached, so Ray
ends it with its owner) ends the agent, which stops the engine's process group whole; and the
agent stops by itself once the pool's heartbeat goes stale.

Every Ray call from the pool's thread is non-blocking (``ray.wait(timeout=0)``) except a stop,
which waits a bounded time.  This module imports ``ray``: only ``RayRunner.serve_placement``
imports it, after the runner connected.
"""

from __future__ import annotations

import ctypes
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import ray

from orchestra.serving.agent import check_placed, own_status, write_spec
from orchestra.serving.presets import KEY_FILE_ENV
from orchestra.serving.replica import Replica
from orchestra.serving.spec import ServerSpec

LOOK_S = 0.5  #: how often an actor is asked how its replica is
STOP_S = 15.0  #: how long a stop waits for the agent before the actor is killed


def _die_with_actor() -> None:
    """``preexec_fn`` of the agent: SIGTERM when the actor's process (its thread) is gone."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class ReplicaActor:
    """The actor of one replica: it runs the agent and reports how it is (see the module)."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        self.status_path = ""

    def start(self, argv: list[str], key_file: str, status_path: str, log_path: str) -> dict[str, Any]:
        """Start the agent (``key_file``: a path; the key itself never travels through Ray)."""
        self.status_path = status_path
        os.makedirs(os.path.dirname(log_path), exist_ok=True)
        with open(log_path, "ab") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env={**os.environ, KEY_FILE_ENV: key_file}, preexec_fn=_die_with_actor)
        return self.look()

    def look(self) -> dict[str, Any]:
        """The agent's status file and its exit code (None: running)."""
        return {"status": own_status(self.status_path),  # another user's file is never believed
                "code": self.proc.poll() if self.proc is not None else None}

    def stop(self, grace_s: float = 10.0) -> int | None:
        """SIGTERM the agent (it stops the engine's group) and wait; SIGKILL it past ``grace_s``."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        return self.proc.returncode


_Actor = ray.remote(max_restarts=0, max_task_retries=0)(ReplicaActor)


@dataclass
class RayPlacement:
    """Where a :class:`~orchestra.serving.pool.ServerPool` puts replicas on a Ray cluster."""

    prefix: str  # actor names: ``<prefix>-<model>-<i>-<token>``
    before_session: bool = True  # the pool must close while the driver is still connected

    def __call__(self, spec: ServerSpec, served_name: str, index: int, log_path: str,
                 servers_dir: str) -> Replica:
        return RayReplica(spec, served_name, index, log_path, prefix=self.prefix, servers_dir=servers_dir)


@dataclass
class RayReplica(Replica):
    """A replica in a Ray actor of its own (see the module's docstring)."""

    prefix: str = ""
    servers_dir: str = ""
    actor: Any = None
    actor_id: str = ""
    token: str = ""
    pending: Any = None  # the ObjectRef of the last question to the actor
    last: dict[str, Any] = field(default_factory=dict)
    looked: float = 0.0
    gone: int | None = None

    def start(self, key_file: str, socket_dir: str = "") -> None:
        """Create the actor (``num_gpus`` = the replica's GPUs) and start the agent in it."""
        if not ray.is_initialized():
            raise OSError("not connected to the Ray cluster any more")
        base = self.log_path[: -len(".log")]
        os.makedirs(os.path.dirname(base), exist_ok=True)
        write_spec(base + ".spec.json", self.spec)
        self.token = secrets.token_hex(4)
        model = os.path.basename(os.path.dirname(self.log_path))
        cpus = self.spec.threads if self.spec.engine in ("llama.cpp", "command") else 1
        self.actor = _Actor.options(name=f"{self.prefix}-{model}-{self.index}-{self.token}", num_cpus=cpus,
                                    num_gpus=self.spec.gpus_per_replica).remote()
        self.actor_id = self.actor._actor_id.hex()
        agent = [sys.executable, "-m", "orchestra.serving.agent", "--spec", base + ".spec.json",
                 "--name", self.served_name, "--index", str(self.index), "--log", self.log_path,
                 "--status", base + ".status.json", "--heartbeat", os.path.join(self.servers_dir, "heartbeat"),
                 "--owner-host", socket.gethostname(), "--job", self.token]
        try:
            os.unlink(base + ".status.json")
        except FileNotFoundError:
            pass
        self.pending = self.actor.start.remote(agent, key_file, base + ".status.json", self.log_path)
        self.last, self.gone, self.looked, self.port = {}, None, time.monotonic(), 0
        self.state, self.started, self.code = "starting", time.monotonic(), None

    def launched(self) -> bool:
        return self.actor is not None

    def ledger_fields(self) -> dict[str, object]:
        return {"ray_actor": self.actor_id}

    def _look(self) -> None:
        """Collect the actor's last answer, if in; ask again every ``LOOK_S``."""
        if self.actor is None or self.gone is not None:
            return
        if self.pending is not None:
            done, _ = ray.wait([self.pending], timeout=0)
            if not done:
                return
            try:
                self.last = ray.get(self.pending)
            except ray.exceptions.RayError:  # the actor died (killed, its node lost)
                self.gone = 1
                return
            finally:
                self.pending = None
        code = self.last.get("code")
        status = self.last.get("status", {})
        if status.get("job") != self.token:
            status = {}
        if isinstance(code, int):
            self.gone = code or 1
        elif status.get("state") in ("exited", "failed"):
            self.gone = status.get("code") if isinstance(status.get("code"), int) else 1
        if time.monotonic() - self.looked >= LOOK_S and self.gone is None:
            self.looked = time.monotonic()
            self.pending = self.actor.look.remote()

    def _status(self) -> dict[str, Any]:
        status = self.last.get("status", {})
        return status if isinstance(status, dict) and status.get("job") == self.token else {}

    def exited(self) -> int | None:
        self._look()
        return self.gone

    def check(self, key: str) -> str:
        return check_placed(self, self._status(), self.exited(), key)

    def ask_stop(self) -> None:
        if self.actor is not None and self.gone is None and ray.is_initialized():
            self.actor.stop.remote()

    def stop(self, grace_s: float = 5.0) -> None:
        if self.actor is not None and ray.is_initialized():
            try:  # an actor never placed (or never answered) is only killed: asking it would wait STOP_S
                code = ray.get(self.actor.stop.remote(), timeout=STOP_S) if self.last else None
                if self.gone is None:
                    self.gone = code
            except ray.exceptions.RayError:
                pass
            ray.kill(self.actor, no_restart=True)
        self.state = "stopped"

    def forget(self) -> int | None:
        code, self.actor, self.pending = self.gone, None, None
        return code
