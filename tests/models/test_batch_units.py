"""Unit tests of batch mode's pieces: the option's validation, row rules, stable ids, the ledger."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest

from orchestra.models.base import SampleTag, current_sample
from orchestra.models.batch_ledger import BatchLedger
from orchestra.models.batch_rows import BatchOptions, custom_id, row_outcome
from orchestra.models.openai_api import OpenAIAPI


@pytest.mark.parametrize(("value", "message"), [
    (dict(size=50_001), "batch.size must be an integer in [1, 50000]"),
    (dict(size=True), "batch.size must be an integer"),
    (dict(poll_s=0), "batch.poll_s must be a number of seconds > 0"),
    (dict(flush_s=-1), "batch.flush_s must be a number of seconds > 0"),
    (dict(max_bytes=300 * 1024 * 1024), "batch.max_bytes must be an integer in [1, 209715200]"),
    ("yes", "batch must be True, False or a dict"),
])
def test_bad_batch_options_name_the_key(value: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        OpenAIAPI(abbr="m", path="p", batch=value)


def test_batch_options_defaults_and_speed_key() -> None:
    assert BatchOptions.parse(True) == BatchOptions() and BatchOptions.parse(False) is None
    assert BatchOptions.parse(dict(size=10)).size == 10  # type: ignore[union-attr]
    # batch mode changes the price and the path, not the answers: earlier predictions are reused
    assert OpenAIAPI.identity(dict(path="p", batch=True)) == OpenAIAPI.identity(dict(path="p"))
    assert OpenAIAPI(abbr="m", path="p", batch=dict(max_requests_in_flight=7)).max_concurrency() == 7


def test_row_outcomes() -> None:
    ok = {"custom_id": "a", "response": {"status_code": 200, "body": {"choices": []}}, "error": None}
    assert row_outcome(ok, "") == ("ok", {"choices": []})
    for status, kind in ((429, "retry"), (500, "retry"), (503, "retry"), (400, "fail"), (404, "fail")):
        row = {"response": {"status_code": status, "body": {"error": {"message": "msg"}}}}
        assert row_outcome(row, "") == (kind, f"HTTP {status}: msg")
    expired = {"response": None, "error": {"code": "batch_expired", "message": "late"}}
    assert row_outcome(expired, "") == ("retry", "batch_expired: late")
    assert row_outcome(None, "the batch failed") == ("retry", "the batch failed")


def test_custom_ids_are_stable_per_sample_and_call() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}

    async def ids(sample: int, calls: int) -> list[str]:
        current_sample.set(SampleTag(sample))
        return [custom_id("/chat/completions", body) for _ in range(calls)]

    first, again, other = (asyncio.run(ids(*a)) for a in ((3, 2), (3, 2), (4, 1)))
    assert first == again and first[0] != first[1] and other[0] not in first
    assert all(len(c) <= 64 and c.replace("-", "").isalnum() for c in first)


def test_ledger_folds_lines_and_skips_a_torn_one(tmp_path: Path) -> None:
    ledger = BatchLedger(str(tmp_path / "batches" / "m.jsonl"))
    ledger.record("submitting", "k1", task_id="t", file_id="f1", custom_ids=["a", "b"])
    ledger.record("created", "k1", batch_id="batch_1")
    ledger.record("submitting", "k2", task_id="t", file_id="f2", custom_ids=["c"])
    with open(ledger.path, "ab") as f:
        f.write(b'{"ts": 1, "state": "ended", "key": "k1", "bat')  # a SIGKILL mid-append
    recs = ledger.load()
    assert (recs["k1"].state, recs["k1"].batch_id, recs["k1"].custom_ids) == ("created", "batch_1", ["a", "b"])
    assert recs["k2"].state == "submitting"

    async def find(keys: set[str], since: float) -> dict[str, dict[str, Any]]:
        assert keys == {"k2"}
        return {}

    recs = asyncio.run(ledger.recover("t", find))
    assert recs["k2"].state == "not_created"
    ledger.record("ended", "k1", batch_id="batch_1", status="completed")  # appended after the torn bytes
    assert ledger.load()["k1"].state == "ended"
    assert os.path.getsize(ledger.path) > 0
