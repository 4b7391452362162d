"""A run's first task starts as soon as the plan exists (issue 40): the ``queued`` lines of tasks
that cannot start yet and the eval stage's whole queue come after it, and a run killed at any
moment of that start resumes with ``-r`` to an uninterrupted run's results, redoing nothing finished.

At 316 x 316 datasets (200,000 tasks) the lines and the eval stage's queue written first held the
first task back by seconds (``benchmarks/scale_bench.py cli``); here a few tasks show the order.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.chaos import Point, after_kill, kill_at, predictions_of, sealed_outputs, start, the_run
from tests.helpers import events, run_cli, summary_rows

DATASETS = 4
ROWS = 6


def _config(tmp_path: Path, delay_s: float = 0.0) -> Path:
    """``DATASETS`` datasets, one infer and one eval task each, one infer task at a time."""
    lines = []
    for d in range(DATASETS):
        data = tmp_path / f"d{d}.jsonl"
        data.write_text("".join(json.dumps({"question": f"{i} + {d}", "answer": i + d}) + "\n" for i in range(ROWS)))
        lines.append(f"""dict(type=JsonlDataset, abbr='d{d}', path={str(data)!r},
         reader_cfg=dict(input_columns=['question'], output_column='answer'),
         infer_cfg=dict(prompt_template='{{question}}', inferencer=dict(type='gen', max_out_len=8)),
         eval_cfg=dict(evaluator='numeric_match'))""")
    cfg = tmp_path / "cfg.py"
    cfg.write_text(f"""
from orchestra.datasets import JsonlDataset
from orchestra.models import DeterministicModel
from orchestra.partitioners import NaivePartitioner
from orchestra.runners import LocalRunner
from orchestra.tasks import EvalTask, InferTask

models = [dict(type=DeterministicModel, abbr='det', delay_s={delay_s}, batch_size=2)]
datasets = [{', '.join(lines)}]
infer = dict(partitioner=dict(type=NaivePartitioner),
             runner=dict(type=LocalRunner, max_num_workers=1, task=dict(type=InferTask)))
eval = dict(partitioner=dict(type=NaivePartitioner),
            runner=dict(type=LocalRunner, max_num_workers=1, task=dict(type=EvalTask)))
""")
    return cfg


def test_the_first_task_starts_before_the_lines_and_the_queue_of_tasks_not_needed_yet(tmp_path: Path) -> None:
    """The infer stage's first task's ``started`` line comes before the ``queued`` lines of the infer
    tasks that wait for a slot and before any line of the eval stage, and every task's first line
    is still its ``queued`` one (the run log and the summary read a task's latest line as its state).
    Before: every ``queued`` line of both stages was written before the first task started."""
    work = tmp_path / "out"
    res = run_cli(_config(tmp_path), "-w", work)
    assert res.returncode == 0, res.stderr[-2000:]
    log = [e for e in events(the_run(work)) if "task_id" in e]
    first = next(i for i, e in enumerate(log) if e["event"] == "started")
    assert log[first]["stage"] == "infer"
    later = [e["task_id"] for e in log[first + 1:] if e["event"] == "queued"]
    infer_ids = {e["task_id"] for e in log if e["stage"] == "infer"}
    eval_ids = {e["task_id"] for e in log if e["stage"] == "eval"}
    assert len(infer_ids) == len(eval_ids) == DATASETS
    assert infer_ids - {log[first]["task_id"]} <= set(later), "infer tasks queued before the first task started"
    assert eval_ids <= set(later), "the eval stage queued before the first task started"
    firsts: dict[str, str] = {}
    for e in log:
        firsts.setdefault(e["task_id"], e["event"])
    assert set(firsts.values()) == {"queued"}, firsts
    assert {(d, m): row["det"] for (d, m), row in summary_rows(the_run(work)).items()} == {
        (f"d{d}", "numeric_match"): 1.0 for d in range(DATASETS)}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The results and predictions of the config run once without a stop."""
    folder = tmp_path_factory.mktemp("clean")
    work = folder / "out"
    res = run_cli(_config(folder), "-w", work)
    assert res.returncode == 0, res.stderr[-2000:]
    return {"rows": summary_rows(the_run(work)), "predictions": predictions_of(the_run(work))}


def _lines_of(kind: str) -> Any:
    """How many ``kind`` lines a work folder's event log holds (0 before it has one)."""
    def count(work: Path) -> int:
        logs = sorted(work.glob("*/events.jsonl"))
        return logs[-1].read_bytes().count(f'"event": "{kind}"'.encode()) if logs else 0
    return count


@pytest.mark.parametrize("moment", ["started", "done"])
def test_a_run_killed_at_its_first_task_resumes_to_the_same_results(tmp_path: Path, uninterrupted: dict[str, Any],
                                                                    moment: str) -> None:
    """Every process of the run SIGKILLed once its first task has started (``started``: most
    ``queued`` lines and the eval stage's queue not written yet, most task specs not written) or
    once its first task is done: ``-r`` ends with the uninterrupted run's results and predictions,
    and redoes nothing that was finished at the kill (the file untouched, its task not started again)."""
    cfg = _config(tmp_path, delay_s=0.2)  # a task takes a moment: the kill lands while the first runs
    work = tmp_path / "out"
    proc = start(cfg, work)
    kill = kill_at(proc, work, Point(1, 0.0), "node", count=_lines_of(moment))
    assert kill is not None, "the run ended before its kill"
    after_kill(kill, work)
    run = the_run(work)
    finished = sealed_outputs(run)
    done_before = {e["task_id"] for e in events(run) if e["event"] == "done"}
    if moment == "done":
        assert finished and done_before
    again = run_cli(cfg, "-w", work, "-r")
    assert again.returncode == 0, again.stderr[-2000:]
    assert summary_rows(run) == uninterrupted["rows"]
    assert predictions_of(run) == uninterrupted["predictions"]
    after = sealed_outputs(run)
    assert {path: after[path] for path in finished} == finished, "a finished output was written again"
    log = events(run)
    resumed = max(i for i, e in enumerate(log) if e["event"] == "run_started")
    assert not {e["task_id"] for e in log[resumed:] if e["event"] == "started"} & done_before
    assert not list(run.rglob("*.tmp-*"))


def test_a_stop_within_the_first_round_still_says_each_task_queued_first(tmp_path: Path) -> None:
    """Ctrl-C once the first task has started, before most ``queued`` lines and the eval stage's
    queue are written: every task's first line is still its ``queued`` one (then ``cancelled``), the
    eval stage's waiting tasks are cancelled, not skipped (as when it queued beside the infer stage)."""
    work = tmp_path / "out"
    proc = start(_config(tmp_path, delay_s=0.2), work)
    kill = kill_at(proc, work, Point(1, 0.0), "sigint", count=_lines_of("started"))
    assert kill is not None, "the run ended before its kill"
    after_kill(kill, work)
    firsts: dict[str, str] = {}
    lasts: dict[tuple[str, str], str] = {}
    for e in events(the_run(work)):
        if "task_id" in e:
            firsts.setdefault(e["task_id"], e["event"])
            lasts[(e["stage"], e["task_id"])] = e["event"]
    assert set(firsts.values()) == {"queued"}, firsts
    assert "cancelled" in {end for (stage, _), end in lasts.items() if stage == "eval"}, lasts
    assert "skipped" not in lasts.values(), lasts
