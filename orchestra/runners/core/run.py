"""What a launch gets from the run (``RunContext``) and what it gives back (``TaskResult``)."""

from __future__ import annotations

import enum
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from orchestra.events import EventLog
from orchestra.fileio import append_line
from orchestra.paths import RunPaths
from orchestra.runners.core.contract import Job
from orchestra.runners.core.host import HostCapacity
from orchestra.tasks.spec import TaskSpec, output_done


class TaskState(str, enum.Enum):
    """Where a task ended up."""

    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"
    SKIPPED = "skipped"


@dataclass
class TaskResult:
    """The outcome of a task after all its attempts."""

    task_id: str
    stage: str
    state: TaskState
    attempts: int
    log_path: str
    reason: str = ""
    duration_s: float = 0.0


class Results(dict[str, TaskResult]):
    """Results by task id, with a running count per end state: the progress hook gets the
    counts every round, and counting 10,000 results each round would make the loop quadratic."""

    def __init__(self, on_end: Callable[[str], None] | None = None) -> None:
        super().__init__()
        self.counts: dict[str, int] = {}
        self.on_end = on_end  # told each task id that reached an end state (no attempt of it can follow)

    def __setitem__(self, task_id: str, result: TaskResult) -> None:
        old = self.get(task_id)
        if old is not None:
            self.counts[old.state.value] -= 1
        super().__setitem__(task_id, result)
        self.counts[result.state.value] = self.counts.get(result.state.value, 0) + 1
        if self.on_end is not None:
            self.on_end(task_id)


class Shared:
    """Objects the launches of one run share, made on first use by name and closed once, by
    whoever made this (``run_stages``, at the run's end).  Safe to use from the stages' threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._objects: dict[Any, Any] = {}

    def get(self, name: Any, make: Callable[[], Any]) -> Any:
        """The object called ``name``, made by ``make()`` if there is none yet."""
        with self._lock:
            if name not in self._objects:
                self._objects[name] = make()
            return self._objects[name]

    def close(self) -> None:
        """Close every object (its ``close()``), each once, even if one raises."""
        with self._lock:
            objects, self._objects = list(self._objects.values()), {}
        errors = []
        for obj in objects:
            try:
                obj.close()
            except Exception as exc:  # noqa: BLE001 - the others still close; the first is raised
                errors.append(exc)
        if errors:
            raise errors[0]


@dataclass
class RunContext:
    """What a runner needs from the run: its folder, its event log, and the stop flag."""

    paths: RunPaths
    events: EventLog
    stop: threading.Event = field(default_factory=threading.Event)
    on_change: Callable[[dict[str, int]], None] | None = None  # progress display hook
    #: set while an upstream stage still runs and may write this launch's inputs: a task
    #: whose inputs are missing then waits (the eval of a (model, dataset) starts as soon as
    #: its predictions are done); once cleared, a task still missing inputs is skipped
    upstream: threading.Event | None = None
    #: this machine's GPUs and cores as the run's local runners hand them out (the stages
    #: share one when they run side by side); None: each local runner keeps its own
    host: HostCapacity | None = None
    #: what the run's launches share beyond one launch (the local runner's warm workers, so the
    #: eval stage scores in the processes the infer stage warmed); None: each launch its own
    shared: Shared | None = None
    #: set by a launch once its first round has started the tasks it could and its ``queued``
    #: events are written (and at its end): a stage beside it waits for this before queueing its
    #: own tasks, so that the run's first tasks start before a second queue of 100,000 is built
    begun: threading.Event | None = None

    def inputs_may_come(self) -> bool:
        return self.upstream is not None and self.upstream.is_set()


@dataclass
class PendingTask:
    """A task waiting for its next attempt (the loop's queue entry)."""

    task: TaskSpec
    attempt: int
    not_before: float = 0.0
    first_started: float = 0.0
    infra_retries: int = 0  # attempts retried as infrastructure failures: they do not count against ``retry``
    inputs_ready: bool = True  # False until its inputs (an upstream stage's outputs) exist
    inputs_checked: float = 0.0  # when they were last looked for
    inputs_seen: int = 0  # its first inputs_seen inputs were found done (they stay done during a launch)
    said: bool = True  # its ``queued`` event is written (False from queueing until then: core/waiting.py)

    def first_missing(self) -> str | None:
        """The first input of this waiting task that is not done yet, or None.  Inputs found done
        are not read again: an eval task over 10,000 predictions looks at each file once."""
        inputs = [pair for unit in self.task.units for pair in unit.inputs]
        while self.inputs_seen < len(inputs):
            path, expected = inputs[self.inputs_seen]
            if not output_done(path, expected):
                return path
            self.inputs_seen += 1
        return None


@dataclass
class InFlight:
    """The jobs of one launch that a session still answers for."""

    running: dict[Job, PendingTask]
    stopping: dict[Job, PendingTask]  # cancelled (timeout or stop), not yet reported gone


def log_size(path: str) -> int:
    """The size of a task log now: where the output of the attempt about to start begins."""
    return os.path.getsize(path) if os.path.exists(path) else 0


def read_log(path: str, offset: int, limit: int | None = None) -> str:
    """A task log from ``offset`` on (its last ``limit`` bytes at most); ``""`` if it cannot be read."""
    try:
        with open(path, "rb") as f:
            end = f.seek(0, os.SEEK_END)
            f.seek(offset if limit is None else max(offset, end - limit))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


def note(log_path: str, text: str) -> None:
    """Append ``text`` (whole lines, each ending in a newline: orchestra's own ``===== ...`` lines,
    a job's log copied) to a task log; a log that cannot be written must not stop the run."""
    if not text:
        return
    try:
        os.makedirs(os.path.dirname(log_path) or ".", exist_ok=True)
        append_line(log_path, text.encode("utf-8", "replace"))
    except OSError:
        pass
