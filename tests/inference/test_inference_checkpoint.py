"""Checkpoints: torn lines, stale hashes, failed samples, one writer at a time."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

from orchestra.errors import TaskFailedError
from orchestra.inference.checkpoint import Checkpoint


def lines(path: Any) -> list[dict[str, Any]]:
    return [json.loads(x) for x in open(path, encoding="utf-8").read().splitlines()]


def test_append_resume_and_finalize(tmp_path: Any) -> None:
    path = tmp_path / "p.jsonl.ckpt"
    ck = Checkpoint(str(path), "h1")
    ck.append({"id": 0, "prediction": "a"})
    ck.append({"id": 1, "error": "HTTP 500"})
    ck.close()
    again = Checkpoint(str(path), "h1")
    assert again.done_ids() == {0} and [r["id"] for r in again.errors()] == [1]
    again.append({"id": 1, "prediction": "b"})  # the retry of the failed sample wins
    out = tmp_path / "p.jsonl"
    again.finalize(str(out), {"model": "m"})
    got = lines(out)
    assert {k: got[0]["_meta"][k] for k in ("model", "hash", "count")} == {"model": "m", "hash": "h1", "count": 2}
    assert got[1:] == [{"id": 0, "prediction": "a"}, {"id": 1, "prediction": "b"}]
    assert not path.exists() and not os.path.exists(str(path) + ".lock")


def test_torn_last_line_is_cut_before_appending(tmp_path: Any) -> None:
    path = tmp_path / "p.ckpt"
    path.write_text('{"_meta": {"hash": "h"}}\n{"id": 0, "prediction": "a"}\n{"id": 1, "predic')
    ck = Checkpoint(str(path), "h")
    assert ck.done_ids() == {0}
    ck.append({"id": 1, "prediction": "b"})
    ck.close()
    assert [r.get("id") for r in lines(path)[1:]] == [0, 1]


def test_garbage_line_is_skipped(tmp_path: Any) -> None:
    path = tmp_path / "p.ckpt"
    path.write_text('{"_meta": {"hash": "h"}}\n{"id": 0, "prediction": "a"}\nnot json\n{"id": 2, "prediction": "c"}\n')
    assert Checkpoint(str(path), "h").done_ids() == {0, 2}


def test_checkpoint_of_other_settings_is_discarded(tmp_path: Any) -> None:
    path = tmp_path / "p.ckpt"
    path.write_text('{"_meta": {"hash": "old"}}\n{"id": 0, "prediction": "a"}\n')
    ck = Checkpoint(str(path), "new")
    assert ck.done_ids() == set() and not path.exists()


def test_one_writer_at_a_time(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestra.inference import checkpoint

    monkeypatch.setattr(checkpoint, "LOCK_WAIT_S", 0.3)  # the second writer's wait (see below) cut short
    path = str(tmp_path / "p.ckpt")
    first = Checkpoint(path, "h")
    first.append({"id": 0, "prediction": "a"})
    with open(path, "ab") as f:  # the live writer is mid-line
        f.write(b'{"id": 7, "predic')
    size = os.path.getsize(path)
    for other_hash in ("h", "other"):
        with pytest.raises(TaskFailedError, match="another process"):
            Checkpoint(path, other_hash)
    # the refused second writer neither cut the torn tail nor deleted the stale-looking file
    assert os.path.getsize(path) == size
    first.close()
    second = Checkpoint(path, "h")  # free once the first one closed; the torn tail is cut now
    second.append({"id": 1, "prediction": "b"})
    second.close()
    assert Checkpoint(path, "h").done_ids() == {0, 1}


def test_fsync_every_line_mode(tmp_path: Any) -> None:
    ck = Checkpoint(str(tmp_path / "p.ckpt"), "h", fsync_interval_s=0)
    ck.append({"id": 3, "prediction": "x"})
    ck.close()
    assert Checkpoint(str(tmp_path / "p.ckpt"), "h").done_ids() == {3}


def test_a_truncated_or_damaged_prediction_file_is_not_done(tmp_path: Any) -> None:
    """Regression (issue 15.1): only the first line's hash used to be checked, so a cut file
    counted as complete and a damaged middle line broke its eval on every retry."""
    from orchestra.fileio import write_sealed_jsonl
    from orchestra.tasks.spec import output_done

    path = tmp_path / "p.jsonl"
    write_sealed_jsonl(str(path), {"hash": "h"}, [{"id": i, "prediction": str(i)} for i in range(50)])
    assert output_done(str(path), "h")
    whole = path.read_bytes()
    path.write_bytes(whole[: len(whole) * 2 // 3])  # cut mid-file
    assert not output_done(str(path), "h")
    path.write_bytes(whole.replace(b'"prediction": "7"', b'"prediction": "x"'))  # same length, other bytes
    assert not output_done(str(path), "h")
    path.write_bytes(whole.replace(b'{"id": 7,', b'{"id"::7,'))  # a damaged middle line
    assert not output_done(str(path), "h")
    path.write_bytes(whole)
    assert output_done(str(path), "h")


def test_a_lone_surrogate_from_any_model_is_written_as_a_replacement_character(tmp_path: Any) -> None:
    """A model class that hands back "4 \\ud83d" (a pair cut in half) loses nothing: the line is
    written with U+FFFD, ordinary text byte for byte as before."""
    path = tmp_path / "p.jsonl.ckpt"
    ck = Checkpoint(str(path), "h")
    ck.append({"id": 0, "prediction": "The answer is 4 \ud83d", "prompt": "é \U0001f600"})
    ck.append({"id": 1, "prediction": "中文"})
    assert ck.done_ids() == {0, 1}
    out = tmp_path / "p.jsonl"
    ck.finalize(str(out), {})
    raw = out.read_bytes()
    assert "中文".encode() in raw and "é \U0001f600".encode() in raw
    assert lines(out)[1]["prediction"] == "The answer is 4 \ufffd"


def test_lines_that_are_json_but_not_records_are_skipped_not_fatal(tmp_path: Any) -> None:
    """A damaged checkpoint whose lines parse as JSON of another shape (an id that is no number,
    a meta that is no object) must not stop the task from ever resuming: such a line is skipped
    (its sample runs again), a header of the wrong shape makes the file stale."""
    path = tmp_path / "p.ckpt"
    path.write_text('{"_meta": {"hash": "h"}}\n{"id": 0, "prediction": "a"}\n{"id": "x7", "prediction": "b"}\n'
                    '{"id": null}\n{"id": [1]}\n{"id": 2.0, "prediction": "c"}\n{"id": true, "prediction": "d"}\n')
    ck = Checkpoint(str(path), "h")
    assert ck.done_ids() == {0, 2}
    ck.append({"id": 3, "prediction": "e"})
    ck.close()
    stale = tmp_path / "q.ckpt"
    stale.write_text('{"_meta": "h"}\n{"id": 0, "prediction": "a"}\n')
    assert Checkpoint(str(stale), "h").done_ids() == set() and not stale.exists()
    listed = tmp_path / "r.ckpt"
    listed.write_text('["_meta"]\n{"id": 0, "prediction": "a"}\n')
    assert Checkpoint(str(listed), "h").done_ids() == set()


def test_a_sample_line_the_disk_tears_is_an_error_not_a_recorded_sample(tmp_path: Any) -> None:
    """A full disk cuts a checkpoint line short without an error: the sample was counted as
    safe and the next line was appended after the torn bytes.  Now the append raises naming the
    file; the next open drops the torn tail, so the samples before it are kept."""
    import subprocess
    import sys

    path = tmp_path / "ck.jsonl"
    script = (
        "import os, resource, sys\n"
        "from orchestra.inference.checkpoint import Checkpoint\n"
        "ck = Checkpoint(sys.argv[1], 'h', fsync_interval_s=0)\n"
        "ck.append({'id': 0, 'prediction': 'kept'})\n"
        "room = os.path.getsize(sys.argv[1]) + 10\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (room, room))\n"
        "try:\n"
        "    ck.append({'id': 1, 'prediction': 'x' * 100})\n"
        "except OSError as exc:\n"
        "    print('refused:', exc, sorted(ck.records))\n"
        "else:\n"
        "    print('taken as recorded', sorted(ck.records))\n"
    )
    res = subprocess.run([sys.executable, "-c", script, str(path)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("refused:") and str(path) in res.stdout and res.stdout.rstrip().endswith("[0]")
    again = Checkpoint(str(path), "h")
    again.append({"id": 2, "prediction": "after"})
    again.close()
    assert sorted(Checkpoint(str(path), "h").records) == [0, 2]


def _hold_lock(lock: str, seconds: float) -> Any:
    """Another process (an earlier attempt still ending) holding the checkpoint's writer lock."""
    import subprocess
    import sys
    import time

    code = ("import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT); "
            "fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); time.sleep(float(sys.argv[2]))")
    proc = subprocess.Popen([sys.executable, "-c", code, lock, str(seconds)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline() == "held\n"
    return proc, time.monotonic()


def test_a_lock_an_ending_attempt_still_holds_is_waited_for(tmp_path: Any) -> None:
    """Regression (seen in the Slurm chaos test): a job whose scancel raced its start kept running
    for 3 s, and the resumed attempt failed at once with 'being written by another process'.
    The writer now waits for the lock a while."""
    import time

    path = str(tmp_path / "p.jsonl.ckpt")
    proc, t0 = _hold_lock(path + ".lock", 1.5)
    try:
        ckpt = Checkpoint(path, "h")
        waited = time.monotonic() - t0
        ckpt.close()
    finally:
        proc.kill()
        proc.wait()
    assert 1.0 <= waited < 10, waited


def test_a_lock_held_past_the_wait_fails_the_task_with_one_line(tmp_path: Any,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestra.inference import checkpoint

    monkeypatch.setattr(checkpoint, "LOCK_WAIT_S", 0.5)
    path = str(tmp_path / "p.jsonl.ckpt")
    proc, _ = _hold_lock(path + ".lock", 30)
    try:
        with pytest.raises(TaskFailedError, match="being written by another process .*still running 0.5 s later"):
            Checkpoint(path, "h")
    finally:
        proc.kill()
        proc.wait()
