"""The node side of a replica placed on a cluster (a Slurm job, a Ray actor).

    python -m orchestra.serving.agent --spec FILE --name SERVED --index I --log FILE --status FILE
        --heartbeat FILE [--host ADDR] [--owner-stale-s 30]

Runs on the node that holds the replica's GPUs.  It starts the replica exactly as the
orchestrator does on its own machine (:class:`~orchestra.serving.replica.Replica`: the watchdog,
the engine in its own process group, a free port), bound to the node's address, and makes the same
checks before anyone uses it: the socket on the port is the replica's own, it answers its
readiness path, and it refuses requests without the key.  Then it publishes the replica's address
in ``--status`` (JSON, written atomically; never the key, which it reads from the file named by
``ORCHESTRA_SERVER_KEY_FILE``):

* ``{"state": "ready", "url": ..., "host": ..., "port": ..., "agent": ...}``,
* ``{"state": "failed", "why": "late" | "exited" | "exposed" | "open", "code": ...}`` and exit 3,
* ``{"state": "exited", "code": ...}`` once a ready replica's server exited (the agent exits too),
* ``{"state": "failed", "why": "no-address", "code": 4}`` and exit 4 (:data:`EXIT_NO_ADDRESS`), with one
  line in its log, when the orchestrator's host name does not resolve (or no route leads there): the
  node cannot tell which of its addresses to listen on.

It stops the replica whole and exits on SIGTERM / SIGINT (``scancel``, a killed actor), when its
parent process is gone (a Ray actor), and when ``--heartbeat`` (touched every second by the
orchestrator's pool) has not changed for ``--owner-stale-s`` by the agent's own clock (so clock
skew between hosts does not matter; a heartbeat, spec or status file of another user is never
believed): a replica never outlives its orchestrator for long, even on a node that cannot see the
orchestrator's processes.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import stat
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from orchestra.fileio import atomic_write_json, atomic_write_text
from orchestra.privdir import UnsafeFolderError, open_private_file
from orchestra.serving.balance import own_listeners
from orchestra.serving.presets import HOST, KEY_FILE_ENV
from orchestra.serving.replica import FOREIGN_IN_A_ROW, Replica, _status
from orchestra.serving.spec import ServerSpec

LOOK_S = 0.2  #: how often the replica and the heartbeat are looked at
EXIT_NO_ADDRESS = 4  #: the agent's exit when it cannot find its address towards the orchestrator


def spec_json(spec: ServerSpec) -> dict[str, Any]:
    """``spec`` as JSON (for :func:`spec_from_json` on the node): it holds no secret."""
    return {name: getattr(spec, name) for name in spec.__dataclass_fields__}


def spec_from_json(data: dict[str, Any]) -> ServerSpec:
    """The spec :func:`spec_json` wrote (lists back to tuples)."""
    fields = dict(data)
    for name in ("args", "command"):
        fields[name] = tuple(fields.get(name, ()))
    fields["env"] = tuple((str(k), str(v)) for k, v in fields.get("env", ()))
    return ServerSpec(**fields)


def node_address(owner_host: str) -> str:
    """The address replicas of this node listen on: 127.0.0.1 when the orchestrator
    (``owner_host``, a host name) runs on this very machine, else the address this node uses to
    reach the orchestrator's host (its interface on the network they share).  Raises
    :class:`OSError` with a one-line message naming the host when its name does not resolve or no
    route leads to it."""
    if not owner_host or owner_host in (socket.gethostname(), socket.getfqdn(), "localhost"):
        return HOST
    try:
        address = socket.gethostbyname(owner_host)
    except OSError as exc:  # socket.gaierror, or herror
        raise OSError(f"cannot resolve the orchestrator's host name {owner_host!r} "
                      f"({exc.strerror or exc}); check this node's DNS or /etc/hosts") from None
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect((address, 9))  # no packet is sent: only a route is chosen
        except OSError as exc:
            raise OSError(f"no route from this node to the orchestrator's host {owner_host!r} ({address}): "
                          f"{exc.strerror or exc}") from None
        return str(probe.getsockname()[0])


def write_spec(path: str, spec: ServerSpec) -> None:
    """Write ``spec`` for the node's agent: a new file of ours renamed into place, so a link or a
    file someone planted at ``path`` in the run folder is replaced, never written through."""
    atomic_write_json(path, spec_json(spec))


def touch_heartbeat(path: str) -> None:
    """Touch the orchestrator's heartbeat (the pool, every second): its time changes if it is a
    regular file of ours (a link planted there since is touched itself, not what it points to);
    otherwise a new file of ours replaces whatever is there."""
    try:
        st = os.lstat(path)
        if stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid():
            os.utime(path, follow_symlinks=False)
            return
    except OSError:
        pass
    atomic_write_text(path, "orchestra heartbeat\n")


def read_own_json(path: str) -> Any:
    """The JSON in ``path`` if it is a regular file of this user (never through a symbolic link),
    else raises :class:`OSError` / :class:`UnsafeFolderError` / :class:`ValueError`: a file in the
    run folder that another user put there is never believed."""
    fd = open_private_file(path, os.O_RDONLY)
    with os.fdopen(fd, encoding="utf-8") as fh:
        return json.load(fh)


def own_status(path: str) -> dict[str, Any]:
    """A replica's status file as its agent wrote it ({}: missing, unreadable, or not ours)."""
    try:
        data = read_own_json(path)
    except (OSError, ValueError, UnsafeFolderError):
        return {}
    return data if isinstance(data, dict) else {}


