"""Batch mode of OpenAIAPI through ``run.py``, against the Files + Batches double on 127.0.0.1:
the plain path, SIGKILL then ``-r``, Ctrl-C, expired batches, row errors, an answered row repeated
as an error row, persistent
validation failure, shuffled output and the API key kept out of the run folder."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
KEY = "sk-batch-secret-4a1f9c"


def write_config(tmp_path: Path, base_url: str, rows: int = 30, batch: str = "dict(size=8, poll_s=0.2, flush_s=0.2)",
                 question: str = "What is {i} + {j}?", max_task_size: int = 10_000, max_retries: int = 3,
                 retry: int = 0, model: str = "OpenAIAPI", extra: str = "", runner: str = "max_num_workers=2") -> Path:
    data = tmp_path / "data"
    data.mkdir(exist_ok=True)
    with open(data / "arith.jsonl", "w") as f:
        for i in range(rows):
            f.write(json.dumps({"question": question.format(i=i, j=2 * i), "answer": str(3 * i)}) + "\n")
    cfg = tmp_path / "cfg.py"
    cfg.write_text(f"""
from orchestra.datasets import JsonlDataset
from orchestra.models import AnthropicAPI, OpenAIAPI
from orchestra.partitioners import NaivePartitioner, SizePartitioner
from orchestra.runners import LocalRunner
from orchestra.tasks import EvalTask, InferTask

models = [dict(type={model}, abbr='gpt-batch', path='test-model', base_url={base_url!r},
               key_env='BATCH_TEST_KEY', max_out_len=16, max_retries={max_retries}, batch={batch}{extra})]
