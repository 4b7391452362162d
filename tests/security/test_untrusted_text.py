"""Text from outside that orchestra must survive: a model answer or a data row holding a lone
surrogate (valid JSON, not encodable text), and a data file with no rows.  All through the CLI,
against the project's test HTTP server."""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sec_helpers import cli_env, run_cli, the_run, write_config

from orchestra.events import EventLog, read_events
from orchestra.fileio import encodable, utf8


def _predictions(run: Path) -> list[dict[str, Any]]:
    (pred,) = (run / "predictions" / "api").glob("rows*.jsonl")
    lines = pred.read_bytes().decode("utf-8").splitlines()  # strict UTF-8: no surrogate got through
    return [json.loads(line) for line in lines[1:]]


@pytest.fixture
def cutting_server(server: Any) -> Iterator[Any]:
    """The test server, except that a prompt holding CUT_PAIR is answered with the real answer
    followed by the first half of an emoji's surrogate pair (what a server that cuts at
    max_tokens inside a pair sends: ``"4 \\ud83d"``, valid JSON)."""
    module = sys.modules[type(server.server).__module__]
    real = module.answer

    def answer(messages: list[dict[str, Any]]) -> str:
        text = real(messages)
        return f"The answer is {text} \ud83d" if "CUT_PAIR" in str(messages[-1].get("content")) else text

    module.answer = answer
    try:
        yield server
    finally:
        module.answer = real


def test_a_model_answer_with_a_lone_surrogate_is_recorded_with_a_replacement_character(
        tmp_path: Path, cutting_server: Any) -> None:
    data = tmp_path / "rows.jsonl"
    data.write_text('{"question": "CUT_PAIR What is 2 + 2?", "answer": "4"}\n'
                    '{"question": "What is 3 + 4?", "answer": "7"}\n')
    cfg = write_config(tmp_path, cutting_server.base_url, data, max_out_len=64)
    res = run_cli(cfg, cli_env(tmp_path, ORCHESTRA_LOCK_DIR=str(tmp_path / "locks")))
    assert res.returncode == 0, res.stderr
    preds = _predictions(the_run(tmp_path))
    assert [p["prediction"] for p in preds] == ["The answer is 4 \ufffd", "7"]
    assert re.search(r"rows\s+numeric_match\s+1\.0000", res.stdout), res.stdout  # "4 \ufffd" scores as 4
    # -r finds the finished outputs: nothing is asked again.
    served = cutting_server.stats()["requests"]
    again = run_cli(cfg, cli_env(tmp_path, ORCHESTRA_LOCK_DIR=str(tmp_path / "locks")), "-r")
    assert again.returncode == 0, again.stderr
    assert cutting_server.stats()["requests"] == served == 2


def test_a_data_row_with_a_lone_surrogate_runs_with_a_replacement_character(tmp_path: Path, server: Any) -> None:
    data = tmp_path / "rows.jsonl"
    data.write_text('{"question": "What is 2 + 2? \\ud800", "answer": "4"}\n'
                    '{"question": "What is 3 + 4? \\ud83d\\ude00", "answer": "7"}\n')
    cfg = write_config(tmp_path, server.base_url, data)
    res = run_cli(cfg, cli_env(tmp_path, ORCHESTRA_LOCK_DIR=str(tmp_path / "locks")))
    assert res.returncode == 0, res.stderr
    preds = _predictions(the_run(tmp_path))
    assert [p["prediction"] for p in preds] == ["4", "7"]
    prompts = json.dumps(preds, ensure_ascii=False)
    assert "What is 2 + 2? \ufffd" in prompts and "What is 3 + 4? \U0001f600" in prompts  # a real pair stays


def test_an_empty_data_file_says_it_holds_no_rows(tmp_path: Path, server: Any) -> None:
    for name, text in (("empty.jsonl", ""), ("blank.jsonl", "\n\n")):
        data = tmp_path / name
        data.write_text(text)
        cfg = write_config(tmp_path, server.base_url, data)
        for args in ((), ("--dry-run",)):
            res = run_cli(cfg, cli_env(tmp_path), *args)
            assert res.returncode == 2, res.stderr
            lines = res.stderr.strip().splitlines()
            assert lines == [f"orchestra: error: {cfg}: datasets[0] (rows): {data} holds no rows; "
                             "put at least one row in it or drop the dataset"], res.stderr
    assert not (tmp_path / "out").exists()


def test_encodable_leaves_ordinary_text_alone() -> None:
    text = "plain, é, 中文, \U0001f600"
    assert encodable(text) is text and utf8(text) == text.encode("utf-8")
    assert encodable({"a\udc80": ["x\ud800y", 1, None]}) == {"a\ufffd": ["x\ufffdy", 1, None]}


def test_a_work_dir_whose_name_is_not_utf8_is_one_line_before_anything_is_made(tmp_path: Path, server: Any) -> None:
    """A work dir named with a byte that is not UTF-8 (``out\\xff``, as a shell passes it) used to
    start the run and end it with a UnicodeEncodeError traceback from the event log, exit 1;
    every file of a run holds its paths as UTF-8 text, so it is refused up front, exit 2."""
    data = tmp_path / "rows.jsonl"
    data.write_text('{"question": "What is 2 + 2?", "answer": "4"}\n')
    cfg = write_config(tmp_path, server.base_url, data)
    for args in (["-w", os.fsdecode(bytes(tmp_path) + b"/out\xff")], ["-r", os.fsdecode(b"run\xff")]):
        res = run_cli(cfg, cli_env(tmp_path), *args)
        lines = res.stderr.splitlines()
        assert res.returncode == 2 and len(lines) == 1, res.stderr
        assert "\\xff: the name is not valid UTF-8" in lines[0] and "Traceback" not in res.stderr, lines[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache", "cfg.py", "rows.jsonl"]  # nothing made


def test_an_event_field_with_a_lone_surrogate_is_written_as_utf8(tmp_path: Path) -> None:
    """Event fields can hold text from outside (an endpoint's error, a path): a lone surrogate
    is written as U+FFFD, the line is valid UTF-8, and the events around it are kept."""
    log = EventLog(str(tmp_path / "events.jsonl"))
    log.emit("before")
    log.emit("failed", reason="endpoint said \udcff\ud83d")
    log.emit("after")
    (tmp_path / "events.jsonl").read_bytes().decode("utf-8")  # strict
    got = read_events(str(tmp_path / "events.jsonl"))
    assert [e["event"] for e in got] == ["before", "failed", "after"]
    assert got[1]["reason"] == "endpoint said \ufffd\ufffd"
