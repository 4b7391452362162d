"""OpenAIAPI against a real local HTTP server: answers, retries, timeouts, keys, slots."""

from __future__ import annotations

import asyncio
import dataclasses
import socket
from typing import Any

import pytest

from orchestra.errors import ModelError
from orchestra.models.openai_api import OpenAIAPI
from orchestra.requests import GenRequest, LoglikRequest


@pytest.fixture(autouse=True)
def _lock_dir(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORCHESTRA_LOCK_DIR", str(tmp_path / "locks"))


def make(server: Any, **kw: Any) -> OpenAIAPI:
    kw.setdefault("key_env", None)
    model = OpenAIAPI(abbr="m", path="test-model", base_url=server.base_url, **kw)
    # Short waits keep the tests quick; the policy's shape is what is under test.
    model.policy = dataclasses.replace(model.policy, backoff_base_s=0.01)
    return model


def run(model: OpenAIAPI, *coros: Any) -> list[Any]:
    async def main() -> list[Any]:
        try:
            return list(await asyncio.gather(*coros, return_exceptions=True))
        finally:
            await model.aclose()

    return asyncio.run(main())


def gen(prompt: Any, **kw: Any) -> GenRequest:
    return GenRequest(prompt=prompt, max_out_len=kw.pop("max_out_len", 32), **kw)


def test_chat_answers_and_counts(server: Any) -> None:
    model = make(server)
    out = run(model, model.generate(gen("what is 12 + 30")), model.generate(gen([
        {"role": "user", "content": "5 * 6"}, {"role": "assistant", "content": "30"},
        {"role": "user", "content": "plus 4"}])))
    assert out == ["42", "34"]
    st = server.stats()
    assert st["requests"] == 2 and st["by_status"] == {"200": 2}
    assert model.stats.done == 2 and model.stats.retries == 0 and model.stats.in_flight == 0


def test_system_prompt_and_settings_reach_the_body(server: Any) -> None:
    model = make(server, system_prompt="be brief", generation_kwargs={"frequency_penalty": 0.5, "temperature": 9})
    body = model.request_body(gen("hi", temperature=0.3, stop=("\n",), seed=3))
    assert body["messages"][0] == {"role": "system", "content": "be brief"}
    assert body["temperature"] == 0.3 and body["frequency_penalty"] == 0.5
    assert body["stop"] == ["\n"] and body["seed"] == 3 and body["max_tokens"] == 32
    assert run(model, model.generate(gen("say hello")))[0] == "HELLO"


def test_greedy_unseeded_requests_take_the_models_sampling_settings(server: Any) -> None:
    """As for local models (BaseModel.sampling): the model's generation_kwargs are the
    settings of a greedy, unseeded request; a request with its own sampling keeps it."""
    model = make(server, generation_kwargs={"temperature": 0.6, "top_p": 0.9, "seed": 5, "frequency_penalty": 0.5})
    default = model.request_body(gen("hi"))
    assert (default["temperature"], default["top_p"], default["seed"]) == (0.6, 0.9, 5)
    own = model.request_body(gen("hi", temperature=0.3))
    assert (own["temperature"], own["top_p"], "seed" in own) == (0.3, 1.0, False)
    assert default["frequency_penalty"] == own["frequency_penalty"] == 0.5
    plain = make(server).request_body(gen("hi"))
    assert (plain["temperature"], plain["top_p"], "seed" in plain) == (0.0, 1.0, False)


def test_a_request_without_max_out_len_gets_the_models(server: Any) -> None:
    """The test server cuts its answer to ``max_tokens`` characters: what it got is visible."""
    model = make(server, max_out_len=3, generation_kwargs={"max_tokens": 1000})
    assert model.request_body(GenRequest(prompt="say hello"))["max_tokens"] == 3
    assert run(model, model.generate(GenRequest(prompt="say hello")),
               model.generate(GenRequest(prompt="say hello", max_out_len=4))) == ["HEL", "HELL"]
    default = make(server)
    assert run(default, default.generate(GenRequest(prompt="say hello"))) == ["HELLO"]


def test_completions_endpoint_and_loglikelihood(server: Any) -> None:
    model = make(server, endpoint="completions")
    text, lls = run(model, model.generate(gen("7 - 10")),
                    model.loglikelihood(LoglikRequest(context="The capital is Paris. Answer:",
                                                      continuations=(" Rome", " Paris"))))
    assert text == "-3"
    assert lls[1] > lls[0]


def test_loglikelihood_counts_a_token_spanning_the_contexts_trailing_space(server: Any) -> None:
    """'Answer: ' + 'Paris' scores as 'Answer:' + ' Paris' (as HFCausalLM splits it): the space,
    one token of the test server, is the continuation's (it was dropped before)."""
    model = make(server, endpoint="completions")
    ctx = "The capital is Paris. Answer:"
    spaced, plain = run(model, model.loglikelihood(LoglikRequest(context=ctx + " ", continuations=("Rome", "Paris"))),
                        model.loglikelihood(LoglikRequest(context=ctx, continuations=(" Rome", " Paris"))))
    assert spaced == plain == [-5.0, -1.0]  # -1 per character; 0 for 'Paris', which the context holds


def test_loglikelihood_needs_the_completions_endpoint(server: Any) -> None:
    model = make(server)
    (err,) = run(model, model.loglikelihood(LoglikRequest(context="a", continuations=("b",))))
    assert isinstance(err, ModelError) and "endpoint='completions'" in str(err)


def test_400_fails_with_the_servers_message_and_is_not_retried(server: Any) -> None:
    model = make(server)
    (err,) = run(model, model.generate(gen("BAD_REQUEST please")))
    assert isinstance(err, ModelError)
    assert "HTTP 400" in str(err) and "contains BAD_REQUEST" in str(err)
    assert server.stats()["per_prompt"] == {"BAD_REQUEST please": 1}
    assert model.stats.errors == 1 and model.stats.retries == 0


def test_500s_are_retried_until_success(server: Any) -> None:
    server.configure(fail_first=2)
    model = make(server)
    assert run(model, model.generate(gen("1 + 1"))) == ["2"]
    assert server.stats()["per_prompt"] == {"1 + 1": 3}
    assert model.stats.retries == 2 and model.stats.errors == 0


def test_gives_up_after_max_retries(server: Any) -> None:
    server.configure(fail_first=10)
    model = make(server, max_retries=2)
    (err,) = run(model, model.generate(gen("1 + 1")))
    assert isinstance(err, ModelError) and "gave up after 3 attempts" in str(err) and "HTTP 500" in str(err)
    assert server.stats()["per_prompt"] == {"1 + 1": 3}
    assert model.stats.errors == 1


def test_429_is_retried_after_retry_after_and_slows_the_rate(server: Any) -> None:
    server.configure(rate=2.0, burst=1.0)
    model = make(server)
    out = run(model, model.generate(gen("#1: 1 + 1")), model.generate(gen("#2: 2 + 2")))
    assert out == ["2", "4"]
    st = server.stats()
    assert st["by_status"].get("429", 0) >= 1 and st["by_status"]["200"] == 2
    assert model.stats.rate_limited == st["by_status"]["429"]
    assert model.rate.adjustments >= 1 and "rate_limit_rps" in model.stats.extra
    # The retry came no earlier than the server asked (retry-after-ms: until the next token).
    log = st["log"]
    first_429 = next(t for t, _, status in log if status == 429)
    assert all(t >= first_429 + 0.4 for t, _, status in log if status == 200 and t > first_429)


def test_attempt_timeout_is_retried_then_fails(server: Any) -> None:
    model = make(server, attempt_timeout_s=0.2, max_retries=1)
    (err,) = run(model, model.generate(gen("HANG_FOREVER")))
    assert isinstance(err, ModelError) and "timed out" in str(err)
    assert server.stats()["per_prompt"] == {"HANG_FOREVER": 2}


def test_total_timeout_bounds_all_attempts(server: Any) -> None:
    model = make(server, attempt_timeout_s=0.2, timeout_s=0.5, max_retries=50)
    (err,) = run(model, model.generate(gen("HANG_FOREVER")))
    assert isinstance(err, ModelError) and "timed out" in str(err)
    assert 1 <= server.stats()["per_prompt"]["HANG_FOREVER"] <= 3


def test_connection_refused_is_retried_then_fails() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again before the model connects
    model = OpenAIAPI(abbr="m", path="x", base_url=f"http://127.0.0.1:{port}/v1", key_env=None, max_retries=2)
    model.policy = dataclasses.replace(model.policy, backoff_base_s=0.01)
    (err,) = run(model, model.generate(gen("1 + 1")))
    assert isinstance(err, ModelError) and "gave up after 3 attempts" in str(err)
    assert model.stats.retries == 2


def test_key_is_sent_and_never_shown(server: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    secret = "sk-test-0123456789abcdef"
    server.configure(api_key=secret)
    monkeypatch.setenv("ORCHESTRA_TEST_KEY", secret)
    model = make(server, key_env="ORCHESTRA_TEST_KEY")
    assert run(model, model.generate(gen("2 * 21"))) == ["42"]
    assert secret not in repr(model) and secret not in str(vars(model))
    # A server that echoes the key it got (as some do in their 401 message): scrubbed.
    server.configure(api_key="sk-the-right-one")
    model = make(server, key_env="ORCHESTRA_TEST_KEY")
    (err,) = run(model, model.generate(gen("2 * 21")))
    assert isinstance(err, ModelError) and "HTTP 401" in str(err)
    assert secret not in str(err) and "***" in str(err)


def test_unset_key_env_is_named_on_401(server: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    server.configure(api_key="sk-needed")
    monkeypatch.delenv("ORCHESTRA_UNSET_KEY", raising=False)
    model = make(server, key_env="ORCHESTRA_UNSET_KEY")
    (err,) = run(model, model.generate(gen("1 + 1")))
    assert isinstance(err, ModelError) and "ORCHESTRA_UNSET_KEY is not set" in str(err)


def test_the_slot_is_not_held_while_backing_off(server: Any) -> None:
    server.configure(latency_s=0.05)
    model = make(server, max_connections=1)
    model.policy = dataclasses.replace(model.policy, backoff_base_s=0.6, quick_retries=0)

    async def later() -> str:
        await asyncio.sleep(0.02)
        return await model.generate(gen("B: 2 + 2"))

    assert run(model, model.generate(gen("A FAIL_ONCE: 1 + 1")), later()) == ["2", "4"]
    order = [(key[:1], status) for _, key, status in server.stats()["log"]]
    # B is served while A waits to retry; holding the slot would give A500, A200, B200.
    assert order == [("A", 500), ("B", 200), ("A", 200)]
    assert server.stats()["peak_concurrency"] == 1


def test_a_retry_at_once_goes_before_requests_waiting_for_a_slot(server: Any) -> None:
    """A sample whose first request got a 500 on a healthy endpoint is retried in the slot it
    held, before the next sample's first request (issue 40: queued behind first attempts, the
    retry of a sample that already waited came a round trip later).  Once the endpoint keeps
    failing, a 500 backs off and the slot goes to the request waiting for it."""
    server.configure(latency_s=0.05)
    model = make(server, max_connections=1)

    async def later(prompt: str) -> str:
        await asyncio.sleep(0.02)  # queued for the slot while A's first request is in flight
        return await model.generate(gen(prompt))

    assert run(model, model.generate(gen("A FAIL_ONCE: 1 + 1")), later("B: 2 + 2")) == ["2", "4"]
    order = [(key[:1], status) for _, key, status in server.stats()["log"]]
    assert order == [("A", 500), ("A", 200), ("B", 200)]
    assert server.stats()["peak_concurrency"] == 1 and model.stats.retries == 1

    server.configure(latency_s=0.05, fail_first=1)  # every prompt's first request: a 500
    model = make(server, max_connections=1, max_retries=0)
    run(model, *(model.generate(gen(f"#{i}: {i} + 1")) for i in range(10)))
    assert not model.rate.healthy()
    server.reset()
    model.policy = dataclasses.replace(model.policy, max_retries=8)
    assert run(model, model.generate(gen("C: 3 + 3")), later("D: 4 + 4")) == ["6", "8"]
    order = [(key[:1], status) for _, key, status in server.stats()["log"]]
    assert order == [("C", 500), ("D", 500), ("C", 200), ("D", 200)]


def test_max_connections_bounds_requests_in_flight(server: Any) -> None:
    server.configure(latency_s=0.05)
    model = make(server, max_connections=3)
    out = run(model, *(model.generate(gen(f"#{i}: {i} + 1")) for i in range(20)))
    assert out == [str(i + 1) for i in range(20)]
    assert server.stats()["peak_concurrency"] == 3


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"endpoint": "responses"}, "endpoint must be one of"),
    ({"base_url": "localhost:8000"}, "must start with http"),
    ({"max_connections": 0}, "max_connections"),
    ({"rate_limit": 0}, "rate_limit"),
    ({"path": ""}, "path"),
])
def test_constructor_rejects_bad_settings(kwargs: dict[str, Any], message: str) -> None:
    args: dict[str, Any] = {"abbr": "m", "path": "x", "key_env": None, **kwargs}
    with pytest.raises(ValueError, match=message):
        OpenAIAPI(**args)


