"""``Sandbox``: run one untrusted program with limits, isolated, and leave nothing behind.

A run holds one slot of the host-wide scope (:func:`~orchestra.sandbox.process.subprocess_slots`)
from before its folder is prepared until after it is removed.  The slot number picks the
run's folder (``<temp>/orchestra-sandbox-<uid>/<scope key>/box-<slot>``, see :func:`boxes_dir`;
wiped before use, so a run killed with its task leaves nothing that the next run of that
slot does not remove) and, as root, its user id
(``uid_base + <offset of the lock folder> + slot``): two programs never share a user, so
one program's fork bomb cannot use up another's process limit.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import shutil
import signal
import socket
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from orchestra.errors import OrchestraError, UserError
from orchestra.limits.concurrency import HostSlots, ProcessSlots
from orchestra.privdir import private_dir, temp_folder
from orchestra.sandbox.isolation import ISOLATIONS, Isolation, SandboxProgram
from orchestra.sandbox.limits import SandboxLimits
from orchestra.sandbox.process import MAX_SLOTS, run_process, subprocess_slots

#: First user id of sandboxed programs (above the ranges distributions and systemd hand out).
DEFAULT_UID_BASE = 1_900_000_000
_OFFSETS = 4096  # lock folders are spread over this many blocks of MAX_SLOTS user ids
#: Most bytes a program may be given on its standard input (they must fit a socket's buffer).
MAX_STDIN_BYTES = 16384
#: ``isolation='auto'`` tries these, in order.
AUTO_ORDER = ("bwrap", "unshare")
_FILE_NAME_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")
# Checked once per process and method: method name -> None (works) or why not.
_PROBED: dict[str, str | None] = {}


def boxes_dir(scope_dir: str) -> str:
    """Where the sandbox folders of the host-wide scope kept in ``scope_dir`` live:
    ``$ORCHESTRA_SANDBOX_DIR`` or ``<temp>/orchestra-sandbox-<uid>``, then a key of the scope
    (the folders must be reachable by the sandbox users, so not under a private lock folder).
    The root is created 0711 or must be a folder of this user that no one else can write
    (:func:`orchestra.privdir.private_dir`; else a one-line :class:`UserError`)."""
    root = private_dir(os.environ.get("ORCHESTRA_SANDBOX_DIR") or temp_folder("sandbox"), mode=0o711,
                       env="ORCHESTRA_SANDBOX_DIR")
    return os.path.join(root, hashlib.sha256(scope_dir.encode("utf-8")).hexdigest()[:16])


def _make_open_dirs(path: str) -> None:
    """Create ``path`` and its missing parents as 0711 folders (traversable, not listable)."""
    missing = []
    while not os.path.isdir(path):
        missing.append(path)
        path = os.path.dirname(path)
    for folder in reversed(missing):
        try:
            os.mkdir(folder)
        except FileExistsError:
            continue
        os.chmod(folder, 0o711)  # whatever the umask


def remove_tree(path: str) -> None:
    """Remove a slot folder, whatever its program did to it.  Without root, a program under
    ``none`` runs as our own user in that folder and may make its folders read-only or
    unreadable, which stopped ``rmtree`` (and then every later run of the slot); each folder is
    made ours to change and the removal is tried again.  A link swapped in meanwhile could only
    point at a file of our own user, which that program could change itself.  As root nothing
    stops ``rmtree``, so nothing is changed."""
    shutil.rmtree(path, ignore_errors=True)
    if not os.path.lexists(path) or os.geteuid() == 0:
        return
    stack = [path]
    while stack:
        folder = stack.pop()
        try:
            os.chmod(folder, 0o700)
            with os.scandir(folder) as entries:
                stack.extend(e.path for e in entries if e.is_dir(follow_symlinks=False))
        except OSError:
            continue
    shutil.rmtree(path, ignore_errors=True)


class IsolationUnavailable(UserError):
    """The isolation asked for cannot work on this host (one line: which, and why)."""


class SandboxError(OrchestraError):
    """A sandbox could not run a program for reasons of its own (not the program's)."""


@dataclass(frozen=True)
class SandboxResult:
    """How one sandboxed program ended.

    ``status``: ``ok`` (exit 0), ``failed`` (another exit code), ``timeout`` (wall clock),
    ``cpu_limit``, ``memory_limit`` (a ``MemoryError``), ``output_limit``, ``killed`` (by a
    signal).  Output is decoded as UTF-8 with replacement characters.
    """

    status: str
    returncode: int
    stdout: str
    stderr: str
    duration_s: float
    slot: int

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def _status(returncode: int, stderr: bytes, timed_out: bool, exceeded: bool) -> str:
    if exceeded:
        return "output_limit"
    if timed_out:
        return "timeout"
    if returncode == 0:
        return "ok"
    signum = -returncode if returncode < 0 else returncode - 128 if returncode > 128 else 0
    if signum == signal.SIGXCPU:
        return "cpu_limit"
    if b"MemoryError" in stderr:
        return "memory_limit"
    if signum:
        return "killed"
    return "failed"


class Sandbox:
    """Runs programs isolated and limited, at most ``max_sandboxes`` at once on the host.

    Args:
        isolation: ``'auto'`` (bubblewrap, else ``unshare``), ``'bwrap'``, ``'unshare'`` or
            ``'none'`` (no namespaces: network and host files reachable).
        limits: the limits of each program (:class:`SandboxLimits`, or a dict of its fields).
        max_sandboxes: programs running at once on this host, across all tasks (default:
            CPU count).
        allow_unisolated: run without network isolation when none is available (or with
            ``isolation='none'``).  Off by default: model-written code is untrusted.
        extra_paths: more host folders a bwrap sandbox sees, read-only (an interpreter
            installed outside ``/usr``).
        uid_base: first user id of sandboxed programs when orchestra runs as root.
    """

    def __init__(
        self,
        isolation: str = "auto",
        limits: SandboxLimits | Mapping[str, Any] | None = None,
        max_sandboxes: int | None = None,
        allow_unisolated: bool = False,
        extra_paths: Sequence[str] = (),
        uid_base: int = DEFAULT_UID_BASE,
    ) -> None:
        if isolation != "auto" and isolation not in ISOLATIONS:
            raise ValueError(f"isolation must be one of auto, {', '.join(ISOLATIONS)}; got {isolation!r}")
        if isolation == "none" and not allow_unisolated:
            raise ValueError("isolation='none' runs untrusted code with network access and the host's files in "
                             "reach; set allow_unisolated=True to accept that")
        if max_sandboxes is not None and (isinstance(max_sandboxes, bool) or not isinstance(max_sandboxes, int)
                                          or not 1 <= max_sandboxes <= MAX_SLOTS):
            raise ValueError(f"max_sandboxes must be an integer within 1..{MAX_SLOTS}, got {max_sandboxes!r}")
        if not isinstance(uid_base, int) or uid_base < 1000 or uid_base + _OFFSETS * MAX_SLOTS >= 2**32 - 1:
            raise ValueError(f"uid_base must be an integer >= 1000 leaving room for {_OFFSETS * MAX_SLOTS} ids")
        for path in extra_paths:
            if not os.path.isabs(path):
                raise ValueError(f"extra_paths must be absolute folders, got {path!r}")
        self.isolation = isolation
        self.limits = limits if isinstance(limits, SandboxLimits) else SandboxLimits(**dict(limits or {}))
        self.max_sandboxes = max_sandboxes
        self.allow_unisolated = allow_unisolated
        self.extra_paths = tuple(extra_paths)
        self.uid_base = uid_base
        self.running = 0
        self.started = 0
        self._method: Isolation | None = None
        self._slots: HostSlots | ProcessSlots | None = None
        self._swept: set[int] = set()  # slots whose user was cleared before this object's first use

    # -- which isolation ------------------------------------------------------------------
    def _slot_scope(self) -> HostSlots | ProcessSlots:
        if self._slots is None:
            self._slots = subprocess_slots(self.max_sandboxes)
        return self._slots

    @property
    def limit(self) -> int:
        """Sandboxes at once on this host (the host-wide scope's size)."""
        return self._slot_scope().limit

    @property
    def method(self) -> Isolation:
        """The isolation in force (after :meth:`start`)."""
        if self._method is None:
            raise RuntimeError("Sandbox.start() was not awaited")
        return self._method

    async def _probe(self, method: Isolation) -> str | None:
        missing = method.missing()
        if missing is not None:
            return missing
        if method.name not in _PROBED:  # a trial run, once per process
            reason = None
            self._method = method
            try:
                result = await self.run({}, ["/bin/sh", "-c", "exit 0"])
                if not result.ok:
                    reason = (f"isolation {method.name!r} does not work here: a trivial program ended "
                              f"{result.status} ({result.stderr.strip()[:200]})")
            except SandboxError as exc:
                reason = f"isolation {method.name!r} does not work here: {exc}"
            finally:
                self._method = None
            _PROBED[method.name] = reason
        return _PROBED[method.name]

    async def start(self) -> Isolation:
        """Choose the isolation (trying it with a trivial program, once per process) or raise
        :class:`IsolationUnavailable` with one line that says why."""
        if self._method is not None:
            return self._method
        names = AUTO_ORDER if self.isolation == "auto" else (self.isolation,)
        reasons = []
        for name in names:
            reason = await self._probe(ISOLATIONS[name])
            if reason is None:
                self._method = ISOLATIONS[name]
                return self._method
            reasons.append(reason)
        if self.isolation == "auto" and self.allow_unisolated:
            self._method = ISOLATIONS["none"]
            return self._method
        hint = "" if self.isolation == "none" else (
            "; install bubblewrap (apt-get install bubblewrap), run as root for 'unshare', or set "
            "allow_unisolated=True with isolation='none' to run without network isolation")
        raise IsolationUnavailable("; ".join(reasons) + hint)

    def describe(self) -> dict[str, Any]:
        """What is in force: for the run log and the events."""
        method = self.method
        scope = self._slot_scope()
        return {
            "isolation": method.name,
            "network_isolated": method.isolates_network,
            "guarantees": method.describe(self.limits),
            "user": "one uid per slot" if os.geteuid() == 0 else f"uid {os.geteuid()} (not root)",
            "max_sandboxes": scope.limit,
            "limits": self.limits.as_dict(),
        }

    # -- one run --------------------------------------------------------------------------
    def _uid(self, scope: HostSlots | ProcessSlots, slot: int) -> int | None:
        if os.geteuid() != 0:
            return None
        where = getattr(scope, "dir", scope.name)
        return self.uid_base + (zlib.crc32(where.encode()) % _OFFSETS) * MAX_SLOTS + slot

    def _nproc(self, uid: int | None) -> int:
        if uid is not None:
            return self.limits.max_processes
        # Not root: RLIMIT_NPROC counts every task of our own user, so leave room for those.
        return count_tasks(os.getuid()) + self.limits.max_processes

    def _prepare(self, slot_dir: str, files: Mapping[str, str], uid: int | None, method: Isolation) -> None:
        remove_tree(slot_dir)
        os.mkdir(slot_dir, 0o711)
        src, work = os.path.join(slot_dir, "src"), os.path.join(slot_dir, "work")
        os.mkdir(src, 0o755)
        os.mkdir(work, 0o700)
        for name, text in files.items():
            for folder in (src, work) if method.name == "none" else (src,):
                path = os.path.join(folder, name)
                with open(path, "w", encoding="utf-8") as f:
                    f.write(text)
                os.chmod(path, 0o444)
        if uid is not None:
            os.chown(work, uid, uid)

    async def run(self, files: Mapping[str, str], argv: Sequence[str],
                  env: Mapping[str, str] | None = None, stdin: bytes = b"") -> SandboxResult:
        """Run ``argv`` (``argv[0]`` absolute; relative paths are in the work folder, which
        holds ``files``) in a sandbox; raises :class:`SandboxError` if the sandbox itself failed.

        ``stdin`` (at most :data:`MAX_STDIN_BYTES`) is what the program reads on its standard
        input before the end of it; it is in no file, argument or variable of the sandbox.
        """
        method = self.method
        if len(stdin) > MAX_STDIN_BYTES:
            raise ValueError(f"stdin holds at most {MAX_STDIN_BYTES} bytes, got {len(stdin)}")
        for name in files:
            if not name or not set(name) <= _FILE_NAME_CHARS or name.startswith("."):
                raise ValueError(f"sandbox file names are plain names of letters, digits and ._-; got {name!r}")
        if not argv or not os.path.isabs(argv[0]):
            raise ValueError(f"argv[0] must be an absolute path, got {list(argv)[:1]}")
        scope = self._slot_scope()
        slot = await scope.acquire()
        boxes = boxes_dir(getattr(scope, "dir", scope.name))
        slot_dir = os.path.join(boxes, f"box-{slot}")
        self.running += 1
        try:
            _make_open_dirs(boxes)
            uid = self._uid(scope, slot)
            self._prepare(slot_dir, files, uid, method)
            work = method.work_dir(slot_dir)
            job = SandboxProgram(
                slot_dir=slot_dir,
                uid=uid,
                argv=tuple(argv),
                env={"PATH": "/usr/bin:/bin", "HOME": work, "TMPDIR": work, "LANG": "C.UTF-8",
                     "PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1", **(env or {})},
                limits=self.limits,
                files=tuple(files),
                nproc=self._nproc(uid),
                extra_paths=self.extra_paths,
                nonce=secrets.token_hex(8),
            )
            if uid is not None and method.name == "none" and slot not in self._swept:
                method.after_exit(job)  # leftovers of a run that was killed with its task
                self._swept.add(slot)
            cmd = method.command(job)
            self.started += 1
            ours, theirs = socket.socketpair()
            try:
                ours.sendall(stdin)  # fits the socket's buffer (MAX_STDIN_BYTES)
                ours.shutdown(socket.SHUT_WR)
                try:
                    res = await run_process(cmd.argv, env=cmd.env, cwd=cmd.cwd, timeout_s=self.limits.timeout_s,
                                            max_output_bytes=self.limits.max_output_bytes,
                                            after_exit=lambda: method.after_exit(job), stdin_fd=theirs.fileno())
                finally:
                    theirs.close()
                started = _started(ours)
            finally:
                ours.close()
            problem = None if res.timed_out or res.output_exceeded else method.setup_error(
                job, started, res.returncode, res.stderr)
            if problem is not None:
                raise SandboxError(f"sandbox ({method.name}) did not start the program: {problem}")
            return SandboxResult(
                status=_status(res.returncode, res.stderr, res.timed_out, res.output_exceeded),
                returncode=res.returncode,
                stdout=res.stdout.decode("utf-8", "replace"),
                stderr=res.stderr.decode("utf-8", "replace"),
                duration_s=res.duration_s,
                slot=slot,
            )
        finally:
            self.running -= 1
            remove_tree(slot_dir)
            scope.release(slot)

    def snapshot(self) -> dict[str, Any]:
        """Live counters for progress events."""
        scope = self._slot_scope()
        return {"sandboxes_running": self.running, "sandboxes_started": self.started,
                "max_sandboxes": scope.limit}


def _started(sock: socket.socket) -> bool:
    """Whether the wrapper wrote the start byte (the program may have written more after it)."""
    try:
        return sock.recv(1, socket.MSG_DONTWAIT) == b"s"
    except (BlockingIOError, OSError):
        return False


def count_tasks(uid: int) -> int:
    """Tasks (processes and threads) of ``uid`` now, as ``RLIMIT_NPROC`` counts them."""
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.stat(f"/proc/{entry}").st_uid == uid:
                total += len(os.listdir(f"/proc/{entry}/task"))
        except OSError:
            continue
    return total
