"""-r after a SIGKILL: what writers killed in the middle of a write left is cleared (found by the
chaos test, tests/e2e/test_chaos_resume.py, which kills runs at seeded moments)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.helpers import run_cli, run_dirs


def test_resume_clears_what_killed_writers_left(tmp_path: Path) -> None:
    """What a SIGKILL leaves in the middle of a write, planted where the chaos runs found it (a
    prediction's temporary file), and where it may land as well: -r leaves none of it behind.
    Before: every one stayed in the run folder for good."""
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
