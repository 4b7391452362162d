"""One thread that lasts as long as the orchestrator's process, for starts that must outlive a stage.

A process started with a parent-death signal (``PR_SET_PDEATHSIG``) gets it when the *thread* that
started it ends, not its process.  Started from a stage's thread (the eval stage runs in one beside
the infer stage), such processes would be killed when that stage ends, and whatever they started in
turn, orphaned, would outlive the run.  :func:`in_lasting_thread` runs such a start in a daemon
thread that is never joined: it ends with the process (RayRunner starts a local Ray there).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

_lock = threading.Lock()
_calls: queue.Queue[tuple[Callable[[], Any], dict[str, Any], threading.Event]] | None = None


def in_lasting_thread(call: Callable[[], T]) -> T:
    """Run ``call`` in this process's lasting thread and wait for it: its result, or its error."""
    global _calls
    with _lock:
        if _calls is None:
            _calls = queue.Queue()
            threading.Thread(target=_serve, args=(_calls,), name="orchestra-lasting", daemon=True).start()
    answer: dict[str, Any] = {}  # its "value", or its "error"
    done = threading.Event()
    _calls.put((call, answer, done))
    done.wait()
    if "error" in answer:
        raise answer["error"]
    value: T = answer["value"]
    return value


def _serve(calls: queue.Queue[tuple[Callable[[], Any], dict[str, Any], threading.Event]]) -> None:
    while True:
        call, answer, done = calls.get()
        try:
            answer["value"] = call()
        except BaseException as exc:  # handed to the caller
            answer["error"] = exc
        finally:
            done.set()
