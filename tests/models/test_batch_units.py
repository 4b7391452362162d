"""Unit tests of batch mode's pieces: the option's validation, row rules, stable ids, the ledger."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest

from orchestra.models.base import SampleTag, current_sample
from orchestra.models.batch.ledger import BatchLedger, BatchRecord
from orchestra.models.batch.openai import row_outcome
from orchestra.models.batch.options import BatchOptions
from orchestra.models.batch.rows import custom_id
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

    async def find(wanted: list[BatchRecord], taken: set[str]) -> dict[str, dict[str, Any]]:
        assert [r.key for r in wanted] == ["k2"] and taken == {"batch_1"}
        return {}

    recs = asyncio.run(ledger.recover("t", find))
    assert recs["k2"].state == "not_created"
    ledger.record("ended", "k1", batch_id="batch_1", status="completed")  # appended after the torn bytes
    assert ledger.load()["k1"].state == "ended"
    assert os.path.getsize(ledger.path) > 0


def test_spool_takes_live_owners_entries_once_and_drops_a_dead_owners(tmp_path: Path) -> None:
    """A real second process joins the spool, spools an entry and dies by SIGKILL: its lock is
    free, so the leader drops its entries unread; consumed nonces are never taken again."""
    import signal
    import subprocess
    import sys

    from orchestra.models.batch.spool import BatchSpool, cut

    code = ("import sys, time; from orchestra.models.batch.spool import BatchSpool; "
            "s = BatchSpool(sys.argv[1], 'dead-task'); s.open(); "
            "s.put([{'cid': 'd', 'path': '/p', 'body': {}, 'nonce': 'nd'}]); print('ok', flush=True); time.sleep(60)")
    child = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    assert child.stdout is not None and child.stdout.readline().strip() == "ok"
    me, other = BatchSpool(str(tmp_path), "task-a"), BatchSpool(str(tmp_path), "task-b")
    me.open()
    other.open()
    me.put([{"cid": "a1", "path": "/p", "body": {}, "nonce": "n1"},
            {"cid": "a2", "path": "/p", "body": {}, "nonce": "n2"}])
    other.put([{"cid": "b1", "path": "/p", "body": {}, "nonce": "n3"}])
    assert me.try_lead() and not other.try_lead()  # one leader at a time
    (child_owner,) = [n[:-6] for n in os.listdir(me.folder) if n.startswith(me.host + "~dead") and n.endswith(".owner")]
    assert me.alive(child_owner)
    assert sorted(e["cid"] for e in me.gather(set())) == ["a1", "a2", "b1", "d"]  # the child still lives
    child.send_signal(signal.SIGKILL)
    child.wait()
    assert not me.alive(child_owner)
    left = me.gather({"n1"})  # n1 went into a batch: never taken again; the dead owner's entry is gone
    assert sorted(e["cid"] for e in left) == ["a2", "b1"]
    assert [len(c) for c in cut(left, 8, 10**6, lambda c, p, b: b"x" * 10, 1.0, left[0]["ts"] + 0.5)] == []
    assert [len(c) for c in cut(left, 8, 10**6, lambda c, p, b: b"x" * 10, 1.0, left[0]["ts"] + 1.0)] == [2]
    assert [len(c) for c in cut(left, 1, 10**6, lambda c, p, b: b"x" * 10, 1.0, 0.0)] == [1, 1]  # full: at once
    me.unlead()
    assert other.try_lead()  # released: the next owner leads
    other.close()
    me.close()
    assert sorted(os.listdir(me.folder)) == ["lead.lock"]


def test_a_create_another_host_may_still_have_out_holds_back_this_tasks_rows(tmp_path: Path) -> None:
    """A ``submitting`` line of another host's leader, holding rows of this task: while its create
    call may still be out, the task waits (sending them now could pay twice); once it cannot be
    out any more, it is looked up by metadata and settled."""
    import time

    from orchestra.limits.retry import RetryPolicy
    from orchestra.models.base import ModelStats
    from orchestra.models.batch.batcher import Batcher
    from orchestra.models.batch.options import BatchOptions

    class Lookup:  # the provider's list of batches, empty: the create never made one
        asked: list[set[str]] = []

        @staticmethod
        def line(cid: str, path: str, body: dict[str, Any]) -> bytes:
            return b"{}\n"

        async def find(self, wanted: list[BatchRecord], taken: set[str]) -> dict[str, dict[str, Any]]:
            self.asked.append({r.key for r in wanted})
            return {}

    def batcher() -> Batcher:
        b = Batcher(BatchOptions(), Lookup(), RetryPolicy(attempt_timeout_s=5), ModelStats(),  # type: ignore[arg-type]
                          "m")
        b.bind(str(tmp_path / "batches" / "m.jsonl"), "run", "task-a", lambda event, **f: None)
        return b

    b = batcher()
    ledger = BatchLedger(str(tmp_path / "batches" / "m.jsonl"))
    ledger.record("submitting", "k1", task_id="task-b", owner="elsewhere~task-b.7.abcd",
                  custom_ids=[f"o1-s0-0-t{b._tag}"], nonces=["n"])

    async def recover(b: Batcher, wait_s: float) -> bool:
        try:
            await asyncio.wait_for(b._read_ledger(), wait_s)
            return True
        except asyncio.TimeoutError:
            return False

    assert not asyncio.run(recover(b, 1.5)) and Lookup.asked == []  # fresh: it may be out, wait
    b.spool.close()  # type: ignore[union-attr]
    lines = (tmp_path / "batches" / "m.jsonl").read_text().replace(f'"ts": {ledger.load()["k1"].ts}',
                                                                     f'"ts": {time.time() - 60}')
    (tmp_path / "batches" / "m.jsonl").write_text(lines)
    b = batcher()
    assert asyncio.run(recover(b, 5.0)) and Lookup.asked == [{"k1"}]
    assert ledger.load()["k1"].state == "not_created"
    b.spool.close()  # type: ignore[union-attr]


MALFORMED = {
    "no entries": {"ts": 1.0},
    "no ts": {"entries": []},
    "entries not a list": {"ts": 1.0, "entries": {"cid": "x"}},
    "ts a string": {"ts": "soon", "entries": []},
    "entry without nonce": {"ts": 1.0, "entries": [{"cid": "x", "path": "/p", "body": {}}]},
    "entry not an object": {"ts": 1.0, "entries": ["x"]},
    "body not an object": {"ts": 1.0, "entries": [{"cid": "x", "path": "/p", "body": "b", "nonce": "n"}]},
    "a list": [1, 2],
}


def test_malformed_spool_files_are_skipped_with_one_warning_and_never_crash_the_leader(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Valid JSON that is not what ``put`` writes (no entries, no ts, wrong types, planted keys), in
    the names of a live owner and of one killed by SIGKILL: the leader takes the good entries, names
    each bad file once on stderr, and deletes the dead owner's files."""
    import json
    import signal
    import subprocess
    import sys

    from orchestra.models.batch.spool import BatchSpool, cut

    code = ("import sys, time; from orchestra.models.batch.spool import BatchSpool; "
            "s = BatchSpool(sys.argv[1], 'dead-task'); s.open(); print(s.owner, flush=True); time.sleep(60)")
    child = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    try:
        assert child.stdout is not None
        dead = child.stdout.readline().strip()
        me, other = BatchSpool(str(tmp_path), "task-a"), BatchSpool(str(tmp_path), "task-b")
        me.open()
        other.open()
        assert me.try_lead()
        other.put([{"cid": "b1", "path": "/p", "body": {}, "nonce": "n1", "dup_nonces": "zz"}])
        bad = {}
        for i, (why, blob) in enumerate(MALFORMED.items()):
            for owner in (other.owner, dead):
                path = Path(me.folder) / f"{owner}.{900 + i:08d}.json"
                path.write_text(json.dumps(blob))
                bad[path] = why
        (Path(me.folder) / f"{other.owner}.{999:08d}.json").write_text("[" * 100_000)  # deeper than Python parses
        got = me.gather(set())
        assert [(e["cid"], e["nonce"], "dup_nonces" in e) for e in got] == [("b1", "n1", False)]
        assert [len(c) for c in cut(got, 1, 10**6, lambda c, p, b: b"x", 1.0, 0.0)] == [1]
        warned = [line for line in capsys.readouterr().err.splitlines() if "spool file" in line]
        assert len(warned) == len(MALFORMED) * 2 + 1 and all(" skipped: " in w for w in warned)
        assert me.gather(set()) == got and "spool file" not in capsys.readouterr().err  # once per file
        child.send_signal(signal.SIGKILL)
        child.wait()
        me.gather(set())  # the dead owner's files go, malformed or not; the live owner's stay
        assert {p: p.exists() for p in bad} == {p: dead not in p.name for p in bad}
        other.close()
        me.close()
        assert sorted(os.listdir(me.folder)) == ["lead.lock"]
    finally:
        child.kill()
        child.wait()


