"""An endpoint that echoes the API key back encoded (percent-encoded, base64 of the key and of a
``Basic`` header's ``user:key``, split across lines, JSON-escaped character by character, cut
short at the end of an error excerpt) gets none of it into the run folder (task logs,
predictions, results, events, the report's packed samples) or what the CLI prints, also with
``--debug``'s tracebacks.  Through ``python run.py`` and the real OpenAI-compatible test server
(``echo_marker``: an answer, and a 400 whose plain-text body is quoted in the error)."""

from __future__ import annotations

import base64
import json
import os
import re
import secrets
import subprocess
import sys
import urllib.parse
import zlib
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
KEY_ENV = "ORC_ECHO_TEST_KEY"


def _key() -> str:
    """A key with characters that every encoding changes (``/``, ``+``, ``=``)."""
    return f"sk-{secrets.token_urlsafe(18)}/+={secrets.token_hex(8)}"


def leaks(text: str, key: str) -> list[str]:
    """The forms of ``key`` found in ``text`` (lines joined first, so a split key is found whole)."""
    joined = re.sub(r"\s|\\+[rnt]", "", text)
    lower = joined.lower()
    found = [name for name, form in (("the key", key), ("its start", key[:8])) if form in joined]
    if urllib.parse.quote(key, safe="").lower() in lower:
        found.append("percent-encoded")
    if "".join(f"\\u{ord(c):04x}" for c in key[:8]) in lower:
        found.append("JSON-escaped")
    for prefix in (b"", b"user:", b"ab:"):
        for encode in (base64.b64encode, base64.urlsafe_b64encode):
            middle = encode(prefix + key.encode()).decode()[8:-8]  # what depends on the key alone
            if middle in joined:
                found.append(f"base64 of {prefix.decode()}key")
    return found


def _readable(path: Path) -> str:
    """A file's text; for the report, with every packed (deflated, base64) script inflated too."""
    text = path.read_bytes().decode("utf-8", errors="replace")
    if path.suffix == ".html":
        for packed in re.findall(r'<script type="application/octet-stream" id="[^"]*">([^<]*)</script>', text):
            text += zlib.decompress(base64.b64decode(packed), -15).decode("utf-8", errors="replace")
    return text


def _config(tmp_path: Path, server: Any, name: str) -> Path:
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps({"question": q, "answer": a}) + "\n" for q, a in [
        ("1 + 1", 2), ("ECHO_KEY 2 + 2", 4), ("ECHO_KEY_ERR 3 + 3", 6), ("ECHO_KEY_CUT 4 + 4", 8), ("5 + 5", 10)]))
    cfg = tmp_path / f"{name}.py"
    cfg.write_text(f"""
from orchestra.datasets import JsonlDataset
from orchestra.models import OpenAIAPI

models = [dict(type=OpenAIAPI, abbr='api', path='test-model', base_url={server.base_url!r}, key_env={KEY_ENV!r},
               max_out_len=8)]
datasets = [dict(type=JsonlDataset, abbr='rows', path={str(data)!r},
                 reader_cfg=dict(input_columns=['question'], output_column='answer'),
                 infer_cfg=dict(prompt_template='{{question}}', inferencer=dict(type='gen', max_out_len=8)),
                 eval_cfg=dict(evaluator='numeric_match'))]
work_dir = {str(tmp_path / name)!r}
""")
    return cfg


def test_an_encoded_echo_of_the_key_reaches_no_file_and_no_output(server: Any, tmp_path: Path) -> None:
    key = _key()
    server.configure(api_key=key)
    env = {**os.environ, KEY_ENV: key, "ORCHESTRA_PROGRESS_INTERVAL_S": "0.1"}
    runs = [(_config(tmp_path, server, "tolerated"), ["--cfg-options", "infer.runner.task.error_tolerance=0.5"], 0),
            (_config(tmp_path, server, "debug"), ["--debug"], 1)]  # the 400 fails the task: a traceback
    for cfg, flags, code in runs:
        res = subprocess.run([sys.executable, "run.py", str(cfg), *flags], cwd=REPO, capture_output=True, text=True,
                             timeout=120, env=env)
        assert res.returncode == code, res.stderr[-3000:]
        found = {"stdout": leaks(res.stdout, key), "stderr": leaks(res.stderr, key)}
        (run,) = (tmp_path / cfg.stem).iterdir()
        files = [p for p in run.rglob("*") if p.is_file() and not p.is_symlink()]
        assert any("predictions" in p.parts for p in files)  # the records (--debug: in-process, no task log)
        found.update({str(p.relative_to(run)): leaks(_readable(p), key) for p in files})
        assert not {where: forms for where, forms in found.items() if forms}, {w: f for w, f in found.items() if f}
        said = res.stdout + res.stderr + "".join(_readable(p) for p in files)
        assert "your key: ***" in said and "bad key ***" in said  # both echoes came, scrubbed
    assert server.stats()["per_prompt"]["ECHO_KEY_ERR 3 + 3"] >= 2
