"""The batch double speaks OpenAI's documented Files + Batches contract: the official ``openai``
SDK, validating every answer strictly, drives it; where the service is strict, so is the double."""

from __future__ import annotations

import io
import json
import time
from typing import Any

import openai
import pytest


def client(srv: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.base_url, api_key="sk-test", max_retries=0, _strict_response_validation=True)


def rows(*prompts: str, url: str = "/v1/chat/completions") -> bytes:
    return "".join(json.dumps({"custom_id": f"r{i}", "method": "POST", "url": url,
                               "body": {"model": "m", "messages": [{"role": "user", "content": p}],
                                        "max_tokens": 8}}) + "\n" for i, p in enumerate(prompts)).encode()


def wait(c: openai.OpenAI, batch_id: str, until: tuple[str, ...], timeout: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        b = c.batches.retrieve(batch_id)
        if b.status in until or time.monotonic() > deadline:
            return b
        time.sleep(0.05)


def test_plain_batch_through_the_sdk_with_shuffled_output(batch_server: Any) -> None:
    c = client(batch_server)
    prompts = [f"{i} + {i}" for i in range(40)]
    f = c.files.create(file=("in.jsonl", io.BytesIO(rows(*prompts))), purpose="batch")
    assert f.purpose == "batch" and f.filename == "in.jsonl"
    b = c.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h",
                         metadata={"run": "r1", "task": "t1"})
    assert b.status == "validating" and b.metadata == {"run": "r1", "task": "t1"}
    b = wait(c, b.id, ("completed",))
    assert b.status == "completed" and b.request_counts is not None and b.request_counts.completed == 40
    assert b.output_file_id is not None and b.error_file_id is None
    out = [json.loads(line) for line in c.files.content(b.output_file_id).text.splitlines()]
    ids = [r["custom_id"] for r in out]
    assert sorted(ids) == sorted(f"r{i}" for i in range(40)) and ids != [f"r{i}" for i in range(40)]
    by_id = {r["custom_id"]: r["response"] for r in out}
    assert by_id["r7"]["status_code"] == 200 and by_id["r7"]["body"]["choices"][0]["message"]["content"] == "14"


def test_strict_where_the_service_is(batch_server: Any) -> None:
    c = client(batch_server)
    with pytest.raises(openai.BadRequestError, match="jsonl"):
        c.files.create(file=("in.json", io.BytesIO(rows("1 + 1"))), purpose="batch")
    f = c.files.create(file=("in.jsonl", io.BytesIO(rows("1 + 1"))), purpose="batch")
    with pytest.raises(openai.BadRequestError, match="Unrecognized request argument supplied: priority"):
        c.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h",
                         extra_body={"priority": "high"})
    bad = c.files.create(file=("in.jsonl", io.BytesIO(rows("1 + 1", url="/v1/completions"))), purpose="batch")
    b = wait(c, c.batches.create(input_file_id=bad.id, endpoint="/v1/chat/completions",
                                 completion_window="24h").id, ("failed",))
    assert b.status == "failed" and b.errors is not None and b.errors.data is not None
    assert b.errors.data[0].code == "mismatched_endpoint"


def test_row_errors_expiry_and_token_limit(batch_server: Any) -> None:
    c = client(batch_server)
    body = json.dumps({"custom_id": "x", "method": "POST", "url": "/v1/chat/completions",
                       "body": {"model": "m", "messages": [{"role": "user", "content": "hi"}], "colour": 1}})
    f = c.files.create(file=("in.jsonl", io.BytesIO((body + "\n").encode() + rows("ROW_500_ONCE 1 + 1"))),
                       purpose="batch")
    b = wait(c, c.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h").id,
             ("completed",))
    assert b.error_file_id is not None
    errs = {r["custom_id"]: r for r in map(json.loads, c.files.content(b.error_file_id).text.splitlines())}
    assert errs["x"]["response"]["status_code"] == 400 and "colour" in errs["x"]["response"]["body"]["error"]["message"]
    assert errs["r0"]["response"]["status_code"] == 500
    batch_server.configure(expire_after=2)
    f = c.files.create(file=("in.jsonl", io.BytesIO(rows("1 + 1", "2 + 2", "3 + 3"))), purpose="batch")
    b = wait(c, c.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h").id,
             ("expired",))
    assert b.status == "expired" and b.request_counts is not None and b.request_counts.completed == 2
    assert b.error_file_id is not None
    expired = [json.loads(x) for x in c.files.content(b.error_file_id).text.splitlines()]
    assert [e["error"]["code"] for e in expired] == ["batch_expired"]
    batch_server.configure(expire_after=None)
    f = c.files.create(file=("in.jsonl", io.BytesIO(rows("TOKEN_LIMIT_ONCE 1 + 1"))), purpose="batch")
    b = c.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
    time.sleep(0.1)
    got = c.batches.retrieve(b.id)  # the failure shows only once the batch is retrieved
    assert got.status == "failed" and got.errors is not None and got.errors.data is not None
    assert got.errors.data[0].code == "token_limit_exceeded"


def test_list_pages_and_cancel(batch_server: Any) -> None:
    batch_server.configure(turnaround_s=5.0, cancel_delay_s=0.1)
    c = client(batch_server)
    f = c.files.create(file=("in.jsonl", io.BytesIO(rows("1 + 1"))), purpose="batch")
    made = [c.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h",
                             metadata={"n": str(i)}).id for i in range(5)]
    page = c.batches.list(limit=2)
    assert [b.id for b in page.data] == made[::-1][:2] and page.has_more
    assert [b.id for b in c.batches.list(limit=2)] == made[::-1]  # the SDK follows `after` across pages
    b = c.batches.cancel(made[0])
    assert b.status == "cancelling"
    assert wait(c, made[0], ("cancelled",)).status == "cancelled"
    assert batch_server.stats().cancelled == [made[0]]
