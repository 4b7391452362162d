"""Batch mode of :class:`~orchestra.models.openai_api.OpenAIAPI`: every request through the
provider's Batch API, at the batch price, without ever paying twice.

Requests gather for ``flush_s`` (or until ``size`` of them wait) and go out as one JSONL file
per batch, split so that no file passes ``size`` requests or ``max_bytes``; the requests of every
task of the model in the run folder on this host fill the same batches (the spool,
:mod:`orchestra.models.openai_batch_submit`), and each task polls the batches holding its own
requests and checkpoints its own samples.  Each batch is in the
run folder's ledger (:mod:`orchestra.models.batch_ledger`) before it is created and before it is
relied on; its metadata names the run, the task and its ledger key.  Answers are matched by
``custom_id`` (a hash of the request and the sample it belongs to), never by line order.

Resume: a request some recorded batch holds waits for that batch (or reads its files) instead
of being sent again.  Rows that failed for a passing reason go into a later batch, at most
``max_retries`` times (:func:`~orchestra.models.batch_rows.row_outcome`).
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable
from typing import Any

from orchestra.errors import ModelError
from orchestra.fileio import stable_hash
from orchestra.limits.retry import RetryPolicy
from orchestra.models.base import ModelStats
from orchestra.models.batch_ledger import FINAL, BatchLedger, BatchRecord, found_fields
from orchestra.models.batch_rows import BatchOptions, custom_id
from orchestra.models.batch_spool import BatchSpool
from orchestra.models.http_body import scrub_fields
from orchestra.models.openai_batch_http import BatchHTTP
from orchestra.models.openai_batch_submit import Batch, BatchSubmitter, Req


class OpenAIBatcher(BatchSubmitter):
    """Sends one model's requests through the Batch API (see the module docstring)."""

    def __init__(self, options: BatchOptions, http: BatchHTTP, policy: RetryPolicy, stats: ModelStats,
                 model_name: str, scrub: Callable[[str], str] = str) -> None:
        self.scrub = scrub  # the model's: the key out of every row error and event field
        self.options = options
        self.http = http
        self.policy = policy
        self.stats = stats
        self.model_name = model_name
        self.ledger: BatchLedger | None = None
        self.spool: BatchSpool | None = None
        self.run_id = ""
        self.task_id = ""
        self._emit: Callable[..., None] = lambda event, **f: None
        self._reqs: dict[str, Req] = {}
        self._queue: list[str] = []
        self._batches: dict[str, Batch] = {}
        self._known: dict[str, BatchRecord] = {}  # ledger records by key (from earlier runs too)
        self._held_by: dict[str, str] = {}  # custom_id -> latest recorded batch key holding it
        self._recovery: asyncio.Task[None] | None = None
        self._creating: dict[str, BatchRecord] = {}  # key -> its record, while its create call is out
        self._to_retry: list[str] = []  # rows that failed in this loop step, requeued together
        self._full: asyncio.Event | None = None
        self._flusher: asyncio.Task[None] | None = None
        self._poller: asyncio.Task[None] | None = None
        self._wake: asyncio.Event | None = None
        self._pending: dict[str, list[str]] = {}
        self._offset = 0
        self._tag = ""

    def bind(self, ledger_path: str, run_id: str, task_id: str, emit: Callable[..., None]) -> None:
        """Record batches in ``ledger_path`` for task ``task_id`` of run ``run_id``."""
        self.ledger = BatchLedger(ledger_path)
        self.run_id, self.task_id = run_id, task_id
        self._emit = lambda event, **f: emit(event, **scrub_fields(f, self.scrub))
        if self.spool is not None:
            self.spool.close()
        self.spool = BatchSpool(ledger_path[:-len(".jsonl")] + ".spool", task_id)
        self.spool.open()
        self._tag = stable_hash(task_id, 8)  # a task's rows are its own, also in shared batches
        self._pending, self._offset = {}, 0
        self._recovery = None
        self._held_by.clear()
        self._to_retry = []
        self._full = None  # events bind to a loop: a warm worker runs one loop per task
        self._wake = None
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
        cid = f"{custom_id(path, body)}-t{self._tag}"
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        req = self._reqs.get(cid)
        if req is not None:  # the same request of the same sample: one row answers both
            req.futures.append(fut)
            return await fut
        req = self._reqs[cid] = Req(path, body, [fut])
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
        for cid in list(self._reqs):
            self._fail(cid, f"batch mode stopped: {type(exc).__name__}: {exc}")

    def _track(self, batch: Batch) -> None:
        self._batches[batch.key] = batch
        self.stats.extra["batches_in_progress"] = len(self._batches)
        if self._wake is not None:
            self._wake.set()
        if self._poller is None or self._poller.done():
            self._poller = asyncio.get_running_loop().create_task(self._poll_loop())
            self._poller.add_done_callback(self._crashed)

    def _adopt(self, rec: BatchRecord) -> None:
        """Watch a batch an earlier run recorded (read at once: it may be over already)."""
        if rec.key in self._batches:
            return
        self._count("batches_adopted")
        self._emit("batch_adopted", batch_id=rec.batch_id, key=rec.key, requests=len(rec.custom_ids),
                   recorded_state=rec.state)
        self._track(Batch(rec.key, rec.batch_id, rec.custom_ids, rec.status, 0.0, t0=rec.ts))

    # -- resume ---------------------------------------------------------------------------
    async def _recover(self) -> None:
        """Every request waits for the one recovery of this task (no request may be queued
        before it is known which batches already hold what)."""
        if self._recovery is None:
            self._recovery = asyncio.get_running_loop().create_task(self._read_ledger())
        await asyncio.shield(self._recovery)

    # -- polling and results ----------------------------------------------------------------
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
            obj = await self.http.get(batch.batch_id)
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
            if status not in self.http.statuses and status not in batch.unknown:
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
        known = ", ".join(sorted(self.http.statuses))
        self._emit("batch_status_unknown", batch_id=batch.batch_id, status=status, known=known)
        print(self.scrub(f"orchestra: warning: batch {batch.batch_id} of model {self.model_name} shows status "
                         f"{status!r}, which is none of {known}; polled on until it ends or batch.window_s "
                         f"({self.options.window_s:g} s) passes"), file=sys.stderr, flush=True)

    async def _finish(self, batch: Batch, obj: dict[str, Any], why: str = "") -> None:
        """Read a finished batch's rows: answers resolve, the rest go again or fail.  ``why``: the
        batch was given up (its reason stands for rows it did not answer; no second read)."""
        assert self.ledger is not None
        try:
            rows = await self.http.rows(obj)
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
        reason = why or self.http.reason(obj)
        ok = 0
        for cid in batch.custom_ids:
            req = self._reqs.get(cid)
            if req is None or req.key != batch.key:
                continue  # not needed now (done, or waiting for a later batch)
            kind, value = rows.get(cid, ("retry", reason))
            if kind == "ok":
                ok += 1
                self._resolve(cid, value)
            elif kind == "retry":
                self._retry_or_fail(cid, str(value))
            else:
                self._fail(cid, str(value))
        self._emit("batch_ended", batch_id=batch.batch_id, status=batch.status, polls=batch.polls,
                   rows=len(batch.custom_ids), answered=ok, errors=self.http.errors(obj))

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
        for cid in batch.custom_ids:
            req = self._reqs.get(cid)
            if req is not None and req.key == batch.key:
                self._retry_or_fail(cid, reason)

    def _resolve(self, cid: str, body: dict[str, Any]) -> None:
        req = self._reqs.pop(cid)
        self.stats.done += 1
        for fut in req.futures:
            if not fut.done():
                fut.set_result(body)

    def _fail(self, cid: str, text: str) -> None:
        req = self._reqs.pop(cid)
        self.stats.errors += 1
        for fut in req.futures:
            if not fut.done():
                fut.set_exception(ModelError(self.scrub(text)))  # a provider may echo the key in a row

    def _retry_or_fail(self, cid: str, reason: str) -> None:
        req = self._reqs.get(cid)
        if req is None:
            return
        req.attempts += 1
        req.key = req.nonce = ""
        if req.attempts > self.policy.max_retries:
            self._fail(cid, f"gave up after {req.attempts} batches ({self.policy.max_retries} retries): {reason}")
            return
        self.stats.retries += 1
        if not self._to_retry:  # the rows failing together go into one later batch, after one backoff
            asyncio.get_running_loop().call_soon(self._schedule_retries)
        self._to_retry.append(cid)

    def _schedule_retries(self) -> None:
        cids, self._to_retry = self._to_retry, []
        attempts = max((self._reqs[c].attempts for c in cids if c in self._reqs), default=1)
        asyncio.get_running_loop().call_later(self.policy.backoff_s(attempts), self._requeue, cids)

    def _requeue(self, cids: list[str]) -> None:
        for cid in cids:
            if cid in self._reqs and not self._reqs[cid].key:
                self._enqueue(cid)

    # -- stopping -------------------------------------------------------------------------------
    async def aclose(self) -> None:
        """Cancel every batch still in flight (Ctrl-C, a failed task), recorded, waiting at most
        ``cancel_wait_s`` for the provider to show each one cancelled."""
        self._follow()  # batches another task's lead created for this task's requests meanwhile
        for task in (self._flusher, self._poller):
            if task is not None and not task.done():
                task.cancel()
        self._flusher = self._poller = None
        deadline = time.monotonic() + self.options.cancel_wait_s
        live = [b for b in self._batches.values() if b.status not in FINAL]
        self._batches.clear()
        if self._creating and self.ledger is not None:  # stopped during a create: did it make one?
            try:
                taken = {r.batch_id for r in self.ledger.load().values() if r.batch_id}
                found = await asyncio.wait_for(self.http.find(list(self._creating.values()), taken),
                                               max(0.1, deadline - time.monotonic()))
            except (ModelError, asyncio.TimeoutError):
                found = {}
            for key, obj in found.items():
                self.ledger.record("created", key, batch_id=obj["id"], **found_fields(obj))
                live.append(Batch(key, str(obj["id"]), [], str(obj.get("status", ""))))
            self._creating.clear()
        if live and self.ledger is not None:
            await asyncio.gather(*(self._cancel(b, deadline) for b in live))
        for cid in list(self._reqs):
            self._fail(cid, "stopped before its batch ended")
        self._queue.clear()
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
            obj = await asyncio.wait_for(self.http.cancel(batch.batch_id), max(0.1, deadline - time.monotonic()))
            status = str(obj.get("status", ""))
            while status not in FINAL and time.monotonic() < deadline:
                await asyncio.sleep(min(0.2, max(0.0, deadline - time.monotonic())))
                obj = await asyncio.wait_for(self.http.get(batch.batch_id), max(0.1, deadline - time.monotonic()))
                status = str(obj.get("status", ""))
        except (ModelError, asyncio.TimeoutError) as exc:
            status = status or f"unconfirmed ({exc})"
        self.ledger.record("cancelled" if status in FINAL else "cancel_unconfirmed", batch.key,
                           batch_id=batch.batch_id, status=status)
        self._emit("batch_cancelled", batch_id=batch.batch_id, status=status)
        return obj
