"""Shared batches through ``run.py``: the infer tasks of one model in one run folder, running at
once in separate processes on this host, fill the same batches (the spool and its flock-elected
leader, orchestra/models/batch/spool.py), without ever putting a request in two batches: also
when the whole run is SIGKILLed and resumed, and when only the leader dies mid-create."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from test_batch_run import REPO, _start, _wait_for, env, events, ledger, orchestra, score, the_run, write_config

SHARDS, N, SIZE = 4, 10, 8  # 4 tasks of 10 requests, batches of at most 8
SHARED = f"dict(size={SIZE}, poll_s=0.3, flush_s=6)"  # long enough for the 4 processes to start


def _config(tmp_path: Path, base_url: str, retry: int = 0, warm: bool = False) -> Path:
    return write_config(tmp_path, base_url, rows=SHARDS * N, max_task_size=N, batch=SHARED,
                        runner=f"max_num_workers={SHARDS}, reuse_workers={warm}", retry=retry)


def _check_once(batch_server: Any) -> None:
    st = batch_server.stats()
    assert len(st.submitted) == SHARDS * N and set(st.submitted.values()) == {1}, "no request in two batches"


@pytest.mark.parametrize("warm", [False, True])
def test_four_tasks_fill_shared_batches(tmp_path: Path, batch_server: Any, warm: bool) -> None:
    res = orchestra(_config(tmp_path, batch_server.base_url, warm=warm))
    assert res.returncode == 0, res.stderr
    run = the_run(tmp_path)
    assert score(run) == 1.0
    infer_tasks = {e["task_id"] for e in events(run, "done") if e["stage"] == "infer"}
    assert len(infer_tasks) == SHARDS
    _check_once(batch_server)
    # one batch per task would be 4 x ceil(10/8) = 8 batches; shared: ceil(40/8) = 5
    assert len(batch_server.batches()) == math.ceil(SHARDS * N / SIZE) == 5
    submitted = events(run, "batch_submitted")
    assert sorted(e["requests"] for e in submitted) == [8] * 5
    assert max(len(e["tasks"]) for e in submitted) > 1, "a batch holds requests of several tasks"
    # each task polled and checkpointed its own samples; no spool entry is left behind
    spool = run / "batches" / "gpt-batch.spool"
    assert [p.name for p in spool.rglob("*") if p.is_file() and p.name != "lead.lock"] == []


def test_sigkill_of_the_run_then_resume_with_shared_batches(tmp_path: Path, batch_server: Any) -> None:
    """Four tasks share batches; the whole run dies by SIGKILL while some batches run and one
    create call is unanswered; ``-r`` adopts every batch and sends each request once."""
    batch_server.configure(turnaround_s=3.0, create_delay_s=1.5)
    cfg = _config(tmp_path, batch_server.base_url)
    proc = _start(cfg)
    _wait_for(lambda: len(batch_server.batches()) >= 3)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=30)
    batch_server.configure(create_delay_s=0.0)
    run = the_run(tmp_path)
    made = batch_server.batches()
    res = orchestra(cfg, "-r")
    assert res.returncode == 0, res.stderr
    assert score(run) == 1.0
    _check_once(batch_server)
    adopted = {e["batch_id"] for e in events(run, "batch_adopted")}
    assert {b["id"] for b in made} <= adopted | {e["batch_id"] for e in events(run, "batch_ended")}
    assert any(line.get("adopted_by_metadata") for line in ledger(run)), "the unanswered create was found"
    assert len(batch_server.batches()) == 5


def test_a_leader_killed_mid_create_is_replaced_without_loss_or_duplicate(tmp_path: Path,
                                                                         batch_server: Any) -> None:
    """Only the leader's process dies (SIGKILL) while its create call is out: another task takes
    the lead, finds that batch by its metadata, and every owner still gets its rows; the killed
    task's retry adopts its own."""
    batch_server.configure(turnaround_s=2.0, create_delay_s=2.0)
    cfg = _config(tmp_path, batch_server.base_url, retry=1)
    proc = _start(cfg)
    def first_submitting() -> dict[str, Any] | None:
        for path in (tmp_path / "out").glob("*/batches/gpt-batch.jsonl"):
            for line in path.read_text().splitlines():
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue  # being written
                if rec["state"] == "submitting":
                    return dict(rec)
        return None

    _wait_for(lambda: first_submitting() is not None and len(batch_server.batches()) >= 1)
    leader = first_submitting()
    assert leader is not None
    os.kill(int(leader["owner"].split(".")[-2]), signal.SIGKILL)
    batch_server.configure(create_delay_s=0.0)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    run = the_run(tmp_path)
    assert score(run) == 1.0
    _check_once(batch_server)
    lines = ledger(run)
    found = [ln for ln in lines if ln.get("adopted_by_metadata") and ln["key"] == leader["key"]]
    assert found, "the dead leader's batch was found by its metadata"
    assert not [ln for ln in lines if ln["state"] == "not_created"]


def test_ctrl_c_cancels_every_shared_batch(tmp_path: Path, batch_server: Any) -> None:
    batch_server.configure(turnaround_s=60.0, cancel_delay_s=0.3)
    with open(tmp_path / "stderr", "w") as err_file:  # a file, not a pipe no one reads while we wait
        proc = subprocess.Popen([sys.executable, "run.py", str(_config(tmp_path, batch_server.base_url))],
                                cwd=REPO, env=env(), stdout=subprocess.DEVNULL, stderr=err_file, text=True,
                                start_new_session=True)
        _wait_for(lambda: len(batch_server.batches()) >= 4)
        time.sleep(0.5)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
    assert proc.returncode == 130, (tmp_path / "stderr").read_text()[-3000:]
    assert time.monotonic() - t0 < 10
    made = {b["id"] for b in batch_server.batches()}
    assert set(batch_server.stats().cancelled) == made
    assert {b["status"] for b in batch_server.batches()} == {"cancelled"}
    run = the_run(tmp_path)
    assert any(len(e["tasks"]) > 1 for e in events(run, "batch_submitted")), "some batch was shared"
    assert {line["batch_id"] for line in ledger(run) if line["state"] == "cancelled"} == made
