"""The replicas of a launch: started on demand, watched, restarted, stopped (one thread does it).

:class:`ServerPool` is driven from the scheduling loop's thread through :meth:`ServerPool.want`
(cheap: it only records the wish) and :meth:`ServerPool.release`; a single thread of its own starts
every replica process, probes readiness, restarts dead replicas and stops them.  That thread lives
until :meth:`ServerPool.close`, which matters: a replica's parent-death signal fires when the
*thread* that started it ends, so the replicas die with the pool, and with the orchestrator.

Where a replica runs is the pool's ``placement``: a process of this machine (the default), a
Slurm job (:mod:`orchestra.serving.slurm_place`) or a Ray actor (:mod:`orchestra.serving.ray_place`),
each a :class:`~orchestra.serving.replica.Replica` with the same methods; restarts, balancing,
``replicas.json`` and the ledger are the same for all.  The thread touches ``<run>/servers/heartbeat``
every second: replicas on cluster nodes stop once it goes stale.

The live addresses of a model's replicas are in ``<run>/servers/<model>/replicas.json`` (rewritten
atomically whenever the set changes: tasks re-read it); each replica's output in
``<run>/servers/<model>/replica-<i>.log``; every start and stop in ``<run>/servers/ledger.jsonl``,
which a later orchestrator on the same run folder reads to stop what a crashed one left (:func:`reap`).
"""

from __future__ import annotations

import functools
import os
import secrets
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from orchestra.fileio import atomic_write_json
from orchestra.journal import Journal, Phase
from orchestra.paths import safe_name
from orchestra.privdir import folder_problem, open_private_file, private_dir, temp_folder
from orchestra.serving.agent import touch_heartbeat
from orchestra.serving.replica import FOREIGN_IN_A_ROW, Replica, start_time
from orchestra.serving.spec import ServerSpec
from orchestra.serving.watchdog import group_members

TICK_S = 0.1  #: how often the pool's thread looks at its replicas
HEARTBEAT_S = 1.0  #: how often ``<run>/servers/heartbeat`` is touched (replicas on a cluster watch it)
#: GPU hand-out: ``take(n)`` -> GPU ids or None (wait), ``give(ids)``
TakeGpus = Callable[[int], "list[str] | None"]
GiveGpus = Callable[[list[str]], None]
#: where a replica runs: (spec, served name, index, log path, servers dir) -> a Replica (a local
#: process; :mod:`orchestra.serving.slurm_place` / :mod:`orchestra.serving.ray_place` for clusters)
Placement = Callable[[ServerSpec, str, int, str, str], Replica]


def local_placement(spec: ServerSpec, served_name: str, index: int, log_path: str, servers_dir: str) -> Replica:
    """A replica as a process of this machine, beside the orchestrator."""
    return Replica(spec, served_name, index, log_path)


def new_key_file() -> tuple[str, str]:
    """A fresh random key in a private file (0600, in a 0700 folder of this user under the temp
    folder, never in the run folder): (path, key)."""
    folder = private_dir(temp_folder("serve"))
    key = secrets.token_urlsafe(32)
    path = os.path.join(folder, f"{secrets.token_hex(8)}.key")
    fd = open_private_file(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, key.encode())
    finally:
        os.close(fd)
    return path, key


#: the servers' ledger's words and their phase in :mod:`orchestra.journal`: a local replica is recorded
#: once it runs (its pid is known only then); a replica's cluster job by name before sbatch (slurm_place)
STATES: dict[str, Phase] = {"submitting": "intent", "submit_failed": "failed", "started": "started",
                            "stopped": "ended", "reaped": "ended"}


def servers_ledger(servers_dir: str) -> Journal:
    """The servers' ledger of a run folder, ``<run>/servers/ledger.jsonl``: every replica started and stopped."""
    return Journal(os.path.join(servers_dir, "ledger.jsonl"), "name", STATES)


