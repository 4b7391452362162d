"""``ORCHESTRA_PROGRESS_INTERVAL_S`` given a value that is not a positive number of seconds is a
usage error before anything runs (it silently meant 30 s), through the real CLI."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.helpers import run_cli


@pytest.mark.parametrize("value", ["fast", "-5", "0", "nan", "inf", "1e999"])
def test_a_bad_progress_interval_is_one_line_naming_the_variable(tmp_path: Path, value: str) -> None:
    env = {**os.environ, "ORCHESTRA_PROGRESS_INTERVAL_S": value}
    work = tmp_path / "out"
    done = run_cli("configs/eval_demo.py", "-w", work, env=env, timeout=120)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"orchestra: error: ORCHESTRA_PROGRESS_INTERVAL_S={value!r}: ") \
        and "seconds" in lines[0], lines[0]
    assert not work.exists()  # refused before the run folder was made


def test_a_good_progress_interval_still_runs(tmp_path: Path) -> None:
    env = {**os.environ, "ORCHESTRA_PROGRESS_INTERVAL_S": "0.5"}
    done = run_cli("configs/eval_demo.py", "-w", tmp_path / "out", "--dry-run", env=env, timeout=120)
    assert done.returncode == 0, done.stderr