def test_one_model_serves_several_event_loops(server: Any) -> None:
    """A warm worker keeps the model and runs one ``asyncio.run`` per task."""
    server.configure(rate=1000.0, burst=2.0)
    model = make(server, max_connections=2)
    for loop_no in range(3):
        out = run(model, *(model.generate(gen(f"L{loop_no}-{i}: {i} + {loop_no}")) for i in range(6)))
        assert out == [str(i + loop_no) for i in range(6)]
    assert server.stats()["by_status"]["200"] == 18


def test_scrubber_hides_escaped_echoes_of_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """Regression (issue 15.13): a JSON- or URL-escaped echo of the key slipped through."""
    import json as _json
    import urllib.parse

    key = 'sk-te/st+k"ey 01%'
    monkeypatch.setenv("X_SCRUB_KEY", key)
    model = OpenAIAPI(abbr="m", path="m", base_url="http://127.0.0.1:9/v1", key_env="X_SCRUB_KEY")
    echoes = [key, _json.dumps({"k": key})[7:-2], _json.dumps(key).replace("/", "\\/"),
              urllib.parse.quote(key, safe=""), urllib.parse.quote_plus(key), urllib.parse.quote(key, safe="").lower()]
    for echo in echoes:
        out = model._scrub(f"server said: bad key {echo}!")
        assert "***" in out and echo not in out, (echo, out)


