"""Task spec files (``<run>/tasks/<id>.py``) that someone else edited or damaged, and the task
scripts' own usage errors: real task processes and the real CLI.

A spec is read by the task script that runs it and by the summary (``--mode viz``, the end of
every run).  A file that is a Python literal of the wrong shape used to escape both as a
``KeyError``/``TypeError`` traceback: the task script failed without its one line, and the
summary of the whole run died with it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from orchestra.tasks.spec import TaskSpec
from tests.tasks.test_eval_heavy import REPO, only_run, orchestra
from tests.tasks.test_loglik_template import loglik_config

DAMAGED = {
    "no units": "SPEC = {'stage': 'eval', 'task_id': 'x'}\n",
    "not a dict": "SPEC = 1\n",
    "a unit that is no dict": "SPEC = {'stage': 'eval', 'units': [1]}\n",
    "an unknown field": None,  # the real spec plus a field no TaskSpec has
    "a unit of the wrong types": None,  # the real spec with a unit whose start is text
    "an unknown stage": None,  # the real spec with stage 'bogus'
    "nested beyond the parser": "SPEC = " + "[" * 100_000 + "]" * 100_000 + "\n",
}


def damaged_text(kind: str, real: str) -> str:
    text = DAMAGED[kind]
    if text is not None:
        return text
    if kind == "an unknown field":
        return real.replace("SPEC = {", "SPEC = {'priority': 'high', ", 1)
    if kind == "a unit of the wrong types":
        return real.replace("'start': 0,", "'start': 'zero',", 1)
    assert kind == "an unknown stage"
    return real.replace("'stage': 'eval'", "'stage': 'bogus'", 1)


def task_script(stage: str, *args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", f"orchestra.tasks.{stage}", *map(str, args)], cwd=REPO,
                          capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A finished run of one loglik dataset (config, run folder)."""
    tmp = tmp_path_factory.mktemp("specs")
    rows = [{"q": f"w{i}", "choices": ["x", f"w{i}"], "label": 1} for i in range(4)]
    cfg = loglik_config(tmp, rows, None)
    res = orchestra(cfg)
    assert res.returncode == 0, res.stdout + res.stderr
    return cfg, only_run(tmp)


@pytest.mark.parametrize("kind", list(DAMAGED))
def test_a_damaged_spec_is_one_line_from_the_task_and_the_summary_still_reads_the_run(
        finished_run: tuple[Path, Path], kind: str) -> None:
    cfg, run = finished_run
    spec = run / "tasks" / "eval_det_pick.py"
    real = spec.read_text()
    assert TaskSpec.load(str(spec)).units  # the real one reads
    results = run / "results" / "det" / "pick.json"
    kept = results.read_bytes()
    try:
        results.unlink()  # the summary reads the specs to say why a result is missing
        spec.write_text(damaged_text(kind, real))
        res = task_script("eval", spec)
        assert res.returncode == 2, res.stdout + res.stderr
        assert "Traceback" not in res.stderr, res.stderr
        (line,) = res.stderr.strip().splitlines()
        assert line.startswith(f"{spec}: cannot read task spec: "), line
        viz = orchestra(cfg, "--mode", "viz", "-r")
        assert viz.returncode == 1, viz.stdout + viz.stderr
        assert "Traceback" not in viz.stdout + viz.stderr, viz.stdout + viz.stderr
        assert "- det / pick: " in viz.stdout, viz.stdout
    finally:
        spec.write_text(real)
        results.write_bytes(kept)


def test_the_task_scripts_usage_errors_are_one_line_and_exit_2(tmp_path: Path) -> None:
    for args in ([], ["a.py", "b.py"]):
        res = task_script("infer", *args)
        assert res.returncode == 2 and res.stderr.strip().splitlines() == [
            "usage: python -m orchestra.tasks.<infer|eval> <task spec file>"], res.stderr
    for path, why in ((tmp_path / "missing.py", "No such file"), (tmp_path / "notes.py", "no 'SPEC = '")):
        if path.name == "notes.py":
            path.write_text("print('not a spec')\n")
        res = task_script("eval", path)
        assert res.returncode == 2, res.stderr
        (line,) = res.stderr.strip().splitlines()
        assert line.startswith(f"{path}: cannot read task spec: ") and why in line, line