class Heartbeat:
    """Whether the orchestrator's heartbeat file still changes: fresh while its modification time
    (a file of this user) changed less than ``stale_s`` ago by *this* process's monotonic clock, so
    a node whose clock disagrees with the orchestrator's (or the file server's) judges it right."""

    def __init__(self, path: str, stale_s: float) -> None:
        self.path, self.stale_s = path, stale_s
        self.seen: int | None = None
        self.changed = time.monotonic()

    def fresh(self) -> bool:
        try:
            st = os.stat(self.path, follow_symlinks=False)
        except OSError:
            return False
        if st.st_uid != os.geteuid():
            return False
        if st.st_mtime_ns != self.seen:
            self.seen, self.changed = st.st_mtime_ns, time.monotonic()
        return time.monotonic() - self.changed < self.stale_s

#: how long a placed replica may wait for room (a Slurm queue, a Ray node) on top of its startup timeout
QUEUE_S = 600.0


def check_placed(replica: Replica, status: dict[str, Any], code: int | None, key: str) -> str:
    """One look, from the orchestrator, at a replica placed on a cluster (a Slurm job, a Ray
    actor): what its agent's ``status`` says, then, once it is ready at an address, the same
    key checks the local pool makes (a port of this machine must still be ours before the key goes).
    ``code``: the placement's exit code (None: alive).  Returns a state as :meth:`Replica.check`."""
    if status.get("state") == "failed" and status.get("why") in ("late", "exposed", "open"):
        return str(status["why"])
    if code is not None:
        replica.code = code
        return "exited"
    if time.monotonic() - replica.started > replica.spec.startup_s + QUEUE_S:
        return "late"
    if status.get("state") != "ready":
        return "starting"
    replica.host, replica.port = str(status.get("host", "")), int(str(status.get("port", 0)))
    if replica.host == HOST and not own_listeners(replica.port):
        return "foreign"
    if _status(replica.base_url + "/models", None) not in (401, 403):
        return "open"
    if _status(replica.base_url + "/models", key) != 200:
        return "starting"
    return "ready"


