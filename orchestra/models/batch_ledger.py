"""The run folder's record of every provider batch: ``<run>/batches/<model>.jsonl``.

A line is appended and fsynced *before* the step it must survive: ``submitting`` (the batch's
local key, the task, the uploaded file and every ``custom_id`` it carries) before the create
call, ``created`` with the provider's batch id as soon as it is known, ``cancel_sent`` before a
cancel, then ``ended`` (the final status) or ``cancelled``.  The same key is set in the batch's
metadata, so a batch whose ``created`` line a SIGKILL cut off is found by listing the
provider's batches (:meth:`BatchLedger.recover`) and adopted.

A later task on the same run folder (``-r``) folds the lines into one record per key
(:meth:`BatchLedger.load`) and, for each request it needs, looks for a batch that already holds
it: a request in an existing batch is never submitted again.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from orchestra.fileio import append_line, read_jsonl

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
        """One record per batch key, every line folded in order (a torn last line is skipped)."""
        out: dict[str, BatchRecord] = {}
        if not os.path.exists(self.path):
            return out
        for line in read_jsonl(self.path):
            if not isinstance(line, dict) or "key" not in line:
                continue
            rec = out.setdefault(str(line["key"]), BatchRecord(key=str(line["key"])))
            rec.state = str(line.get("state", rec.state))
            rec.ts = float(line.get("ts", rec.ts))
            for name in ("task_id", "file_id", "batch_id", "status", "owner"):
                if line.get(name):
                    setattr(rec, name, str(line[name]))
            if isinstance(line.get("custom_ids"), list):
                rec.custom_ids = [str(c) for c in line["custom_ids"]]
            if isinstance(line.get("nonces"), list):
                rec.nonces = [str(c) for c in line["nonces"]]
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
                      find: Callable[[set[str], float], Awaitable[dict[str, dict[str, Any]]]],
                      busy: Callable[[BatchRecord], bool] = lambda rec: False) -> dict[str, BatchRecord]:
        """:meth:`load`, after settling this task's batches whose create call was sent but whose
        id was never recorded (``task_id=None``: of every task; only safe while no create call of
        another process can be out, i.e. under the spool's ``lead.lock``): ``find(keys, since)``
        looks them up by their metadata key (the provider's list); found ones are recorded
        ``created``, the others ``not_created``.  ``busy(record)``: its creator still lives (it settles
        its own create call)."""
        records = self.load()
        orphans = [r for r in records.values()
                   if task_id in (None, r.task_id) and r.state == "submitting" and not busy(r)]
        if orphans:
            found = await find({r.key for r in orphans}, min(r.ts for r in orphans) - 3600)
            for rec in orphans:
                batch = found.get(rec.key)
                if batch is None:
                    self.record("not_created", rec.key)
                    rec.state = "not_created"
                else:
                    self.record("created", rec.key, batch_id=batch["id"], adopted_by_metadata=True)
                    rec.state, rec.batch_id = "created", str(batch["id"])
        return records
