"""Batch mode through ``run.py`` when ``-r`` packs the same shards into other tasks: a dataset
added to the config between a run killed mid-batch and its ``-r`` keeps the other datasets'
predictions (docs/runners.md, SizePartitioner), so the requests the killed run's batches hold
must be waited for, not sent again, though the task holding them now has another id."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
from pathlib import Path
from typing import Any

_spec = importlib.util.spec_from_file_location("orchestra_test_batch_run_rg",
                                               os.path.join(os.path.dirname(__file__), "test_batch_run.py"))
assert _spec is not None and _spec.loader is not None
br = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(br)


def _config(tmp_path: Path, base_url: str, names: list[str]) -> Path:
    """One JSONL dataset per name (6 rows each, distinct questions), all packed into one task."""
    data = tmp_path / "data"
    data.mkdir(exist_ok=True)
    entries = []
    for k, name in enumerate(names):
        with open(data / f"{name}.jsonl", "w") as f:
            for i in range(6):
                f.write(json.dumps({"question": f"What is {i} + {100 * k + i}?", "answer": str(100 * k + 2 * i)})
                        + "\n")
        entries.append(f"""dict(type=JsonlDataset, abbr={name!r}, path={str(data / f'{name}.jsonl')!r},
         reader_cfg=dict(input_columns=['question'], output_column='answer'),
         infer_cfg=dict(prompt_template='{{question}}', inferencer=dict(type='gen', max_out_len=16)),
         eval_cfg=dict(evaluator=dict(type='numeric_match'))),""")
    cfg = tmp_path / "cfg.py"
    cfg.write_text(f"""
from orchestra.datasets import JsonlDataset
from orchestra.models import OpenAIAPI
from orchestra.partitioners import NaivePartitioner, SizePartitioner
from orchestra.runners import LocalRunner
from orchestra.tasks import EvalTask, InferTask

models = [dict(type=OpenAIAPI, abbr='gpt-batch', path='test-model', base_url={base_url!r},
               key_env='BATCH_TEST_KEY', max_out_len=16, max_retries=3,
               batch=dict(size=100, poll_s=0.2, flush_s=0.2))]
datasets = [{''.join(entries)}]
infer = dict(
    partitioner=dict(type=SizePartitioner, max_task_size=10_000, gen_task_coef=1, granularity=1),
    runner=dict(type=LocalRunner, max_num_workers=1, retry=0, task=dict(type=InferTask)),
)
eval = dict(partitioner=dict(type=NaivePartitioner), runner=dict(type=LocalRunner, task=dict(type=EvalTask)))
work_dir = {str(tmp_path / 'out')!r}
""")
    return cfg


def test_a_task_packed_otherwise_after_a_config_edit_waits_for_the_killed_runs_batch(
        tmp_path: Path, batch_server: Any) -> None:
    batch_server.configure(turnaround_s=4.0)
    proc = br._start(_config(tmp_path, batch_server.base_url, ["a", "b"]))
    run_dir: list[Path] = []

    def created() -> bool:
        if not run_dir:
            run_dir.extend(p for p in (tmp_path / "out").glob("*") if p.is_dir())
        return bool(run_dir) and (run_dir[0] / "batches" / "gpt-batch.jsonl").exists() and any(
            line["state"] == "created" for line in br.ledger(run_dir[0]))

    br._wait_for(created)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=30)
    assert len(batch_server.stats().submitted) == 12  # a's and b's rows, in the killed run's batch
    res = br.orchestra(_config(tmp_path, batch_server.base_url, ["a", "b", "c"]), "-r", "latest")
    assert res.returncode == 0, res.stderr
    run = br.the_run(tmp_path)
    tasks = {e["task_id"] for e in br.events(run, "done") if e["stage"] == "infer"}
    assert tasks == {"infer_gpt-batch_a+2"}, tasks  # before: infer_gpt-batch_a+1
    summary = json.loads((run / "summary" / "summary.json").read_text())
    assert all(row["gpt-batch"] == 1.0 for row in summary["rows"]), summary["rows"]
    st = batch_server.stats()
    assert len(st.submitted) >= 18 and sorted(st.prompts.values()) == [1] * 18, st.prompts
