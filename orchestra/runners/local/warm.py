"""Warm worker processes for LocalRunner: load a model once, run task after task.

Workers are keyed by what makes them reusable (stage, model settings, GPU ids).  A task goes to an
idle worker of its key; otherwise a new worker starts at once, replacing an idle one when the pool
is full: the warm pool of ``core/warm.py``, shared with the Ray pool, over this module's transport,
a process whose requests go down its stdin and whose answers come back on a pipe.  See
``orchestra/tasks/worker.py`` for the worker's side of the protocol.

One pool serves every warm launch of a run (the infer and the eval stage, side by side or one
after the other): an eval task, which loads no model, runs in an idle worker of any key once no
infer task still to start wants that worker, so it scores where the infer stage already imported
what scoring needs (lm-eval's bridge: lm-eval and its task index) instead of in a new process.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from orchestra.runners.core.contract import Exit, Job
from orchestra.runners.core.proc import reap_group, signal_group, start_group, stop_groups
from orchestra.runners.core.warm import StartFailed, WarmPool, Worker


@dataclass
class Pipe:
    """A worker process and the state of its reply pipe."""

    proc: subprocess.Popen[bytes]
    reply_fd: int
    buffer: bytes = b""


class Pipes:
    """The warm pool's transport on this machine: one process per worker, up as soon as it runs."""

    what = "warm worker"

    def __init__(self, kill_grace_s: float, log_dir: str) -> None:
        self.kill_grace_s = kill_grace_s
        self.log_dir = log_dir  # where each worker's own output goes (its tasks' go to their logs)

    def start(self, worker: Worker[str], request: Any) -> None:
        """Start the process, with the environment of the task it starts for (``request``)."""
        log = os.path.join(self.log_dir, f"{worker.name}-{time.time_ns()}.log")
        os.makedirs(self.log_dir, exist_ok=True)  # before the pipe: a failure here leaves nothing open
        read_fd, write_fd = os.pipe()
        os.set_blocking(read_fd, False)
        try:
            proc = start_group([sys.executable, "-m", "orchestra.tasks.worker"],
                               {**request, "ORCHESTRA_WORKER_FD": str(write_fd)}, log,
                               stdin=subprocess.PIPE, pass_fds=(write_fd,))
        except OSError:
            os.close(read_fd)
            raise
        finally:
            os.close(write_fd)
        worker.handle, worker.where = Pipe(proc, read_fd), {"pid": proc.pid}

    def came_up(self, starting: list[Worker[str]]) -> Mapping[Worker[str], dict[str, Any] | StartFailed]:
        return {}  # never starting: a process is up once it runs

    def stop(self, workers: list[Worker[str]], reason: str) -> None:
        """Kill these workers' process groups (SIGTERM, then SIGKILL after the grace period)."""
        stop_groups([w.handle.proc for w in workers], self.kill_grace_s)
        for w in workers:
            hang_up(w)


def hang_up(worker: Worker[str], reply: bool = True) -> None:
    """Close our ends of ``worker``'s pipes, its input only unless ``reply`` (an idle worker's
    process ends on end of input).  Each is closed once: a number closed twice may be another's."""
    pipe: Pipe = worker.handle
    if reply and pipe.reply_fd >= 0:
        os.close(pipe.reply_fd)
        pipe.reply_fd = -1
    if pipe.proc.stdin is not None:
        try:
            pipe.proc.stdin.close()
        except OSError:
            pass


def exit_code(line: bytes) -> int | None:
    """The exit code in a worker's answer line (``{"code": N}``), or None for a line that is not one."""
    try:
        answer = json.loads(line)
    except (ValueError, RecursionError):
        return None
    code = answer.get("code") if isinstance(answer, dict) else None
    return code if isinstance(code, int) and not isinstance(code, bool) else None


def model_part(key: str) -> str:
    """The ``worker_key`` in a pool key ``<worker_key>|<GPU ids>``."""
    return key.rpartition("|")[0]


