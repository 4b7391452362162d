"""OpenAIAPI's log-likelihoods from a scoring server that lies about the shape of its reply.

The server is ``tests/servers/hostile_loglik_server.py``: the real SmolLM2-135M scoring the
prompt in vLLM's echo format, its reply bent as the request's model name asks (lengths that
disagree, offsets that go back or past the echoed text, log-probabilities that are not finite
numbers <= 0, an echo that is not the prompt, ``top_logprobs`` missing or not adding up for an
``is_greedy`` request).  Each bent reply must fail the request with a
:class:`ModelError` naming the field, never become a number; an honest reply scores as before.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestra.errors import ModelError
from orchestra.models.openai_api import OpenAIAPI
from orchestra.requests import LoglikRequest

pytestmark = pytest.mark.slow

SERVER = Path(__file__).resolve().parents[1] / "servers" / "hostile_loglik_server.py"
KEY = "hostile-test-key-0123456789"
CONTEXT = "Question: What is the capital of France?\nAnswer:"


@pytest.fixture(scope="module")
def base_url() -> Iterator[str]:
    """The hostile server on 127.0.0.1, one process for the module (the model loads once)."""
    env = {**os.environ, "ORCHESTRA_SERVER_KEY": KEY}
    proc = subprocess.Popen([sys.executable, str(SERVER), "--port", "0"], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, env=env, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # the model loads first (~10 s); a dead server ends the read
        assert line.startswith("PORT "), f"server said {line!r}, exit {proc.poll()}"
        yield f"http://127.0.0.1:{int(line.split()[1])}/v1"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def scores(base_url: str, bend: str, context: str, continuations: tuple[str, ...],
           monkeypatch: pytest.MonkeyPatch, greedy: bool = False) -> list[Any]:
    """The model's log-likelihoods (``(log-likelihood, is greedy)`` pairs if ``greedy``), or the
    error, for one request to the server bent by ``bend``."""
    monkeypatch.setenv("HOSTILE_KEY", KEY)
    model = OpenAIAPI(abbr="m", path=bend, base_url=base_url, endpoint="completions", key_env="HOSTILE_KEY",
                      max_retries=0)

    async def main() -> list[Any]:
        try:
            request = LoglikRequest(context=context, continuations=continuations)
            call = model.loglikelihood_greedy(request) if greedy else model.loglikelihood(request)
            return list(await asyncio.gather(call, return_exceptions=True))
        finally:
            await model.aclose()

    (out,) = asyncio.run(main())
    return out if isinstance(out, BaseException) else list(out)


def raw_reply(base_url: str, prompt: str, model: str = "honest", logprobs: int = 0) -> dict[str, Any]:
    """The reply to ``prompt`` (honest unless ``model`` bends it), fetched without orchestra."""
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": 0, "echo": True,
                       "logprobs": logprobs}).encode()
    req = urllib.request.Request(base_url + "/completions", data=body, headers={
        "Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        return dict(json.load(resp))


def reference(reply: dict[str, Any], prompt: str, context: str) -> float:
    """The rule as written before the checks: the log-probabilities of the tokens that end after
    the context (its trailing whitespace left out); a token ends where the next one starts."""
    lp = reply["choices"][0]["logprobs"]
    ends = [*lp["text_offset"][1:], len(prompt)]
    return sum(v for end, v in zip(ends, lp["token_logprobs"]) if end > len(context.rstrip()) and v is not None)


#: bend -> what the error must name
BENT = {
    "offsets-short": "logprobs.text_offset",
    "logprobs-short": "logprobs.token_logprobs",
    "tokens-long": "logprobs.tokens",
    "offsets-missing": "logprobs.text_offset",
    "offset-backwards": "logprobs.text_offset[2]",
    "offset-past-text": "logprobs.text_offset[",
    "offset-negative": "logprobs.text_offset[0]",
    "offset-not-integer": "logprobs.text_offset[2]",
    "offset-a-string": "logprobs.text_offset[2]",
    "logprob-positive": "logprobs.token_logprobs[",
    "logprob-nan": "logprobs.token_logprobs[",
    "logprob-minus-infinity": "logprobs.token_logprobs[",
    "logprob-a-string": "logprobs.token_logprobs[",
    "logprob-huge-integer": "logprobs.token_logprobs[",  # float() of it overflowed: a traceback, not an error
    "logprob-true": "logprobs.token_logprobs[",
    "logprob-none-inside": "logprobs.token_logprobs[",
    "echo-of-another-prompt": "choices[0].text",
    "echo-cut-short": "choices[0].text",
    "echo-missing": "choices[0].text",
}


@pytest.mark.parametrize("bend", sorted(BENT))
def test_a_bent_reply_fails_the_request_naming_the_field(base_url: str, bend: str,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    out = scores(base_url, bend, CONTEXT, (" Paris",), monkeypatch)
    assert isinstance(out, ModelError), f"{bend}: scored {out!r} instead of failing"
    text = str(out)
    assert BENT[bend] in text and "\n" not in text and KEY not in text, text
    assert text.startswith("model m: refused the scoring reply of /completions: "), text


def test_an_honest_reply_scores_as_before(base_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    continuations = (" Paris", " Rome", " the moon")
    got = scores(base_url, "honest", CONTEXT, continuations, monkeypatch)
    assert not isinstance(got, BaseException), got
    want = [reference(raw_reply(base_url, CONTEXT + c), CONTEXT + c, CONTEXT) for c in continuations]
    assert got == pytest.approx(want, abs=1e-9) and all(v < 0 for v in got), (got, want)
    assert got[0] > got[1] and got[0] > got[2]  # the real model knows its capitals
    spaced = scores(base_url, "honest", CONTEXT + " ", tuple(c[1:] for c in continuations), monkeypatch)
    assert spaced == pytest.approx(got, abs=1e-9)  # 'Answer: ' + 'Paris' is 'Answer:' + ' Paris'
    # a token the server generated after the echo (it ignored max_tokens 0) is not the prompt's
    assert scores(base_url, "one-token-more", CONTEXT, continuations, monkeypatch) == pytest.approx(got, abs=1e-9)


def test_vllm_echo_of_a_bos_token_scores_the_continuation(base_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM echoes a BOS token first and counts its length in every later offset, though the text
    does not hold it: that honest reply was refused (an offset past the echoed text).  The score
    must be the sum over the tokens past the context's, counted by tokens as lm-eval does."""
    continuations = (" Paris", " Rome", " the moon")
    got = scores(base_url, "vllm-bos", CONTEXT, continuations, monkeypatch)
    assert not isinstance(got, BaseException), got
    context_tokens = raw_reply(base_url, CONTEXT, "vllm-bos")["choices"][0]["logprobs"]["tokens"]
    want = []
    for c in continuations:
        lp = raw_reply(base_url, CONTEXT + c, "vllm-bos")["choices"][0]["logprobs"]
        assert lp["tokens"][0] == "<|im_start|>" and lp["tokens"][:len(context_tokens)] == context_tokens
        assert lp["text_offset"][-1] > len(CONTEXT + c) - len(lp["tokens"][-1])  # offsets run past the text
        want.append(sum(lp["token_logprobs"][len(context_tokens):]))
    assert got == pytest.approx(want, abs=1e-9) and got[0] > got[1] and got[0] > got[2], (got, want)


