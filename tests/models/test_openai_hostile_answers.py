"""Generation answers whose text is not text: a real aiohttp server on 127.0.0.1 answers every
``/chat/completions`` and ``/completions`` call with the reply a test sets.

A ``content`` (or ``text``) that is a number, a list or an object must fail the request with one
line, never become the prediction: a list would pass for ``num_samples`` answers in the record
(and be scored as such), an object would be sent back as a chat turn.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from servers.double_thread import AppServer

from orchestra.errors import ModelError
from orchestra.models.anthropic_api import AnthropicAPI
from orchestra.models.openai_api import OpenAIAPI
from orchestra.requests import GenRequest, LoglikRequest


class Replies(AppServer):
    """Answers every POST with ``self.reply`` (JSON)."""

    def __init__(self) -> None:
        self.reply: Any = {}
        self.status, self.headers, self.requests = 200, {"x-none": "0"}, 0
        self.serve("replies")

    async def answer(self, request: web.Request) -> web.Response:
        await request.read()
        self.requests += 1
        return web.json_response(self.reply, status=self.status, headers=self.headers)

    def routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/chat/completions", self.answer)
        app.router.add_post("/v1/completions", self.answer)
        app.router.add_post("/v1/messages", self.answer)


@pytest.fixture
def replies(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Replies]:
    monkeypatch.setenv("ORCHESTRA_LOCK_DIR", str(tmp_path / "locks"))
    server = Replies()
    yield server
    server.close()


def _generate(server: Replies, endpoint: str, reply: Any) -> Any:
    server.reply = reply

    async def main() -> Any:
        model = OpenAIAPI(abbr="m", path="p", base_url=server.base_url, key_env=None, endpoint=endpoint,
                          max_retries=0)
        try:
            return await model.generate(GenRequest("What is 2 + 3?"))
        finally:
            await model.aclose()

    return asyncio.run(main())


def _choice(endpoint: str, value: Any) -> dict[str, Any]:
    if endpoint == "chat":
        return {"choices": [{"index": 0, "message": {"role": "assistant", "content": value}}]}
    return {"choices": [{"index": 0, "text": value}]}


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
@pytest.mark.parametrize("value", [5, ["5", "6"], {"text": "5"}, True], ids=["number", "list", "object", "bool"])
def test_text_that_is_not_a_string_fails_the_request_with_one_line(replies: Replies, endpoint: str,
                                                                   value: Any) -> None:
    with pytest.raises(ModelError) as err:
        _generate(replies, endpoint, _choice(endpoint, value))
    assert "not text" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_text_and_null_text_are_answers(replies: Replies, endpoint: str) -> None:
    assert _generate(replies, endpoint, _choice(endpoint, " 5")) == " 5"
    assert _generate(replies, endpoint, _choice(endpoint, None)) == ""  # a refusal or a tool call: no text


def test_chat_content_given_as_parts_is_its_text_parts_joined(replies: Replies) -> None:
    """Mistral's reasoning models answer with ``content`` as a list: ``thinking`` parts, then ``text``."""
    parts = [{"type": "thinking", "thinking": [{"type": "text", "text": "2 + 3 is 5"}]},
             {"type": "text", "text": " 5"}, {"type": "text", "text": "."}]
    assert _generate(replies, "chat", _choice("chat", parts)) == " 5."
    assert _generate(replies, "chat", _choice("chat", [{"type": "thinking", "thinking": []}])) == ""


@pytest.mark.parametrize("parts", [[{"type": "text", "text": 5}], [{"type": "text"}], [{"text": "5"}], ["5"],
                                   [{"type": "text", "text": "5"}, None]],
                         ids=["text-number", "text-missing", "untyped", "string-part", "null-part"])
def test_chat_content_parts_that_are_not_text_fail_with_one_line(replies: Replies, parts: list[Any]) -> None:
    with pytest.raises(ModelError) as err:
        _generate(replies, "chat", _choice("chat", parts))
    assert "not text" in str(err.value) and "\n" not in str(err.value)


def _claude(server: Replies, reply: Any) -> Any:
    server.reply = reply

    async def main() -> Any:
        model = AnthropicAPI(abbr="c", path="claude", base_url=server.base_url, key_env=None, max_retries=0)
        try:
            return await model.generate(GenRequest("What is 2 + 3?"))
        finally:
            await model.aclose()

    return asyncio.run(main())


def test_anthropic_text_blocks_are_joined_and_others_skipped(replies: Replies) -> None:
    content = [{"type": "thinking", "thinking": "hmm"}, {"type": "text", "text": " 5"}, "junk",
               {"type": "tool_use", "id": "t"}, {"type": "text", "text": "."}]
    assert _claude(replies, {"content": content, "usage": {"input_tokens": 3, "output_tokens": 2}}) == " 5."


