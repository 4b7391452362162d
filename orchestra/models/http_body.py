"""What a model API endpoint sends back is adversarial input: its body is read with a bound (a
body without end, or a compressed one that inflates without end, must not fill the memory of
the task that asked), the key is scrubbed from any of it quoted in an error, and an answer given
as parts is read only from parts that are what they claim."""

from __future__ import annotations

import urllib.parse
from collections.abc import Callable, Mapping
from typing import Any

from orchestra.errors import ModelError
from orchestra.models.key_scrub import scrub_key

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


#: the shortest key scrubbed from answers: a placeholder key of a local server (``EMPTY``, ``1``,
#: ``dummy``) is also a word or a number the model may answer with, and replacing it by ``***``
#: would change the answer and its score; a real provider's key is 30 characters or more
ANSWER_SCRUB_MIN = 16


def scrub_answer(text: str, key: str) -> str:
    """``text``, a model's answer, with ``key`` scrubbed (:func:`~.key_scrub.scrub_key`) if it is long enough
    to be a secret (``ANSWER_SCRUB_MIN``); a shorter one is left, as it may be an ordinary word."""
    return scrub_key(text, key) if len(key) >= ANSWER_SCRUB_MIN else text


def is_redirect(status: int) -> bool:
    """Whether an answer is a redirect, which no model call follows: the key travels in a header
    of the session (``Authorization``, which aiohttp drops on the way to another origin, or
    Anthropic's ``x-api-key``, which it keeps), so a redirect to another origin, or from https to
    http, would hand it over."""
    return status in (301, 302, 303, 307, 308)


def redirect_reason(status: int, headers: Mapping[str, str], url: str = "") -> str:
    """A redirect's error text: where it leads and the fix.  A ``Location`` relative to ``url`` (the
    address asked) is resolved against it; another origin is named by its origin only (a query or a
    path may hold a token), the same origin by its path too (else the text would name the address
    that was asked, and not say what the endpoint wants instead)."""
    location = str(headers.get("Location", ""))[:2000]
    target = urllib.parse.urlsplit(urllib.parse.urljoin(url, location) if location else "")
    origin = _origin(target)
    if origin and origin == _origin(urllib.parse.urlsplit(url)):
        origin += target.path
    where = f" to {origin!r}" if origin else " (no Location)"
    return (f"HTTP {status}: the endpoint redirects{where}; orchestra does not follow redirects (the API key "
            "would go along): set base_url to the address the endpoint means")


def _origin(parts: urllib.parse.SplitResult) -> str:
    """``scheme://host[:port]`` of ``parts`` ('' without a scheme or a host)."""
    if not parts.scheme or not parts.hostname:
        return ""
    port = _port(parts)
    return f"{parts.scheme}://{parts.hostname}{f':{port}' if port else ''}"


def _port(parts: urllib.parse.SplitResult) -> int | None:
    try:
        return parts.port
    except ValueError:  # not a number: left out
        return None


def scrub_fields(value: Any, scrub: Callable[[str], str]) -> Any:
    """``value`` (an event's fields: strings in dicts and lists) with ``scrub`` applied to every string."""
    if isinstance(value, str):
        return scrub(value)
    if isinstance(value, dict):
        return {k: scrub_fields(v, scrub) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [scrub_fields(v, scrub) for v in value]
    return value


def text_parts(parts: list[Any], abbr: str) -> str:
    """A chat answer's ``content`` given as parts (Mistral's reasoning models: ``thinking`` parts,
    then ``text`` parts): the ``text`` parts joined, the others skipped; one line if a part is not a
    typed object or a ``text`` part holds no string."""
    texts = []
    for part in parts:
        if not isinstance(part, dict) or not isinstance(part.get("type"), str):
            raise ModelError(f"model {abbr}: a part of the answer's content is not a typed object, not text")
        if part["type"] == "text":
            if not isinstance(part.get("text"), str):
                raise ModelError(f"model {abbr}: a text part of the answer's content is not text")
            texts.append(part["text"])
    return "".join(texts)


#: the token counts of an OpenAI answer's ``usage``, and the counters they add to
OPENAI_USAGE = (("prompt_tokens", "prompt_tokens"), ("completion_tokens", "completion_tokens"))


def count_usage(extra: dict[str, float], data: dict[str, Any],
                names: tuple[tuple[str, str], ...] = OPENAI_USAGE) -> None:
    """Add an answer's token counts (its ``usage``, read by ``names``: theirs, ours) to a
    model's counters ``extra``; an answer without them adds nothing."""
    usage = data.get("usage")
    if isinstance(usage, dict):
        for theirs, ours in names:
            value = usage.get(theirs)
            if isinstance(value, (int, float)):
                extra[ours] = extra.get(ours, 0) + value