#: top_logprobs bend -> what the error of an is_greedy request must name
BENT_TOP = {
    "top-missing": "logprobs.top_logprobs is NoneType",
    "top-short": "logprobs.top_logprobs has",
    "top-not-object": "logprobs.top_logprobs[",
    "top-null-entry": "logprobs.top_logprobs[",
    "top-empty": "logprobs.top_logprobs[",
    "top-too-many": "entries for logprobs=1",
    "top-nan": "not a finite number",
    "top-positive": "not a finite number",
    "top-a-string": "not a finite number",
    "top-token-mismatch": "logprobs.top_logprobs[",
    "top-below-token": "is above every value of logprobs.top_logprobs[",
}


@pytest.mark.parametrize("bend", sorted(BENT_TOP))
def test_a_bent_top_logprobs_fails_the_is_greedy_request(base_url: str, bend: str,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A reply to an is_greedy request whose ``top_logprobs`` are missing or do not add up fails the
    request naming the field, never a silent True or False."""
    out = scores(base_url, bend, CONTEXT, (" Paris",), monkeypatch, greedy=True)
    assert isinstance(out, ModelError), f"{bend}: answered {out!r} instead of failing"
    text = str(out)
    assert BENT_TOP[bend] in text and "\n" not in text and KEY not in text, text
    assert text.startswith("model m: refused the scoring reply of /completions: "), text


def test_an_honest_reply_tells_is_greedy_as_lm_eval_does(base_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``is_greedy`` is lm-eval's rule over the continuation's tokens (each one's log-probability
    is the largest of its top_logprobs entry), asked with ``logprobs=1``; the log-likelihoods are
    those of the plain request."""
    context, continuations = "one two three four five six seven eight nine", (" ten", " eleven", " Paris")
    got = scores(base_url, "honest", context, continuations, monkeypatch, greedy=True)
    assert not isinstance(got, BaseException), got
    plain = scores(base_url, "honest", context, continuations, monkeypatch)
    assert [v for v, _ in got] == pytest.approx(plain, abs=1e-9)
    want = []
    n_context = len(raw_reply(base_url, context)["choices"][0]["logprobs"]["tokens"])
    for c in continuations:
        lp = raw_reply(base_url, context + c, logprobs=1)["choices"][0]["logprobs"]
        pairs = list(zip(lp["token_logprobs"], lp["top_logprobs"]))[n_context:]
        want.append(all(v == max(top.values()) for v, top in pairs))
    assert [g for _, g in got] == want and True in want and False in want, (got, want)