#: a batch ledger as main (before orchestra.journal) wrote it: the lines of a submit, an adoption by
#: metadata, a cancel the provider did not confirm, and a create that failed
OLD_BATCH_LEDGER = """\
{"ts": 1795925149.381, "state": "submitting", "key": "k-1", "task_id": "infer_m_t0", \
"owner": "host~infer_m_t0.123.ab12", "file_id": "file-abc", "custom_ids": ["c1", "c2"], "nonces": ["n1", "n2"]}
{"ts": 1795925149.384, "state": "created", "key": "k-1", "batch_id": "batch_1", "adopted_by_metadata": true}
{"ts": 1795925149.387, "state": "cancel_sent", "key": "k-1", "batch_id": "batch_1"}
{"ts": 1795925149.389, "state": "cancel_unconfirmed", "key": "k-1", "batch_id": "batch_1", \
"status": "unconfirmed (timed out)"}
{"ts": 1795925149.393, "state": "not_created", "key": "k-2", "custom_ids": ["c3"], "nonces": ["n3"], \
"error": "400 bad file"}
"""


def test_a_batch_ledger_written_before_the_journal_is_read_the_same(tmp_path: Path) -> None:
    """``-r`` of a run folder an earlier version wrote: the batches it paid for are known again."""
    path = tmp_path / "batches" / "m.jsonl"
    path.parent.mkdir()
    path.write_text(OLD_BATCH_LEDGER)
    ledger = BatchLedger(str(path))
    recs = ledger.load()
    assert recs["k-1"] == BatchRecord("k-1", "infer_m_t0", ["c1", "c2"], "file-abc", "batch_1", "cancel_unconfirmed",
                                      "unconfirmed (timed out)", 1795925149.389, ["n1", "n2"],
                                      "host~infer_m_t0.123.ab12")
    assert (recs["k-2"].state, recs["k-2"].custom_ids, recs["k-2"].batch_id) == ("not_created", ["c3"], "")
    lines, offset = ledger.tail(0)
    assert [(line["state"], line["key"]) for line in lines][-1] == ("not_created", "k-2") and len(lines) == 5
    ledger.record("cancelled", "k-1", batch_id="batch_1", status="cancelled")
    assert ledger.load()["k-1"].state == "cancelled" and [line["state"] for line in ledger.tail(offset)[0]] == [
        "cancelled"]
