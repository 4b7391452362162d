"""``python run.py ARGS`` to its end, as ``subprocess.run`` runs it, but forked from a server that
has already imported what every CLI process imports (``tests/cli_forkserver.py`` says what the
forked process shares with a fresh one, and why that is the same).

The config suites start hundreds of ``run.py --dry-run`` processes at ~0.65 s of CPU each, most
of it imports; forked, one costs ~0.2 s.  A forked process is still a real process of its own:
its own argv, folder, environment, stdin/stdout/stderr and exit status (a signal gives a negative
``returncode`` as with ``subprocess``; past ``timeout`` it is killed and ``TimeoutExpired`` raised).

Each pytest process (each xdist worker) has one :class:`ForkedCLI`, started on first use
(:func:`shared`: ``tests.helpers.run_cli`` / ``run_argv`` and the ``cli`` fixture) and stopped at
the session's end; ``ForkedCLI.run`` takes ``subprocess.run``'s arguments for a run.py argv.
It starts a real ``subprocess.run`` instead when the argv is not ``[sys.executable, run.py, ...]``
for this checkout's ``run.py``; when the environment differs from the server's in what the
interpreter reads at start-up (``PYTHON*``, locale, thread counts) or in a variable the server's
imports read; or when this process's resource limits, ignored or blocked signals, process group
or session changed since the server started: a test never sees a difference it did not ask for."""

from __future__ import annotations

import io
import json
import os
import resource
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

SERVER = Path(__file__).resolve().parent / "cli_forkserver.py"
REPO = SERVER.parents[1]
#: environment variables a Python interpreter (or the C library under it, or coverage's start-up
#: hook) reads when it starts (a difference: a real process); ``TZ``: ``time`` reads it once
_STARTUP = ("PYTHON", "LANG", "LC_", "LANGUAGE", "OMP_NUM_THREADS", "OPENBLAS_", "MKL_", "TZ", "COVERAGE_PROCESS_START")


#: CPU seconds of the forked CLI processes this process waited for: not its children, so not in
#: ``RUSAGE_CHILDREN`` until the server is reaped; ``tests/conftest.py``'s CPU accounting adds it
FORKED_CPU_S = [0.0]


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _startup_env(env: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith(_STARTUP)}


def _umask() -> int:
    """This process's umask, read without setting it (``os.umask`` would, for a moment, for every thread)."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1], 8) for line in f if line.startswith("Umask:"))


def _inherited() -> tuple[object, ...]:
    """What a child inherits from this process besides its environment, folder, umask and
    descriptors: resource limits, ignored and blocked signals, process group and session.  The
    server inherited them when it started; a test that changed them since gets a fresh process."""
    limits = tuple(resource.getrlimit(getattr(resource, name)) for name in sorted(dir(resource))
                   if name.startswith("RLIMIT_"))
    ignored = tuple(sig for sig in signal.valid_signals()
                    if sig not in (signal.SIGKILL, signal.SIGSTOP) and signal.getsignal(sig) is signal.SIG_IGN)
    return limits, ignored, tuple(sorted(signal.pthread_sigmask(signal.SIG_BLOCK, []))), os.getpgrp(), os.getsid(0)


class ForkedCLI:
    """One fork server (``tests/cli_forkserver.py``) for this pytest process, and runs through it."""

    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        self._dir = tempfile.mkdtemp(prefix="orchestra-cli-fork-")
        self._socket = os.path.join(self._dir, "s")
        self._env = dict(os.environ if env is None else env)
        self._inherited = _inherited()
        self._proc = subprocess.Popen([sys.executable, str(SERVER), self._socket], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, text=True, env=self._env, cwd=REPO)
        assert self._proc.stdout is not None
        ready = self._proc.stdout.readline()  # "ready KEYS" once it listens, "" if it died
        assert ready.startswith("ready "), f"the CLI fork server did not start (exit {self._proc.wait()})"
        #: what the server's imports read from the environment: a request must agree on these
        self.read_at_import: list[str] = json.loads(ready.split(" ", 1)[1])
        self.forked = 0  # runs that went through the server (tests of this helper read it)

    def close(self) -> None:
        """End the server once every waiter is reaped (its stdin closed).  Reaping it adds the CPU of
        every forked process to this process's children's; :data:`FORKED_CPU_S` already counted
        it, so it is taken off there (the CPU accounting of ``--cpu-durations`` stays continuous)."""
        assert self._proc.stdin is not None and self._proc.stdout is not None
        before = _children_cpu_s()
        self._proc.stdin.close()
        self._proc.wait(timeout=120)
        FORKED_CPU_S[0] -= _children_cpu_s() - before
        self._proc.stdout.close()
        for name in os.listdir(self._dir):
            os.unlink(os.path.join(self._dir, name))
        os.rmdir(self._dir)

    def why_fresh(self, argv: Sequence[str], cwd: str, env: Mapping[str, str]) -> str:
        """Why a run of ``argv`` would be a fresh process, not forked ("" when it would be forked):
        a forked process must see what a fresh one would: this checkout's run.py, the same
        start-up environment and imports' environment, and what a child inherits from us."""
        if "*" in self.read_at_import:
            return "an import of the server listed the whole environment"
        if not (len(argv) >= 2 and argv[0] == sys.executable and Path(argv[1]).name == "run.py"
                and Path(cwd, argv[1]).resolve() == REPO / "run.py"):  # the orchestra the server imported
            return "not this checkout's run.py under this interpreter"
        if self._proc.poll() is not None:
            return f"the fork server is gone (exit status {self._proc.returncode})"
        if _startup_env(env) != _startup_env(self._env):
            mine, servers = _startup_env(env), _startup_env(self._env)
            return "start-up variables differ: " + ", ".join(
                sorted(k for k in set(mine) | set(servers) if mine.get(k) != servers.get(k)))
        differ = [k for k in self.read_at_import if env.get(k) != self._env.get(k)]
        if differ:
            return "variables the server's imports read differ: " + ", ".join(differ)
        if _inherited() != self._inherited:
            return f"resource limits, signals, process group or session changed: {self._inherited} -> {_inherited()}"
        return ""

    def run(self, argv: Sequence[str | os.PathLike[str]], *, cwd: str | os.PathLike[str] | None = None,
            env: Mapping[str, str] | None = None, timeout: float | None = None, capture_output: bool = True,
            text: bool = True) -> subprocess.CompletedProcess[str]:
        """``subprocess.run(argv, cwd=cwd, env=env, timeout=timeout, capture_output=True, text=True)``."""
        assert capture_output and text, "only capture_output=True, text=True runs are supported"
        args = [os.fspath(a) for a in argv]
        environ = dict(os.environ if env is None else env)
        folder = os.path.abspath(os.fspath(cwd) if cwd is not None else os.getcwd())
        if self.why_fresh(args, folder, environ):
            return subprocess.run(args, cwd=cwd, env=env, timeout=timeout, capture_output=True, text=True)
        self.forked += 1
        return self._forked(args, folder, environ, timeout)

    def _forked(self, args: list[str], cwd: str, env: dict[str, str], timeout: float | None
                ) -> subprocess.CompletedProcess[str]:
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            conn.connect(self._socket)
            request = json.dumps({"argv": args, "cwd": cwd, "env": env, "umask": _umask()}).encode()
            socket.send_fds(conn, [request], [0, out_w, err_w])
            conn.shutdown(socket.SHUT_WR)
        finally:
            os.close(out_w)
            os.close(err_w)
        replies = _Replies(conn)
        try:
            output = _read_all({out_r: bytearray(), err_r: bytearray()}, conn, replies,
                               None if timeout is None else time.monotonic() + timeout)
            if output is None:  # past the timeout: kill it, as subprocess.run does
                os.kill(int(replies.wait("pid", 30)), signal.SIGKILL)
                replies.wait("status", 60)  # reaped
                raise subprocess.TimeoutExpired(args, timeout or 0)
            status = replies.wait("status", 60)  # sent right after the process ended (its pipes closed)
            FORKED_CPU_S[0] += float(replies.get("cpu") or 0)
        finally:
            os.close(out_r)
            os.close(err_r)
            conn.close()
        return subprocess.CompletedProcess(args, os.waitstatus_to_exitcode(int(status)), _text(output[out_r]),
                                           _text(output[err_r]))


