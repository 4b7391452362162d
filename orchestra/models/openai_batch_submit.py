"""How batch mode's requests get into batches: through the model's spool, shared by every task
of the model in the run folder on this host (:mod:`orchestra.models.batch_spool`).

A task queues its requests for a moment, writes them into the spool, and then, on every tick
while some of its requests wait, (1) reads the ledger's new lines to learn which batch took
which of its requests (``submitting``, then ``created`` or ``not_created``) and (2) tries to
become the leader; the leader settles batches whose creator died mid-create, gathers every
live owner's entries and creates the batches (:meth:`BatchSubmitter._create`).  Only the
holder of ``lead.lock`` creates batches, so a ``submitting`` line without an outcome whose
creator is dead is an orphan to look up by metadata, never a create still on its way.
"""

from __future__ import annotations

import abc
import asyncio
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from orchestra.errors import ModelError
from orchestra.limits.retry import RetryPolicy
from orchestra.models.batch_ledger import BatchLedger, BatchRecord, found_fields
from orchestra.models.batch_rows import BatchOptions
from orchestra.models.batch_spool import BatchSpool, cut
from orchestra.models.openai_batch_http import BatchHTTP


@dataclass
class Req:
    """One request a task waits for."""

    path: str
    body: dict[str, Any]
    futures: list[asyncio.Future[dict[str, Any]]] = field(default_factory=list)
    key: str = ""  # the batch holding it now
    attempts: int = 0
    nonce: str = ""  # its spool entry, while no batch tracks it (in the spool or being created)


@dataclass
class Batch:
    """A batch a task watches (``custom_ids``: its own rows in it)."""

    key: str
    batch_id: str
    custom_ids: list[str]
    status: str = ""
    next_poll: float = 0.0
    polls: int = 0
    failures: int = 0  # polls in a row that failed (bounded by max_retries)
    read_failures: int = 0  # reads of its finished files that failed (a good poll does not reset it)
    t0: float = field(default_factory=time.time)  # when it was created (its window starts)
    unknown: set[str] = field(default_factory=set)  # undocumented statuses it showed (each warned once)


