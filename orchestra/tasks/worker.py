"""A warm worker: ``python -m orchestra.tasks.worker`` runs task after task in one process.

A model loaded by one task stays loaded for the next task of the same model, so a
dataset split into eight shards pays for loading the weights once per worker, not once
per shard.  The runner sends one JSON line per task on stdin::

    {"spec": "<run>/tasks/<id>.py", "log": "<run>/logs/infer/<id>.log", "env": {...}}

The task's output goes to its log file (file descriptors 1 and 2 are pointed at it while
the task runs) and the worker answers ``{"code": N}`` on the descriptor named by
``ORCHESTRA_WORKER_FD``.  End of input means: exit.  RayRunner's actors serve the same requests
through :func:`run_request`, one actor call per request instead of one line.
"""

from __future__ import annotations

import json
import os
import sys
from typing import BinaryIO

from orchestra.tasks.entry import task_main


def _run_one(request: dict[str, object]) -> int:
    from orchestra.tasks.kinds import run_task

    env = request.get("env", {})
    assert isinstance(env, dict)
    os.environ.update({str(k): str(v) for k, v in env.items()})
    return task_main([str(request["spec"])], run_task)


def run_request(request: dict[str, object]) -> int:
    """Run one request of the protocol in this process: the task's output goes to its log (file
    descriptors 1 and 2 point at it meanwhile) and its exit code is returned.  Warm workers of
    every runner call this (this module's ``main``, RayRunner's actors)."""
    me = os.getpid()
    log_fd = os.open(str(request["log"]), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    saved_out, saved_err = os.dup(1), os.dup(2)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    os.close(log_fd)
    try:
        try:
            code = _run_one(request)
        except SystemExit as exc:
            if os.getpid() != me:
                _forked_exit(exc.code)
            print(f"worker: task crashed: SystemExit: {exc}", file=sys.stderr)
            return 1
        except BaseException as exc:  # the worker must answer, whatever the task did
            if os.getpid() != me:
                _forked_exit(1)
            print(f"worker: task crashed: {type(exc).__name__}: {exc}", file=sys.stderr)
            return 1
        if os.getpid() != me:
            _forked_exit(code)
        return code
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved_out, 1)
        os.dup2(saved_err, 2)
        os.close(saved_out)
        os.close(saved_err)


def _forked_exit(status: object) -> None:
    """End a process the task forked (no exec) that got back here, a ``sys.exit()`` in it
    included: it is no worker, so it neither answers on the worker's pipe nor reads its
    requests; it ends with ``status`` (``sys.exit``'s meaning), as it would in a task process of
    its own."""
    if status is None:
        code = 0
    elif isinstance(status, int):
        code = status & 0xFF
    else:
        print(status, file=sys.stderr)
        code = 1
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


def _private_pipes(reply_fd: int) -> BinaryIO:
    """The requests, read from a private copy of stdin, whose descriptor 0 becomes ``/dev/null``:
    a task, and a program it starts without saying where its input comes from (a scorer running a
    model's code), reads end of input there, as in a task process of its own, and never takes
    the runner's next request or waits for one for ever.  The answer pipe is kept from programs
    a task starts."""
    os.set_inheritable(reply_fd, False)
    requests = os.fdopen(os.dup(0), "rb")  # a duplicate is not inherited
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    return requests


def main() -> int:
    reply_fd = int(os.environ["ORCHESTRA_WORKER_FD"])
    for line in _private_pipes(reply_fd):
        if not line.strip():
            continue
        code = run_request(json.loads(line))
        os.write(reply_fd, (json.dumps({"code": code}) + "\n").encode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
