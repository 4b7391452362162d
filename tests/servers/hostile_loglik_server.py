"""A hostile scoring server: ``loglik_server.py`` (the real SmolLM2-135M, vLLM's echo format, the
key) whose replies are bent out of shape on request, for the tests that a malformed reply is refused.

    python tests/servers/hostile_loglik_server.py [--port 0]

prints ``PORT <n>`` once it listens on 127.0.0.1 and serves until killed.  The request's
``model`` field names what goes wrong with the honest reply (:data:`BENDS`); ``honest`` (or any
name not in it) leaves the reply as the model computed it.  The key is ``ORCHESTRA_SERVER_KEY``,
as for ``loglik_server.py``.
"""

from __future__ import annotations

import importlib.util
import math
import os
import sys
from collections.abc import Callable
from http.server import ThreadingHTTPServer
from typing import Any


def _load_honest() -> Any:
    """tests/servers/loglik_server.py as a module (tests/ is not a package); it loads the model."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "loglik_server.py")
    spec = importlib.util.spec_from_file_location("orchestra_test_loglik_server", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


HONEST = _load_honest()


def _set(key: str, make: Callable[[list[Any], str], Any]) -> Callable[[dict[str, Any]], None]:
    """A bend that replaces ``choice['logprobs'][key]`` by ``make(old value, echoed text)``."""
    def bend(choice: dict[str, Any]) -> None:
        choice["logprobs"][key] = make(choice["logprobs"][key], choice["text"])
    return bend


def _at(values: list[Any], i: int, value: Any) -> list[Any]:
    return [*values[:i], value, *values[i + 1:]]


#: model name -> what it does to ``choices[0]`` of an honest reply (a prompt of 4+ tokens)
BENDS: dict[str, Callable[[dict[str, Any]], None]] = {
    "offsets-short": _set("text_offset", lambda v, t: v[:-1]),
    "logprobs-short": _set("token_logprobs", lambda v, t: v[:-1]),
    "tokens-long": _set("tokens", lambda v, t: [*v, "!"]),
    "offsets-missing": _set("text_offset", lambda v, t: None),
    "offset-backwards": _set("text_offset", lambda v, t: _at(v, 2, v[1] - 1)),
    "offset-past-text": _set("text_offset", lambda v, t: _at(v, len(v) - 1, len(t) + 7)),
    "offset-negative": _set("text_offset", lambda v, t: _at(v, 0, -3)),
    "offset-not-integer": _set("text_offset", lambda v, t: _at(v, 2, v[2] + 0.5)),
    "offset-a-string": _set("text_offset", lambda v, t: _at(v, 2, str(v[2]))),
    "logprob-positive": _set("token_logprobs", lambda v, t: _at(v, len(v) - 1, 0.25)),
    "logprob-nan": _set("token_logprobs", lambda v, t: _at(v, len(v) - 1, math.nan)),
    "logprob-minus-infinity": _set("token_logprobs", lambda v, t: _at(v, len(v) - 1, -math.inf)),
    "logprob-a-string": _set("token_logprobs", lambda v, t: _at(v, len(v) - 1, str(v[-1]))),
    "logprob-huge-integer": _set("token_logprobs", lambda v, t: _at(v, len(v) - 1, -10 ** 400)),
    "logprob-true": _set("token_logprobs", lambda v, t: _at(v, len(v) - 1, True)),
    "logprob-none-inside": _set("token_logprobs", lambda v, t: _at(v, len(v) - 1, None)),
    "echo-of-another-prompt": lambda c: c.update(text="#" + c["text"][1:]),
    "echo-cut-short": lambda c: c.update(text=c["text"][:-3]),
    "echo-missing": lambda c: c.pop("text"),
}


def _last_top(make: Callable[[dict[str, Any], float, str], Any]) -> Callable[[dict[str, Any]], None]:
    """A bend of the last token's ``top_logprobs`` entry: ``make(entry, the token's log-probability,
    the token's text)`` replaces it (a request asking for ``logprobs`` >= 1)."""
    def bend(choice: dict[str, Any]) -> None:
        lp = choice["logprobs"]
        lp["top_logprobs"][-1] = make(lp["top_logprobs"][-1], lp["token_logprobs"][-1], lp["tokens"][-1])
    return bend


#: ``top_logprobs`` bends (is_greedy): the list, or the last token's entry
BENDS.update({
    "top-missing": _set("top_logprobs", lambda v, t: None),
    "top-short": _set("top_logprobs", lambda v, t: v[:-1]),
    "top-not-object": _last_top(lambda e, v, tok: [v]),
    "top-null-entry": _last_top(lambda e, v, tok: None),
    "top-empty": _last_top(lambda e, v, tok: {}),
    "top-too-many": _last_top(lambda e, v, tok: {**e, "zq1": -30.0, "zq2": -31.0, "zq3": -32.0}),
    "top-nan": _last_top(lambda e, v, tok: {k: math.nan for k in e}),
    "top-positive": _last_top(lambda e, v, tok: {k: 0.5 for k in e}),
    "top-a-string": _last_top(lambda e, v, tok: {k: str(x) for k, x in e.items()}),
    # the token's own value in its entry is not its log-probability
    "top-token-mismatch": _last_top(lambda e, v, tok: {**e, tok: v - 1.0}),
    # every "most likely" token less likely than the token itself, which is not among them
    "top-below-token": _last_top(lambda e, v, tok: {"zq": v - 1.0}),
})


def _one_token_more(choice: dict[str, Any]) -> None:
    """Not bent, but more than asked: a token generated after the echo (max_tokens 0 ignored)."""
    lp = choice["logprobs"]
    lp["tokens"].append(" Yes")
    lp["token_logprobs"].append(-0.5)
    lp["text_offset"].append(len(choice["text"]))
    choice["text"] += " Yes"


BENDS["one-token-more"] = _one_token_more


def _with_bos(choice: dict[str, Any]) -> None:
    """Not bent: the reply vLLM gives for a model that starts each prompt with a BOS token."""
    with HONEST.LOCK:
        HONEST.LM.apply_threads()
        choice["logprobs"] = HONEST.echo_logprobs(choice["text"], bos=True)


BENDS["vllm-bos"] = _with_bos


class Handler(HONEST.Handler):  # type: ignore[name-defined,misc]
    """loglik_server's handler; a 200 scoring reply is bent as its request's ``model`` asks."""

    def _answer(self, status: int, body: dict[str, Any]) -> None:
        bend = BENDS.get(str(body.get("model"))) if status == 200 and "choices" in body else None
        if bend is not None:
            bend(body["choices"][0])
        super()._answer(status, body)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the http.server name
        pass


def main() -> None:
    port = int(sys.argv[sys.argv.index("--port") + 1]) if "--port" in sys.argv else 0
    HONEST.torch.set_num_threads(1)
    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    print(f"PORT {server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
