"""A value of the wrong type or range anywhere in a config is one line naming the file, the key
and what is valid, exit 2, before anything runs: models, datasets and their sub-configs,
stages, a sweep and the report's prices.  Each case is a JSON config (one field of a good one
changed) given to the real CLI; the control is the good config itself."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.cli_fork import ForkedCLI

REPO = Path(__file__).resolve().parents[2]
TINY = str(REPO / "tests" / "bad_configs" / "tiny.jsonl")
MODEL = {"type": "DeterministicModel", "abbr": "m"}
DATASET = {"type": "JsonlDataset", "abbr": "d", "path": TINY,
           "reader_cfg": {"input_columns": ["question"], "output_column": "answer"},
           "infer_cfg": {"prompt_template": "{question}"}}
SWEEP = {"models.batch_size": [1, 2]}


def model(**kw: Any) -> list[dict[str, Any]]:
    return [{**MODEL, **kw}]


def dataset(**kw: Any) -> list[dict[str, Any]]:
    return [{**DATASET, **kw}]


def infer_cfg(**kw: Any) -> dict[str, Any]:
    return {"prompt_template": "{question}", **kw}


# case -> (the config's changed top-level keys, what the one line names, what it says)
CASES: dict[str, tuple[dict[str, Any], str, str]] = {
    "model not a dict": ({"models": ["m"]}, "models[0]", "a model is a dict with 'type' and 'abbr', got 'm'"),
    "model without type": ({"models": [{"abbr": "m"}]}, "models[0]", "a model is a dict with 'type' and 'abbr'"),
    "run_cfg a list": ({"models": model(run_cfg=[1])}, "models[0].run_cfg", "expected a dict with num_gpus, num_procs"),
    "run_cfg negative": ({"models": model(run_cfg={"num_gpus": -1})}, "models[0].run_cfg.num_gpus",
                         "expected an integer >= 0, got -1"),
    "run_cfg bool": ({"models": model(run_cfg={"num_procs": True})}, "models[0].run_cfg.num_procs",
                     "expected an integer >= 0, got True"),
    "abbr a number": ({"models": [{**MODEL, "abbr": 5}]}, "models[0].abbr", "expected str, got int 5"),
    "abbr empty": ({"models": [{**MODEL, "abbr": ""}]}, "models[0]", "missing required key 'abbr'"),
    "models a dict": ({"models": MODEL}, "models must be a non-empty list", "got {'type': 'DeterministicModel'"),
    "dataset not a dict": ({"datasets": [3]}, "datasets[0]", "a dataset is a dict with 'type', 'abbr', 'path', got 3"),
    "datasets a string": ({"datasets": "d"}, "datasets must be a non-empty list", "got 'd'"),
    "columns a string": ({"datasets": dataset(reader_cfg={"input_columns": "question"})},
                         "datasets[0].reader_cfg.input_columns", "expected a list of column names, got 'question'"),
    "fewshot a number": ({"datasets": dataset(infer_cfg=infer_cfg(fewshot=5))}, "datasets[0].infer_cfg.fewshot",
                         "expected a dict such as dict(k=5), got 5"),
    "fewshot unknown key": ({"datasets": dataset(infer_cfg=infer_cfg(fewshot={"n": 5}))},
                            "datasets[0].infer_cfg.fewshot", "unknown key 'n'; valid keys: k, separator, source"),
    "template a number": ({"datasets": dataset(infer_cfg={"prompt_template": 5})},
                          "datasets[0].infer_cfg.prompt_template", "expected a string such as 'Q: {question}'"),
    "chat message without content": ({"datasets": dataset(infer_cfg={"prompt_template": [{"role": "user"}]})},
                                     "datasets[0].infer_cfg.prompt_template", "dict(role=..., content=...) messages"),
    "inferencer a number": ({"datasets": dataset(infer_cfg=infer_cfg(inferencer=5))},
                            "datasets[0].infer_cfg.inferencer", "expected a dict such as dict(type='gen'), got 5"),
    "evaluator a number": ({"datasets": dataset(eval_cfg={"evaluator": 5})}, "datasets[0].eval_cfg.evaluator",
                           "type must be a class or a name, got 5"),
    "abbr like a shard": ({"datasets": [DATASET, {**DATASET, "abbr": "d_1"}]}, "datasets[1].abbr 'd_1'",
                          "would share file names with the shards of datasets[0].abbr 'd'"),
    "work_dir empty": ({"work_dir": ""}, "work_dir", "must be a path string, got ''"),
    "overlap a string": ({"eval": {"overlap": "yes"}}, "eval.overlap", "expected True or False, got 'yes'"),
    "runner type None": ({"infer": {"runner": {"type": None, "max_num_workers": 2}}}, "infer.runner",
                         "missing required key 'type'; valid: DLCRunner, LocalRunner"),
    "runner without type, a key of another": ({"infer": {"runner": {"partition": "gpu"}}}, "infer.runner",
                                              "unknown key 'partition' for LocalRunner; valid keys:"),
    "task a string": ({"infer": {"runner": {"type": "LocalRunner", "task": "InferTask"}}}, "infer.runner.task",
                      "expected dict(type=InferTask|EvalTask), got 'InferTask'"),
    "task unknown key": ({"eval": {"runner": {"type": "LocalRunner", "task": {"type": "EvalTask", "n": 1}}}},
                         "eval.runner.task", "unknown key 'n' for EvalTask; it takes no keys"),
    "partitioner a string": ({"infer": {"partitioner": "SizePartitioner"}}, "infer.partitioner",
                             "expected a dict with a 'type' key, got 'SizePartitioner'"),
    "sweep a list": ({"sweep": [1]}, "sweep", "expected a dict with models, datasets, params"),
    "sweep max_variants 0": ({"sweep": {"params": SWEEP, "max_variants": 0}}, "sweep.max_variants",
                             "expected an integer >= 1, got 0"),
    "sweep max_variants bool": ({"sweep": {"params": SWEEP, "max_variants": True}}, "sweep.max_variants",
                                "expected an integer >= 1, got True"),
    "sweep without axes": ({"sweep": {"params": {}}}, "sweep.params", "expected a dict of 'models.<key>'"),
    "sweep values a string": ({"sweep": {"params": {"models.batch_size": "12"}}}, "sweep.params['models.batch_size']",
                              "expected a list of values or a dict of named values, got '12'"),
    "sweep unknown key": ({"sweep": {"params": SWEEP, "paramz": 1}}, "sweep", "unknown key 'paramz'; valid keys"),
    "sweep baseline a list": ({"sweep": {"params": SWEEP, "baseline": [1]}}, "sweep.baseline",
                              "expected a dict of axis name -> value name, got [1]"),
    "sweep baseline not an axis": ({"sweep": {"params": SWEEP, "baseline": {"nope": 1}}}, "sweep.baseline",
                                   "'nope' is not an axis; axes: batch_size"),
    "sweep axes of one name": ({"sweep": {"params": {**SWEEP, "datasets.x.batch_size": [1]}}}, "sweep.params",
                               "two axes end in 'batch_size'; labels would be ambiguous"),
    "sweep values of one name": ({"sweep": {"params": {"models.batch_size": [1, 1]}}},
                                 "sweep.params['models.batch_size']", "two values have the same name"),
    "sweep base without abbr": ({"models": [{"type": "DeterministicModel"}], "sweep": {"params": SWEEP}}, "sweep",
                                "models[0] needs an 'abbr' to name its variants"),
    "prices a list": ({"prices": [1]}, "prices", "must be a dict of model abbr -> dict(input_per_1m_tokens"),
    "prices of no model": ({"prices": {"x": {}}}, "prices", "no model has abbr 'x'; models: m"),
    "prices unknown key": ({"prices": {"m": {"per_token": 1}}}, "prices.m", "unknown key 'per_token'; valid keys"),
    "price negative": ({"prices": {"m": {"per_request": -1}}}, "prices.m.per_request",
                       "expected a number >= 0, got -1"),
    "price not a number": ({"prices": {"m": {"per_gpu_hour": float("nan")}}}, "prices.m.per_gpu_hour",
                           "expected a number >= 0, got nan"),
    "currency a number": ({"prices": {"m": {"currency": 5}}}, "prices.m.currency", "expected a name such as 'USD'"),
    "price entry a number": ({"prices": {"m": 5}}, "prices.m", "expected a dict with input_per_1m_tokens"),
    "credentials in a URL": ({"datasets": dataset(path="https://user:pw@example.com/x.jsonl")}, "datasets[0].path",
                             "a URL with a user and password in it"),
}


def _cli(cli: ForkedCLI, config: Path, work: Path) -> subprocess.CompletedProcess[str]:
    """``run.py CONFIG --dry-run`` to its end (forked: ``tests/cli_fork.py``)."""
    return cli.run([sys.executable, "run.py", str(config), "--dry-run"], cwd=REPO, capture_output=True,
                   text=True, timeout=120, env={**os.environ, "ORCHESTRA_CACHE_DIR": str(work / "cache")})


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory, cli: ForkedCLI
            ) -> dict[str, tuple[Path, subprocess.CompletedProcess[str]]]:
    """Every case (and the good config, as ``control``) through the CLI, four at a time."""
    work = tmp_path_factory.mktemp("wrong_types")
    configs: dict[str, Path] = {}
    for i, (name, (changed, _, _)) in enumerate({"control": ({}, "", ""), **CASES}.items()):
        path = configs[name] = work / f"case{i}.json"
        path.write_text(json.dumps({"models": model(), "datasets": dataset(), "work_dir": str(work / "out"),
                                    **changed}))
    with ThreadPoolExecutor(max_workers=4) as pool:
        done = pool.map(lambda p: _cli(cli, p, work), configs.values())
        return {name: (path, res) for (name, path), res in zip(configs.items(), done)}


def test_the_good_config_plans(results: dict[str, tuple[Path, subprocess.CompletedProcess[str]]]) -> None:
    _, res = results["control"]
    assert res.returncode == 0 and "[infer] 1 task(s)" in res.stdout, res.stderr


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_wrong_value_is_one_line_naming_file_key_and_what_is_valid(
        name: str, results: dict[str, tuple[Path, subprocess.CompletedProcess[str]]]) -> None:
    path, res = results[name]
    _, key, said = CASES[name]
    lines = res.stderr.splitlines()
    assert res.returncode == 2 and len(lines) == 1 and "Traceback" not in res.stderr, res.stderr
    assert lines[0].startswith(f"orchestra: error: {path}: {key}"), lines[0]
    assert said in lines[0], lines[0]
    assert res.stdout == ""
