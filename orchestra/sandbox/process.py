"""The one async helper that runs a scoring subprocess, and the host-wide cap on them.

Every program that scoring runs goes through :func:`run_process`: the child leads its own
session, its stdout and stderr are kept up to a size (a program that writes more is killed),
it is killed after a wall-clock limit, and when the helper returns - normally, on timeout or
because the awaiting task was cancelled (Ctrl-C) - its whole process group has been sent
SIGKILL and the child reaped.  How many run at once on a host is capped by the host-wide
concurrency scope :func:`subprocess_slots` (``flock`` slots shared by every task on the host;
see :mod:`orchestra.limits.concurrency`), which callers hold around the helper.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from orchestra.limits.concurrency import HostSlots, ProcessSlots, concurrency

#: The name of the host-wide scope that caps sandboxed programs.
SCOPE_NAME = "orchestra-sandbox"
#: Most slots a host-wide sandbox scope may have (each slot gets its own user id).
MAX_SLOTS = 256
_READ_CHUNK = 65536
_DRAIN_S = 1.0  # after the child is gone: how long to wait for its pipes to close


def default_max_sandboxes() -> int:
    """The default cap: the CPUs this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def subprocess_slots(limit: int | None = None) -> HostSlots | ProcessSlots:
    """The host-wide scope of sandboxed programs (``limit`` slots; default: CPU count)."""
    limit = default_max_sandboxes() if limit is None else limit
    if not 1 <= limit <= MAX_SLOTS:
        raise ValueError(f"max_sandboxes must be within 1..{MAX_SLOTS}, got {limit}")
    return concurrency(SCOPE_NAME, limit, host_wide=True)


@dataclass(frozen=True)
class ProcessResult:
    """How a process ended and what it wrote (each stream cut at the size limit)."""

    returncode: int
    stdout: bytes
    stderr: bytes
    duration_s: float
    timed_out: bool = False
    output_exceeded: bool = False


def kill_group(pid: int) -> None:
    """SIGKILL the process group led by ``pid`` (gone already: nothing to do)."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


class _Protocol(asyncio.subprocess.SubprocessStreamProtocol):
    """Stream protocol that also says when the process itself exited (``Process.wait()``
    waits for its pipes too, which a daemon it left behind may hold open)."""

    def __init__(self, limit: int, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(limit=limit, loop=loop)
        self.exited = asyncio.Event()

    def process_exited(self) -> None:
        super().process_exited()
        self.exited.set()


async def run_process(
    argv: Sequence[str],
    *,
    env: dict[str, str],
    timeout_s: float,
    max_output_bytes: int,
    cwd: str | None = None,
    after_exit: Callable[[], None] | None = None,
    stdin_fd: int | None = None,
) -> ProcessResult:
    """Run ``argv`` in a new session with exactly ``env``; see the module docstring.

    ``after_exit`` runs once the child has exited or been killed, before its pipes are
    drained (a caller that can reach processes that left the group kills them there).
    ``stdin_fd`` becomes the child's standard input (default: ``/dev/null``); the caller
    keeps and closes its own copy.
    """
    t0 = time.monotonic()
    loop = asyncio.get_running_loop()
    transport, protocol = await loop.subprocess_exec(
        lambda: _Protocol(_READ_CHUNK, loop),
        *argv,
        stdin=asyncio.subprocess.DEVNULL if stdin_fd is None else stdin_fd,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
        cwd=cwd,
        start_new_session=True,
        close_fds=True,
    )
    proc = asyncio.subprocess.Process(transport, protocol, loop)
    exceeded = False
    buffers = (bytearray(), bytearray())

    async def pump(stream: asyncio.StreamReader | None, buf: bytearray) -> None:
        nonlocal exceeded
        if stream is None:
            return
        while True:
            chunk = await stream.read(_READ_CHUNK)
            if not chunk:
                return
            room = max_output_bytes - len(buf)
            buf += chunk[: max(room, 0)]
            if len(chunk) > room:
                exceeded = True
                kill_group(proc.pid)
                return

    pumps = [asyncio.ensure_future(pump(proc.stdout, buffers[0])), asyncio.ensure_future(pump(proc.stderr, buffers[1]))]
    timed_out = False
    try:
        try:
            await asyncio.wait_for(protocol.exited.wait(), timeout_s)
        except (asyncio.TimeoutError, TimeoutError):
            timed_out = True
    finally:
        # Whatever happened (exit, timeout, output limit, cancellation): nothing of the
        # group outlives this call.
        kill_group(proc.pid)
        if after_exit is not None:
            after_exit()
        _, pending = await asyncio.wait(pumps, timeout=_DRAIN_S)
        for task in pending:
            task.cancel()
        await protocol.exited.wait()
        transport.close()  # our ends of pipes that something out of reach still holds
    returncode = transport.get_returncode()
    assert returncode is not None
    return ProcessResult(
        returncode=returncode,
        stdout=bytes(buffers[0]),
        stderr=bytes(buffers[1]),
        duration_s=time.monotonic() - t0,
        timed_out=timed_out,
        output_exceeded=exceeded,
    )
