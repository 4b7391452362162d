"""The rows of batch mode, for any provider: a row's stable ``custom_id``, the lines of a result
file, and the rows one task waits for (:class:`Waiting`) with what becomes of each when its
batch ends: an answer, another batch after a backoff (a failure worth retrying), or a final
failure.  What a provider's result line means is the provider's (:mod:`.openai`,
:mod:`.anthropic`): each maps it to ``("ok", body)``, ``("retry", text)`` or ``("fail", text)``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from orchestra.errors import ModelError
from orchestra.fileio import stable_hash
from orchestra.limits.retry import RetryPolicy
from orchestra.models.base import ModelStats, current_sample


def custom_id(path: str, body: dict[str, Any]) -> str:
    """A stable ``custom_id``: the request's hash, its sample and its number among the sample's
    identical calls, so that a resumed run finds the row an earlier run already paid for."""
    digest = stable_hash({"url": path, "body": body}, 20)
    tag = current_sample.get()
    if tag is None:
        return f"o{digest}"
    n = tag.seen.get(digest, 0)
    tag.seen[digest] = n + 1
    return f"o{digest}-s{tag.id}-{n}"


def keep(rows: dict[str, tuple[str, Any]], cid: str, outcome: tuple[str, Any]) -> None:
    """Record ``outcome`` for row ``cid`` of a result file; a later line for the same row wins,
    except over an answer: a row answered once was paid for, and sending it again pays twice."""
    if rows.get(cid, ("",))[0] != "ok":
        rows[cid] = outcome


@dataclass
class Req:
    """One request a task waits for."""

    path: str
    body: dict[str, Any]
    futures: list[asyncio.Future[dict[str, Any]]] = field(default_factory=list)
    key: str = ""  # the batch holding it now
    attempts: int = 0
    nonce: str = ""  # its spool entry, while no batch tracks it (in the spool or being created)


class Waiting:
    """The rows one task waits for, by ``custom_id``, and their outcomes.

    Args:
        policy: ``max_retries`` (batches a row may go into after its first) and the backoff.
        stats: the model's counters (``done``, ``errors``, ``retries``).
        scrub: the model's: the key out of every error text (a provider may echo it in a row).
        enqueue: puts a row whose backoff is over into the queue of the next batch.
    """

    def __init__(self, policy: RetryPolicy, stats: ModelStats, scrub: Callable[[str], str],
                 enqueue: Callable[[str], None]) -> None:
        self.reqs: dict[str, Req] = {}
        self.policy = policy
        self.stats = stats
        self.scrub = scrub
        self._enqueue = enqueue
        self._to_retry: list[str] = []  # rows that failed in this loop step, requeued together

    def reset(self) -> None:
        """A new task (a warm worker runs one loop per task): no retry of the last one is due."""
        self._to_retry = []

    def settle(self, key: str, cids: list[str], rows: dict[str, tuple[str, Any]], reason: str) -> int:
        """Apply the rows of batch ``key`` to those of ``cids`` it still holds (a row it did not
        answer goes again, ``reason`` its error); how many were answered."""
        ok = 0
        for cid in cids:
            req = self.reqs.get(cid)
            if req is None or req.key != key:
                continue  # not needed now (done, or waiting for a later batch)
            kind, value = rows.get(cid, ("retry", reason))
            if kind == "ok":
                ok += 1
                self.resolve(cid, value)
            elif kind == "retry":
                self.retry_or_fail(cid, str(value))
            else:
                self.fail(cid, str(value))
        return ok

    def resolve(self, cid: str, body: dict[str, Any]) -> None:
        req = self.reqs.pop(cid)
        self.stats.done += 1
        for fut in req.futures:
            if not fut.done():
                fut.set_result(body)

    def fail(self, cid: str, text: str) -> None:
        req = self.reqs.pop(cid)
        self.stats.errors += 1
        for fut in req.futures:
            if not fut.done():
                fut.set_exception(ModelError(self.scrub(text)))  # a provider may echo the key in a row

    def fail_all(self, text: str) -> None:
        for cid in list(self.reqs):
            self.fail(cid, text)

    def retry_or_fail(self, cid: str, reason: str) -> None:
        """Row ``cid`` goes into a later batch (after a backoff), or fails past ``max_retries``."""
        req = self.reqs.get(cid)
        if req is None:
            return
        req.attempts += 1
        req.key = req.nonce = ""
        if req.attempts > self.policy.max_retries:
            self.fail(cid, f"gave up after {req.attempts} batches ({self.policy.max_retries} retries): {reason}")
            return
        self.stats.retries += 1
        if not self._to_retry:  # the rows failing together go into one later batch, after one backoff
            asyncio.get_running_loop().call_soon(self._schedule_retries)
        self._to_retry.append(cid)

    def _schedule_retries(self) -> None:
        cids, self._to_retry = self._to_retry, []
        attempts = max((self.reqs[c].attempts for c in cids if c in self.reqs), default=1)
        asyncio.get_running_loop().call_later(self.policy.backoff_s(attempts), self._requeue, cids)

    def _requeue(self, cids: list[str]) -> None:
        for cid in cids:
            if cid in self.reqs and not self.reqs[cid].key:
                self._enqueue(cid)
