"""Terminal escapes from outside never reach the terminal: an endpoint whose error message holds ESC,
BEL, CSI, OSC (and 8-bit C1) sequences, through ``python run.py``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
# retitles the window, erases the line, prints a fake green status, rings, 8-bit CSI, a carriage return
EVIL = "\x1b]0;pwned\x07\x1b[2K\x1b[1;32mALL TASKS DONE\x1b[0m\x07\x9b31m\x9d0;t\x9c\rX"
CONTROLS = [chr(c) for c in (*range(0, 9), *range(11, 32), *range(0x7F, 0xA0))]


def test_endpoint_error_with_escapes_is_printed_without_them(server: Any, tmp_path: Path) -> None:
    server.configure(bad_marker=EVIL)  # the server's 400 says "the prompt contains <EVIL>"
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps({"question": f"{i} + 1 {EVIL if i == 1 else ''}", "answer": i + 1}) + "\n"
                            for i in range(3)))
    cfg = tmp_path / "cfg.py"
    cfg.write_text(f"""
from orchestra.datasets import JsonlDataset
from orchestra.models import OpenAIAPI
from orchestra.tasks import EvalTask, InferTask

models = [dict(type=OpenAIAPI, abbr='api', path='test-model', base_url={server.base_url!r}, max_out_len=8)]
datasets = [dict(type=JsonlDataset, abbr='rows', path={str(data)!r},
                 reader_cfg=dict(input_columns=['question'], output_column='answer'),
                 infer_cfg=dict(prompt_template='{{question}}', inferencer=dict(type='gen', max_out_len=8)),
                 eval_cfg=dict(evaluator='numeric_match'))]
work_dir = {str(tmp_path / 'out')!r}
""")
    res = subprocess.run([sys.executable, "run.py", str(cfg)], cwd=REPO, capture_output=True, timeout=120,
                         env={**os.environ, "ORCHESTRA_PROGRESS_INTERVAL_S": "0.1"})
    out, err = res.stdout.decode("utf-8"), res.stderr.decode("utf-8")
    assert res.returncode == 1, err[-3000:]
    assert "HTTP 400" in err and "the prompt contains" in err and "ALL TASKS DONE" in err, err[-3000:]
    for stream in (out, err):
        found = sorted({f"{ord(c):#x}" for c in stream if c in CONTROLS})
        assert not found, (found, stream[-2000:])
    (log,) = (tmp_path / "out").glob("*/logs/infer/*.log")
    assert "\x1b]0;pwned" in log.read_text()  # the log file keeps what the endpoint sent


def test_printable_removes_whole_sequences() -> None:
    from orchestra.terminal import printable

    assert printable(EVIL) == "ALL TASKS DONEX"
    assert printable("a\tb\nc \u00e9\u4e2d") == "a\tb\nc \u00e9\u4e2d"
    assert printable("x\x1bcy\x1b[?25l\x00z\x7f") == "xyz"
