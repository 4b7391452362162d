"""-r after a SIGKILL: what writers killed in the middle of a write left is cleared (found by the
chaos test, tests/e2e/test_chaos_resume.py, which kills runs at seeded moments)."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

import pytest

from orchestra.api import viz as orchestra_viz
from tests.helpers import run_cli, run_dirs


def _config(tmp_path: Path) -> Path:
    """A small real run: 40 rows, two infer shards, a deterministic model, LocalRunner."""
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps({"question": f"{i} + 1", "answer": i + 1}) + "\n" for i in range(40)))
    cfg = tmp_path / "cfg.py"
    cfg.write_text(f"""
from orchestra.datasets import JsonlDataset
from orchestra.models import DeterministicModel
from orchestra.partitioners import SizePartitioner
from orchestra.runners import LocalRunner
from orchestra.tasks import InferTask

models = [dict(type=DeterministicModel, abbr='det')]
datasets = [dict(type=JsonlDataset, abbr='rows', path={str(data)!r},
                 reader_cfg=dict(input_columns=['question'], output_column='answer'),
                 infer_cfg=dict(prompt_template='{{question}}', inferencer=dict(type='gen', max_out_len=8)),
                 eval_cfg=dict(evaluator='numeric_match'))]
infer = dict(partitioner=dict(type=SizePartitioner, max_task_size=20, gen_task_coef=1),
             runner=dict(type=LocalRunner, task=dict(type=InferTask)))
""")
    return cfg


def test_resume_clears_what_killed_writers_left(tmp_path: Path) -> None:
    """What a SIGKILL leaves in the middle of a write, planted where the chaos runs found it (a
    prediction's temporary file), and where it may land as well: -r leaves none of it behind.
    Before: every one stayed in the run folder for good."""
    cfg = _config(tmp_path)
    work = tmp_path / "out"
    first = run_cli(cfg, "-w", work)
    assert first.returncode == 0, first.stderr[-2000:]
    (run,) = run_dirs(work)
    preds = run / "predictions" / "det"
    shards = sorted(preds.glob("rows_*.jsonl"))
    assert len(shards) >= 2
    done, redone = shards[0].name, shards[1].name
    planted = [
        # a finished shard whose task was killed after sealing it, before dropping its checkpoint
        preds / f"{done}.ckpt", preds / f"{done}.ckpt.lock", preds / f".tmp-0a1b2c3d{done}",
        preds / f".tmp-00ff00ff{redone}",  # a shard written again: its first write was killed
        run / "results" / "det" / ".tmp-12345678rows.json", run / "results" / "det" / ".tmp-9abcdef0rows.details.jsonl",
        run / "summary" / ".tmp-deadbeefreport.html", run / "tasks" / "infer_det_rows_0+1.py.tmp-123-456"]
    shards[1].unlink()
    for path in planted:
        path.write_text("{}\n")
    again = run_cli(cfg, "-w", work, "-r")
    assert again.returncode == 0, again.stderr[-2000:]
    assert shards[1].exists()
    assert not [str(p.relative_to(run)) for p in planted if p.exists()]
    assert not [p for p in run.rglob("*") if ".tmp-" in p.name or p.name.endswith((".ckpt", ".ckpt.lock"))]


def test_resume_leaves_the_temporary_files_of_a_live_viz_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                               ) -> None:
    """--mode viz takes no run lock (it may look at a running run): a -r starting while it writes
    the summary must not take its temporary files for a killed writer's.  Before: the -r removed
    the one viz was about to rename, and viz failed with FileNotFoundError."""
    cfg = _config(tmp_path)
    work = tmp_path / "out"
    assert run_cli(cfg, "-w", work).returncode == 0
    (run,) = run_dirs(work)
    paused, go = threading.Event(), threading.Event()
    replace = os.replace

    def slow_replace(src: Any, dst: Any, **kw: Any) -> None:  # viz between its write and its rename
        if threading.current_thread().name == "viz" and os.path.basename(str(dst)) == "summary.md":
            paused.set()
            assert go.wait(120)
        replace(src, dst, **kw)

    monkeypatch.setattr(os, "replace", slow_replace)
    failed: list[BaseException] = []

    def viz() -> None:
        try:
            orchestra_viz(str(run), quiet=True)
        except BaseException as exc:
            failed.append(exc)

    thread = threading.Thread(target=viz, name="viz")
    thread.start()
    try:
        while not paused.wait(0.2):
            assert thread.is_alive(), failed
        assert [p.name for p in (run / "summary").glob(".tmp-*summary.md")]  # viz's, being written
        again = run_cli(cfg, "-w", work, "-r")
        assert again.returncode == 0, again.stderr[-2000:]
    finally:
        go.set()
        thread.join(120)
    assert not failed, failed
    assert not [p for p in run.rglob("*") if ".tmp-" in p.name]
