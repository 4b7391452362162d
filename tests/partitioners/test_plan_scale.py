"""Planning at sweep scale (issue 23): linear growth, hashes that did not move, and a dry run
that summarises a large plan unless asked for the whole listing."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from test_partitioners import MODEL, ds_cfg, info, run_config

from orchestra import api
from orchestra.evaluators import evaluator_identity
from orchestra.fileio import stable_hash
from orchestra.partitioners import NaivePartitioner, SizePartitioner
from orchestra.paths import RunPaths
from orchestra.planner import dataset_key, make_plan, model_class
from tests.helpers import run_argv

REPO = Path(__file__).resolve().parents[2]


def test_unit_hashes_and_paths_are_the_per_unit_formula(tmp_path: Path) -> None:
    """The planner encodes a model's and a dataset's part of a hash once; the result must be the
    hash of the whole, as before, or every earlier run's outputs would stop counting as done."""
    models = [MODEL, {**MODEL, "abbr": "数学 model", "max_out_len": 7}]
    judged = {**ds_cfg("judged"), "eval_cfg": {"evaluator": {"type": "exact_match"}, "pred_postprocessor": "x"}}
    infos = [info("big", 1000), info("a/b", 30), info("judged", 40, cfg=judged), info("mc", 50, "loglik", 4.0)]
    paths = RunPaths(str(tmp_path / "run"))
    plan = make_plan(run_config(SizePartitioner(max_task_size=2000), NaivePartitioner(), models), infos, paths)
    by_abbr = {i.abbr: i for i in infos}
    preds: dict[tuple[str, str], list[Any]] = {}
    assert len(plan.all_units["infer"]) > len(infos) * len(models)  # 'big' is sharded
    for model_abbr, unit in plan.all_units["infer"]:
        model = next(m for m in models if m["abbr"] == model_abbr)
        mkey = model_class(model).identity(model)
        assert unit.hash == stable_hash([mkey, dataset_key(by_abbr[unit.dataset_abbr]), unit.start, unit.end])
        assert unit.output == paths.predictions(model_abbr, unit.dataset_abbr, unit.shard)
        preds.setdefault((model_abbr, unit.dataset_abbr), []).append(unit.hash)
    assert len(plan.all_units["eval"]) == len(infos) * len(models)
    for model_abbr, unit in plan.all_units["eval"]:
        ident = evaluator_identity(by_abbr[unit.dataset_abbr].cfg.get("eval_cfg", {}))
        assert unit.hash == stable_hash([preds[(model_abbr, unit.dataset_abbr)], ident])
        assert unit.output == paths.results(model_abbr, unit.dataset_abbr)
    ids = [t.task_id for tasks in plan.tasks.values() for t in tasks]
    assert len(ids) == len(set(ids))


def _write_config(folder: Path, side: int) -> dict[str, Any]:
    """``side`` models x ``side`` datasets (each its own 4-row file): 2 x side^2 tasks."""
    folder.mkdir(parents=True, exist_ok=True)
    datasets = []
    for i in range(side):
        path = folder / f"d{i}.jsonl"
        path.write_text("".join(json.dumps({"question": f"{r} + {i}?", "answer": str(r + i)}) + "\n"
                                for r in range(4)))
        datasets.append(dict(type="JsonlDataset", abbr=f"d{i}", path=str(path),
                             reader_cfg=dict(input_columns=["question"], output_column="answer"),
                             infer_cfg=dict(prompt_template="{question}", inferencer=dict(type="gen", max_out_len=8)),
                             eval_cfg=dict(evaluator="numeric_match")))
    models = [dict(type="DeterministicModel", abbr=f"m{i}", path=f"det-{i}") for i in range(side)]
    return dict(models=models, datasets=datasets, work_dir=str(folder / "out"),
                infer=dict(partitioner=dict(type=SizePartitioner, max_task_size=80, granularity=1)),
                eval=dict(partitioner=dict(type=NaivePartitioner)))


