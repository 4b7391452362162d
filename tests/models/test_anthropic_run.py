"""AnthropicAPI through ``run.py`` against the Messages + Message Batches double on 127.0.0.1:
direct calls, and batch mode (plain, shuffled results, expiry, a row error, an answered row repeated as
an error, Ctrl-C, SIGKILL + -r)."""

from __future__ import annotations

import importlib.util
import os
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

_spec = importlib.util.spec_from_file_location("orchestra_test_batch_run",
                                               os.path.join(os.path.dirname(__file__), "test_batch_run.py"))
assert _spec is not None and _spec.loader is not None
br = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(br)

BATCH = "dict(size=8, poll_s=0.2, flush_s=0.2)"


def config(tmp_path: Path, srv: Any, **kw: Any) -> Path:
    kw.setdefault("batch", BATCH)
    return br.write_config(tmp_path, srv.base_url, model="AnthropicAPI", **kw)


def test_direct_calls_with_the_key_in_its_header(tmp_path: Path, anthropic_server: Any) -> None:
    anthropic_server.configure(api_key=br.KEY)
    res = br.orchestra(config(tmp_path, anthropic_server, rows=10, batch="None",
                              extra=", system_prompt='be brief'"))
    assert res.returncode == 0, res.stderr
    run = br.the_run(tmp_path)
    assert br.score(run) == 1.0
    st = anthropic_server.stats()
    assert st.calls["POST /v1/messages"] == 10 and st.unauthorized == 0
    last = br.events(run, "progress")[-1]
    assert last["completion_tokens"] == sum(len(str(3 * i)) for i in range(10))
    for path in run.rglob("*"):
        if path.is_file():
            assert br.KEY.encode() not in path.read_bytes(), path


def test_batch_mode_plain_shuffled_and_counted(tmp_path: Path, anthropic_server: Any) -> None:
    anthropic_server.configure(api_key=br.KEY)
    res = br.orchestra(config(tmp_path, anthropic_server, rows=30, max_task_size=15))
    assert res.returncode == 0, res.stderr
    run = br.the_run(tmp_path)
    assert br.score(run) == 1.0  # every answer differs and the results come shuffled
    st = anthropic_server.stats()
    assert st.calls["POST /v1/messages"] == 0, "no direct call in batch mode"
    assert len(st.submitted) == 30 and set(st.submitted.values()) == {1}
    # the two tasks share batches of at most 8 (each task reads the batches holding its rows)
    sizes = sorted(e["requests"] for e in br.events(run, "batch_submitted"))
    assert sizes in ([6, 8, 8, 8], [7, 7, 8, 8]), sizes
    assert {e["status"] for e in br.events(run, "batch_ended")} == {"ended"}
    states = Counter(line["state"] for line in br.ledger(run))
    assert states["submitting"] == states["created"] == 4
    assert {ln["key"] for ln in br.ledger(run) if ln["state"] == "ended"} == {
        ln["key"] for ln in br.ledger(run) if ln["state"] == "created"}


def test_expired_rows_go_into_a_later_batch(tmp_path: Path, anthropic_server: Any) -> None:
    anthropic_server.configure(expire_after=5)
    res = br.orchestra(config(tmp_path, anthropic_server, rows=12, batch="dict(size=12, poll_s=0.2, flush_s=0.3)"))
    assert res.returncode == 0, res.stderr
    assert br.score(br.the_run(tmp_path)) == 1.0
    st = anthropic_server.stats()
    assert sorted(st.submitted.values()).count(1) == 5 and sum(st.submitted.values()) == 12 + 7 + 2


def test_transient_row_error_retried_and_invalid_params_fail_in_one_line(
        tmp_path: Path, anthropic_server: Any) -> None:
    res = br.orchestra(config(tmp_path, anthropic_server, rows=4, question="ROW_500_ONCE What is {i} + {j}?"))
    assert res.returncode == 0, res.stderr
    assert set(anthropic_server.stats().submitted.values()) == {2}
    bad = tmp_path / "bad"
    bad.mkdir()
    res = br.orchestra(config(bad, anthropic_server, rows=3, extra=", generation_kwargs=dict(colour=1)"))
    assert res.returncode == 1
    assert "invalid_request_error: colour: Extra inputs are not permitted" in res.stderr
    assert "Traceback" not in res.stderr