class BatchSubmitter(abc.ABC):
    """The submitting half of :class:`~orchestra.models.openai_batch.OpenAIBatcher`."""

    options: BatchOptions
    http: BatchHTTP
    policy: RetryPolicy
    model_name: str
    ledger: BatchLedger | None
    spool: BatchSpool | None
    run_id: str
    task_id: str
    _emit: Callable[..., None]
    _reqs: dict[str, Req]
    _queue: list[str]
    _known: dict[str, BatchRecord]
    _held_by: dict[str, str]
    _creating: dict[str, BatchRecord]  # key -> what its create call holds, while it is out
    _pending: dict[str, list[str]]  # batch key -> this task's custom_ids it takes (not created yet)
    _offset: int  # how far this task has read the ledger
    _tag: str  # ends every custom_id of this task
    _full: asyncio.Event | None
    _flusher: asyncio.Task[None] | None

    @abc.abstractmethod
    def _track(self, batch: Batch) -> None:
        ...

    @abc.abstractmethod
    def _retry_or_fail(self, cid: str, reason: str) -> None:
        ...

    @abc.abstractmethod
    def _count(self, name: str, delta: int = 1) -> None:
        ...

    @abc.abstractmethod
    def _crashed(self, task: asyncio.Task[None]) -> None:
        ...

    # -- this task's side -----------------------------------------------------------------------
    def _enqueue(self, cid: str) -> None:
        self._queue.append(cid)
        if self._full is None:
            self._full = asyncio.Event()
        if len(self._queue) >= self.options.size:
            self._full.set()
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.get_running_loop().create_task(self._flush_loop())
            self._flusher.add_done_callback(self._crashed)

    def _waiting(self) -> bool:
        return bool(self._queue) or any(r.nonce for r in self._reqs.values())

    async def _flush_loop(self) -> None:
        assert self._full is not None and self.spool is not None
        tick = max(0.05, min(0.25, self.options.flush_s))
        while self._waiting():
            if len(self._queue) < self.options.size:
                try:
                    await asyncio.wait_for(self._full.wait(), tick)
                except asyncio.TimeoutError:
                    pass
            self._full.clear()
            self._spool_queue()
            self._follow()
            if self.spool.try_lead():
                await self._lead()
                self.spool.unlead()  # not on cancellation: aclose settles a create first
                self._follow()

    def _spool_queue(self) -> None:
        assert self.spool is not None
        entries = []
        for cid in self._queue:
            req = self._reqs.get(cid)
            if req is None or req.nonce or req.key:
                continue
            req.nonce = uuid.uuid4().hex[:12]
            entries.append({"cid": cid, "path": req.path, "body": req.body, "nonce": req.nonce,
                            "task": self.task_id})
        self._queue = []
        if entries:
            self.spool.put(entries)

    def _follow(self) -> None:
        """Read the ledger's new lines: which batches took this task's spooled requests."""
        if self.ledger is None:
            return
        lines, self._offset = self.ledger.tail(self._offset)
        for line in lines:
            key, state = str(line["key"]), line.get("state")
            nonces = set(line.get("nonces") or ())
            mine = [c for c in line.get("custom_ids") or () if c in self._reqs and self._reqs[c].nonce in nonces]
            if state == "submitting":
                for cid in mine:
                    self._reqs[cid].key = key
                self._pending[key] = mine
            elif state == "not_created":
                for cid in mine + self._pending.pop(key, []):
                    req = self._reqs.get(cid)
                    if req is not None and req.nonce and req.key in ("", key):
                        self._retry_or_fail(cid, str(line.get("error") or "the batch could not be created"))
            elif state == "created":
                cids = [c for c in self._pending.pop(key, []) if c in self._reqs and self._reqs[c].key == key]
                if cids:
                    self._took(key, str(line["batch_id"]), cids)

    def _took(self, key: str, batch_id: str, cids: list[str]) -> None:
        self._known[key] = BatchRecord(key, self.task_id, cids, "", batch_id, "created")
        for cid in cids:
            self._held_by[cid] = key
            self._reqs[cid].nonce = ""
        self._track(Batch(key, batch_id, cids, "", time.monotonic() + self.options.poll_s))
        self._count("batches_submitted")

    async def _read_ledger(self) -> None:
        """Once per task, before any request is queued: which batches hold which requests.
        Under ``lead.lock`` (no create call is out): batches whose creator died before
        recording the id are looked up by their metadata first."""
        assert self.ledger is not None and self.spool is not None
        mine = f"-t{self._tag}"
        while True:
            while not self.spool.try_lead():
                await asyncio.sleep(0.05)
            try:
                self._known = await self.ledger.recover(None, self.http.find, self._busy)
                self._offset = self.ledger.tail(0)[1]
            finally:
                self.spool.unlead()
            # A create another host's leader may still have out holds rows of this task: wait
            # until it is settled (or too old to be out), or they could be sent twice.
            if not any(r.state == "submitting" and any(c.endswith(mine) for c in r.custom_ids)
                       for r in self._known.values()):
                break
            await asyncio.sleep(1.0)
        for rec in sorted(self._known.values(), key=lambda r: r.ts):
            if rec.batch_id:
                for cid in rec.custom_ids:
                    self._held_by[cid] = rec.key

    def _busy(self, rec: BatchRecord) -> bool:
        """Whether a ``submitting`` line without an outcome is not ours to settle: its creator on
        this host still lives (it settles its own create), or it was made on another host (only
        another task may still be creating it: until its create call cannot be out any more)."""
        assert self.spool is not None
        if self.spool.here(rec.owner):
            return self.spool.alive(rec.owner)
        if rec.task_id == self.task_id:
            return False  # made by this task's earlier run, which is over
        return time.time() - rec.ts < self.policy.attempt_timeout_s + 30  # its create call may be out

    # -- the leader ---------------------------------------------------------------------------------
    async def _lead(self) -> None:
        """One round as leader: settle dead creators' batches, cut every live owner's entries
        into batches and create those due (full ones at once, the last after ``flush_s``)."""
        assert self.ledger is not None and self.spool is not None
        spool = self.spool
        try:
            records = await self.ledger.recover(None, self.http.find, self._busy)
        except ModelError as exc:  # the provider's list failed (after retries): next round tries again
            self._emit("batch_lookup_failed", error=str(exc))
            return
        consumed = {n for r in records.values() for n in r.nonces}
        entries = spool.gather(consumed)
        for chunk in cut(entries, self.options.size, self.options.max_bytes, self.http.line,
                         self.options.flush_s, time.time()):
            await self._create(chunk)

    async def _create(self, chunk: list[dict[str, Any]]) -> None:
        """Create one batch of ``chunk`` (spool entries of any owner), recorded before and after."""
        assert self.ledger is not None and self.spool is not None
        key = uuid.uuid4().hex[:16]
        cids = [e["cid"] for e in chunk]
        nonces = [n for e in chunk for n in (e["nonce"], *e.get("dup_nonces", ()))]
        content = b"".join(self.http.line(e["cid"], e["path"], e["body"]) for e in chunk)
        try:
            handle = await self.http.prepare(key, content)
        except ModelError as exc:  # nothing exists yet: the owners requeue their rows
            self.ledger.record("not_created", key, custom_ids=cids, nonces=nonces, error=str(exc))
            return
        sent = BatchRecord(key, self.task_id, cids, handle, ts=time.time())
        self.ledger.record("submitting", key, task_id=self.task_id, owner=self.spool.owner, file_id=handle,
                           custom_ids=cids, nonces=nonces)
        self._creating[key] = sent
        meta = {"orchestra_run": self.run_id, "orchestra_task": self.task_id, "orchestra_key": key,
                "orchestra_model": self.model_name[:512]}
        found: dict[str, bool] = {}  # how a batch whose create answer was lost was found again
        try:
            batch = await self.http.create_batch(handle, chunk[0]["path"], content, meta)
            if not isinstance(batch.get("id"), str) or not batch["id"]:
                raise ModelError("the create call was answered without a batch id")
        except ModelError as exc:
            # A create that failed in flight (its answer lost: a client timeout) may still have
            # made the batch: look for it before its rows are sent again.
            try:
                taken = {r.batch_id for r in self.ledger.load().values() if r.batch_id}
                batch = (await self.http.find([sent], taken)).get(key) or {}
            except ModelError:
                batch = {}
            if not batch:
                self._creating.pop(key, None)
                self.ledger.record("not_created", key, error=str(exc))
                return
            found = found_fields(batch)
        self._creating.pop(key, None)
        self.ledger.record("created", key, batch_id=batch["id"], **found)
        self._emit("batch_submitted", batch_id=batch["id"], key=key, requests=len(cids), bytes=len(content),
                   tasks=sorted({str(e.get("task", "")) for e in chunk}))
