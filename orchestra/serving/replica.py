"""One replica process: started under its watchdog, checked for readiness, stopped whole.

Nothing here blocks for long: :meth:`Replica.check` makes one short probe, so the pool's thread
watches every replica of the run in one loop.  A replica is *ready* only when

1. the socket listening on its port belongs to a process of its own group, looked up in /proc
   before anything is sent to the port (a port another process took between our choice and the
   server's bind is caught here, before that process could see the key; the replica is then
   restarted on another port, without a race left),
2. its ``ready_path`` answers 200, and
3. ``/v1/models`` answers 401/403 without the key and 200 with it (a server that does not demand
   the key is never used: another local user could drive the GPUs through it).

A replica of an engine whose key does not guard every route (vLLM) listens on a Unix socket in
a 0700 folder of this user instead of a port (:attr:`ServerSpec.on_socket`): only this user can
connect to it.  Step 1 then looks the socket up in /proc/net/unix.
"""

from __future__ import annotations

import ctypes
import http.client
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from orchestra.serving.presets import HOST, launch
from orchestra.serving.spec import ServerSpec
from orchestra.serving.watchdog import CappedLog, group_members

_PR_SET_PDEATHSIG = 1
#: the longest path a Unix socket can be bound to on Linux (``sun_path`` holds 108 bytes with its NUL)
MAX_SOCKET_PATH = 107
#: a port held by a process outside the replica's group this many starts in a row is the server's
#: doing (a daemon, ``setsid``, a container's proxy), not a lost race: the start fails
FOREIGN_IN_A_ROW = 3


def free_port(host: str = HOST) -> int:
    """A port the kernel says is free now (the ownership check in :meth:`Replica.check` closes
    the window between this choice and the server's bind)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def listener(port: int, host: str = HOST) -> tuple[int, bool] | None:
    """The socket listening on ``host:port`` from /proc/net/tcp: (its inode, whether it listens
    on every address rather than ``host`` only); None: nothing listens there yet."""
    loopback = socket.inet_aton(host)[::-1].hex().upper() + f":{port:04X}"  # /proc's byte order
    anywhere = f"00000000:{port:04X}"
    try:
        with open("/proc/net/tcp", encoding="ascii") as fh:
            next(fh)
            for line in fh:
                parts = line.split()
                if len(parts) > 9 and parts[1] in (loopback, anywhere) and parts[3] == "0A":
                    return int(parts[9]), parts[1] == anywhere
    except OSError:
        return None
    return None


def unix_listeners(path: str) -> list[int]:
    """The inodes of the Unix sockets listening at ``path`` (from /proc/net/unix; []: none yet).
    There may be several: the table shows the path a socket was bound to, and a socket bound to
    the same name in another mount namespace, or to a name since unlinked, is listed too."""
    found: list[int] = []
    try:
        with open("/proc/net/unix", encoding="utf-8", errors="replace") as fh:
            next(fh)
            for line in fh:
                parts = line.split(None, 7)
                # Flags 00010000 (__SO_ACCEPTCON): a listening socket; the path is the last column.
                if len(parts) == 8 and parts[7].rstrip("\n") == path and int(parts[3], 16) & 0x10000:
                    found.append(int(parts[6]))
    except (OSError, ValueError, StopIteration):
        return found
    return found


def owns_socket(pids: list[int], inode: int) -> bool:
    """Whether one of ``pids`` holds the socket ``inode`` open."""
    target = f"socket:[{inode}]"
    for pid in pids:
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                try:
                    if os.readlink(f"/proc/{pid}/fd/{fd}") == target:
                        return True
                except OSError:
                    continue
        except OSError:
            continue
    return False


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (with the pid, it names one process)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            return int(fh.read().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def _watched_by_us() -> None:
    """``preexec_fn`` of a watchdog: SIGTERM when the thread that started it dies (orchestrator
    SIGKILL included); the watchdog then stops its group."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass


#: readiness checks never go through a proxy (``http_proxy`` would get the key, even for 127.0.0.1)
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class _UnixHTTP(http.client.HTTPConnection):
    """HTTP over the Unix socket ``path`` (the readiness checks of a replica on a socket)."""

    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self.path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self.path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


