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

The file is an :class:`orchestra.journal.Journal` (append and fsync, fold, tail, the words of
:data:`STATES` and their phases).
"""

from __future__ import annotations

import json
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from orchestra.errors import ModelError
from orchestra.journal import Journal, Phase

#: the ledger's words and their phase in :mod:`orchestra.journal` (what a run folder of any version holds)
STATES: dict[str, Phase] = {
    "submitting": "intent", "created": "started", "cancel_sent": "stop_sent", "cancel_unconfirmed": "stop_sent",
    "cancelled": "ended", "ended": "ended", "not_created": "failed"}

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
    nonces: list[str] = field(default_factory=list)  # the spool entries it took (spool.py)
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


class BatchLedger(Journal):
    """Append-only batch records of one model in one run folder (thread-safe)."""

    def __init__(self, path: str) -> None:
        super().__init__(path, "key", STATES)

    def record(self, state: str, key: str, **fields: Any) -> None:
        """Append ``{ts, state, key, ...}``; durable (fsynced) when this returns."""
        self.append(state, key, **fields)

    def load(self) -> dict[str, BatchRecord]:
        """One record per batch key, every line folded in order.  A line that is not JSON (torn
        by a crash) is skipped; one that is JSON of the wrong shape (a hand edit) stops with an
        error naming the file, the line and what to do: guessing could pay for a batch twice."""
        out: dict[str, BatchRecord] = {}
        for key, line in self.fold(self._check).items():
            rec = out[key] = BatchRecord(key=key, state=line.get("state", ""), ts=float(line["ts"]))
            for name in ("task_id", "file_id", "batch_id", "status", "owner"):
                if line.get(name):
                    setattr(rec, name, line[name])
            rec.custom_ids = list(line.get("custom_ids", ()))
            rec.nonces = list(line.get("nonces", ()))
        return out

    def _check(self, n: int, line: Any) -> None:
        """Stop at line ``n`` of the ledger when it is not what :meth:`record` writes."""
        why = _wrong(line)
        if why:
            raise ModelError(f"batch ledger {self.path}, line {n}: {why}; this file records the batches "
                             "paid for: fix or delete that line (deleting it may send its batch's "
                             "requests again), then run again with -r")

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