class PipePool:
    """At most ``max_workers`` warm workers, handed out by key (``WarmPool`` over :class:`Pipes`).

    Shared by launches (:meth:`join`, :meth:`leave`): their loops may call it from two threads, and
    each runs at most its own ``max_num_workers`` jobs, so the pool holds the sum of theirs."""

    def __init__(self, max_workers: int, kill_grace_s: float, log_dir: str) -> None:
        self.pipes = Pipes(kill_grace_s, log_dir)
        self.pool: WarmPool[str] = WarmPool(self.pipes, max_workers, f"worker-{os.getpid()}")
        self.lock = threading.RLock()
        self.to_start: Counter[str] = Counter()  # infer tasks of a launch not submitted yet, by worker_key

    def join(self, max_workers: int, worker_keys: Iterable[str]) -> None:
        """A launch of at most ``max_workers`` jobs at once, whose tasks need workers of ``worker_keys``
        (one entry per task) comes in."""
        with self.lock:
            self.pool.max_workers += max_workers
            self.to_start.update(worker_keys)

    def leave(self, max_workers: int, worker_keys: Iterable[str]) -> None:
        """That launch ended: its room goes, and its tasks want no worker any more (its idle workers
        stay, for the next launch's tasks)."""
        with self.lock:
            self.pool.max_workers -= max_workers
            for key in set(worker_keys):
                self.to_start.pop(key, None)

    def _borrowable(self, key: str) -> Worker[str] | None:
        """For a task that needs no model (eval): an idle worker of its own ``key``, else the idle one
        used last whose model no task still to start wants (None: start one of ``key``)."""
        idle = [w for w in self.pool.workers.values() if w.ready and not w.busy]
        if any(w.key == key for w in idle):
            return None  # take() picks it
        free = [w for w in idle if not self.to_start[model_part(w.key)]]
        return max(free, key=lambda w: w.idle_since) if free else None

    def run(self, job: Job, key: str) -> Worker[str]:
        """Send ``job`` to a warm worker of ``key`` (an eval task: of any key that no infer task still
        wants), starting one if needed."""
        with self.lock:
            return self._run(job, key)

    def _run(self, job: Job, key: str) -> Worker[str]:
        self.detach([w for w in self.pool.workers.values() if not w.busy and w.handle.proc.poll() is not None])
        worker_key = model_part(key)
        if self.to_start[worker_key]:
            self.to_start[worker_key] -= 1
        # only a task on no GPU: a worker's GPUs are fixed once it has used them
        borrowed = self._borrowable(key) if job.task.stage == "eval" and job.task.num_gpus == 0 else None
        if borrowed is not None:
            borrowed.busy = True
            worker: Worker[str] | None = borrowed
        else:
            worker = self.pool.take(key) or self.pool.start(key, job.command.env)
        assert worker is not None, "the loop runs at most max_workers jobs, so an idle worker makes room"
        request = {"spec": job.command.argv[-1], "log": job.log_path, "env": job.command.env}
        stdin = worker.handle.proc.stdin
        assert stdin is not None
        try:
            stdin.write((json.dumps(request) + "\n").encode())
            stdin.flush()
        except OSError:  # it died since the check above: out of the pool, or it holds a slot busy for ever
            self.detach([worker])
            signal_group(worker.handle.proc.pid, signal.SIGKILL)
            raise
        return worker

    def poll(self, worker: Worker[str]) -> Exit | None:
        """How ``worker``'s task ended (its answer on the pipe, or the process gone), or None."""
        with self.lock:
            return self._poll(worker)

    def _poll(self, worker: Worker[str]) -> Exit | None:
        pipe: Pipe = worker.handle
        try:
            chunk = os.read(pipe.reply_fd, 4096)
            pipe.buffer += chunk
            eof = chunk == b""
        except BlockingIOError:
            eof = False
        if b"\n" in pipe.buffer:
            line, _, pipe.buffer = pipe.buffer.partition(b"\n")
            code = exit_code(line)
            if code is None:  # not the worker's answer: something its task ran wrote there; it is not trusted again
                self.detach([worker])
                stop_groups([pipe.proc], 0.0)
                return Exit(-1, f"warm worker's answer pipe held {line[:80]!r}, not an exit code; the worker was "
                                "stopped")
            self.pool.finished(worker)
            return Exit(code)
        code = reap_group(pipe.proc)  # what a dead worker left running in its group (a model's engine) goes too
        if eof and code is None:  # its answer pipe closed: it is on its way out; the grace, then stopped
            deadline = time.monotonic() + self.pipes.kill_grace_s
            while (code := reap_group(pipe.proc)) is None and time.monotonic() < deadline:
                time.sleep(0.01)
            if code is None:
                stop_groups([pipe.proc], 0.0)
                code = pipe.proc.wait()
        if code is not None:
            self.detach([worker])
            return Exit(code if code else -1, f"warm worker exited with code {code} during the task")
        return None

    def detach(self, workers: list[Worker[str]]) -> list[subprocess.Popen[bytes]]:
        """Take these workers out of the pool (a cancel stops their processes, off the loop)."""
        with self.lock:
            for w in workers:
                if self.pool.workers.pop(w.ident, None) is not None:
                    hang_up(w)
            return [w.handle.proc for w in workers]

    def close(self) -> None:
        """Let idle workers exit on end of input; kill whatever does not."""
        with self.lock:
            for w in self.pool.workers.values():
                hang_up(w, reply=False)
            deadline = time.monotonic() + self.pipes.kill_grace_s
            while time.monotonic() < deadline and any(w.handle.proc.poll() is None
                                                      for w in self.pool.workers.values()):
                time.sleep(0.02)
            self.pool.close()
