"""The one ledger primitive (``orchestra.journal``): durable appends with one fsync each, folding
into the latest state per key, tailing, a torn last line ignored, and one vocabulary of words."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from orchestra.journal import PHASES, Journal, Phase, words_in

STATES: dict[str, Phase] = {"asked": "intent", "running": "started", "halting": "stop_sent", "done": "ended",
                            "refused": "failed"}


def test_each_append_is_fsynced_once_and_is_a_whole_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[int] = []
    real = os.fsync

    def count(fd: int) -> None:
        synced.append(fd)
        real(fd)

    monkeypatch.setattr(os, "fsync", count)
    journal = Journal(str(tmp_path / "deep" / "ledger.jsonl"), "name", STATES)  # its folder is made
    journal.append("asked", "a", task="t")
    assert len(synced) == 1
    journal.append("running", "a", job_id="7")
    assert len(synced) == 2
    lines = (tmp_path / "deep" / "ledger.jsonl").read_text().splitlines()
    assert [line.split('"ts": ')[0] for line in lines] == ["{", "{"] and len(lines) == 2
    assert lines[1].endswith('"state": "running", "name": "a", "job_id": "7"}')


def test_the_fold_keeps_each_keys_latest_state_and_every_field_said_before(tmp_path: Path) -> None:
    journal = Journal(str(tmp_path / "j.jsonl"), "key", STATES)
    journal.append("asked", "a", task="t", attempt=1, ids=["x", "y"])
    journal.append("asked", "b", task="u")
    journal.append("running", "a", job_id="7", task="")  # "" says nothing: the task stays "t"
    journal.append("halting", "a", ids=[], attempt=0)  # anything else replaces, an empty list and 0 too
    folded = journal.fold()
    assert folded["a"]["state"] == "halting" and folded["b"]["state"] == "asked"
    assert {k: v for k, v in folded["a"].items() if k != "ts"} == {
        "state": "halting", "key": "a", "task": "t", "attempt": 0, "ids": [], "job_id": "7"}


def test_a_torn_last_line_is_ignored_and_the_next_append_stands_alone(tmp_path: Path) -> None:
    """A crash mid-append leaves part of a line at the end: reading skips it, tailing leaves it
    for later, and the next append starts on a line of its own instead of being spoiled by it."""
    journal = Journal(str(tmp_path / "j.jsonl"), "name", STATES)
    journal.append("running", "a", job_id="1")
    with open(journal.path, "ab") as f:
        f.write(b'{"ts": 1, "state": "done", "name": "a", "jo')  # SIGKILL here
    assert journal.fold()["a"]["state"] == "running"
    lines, offset = journal.tail(0)
    assert [line["state"] for line in lines] == ["running"] and offset < os.path.getsize(journal.path)
    journal.append("done", "a")
    assert journal.fold()["a"]["state"] == "done"
    lines, offset = journal.tail(offset)
    assert [line["state"] for line in lines] == ["done"] and offset == os.path.getsize(journal.path)
    assert journal.tail(offset) == ([], offset)


def test_what_another_process_appends_is_tailed(tmp_path: Path) -> None:
    path = tmp_path / "j.jsonl"
    journal = Journal(str(path), "name", STATES)
    journal.append("asked", "a")
    _, offset = journal.tail(0)
    code = ("import sys; from orchestra.journal import Journal; "
            "Journal(sys.argv[1], 'name', {'running': 'started'}).append('running', 'b', job_id='9')")
    subprocess.run([sys.executable, "-c", code, str(path)], check=True, timeout=60)
    lines, _ = journal.tail(offset)
    assert [(line["name"], line["job_id"]) for line in lines] == [("b", "9")]


def test_a_word_outside_the_vocabulary_is_refused_in_one_line(tmp_path: Path) -> None:
    journal = Journal(str(tmp_path / "j.jsonl"), "name", STATES)
    with pytest.raises(ValueError) as err:
        journal.append("finished", "a")
    message = str(err.value)
    assert "\n" not in message and "'finished'" in message and str(tmp_path / "j.jsonl") in message
    assert "valid: asked, running, halting, done, refused" in message
    assert not os.path.exists(journal.path)  # nothing written
    with pytest.raises(ValueError, match=r"unknown phase\(s\) \['over'\]; valid: intent, started"):
        Journal(str(tmp_path / "k.jsonl"), "name", {"x": "over"})  # type: ignore[dict-item]


def test_lines_of_another_shape_are_skipped_or_left_to_a_check(tmp_path: Path) -> None:
    journal = Journal(str(tmp_path / "j.jsonl"), "name", STATES)
    (tmp_path / "j.jsonl").write_text('not json\n[1, 2]\n{"state": "running", "name": 7}\n\n"x"\n')
    journal.append("running", "a")
    assert list(journal.fold()) == ["a"]
    seen: list[tuple[int, Any]] = []
    journal.fold(lambda n, value: seen.append((n, value)))
    assert [n for n, _ in seen] == [2, 3, 5, 6]  # line numbers of the file: the torn line and the blank one skipped


def test_words_in_gives_a_vocabulary_s_words_of_some_phases() -> None:
    assert words_in(STATES, "ended", "failed") == {"done", "refused"}
    assert PHASES == ("intent", "started", "stop_sent", "ended", "failed")


def test_each_ledger_refuses_a_word_outside_its_vocabulary(tmp_path: Path) -> None:
    """A misspelt word (``stoped``) used to be written and then read as neither over nor alive:
    now the three ledgers refuse it before anything is written, and keep their words' meanings."""
    from orchestra.models.batch.ledger import BatchLedger
    from orchestra.runners.core.ledger import MAYBE_ALIVE, OVER, Ledger
    from orchestra.serving.pool import servers_ledger

    ledger, batches = Ledger(str(tmp_path / "slurm")), BatchLedger(str(tmp_path / "batches" / "m.jsonl"))
    servers = servers_ledger(str(tmp_path / "servers"))
    for record, word in ((ledger.record, "stoped"), (batches.record, "canceled"), (servers.append, "ended")):
        with pytest.raises(ValueError, match="unknown state"):
            record(word, "x")
    assert not any(os.path.exists(j.path) for j in (ledger, batches, servers))
    assert OVER == {"stopped", "ended", "submit_failed", "submit_unknown"}
    assert MAYBE_ALIVE == {"submitted", "adopted", "stop_sent", "stop_acknowledged", "stop_unconfirmed"}
