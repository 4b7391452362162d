"""Eval tasks declare what their evaluator occupies, and the stages share one machine's slots.

The unit tests pin :class:`HostCapacity`' rules; the last test runs a real two-stage run (local
processes, stages side by side) where the judge of the eval stage is a model on the same single
(fake) GPU as inference: the eval task waits for the GPU instead of sharing it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orchestra
from orchestra.evaluators import evaluator_resources
from orchestra.events import read_events
from orchestra.models.fake import DeterministicModel
from orchestra.planner import _eval_needs
from orchestra.runners import LocalRunner
from orchestra.runners.core.host import HostCapacity
from orchestra.tasks import EvalTask, InferTask
from orchestra.tasks.spec import Unit

REPO = Path(__file__).resolve().parents[3]


def test_inference_never_waits_for_cores_eval_takes_what_is_left() -> None:
    host = HostCapacity(cores=4)
    assert host.take("infer", 3, [], 0, 1) == []
    assert host.take("eval", 2, [], 0, 1) == []  # the first eval task always runs
    assert host.take("eval", 1, [], 0, 1) is None  # 3 + 2 + 1 > 4 cores
    assert host.take("infer", 1, [], 0, 1) == []  # inference goes ahead regardless
    host.give("infer", 3, [])
    assert host.take("eval", 1, [], 0, 1) == []  # 1 + 2 + 1 = 4 cores: fits
    assert host.take("eval", 1, [], 0, 1) is None
    assert host.held()["cores"] == {"infer": 1, "eval": 3} and host.held()["tasks"] == {"infer": 1, "eval": 2}
    host.give("eval", 2, [])
    assert host.take("eval", 5, [], 0, 1) is None  # more than the machine: only as the one eval task
    host.give("eval", 1, [])
    assert host.take("eval", 5, [], 0, 1) == []


def test_a_gpu_is_held_across_stages() -> None:
    host = HostCapacity(cores=8)
    assert host.take("infer", 1, ["0", "1"], 1, 1) == ["0"]
    assert host.take("eval", 1, ["0", "1"], 1, 1) == ["1"]
    assert host.take("eval", 1, ["0", "1"], 1, 1) is None  # both GPUs taken, by either stage
    assert host.take("infer", 1, ["0", "1"], 2, 2) == ["0", "1"]  # two per GPU allowed
    host.give("infer", 1, ["0"])
    assert host.held()["gpus"] == {"0": 1, "1": 2}
    assert host.take("eval", 1, ["0", "1"], 1, 2) == ["0"]


def unit(evaluator: Any) -> Unit:
    return Unit(dataset={"abbr": "d", "eval_cfg": {"evaluator": evaluator}}, dataset_abbr="d", start=0, end=1,
                shard=None, num_shards=1, output="o", hash="h", cost=1.0)


def test_evaluators_declare_what_an_eval_task_occupies() -> None:
    gpu_judge = {"type": "judge", "judge": {"type": DeterministicModel, "abbr": "j", "run_cfg": {"num_gpus": 2}}}
    api_judge = {"type": "judge", "judge": {"type": "orchestra.models.OpenAIAPI", "path": "m"}}
    code = {"type": "code_exec", "max_sandboxes": 3}
    assert evaluator_resources({}) == {"num_gpus": 0, "num_procs": 1}
    assert evaluator_resources({"evaluator": "accuracy"}) == {"num_gpus": 0, "num_procs": 1}
    assert evaluator_resources({"evaluator": gpu_judge}) == {"num_gpus": 2, "num_procs": 1}
    assert evaluator_resources({"evaluator": api_judge}) == {"num_gpus": 0, "num_procs": 1}
    assert evaluator_resources({"evaluator": code}) == {"num_gpus": 0, "num_procs": 3}
    assert evaluator_resources({"evaluator": {"type": "code_exec"}}) == {"num_gpus": 0, "num_procs": 1}
    # An eval task of several datasets needs the most any of them does.
    assert _eval_needs([unit(code), unit(gpu_judge), unit("accuracy")]) == {"num_gpus": 2, "num_procs": 3}


def test_a_judge_on_the_inference_gpu_waits_for_it(tmp_path: Path) -> None:
    gpu_model = {"type": DeterministicModel, "batch_size": 2, "load_s": 1.5, "run_cfg": {"num_gpus": 1}}
    datasets = [
        {"type": "orchestra.datasets.JsonlDataset", "abbr": f"arith{i}", "path": str(REPO / "configs/data/arith.jsonl"),
         "reader_cfg": {"input_columns": ["question"], "output_column": "answer", "test_range": f"[{i}:{i + 4}]"},
         "infer_cfg": {"prompt_template": "Question: {question}\nAnswer:",
                       "inferencer": {"type": "gen", "max_out_len": 16}},
         "eval_cfg": {"evaluator": {"type": "judge", "judge": {**gpu_model, "abbr": "judge"},
                                    "prompt_template": "Grade it. Rating: [[{answer}]]"}}}
        for i in range(3)
    ]
    cfg = {
        "models": [{**gpu_model, "abbr": "det"}],
        "datasets": datasets,
        "infer": {"partitioner": {"type": "orchestra.partitioners.NaivePartitioner"},
                  "runner": {"type": LocalRunner, "max_num_workers": 2, "gpus": ["0"], "task": {"type": InferTask}}},
        "eval": {"partitioner": {"type": "orchestra.partitioners.NaivePartitioner"},
                 "runner": {"type": LocalRunner, "max_num_workers": 2, "gpus": ["0"], "task": {"type": EvalTask}}},
    }
    run = orchestra.run(cfg, work_dir=str(tmp_path / "out"), quiet=True)
    assert run.status == "done", run.failed
    events = read_events(Path(run.run_dir) / "events.jsonl")
    spans: dict[str, list[float]] = {}
    for e in events:
        if e["event"] in ("started", "done"):
            spans.setdefault(e["task_id"], []).append(e["ts"])
    starts = {e["task_id"]: e for e in events if e["event"] == "started"}
    assert len(starts) == 6 and all(s["resources"]["gpu_ids"] == ["0"] for s in starts.values())
    # One GPU, one task at a time on it, whichever its stage: no two spans overlap.
    ordered = sorted(spans.values())
    assert all(a[1] <= b[0] for a, b in zip(ordered, ordered[1:])), ordered
