"""A bounded read of an HTTP response body: an endpoint's answer is adversarial input, and a
body without end (or a compressed one that inflates without end) must not fill the memory of
the task that asked."""

from __future__ import annotations

from typing import Any

#: the largest response body a model API call reads (a completion of any real size fits well)
MAX_BODY_BYTES = 64 << 20


async def read_capped(resp: Any, limit: int = MAX_BODY_BYTES) -> bytes | None:
    """The body of the aiohttp response ``resp`` (decompressed); None once it is over ``limit``
    bytes, by its Content-Length or by what arrived (nothing more is read then)."""
    if resp.content_length is not None and resp.content_length > limit:
        return None
    chunks: list[bytes] = []
    size = 0
    async for chunk in resp.content.iter_chunked(1 << 20):
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)
