"""A fork server for ``python run.py ...``: the test client (``tests/cli_fork.py``) sends it an
argv, a folder, an environment and three file descriptors, and it answers with the exit status
of a real ``run.py`` process forked from it.

Why: a ``run.py --dry-run`` of a plain config spends ~0.7 s of its ~0.85 s of CPU importing the
same third-party modules (``mmengine.config`` and what it pulls in); the config suites start
hundreds of them.  This process imports those modules once; each CLI process is forked from it.

What a forked CLI process shares with a fresh ``python run.py``, and what it does not:

- the same interpreter, ``sys.executable``, ``sys.flags`` and start-up environment (the client
  starts a real process instead when the variables the interpreter reads at start-up, such as
  ``PYTHON*``, ``LANG`` or ``LC_*``, differ from this server's);
- its own argv (``sys.argv``), working folder, environment (``os.environ`` replaced whole),
  stdin/stdout/stderr (the client's descriptors) and nothing else open: every other descriptor
  is closed, as ``subprocess`` closes them;
- ``run.py`` runs as ``__main__`` with its folder first on ``sys.path``, and the interpreter's own
  exit handling gives the exit status (``sys.exit``, an uncaught exception's traceback and exit 1,
  ``atexit``, waiting for non-daemon threads); ``sys.excepthook`` leaves this server's frames out
  of an uncaught exception's traceback, which then reads as a fresh process's;
- no ``orchestra`` module is imported here: every ``orchestra`` import (registries, caches, the
  modules that read the environment when imported) happens in the CLI process itself.  Only the
  third-party modules of :data:`PRELOAD`, which keep no state the CLI depends on, are shared.

The process tree: this server forks a *waiter* per request, which forks the CLI process, tells
the client its pid (so that a client's timeout can kill it), waits for it and sends its status.

Protocol (one Unix-socket connection per run): the client sends one message, a JSON object
``{"argv": [python, script, ...], "cwd": ..., "env": {...}}`` with descriptors for fds 0, 1 and 2 attached
(``socket.send_fds``) and then shuts its sending side; the waiter answers ``pid <n>\\n`` and, when
the CLI process has ended, ``status <waitstatus>\\n``.

Started as ``python tests/cli_forkserver.py SOCKET``; prints ``ready`` once it listens.
"""

from __future__ import annotations

import builtins
import importlib.machinery
import json
import os
import socket
import sys
import types
from typing import Any

#: the third-party modules every ``run.py`` imports, at ~0.7 s of CPU (none reads orchestra's
#: environment or keeps state a CLI run depends on; ``orchestra`` itself is never imported here)
PRELOAD = ("mmengine.config", "yaml", "numpy")


def _receive(conn: socket.socket) -> tuple[dict[str, Any], list[int]]:
    """The request and the three descriptors the client sent."""
    chunks, fds = [], []
    while True:
        data, got, _, _ = socket.recv_fds(conn, 1 << 20, 3)
        fds.extend(got)
        if not data:
            break
        chunks.append(data)
    return json.loads(b"".join(chunks)), fds


def _become_cli(request: dict[str, Any], fds: list[int], keep: list[socket.socket]) -> str:
    """In the forked CLI process: take the request's descriptors, folder, environment and argv;
    the script to run."""
    for sock in keep:
        sock.close()
    for target, fd in enumerate(fds):
        os.dup2(fd, target)  # dup2's copy is inheritable, as a child's 0, 1 and 2 are
    os.closerange(3, os.sysconf("SC_OPEN_MAX") if hasattr(os, "sysconf") else 65536)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    script = os.path.abspath(request["argv"][1])  # ``__main__.__file__``: absolute, as Python makes it
    sys.orig_argv = list(request["argv"])
    sys.argv = list(request["argv"][1:])
    sys.path[0] = os.path.dirname(script)  # as ``python SCRIPT`` sets it

    def excepthook(kind: type[BaseException], exc: BaseException, tb: Any) -> None:
        while tb is not None and tb.tb_frame.f_code.co_filename != script:
            tb = tb.tb_next  # this server's and runpy's frames: not in a fresh process's traceback
        sys.__excepthook__(kind, exc.with_traceback(tb), tb)

    sys.excepthook = excepthook
    return script


def _wait_and_report(conn: socket.socket, pid: int) -> None:
    """In the waiter: send the CLI process's pid, wait for it, send its wait status."""
    try:
        conn.sendall(f"pid {pid}\n".encode())
    except OSError:
        pass  # the client is gone; still reap the child
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            break
        except InterruptedError:
            continue
    try:
        conn.sendall(f"status {status}\n".encode())
    except OSError:
        pass


def serve(path: str) -> str:
    """Accept runs until the process that started this one ends or kills it; return (only in a
    forked CLI process) the script that process is to run."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    listener.settimeout(0.5)
    owner = os.getppid()
    print("ready", flush=True)
    while True:
        while True:  # reap ended waiters
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
        try:
            conn, _ = listener.accept()
        except TimeoutError:
            if os.getppid() != owner:  # the pytest process that started this one is gone
                sys.exit(0)
            continue
        conn.settimeout(None)
        try:
            request, fds = _receive(conn)
        except (OSError, ValueError):
            conn.close()
            continue
        sys.stdout.flush()
        sys.stderr.flush()
        if os.fork() == 0:  # the waiter
            listener.close()
            try:
                child = os.fork()
            except OSError:
                os._exit(1)
            if child == 0:
                return _become_cli(request, fds, [conn])
            for fd in fds:
                os.close(fd)
            _wait_and_report(conn, child)
            os._exit(0)
        for fd in fds:
            os.close(fd)
        conn.close()


def _run_as_main(script: str) -> None:
    """Run ``script`` as the ``__main__`` module, as ``python SCRIPT`` does (``runpy.run_path``
    would also set ``sys.argv[0]`` to the script's path, which a fresh process keeps as given)."""
    main = types.ModuleType("__main__")
    main.__dict__.update(__file__=script, __cached__=None, __builtins__=builtins,
                         __loader__=importlib.machinery.SourceFileLoader("__main__", script))
    sys.modules["__main__"] = main
    with open(script, "rb") as f:
        code = compile(f.read(), script, "exec")
    exec(code, main.__dict__)


def _preload() -> None:
    import importlib

    for name in PRELOAD:
        importlib.import_module(name)
    assert not any(m == "orchestra" or m.startswith("orchestra.") for m in sys.modules), "orchestra preloaded"


if __name__ == "__main__":
    _preload()
    # below: only in a forked CLI process, which runs the script as ``python SCRIPT`` would; its
    # SystemExit or uncaught exception ends this interpreter as it ends that one
    _run_as_main(serve(sys.argv[1]))