@pytest.mark.parametrize("reply", [{"content": "5"}, {"type": "message"}, {"content": [{"type": "text", "text": 5}]},
                                   {"content": [{"type": "text", "text": ["5", "6"]}]}],
                         ids=["content-string", "no-content", "text-number", "text-list"])
def test_anthropic_answer_without_text_content_fails_with_one_line(replies: Replies, reply: Any) -> None:
    with pytest.raises(ModelError) as err:
        _claude(replies, reply)
    assert "\n" not in str(err.value) and ("without content" in str(err.value) or "not text" in str(err.value))


def test_anthropic_refuses_loglikelihoods_with_one_line() -> None:
    model = AnthropicAPI(abbr="c", path="claude", key_env=None)
    with pytest.raises(ModelError, match="gives no log-probabilities"):
        asyncio.run(model.loglikelihood(LoglikRequest("2 + 3 =", (" 5", " 6"))))


def test_a_retry_after_past_the_deadline_gives_up_at_once(replies: Replies) -> None:
    """A 503 asking for 30 s while timeout_s is 10: the request fails now, with one line naming
    timeout_s and the server's message, instead of sleeping past its own deadline."""
    replies.status, replies.headers = 503, {"Retry-After": "30", "retry-after-ms": "soon"}
    replies.reply = {"error": {"message": "overloaded"}}

    async def main() -> Any:
        model = OpenAIAPI(abbr="m", path="p", base_url=replies.base_url, key_env=None, timeout_s=10.0)
        try:
            return await model.generate(GenRequest("What is 2 + 3?"))
        finally:
            await model.aclose()

    began = time.monotonic()
    with pytest.raises(ModelError) as err:
        asyncio.run(main())
    # well under the 10 s deadline (a loaded machine's start-up and one local request take a second at most)
    assert time.monotonic() - began < 5 and replies.requests == 1
    text = str(err.value)
    assert "timeout_s=10 would pass before the next one" in text and "HTTP 503: overloaded" in text and "\n" not in text


def _plain(server: Replies, **kwargs: Any) -> Any:
    async def main() -> Any:
        model = OpenAIAPI(abbr="m", path="p", base_url=server.base_url, **{"key_env": None, "max_retries": 0,
                                                                          **kwargs})
        try:
            return await model.generate(GenRequest("What is 2 + 3?"))
        finally:
            await model.aclose()

    return asyncio.run(main())


def test_a_200_whose_json_is_not_an_object_fails_at_once_with_one_line(replies: Replies) -> None:
    replies.reply = ["5"]
    with pytest.raises(ModelError, match=r"HTTP 200 with unexpected JSON: \['5'\]"):
        _plain(replies, max_retries=3)
    assert replies.requests == 1  # the same answer would come again: not retried


def test_a_401_names_the_unset_key_variable(replies: Replies, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ORCHESTRA_TEST_UNSET_KEY", raising=False)
    replies.status, replies.reply = 401, {"error": {"message": "missing bearer token"}}
    with pytest.raises(ModelError) as err:
        _plain(replies, key_env="ORCHESTRA_TEST_UNSET_KEY")
    assert str(err.value) == ("HTTP 401: missing bearer token (environment variable ORCHESTRA_TEST_UNSET_KEY "
                              "is not set)")


def test_batch_mode_outside_a_run_folder_is_one_line() -> None:
    model = OpenAIAPI(abbr="m", path="p", key_env=None, batch=True)
    with pytest.raises(ModelError, match="batch mode needs a run folder; it runs in infer tasks only"):
        asyncio.run(model.generate(GenRequest("hi")))


@pytest.mark.parametrize("reply", [{}, {"choices": []}, {"choices": [{"message": "5"}]}, {"choices": "5"}],
                         ids=["no-choices", "empty", "message-string", "choices-string"])
def test_an_answer_without_choices_is_one_line_naming_what_came(replies: Replies, reply: Any) -> None:
    replies.reply = reply
    with pytest.raises(ModelError) as err:
        _plain(replies)
    assert str(err.value).startswith("answer without choices: ") and "\n" not in str(err.value)


class NotJson(Replies):
    """Answers 200 with HTML (a proxy's error page) the first ``bad`` times, then a real answer."""

    bad = 2

    async def answer(self, request: web.Request) -> web.Response:
        await request.read()
        self.requests += 1
        if self.requests <= self.bad:
            return web.Response(text="<html>gateway says hi</html>", content_type="text/html")
        return web.json_response(_choice("chat", " 5"))


def test_a_200_that_is_not_json_is_retried(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORCHESTRA_LOCK_DIR", str(tmp_path / "locks"))
    server = NotJson()
    try:
        assert _plain(server, max_retries=3) == " 5" and server.requests == 3
        server.requests, server.bad = 0, 99
        with pytest.raises(ModelError, match=r"gave up after 2 attempts \(1 retries\): HTTP 200 with a body that is "
                                             r"not JSON: b'<html>gateway says hi</html>'"):
            _plain(server, max_retries=1)
    finally:
        server.close()