def test_the_first_500s_are_retried_at_once_and_a_third_backs_off(server: Any) -> None:
    """A lone 500 costs one more round trip, not a backoff: with a 10-minute backoff the
    sample still gets its 200 after two 500s (it would wait 5-10 minutes if a retry backed
    off); a third 500 of the same request backs off, which a 5 s ``timeout_s`` cannot cover."""
    server.configure(fail_first=2)
    model = make(server, timeout_s=5.0)
    model.policy = dataclasses.replace(model.policy, backoff_base_s=600.0)
    assert run(model, model.generate(gen("1 + 1"))) == ["2"]
    assert server.stats()["per_prompt"] == {"1 + 1": 3}
    assert model.stats.retries == 2 and model.stats.errors == 0

    server.configure(fail_first=3)
    model = make(server, timeout_s=5.0)
    model.policy = dataclasses.replace(model.policy, backoff_base_s=600.0)
    (err,) = run(model, model.generate(gen("2 + 2")))
    assert isinstance(err, ModelError) and "gave up after 3 attempts: timeout_s=5" in str(err), err
    assert server.stats()["per_prompt"]["2 + 2"] == 3


def test_an_endpoint_that_keeps_failing_is_backed_off_from_the_first_error(server: Any) -> None:
    """Once most recent answers were errors, a request's first 500 backs off too (past ``timeout_s``
    here); so does every error with ``quick_retries=0``."""
    server.configure(fail_first=100)
    model = make(server, timeout_s=5.0, max_retries=0)
    run(model, *(model.generate(gen(f"#{i}: {i} + 1")) for i in range(10)))  # ten answers, all 500
    assert not model.rate.healthy()
    model.policy = dataclasses.replace(model.policy, backoff_base_s=600.0, max_retries=8)
    (err,) = run(model, model.generate(gen("3 + 3")))
    assert isinstance(err, ModelError) and "gave up after 1 attempts" in str(err), err

    server.configure(fail_first=1)
    model = make(server, timeout_s=5.0)
    model.policy = dataclasses.replace(model.policy, backoff_base_s=600.0, quick_retries=0)
    (err,) = run(model, model.generate(gen("4 + 4")))
    assert isinstance(err, ModelError) and "gave up after 1 attempts" in str(err), err
