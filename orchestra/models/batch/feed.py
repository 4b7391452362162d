"""How one task's requests get into batches (:class:`Feed`): through the model's spool
(:mod:`.spool`), shared by every task of the model in the run folder on this host.

A task queues its requests for a moment, writes them into the spool, and then, on every tick
while some of its requests are in no batch yet, (1) reads the ledger's new lines to learn which
batch took which of its requests (``submitting``, then ``created`` or ``not_created``) and (2)
tries to become the leader, which creates the batches of every task (:mod:`.leader`).  A
request whose batch could not be created goes into a later one (:meth:`~.rows.Waiting.retry_or_fail`);
one whose batch was created is handed to the batcher, which polls it (``took``).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable

from orchestra.models.batch.leader import Leader
from orchestra.models.batch.ledger import BatchLedger
from orchestra.models.batch.rows import Waiting
from orchestra.models.batch.spool import BatchSpool


class Feed:
    """Task ``task_id``'s side of the spool.

    Args:
        size: ``batch.size``: a full queue is spooled at once.
        flush_s: ``batch.flush_s``: how long requests gather (the tick is at most 0.25 s).
        took: called with ``(key, batch_id, custom_ids)`` when a created batch holds some of
            this task's requests.
        crashed: the done callback of the background loop (a bug there fails every request).
    """

    def __init__(self, size: int, flush_s: float, ledger: BatchLedger, spool: BatchSpool, leader: Leader,
                 waiting: Waiting, task_id: str, took: Callable[[str, str, list[str]], None],
                 crashed: Callable[[asyncio.Task[None]], None]) -> None:
        self.size, self.flush_s = size, flush_s
        self.ledger, self.spool, self.leader = ledger, spool, leader
        self.waiting = waiting
        self.task_id = task_id
        self._took = took
        self._crashed = crashed
        self.offset = 0  # how far this task has read the ledger
        self._queue: list[str] = []
        self._pending: dict[str, list[str]] = {}  # batch key -> this task's custom_ids it takes (not created yet)
        self._full: asyncio.Event | None = None  # made in the loop that uses it
        self._flusher: asyncio.Task[None] | None = None

    def enqueue(self, cid: str) -> None:
        """Queue request ``cid`` for the spool (at once when ``size`` of them wait)."""
        self._queue.append(cid)
        if self._full is None:
            self._full = asyncio.Event()
        if len(self._queue) >= self.size:
            self._full.set()
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.get_running_loop().create_task(self._flush_loop())
            self._flusher.add_done_callback(self._crashed)

    def stop(self) -> None:
        """Stop the loop (the batcher stops; what it spooled is withdrawn with the spool)."""
        if self._flusher is not None and not self._flusher.done():
            self._flusher.cancel()
        self._flusher = None

    def drop(self) -> None:
        """Forget the requests still queued (the batcher has failed them)."""
        self._queue.clear()

    def _unbatched(self) -> bool:
        """Whether some request of this task is in no batch yet (queued, or in the spool)."""
        return bool(self._queue) or any(r.nonce for r in self.waiting.reqs.values())

    async def _flush_loop(self) -> None:
        assert self._full is not None
        tick = max(0.05, min(0.25, self.flush_s))
        while self._unbatched():
            if len(self._queue) < self.size:
                try:
                    await asyncio.wait_for(self._full.wait(), tick)
                except asyncio.TimeoutError:
                    pass
            self._full.clear()
            self._spool_queue()
            self.follow()
            if self.spool.try_lead():
                await self.leader.round()
                self.spool.unlead()  # not on cancellation: aclose settles a create first
                self.follow()

    def _spool_queue(self) -> None:
        entries = []
        for cid in self._queue:
            req = self.waiting.reqs.get(cid)
            if req is None or req.nonce or req.key:
                continue
            req.nonce = uuid.uuid4().hex[:12]
            entries.append({"cid": cid, "path": req.path, "body": req.body, "nonce": req.nonce,
                            "task": self.task_id})
        self._queue = []
        if entries:
            self.spool.put(entries)

    def follow(self) -> None:
        """Read the ledger's new lines: which batches took this task's spooled requests."""
        reqs = self.waiting.reqs
        lines, self.offset = self.ledger.tail(self.offset)
        for line in lines:
            key, state = str(line["key"]), line.get("state")
            nonces = set(line.get("nonces") or ())
            mine = [c for c in line.get("custom_ids") or () if c in reqs and reqs[c].nonce in nonces]
            if state == "submitting":
                for cid in mine:
                    reqs[cid].key = key
                self._pending[key] = mine
            elif state == "not_created":
                for cid in mine + self._pending.pop(key, []):
                    req = reqs.get(cid)
                    if req is not None and req.nonce and req.key in ("", key):
                        self.waiting.retry_or_fail(cid, str(line.get("error") or "the batch could not be created"))
            elif state == "created":
                cids = [c for c in self._pending.pop(key, []) if c in reqs and reqs[c].key == key]
                if cids:
                    for cid in cids:
                        reqs[cid].nonce = ""
                    self._took(key, str(line["batch_id"]), cids)
