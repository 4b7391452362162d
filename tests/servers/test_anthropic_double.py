"""The Anthropic double speaks the documented Messages + Message Batches contract: the official
``anthropic`` SDK, validating every answer strictly, drives it."""

from __future__ import annotations

import time
from typing import Any

import anthropic
import pytest


def client(srv: Any) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=srv.base_url.removesuffix("/v1"), api_key="sk-ant-test", max_retries=0,
                               _strict_response_validation=True)


def req(cid: str, prompt: str, **extra: Any) -> Any:
    return {"custom_id": cid, "params": {"model": "claude-test", "max_tokens": 16,
                                         "messages": [{"role": "user", "content": prompt}], **extra}}


def wait(c: anthropic.Anthropic, batch_id: str, timeout: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        b = c.messages.batches.retrieve(batch_id)
        if b.processing_status == "ended" or time.monotonic() > deadline:
            return b
        time.sleep(0.05)


def test_messages_and_strictness(anthropic_server: Any) -> None:
    c = client(anthropic_server)
    m = c.messages.create(model="claude-test", max_tokens=16, system="be brief",
                          messages=[{"role": "user", "content": "what is 20 + 22"}])
    assert m.content[0].type == "text" and m.content[0].text == "42" and m.usage.output_tokens == 2
    with pytest.raises(anthropic.BadRequestError, match="seed: Extra inputs are not permitted"):
        c.messages.create(model="claude-test", max_tokens=16, messages=[{"role": "user", "content": "x"}],
                          extra_body={"seed": 1})


def test_batch_results_shuffled_errors_and_pages(anthropic_server: Any) -> None:
    c = client(anthropic_server)
    reqs = [req(f"r{i}", f"{i} + {i}") for i in range(30)] + [req("bad", "hi", seed=3),
                                                              req("flaky", "ROW_500_ONCE 1 + 1")]
    b = c.messages.batches.create(requests=reqs)
    assert b.processing_status == "in_progress" and b.request_counts.processing == 32
    b = wait(c, b.id)
    assert b.request_counts.succeeded == 30 and b.request_counts.errored == 2 and b.results_url
    results = list(c.messages.batches.results(b.id))
    ids = [r.custom_id for r in results]
    assert sorted(ids) == sorted(r["custom_id"] for r in reqs) and ids != [r["custom_id"] for r in reqs]
    by_id = {r.custom_id: r.result for r in results}
    assert by_id["r7"].type == "succeeded" and by_id["r7"].message.content[0].text == "14"  # type: ignore[union-attr]
    assert by_id["bad"].type == "errored" and by_id["bad"].error.error.type == "invalid_request_error"  # type: ignore[union-attr]
    assert by_id["flaky"].type == "errored" and by_id["flaky"].error.error.type == "api_error"  # type: ignore[union-attr]
    with pytest.raises(anthropic.BadRequestError, match="duplicate"):
        c.messages.batches.create(requests=[req("x", "1"), req("x", "2")])
    made = [c.messages.batches.create(requests=[req("a", "1 + 1")]).id for _ in range(3)]
    page = c.messages.batches.list(limit=2)
    assert [x.id for x in page.data] == made[::-1][:2] and page.has_more
    assert [x.id for x in c.messages.batches.list(limit=2)][:3] == made[::-1]


def test_expiry_and_cancel(anthropic_server: Any) -> None:
    c = client(anthropic_server)
    anthropic_server.configure(expire_after=1)
    b = wait(c, c.messages.batches.create(requests=[req("a", "1 + 1"), req("b", "2 + 2")]).id)
    kinds = sorted(r.result.type for r in c.messages.batches.results(b.id))
    assert kinds == ["expired", "succeeded"] and b.request_counts.expired == 1
    anthropic_server.configure(expire_after=None, turnaround_s=30.0)
    b = c.messages.batches.create(requests=[req("a", "1 + 1")])
    assert c.messages.batches.cancel(b.id).processing_status == "canceling"
    b = wait(c, b.id)
    assert b.processing_status == "ended" and b.request_counts.canceled == 1 and b.cancel_initiated_at
