"""Warm worker processes for LocalRunner: load a model once, run task after task.

Workers are keyed by what makes them reusable (stage, model settings, GPU ids).  A task
goes to an idle worker with its key; otherwise a new worker starts, replacing an idle one
when the pool is full (the policy of ``core/warm.py``, shared with the Ray pool; the
transport here is a process and its pipes).  See ``orchestra/tasks/worker.py`` for the
worker's side of the protocol.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field

from orchestra.runners.core import warm
from orchestra.runners.core.contract import Exit, Job
from orchestra.runners.core.proc import start_group, stop_groups


@dataclass
class Worker:
    """One warm worker process and the state of its reply pipe."""

    key: str
    proc: subprocess.Popen[bytes]
    reply_fd: int
    busy: bool = False
    idle_since: float = 0.0
    buffer: bytes = b""
    tasks_run: int = field(default=0)

    @property
    def ready(self) -> bool:
        """A worker process answers as soon as it runs (it is ready once alive)."""
        return self.proc.poll() is None


class WarmPool:
    """At most ``max_workers`` warm workers, handed out by key."""

    def __init__(self, max_workers: int, kill_grace_s: float, log_dir: str) -> None:
        self.max_workers = max_workers
        self.log_dir = log_dir  # where each worker's own output goes (its tasks' go to their logs)
        self.kill_grace_s = kill_grace_s
        self.workers: list[Worker] = []

    def run(self, job: Job, key: str) -> Worker:
        """Send ``job`` to a warm worker of ``key``, starting one if needed."""
        worker = warm.pick(self.workers, key)
        if worker is None:
            self._make_room()
            worker = self._spawn(job, key)
        request = {"spec": job.command.argv[-1], "log": job.log_path, "env": job.command.env}
        assert worker.proc.stdin is not None
        worker.proc.stdin.write((json.dumps(request) + "\n").encode())
        worker.proc.stdin.flush()
        worker.busy = True
        worker.tasks_run += 1
        return worker

    def _make_room(self) -> None:
        for dead in [w for w in self.workers if w.proc.poll() is not None and not w.busy]:
            self._forget(dead)
        while len(self.workers) >= self.max_workers and (spare := warm.victim(self.workers)) is not None:
            self.stop([spare])

    def _spawn(self, job: Job, key: str) -> Worker:
        read_fd, write_fd = os.pipe()
        os.set_blocking(read_fd, False)
        log = os.path.join(self.log_dir, f"worker-{os.getpid()}-{len(self.workers)}-{time.time_ns()}.log")
        os.makedirs(self.log_dir, exist_ok=True)
        proc = start_group([sys.executable, "-m", "orchestra.tasks.worker"],
                           {**job.command.env, "ORCHESTRA_WORKER_FD": str(write_fd)}, log,
                           stdin=subprocess.PIPE, pass_fds=(write_fd,))
        os.close(write_fd)
        worker = Worker(key, proc, read_fd)
        self.workers.append(worker)
        return worker

    def poll(self, worker: Worker) -> Exit | None:
        try:
            chunk = os.read(worker.reply_fd, 4096)
            worker.buffer += chunk
            eof = chunk == b""
        except BlockingIOError:
            eof = False
        if b"\n" in worker.buffer:
            line, _, worker.buffer = worker.buffer.partition(b"\n")
            worker.busy = False
            worker.idle_since = time.monotonic()
            return Exit(int(json.loads(line)["code"]))
        if eof or worker.proc.poll() is not None:
            code = worker.proc.wait()
            self._forget(worker)
            return Exit(code if code else -1, f"warm worker exited with code {code} during the task")
        return None

    def stop(self, workers: list[Worker]) -> None:
        """Kill these workers' process groups (SIGTERM, then SIGKILL after the grace period)."""
        stop_groups([w.proc for w in workers], self.kill_grace_s)
        for w in workers:
            self._forget(w)

    def detach(self, workers: list[Worker]) -> list[subprocess.Popen[bytes]]:
        """Take these workers out of the pool (a cancel stops their processes, off the loop)."""
        for w in workers:
            self._forget(w)
        return [w.proc for w in workers]

    def _forget(self, worker: Worker) -> None:
        if worker in self.workers:
            self.workers.remove(worker)
        try:
            os.close(worker.reply_fd)
        except OSError:
            pass
        if worker.proc.stdin is not None:
            try:
                worker.proc.stdin.close()
            except OSError:
                pass

    def close(self) -> None:
        """Let idle workers exit on end of input; kill whatever does not."""
        for w in self.workers:
            if w.proc.stdin is not None:
                try:
                    w.proc.stdin.close()
                except OSError:
                    pass
        deadline = time.monotonic() + self.kill_grace_s
        while time.monotonic() < deadline and any(w.proc.poll() is None for w in self.workers):
            time.sleep(0.02)
        self.stop(list(self.workers))
