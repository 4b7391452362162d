"""The files of a run follow the process umask, as its folders do: ``umask 002`` shares them
with the group (a report on a shared drive), ``umask 077`` keeps them private.  The run folder
itself and its work dir are never group- or other-writable (test_run_folder_trust.py)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from sec_helpers import REPO, cli_env, the_run, write_config


def _run_under(umask: int, folder: Path, base_url: str) -> Path:
    folder.mkdir()
    data = folder / "rows.jsonl"
    data.write_text('{"question": "What is 2 + 2?", "answer": "4"}\n{"question": "What is 3 + 4?", "answer": "7"}\n')
    cfg = write_config(folder, base_url, data)
    res = subprocess.run([sys.executable, "run.py", str(cfg)], cwd=REPO, capture_output=True, text=True, timeout=180,
                         env=cli_env(folder, ORCHESTRA_LOCK_DIR=str(folder / "locks")), umask=umask)
    assert res.returncode == 0, res.stderr
    return the_run(folder)


def _modes(run: Path) -> dict[str, int]:
    return {str(p.relative_to(run)): stat.S_IMODE(p.stat().st_mode) for p in [run, *run.rglob("*")]
            if not p.name.endswith(".lock")}


@pytest.mark.parametrize("umask, file_mode, dir_mode", [(0o002, 0o664, 0o775), (0o077, 0o600, 0o700)])
def test_run_outputs_follow_the_umask(tmp_path: Path, server: Any, umask: int, file_mode: int, dir_mode: int) -> None:
    run = _run_under(umask, tmp_path / f"u{umask:03o}", server.base_url)
    modes = _modes(run)
    for name in ("predictions/api/rows.jsonl", "results/api/rows.json", "summary/summary.csv", "summary/summary.md",
                 "summary/summary.json", "summary/report.html", "events.jsonl", "config.py"):
        assert modes[name] == file_mode, f"{name}: {modes[name]:o}, expected {file_mode:o}"
    for name, mode in modes.items():
        if name == ".":  # the run folder: never group- or other-writable, whatever the umask
            assert mode == dir_mode & ~0o022 == stat.S_IMODE(os.stat(run.parent).st_mode), f"{mode:o}"
            continue
        assert mode == (dir_mode if (run / name).is_dir() else file_mode), f"{name}: {mode:o}"