def _plan_cpu_s(cfg: dict[str, Any], tasks: int, repeats: int = 3) -> float:
    """The least process CPU time of ``repeats`` plans (after one to warm imports and caches)."""
    best = float("inf")
    for n in range(repeats + 1):
        t0 = time.process_time()
        view = api.plan(cfg)
        spent = time.process_time() - t0
        assert sum(len(t) for t in view.tasks.values()) == tasks
        if n:
            best = min(best, spent)
    return best


def test_planning_grows_linearly_in_cpu_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """4x the tasks may cost at most 6x the CPU time (linear: 4x; anything quadratic: ~16x).

    Process CPU time, not wall, so that other processes on a busy machine do not count; the
    best of a few repeats, so that a stray collection or page fault does not either."""
    monkeypatch.setenv("ORCHESTRA_CACHE_DIR", str(tmp_path / "cache"))
    small = _plan_cpu_s(_write_config(tmp_path / "small", 50), 5000)
    large = _plan_cpu_s(_write_config(tmp_path / "large", 100), 20000)
    assert large <= 6 * small, f"planning 20,000 tasks took {large:.3f} s of CPU, 5,000 took {small:.3f} s"


def _cli(*args: Any) -> subprocess.CompletedProcess[str]:
    return run_argv([sys.executable, "run.py", *map(str, args)], timeout=300)  # forked: tests/cli_fork.py


def test_dry_run_summarises_a_large_plan_and_lists_it_on_request(tmp_path: Path) -> None:
    cfg = _write_config(tmp_path, 6)  # 36 infer + 36 eval tasks
    path = tmp_path / "cfg.py"
    path.write_text(f"from orchestra.partitioners import NaivePartitioner, SizePartitioner\n"
                    f"models = {cfg['models']!r}\ndatasets = {cfg['datasets']!r}\nwork_dir = {cfg['work_dir']!r}\n"
                    "infer = dict(partitioner=dict(type=SizePartitioner, max_task_size=80, granularity=1))\n"
                    "eval = dict(partitioner=dict(type=NaivePartitioner))\n")
    summary = _cli(path, "--dry-run")
    assert summary.returncode == 0, summary.stderr
    for stage in ("infer", "eval"):
        assert f"[{stage}] 36 task(s) to run" in summary.stdout
        assert "  36 tasks, 144 sample(s)" in summary.stdout
        assert summary.stdout.count(f"\n  {stage}_m") == api.PlanView.SUMMARY_TASKS
    assert summary.stdout.count("... 16 more task(s) (--dry-run --list prints every task)") == 2
    full = _cli(path, "--dry-run", "--list")
    assert full.returncode == 0, full.stderr
    for stage in ("infer", "eval"):
        listed = {line.split()[0] for line in full.stdout.splitlines() if line.startswith(f"  {stage}_m")}
        assert listed == {f"{stage}_m{m}_d{d}" for m in range(6) for d in range(6)}
    assert "more task(s)" not in full.stdout and full.stdout.count("$ ") == 72
    alone = _cli(path, "--list")
    assert alone.returncode == 2 and alone.stderr.strip() == "orchestra: error: --list needs --dry-run (it lists the " \
        "tasks a run would start)"
    assert not (tmp_path / "out").exists()


def test_one_item_per_bin_is_largest_first_as_the_general_path_gives() -> None:
    from orchestra.partitioners.base import balanced_bins

    costs = [3.0, 1.0, 7.0, 1.0, 2.5]
    assert balanced_bins(costs, 5) == [[2], [0], [4], [1], [3]]
    assert balanced_bins(costs, 9) == [[2], [0], [4], [1], [3]]
    # the general path (a zero cost keeps it) agrees on the positive ones
    assert balanced_bins([*costs, 0.0], 6)[:5] == [[2], [0], [4], [1], [3]]
