"""Task spec files (``<run>/tasks/<id>.py``) that someone else edited or damaged, and the task
scripts' own usage errors: real task processes and the real CLI.

A spec is read by the task script that runs it and by the summary (``--mode viz``, the end of
every run).  A file that is a Python literal of the wrong shape used to escape both as a
``KeyError``/``TypeError`` traceback: the task script failed without its one line, and the
summary of the whole run died with it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestra.tasks.spec import TaskSpec, Unit
from tests.tasks.test_eval_heavy import REPO, only_run, orchestra
from tests.tasks.test_loglik_template import loglik_config

DAMAGED = {
    "no units": "SPEC = {'stage': 'eval', 'task_id': 'x'}\n",
    "not a dict": "SPEC = 1\n",
    "a unit that is no dict": "SPEC = {'stage': 'eval', 'units': [1]}\n",
    "an unknown field": None,  # the real spec plus a field no TaskSpec has
    "a unit of the wrong types": None,  # the real spec with a unit whose start is text
    "an unknown stage": None,  # the real spec with stage 'bogus'
    "inputs that are no pairs": None,  # the real spec with an input of three parts
    "brackets beyond the tokenizer": "SPEC = " + "[" * 100_000 + "]" * 100_000 + "\n",
    "operators beyond the parser": "SPEC = " + "-" * 100_000 + "1\n",
}


def damaged_text(kind: str, real: str) -> str:
    text = DAMAGED[kind]
    if text is not None:
        return text
    if kind == "an unknown field":
        return real.replace("SPEC = {", "SPEC = {'priority': 'high', ", 1)
    if kind == "a unit of the wrong types":
        return real.replace("'start': 0,", "'start': 'zero',", 1)
    if kind == "inputs that are no pairs":
        return real.replace("'inputs': ((", "'inputs': (('extra', ", 1)
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
    damaged = damaged_text(kind, real)
    assert damaged != real
    try:
        results.unlink()  # the summary reads the specs to say why a result is missing
        spec.write_text(damaged)
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


DUMP_ON_A_FULL_DISK = r"""
import os, resource, signal, sys
from orchestra.tasks.spec import TaskSpec, Unit

path = sys.argv[1]
unit = Unit(dataset={'type': 'x', 'rows': 'r' * 50_000}, dataset_abbr='d', start=0, end=1, shard=None,
            num_shards=1, output='/o.jsonl', hash='h', cost=1.0)
spec = TaskSpec(stage='infer', task_id='t', run_dir='/r', model={}, model_abbr='m', units=(unit,))
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG, as on a full disk
resource.setrlimit(resource.RLIMIT_FSIZE, (10_000, resource.RLIM_INFINITY))
try:
    spec.dump(path)
except OSError as exc:
    print('refused:', exc.strerror)
"""


def test_a_spec_the_disk_refuses_leaves_the_old_one_and_no_temporary_file(tmp_path: Path) -> None:
    folder = tmp_path / "tasks"
    folder.mkdir()
    spec = folder / "t.py"
    spec.write_text("# the spec of an earlier run\n")
    res = subprocess.run([sys.executable, "-c", DUMP_ON_A_FULL_DISK, str(spec)], cwd=REPO, capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 0 and res.stdout.strip() == "refused: File too large", res.stdout + res.stderr
    assert spec.read_text() == "# the spec of an earlier run\n"
    assert os.listdir(folder) == ["t.py"]


def test_a_spec_is_written_where_its_folder_was_removed(tmp_path: Path) -> None:
    unit = Unit(dataset={"type": "x"}, dataset_abbr="d", start=0, end=3, shard=0, num_shards=2,
                output=str(tmp_path / "p.jsonl"), hash="h", cost=1.5, inputs=(("a.jsonl", "h1"),))
    spec = TaskSpec(stage="eval", task_id="t", run_dir=str(tmp_path), model={"abbr": "m"}, model_abbr="m",
                    units=(unit,), task_cfg={"k": 1}, num_gpus=1, worker_key="w")
    path = tmp_path / "gone" / "tasks" / "t.py"  # someone removed the run's tasks folder
    spec.dump(str(path))
    assert TaskSpec.load(str(path)) == spec
    assert os.listdir(path.parent) == ["t.py"]


def test_an_eval_task_whose_predictions_changed_since_its_stage_was_gated_fails_in_one_line(
        finished_run: tuple[Path, Path]) -> None:
    _, run = finished_run
    spec = run / "tasks" / "eval_det_pick.py"
    predictions = run / "predictions" / "det" / "pick.jsonl"
    kept = predictions.read_bytes()
    try:
        predictions.write_bytes(kept.replace(b'"hash": "', b'"hash": "0', 1))  # sealed for other settings
        res = task_script("eval", spec)
        assert res.returncode == 1, res.stdout + res.stderr
        assert "Traceback" not in res.stderr, res.stderr
        assert res.stderr.strip().splitlines() == [
            "[eval_det_pick] FAILED: pick: predictions predictions/det/pick.jsonl are missing or from other "
            "settings (did its infer task fail?)"], res.stderr
        predictions.unlink()
        res = task_script("eval", spec)
        assert res.returncode == 1 and "are missing or from other settings" in res.stderr, res.stderr
    finally:
        predictions.write_bytes(kept)
    assert task_script("eval", spec).returncode == 0