def _status(url: str, key: str | None, timeout_s: float = 1.0, socket_path: str = "") -> int:
    """The HTTP status of GET ``url`` (0: no answer), asked directly, never through a proxy; over
    the Unix socket ``socket_path`` if one is given (``url``'s path is what is asked then)."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    if socket_path:
        conn = _UnixHTTP(socket_path, timeout_s)
        try:
            conn.request("GET", urllib.parse.urlsplit(url).path, headers=headers)
            resp = conn.getresponse()
            resp.read(1 << 16)
            return int(resp.status)
        except (OSError, http.client.HTTPException):
            return 0
        finally:
            conn.close()
    req = urllib.request.Request(url, headers=headers)
    try:
        with _DIRECT.open(req, timeout=timeout_s) as resp:
            resp.read(1 << 16)
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except (OSError, ValueError):
        return 0


@dataclass
class Replica:
    """One server of a model: its process (the watchdog), port, GPUs, log and state."""

    spec: ServerSpec
    served_name: str
    index: int
    log_path: str
    gpus: list[str] = field(default_factory=list)
    port: int = 0
    socket_path: str = ""  # a replica on a Unix socket (``spec.on_socket``): its path; port stays 0
    proc: subprocess.Popen[bytes] | None = None
    state: str = "new"  # new -> starting -> ready -> exited | stopped
    started: float = 0.0
    code: int | None = None
    ledger_name: str = ""  # this start's name in the servers' ledger
    host: str = HOST  # the address it listens on (a cluster node's own address, placed remotely)
    foreign: int = 0  # starts in a row whose port another process held (see :data:`FOREIGN_IN_A_ROW`)
    #: the servers' ledger for this start, set by the pool before ``start``: ``record(state, **fields)``
    #: (a start that relies on something outside this process, a cluster job, records it first)
    record: Callable[..., None] = field(default=lambda *_, **__: None, repr=False, compare=False)

    @property
    def base_url(self) -> str:
        return "http://localhost/v1" if self.socket_path else f"http://{self.host}:{self.port}/v1"

    @property
    def where(self) -> str:
        """Where it listens, for the log and events: ``port N``, ``HOST:N`` or ``socket PATH``."""
        if self.socket_path:
            return f"socket {self.socket_path}"
        return f"port {self.port}" if self.host == HOST else f"{self.host}:{self.port}"

    def launched(self) -> bool:
        """Whether something of this start may still run (a process, a job, an actor)."""
        return self.proc is not None

    def ledger_fields(self) -> dict[str, object]:
        """What the servers' ledger records of this start, for :func:`~orchestra.serving.pool.reap`."""
        assert self.proc is not None
        return {"pid": self.proc.pid, "start_time": start_time(self.proc.pid)}

    def forget(self) -> int | None:
        """After :meth:`stop`: drop the handle of this start; its exit code."""
        code = self.proc.returncode if self.proc is not None else None
        self.proc = None
        return code

    def start(self, key_file: str, socket_dir: str = "") -> None:
        """Start the watchdog and the server under it on a fresh port of ``host``, or, for an
        engine on a Unix socket given a private folder ``socket_dir``, on a fresh socket there
        (output appended to the log).  Without ``socket_dir`` (a cluster node's agent) every
        engine listens on a port."""
        if self.spec.on_socket and socket_dir:
            self.port, self.socket_path = 0, os.path.join(socket_dir, f"{secrets.token_hex(6)}.sock")
            if len(os.fsencode(self.socket_path)) > MAX_SOCKET_PATH:  # the server's bind would fail, late
                raise OSError(f"its socket path {self.socket_path} is {len(os.fsencode(self.socket_path))} bytes, "
                              f"over the {MAX_SOCKET_PATH} a Unix socket takes; set TMPDIR to a shorter folder")
        else:
            self.port, self.socket_path = free_port(self.host), ""
        how = launch(self.spec, self.served_name, self.port, key_file, self.gpus, self.socket_path, self.host)
        argv = [sys.executable, "-m", "orchestra.serving.watchdog", "--owner", str(os.getpid()),
                *(a for name in how.key_env for a in ("--key-env", name)), "--", *how.argv]
        os.makedirs(os.path.dirname(self.log_path), exist_ok=True)
        fd = os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.fchmod(fd, 0o600)  # the server's own words stay private (the key is scrubbed, not all else)
        with os.fdopen(fd, "ab") as log:
            # capped as the watchdog caps what follows (a restart's header lands after a cut)
            CappedLog(fd).write(f"===== orchestra: replica {self.index} of {self.served_name} on {self.where} at "
                                f"{time.strftime('%Y-%m-%d %H:%M:%S')}\n===== command: {' '.join(how.argv)}\n"
                                .encode())
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env={**os.environ, **how.env}, start_new_session=True,
                                         preexec_fn=_watched_by_us)
        self.state, self.started, self.code = "starting", time.monotonic(), None

    def exited(self) -> int | None:
        """The exit code once the replica's process is gone (None: alive)."""
        if self.proc is None:
            return None
        return self.proc.poll()

    def check(self, key: str) -> str:
        """One look at a starting replica: ``starting``, ``ready``, ``exited``, ``late`` (past its
        deadline), ``foreign`` (another process holds its port), ``exposed`` (it listens on every
        address, not 127.0.0.1 only) or ``open`` (it serves without the key)."""
        code = self.exited()
        if code is not None:
            self.code = code
            return "exited"
        if time.monotonic() - self.started > self.spec.startup_s:
            return "late"
        # Whose socket listens on the port is looked up before the key is sent anywhere: a
        # process of another user that took the port must never see the key.
        assert self.proc is not None
        if self.socket_path:
            # Only this user can bind in the socket's 0700 folder: one listener of the group's at
            # the path is enough (another one listed with that name is not what a connect reaches).
            inodes = unix_listeners(self.socket_path)
            if not inodes:
                return "starting"
            members = group_members(self.proc.pid)
            if not any(owns_socket(members, inode) for inode in inodes):
                return "foreign"
        else:
            found = listener(self.port, self.host)
            if found is None:
                return "starting"
            if not owns_socket(group_members(self.proc.pid), found[0]):
                return "foreign"
            if found[1]:
                return "exposed"
        sock = self.socket_path
        if _status(self.base_url[: -len("/v1")] + self.spec.ready_path, key, socket_path=sock) != 200:
            return "starting"
        if _status(self.base_url + "/models", None, socket_path=sock) not in (401, 403):
            return "open"
        if _status(self.base_url + "/models", key, socket_path=sock) != 200:
            return "starting"
        return "ready"

    def ask_stop(self) -> None:
        """SIGTERM the watchdog (it stops the server's group); :meth:`stop` waits for it."""
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.kill(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass

    def stop(self, grace_s: float = 5.0) -> None:
        """SIGTERM the watchdog (it stops the server's group), then SIGKILL the group; reap."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.ask_stop()
            try:
                self.proc.wait(timeout=grace_s + 2)
            except subprocess.TimeoutExpired:
                pass
        # A reaped watchdog's pid may be another process's by now: only a live one is signalled
        # (its group's id cannot be reused while a member of the group lives).
        for pid in [*group_members(self.proc.pid), *([self.proc.pid] if self.proc.poll() is None else [])]:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        if self.socket_path:  # a server killed does not remove its socket file
            try:
                os.unlink(self.socket_path)
            except OSError:
                pass
        self.state = "stopped"

    def tail(self, key: str, lines: int = 5) -> str:
        """The last lines of the replica's log, joined with ' | ', ``key`` replaced by ``***``
        (for a one-line report)."""
        try:
            with open(self.log_path, "rb") as fh:
                fh.seek(max(0, os.path.getsize(self.log_path) - 8192))
                last = deque((ln.strip() for ln in fh.read().decode("utf-8", "replace").splitlines()
                              if ln.strip() and not ln.startswith("=====")), maxlen=lines)
        except OSError:
            return ""
        text = " | ".join(last)
        return text.replace(key, "***") if key else text
