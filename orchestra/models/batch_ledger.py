"""The run folder's record of every provider batch: ``<run>/batches/<model>.jsonl``.

A line is appended and fsynced *before* the step it must survive: ``submitting`` (the batch's
local key, the task, the uploaded file and every ``custom_id`` it carries) before the create
call, ``created`` with the provider's batch id as soon as it is known, ``cancel_sent`` before a
cancel, then ``ended`` (the final status) or ``cancelled``.  The same key is set in the batch's
metadata, so a batch whose ``created`` line a SIGKILL cut off is found by listing the
provider's batches (:meth:`BatchLedger.recover`) and adopted (a message batch, which has no
metadata, by its size and creation time).

A later task on the same run folder (``-r``) folds the lines into one record per key
(:meth:`BatchLedger.load`) and, for each request it needs, looks for a batch that already holds
it: a request in an existing batch is never submitted again.
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from orchestra.errors import ModelError
from orchestra.fileio import append_line

#: statuses after which a batch changes no more (OpenAI's four; Anthropic's batches just "end")
FINAL = frozenset({"completed", "expired", "cancelled", "failed", "ended"})


@dataclass
class BatchRecord:
    """What the ledger says about one batch."""

    key: str
    task_id: str = ""
    custom_ids: list[str] = field(default_factory=list)
    file_id: str = ""
    batch_id: str = ""
    state: str = ""  # submitting | created | cancel_sent | cancelled | ended | not_created
    status: str = ""  # the provider's last status seen
    ts: float = 0.0
    nonces: list[str] = field(default_factory=list)  # the spool entries it took (batch_spool.py)
    owner: str = ""  # the spool owner (process) that created it


def _finite(number: int | float) -> bool:
    """Whether a number is finite as a float (JSON's integers may be too large to be one)."""
    try:
        return math.isfinite(number)
    except OverflowError:
        return False


def _wrong(line: Any) -> str:
    """What is wrong with one parsed ledger line ("" when it is what :meth:`BatchLedger.record` writes)."""
    if not isinstance(line, dict):
        return f"not a JSON object: {json.dumps(line)[:80]}"
    if not isinstance(line.get("key"), str) or not line["key"]:
        return f"'key' must be a non-empty string, got {line.get('key')!r:.80}"
    ts = line.get("ts")
    if not isinstance(ts, (int, float)) or isinstance(ts, bool) or not _finite(ts):
        return f"'ts' must be a number (seconds since the epoch), got {ts!r:.80}"
    for name in ("state", "task_id", "file_id", "batch_id", "status", "owner"):
        if name in line and not isinstance(line[name], str):
            return f"{name!r} must be a string, got {line[name]!r:.80}"
    for name in ("custom_ids", "nonces"):
        if name in line and not (isinstance(line[name], list) and all(isinstance(c, str) for c in line[name])):
            return f"{name!r} must be a list of strings, got {json.dumps(line[name])[:80]}"
    return ""


def found_fields(batch: dict[str, Any]) -> dict[str, bool]:
    """The ledger field saying how a batch whose id was never recorded was found again."""
    return {"adopted_by_listing": True} if batch.get("found_by") == "listing" else {"adopted_by_metadata": True}


class BatchLedger:
    """Append-only batch records of one model in one run folder (thread-safe)."""

    def __init__(self, path: str) -> None:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        self.path = path
        self._lock = threading.Lock()

    def record(self, state: str, key: str, **fields: Any) -> None:
        """Append ``{ts, state, key, ...}``; durable (fsynced) when this returns."""
        line = json.dumps({"ts": round(time.time(), 3), "state": state, "key": key, **fields},
                          ensure_ascii=False) + "\n"
        with self._lock:
            append_line(self.path, line.encode("utf-8"))
            fd = os.open(self.path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def load(self) -> dict[str, BatchRecord]:
        """One record per batch key, every line folded in order.  A line that is not JSON (torn
        by a crash) is skipped; one that is JSON of the wrong shape (a hand edit) stops with an
        error naming the file, the line and what to do: guessing could pay for a batch twice."""
        out: dict[str, BatchRecord] = {}
        if not os.path.exists(self.path):
            return out
        with open(self.path, "rb") as f:
            for n, raw in enumerate(f, 1):
                try:
                    line = json.loads(raw) if raw.strip() else None
                except (ValueError, RecursionError):
                    continue  # a torn line (see fileio.append_line)
                if line is None:
                    continue
                why = _wrong(line)
                if why:
                    raise ModelError(f"batch ledger {self.path}, line {n}: {why}; this file records the batches "
                                     "paid for: fix or delete that line (deleting it may send its batch's "
                                     "requests again), then run again with -r")
                rec = out.setdefault(line["key"], BatchRecord(key=line["key"]))
                rec.state = line.get("state", rec.state)
                rec.ts = float(line["ts"])
                for name in ("task_id", "file_id", "batch_id", "status", "owner"):
                    if line.get(name):
                        setattr(rec, name, line[name])
                if "custom_ids" in line:
                    rec.custom_ids = list(line["custom_ids"])
                if "nonces" in line:
                    rec.nonces = list(line["nonces"])
        return out

    def tail(self, offset: int) -> tuple[list[dict[str, Any]], int]:
        """The whole lines appended since byte ``offset`` (another process's too) and the offset
        after them; a line still being written is left for the next call."""
        try:
            with open(self.path, "rb") as f:
                f.seek(offset)
                blob = f.read()
        except FileNotFoundError:
            return [], offset
        end = blob.rfind(b"\n") + 1
        out: list[dict[str, Any]] = []
        for raw in blob[:end].splitlines():
            try:
                line = json.loads(raw)
            except ValueError:
                continue  # a torn line (see fileio.append_line)
            if isinstance(line, dict) and "key" in line:
                out.append(line)
        return out, offset + end

    async def recover(self, task_id: str | None,
                      find: Callable[[list[BatchRecord], set[str]], Awaitable[dict[str, dict[str, Any]]]],
                      busy: Callable[[BatchRecord], bool] = lambda rec: False) -> dict[str, BatchRecord]:
        """:meth:`load`, after settling this task's batches whose create call was sent but whose
        id was never recorded (``task_id=None``: of every task; only safe while no create call of
        another process can be out, i.e. under the spool's ``lead.lock``): ``find(records, taken)``
        looks them up on the provider's list (by metadata key, or by what a message batch shows;
        ``taken``: the batch ids other records hold); found ones are recorded ``created``, the
        others ``not_created``.  ``busy(record)``: its creator still lives (it settles its own
        create call)."""
        records = self.load()
        orphans = [r for r in records.values()
                   if task_id in (None, r.task_id) and r.state == "submitting" and not busy(r)]
        if orphans:
            found = await find(orphans, {r.batch_id for r in records.values() if r.batch_id})
            for rec in orphans:
                batch = found.get(rec.key)
                if batch is None:
                    self.record("not_created", rec.key)
                    rec.state = "not_created"
                else:
                    self.record("created", rec.key, batch_id=batch["id"], **found_fields(batch))
                    rec.state, rec.batch_id = "created", str(batch["id"])
        return records
