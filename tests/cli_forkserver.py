"""A fork server for ``python run.py ...``: the test client (``tests/cli_fork.py``) sends it an
argv, a folder, an environment and three file descriptors, and it answers with the exit status
of a real ``run.py`` process forked from it.

Why: a ``run.py --dry-run`` of a plain config costs ~0.65 s of CPU, most of it importing the same
modules (``mmengine.config`` and what it pulls in, orchestra's CLI, config and planner); the config
suites start hundreds of them.  This process imports those modules once; each CLI process is forked
from it and costs ~0.2 s.

What a forked CLI process shares with a fresh ``python run.py``, and what it does not:

- the same interpreter, ``sys.executable``, ``sys.flags`` and start-up environment (the client
  starts a real process instead when the variables the interpreter reads at start-up, such as
  ``PYTHON*``, ``LANG`` or ``LC_*``, or those the preloaded modules read when imported, differ
  from this server's; or when its resource limits, ignored or blocked signals or process group
  are no longer those this server inherited);
- its own argv (``sys.argv``), working folder, umask, environment (``os.environ`` replaced whole),
  stdin/stdout/stderr (the client's descriptors) and nothing else open: every other descriptor
  is closed, as ``subprocess`` closes them;
- ``run.py`` runs as ``__main__`` with its folder first on ``sys.path``, and the interpreter's own
  exit handling gives the exit status (``sys.exit``, an uncaught exception's traceback and exit 1,
  ``atexit``, waiting for non-daemon threads); ``sys.excepthook`` leaves this server's frames out
  of an uncaught exception's traceback, which then reads as a fresh process's;
- the modules of :data:`PRELOAD`, imported here, as they are when imported: what a dry run of any
  config imports (mmengine and its dependencies; orchestra's CLI, API, config checks, planner and
  registries).  No orchestra module reads the environment, the working folder, the clock or a
  file when it is imported (only ``socket.gethostname()``: the same host), so the state they hold
  is the one a fresh process builds; what depends on a run (caches, ``--dry-run``'s no-write
  switch, a config's own registered classes) is made in the CLI process.  No ML framework
  (torch, transformers, lm_eval, vllm, datasets) is imported here: asserted at start.

What differs, and is why the client keeps a fresh process for tests that look at it
(``tests/helpers.FRESH``): the CLI process's parent is a waiter (below), not pytest; its
``/proc/PID/cmdline`` is this server's (``python tests/cli_forkserver.py SOCKET``), not
``python run.py ...``; and it runs in the process group and session this server was started in.

The process tree: this server forks a *waiter* per request, which forks the CLI process, tells
the client its pid (so that a client's timeout can kill it), waits for it and sends its status.

Protocol (one Unix-socket connection per run): the client sends one message, a JSON object
``{"argv": [python, script, ...], "cwd": ..., "env": {...}, "umask": n}`` with descriptors for fds 0, 1 and 2 attached
(``socket.send_fds``) and then shuts its sending side; the waiter answers ``pid <n>\\n`` and, when
the CLI process has ended, ``status <waitstatus>\\n``.

Started as ``python tests/cli_forkserver.py SOCKET``; prints ``ready KEYS`` once it listens, KEYS
the JSON list of the environment variables its imports read (the client forks only a request
whose environment has the same values for them; ``*``: an import listed the whole environment).
"""

from __future__ import annotations

import builtins
import importlib.machinery
import json
import os
import select
import socket
import sys
import types
from typing import Any

#: what every ``run.py`` imports whatever its config (measured: 0.69 s of CPU for a fresh dry run of
#: configs/eval_demo.py, 0.43 s forked with only the third-party ones preloaded, 0.19 s with these)
PRELOAD = ("mmengine.config", "yaml", "numpy", "rich.console", "asyncio", "ssl", "email.message", "http.client",
           "urllib.request", "filelock", "platformdirs", "concurrent.futures", "subprocess", "json", "tomllib",
           "uuid", "decimal", "argparse", "multiprocessing", "tempfile", "shlex", "difflib", "ipaddress",
           "dataclasses", "inspect", "orchestra.cli.main", "orchestra.api", "orchestra.stages", "orchestra.planner",
           "orchestra.config")
#: never imported by the orchestrator (the import-linter contract), so never here either
ML = ("torch", "transformers", "lm_eval", "vllm", "datasets")


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
    os.umask(request["umask"])  # the client's, which a fresh child inherits
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
    _, status, usage = os.wait4(pid, 0)
    try:  # and the CPU it used (its own and its reaped children's), for the suite's CPU accounting
        conn.sendall(f"cpu {usage.ru_utime + usage.ru_stime}\nstatus {status}\n".encode())
    except OSError:
        pass


def _reap_all() -> None:
    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return


def serve(path: str, read_at_import: list[str]) -> str:
    """Accept runs until stdin ends (the client closed it: every waiter is reaped, then this
    process exits) or the process that started this one is gone; return (only in a forked CLI
    process) the script that process is to run."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    owner = os.getppid()
    print("ready", json.dumps(read_at_import), flush=True)
    while True:
        while True:  # reap ended waiters
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
        ready, _, _ = select.select([listener, sys.stdin], [], [], 0.5)
        if sys.stdin in ready and not os.read(sys.stdin.fileno(), 1) or os.getppid() != owner:
            _reap_all()  # so that the CPU of every CLI process counts in this one's
            sys.exit(0)
        if listener not in ready:
            continue
        conn, _ = listener.accept()
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


def _preload() -> list[str]:
    """Import :data:`PRELOAD`; the environment variables those imports read (``*``: the whole
    environment was listed), which the client then compares before it forks."""
    import importlib

    sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # run.py's folder, as in the CLI
    read: set[str] = set()
    environ = type(os.environ)
    getitem, iterate = environ.__getitem__, environ.__iter__

    def recorded_getitem(self: Any, key: str) -> str:
        read.add(key)
        return getitem(self, key)

    def recorded_iter(self: Any) -> Any:
        read.add("*")
        return iterate(self)

    environ.__getitem__, environ.__iter__ = recorded_getitem, recorded_iter  # type: ignore[method-assign]
    try:  # os.getenv, os.environ.get, ``in`` and copies all come through these two
        for name in PRELOAD:
            importlib.import_module(name)
    finally:
        environ.__getitem__, environ.__iter__ = getitem, iterate  # type: ignore[method-assign]
    assert not set(ML) & set(sys.modules), f"an ML framework was imported: {set(ML) & set(sys.modules)}"
    return sorted(read)


if __name__ == "__main__":
    read_at_import = _preload()
    # below: only in a forked CLI process, which runs the script as ``python SCRIPT`` would; its
    # SystemExit or uncaught exception ends this interpreter as it ends that one
    _run_as_main(serve(sys.argv[1], read_at_import))