def reap(servers_dir: str) -> list[int]:
    """Stop every replica an earlier orchestrator of this run folder recorded as started and
    not as gone (e.g. after it was SIGKILLed): the pids stopped.  A pid is only killed while
    it still is the same process (its start time matches the ledger's)."""
    if not os.path.exists(os.path.join(servers_dir, "ledger.jsonl")):
        return []
    ledger = servers_ledger(servers_dir)
    # submitting: a cluster job's name recorded before sbatch, its id not (yet) known
    live = {name: rec for name, rec in ledger.fold().items() if rec.get("state") in ("started", "submitting")}
    stopped = []
    for name, rec in live.items():
        pid, born = rec.get("pid"), rec.get("start_time")
        if isinstance(rec.get("slurm_job"), str) or isinstance(rec.get("job_name"), str):
            # a replica's Slurm job (by id, or by name when sbatch's answer was never recorded):
            # cancelled if still ours and alive
            from orchestra.serving.slurm_place import cancel_stale, remove_private_files

            cancel_stale(str(rec.get("slurm_job", "")), str(rec.get("job_name", "")))
            remove_private_files(servers_dir)  # their secrets, at rest in the run folder otherwise
        # The ledger is in the run folder: a line names a process to kill only if it still is
        # the same process (start time) and is a replica's watchdog of this user.
        elif isinstance(pid, int) and born is not None and start_time(pid) == born and _is_watchdog(pid):
            for member in [*group_members(pid), pid]:
                try:
                    os.kill(member, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            stopped.append(pid)
        ledger.append("reaped", name, pid=pid)
        _remove_leftovers(rec.get("key_file"), rec.get("socket"))
    return stopped


def _is_watchdog(pid: int) -> bool:
    """Whether ``pid`` is a replica's watchdog (``-m orchestra.serving.watchdog``) of this user."""
    try:
        if os.stat(f"/proc/{pid}").st_uid != os.geteuid():
            return False
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            argv = fh.read().split(b"\0")
    except OSError:
        return False
    return any(a == b"-m" and b == b"orchestra.serving.watchdog" for a, b in zip(argv, argv[1:]))


def _remove_leftovers(key_file: Any, sock: Any) -> None:
    """Remove a crashed launch's key file and socket folder, as the ledger names them, but only
    where a launch puts them: directly in this user's private serving folder (a forged line
    names nothing else that gets removed)."""
    root = temp_folder("serve")
    if not os.path.isdir(root) or folder_problem(root) is not None:
        return
    if isinstance(key_file, str) and os.path.normpath(key_file) == key_file and \
            os.path.dirname(key_file) == root and key_file.endswith(".key"):
        try:
            os.unlink(key_file)
        except OSError:
            pass
    folder = os.path.dirname(sock) if isinstance(sock, str) else ""
    if folder and os.path.normpath(sock) == sock and os.path.dirname(folder) == root and \
            os.path.basename(folder).startswith("sockets-") and os.path.isdir(folder) and \
            folder_problem(folder) is None:
        shutil.rmtree(folder, ignore_errors=True)


@dataclass
class Served:
    """One model's replicas in this launch."""

    abbr: str
    spec: ServerSpec
    served_name: str
    folder: str
    replicas: list[Replica] = field(default_factory=list)
    restarts: int = 0
    failed: str = ""  # set once no replica can serve any more (one line)
    stopping: bool = False
    published: tuple[tuple[str, str], ...] = ()

    def ready(self) -> list[Replica]:
        return [r for r in self.replicas if r.state == "ready"]


class ServerPool:
    """Every managed server of one launch (thread-safe).

    Args:
        servers_dir: ``<run>/servers``.
        emit: the run's event log (``server_*`` events).
        take_gpus / give_gpus: the runner's GPU hand-out, which replicas share with tasks (a
            cluster placement asks its scheduler for GPUs instead: its hand-out gives none).
        placement: where replicas run (default: processes of this machine).
    """

    def __init__(self, servers_dir: str, emit: Callable[..., None], take_gpus: TakeGpus,
                 give_gpus: GiveGpus, placement: Placement = local_placement) -> None:
        self.dir = servers_dir
        self.placement = placement
        os.makedirs(servers_dir, exist_ok=True)
        self.heartbeat = os.path.join(servers_dir, "heartbeat")
        self._beat = 0.0
        self.journal = servers_ledger(servers_dir)
        self.ledger = self.journal.path
        self.emit, self.take_gpus, self.give_gpus = emit, take_gpus, give_gpus
        self.key_file, self._key = new_key_file()
        # replicas on Unix sockets (vLLM) listen in a folder only this user may enter (0700)
        self.socket_dir = tempfile.mkdtemp(prefix="sockets-", dir=os.path.dirname(self.key_file))
        self._lock = threading.Lock()
        self._models: dict[str, Served] = {}
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._run, name="orchestra-servers", daemon=True)
        self._thread.start()

    # -- the scheduling loop's side ----------------------------------------------------------
    def want(self, abbr: str, spec: ServerSpec, served_name: str) -> tuple[bool, str]:
        """Ask for ``abbr``'s replicas: (ready, why not ready for good); starts them if needed."""
        with self._lock:
            served = self._models.get(abbr)
            if served is not None and served.stopping and not served.failed:
                served.stopping = False  # wanted again (a retry after the last task seemed over)
            if served is None:
                folder = os.path.join(self.dir, safe_name(abbr))
                served = Served(abbr, spec, served_name, folder)
                served.replicas = [self.placement(spec, served_name, i, os.path.join(folder, f"replica-{i}.log"),
                                                  self.dir) for i in range(spec.replicas)]
                self._models[abbr] = served
            return bool(served.ready()), served.failed

    def release(self, abbr: str) -> None:
        """``abbr``'s last task is over: stop its replicas (their GPUs go back)."""
        with self._lock:
            served = self._models.get(abbr)
            if served is not None:
                served.stopping = True

    def close(self) -> None:
        """Stop every replica, wait for the thread, remove the key file."""
        self._closing.set()
        self._thread.join(timeout=60)
        try:
            os.unlink(self.key_file)
        except OSError:
            pass
        shutil.rmtree(self.socket_dir, ignore_errors=True)

    # -- the pool's thread -------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while not self._closing.is_set():
                self._touch()
                with self._lock:
                    models = list(self._models.values())
                for served in models:
                    try:
                        self._tend(served)
                    except Exception as exc:  # noqa: BLE001 - a bug here must fail the model's tasks, not hang them
                        served.failed = f"the server pool failed for {served.abbr}: {type(exc).__name__}: {exc}"
                        served.stopping = True
                self._closing.wait(TICK_S)
        finally:
            with self._lock:
                models = list(self._models.values())
            for served in models:  # all of them asked at once: they stop side by side
                for replica in served.replicas:
                    replica.ask_stop()
            for served in models:
                for replica in served.replicas:
                    self._stop(served, replica)

    def _touch(self) -> None:
        """Tell replicas on cluster nodes that their owner lives (they stop once this goes stale)."""
        now = time.monotonic()
        if now - self._beat >= HEARTBEAT_S:
            self._beat = now
            try:
                touch_heartbeat(self.heartbeat)  # never through a link planted in the run folder
            except OSError:
                pass  # a full disk for a moment: the agents wait 30 s before they give up on us

    def _tend(self, served: Served) -> None:
        if served.stopping:
            for replica in served.replicas:
                replica.ask_stop()
            for replica in served.replicas:
                self._stop(served, replica)
            self._publish(served)
            return
        for replica in served.replicas:
            if replica.state in ("new", "waiting", "stopped"):
                self._start(served, replica)
            elif replica.state == "starting":
                self._look(served, replica)
            elif replica.state == "ready" and replica.exited() is not None:
                replica.code = replica.exited()
                self._lost(served, replica, f"exited with code {replica.code} while serving")
        self._publish(served)

    def _start(self, served: Served, replica: Replica) -> None:
        if served.spec.gpus_per_replica and not replica.gpus:
            gpus = self.take_gpus(served.spec.gpus_per_replica)
            if gpus is None:
                replica.state = "waiting"
                return
            replica.gpus = gpus
        name = f"{served.abbr}/{replica.index}/{served.restarts}/{time.time():.3f}"
        replica.record = functools.partial(self._record_replica, name, served.abbr, replica.index)
        try:
            replica.start(self.key_file, self.socket_dir)
        except OSError as exc:
            self._give_gpus(replica)
            served.failed = f"{served.spec.engine} replica {replica.index} of {served.abbr} could not start: {exc}"
            replica.state = "exited"
            return
        if not replica.launched():
            return  # the cluster refused its job for now: it waits, and goes again (slurm_place)
        where = replica.ledger_fields()
        self.journal.append("started", name, model=served.abbr, replica=replica.index, **where,
                            port=replica.port, socket=replica.socket_path, gpus=replica.gpus, key_file=self.key_file)
        replica.ledger_name = name
        self.emit("server_started", model=served.abbr, engine=served.spec.engine, replica=replica.index,
                  port=replica.port, socket=replica.socket_path, gpus=replica.gpus, log=replica.log_path, **where)

    def _look(self, served: Served, replica: Replica) -> None:
        state = replica.check(self._key)
        if state == "starting":
            return
        if state == "ready":
            replica.state, replica.foreign = "ready", 0
            self.emit("server_ready", model=served.abbr, replica=replica.index, port=replica.port,
                      socket=replica.socket_path, startup_s=round(time.monotonic() - replica.started, 3))
            return
        why = {"exited": f"exited with code {replica.code} before it was ready",
               "late": f"did not answer {served.spec.ready_path} within {served.spec.startup_s:g} s",
               "foreign": f"{replica.where} is held by another process",
               "exposed": "listens on every address, not on 127.0.0.1 only (refused: keep it on loopback)",
               "open": "answers without the key (refused: anyone on this machine could use it)"}[state]
        if state == "foreign":
            replica.foreign += 1
            if replica.foreign < FOREIGN_IN_A_ROW:  # lost a race for the port: not the server's fault, not counted
                self._stop(served, replica)
                replica.state = "new"
                return
            why += (f", {FOREIGN_IN_A_ROW} times in a row (a server must listen itself, in its own process "
                    "group: not hand its port to a daemon, a process started with setsid or a container's proxy)")
        replica.foreign = 0
        self._lost(served, replica, why)

    def _lost(self, served: Served, replica: Replica, why: str) -> None:
        """A replica died or never became ready: report it in one line, restart it if allowed."""
        tail = replica.tail(self._key)
        line = (f"{served.spec.engine} replica {replica.index} of {served.abbr} {why}"
                + (f"; last log lines: {tail}" if tail else "") + f" (log: {replica.log_path})")
        self._stop(served, replica)
        again = served.restarts < served.spec.max_restarts
        self.emit("server_exited", model=served.abbr, replica=replica.index, reason=line, exit_code=replica.code,
                  infra=True, restart=again)
        if again:
            served.restarts += 1
            replica.state = "new"
            return
        replica.state = "exited"
        if not served.ready() and all(r.state == "exited" for r in served.replicas):
            served.failed = line

    def _stop(self, served: Served, replica: Replica) -> None:
        if replica.launched() and replica.state not in ("stopped",):
            replica.stop()
            code = replica.forget()
            self.journal.append("stopped", replica.ledger_name, model=served.abbr,
                                replica=replica.index, exit_code=code)
            self.emit("server_stopped", model=served.abbr, replica=replica.index)
        replica.state = "stopped" if replica.state != "exited" else "exited"
        self._give_gpus(replica)

    def _record_replica(self, name: str, model: str, index: int, state: str, **fields: Any) -> None:
        """A replica's own line in the servers' ledger (what :attr:`Replica.record` calls before it
        relies on something outside this process: a cluster job, by name, before sbatch)."""
        self.journal.append(state, name, model=model, replica=index, key_file=self.key_file, **fields)

    def _give_gpus(self, replica: Replica) -> None:
        if replica.gpus:
            self.give_gpus(replica.gpus)
            replica.gpus = []

    def _publish(self, served: Served) -> None:
        """Write the ready replicas' addresses where the model's tasks read them."""
        urls = tuple((r.base_url, r.socket_path) for r in served.ready())
        if urls == served.published:
            return
        os.makedirs(served.folder, exist_ok=True)
        atomic_write_json(os.path.join(served.folder, "replicas.json"),
                          {"model": served.served_name,
                           "replicas": [{"url": u, **({"socket": s} if s else {})} for u, s in urls]})
        served.published = urls
