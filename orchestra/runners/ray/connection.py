"""RayRunner's connection to Ray: joining a cluster or starting a local Ray, once per process,
and keeping Ray's messages about the cluster off the terminal's results while launches use it.

With ``pool.py`` and ``session.py`` this is where the orchestrator imports ``ray``; RayRunner
imports them only when it launches (see ``.importlinter``).
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

from orchestra.errors import Stopped, UserError
from orchestra.fileio import append_line
from orchestra.runners.core.lasting import in_lasting_thread

#: what this process's Ray connection was made for by :func:`connect` (None: not by it)
_connected_for: tuple[str, str] | None = None
#: launches using the connection now (the eval stage's runner works beside the infer stage's)
_users = 0
#: undoes the routing of Ray's cluster messages that the first of these launches asked for
_unroute: Callable[[], None] | None = None
_lock = threading.Lock()


def connect(address: str | None, runtime_env: dict[str, Any] | None, log_path: str,
            timeout_s: float = 120.0, stop: threading.Event | None = None) -> None:
    """Connect this process to Ray: a new local Ray (``address=None``) or a cluster.  Every call
    is paired with a :func:`disconnect` when its launch ends.  While launches use it, the messages
    Ray's driver prints about the cluster go to ``log_path`` (the first launch's; stages that run at
    once share one run folder), not to this process's stdout, which carries the results table.

    A connection the caller made (a notebook's ``ray.init``) is used as it is.  One this function
    made for the same address and runtime_env is shared (by stages that run at once) and kept (a
    local Ray then serves every stage and run of the process; Ray stops it when the process
    exits); another is replaced once no launch uses it.  A process holds one Ray connection, so
    two stages at once must ask for the same cluster.

    ``timeout_s`` bounds each Ray Client (``ray://``) connection attempt: the head's client
    server has been seen to take a client and never answer it.  Once ``stop`` is set (the run's
    stop flag: a signal), an attempt under way is cut and :class:`~orchestra.errors.Stopped` raised.
    """
    global _connected_for, _users, _unroute
    wanted = ("local" if address is None else address, repr(sorted((runtime_env or {}).items())))
    with _lock:
        if ray.is_initialized() and _connected_for not in (None, wanted):
            if _users:
                theirs = "a local Ray" if _connected_for[0] == "local" else _connected_for[0]
                ours = "a local Ray" if address is None else address
                raise UserError(f"RayRunner: two stages running at once ask for different Ray clusters or "
                                f"runtime_env ({theirs}, {ours}); one process holds one Ray connection: give "
                                "both the same address and runtime_env, or set eval=dict(overlap=False)")
            ray.shutdown()
            _connected_for = None
        if not ray.is_initialized():
            _init(address, wanted[0], runtime_env, timeout_s, stop)
            _connected_for = wanted
        if not _users:
            _unroute = _to_log(log_path)
        _users += 1


def _init(address: str | None, target: str, runtime_env: dict[str, Any] | None, timeout_s: float,
          stop: threading.Event | None) -> None:
    if threading.current_thread() is not threading.main_thread():
        # A local Ray's processes die with the thread that started them (Ray sets PDEATHSIG, which
        # follows the thread): started from a stage's thread they would die when that stage ends
        in_lasting_thread(lambda: _ray_init(address, target, runtime_env, timeout_s, stop))
        return
    # ray.init installs its own SIGTERM handler; the run's (stop every task, then exit) must stay
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        _ray_init(address, target, runtime_env, timeout_s, stop)
    finally:
        for sig, handler in handlers.items():
            if handler is not None:
                signal.signal(sig, handler)


#: Ray Client connections tried when the head's client server could not start this client's
#: server, or did not answer within the connection's time
CLIENT_INIT_TRIES = 3
#: how long a Ray Client connection that was cut at its deadline may take to give up
CLIENT_CANCEL_WAIT_S = 15.0


class _Unanswered(Exception):
    """A Ray Client connection that got no answer within its time, and was cut."""


def _ray_init(address: str | None, target: str, runtime_env: dict[str, Any] | None, timeout_s: float,
              stop: threading.Event | None = None) -> None:
    ray_logger = logging.getLogger("ray._private.worker")  # where ray.init logs

    def quiet(record: logging.LogRecord) -> bool:  # "... not the main thread": the run has its own
        return "SIGTERM handler is not set" not in record.getMessage()

    ray_logger.addFilter(quiet)
    try:
        for tries in range(1, CLIENT_INIT_TRIES + 1):
            try:
                if target.startswith("ray://"):
                    _client_init(target, runtime_env, timeout_s, stop)
                else:
                    ray.init(address=target, runtime_env=runtime_env, log_to_driver=False,
                             logging_level=logging.WARNING)
                return
            except ConnectionAbortedError as exc:
                # Ray Client: the head starts a server process per client, and that start sometimes
                # fails on a busy head with nothing in its logs ("Initialization failure from
                # server:"); the next connection gets a new one.  Seen in this project's tests.
                if not target.startswith("ray://") or tries == CLIENT_INIT_TRIES:
                    raise _init_error(address, exc) from None
                time.sleep(tries)
            except _Unanswered:
                # the same start, failing without a word: the head's client server forked the
                # client's server, the fork crashed, and the client was left waiting (seen here)
                if tries == CLIENT_INIT_TRIES:
                    raise UserError(f"RayRunner could not connect to the Ray cluster at {address}: no answer within "
                                    f"connect_timeout_s={timeout_s:g} s, {CLIENT_INIT_TRIES} times (a runtime_env "
                                    "that the head installs may need longer; the head's "
                                    "logs/ray_client_server*.err may say more)") from None
    except (ConnectionError, RuntimeError, ValueError, TimeoutError, rex.RayError) as exc:
        raise _init_error(address, exc) from None
    finally:
        ray_logger.removeFilter(quiet)


def _client_init(target: str, runtime_env: dict[str, Any] | None, timeout_s: float,
                 stop: threading.Event | None) -> None:
    """``ray.init`` through Ray Client, cut after ``timeout_s`` (:class:`_Unanswered`) or once
    ``stop`` is set (:class:`Stopped`).  Ray Client waits for the head's answer to its first
    request with no deadline of its own, and the run's signal handler only sets ``stop``."""
    outcome: list[BaseException | None] = []
    done = threading.Event()

    def init() -> None:
        try:
            ray.init(address=target, runtime_env=runtime_env, log_to_driver=False, logging_level=logging.WARNING)
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread
            outcome.append(exc)
        finally:
            done.set()

    thread = threading.Thread(target=init, name="orchestra-ray-connect", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout_s
    while not done.wait(0.2) and time.monotonic() < deadline and not (stop is not None and stop.is_set()):
        pass
    if done.is_set():
        thread.join(1.0)
        if outcome[0] is not None:
            raise outcome[0]
        return
    ended, cut = _cut_client(done)
    if not ended:
        what = "the connection did not stop when cut" if cut else "Ray Client was still dialling the head"
        raise UserError(f"RayRunner could not connect to the Ray cluster at {target}: no answer within "
                        f"connect_timeout_s={timeout_s:g} s, and {what}")
    thread.join(1.0)
    ray.shutdown()  # whatever the cut left: a connection made just as it was cut, Ray Client's mode
    if stop is not None and stop.is_set():
        raise Stopped()
    raise _Unanswered()


def _cut_client(done: threading.Event) -> tuple[bool, bool]:
    """Close the gRPC channel of the Ray Client connection being made, so that its wait for the
    head's answer ends (with a ConnectionError in the connecting thread): as soon as Ray Client
    has a channel, within :data:`CLIENT_CANCEL_WAIT_S`.  Returns whether the connecting thread
    ended in that time, and whether a channel was cut.  The client is marked as shutting down
    first, so it does not reconnect; the error Ray Client logs about the closed channel is kept
    off the terminal."""
    from ray.util.client import ray as client_api

    cut = False
    data_logger = logging.getLogger("ray.util.client.dataclient")

    def not_the_cut(record: logging.LogRecord) -> bool:
        return "Unrecoverable error in data channel" not in record.getMessage()

    data_logger.addFilter(not_the_cut)
    try:
        end = time.monotonic() + CLIENT_CANCEL_WAIT_S
        while not done.wait(0.05):
            if time.monotonic() >= end:
                return False, cut
            worker = getattr(client_api.get_context(), "client_worker", None)
            channel = getattr(worker, "channel", None)
            if not cut and worker is not None and channel is not None:
                worker._in_shutdown = True
                channel.close()
                cut = True
        return True, cut
    finally:
        data_logger.removeFilter(not_the_cut)


def _init_error(address: str | None, exc: BaseException) -> UserError:
    what = "start a local Ray" if address is None else f"connect to the Ray cluster at {address}"
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()] or [type(exc).__name__]
    said = lines[0] if not lines[0].endswith(":") or len(lines) == 1 else f"{lines[0]} {lines[-1]}"
    if said.endswith(":"):
        said += " no reason given (the head's logs/ray_client_server*.err may say more)"
    return UserError(f"RayRunner could not {what}: {said}")


def disconnect() -> None:
    """After a launch: once no launch uses it, leave a cluster :func:`connect` joined (a driver
    that stays would keep its job open there); a local Ray it started stays for the next launch
    of this process."""
    global _connected_for, _users, _unroute
    with _lock:
        _users = max(0, _users - 1)
        if not _users and _unroute is not None:
            _unroute()
            _unroute = None
        if not _users and _connected_for is not None and _connected_for[0] != "local":
            ray.shutdown()
            _connected_for = None


def _to_log(log_path: str) -> Callable[[], None]:
    """Send the messages Ray's driver prints about the cluster (a raylet that died, with the tail
    of its log; a worker killed for memory) to ``log_path``; returns the function that undoes it."""
    worker_module: Any = getattr(getattr(ray, "_private", None), "worker", None)
    original = getattr(worker_module, "print_to_stdstream", None)
    if original is None:  # another Ray: its messages stay where it prints them
        return lambda: None

    def to_log(data: dict[str, Any], ignore_prefix: bool) -> None:
        if data.get("pid") != "raylet":
            original(data, ignore_prefix)
            return
        os.makedirs(os.path.dirname(log_path), exist_ok=True)
        text = f"[{time.strftime('%Y-%m-%d %H:%M:%S')}] " + "\n".join(data.get("lines", [])) + "\n"
        append_line(log_path, text.encode("utf-8", "replace"))

    worker_module.print_to_stdstream = to_log
    return lambda: setattr(worker_module, "print_to_stdstream", original)