def test_an_answered_result_repeated_as_an_error_is_kept_not_sent_again(tmp_path: Path,
                                                                        anthropic_server: Any) -> None:
    """A results file with a request's answer and, later, an errored line for the same
    ``custom_id``: the answer is kept and the request goes into no other batch (paid once)."""
    res = br.orchestra(config(tmp_path, anthropic_server, rows=4, question="ROW_DUP_ONCE What is {i} + {j}?"))
    assert res.returncode == 0, res.stderr
    assert br.score(br.the_run(tmp_path)) == 1.0
    st = anthropic_server.stats()
    assert len(st.submitted) == 4 and set(st.submitted.values()) == {1}, st.submitted


def test_ctrl_c_cancels_message_batches(tmp_path: Path, anthropic_server: Any) -> None:
    anthropic_server.configure(turnaround_s=60.0, cancel_delay_s=0.3)
    proc = br._start(config(tmp_path, anthropic_server, rows=16, max_task_size=8))
    br._wait_for(lambda: len(anthropic_server.batches()) >= 2)
    time.sleep(0.3)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    made = {b["id"] for b in anthropic_server.batches()}
    assert set(anthropic_server.stats().cancelled) == made
    run = br.the_run(tmp_path)
    assert {line["batch_id"] for line in br.ledger(run) if line["state"] == "cancelled"} == made


def test_sigkill_then_resume_adopts_recorded_batches(tmp_path: Path, anthropic_server: Any) -> None:
    anthropic_server.configure(turnaround_s=3.0)
    cfg = config(tmp_path, anthropic_server, rows=24)
    proc = br._start(cfg)
    br._wait_for(lambda: len(anthropic_server.batches()) >= 3)
    time.sleep(0.3)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=30)
    res = br.orchestra(cfg, "-r")
    assert res.returncode == 0, res.stderr
    run = br.the_run(tmp_path)
    assert br.score(run) == 1.0
    st = anthropic_server.stats()
    assert len(st.submitted) == 24 and set(st.submitted.values()) == {1}, "no request in two batches"
    assert len(anthropic_server.batches()) == 3 and len(br.events(run, "batch_adopted")) == 3


def test_a_create_answered_after_the_attempt_timeout_is_found_and_paid_once(
        tmp_path: Path, anthropic_server: Any) -> None:
    """The create call is answered after 1.5 s, the attempt timeout is 1 s: the batch it made is
    found on the list of message batches (same number of requests, made after the call was sent)
    and adopted, never created again.  Before: 4 batches made, 24 rows paid for 6 requests, and
    every sample failed."""
    anthropic_server.configure(create_delay_s=1.5)
    res = br.orchestra(config(tmp_path, anthropic_server, rows=6, extra=", attempt_timeout_s=1"))
    assert res.returncode == 0, res.stderr
    run = br.the_run(tmp_path)
    assert br.score(run) == 1.0
    st = anthropic_server.stats()
    assert len(anthropic_server.batches()) == 1 and len(st.submitted) == 6 and set(st.submitted.values()) == {1}
    found = [line for line in br.ledger(run) if line.get("adopted_by_listing")]
    assert [line["batch_id"] for line in found] == [anthropic_server.batches()[0]["id"]]


def test_sigkill_during_a_create_then_resume_finds_the_unrecorded_batch(tmp_path: Path, anthropic_server: Any) -> None:
    """SIGKILL while a create call is out (the batch exists, its id was never recorded): ``-r``
    finds it on the list of message batches and adopts it; no request goes into two batches."""
    anthropic_server.configure(turnaround_s=3.0, create_delay_s=2.0)
    cfg = config(tmp_path, anthropic_server, rows=24, batch="dict(size=8, poll_s=0.3, flush_s=0.2)")
    proc = br._start(cfg)
    br._wait_for(lambda: len(anthropic_server.batches()) >= 2)  # the second exists; its create is not answered
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=30)
    anthropic_server.configure(create_delay_s=0.0)
    run = br.the_run(tmp_path)
    made = anthropic_server.batches()
    assert [line["state"] for line in br.ledger(run)] == ["submitting", "created", "submitting"]
    res = br.orchestra(cfg, "-r")
    assert res.returncode == 0, res.stderr
    assert br.score(run) == 1.0
    st = anthropic_server.stats()
    assert len(st.submitted) == 24 and set(st.submitted.values()) == {1}, "no request in two batches"
    found = [line for line in br.ledger(run) if line.get("adopted_by_listing")]
    assert [line["batch_id"] for line in found] == [made[1]["id"]]
    assert len(anthropic_server.batches()) == 3