def _address(owner_host: str, gone: Callable[[], bool]) -> str | None:
    """:func:`node_address` in a thread, since a resolver may wait tens of seconds for a DNS server
    that does not answer while SIGTERM only sets a flag: None once ``gone()`` says stop first."""
    box: list[str | OSError] = []

    def look() -> None:
        try:
            box.append(node_address(owner_host))
        except OSError as exc:
            box.append(exc)

    resolver = threading.Thread(target=look, name="agent-address", daemon=True)
    resolver.start()
    while resolver.is_alive() and not gone():
        resolver.join(LOOK_S)
    if not box:
        return None
    if isinstance(box[0], OSError):
        raise box[0]
    return box[0]


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m orchestra.serving.agent")
    ap.add_argument("--spec", required=True)
    ap.add_argument("--name", required=True)
    ap.add_argument("--index", type=int, required=True)
    ap.add_argument("--log", required=True)
    ap.add_argument("--status", required=True)
    ap.add_argument("--heartbeat", required=True)
    ap.add_argument("--owner-host", default="", help="the orchestrator's host name")
    ap.add_argument("--owner-stale-s", type=float, default=30.0)
    ap.add_argument("--job", default=os.environ.get("SLURM_JOB_ID", ""), help="names this start in --status")
    args = ap.parse_args()
    try:
        spec = spec_from_json(read_own_json(args.spec))
    except (OSError, ValueError, TypeError, UnsafeFolderError) as exc:
        raise SystemExit(f"agent: cannot use the spec file {args.spec}: {exc}") from None
    key_file = os.environ.get(KEY_FILE_ENV, "")
    try:
        with open(key_file, encoding="utf-8") as fh:
            key = fh.read().strip()
    except OSError as exc:
        raise SystemExit(f"agent: cannot read the key file ({exc}); a replica never serves without a key") from None
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: stop.set())
    parent = os.getppid()
    heartbeat = Heartbeat(args.heartbeat, args.owner_stale_s)
    try:
        host = _address(args.owner_host, lambda: stop.is_set() or os.getppid() != parent)
        if host is None:  # stopped while the resolver still waited: as a stop while starting
            sys.exit(3)
    except OSError as exc:  # one line in the log; the status and the exit code say why for the pool
        print(f"agent: {exc}", file=sys.stderr, flush=True)
        atomic_write_json(args.status, {"state": "failed", "why": "no-address", "code": EXIT_NO_ADDRESS,
                                        "agent": os.getpid(), "job": args.job})
        sys.exit(EXIT_NO_ADDRESS)
    replica = Replica(spec, args.name, args.index, args.log, host=host)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    replica.gpus = [g for g in visible.split(",") if g] if spec.gpus_per_replica else []

    print(f"agent: replica {args.index} of {args.name} on {replica.host}, GPUs [{','.join(replica.gpus)}]", flush=True)

    def owner_gone() -> bool:
        return stop.is_set() or os.getppid() != parent or not heartbeat.fresh()

    state, tries = "foreign", 0
    while state == "foreign" and tries < FOREIGN_IN_A_ROW and not owner_gone():  # a port taken: another one
        tries += 1
        replica.start(key_file)
        state = "starting"
        while state == "starting" and not owner_gone():
            stop.wait(LOOK_S)
            state = replica.check(key)
        if state != "ready":
            replica.stop()
    if state == "foreign":
        print(f"agent: {replica.where} was held by a process outside the replica's own group {tries} times in a "
              "row: a server must listen itself (not through a daemon or a container's proxy)", flush=True)
    if state != "ready":
        if state != "starting":
            atomic_write_json(args.status, {"state": "failed", "why": state, "code": replica.code,
                                            "agent": os.getpid(), "job": args.job})
        sys.exit(3)
    atomic_write_json(args.status, {"state": "ready", "url": replica.base_url, "host": replica.host,
                                    "port": replica.port, "agent": os.getpid(), "job": args.job})
    while replica.exited() is None and not owner_gone():
        stop.wait(LOOK_S)
    code = replica.exited()
    replica.stop()
    atomic_write_json(args.status, {"state": "exited", "code": code if code is not None else replica.forget(),
                                    "agent": os.getpid(), "job": args.job})
    sys.exit(0 if code is None else (code if code >= 0 else 128 - code) or 1)


if __name__ == "__main__":
    main()
