"""A task's retry within one run redoes nothing that finished: ``python run.py`` against the real
local OpenAI-compatible server, real task processes.

One task runs two datasets together.  A sample of one of them is refused (HTTP 400) on every
attempt; the other dataset finishes in the first attempt.  The retry must find that dataset's
predictions whole ("already done"), and the other dataset's finished samples in its
checkpoint, so the only request it sends is the refused sample's.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from orchestra.inference.checkpoint import Checkpoint
from tests.api.test_api_pipeline import latest_run, orchestra, predictions, write_config, write_data


@pytest.mark.slow
def test_a_retry_sends_only_what_failed_and_keeps_the_finished_dataset(server: Any, tmp_path: Path) -> None:
    data, expected = write_data(tmp_path, 12, bad=(5,))
    cfg = write_config(tmp_path, server.base_url, data, chat=True, retry=1)
    res = orchestra(cfg, "--mode", "infer")
    assert res.returncode == 1, res.stdout + res.stderr
    run = latest_run(tmp_path)
    (spec,) = (run / "tasks").glob("infer_*.py")
    log = (run / "logs" / "infer" / f"{spec.stem}.log").read_text()
    first, second = log.split("===== orchestra: attempt 2 of ")
    assert "arith: 12 samples, 0 from checkpoint, 12 to run" in first, first
    assert "chat: 20 samples, 0 from checkpoint, 20 to run" in first, first
    assert "chat: already done" in second, second
    assert "arith: 12 samples, 11 from checkpoint, 1 to run" in second, second
    assert second.count("1/12 samples failed") == 1, second
    counts = server.stats()["per_prompt"]
    bad = [k for k in counts if "BAD_REQUEST" in k]
    assert len(bad) == 1 and counts[bad[0]] == 2, counts  # the refused sample: once per attempt
    assert all(n == 1 for k, n in counts.items() if k not in bad), counts  # every other request: once
    chat = predictions(run, "chat")
    assert len(chat) == 20 and all(len(r["prediction"]) == 3 for r in chat.values())
    assert not (run / "predictions" / "api" / "arith.jsonl").exists()  # a shard with a failure is not sealed
    # ... and with the sample answered, -r sends that one request and seals the shard
    server.configure(bad_marker="NOTHING_IS_BAD")
    res = orchestra(cfg, "--mode", "infer", "-r", "latest")
    assert res.returncode == 0, res.stdout + res.stderr
    assert list(server.stats()["per_prompt"].values()) == [1]
    preds = predictions(run)
    assert [preds[i]["prediction"] for i in range(12)] == expected
    meta = json.loads((run / "predictions" / "api" / "arith.jsonl").read_text().splitlines()[0])["_meta"]
    assert meta["count"] == 12 and meta["failed"] == 0


@pytest.mark.slow
def test_a_task_killed_between_its_last_sample_and_the_prediction_file_sends_nothing_again(
        server: Any, tmp_path: Path) -> None:
    """A SIGKILL after the last checkpoint line and before the sealed file was renamed into place
    leaves the checkpoint whole and no prediction file.  The window is too short to hit with a
    signal, so the test leaves that state with the checkpoint's own writer, from a finished run's
    records: ``-r`` must seal the shard from the checkpoint without a request."""
    data, expected = write_data(tmp_path, 10)
    cfg = write_config(tmp_path, server.base_url, data)
    res = orchestra(cfg, "--mode", "infer")
    assert res.returncode == 0, res.stdout + res.stderr
    run = latest_run(tmp_path)
    output = run / "predictions" / "api" / "arith.jsonl"
    lines = output.read_text().splitlines()
    meta = json.loads(lines[0])["_meta"]
    ckpt = Checkpoint(f"{output}.ckpt", meta["hash"])
    for line in lines[1:]:
        ckpt.append(json.loads(line))
    ckpt.close()
    output.unlink()
    server.configure()  # counters back to zero
    res = orchestra(cfg, "--mode", "infer", "-r", "latest")
    assert res.returncode == 0, res.stdout + res.stderr
    assert server.stats()["per_prompt"] == {}
    log = (run / "logs" / "infer" / "infer_api_arith.log").read_text()
    assert log.count("arith: 10 samples, 10 from checkpoint, 0 to run") == 1, log
    assert output.read_text().splitlines()[1:] == lines[1:]
    assert not Path(f"{output}.ckpt").exists()
    assert [predictions(run)[i]["prediction"] for i in range(10)] == expected
