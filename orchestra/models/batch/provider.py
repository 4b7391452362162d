"""What the batcher asks of a provider's batch API (:class:`BatchProvider`), answered by OpenAI's
Files + Batches (:mod:`.openai`) and Anthropic's Message Batches (:mod:`.anthropic`), both
over the one retrying transport (:mod:`.transport`).

Statuses come back in the batcher's words: a batch object's ``status`` is one of the provider's
``statuses``, and it changes no more once it is in :data:`~.ledger.FINAL`.  A result row is
``("ok", body)``, ``("retry", text)`` or ``("fail", text)`` (:mod:`.rows`).
"""

from __future__ import annotations

from typing import Any, Protocol

from orchestra.models.batch.ledger import BatchRecord

#: pages of the provider's batch list (100 batches each) read at most when a batch whose create
#: answer was lost is looked for: a list that pages on forever (``has_more`` always true, its
#: cursor ignored, creation times in the future) must not hold the batcher
MAX_LIST_PAGES = 20


class BatchProvider(Protocol):
    """One provider's batch calls: the shapes of its requests and answers, and its endpoints."""

    @property
    def statuses(self) -> frozenset[str]:
        """Every status the provider documents (another one is an event and a warning)."""
        ...

    def line(self, cid: str, path: str, body: dict[str, Any]) -> bytes:
        """One request as a line of the batch input (the provider's JSONL row)."""
        ...

    async def prepare(self, key: str, content: bytes) -> str:
        """Make the batch's input available before it is recorded: a handle (an uploaded file's id)."""
        ...

    async def create_batch(self, handle: str, path: str, content: bytes, meta: dict[str, str]) -> dict[str, Any]:
        """Create the batch of ``content`` (requests to ``path``); one attempt (a retried create
        could start it twice).  ``meta``: the run, task and ledger key, where the provider keeps them."""
        ...

    async def get(self, batch_id: str) -> dict[str, Any]:
        """The batch object now (``status`` in the batcher's words)."""
        ...

    async def cancel(self, batch_id: str) -> dict[str, Any]:
        """Ask the provider to cancel a batch (one attempt); the batch object it answers."""
        ...

    async def rows(self, obj: dict[str, Any]) -> dict[str, tuple[str, Any]]:
        """Each result row of a finished batch by ``custom_id``: ``(kind, value)``."""
        ...

    def reason(self, obj: dict[str, Any]) -> str:
        """Why a finished batch's rows without a result got none (their error text)."""
        ...

    def errors(self, obj: dict[str, Any]) -> list[dict[str, Any]]:
        """The batch's own errors (validation, token limit), for the ``batch_ended`` event."""
        ...

    async def find(self, wanted: list[BatchRecord], taken: set[str]) -> dict[str, dict[str, Any]]:
        """The batches of ``wanted`` (ledger records whose create answer was lost), by record key,
        looked up on the provider's list; never one whose id another record holds (``taken``)."""
        ...
