"""Warm worker processes for LocalRunner: load a model once, run task after task.

Workers are keyed by what makes them reusable (stage, model settings, GPU ids).  A task goes to an
idle worker of its key; otherwise a new worker starts at once, replacing an idle one when the pool
is full: the warm pool of ``core/warm.py``, shared with the Ray pool, over this module's transport,
a process whose requests go down its stdin and whose answers come back on a pipe.  See
``orchestra/tasks/worker.py`` for the worker's side of the protocol.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
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


class PipePool:
    """At most ``max_workers`` warm workers, handed out by key (``WarmPool`` over :class:`Pipes`)."""

    def __init__(self, max_workers: int, kill_grace_s: float, log_dir: str) -> None:
        self.pipes = Pipes(kill_grace_s, log_dir)
        self.pool: WarmPool[str] = WarmPool(self.pipes, max_workers, f"worker-{os.getpid()}")

    def run(self, job: Job, key: str) -> Worker[str]:
        """Send ``job`` to a warm worker of ``key``, starting one if needed."""
        self.detach([w for w in self.pool.workers.values() if not w.busy and w.handle.proc.poll() is not None])
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
        pipe: Pipe = worker.handle
        try:
            chunk = os.read(pipe.reply_fd, 4096)
            pipe.buffer += chunk
            eof = chunk == b""
        except BlockingIOError:
            eof = False
        if b"\n" in pipe.buffer:
            line, _, pipe.buffer = pipe.buffer.partition(b"\n")
            self.pool.finished(worker)
            return Exit(int(json.loads(line)["code"]))
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
        for w in workers:
            if self.pool.workers.pop(w.ident, None) is not None:
                hang_up(w)
        return [w.handle.proc for w in workers]

    def close(self) -> None:
        """Let idle workers exit on end of input; kill whatever does not."""
        for w in self.pool.workers.values():
            hang_up(w, reply=False)
        deadline = time.monotonic() + self.pipes.kill_grace_s
        while time.monotonic() < deadline and any(w.handle.proc.poll() is None for w in self.pool.workers.values()):
            time.sleep(0.02)
        self.pool.close()