#: this process's fork server, started by the first :func:`shared` call (``tests.helpers.run_cli``,
#: the ``cli`` fixture) and stopped at the session's end (``tests/conftest.py``); its environment
#: is this process's when this module was imported (before any test's ``monkeypatch``)
_SHARED: list[ForkedCLI] = []
_BASE_ENV = dict(os.environ)


def shared() -> ForkedCLI:
    """This pytest process's (this xdist worker's) :class:`ForkedCLI`, started on first use."""
    if not _SHARED:
        _SHARED.append(ForkedCLI(_BASE_ENV))
    return _SHARED[0]


def stop_shared() -> None:
    """End this process's fork server, if one was started (at the session's end)."""
    while _SHARED:
        _SHARED.pop().close()


class _Replies:
    """The ``key value`` lines the waiter sends (``pid``, then ``cpu`` and ``status``)."""

    def __init__(self, conn: socket.socket) -> None:
        self._conn = conn
        self._buf = b""
        self._got: dict[str, str] = {}

    def feed(self, data: bytes) -> None:
        self._buf += data
        while b"\n" in self._buf:
            line, self._buf = self._buf.split(b"\n", 1)
            key, _, value = line.decode().partition(" ")
            self._got[key] = value

    def get(self, key: str) -> str | None:
        return self._got.get(key)

    def wait(self, key: str, timeout_s: float) -> str:
        """The value of ``key``, read from the connection until it comes (fails the test after
        ``timeout_s`` or when the server closed the connection without it)."""
        deadline = time.monotonic() + timeout_s
        while key not in self._got:
            left = deadline - time.monotonic()
            assert left > 0, f"timed out after {timeout_s:g} s waiting for the fork server's {key!r}"
            self._conn.settimeout(left)
            try:
                data = self._conn.recv(4096)
            except TimeoutError:
                continue
            assert data, f"the fork server closed the connection without sending {key!r}"
            self.feed(data)
        return self._got[key]


def _read_all(buffers: dict[int, bytearray], conn: socket.socket, replies: _Replies, deadline: float | None
              ) -> dict[int, bytearray] | None:
    """Both pipes read to their end (None: the deadline passed first); the waiter's replies fed on."""
    with selectors.DefaultSelector() as sel:
        for fd in buffers:
            sel.register(fd, selectors.EVENT_READ)
        sel.register(conn, selectors.EVENT_READ)
        open_pipes = set(buffers)
        while open_pipes:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return None
            for key, _ in sel.select(left):
                if key.fileobj is conn:
                    data = conn.recv(4096)
                    replies.feed(data)
                    if not data:
                        sel.unregister(conn)
                    continue
                fd = int(key.fd)
                chunk = os.read(fd, 1 << 16)
                if chunk:
                    buffers[fd] += chunk
                else:
                    sel.unregister(fd)
                    open_pipes.discard(fd)
    return buffers


def _text(data: bytearray) -> str:
    """Bytes as ``subprocess.run(text=True)`` decodes them (locale encoding, universal newlines)."""
    return io.TextIOWrapper(io.BytesIO(bytes(data))).read()
