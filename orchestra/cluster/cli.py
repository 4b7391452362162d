"""One call of an external cluster client (``sbatch``, ``squeue``, ``dlc``): an argv, never a shell.

``call`` runs it in its own process group with a deadline; on the deadline, or once ``abort`` has
been set for ``abort_grace_s``, the whole group (the client and whatever it started) is killed
and ``CallTimeout`` says which.  ``RateLimiter`` is the token bucket that paces calls to one
service across threads; ``shared_limiter`` hands every client of one account the same bucket.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Hashable, Mapping, Sequence
from typing import IO


class CallError(RuntimeError):
    """The client could not be started."""


class CallTimeout(RuntimeError):
    """The call was killed: ``aborted`` False when it ran past its deadline, True after a stop."""

    def __init__(self, aborted: bool) -> None:
        super().__init__("aborted" if aborted else "deadline")
        self.aborted = aborted


def call(argv: Sequence[str], timeout_s: float, abort: threading.Event | None = None,
         abort_grace_s: float = 2.0, stop_on: Sequence[str] = (),
         env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` to its end (stdin closed, output captured); ``CallError`` / ``CallTimeout``.

    ``env``: the client's whole environment (None: ours).

    ``stop_on``: once a line of the client's stderr holds one of these (e.g. a client about to sleep
    and ask again by itself), its group is killed at once and the call returns what it printed
    (``returncode`` then is -9, unless it had ended)."""
    try:
        proc = subprocess.Popen(list(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                                text=True, errors="replace", start_new_session=True,
                                env=None if env is None else dict(env))
    except OSError as exc:
        raise CallError(f"cannot run {argv[0]}: {exc}") from None
    if stop_on:
        return _call_watching(proc, list(argv), timeout_s, stop_on, abort, abort_grace_s)
    deadline = time.monotonic() + timeout_s
    aborted_at: float | None = None
    while True:
        try:
            wait = 0.1 if abort is not None else max(0.0, deadline - time.monotonic())
            out, err = proc.communicate(timeout=wait)
            return subprocess.CompletedProcess(list(argv), proc.returncode, out or "", err or "")
        except subprocess.TimeoutExpired:
            pass
        now = time.monotonic()
        if abort is not None and aborted_at is None and abort.is_set():
            aborted_at = now
        if now >= deadline or (aborted_at is not None and now - aborted_at >= abort_grace_s):
            kill_group(proc)
            raise CallTimeout(aborted=now < deadline) from None


def _call_watching(proc: subprocess.Popen[str], argv: list[str], timeout_s: float, stop_on: Sequence[str],
                   abort: threading.Event | None, abort_grace_s: float) -> subprocess.CompletedProcess[str]:
    """``call``'s wait when a line of stderr may stop the client: both pipes read line by line,
    the deadline and ``abort`` watched as ``call`` does (until both pipes are closed, as
    ``communicate`` waits: a grandchild that keeps them open is killed with the group at the deadline)."""
    out: list[str] = []
    err: list[str] = []

    def kill() -> None:
        if proc.returncode is None or any(r.is_alive() for r in readers):  # the group may outlive its leader
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)

    def read(stream: IO[str], lines: list[str], watch: bool) -> None:
        for line in stream:
            lines.append(line)
            if watch and any(marker in line for marker in stop_on):
                kill()

    assert proc.stdout is not None and proc.stderr is not None
    readers = [threading.Thread(target=read, args=(proc.stdout, out, False), daemon=True),
               threading.Thread(target=read, args=(proc.stderr, err, True), daemon=True)]
    for reader in readers:
        reader.start()
    deadline = time.monotonic() + timeout_s
    aborted_at: float | None = None
    while proc.poll() is None or any(r.is_alive() for r in readers):
        if proc.returncode is None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=0.1)
        else:
            time.sleep(0.05)  # the client ended; its output is still open
        now = time.monotonic()
        if abort is not None and aborted_at is None and abort.is_set():
            aborted_at = now
        if now >= deadline or (aborted_at is not None and now - aborted_at >= abort_grace_s):
            kill()
            proc.wait()
            for reader in readers:
                reader.join(timeout=5)  # a grandchild that left the group may hold a pipe: bounded
            raise CallTimeout(aborted=now < deadline) from None
    return subprocess.CompletedProcess(argv, proc.returncode, "".join(out), "".join(err))


def kill_group(proc: subprocess.Popen[str]) -> None:
    """SIGKILL the process group a call leads (the client and whatever it started) and reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.communicate(timeout=5)  # a grandchild that left the group may hold the pipes: bounded
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


class RateLimiter:
    """At most ``rate`` calls per second over all threads (a token bucket of ``burst`` calls)."""

    def __init__(self, rate: float, burst: int = 5) -> None:
        self.rate = rate
        self.burst = float(burst)
        self.tokens = float(burst)
        self.stamp = time.monotonic()
        self.lock = threading.Lock()

    def acquire(self) -> None:
        while True:
            with self.lock:
                now = time.monotonic()
                self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
                self.stamp = now
                if self.tokens >= 1:
                    self.tokens -= 1
                    return
                wait = (1 - self.tokens) / self.rate
            time.sleep(wait)


_limiters: dict[tuple[Hashable, float], RateLimiter] = {}
_limiters_lock = threading.Lock()


def shared_limiter(account: Hashable, rate: float) -> RateLimiter:
    """One rate for every client of one account in this process (the infer and eval stages run at once)."""
    with _limiters_lock:
        key = (account, rate)
        if key not in _limiters:
            _limiters[key] = RateLimiter(rate, burst=max(5, int(rate)))
        return _limiters[key]