datasets = [
    dict(type=JsonlDataset, abbr='arith', path={str(data / 'arith.jsonl')!r},
         reader_cfg=dict(input_columns=['question'], output_column='answer'),
         infer_cfg=dict(prompt_template='{{question}}', inferencer=dict(type='gen', max_out_len=16)),
         eval_cfg=dict(evaluator=dict(type='numeric_match'))),
]
infer = dict(
    partitioner=dict(type=SizePartitioner, max_task_size={max_task_size}, gen_task_coef=1, granularity=1),
    runner=dict(type=LocalRunner, {runner}, retry={retry}, retry_backoff_s=0.1, task=dict(type=InferTask)),
)
eval = dict(partitioner=dict(type=NaivePartitioner), runner=dict(type=LocalRunner, task=dict(type=EvalTask)))
work_dir = {str(tmp_path / 'out')!r}
""")
    return cfg


def env() -> dict[str, str]:
    return {**os.environ, "BATCH_TEST_KEY": KEY, "ORCHESTRA_PROGRESS_INTERVAL_S": "0.5"}


def orchestra(*args: str | Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "run.py", *map(str, args)], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, env=env())


def the_run(tmp_path: Path) -> Path:
    (run,) = [p for p in (tmp_path / "out").iterdir() if p.is_dir()]
    return run


def events(run: Path, kind: str | None = None) -> list[dict[str, Any]]:
    evs = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines() if line.strip()]
    return [e for e in evs if kind is None or e["event"] == kind]


def ledger(run: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run / "batches" / "gpt-batch.jsonl").read_text().splitlines()]


def predictions(run: Path) -> dict[str, str]:
    out = {}
    for path in (run / "predictions" / "gpt-batch").glob("*.jsonl"):
        for line in path.read_text().splitlines()[1:]:
            rec = json.loads(line)
            out[str(rec["gold"])] = rec.get("prediction")
    return out


def score(run: Path) -> float:
    summary = json.loads((run / "summary" / "summary.json").read_text())
    return float(summary["rows"][0]["gpt-batch"])


def test_plain_path_every_request_in_one_batch_only(tmp_path: Path, batch_server: Any) -> None:
    batch_server.configure(api_key=KEY)
    res = orchestra(write_config(tmp_path, batch_server.base_url, rows=30, max_task_size=15))
    assert res.returncode == 0, res.stderr
    run = the_run(tmp_path)
    assert score(run) == 1.0
    st = batch_server.stats()
    assert len(st.submitted) == 30 and set(st.submitted.values()) == {1}, "each request in exactly one batch"
    assert st.calls["POST /v1/chat/completions"] == 0, "no direct completion call"
    # 2 tasks x 15 requests share batches of at most 8: 4 batches, every one recorded
    submitted = events(run, "batch_submitted")
    sizes = sorted(e["requests"] for e in submitted)
    assert sizes in ([6, 8, 8, 8], [7, 7, 8, 8]), sizes
    assert {e["batch_id"] for e in events(run, "batch_ended")} == {e["batch_id"] for e in submitted}
    states = Counter(line["state"] for line in ledger(run))
    assert states["submitting"] == states["created"] == 4
    assert {ln["key"] for ln in ledger(run) if ln["state"] == "ended"} == {ln["key"] for ln in ledger(run)
                                                                            if ln["state"] == "created"}
    assert sum(len(line["custom_ids"]) for line in ledger(run) if line["state"] == "submitting") == 30
    # progress shows batches; usage of each row is what the report counts
    last = {e["task_id"]: e for e in events(run, "progress")}
    assert len(last) == 2 and all(e["batches_completed"] >= 2 and e["batches_in_progress"] == 0
                                  for e in last.values())
    # the double counts a character as a token: the usage of every row, and nothing else
    assert sum(e["prompt_tokens"] for e in last.values()) == sum(len(f"What is {i} + {2 * i}?") for i in range(30))
    assert "batches:" in res.stderr


def test_bad_batch_option_is_one_line_exit_2(tmp_path: Path, batch_server: Any) -> None:
    res = orchestra(write_config(tmp_path, batch_server.base_url, batch="dict(sise=8)"))
    assert res.returncode == 2
    assert "batch: unknown key 'sise'; valid keys: size, max_bytes, poll_s" in res.stderr
    assert "Traceback" not in res.stderr


def test_warm_worker_runs_two_tasks_with_one_model_object(tmp_path: Path, batch_server: Any) -> None:
    """A warm worker keeps the model between tasks: each task binds its own ledger and loop."""
    res = orchestra(write_config(tmp_path, batch_server.base_url, rows=20, max_task_size=10,
                                 runner="max_num_workers=1, reuse_workers=True"))
    assert res.returncode == 0, res.stderr
    run = the_run(tmp_path)
    assert score(run) == 1.0
    assert set(batch_server.stats().submitted.values()) == {1} and len(batch_server.stats().submitted) == 20
    assert {e["task_id"] for e in events(run, "batch_submitted")} == {e["task_id"] for e in events(run, "done")
                                                                       if e["stage"] == "infer"}


def test_key_never_reaches_the_run_folder(tmp_path: Path, batch_server: Any) -> None:
    batch_server.configure(api_key=KEY)
    res = orchestra(write_config(tmp_path, batch_server.base_url, rows=6))
    assert res.returncode == 0, res.stderr
    assert batch_server.stats().unauthorized == 0
    for path in the_run(tmp_path).rglob("*"):
        if path.is_file():
            assert KEY.encode() not in path.read_bytes(), path
    assert KEY not in res.stdout + res.stderr


def test_shuffled_output_is_matched_by_custom_id(tmp_path: Path, batch_server: Any) -> None:
    """Every answer differs (i + 2i); the double shuffles its output lines: any match by line
    order would score far below 1."""
    res = orchestra(write_config(tmp_path, batch_server.base_url, rows=40, batch="dict(size=40, poll_s=0.2, "
                                                                                   "flush_s=0.3)"))
    assert res.returncode == 0, res.stderr
    run = the_run(tmp_path)
    assert score(run) == 1.0
    assert all(pred == gold for gold, pred in predictions(run).items())


def test_expired_batch_keeps_completed_rows_and_resubmits_the_rest(tmp_path: Path, batch_server: Any) -> None:
    batch_server.configure(expire_after=5)  # every batch expires with 5 rows done
    res = orchestra(write_config(tmp_path, batch_server.base_url, rows=12,
                                 batch="dict(size=12, poll_s=0.2, flush_s=0.3)", max_retries=3))
    assert res.returncode == 0, res.stderr
    run = the_run(tmp_path)
    assert score(run) == 1.0
    st = batch_server.stats()
    # 12 -> 5 done, 7 again -> 5 done, 2 again -> done: completed rows are never sent again
    assert sorted(st.submitted.values()).count(1) == 5 and sum(st.submitted.values()) == 12 + 7 + 2
    assert [e["status"] for e in events(run, "batch_ended")] == ["expired"] * 3


def test_row_errors_are_retried_and_a_persistent_one_fails_with_the_providers_message(
        tmp_path: Path, batch_server: Any) -> None:
    cfg = write_config(tmp_path, batch_server.base_url, rows=4, question="ROW_500_ONCE What is {i} + {j}?")
    res = orchestra(cfg)
    assert res.returncode == 0, res.stderr
    assert score(the_run(tmp_path)) == 1.0
    assert set(batch_server.stats().submitted.values()) == {2}  # a 500 row, then its answer in a later batch
    fail = tmp_path / "fail"
    fail.mkdir()
    res = orchestra(write_config(fail, batch_server.base_url, rows=3, question="ROW_429_ALWAYS {i} + {j}",
                                 max_retries=2))
    assert res.returncode == 1
    line = next(ln for ln in res.stderr.splitlines() if "FAILED" in ln and "infer" in ln)
    assert "Rate limit reached for requests" in res.stderr and "gave up after 3 batches" in res.stderr
    assert "Traceback" not in res.stderr, line


def test_an_answered_row_repeated_as_a_500_is_kept_not_sent_again(tmp_path: Path, batch_server: Any) -> None:
    """An output file that holds a row's answer and, later, an error row with the same
    ``custom_id``: the answer was paid for, so it is kept; before, the later row won, the
    answered request went into another batch (paid twice) and the run still exited 0."""
    res = orchestra(write_config(tmp_path, batch_server.base_url, rows=4, question="ROW_DUP_ONCE What is {i} + {j}?"))
    assert res.returncode == 0, res.stderr
    run = the_run(tmp_path)
    assert score(run) == 1.0
    st = batch_server.stats()
    assert len(st.submitted) == 4 and set(st.submitted.values()) == {1}, st.submitted
    assert len(events(run, "batch_submitted")) == 1


def test_persistent_validation_failure_fails_the_task_in_one_line(tmp_path: Path, batch_server: Any) -> None:
    res = orchestra(write_config(tmp_path, batch_server.base_url, rows=3, question="INVALID_BATCH {i} + {j}",
                                 max_retries=1))
    assert res.returncode == 1
    assert "invalid request body (INVALID_BATCH)" in res.stderr and "Traceback" not in res.stderr
    run = the_run(tmp_path)
    assert [e["status"] for e in events(run, "batch_ended")] == ["failed", "failed"]


def test_token_limit_seen_at_retrieval_is_retried(tmp_path: Path, batch_server: Any) -> None:
    res = orchestra(write_config(tmp_path, batch_server.base_url, rows=3, question="TOKEN_LIMIT_ONCE {i} + {j}"))
    assert res.returncode == 0, res.stderr
    ended = events(the_run(tmp_path), "batch_ended")
    assert ended[0]["status"] == "failed" and ended[0]["errors"][0]["code"] == "token_limit_exceeded"
    assert ended[-1]["status"] == "completed"


def _start(cfg: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "run.py", str(cfg), *args], cwd=REPO, env=env(), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)


def _wait_for(cond: Any, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.05)


def test_sigkill_then_resume_never_submits_a_request_twice(tmp_path: Path, batch_server: Any) -> None:
    """The orchestrator and its task die by SIGKILL while batches run (one created but not yet
    recorded); ``-r`` adopts them all, by ledger and by metadata, and sends nothing again."""
    batch_server.configure(turnaround_s=3.0, create_delay_s=2.0)  # a window between create and its answer
    cfg = write_config(tmp_path, batch_server.base_url, rows=24, batch="dict(size=8, poll_s=0.3, flush_s=0.2)")
    proc = _start(cfg)
    _wait_for(lambda: len(batch_server.batches()) >= 2)  # the second exists; its create is not answered
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=30)
    batch_server.configure(create_delay_s=0.0)
    run = the_run(tmp_path)
    made = batch_server.batches()
    assert [line["state"] for line in ledger(run)] == ["submitting", "created", "submitting"]
    res = orchestra(cfg, "-r")
    assert res.returncode == 0, res.stderr
    assert score(run) == 1.0
    st = batch_server.stats()
    assert len(st.submitted) == 24 and set(st.submitted.values()) == {1}, "no request in two batches"
    by_meta = [line for line in ledger(run) if line.get("adopted_by_metadata")]
    assert [line["batch_id"] for line in by_meta] == [made[1]["id"]], "the unrecorded batch found by metadata"
    assert {e["batch_id"] for e in events(run, "batch_adopted")} == {b["id"] for b in made}
    assert len(batch_server.batches()) == 3  # only the third batch's requests were sent after -r


def test_ctrl_c_cancels_batches_in_flight_and_exits_130(tmp_path: Path, batch_server: Any) -> None:
    batch_server.configure(turnaround_s=60.0, cancel_delay_s=0.3)
    cfg = write_config(tmp_path, batch_server.base_url, rows=16, max_task_size=8)
    proc = _start(cfg)
    _wait_for(lambda: len(batch_server.batches()) >= 2)
    time.sleep(0.3)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert time.monotonic() - t0 < 10
    made = {b["id"] for b in batch_server.batches()}
    assert set(batch_server.stats().cancelled) == made
    assert {b["status"] for b in batch_server.batches()} == {"cancelled"}
    run = the_run(tmp_path)
    assert {e["batch_id"] for e in events(run, "batch_cancelled")} == made
    assert {line["batch_id"] for line in ledger(run) if line["state"] == "cancelled"} == made
