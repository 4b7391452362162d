"""RayRunner's connection to Ray: joining a cluster or starting a local Ray, once per process,
and keeping Ray's messages about the cluster off the terminal's results.

With ``ray_pool.py`` this is where the orchestrator imports ``ray``; RayRunner imports both
only when it launches (see ``.importlinter``).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

import ray
from ray import exceptions as rex

from orchestra.errors import UserError

#: what this process's Ray connection was made for by :func:`connect` (None: not by it)
_connected_for: tuple[str, str] | None = None


def connect(address: str | None, runtime_env: dict[str, Any] | None) -> None:
    """Connect this process to Ray: a new local Ray (``address=None``) or a cluster.

    A connection the caller made (a notebook's ``ray.init``) is used as it is.  One this function
    made for the same address and runtime_env is kept (a local Ray then serves every stage and
    run of the process; Ray stops it when the process exits); another is replaced.
    """
    global _connected_for
    wanted = ("local" if address is None else address, repr(sorted((runtime_env or {}).items())))
    if ray.is_initialized():
        if _connected_for is None or _connected_for == wanted:
            return
        ray.shutdown()
        _connected_for = None
    # ray.init installs its own SIGTERM handler; the run's (stop every task, then exit) must stay
    main = threading.current_thread() is threading.main_thread()
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)} if main else {}
    try:
        ray.init(address=wanted[0], runtime_env=runtime_env, log_to_driver=False, logging_level=logging.WARNING)
    except (ConnectionError, RuntimeError, ValueError, TimeoutError, rex.RayError) as exc:
        what = "start a local Ray" if address is None else f"connect to the Ray cluster at {address}"
        first = next((line for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
        raise UserError(f"RayRunner could not {what}: {first}") from None
    finally:
        for sig, handler in handlers.items():
            if handler is not None:
                signal.signal(sig, handler)
    _connected_for = wanted


def disconnect() -> None:
    """After a launch: leave a cluster :func:`connect` joined (a driver that stays would keep its
    job open there); a local Ray it started stays for the next launch of this process."""
    global _connected_for
    if _connected_for is not None and _connected_for[0] != "local":
        ray.shutdown()
        _connected_for = None


def route_cluster_messages(log_path: str) -> Callable[[], None]:
    """Send the messages Ray's driver prints about the cluster (a raylet that died, with the tail
    of its log; a worker killed for memory) to ``log_path`` instead of this process's stdout,
    which carries the results table.  Returns the function that undoes it."""
    worker_module: Any = getattr(getattr(ray, "_private", None), "worker", None)
    original = getattr(worker_module, "print_to_stdstream", None)
    if original is None:  # another Ray: its messages stay where it prints them
        return lambda: None

    def to_log(data: dict[str, Any], ignore_prefix: bool) -> None:
        if data.get("pid") != "raylet":
            original(data, ignore_prefix)
            return
        os.makedirs(os.path.dirname(log_path), exist_ok=True)
        with open(log_path, "a", encoding="utf-8") as log:
            log.write(f"[{time.strftime('%Y-%m-%d %H:%M:%S')}] " + "\n".join(data.get("lines", [])) + "\n")

    worker_module.print_to_stdstream = to_log

    def undo() -> None:
        worker_module.print_to_stdstream = original

    return undo
