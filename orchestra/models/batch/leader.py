"""The spool's leader: whichever task of a model holds the spool's ``lead.lock``
(:mod:`.spool`) creates the batches of every task of that model on this host.

One round (:meth:`Leader.round`): settle the batches whose creator died mid-create (looked up on
the provider's list), gather every live owner's spooled entries, cut them into batches and
create those due (full ones at once, the last after ``flush_s``).  Each create is recorded
before and after (:meth:`Leader.create`): ``submitting`` with the spool entries it consumes, then
``created`` with the provider's id, or ``not_created``.  Only the holder of ``lead.lock``
creates batches, so a ``submitting`` line without an outcome whose creator is dead is an orphan
to look up, never a create still on its way.  The tasks learn from the ledger which batch took
their requests (:meth:`~.feed.Feed.follow`).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

from orchestra.errors import ModelError
from orchestra.models.batch.ledger import BatchLedger, BatchRecord, found_fields
from orchestra.models.batch.options import BatchOptions
from orchestra.models.batch.provider import BatchProvider
from orchestra.models.batch.spool import BatchSpool, cut


class Leader:
    """The leader's rounds for the task ``task_id`` of run ``run_id``, when it holds ``lead.lock``.

    Args:
        busy: whether a ``submitting`` record is not this leader's to settle (its creator may
            still have its create call out).
        creating: key -> the record of each create call still out (shared with the batcher,
            which settles them when it stops mid-create).
    """

    def __init__(self, options: BatchOptions, provider: BatchProvider, ledger: BatchLedger, spool: BatchSpool,
                 run_id: str, task_id: str, model_name: str, emit: Callable[..., None],
                 busy: Callable[[BatchRecord], bool], creating: dict[str, BatchRecord]) -> None:
        self.options = options
        self.provider = provider
        self.ledger = ledger
        self.spool = spool
        self.run_id, self.task_id, self.model_name = run_id, task_id, model_name
        self._emit = emit
        self._busy = busy
        self.creating = creating

    async def round(self) -> None:
        """One round as leader: settle dead creators' batches, cut every live owner's entries
        into batches and create those due (full ones at once, the last after ``flush_s``)."""
        try:
            records = await self.ledger.recover(None, self.provider.find, self._busy)
        except ModelError as exc:  # the provider's list failed (after retries): next round tries again
            self._emit("batch_lookup_failed", error=str(exc))
            return
        consumed = {n for r in records.values() for n in r.nonces}
        entries = self.spool.gather(consumed)
        for chunk in cut(entries, self.options.size, self.options.max_bytes, self.provider.line,
                         self.options.flush_s, time.time()):
            await self.create(chunk)

    async def create(self, chunk: list[dict[str, Any]]) -> None:
        """Create one batch of ``chunk`` (spool entries of any owner), recorded before and after."""
        key = uuid.uuid4().hex[:16]
        cids = [e["cid"] for e in chunk]
        nonces = [n for e in chunk for n in (e["nonce"], *e.get("dup_nonces", ()))]
        content = b"".join(self.provider.line(e["cid"], e["path"], e["body"]) for e in chunk)
        try:
            handle = await self.provider.prepare(key, content)
        except ModelError as exc:  # nothing exists yet: the owners requeue their rows
            self.ledger.record("not_created", key, custom_ids=cids, nonces=nonces, error=str(exc))
            return
        sent = BatchRecord(key, self.task_id, cids, handle, ts=time.time())
        self.ledger.record("submitting", key, task_id=self.task_id, owner=self.spool.owner, file_id=handle,
                           custom_ids=cids, nonces=nonces)
        self.creating[key] = sent
        meta = {"orchestra_run": self.run_id, "orchestra_task": self.task_id, "orchestra_key": key,
                "orchestra_model": self.model_name[:512]}
        found: dict[str, bool] = {}  # how a batch whose create answer was lost was found again
        try:
            batch = await self.provider.create_batch(handle, chunk[0]["path"], content, meta)
            if not isinstance(batch.get("id"), str) or not batch["id"]:
                raise ModelError("the create call was answered without a batch id")
        except ModelError as exc:
            # A create that failed in flight (its answer lost: a client timeout) may still have
            # made the batch: look for it before its rows are sent again.
            try:
                taken = {r.batch_id for r in self.ledger.load().values() if r.batch_id}
                batch = (await self.provider.find([sent], taken)).get(key) or {}
            except ModelError:
                batch = {}
            if not batch:
                self.creating.pop(key, None)
                self.ledger.record("not_created", key, error=str(exc))
                return
            found = found_fields(batch)
        self.creating.pop(key, None)
        self.ledger.record("created", key, batch_id=batch["id"], **found)
        self._emit("batch_submitted", batch_id=batch["id"], key=key, requests=len(cids), bytes=len(content),
                   tasks=sorted({str(e.get("task", "")) for e in chunk}))
