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
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections import deque
from dataclasses import dataclass, field

from orchestra.serving.presets import HOST, launch
from orchestra.serving.spec import ServerSpec
from orchestra.serving.watchdog import group_members

_PR_SET_PDEATHSIG = 1


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


def _status(url: str, key: str | None, timeout_s: float = 1.0) -> int:
    """The HTTP status of GET ``url`` (0: no answer), asked directly, never through a proxy."""
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"} if key else {})
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
    proc: subprocess.Popen[bytes] | None = None
    state: str = "new"  # new -> starting -> ready -> exited | stopped
    started: float = 0.0
    code: int | None = None
    ledger_name: str = ""  # this start's name in the servers' ledger
    host: str = HOST  # the address it listens on (a cluster node's own address, placed remotely)

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

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

    def start(self, key_file: str) -> None:
        """Start the watchdog and the server under it on a fresh port (output appended to the log)."""
        self.port = free_port(self.host)
        how = launch(self.spec, self.served_name, self.port, key_file, self.gpus, self.host)
        argv = [sys.executable, "-m", "orchestra.serving.watchdog", "--owner", str(os.getpid()),
                *(a for name in how.key_env for a in ("--key-env", name)), "--", *how.argv]
        os.makedirs(os.path.dirname(self.log_path), exist_ok=True)
        fd = os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.fchmod(fd, 0o600)  # the server's own words stay private (the key is scrubbed, not all else)
        with os.fdopen(fd, "ab") as log:
            log.write(f"===== orchestra: replica {self.index} of {self.served_name} on port {self.port} at "
                      f"{time.strftime('%Y-%m-%d %H:%M:%S')}\n===== command: {' '.join(how.argv)}\n".encode())
            log.flush()
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
        found = listener(self.port, self.host)
        if found is None:
            return "starting"
        assert self.proc is not None
        if not owns_socket(group_members(self.proc.pid), found[0]):
            return "foreign"
        if found[1]:
            return "exposed"
        if _status(self.base_url[: -len("/v1")] + self.spec.ready_path, key) != 200:
            return "starting"
        if _status(self.base_url + "/models", None) not in (401, 403):
            return "open"
        if _status(self.base_url + "/models", key) != 200:
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
