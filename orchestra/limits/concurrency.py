"""Named concurrency limits, shared by everything in a process or by every process on the host.

``scope = concurrency("openai-api:http://host/v1|gpt", 50, host_wide=True)`` returns the scope
of that name, and ``async with scope() as slot: ...`` holds one of its 50 slots for the block.
Code that must give a slot back before it is done takes it by hand, ``slot = await
scope.acquire()`` ... ``scope.release(slot)``: the HTTP retry loop
(:func:`orchestra.limits.retry.send_with_retries`) does, so that no slot is held while a
request backs off.  Scopes are looked up by name, so every model object, task and coroutine
that names the same scope shares it.  A host-wide scope is backed by lock files (see
:class:`HostSlots`): the kernel releases a slot when its holder dies, even by SIGKILL.

Waiting never binds to an event loop beyond the current wait, so a warm worker that runs
one ``asyncio.run`` per task can keep using the same scopes.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import hashlib
import math
import os
import random
import time
from collections import deque
from collections.abc import Callable
from types import TracebackType
from typing import Protocol

from orchestra.privdir import is_own_regular_file, open_private_file, private_dir, temp_folder


class Slots(Protocol):
    """What a concurrency scope offers: acquire a slot (its number), give it back."""

    name: str
    limit: int

    async def acquire(self) -> int: ...

    def release(self, slot: int) -> None: ...

    def in_use(self) -> int: ...


class _Hold:
    """``async with scope:`` support: holds one slot for the block."""

    __slots__ = ("_slots", "_slot")

    def __init__(self, slots: Slots) -> None:
        self._slots = slots
        self._slot = -1

    async def __aenter__(self) -> int:
        self._slot = await self._slots.acquire()
        return self._slot

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._slots.release(self._slot)


class _Waiters:
    """FIFO of futures waiting for a slot; a cancelled waiter never swallows a slot."""

    def __init__(self) -> None:
        self._queue: deque[asyncio.Future[int]] = deque()

    def __len__(self) -> int:
        return len(self._queue)

    def hand_over(self, slot: int) -> bool:
        """Give ``slot`` to the first live waiter; False if there is none."""
        while self._queue:
            fut = self._queue.popleft()
            if not fut.done() and not fut.get_loop().is_closed():
                fut.set_result(slot)
                return True
        return False


class ProcessSlots:
    """``limit`` slots shared by the coroutines of this process."""

    def __init__(self, name: str, limit: int) -> None:
        self.name = name
        self.limit = limit
        self._free = list(range(limit - 1, -1, -1))
        self._waiters = _Waiters()

    def in_use(self) -> int:
        return self.limit - len(self._free)

    async def acquire(self) -> int:
        if self._free and not len(self._waiters):
            return self._free.pop()
        return await _wait_cancel_safe(self._waiters, self.release)

    def release(self, slot: int) -> None:
        if not self._waiters.hand_over(slot):
            self._free.append(slot)

    def __call__(self) -> _Hold:
        return _Hold(self)


async def _wait_cancel_safe(waiters: _Waiters, release: Callable[[int], None]) -> int:
    """Wait for a slot; if cancelled just after one was handed over, give it back."""
    fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    waiters._queue.append(fut)
    try:
        return await fut
    except asyncio.CancelledError:
        if fut.done() and not fut.cancelled():
            release(fut.result())
        raise


def _private_scope_dir(lock_dir: str | None, key: str) -> str:
    """``<lock dir>/<key>`` (and its ``members`` folder), each a private folder of this user
    (:func:`orchestra.privdir.private_dir`): slot and member files are never made, locked or
    removed where another user could have put them or a link to elsewhere."""
    if lock_dir is None and os.environ.get("ORCHESTRA_LOCK_DIR"):
        lock_dir = os.environ["ORCHESTRA_LOCK_DIR"]
    if lock_dir is None:  # the default: <tmp>/orchestra-<uid>/slots, checked from <tmp>/orchestra-<uid>
        folder = private_dir(temp_folder("slots"), "slots", key, "members")
    else:
        folder = private_dir(lock_dir, key, "members", env="ORCHESTRA_LOCK_DIR")
    return os.path.dirname(folder)


class HostSlots:
    """``limit`` slots shared by every process on this host that names the same scope.

    Slot ``i`` is an exclusive ``flock`` on ``<lock_dir>/<key>/slot-<i>``.  Within one process
    a finished request hands its slot straight to the next waiting one (no system call); a
    process takes free slots from the host with non-blocking ``flock`` calls and, while it has
    to wait for slots held elsewhere, polls every ``poll_s``.  Each live process registers a
    member file; a process holding more than its fair share (``limit`` / members) returns
    finished slots to the host instead of keeping them, and polls more slowly, so that two
    tasks of one model end up sharing the limit instead of one starving the other.
    """

    member_check_s = 0.25  # how often the live members are counted again

    def __init__(self, name: str, limit: int, lock_dir: str | None = None, poll_s: float = 0.01) -> None:
        self.name = name
        self.limit = limit
        key = hashlib.sha256(name.encode("utf-8")).hexdigest()[:20]
        self.dir = _private_scope_dir(lock_dir, key)
        self.poll_s = poll_s
        self._fds: dict[int, int] = {}
        self._held: set[int] = set()
        self._waiters = _Waiters()
        self._member_fd: int | None = None
        self._member_path = ""
        self._members = 1
        self._share = limit
        self._members_checked = 0.0
        self._poll_handle: asyncio.TimerHandle | None = None
        self._rng = random.Random()

    # -- membership (for fair shares) -----------------------------------------------------
    def _register(self) -> None:
        if self._member_fd is not None:
            return
        path = os.path.join(self.dir, "members", f"{os.getpid()}-{self._rng.getrandbits(32):08x}")
        fd = open_private_file(path, os.O_RDWR | os.O_CREAT | os.O_EXCL)
        fcntl.flock(fd, fcntl.LOCK_EX)
        self._member_fd, self._member_path = fd, path
        self._count_members(force=True)

    def _count_members(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._members_checked < self.member_check_s:
            return
        self._members_checked = now
        live = 0
        folder = os.path.join(self.dir, "members")
        for entry in os.listdir(folder):
            path = os.path.join(folder, entry)
            if path == self._member_path:
                live += 1
                continue
            try:  # never through a link; only our own regular files are counted or removed
                fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
            except OSError:
                continue
            try:
                if not is_own_regular_file(fd):
                    continue
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                live += 1  # held: its process is alive
            else:  # left behind by a dead process; another live member may be clearing it too
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
            finally:
                os.close(fd)
        self._members = max(1, live)
        self._share = max(1, math.ceil(self.limit / self._members))

    def fair_share(self) -> int:
        return self._share

    # -- slots ------------------------------------------------------------------------------
    def in_use(self) -> int:
        return len(self._held)

    def _fd(self, slot: int) -> int:
        fd = self._fds.get(slot)
        if fd is None:
            fd = open_private_file(os.path.join(self.dir, f"slot-{slot}"), os.O_RDWR | os.O_CREAT)
            self._fds[slot] = fd
        return fd

    def _try_take(self) -> int | None:
        if len(self._held) >= self.limit:
            return None
        start = self._rng.randrange(self.limit)
        for i in range(self.limit):
            slot = (start + i) % self.limit
            if slot in self._held:
                continue
            try:
                fcntl.flock(self._fd(slot), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                if exc.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                    continue
                raise
            self._held.add(slot)
            return slot
        return None

    async def acquire(self) -> int:
        self._register()
        if not len(self._waiters):
            slot = self._try_take()
            if slot is not None:
                return slot
        self._schedule_poll()
        return await _wait_cancel_safe(self._waiters, self.release)

    def release(self, slot: int) -> None:
        self._count_members()
        if len(self._held) <= self.fair_share() and self._waiters.hand_over(slot):
            return
        fcntl.flock(self._fds[slot], fcntl.LOCK_UN)
        self._held.discard(slot)
        if len(self._waiters):
            self._schedule_poll()

    def _schedule_poll(self) -> None:
        if self._poll_handle is not None:
            return
        loop = asyncio.get_running_loop()
        delay = self.poll_s if len(self._held) < self.fair_share() else self.poll_s * 5
        self._poll_handle = loop.call_later(delay, self._poll)

    def _poll(self) -> None:
        self._poll_handle = None
        self._count_members()
        while len(self._waiters):
            slot = self._try_take()
            if slot is None:
                break
            if not self._waiters.hand_over(slot):
                fcntl.flock(self._fds[slot], fcntl.LOCK_UN)
                self._held.discard(slot)
                break
        if len(self._waiters):
            self._schedule_poll()

    def close(self) -> None:
        """Give back every slot and the membership (the model is done with this scope)."""
        if self._poll_handle is not None:
            self._poll_handle.cancel()
            self._poll_handle = None
        for fd in self._fds.values():
            os.close(fd)  # closing drops the lock
        self._fds.clear()
        self._held.clear()
        if self._member_fd is not None:
            try:
                os.unlink(self._member_path)
            except OSError:
                pass
            os.close(self._member_fd)
            self._member_fd = None

    def __call__(self) -> _Hold:
        return _Hold(self)


_SCOPES: dict[tuple[str, bool], ProcessSlots | HostSlots] = {}


def concurrency(name: str, limit: int, *, host_wide: bool = False,
                lock_dir: str | None = None) -> ProcessSlots | HostSlots:
    """The shared scope called ``name`` with ``limit`` slots; use as ``async with scope():``.

    Every call with the same name (and ``host_wide``) returns the same scope.  An idle scope
    asked for with another limit is rebuilt with it; a busy one raises ``ValueError``, since
    two limits for one scope would both be wrong.
    """
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
        raise ValueError(f"concurrency {name!r}: limit must be an integer >= 1, got {limit!r}")
    key = (name, host_wide)
    scope = _SCOPES.get(key)
    if scope is not None and scope.limit != limit:
        if scope.in_use():
            raise ValueError(f"concurrency {name!r} is in use with limit {scope.limit}; asked for {limit}")
        drop_scope(name, host_wide)
        scope = None
    if scope is None:
        scope = HostSlots(name, limit, lock_dir) if host_wide else ProcessSlots(name, limit)
        _SCOPES[key] = scope
    return scope


def drop_scope(name: str, host_wide: bool = False) -> None:
    """Forget a scope, closing its host slots."""
    scope = _SCOPES.pop((name, host_wide), None)
    if isinstance(scope, HostSlots):
        scope.close()
