"""An endpoint whose operator puts the API key it was sent into the answer (a proxy that echoes its
request, or a prompt that asks the model to repeat its headers): the answer is what orchestra
writes to predictions, results, the summary and the report, which are shared more widely than the
key.  The key is replaced by ``***`` in every answer, for both HTTP model families; real local
HTTP servers, the models' own request path."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from orchestra.models.anthropic_api import AnthropicAPI
from orchestra.models.openai_api import OpenAIAPI
from orchestra.requests import GenRequest

KEY = "sk-echo-9f2c61d0e4b7a8"
ANSWER = "EMPTY: the set is empty, so 1 + 1 = 2 and the answer is 1; no dummy key needed"


class _Echo(BaseHTTPRequestHandler):
    """Answers every POST with the credentials it got, in the shape of the API that was called."""

    def do_POST(self) -> None:  # noqa: N802 - the http.server name
        asked = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        sent = f"{self.headers.get('Authorization', '')} {self.headers.get('x-api-key', '')}"
        said = f"your headers: {sent}; JSON-escaped {json.dumps(sent)[1:-1].replace('/', chr(92) + '/')}"
        if b"count" in asked:  # an ordinary answer, which holds a local server's placeholder keys as words
            said = ANSWER
        if self.path.endswith("/messages"):
            obj: dict[str, Any] = {"content": [{"type": "text", "text": said}], "usage": {}}
        else:
            obj = {"choices": [{"index": 0, "message": {"role": "assistant", "content": said}}]}
        body = json.dumps(obj).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def echo_url(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> Iterator[str]:
    monkeypatch.setenv("ORCHESTRA_LOCK_DIR", str(tmp_path / "locks"))
    monkeypatch.setenv("ORC_ECHO_KEY", KEY)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Echo)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    thread.join()


def _answer(model: Any, prompt: str = "repeat your headers") -> str:
    async def main() -> str:
        try:
            return str(await model.generate(GenRequest(prompt=prompt, max_out_len=16)))
        finally:
            await model.aclose()

    return asyncio.run(main())


@pytest.mark.parametrize("family", [OpenAIAPI, AnthropicAPI])
def test_a_key_echoed_in_the_answer_is_replaced(echo_url: str, family: type) -> None:
    model = family(abbr="m", path="p", base_url=echo_url, key_env="ORC_ECHO_KEY")
    text = _answer(model)
    assert "your headers:" in text  # the request went out with the key and the echo came back
    assert KEY not in text and KEY.replace("/", "\\/") not in text  # before: the answer held it twice
    assert text.count("***") == 2


@pytest.mark.parametrize("family", [OpenAIAPI, AnthropicAPI])
@pytest.mark.parametrize("placeholder", ["EMPTY", "1", "dummy", "the"])
def test_a_placeholder_key_leaves_an_ordinary_answer_as_it_is(
        echo_url: str, family: type, placeholder: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # a local server's placeholder key (vLLM's docs: 'EMPTY') is a word or a number of many answers:
    # scrubbing it would change the answer and its score (before: '***: the set is empty, so *** + ***')
    monkeypatch.setenv("ORC_ECHO_KEY", placeholder)
    model = family(abbr="m", path="p", base_url=echo_url, key_env="ORC_ECHO_KEY")
    assert _answer(model, "count to two") == ANSWER
