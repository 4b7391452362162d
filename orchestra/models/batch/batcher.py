"""Batch mode of an API model (:class:`~orchestra.models.openai_api.OpenAIAPI`,
:class:`~orchestra.models.anthropic_api.AnthropicAPI`): every request through the provider's
batch API, at the batch price, without ever paying twice.  :class:`Batcher` is one task's loop:
submit, resume, follow, poll, collect, stop.

Submit: requests gather for ``flush_s`` (or until ``size`` of them wait) and go into the model's
spool (:mod:`.spool`, through :mod:`.feed`), shared by every task of the model in the run folder
on this host; on every tick while some wait, the task reads the ledger's new lines to learn
which batch took which of its requests (``submitting``, then ``created`` or ``not_created``) and
tries to lead: the leader creates the batches of every task (:mod:`.leader`), split so that no
batch passes ``size`` requests or ``max_bytes``.  Each batch is in the run folder's ledger
(:mod:`.ledger`) before it is created and before it is relied on; its metadata names the run,
the task and its ledger key.  Answers are matched by ``custom_id`` (a hash of the request and the sample it
belongs to, :func:`~.rows.custom_id`), never by line order.

Resume: before a task queues its first request it reads the ledger (:meth:`Batcher._read_ledger`,
settling batches whose creator died mid-create); a request some recorded batch holds waits for
that batch (or reads its files) instead of being sent again.

Poll and collect: each task polls the batches holding its own requests and checkpoints its own
samples; rows that failed for a passing reason go into a later batch, at most ``max_retries``
times (:class:`~.rows.Waiting`).  A batch that cannot be read, or outlives ``window_s``, is
cancelled and its rows go again.  Stop (Ctrl-C, a failed task): every batch in flight is
cancelled, recorded.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from orchestra.errors import ModelError
from orchestra.fileio import stable_hash
from orchestra.limits.retry import RetryPolicy
from orchestra.models.base import ModelStats, current_sample, task_units
from orchestra.models.batch.feed import Feed
from orchestra.models.batch.leader import Leader
from orchestra.models.batch.ledger import FINAL, BatchLedger, BatchRecord, found_fields
from orchestra.models.batch.options import BatchOptions
from orchestra.models.batch.provider import BatchProvider
from orchestra.models.batch.rows import Req, Waiting, custom_id
from orchestra.models.batch.spool import BatchSpool
from orchestra.models.http_body import scrub_fields


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


class Batcher:
    """Sends one model's requests through its provider's batch API (see the module docstring)."""

    def __init__(self, options: BatchOptions, provider: BatchProvider, policy: RetryPolicy, stats: ModelStats,
                 model_name: str, scrub: Callable[[str], str] = str) -> None:
        self.scrub = scrub  # the model's: the key out of every row error and event field
        self.options = options
        self.provider = provider
        self.policy = policy
        self.stats = stats
        self.model_name = model_name
        self.ledger: BatchLedger | None = None
        self.spool: BatchSpool | None = None
        self.run_id = ""
        self.task_id = ""
        self.waiting = Waiting(policy, stats, scrub, self._enqueue)
        self._emit: Callable[..., None] = lambda event, **f: None
        self._feed: Feed | None = None  # this task's way into batches (a new one per task)
        self._batches: dict[str, Batch] = {}
        self._known: dict[str, BatchRecord] = {}  # ledger records by key (from earlier runs too)
        self._held_by: dict[str, str] = {}  # custom_id -> latest recorded batch key holding it
        self._recovery: asyncio.Task[None] | None = None
        self._creating: dict[str, BatchRecord] = {}  # key -> its record, while its create call is out
        self._poller: asyncio.Task[None] | None = None
        self._wake: asyncio.Event | None = None
        self._tag = ""  # ends every custom_id of this task

    def bind(self, ledger_path: str, run_id: str, task_id: str, emit: Callable[..., None]) -> None:
        """Record batches in ``ledger_path`` for task ``task_id`` of run ``run_id``."""
        self.ledger = BatchLedger(ledger_path)
        self.run_id, self.task_id = run_id, task_id
        self._emit = lambda event, **f: emit(event, **scrub_fields(f, self.scrub))
        if self.spool is not None:
            self.spool.close()
        self.spool = BatchSpool(ledger_path[:-len(".jsonl")] + ".spool", task_id)
        self.spool.open()
        leader = Leader(self.options, self.provider, self.ledger, self.spool, run_id, task_id, self.model_name,
                        self._emit, self._busy, self._creating)
        self._feed = Feed(self.options.size, self.options.flush_s, self.ledger, self.spool, leader, self.waiting,
                          task_id, self._took, self._crashed)
        self._tag = stable_hash(task_id, 8)  # a task's rows are its own, also in shared batches
        self._recovery = None
        self._held_by.clear()
        self.waiting.reset()
        self._wake = None  # events bind to a loop: a warm worker runs one loop per task
        for name in ("batches_submitted", "batches_in_progress", "batches_completed", "batches_adopted"):
            self.stats.extra[name] = 0

    def _count(self, name: str, delta: int = 1) -> None:
        self.stats.extra[name] = self.stats.extra.get(name, 0) + delta

    # -- submitting ---------------------------------------------------------------------
    async def submit(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """The response body of ``body`` sent to ``path`` (``/chat/completions``) in a batch."""
        if self.ledger is None:
            raise ModelError("batch mode needs a run folder (the task binds one); none was bound")
        await self._recover()
        sample = current_sample.get()  # its prediction file's tag: a -r that packs it otherwise finds it
        cid = f"{custom_id(path, body)}-t{sample.unit if sample is not None and sample.unit else self._tag}"
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        req = self.waiting.reqs.get(cid)
        if req is not None:  # the same request of the same sample: one row answers both
            req.futures.append(fut)
            return await fut
        req = self.waiting.reqs[cid] = Req(path, body, [fut])
        held = self._held_by.get(cid)
        if held is not None and self._known[held].batch_id:
            req.key = held
            self._adopt(self._known[held])
        else:
            self._enqueue(cid)
        self.stats.in_flight += 1
        try:
            return await fut
        finally:
            self.stats.in_flight -= 1

    def _crashed(self, task: asyncio.Task[None]) -> None:
        """A bug in a background loop must not leave requests waiting forever: fail them."""
        if task.cancelled() or task.exception() is None:
            return
        exc = task.exception()
        self.waiting.fail_all(f"batch mode stopped: {type(exc).__name__}: {exc}")

    def _enqueue(self, cid: str) -> None:
        assert self._feed is not None
        self._feed.enqueue(cid)

    def _took(self, key: str, batch_id: str, cids: list[str]) -> None:
        """A batch the leader created holds ``cids`` of this task: poll it."""
        self._known[key] = BatchRecord(key, self.task_id, cids, "", batch_id, "created")
        for cid in cids:
            self._held_by[cid] = key
        self._track(Batch(key, batch_id, cids, "", time.monotonic() + self.options.poll_s))
        self._count("batches_submitted")

    # -- resume ---------------------------------------------------------------------------
    async def _recover(self) -> None:
        """Every request waits for the one recovery of this task (no request may be queued
        before it is known which batches already hold what)."""
        if self._recovery is None:
            self._recovery = asyncio.get_running_loop().create_task(self._read_ledger())
        await asyncio.shield(self._recovery)

    async def _read_ledger(self) -> None:
        """Once per task, before any request is queued: which batches hold which requests.
        Under ``lead.lock`` (no create call is out): batches whose creator died before
        recording the id are looked up by their metadata first."""
        assert self.ledger is not None and self.spool is not None and self._feed is not None
        mine = tuple(f"-t{tag}" for tag in {self._tag, *task_units.get()})
        while True:
            while not self.spool.try_lead():
                await asyncio.sleep(0.05)
            try:
                self._known = await self.ledger.recover(None, self.provider.find, self._busy)
                self._feed.offset = self.ledger.tail(0)[1]
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

    def _adopt(self, rec: BatchRecord) -> None:
        """Watch a batch an earlier run recorded (read at once: it may be over already)."""
        if rec.key in self._batches:
            return
        self._count("batches_adopted")
        self._emit("batch_adopted", batch_id=rec.batch_id, key=rec.key, requests=len(rec.custom_ids),
                   recorded_state=rec.state)
        self._track(Batch(rec.key, rec.batch_id, rec.custom_ids, rec.status, 0.0, t0=rec.ts))

    # -- polling and results ----------------------------------------------------------------
    def _track(self, batch: Batch) -> None:
        self._batches[batch.key] = batch
        self.stats.extra["batches_in_progress"] = len(self._batches)
        if self._wake is not None:
            self._wake.set()
        if self._poller is None or self._poller.done():
            self._poller = asyncio.get_running_loop().create_task(self._poll_loop())
            self._poller.add_done_callback(self._crashed)

    async def _poll_loop(self) -> None:
        self._wake = asyncio.Event()
        while self._batches:
            now = time.monotonic()
            due = [b for b in self._batches.values() if b.next_poll <= now]
            if due:
                await asyncio.gather(*(self._poll(b) for b in due))
                continue
            self._wake.clear()
            wait = min(b.next_poll for b in self._batches.values()) - now
            try:
                await asyncio.wait_for(self._wake.wait(), max(0.0, wait))
            except asyncio.TimeoutError:
                pass

    async def _poll(self, batch: Batch) -> None:
        batch.next_poll = time.monotonic() + self.options.poll_s
        batch.polls += 1
        try:
            obj = await self.provider.get(batch.batch_id)
        except ModelError as exc:
            self._emit("batch_poll_failed", batch_id=batch.batch_id, error=str(exc))
            batch.failures += 1
            if batch.failures > self.policy.max_retries:
                await self._abandon(batch, f"batch {batch.batch_id} could not be read: {exc}")
            return
        batch.failures = 0
        status = str(obj.get("status", ""))[:100]
        if status != batch.status:
            batch.status = status
            self._emit("batch_status", batch_id=batch.batch_id, status=status,
                       counts=obj.get("request_counts"))
            if status not in self.provider.statuses and status not in batch.unknown:
                batch.unknown.add(status)
                self._unknown(batch, status)
        if status in FINAL:
            await self._finish(batch, obj)
        elif time.time() - batch.t0 > self.options.window_s:  # the provider's window is over: stop waiting
            self._emit("batch_window_over", batch_id=batch.batch_id, status=status, window_s=self.options.window_s)
            await self._abandon(batch, f"batch {batch.batch_id} did not end within {self.options.window_s:g} s "
                                       f"(batch.window_s; last status {status!r})")

    def _unknown(self, batch: Batch, status: str) -> None:
        """A status the provider does not document: said once per batch and status, then polled
        on (a status it adds later may still end) until ``window_s``."""
        known = ", ".join(sorted(self.provider.statuses))
        self._emit("batch_status_unknown", batch_id=batch.batch_id, status=status, known=known)
        print(self.scrub(f"orchestra: warning: batch {batch.batch_id} of model {self.model_name} shows status "
                         f"{status!r}, which is none of {known}; polled on until it ends or batch.window_s "
                         f"({self.options.window_s:g} s) passes"), file=sys.stderr, flush=True)

    async def _finish(self, batch: Batch, obj: dict[str, Any], why: str = "") -> None:
        """Read a finished batch's rows: answers resolve, the rest go again or fail.  ``why``: the
        batch was given up (its reason stands for rows it did not answer; no second read)."""
        assert self.ledger is not None
        try:
            rows = await self.provider.rows(obj)
        except (ModelError, ValueError) as exc:
            self._emit("batch_read_failed", batch_id=batch.batch_id, error=str(exc))
            if not why:
                batch.next_poll = time.monotonic() + self.options.poll_s
                batch.read_failures += 1  # a good poll does not reset it: the file itself is unreadable
                if batch.read_failures > self.policy.max_retries:
                    await self._abandon(batch, f"batch {batch.batch_id} could not be read: {exc}")
                return
            rows = {}
        self._batches.pop(batch.key, None)
        self.stats.extra["batches_in_progress"] = len(self._batches)
        self._count("batches_completed")
        self.ledger.record("ended", batch.key, batch_id=batch.batch_id, status=batch.status)
        ok = self.waiting.settle(batch.key, batch.custom_ids, rows, why or self.provider.reason(obj))
        self._emit("batch_ended", batch_id=batch.batch_id, status=batch.status, polls=batch.polls,
                   rows=len(batch.custom_ids), answered=ok, errors=self.provider.errors(obj))

    async def _abandon(self, batch: Batch, reason: str) -> None:
        """Stop watching ``batch`` (polls or reads keep failing, or its window is over): a batch
        that may still run is cancelled first (it would be paid for alongside the next one), the
        rows it finished are kept, and the rest go into a later batch, bounded by their retries."""
        obj: dict[str, Any] = {}
        if batch.status not in FINAL:
            obj = await self._cancel(batch, time.monotonic() + self.options.cancel_wait_s)
        self._batches.pop(batch.key, None)
        self.stats.extra["batches_in_progress"] = len(self._batches)
        if obj.get("status") in FINAL:
            batch.status = str(obj["status"])
            await self._finish(batch, obj, reason)
            return
        self.waiting.settle(batch.key, batch.custom_ids, {}, reason)  # no row: each goes again

    # -- stopping -------------------------------------------------------------------------------
    async def aclose(self) -> None:
        """Cancel every batch still in flight (Ctrl-C, a failed task), recorded, waiting at most
        ``cancel_wait_s`` for the provider to show each one cancelled."""
        if self._feed is not None:
            self._feed.follow()  # batches another task's lead created for this task's requests meanwhile
            self._feed.stop()
        if self._poller is not None and not self._poller.done():
            self._poller.cancel()
        self._poller = None
        deadline = time.monotonic() + self.options.cancel_wait_s
        live = [b for b in self._batches.values() if b.status not in FINAL]
        self._batches.clear()
        if self._creating and self.ledger is not None:  # stopped during a create: did it make one?
            try:
                taken = {r.batch_id for r in self.ledger.load().values() if r.batch_id}
                found = await asyncio.wait_for(self.provider.find(list(self._creating.values()), taken),
                                               max(0.1, deadline - time.monotonic()))
            except (ModelError, asyncio.TimeoutError):
                found = {}
            for key, obj in found.items():
                self.ledger.record("created", key, batch_id=obj["id"], **found_fields(obj))
                live.append(Batch(key, str(obj["id"]), [], str(obj.get("status", ""))))
            self._creating.clear()
        if live and self.ledger is not None:
            await asyncio.gather(*(self._cancel(b, deadline) for b in live))
        self.waiting.fail_all("stopped before its batch ended")
        if self._feed is not None:
            self._feed.drop()
        if self.spool is not None:
            self.spool.close()  # withdraws what still waits in the spool; releases lead.lock
            self.spool = None

    async def _cancel(self, batch: Batch, deadline: float) -> dict[str, Any]:
        """Cancel ``batch``, recorded, watching it until ``deadline`` to show a final status; the
        provider's last answer (``{}`` when none came)."""
        assert self.ledger is not None
        self.ledger.record("cancel_sent", batch.key, batch_id=batch.batch_id)
        status, obj = "", {}
        try:
            obj = await asyncio.wait_for(self.provider.cancel(batch.batch_id), max(0.1, deadline - time.monotonic()))
            status = str(obj.get("status", ""))
            while status not in FINAL and time.monotonic() < deadline:
                await asyncio.sleep(min(0.2, max(0.0, deadline - time.monotonic())))
                obj = await asyncio.wait_for(self.provider.get(batch.batch_id), max(0.1, deadline - time.monotonic()))
                status = str(obj.get("status", ""))
        except (ModelError, asyncio.TimeoutError) as exc:
            status = status or f"unconfirmed ({exc})"
        self.ledger.record("cancelled" if status in FINAL else "cancel_unconfirmed", batch.key,
                           batch_id=batch.batch_id, status=status)
        self._emit("batch_cancelled", batch_id=batch.batch_id, status=status)
        return obj
