"""Shared batches: the requests of every task of one model in one run folder, on one host, go
into the same batches (``<run>/batches/<model>.spool/<host>/``).

Each task (an *owner*) writes the requests it wants batched as small JSON files into the spool,
one *entry* per request with a fresh ``nonce``.  Whichever owner holds ``lead.lock`` (a
``flock``: the kernel releases it when its holder dies, so a dead leader is replaced by the
next owner that tries) gathers the entries of all owners, cuts them into batches and creates
them; the ledger's ``submitting`` line of a batch lists the nonces it consumed, before the
create call.  An entry whose nonce is in the ledger is never taken again, so a leader that dies
between recording a batch and deleting the spool files it used duplicates nothing.  Every
owner follows the ledger (:meth:`~orchestra.models.batch.ledger.BatchLedger.tail`): it learns
there which batch holds its requests, polls that batch and checkpoints its own samples.

An owner holds an exclusive ``flock`` on ``<owner>.owner`` while it lives (made under another
name, locked, then renamed into place, so that no leader ever sees it unlocked); the entries of
an owner whose lock is free (it died: SIGKILL, ``-r`` later) are deleted unread: its next
incarnation asks again after reading the ledger, so nothing is sent for a process that is gone.
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import socket
import sys
import time
import uuid
from typing import Any

from orchestra.paths import safe_name


def _try_lock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


class BatchSpool:
    """One owner's side of a model's spool folder (see the module docstring)."""

    def __init__(self, folder: str, task_id: str) -> None:
        self.host = safe_name(socket.gethostname())[:64]
        self.folder = os.path.join(folder, self.host)  # one spool per host: flock and pids are local
        self.owner = f"{self.host}~{safe_name(task_id)[:80]}.{os.getpid()}.{uuid.uuid4().hex[:8]}"
        self._owner_fd = -1
        self._lead_fd = -1
        self._seq = 0
        self._warned: set[str] = set()  # malformed spool files already named in a warning

    def open(self) -> None:
        """Join the spool: the owner's lock, held until :meth:`close` (or death)."""
        os.makedirs(self.folder, exist_ok=True)
        tmp = os.path.join(self.folder, f".{self.owner}.tmp")
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.rename(tmp, os.path.join(self.folder, f"{self.owner}.owner"))
        self._owner_fd = fd

    def close(self) -> None:
        """Leave the spool: this owner's waiting entries are withdrawn, its locks released."""
        self.unlead()
        if self._owner_fd < 0:
            return
        for name in os.listdir(self.folder):
            if name.startswith(self.owner + "."):
                _unlink(os.path.join(self.folder, name))
        os.close(self._owner_fd)
        self._owner_fd = -1

    def put(self, entries: list[dict[str, Any]]) -> None:
        """Spool ``entries`` (``{cid, path, body, nonce}``), stamped with the time they came."""
        self._seq += 1
        final = os.path.join(self.folder, f"{self.owner}.{self._seq:08d}.json")
        data = json.dumps({"ts": time.time(), "entries": entries}, ensure_ascii=False).encode("utf-8")
        tmp = final + ".tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
        os.rename(tmp, final)

    # -- the leader -------------------------------------------------------------------------------
    def try_lead(self) -> bool:
        """Take ``lead.lock`` if no other owner holds it (never waits)."""
        if self._lead_fd >= 0:
            return True
        fd = os.open(os.path.join(self.folder, "lead.lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW,
                     0o600)
        if _try_lock(fd):
            self._lead_fd = fd
            return True
        os.close(fd)
        return False

    def unlead(self) -> None:
        if self._lead_fd >= 0:
            os.close(self._lead_fd)  # closing the only descriptor releases the flock
            self._lead_fd = -1

    def gather(self, consumed: set[str]) -> list[dict[str, Any]]:
        """(Leader only.) The entries of live owners not yet in a batch, oldest first, each with
        its spool time ``ts``; files of dead owners and files wholly consumed are deleted."""
        assert self._lead_fd >= 0, "gather needs lead.lock"
        names = sorted(n for n in os.listdir(self.folder) if not n.startswith(".") and n != "lead.lock")
        owners = {n[:-len(".owner")] for n in names if n.endswith(".owner")}
        alive = {o for o in owners if self.alive(o)}
        out: list[dict[str, Any]] = []
        for name in names:
            if not name.endswith(".json"):
                continue
            path = os.path.join(self.folder, name)
            if name.rsplit(".", 2)[0] not in alive:
                _unlink(path)  # its owner is gone (and its owner file with it)
                continue
            try:
                with open(path, "rb") as f:
                    raw = f.read()
            except OSError:
                continue  # withdrawn meanwhile
            ts, entries, why = _parse(raw)
            if why:  # not what put() writes: skipped (its owner's death removes it), never fatal
                if name not in self._warned:
                    self._warned.add(name)
                    print(f"orchestra: warning: spool file {path} skipped: {why}", file=sys.stderr)
                continue
            left = [e for e in entries if e["nonce"] not in consumed]
            if not left:
                _unlink(path)
            out.extend({**{k: e[k] for k in _KEEP if k in e}, "ts": ts} for e in left)
        return out

    def here(self, owner: str) -> bool:
        """Whether ``owner`` (as a ledger line names it) ran on this host."""
        return owner.split("~")[0] == self.host and "~" in owner

    def alive(self, owner: str) -> bool:
        """Whether spool owner ``owner`` of this host (this one included) still lives."""
        return owner == self.owner or (bool(owner) and not self._reap(owner))

    def _reap(self, owner: str) -> bool:
        """True (and its owner file deleted) if ``owner``'s process is gone: its lock is free."""
        path = os.path.join(self.folder, f"{owner}.owner")
        try:
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
        except OSError:
            return True
        try:
            if not _try_lock(fd):
                return False
            _unlink(path)
            return True
        finally:
            os.close(fd)


def cut(entries: list[dict[str, Any]], size: int, max_bytes: int, line_of: Any, flush_s: float,
        now: float) -> list[list[dict[str, Any]]]:
    """Batches to create now from ``entries`` (each one endpoint, at most ``size`` rows and
    ``max_bytes`` bytes): every full batch, and the last one if its oldest entry waited ``flush_s``."""
    first: dict[str, dict[str, Any]] = {}
    by_path: dict[str, list[dict[str, Any]]] = {}
    for e in entries:
        if e["cid"] in first:  # one row; the duplicate entry is consumed with it
            first[e["cid"]].setdefault("dup_nonces", []).append(e["nonce"])
            continue
        first[e["cid"]] = e
        by_path.setdefault(e["path"], []).append(e)
    out: list[list[dict[str, Any]]] = []
    for group in by_path.values():
        chunk: list[dict[str, Any]] = []
        nbytes = 0
        for e in group:
            n = len(line_of(e["cid"], e["path"], e["body"]))
            if chunk and (len(chunk) >= size or nbytes + n > max_bytes):
                out.append(chunk)
                chunk, nbytes = [], 0
            chunk.append(e)
            nbytes += n
        if chunk and (len(chunk) >= size or now - min(e["ts"] for e in chunk) >= flush_s):
            out.append(chunk)
    return out


def _parse(raw: bytes) -> tuple[float, list[dict[str, Any]], str]:
    """A spool file's ``(ts, entries, "")`` as :meth:`BatchSpool.put` writes it, or ``(0, [], why)``
    naming what is wrong with it (any local process can write into the spool folder)."""
    try:
        blob = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        return 0.0, [], f"not JSON ({type(exc).__name__})"
    if not isinstance(blob, dict):
        return 0.0, [], f"a JSON {type(blob).__name__}, not an object"
    ts, entries = blob.get("ts"), blob.get("entries")
    if isinstance(ts, bool) or not isinstance(ts, (int, float)) or not math.isfinite(ts):
        return 0.0, [], f"'ts' is {ts!r:.40}, not a finite number"
    if not isinstance(entries, list):
        return 0.0, [], f"'entries' is {type(entries).__name__}, not a list"
    for i, e in enumerate(entries):
        if not isinstance(e, dict):
            return 0.0, [], f"entry {i} is a JSON {type(e).__name__}, not an object"
        for key, kind in _ENTRY.items():
            if not isinstance(e.get(key), kind):
                return 0.0, [], f"entry {i}: {key!r} is missing or not a {kind.__name__}"
    return float(ts), entries, ""


#: what every spool entry carries, and its type
_ENTRY: dict[str, type] = {"cid": str, "path": str, "body": dict, "nonce": str}
#: the keys of an entry the leader passes on (others, e.g. a planted ``dup_nonces``, are dropped)
_KEEP = (*_ENTRY, "task")


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
