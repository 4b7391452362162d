"""No numeric setting of any config object takes NaN or infinity: each is one line naming the
file, the key and the value, exit 2, before anything runs.

``nan`` passes every range check written as a comparison (``poll_s > 0`` is False for it, so
``poll_s <= 0`` never fires) and ``inf`` passes ``> 0``: with ``batch.poll_s=nan`` a batch was never
polled and the task spun a CPU, with ``server.startup_timeout_s=inf`` a replica that never got
ready was never timed out.  The cases are every numeric constructor argument of every registered
class (found from the signatures, so a new one is covered without editing this file) and the
numeric keys of the dicts they take (``batch``, ``server``, ``generation_kwargs``, ``run_cfg``, a
dataset's ``inferencer`` and ``fewshot``, a judge's model, DLC's ``aliyun_cfg``, a sweep's values).
Each goes in by one of the ways a user writes a config: Python ``float('nan')`` / ``1e999``, YAML
``.nan`` / ``.inf``, JSON ``NaN`` / ``Infinity``; the controls are the same configs with finite
values, which plan.
"""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from orchestra.registry import DATASETS, EVALUATORS, MODELS, PARTITIONERS, RUNNERS, TASKS
from tests.cli_fork import ForkedCLI

pytestmark = pytest.mark.slow  # a hundred CLI processes

REPO = Path(__file__).resolve().parents[2]
TINY = str(REPO / "tests" / "bad_configs" / "tiny.jsonl")
DATASET = {"type": "JsonlDataset", "abbr": "d", "path": TINY,
           "reader_cfg": {"input_columns": ["question"], "output_column": "answer"},
           "infer_cfg": {"prompt_template": "{question}"}}
API = {"abbr": "m", "path": "gpt-x", "base_url": "http://127.0.0.1:9/v1", "key_env": "NO_SUCH_KEY_VAR"}
GGUF = "@@GGUF@@"  # a file made per session (llama.cpp's server.model must be one)
BAD = "@@BAD@@"
#: the non-finite values, and how each way of writing a config spells them
SPELLING = {
    "py": {"nan": "float('nan')", "inf": "1e999", "-inf": "-float('inf')"},
    "yaml": {"nan": ".nan", "inf": ".inf", "-inf": "-.inf"},
    "json": {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"},
}

#: where the keyword arguments of a registered class go in a config, and what else that config needs
HOMES: dict[tuple[str, str], tuple[str, dict[str, Any]]] = {
    ("model", "OpenAIAPI"): ("models.0", API),
    ("model", "AnthropicAPI"): ("models.0", API),
    ("model", "DeterministicModel"): ("models.0", {}),
    ("model", "HFCausalLM"): ("models.0", {"path": "org/name"}),
    ("model", "VLLMModel"): ("models.0", {"path": "org/name"}),
    ("dataset", "LmEvalDataset"): ("datasets.0", {"task": "arc_easy"}),
    ("evaluator", "code_exec"): ("datasets.0.eval_cfg.evaluator", {}),
    ("evaluator", "judge"): ("datasets.0.eval_cfg.evaluator", {"judge": {"type": "DeterministicModel"}}),
    ("evaluator", "numeric_match"): ("datasets.0.eval_cfg.evaluator", {}),
    ("partitioner", "NaivePartitioner"): ("infer.partitioner", {}),
    ("partitioner", "NumWorkerPartitioner"): ("infer.partitioner", {}),
    ("partitioner", "SizePartitioner"): ("infer.partitioner", {}),
    ("runner", "LocalRunner"): ("infer.runner", {}),
    ("runner", "RayRunner"): ("infer.runner", {}),
    ("runner", "SlurmRunner"): ("infer.runner", {}),
    ("runner", "DLCRunner"): ("infer.runner", {"aliyun_cfg": {"workspace_id": "w", "resource_id": "r",
                                                              "worker_image": "img"}}),
    ("task", "InferTask"): ("infer.runner.task", {}),
}
#: homes whose finite control does not plan here for reasons of their own (lm-eval's task index)
NO_CONTROL = {("dataset", "LmEvalDataset")}
BATCH = ("size", "max_bytes", "poll_s", "flush_s", "max_requests_in_flight", "cancel_wait_s")
COMMAND = {"engine": "command", "model": "m", "command": ["python", "-c", "pass", "{port}"]}
#: numeric keys inside the dicts that classes take: (case name, config, dotted key, finite value)
NESTED: list[tuple[str, dict[str, Any], str]] = [
    *[(f"OpenAIAPI batch.{k}", {"models.0": {"type": "OpenAIAPI", **API, "batch": {}}}, f"models.0.batch.{k}")
      for k in BATCH],
    ("AnthropicAPI batch.poll_s", {"models.0": {"type": "AnthropicAPI", **API, "batch": {}}}, "models.0.batch.poll_s"),
    *[(f"server.{k}", {"models.0": {"type": "OpenAIAPI", **API, "server": COMMAND}}, f"models.0.server.{k}")
      for k in ("replicas", "gpus", "threads", "startup_timeout_s", "max_restarts")],
    ("server.tensor_parallel_size", {"models.0": {"type": "OpenAIAPI", **API,
                                                  "server": {"engine": "vllm", "model": "org/name"}},
                                     "infer.runner": {"type": "LocalRunner", "gpus": [0]}},
     "models.0.server.tensor_parallel_size"),
    *[(f"server.{k} (llama.cpp)", {"models.0": {"type": "OpenAIAPI", **API,
                                                "server": {"engine": "llama.cpp", "model": GGUF}}},
       f"models.0.server.{k}") for k in ("parallel", "ctx_size", "threads")],
    *[(f"generation_kwargs.{k}", {"models.0": {"type": "OpenAIAPI", **API, "generation_kwargs": {}}},
       f"models.0.generation_kwargs.{k}") for k in ("temperature", "top_p")],
    *[(f"run_cfg.{k}", {}, f"models.0.run_cfg.{k}") for k in ("num_gpus", "num_procs")],
    ("inferencer.max_out_len", {}, "datasets.0.infer_cfg.inferencer.max_out_len"),
    ("fewshot.k", {}, "datasets.0.infer_cfg.fewshot.k"),
    ("lm-eval gen_kwargs.temperature", {"datasets.0": {"type": "LmEvalDataset", "abbr": "d", "task": "arc_easy",
                                                       "gen_kwargs": {}}},
     "datasets.0.gen_kwargs.temperature"),
    ("judge model timeout_s", {"datasets.0.eval_cfg": {"evaluator": {"type": "judge", "judge": {
        "type": "OpenAIAPI", **API}}}}, "datasets.0.eval_cfg.evaluator.judge.timeout_s"),
    *[(f"aliyun_cfg.{k}", {"infer.runner": HOMES[("runner", "DLCRunner")][1] | {"type": "DLCRunner"}},
       f"infer.runner.aliyun_cfg.{k}") for k in ("priority", "worker_cpu", "worker_memory", "dlc_sleep_time")],
    ("sweep value", {"sweep": {"params": {"models.delay_s": [0, BAD]}}}, ""),
    ("prices", {"prices": {"m": {}}}, "prices.m.per_request"),
]
#: a finite value for each nested key's control (one that plans; else 0.5)
FINITE = {"size": 10, "max_bytes": 1000, "max_requests_in_flight": 10, "replicas": 1, "gpus": 0, "threads": 1,
          "max_restarts": 1, "tensor_parallel_size": 1, "parallel": 2, "ctx_size": 512, "num_gpus": 0,
          "num_procs": 1, "max_out_len": 8, "k": 1, "priority": 1, "worker_cpu": 2, "worker_memory": 8}


def _numeric(annotation: Any) -> bool:
    return isinstance(annotation, str) and any(t in annotation.replace("|", " ").replace("[", " ").split()
                                               for t in ("int", "float", "int]", "float]"))


def _params(cls: type) -> dict[str, inspect.Parameter]:
    """Constructor parameters of ``cls``, following ``**kwargs`` up the MRO as config checks do."""
    out: dict[str, inspect.Parameter] = {}
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None or klass is object:
            continue
        params = list(inspect.signature(init).parameters.values())[1:]
        for p in params:
            if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL):
                out.setdefault(p.name, p)
        if not any(p.kind is p.VAR_KEYWORD for p in params):
            break
    return out


def _shaped(annotation: str, value: Any) -> Any:
    """``value`` in the shape a parameter takes: a list's item, a dict's value, or itself."""
    head = annotation.split("|")[0].strip()
    if head.startswith(("list", "Sequence", "tuple")):
        return [value]
    if head.startswith("dict"):
        return {"d": value}
    return value


def class_cases() -> list[tuple[str, dict[str, Any], str, Any]]:
    """(case, config edits, dotted key, finite value) for every numeric argument of every class; a
    key of several classes at one place (``infer.runner.timeout_s`` of each runner) is checked once,
    in the first class that takes it (the check is the config layer's, not the class's)."""
    cases = []
    seen = set()
    for registry in (MODELS, DATASETS, EVALUATORS, PARTITIONERS, RUNNERS, TASKS):
        for name in registry.names():
            cls = registry.resolve(name, "test")
            numeric = {k: p for k, p in _params(cls).items() if _numeric(p.annotation)}
            if not numeric:
                continue
            home, extra = HOMES[(registry.kind, name)]  # KeyError: a new class; give it a home above
            for key, p in numeric.items():
                if (home, key) in seen:
                    continue
                seen.add((home, key))
                finite = p.default if isinstance(p.default, (int, float)) and not isinstance(p.default, bool) else 1
                base = {home: {"type": name, **({"abbr": "m"} if home.startswith("models") else {}),
                               **({"abbr": "d"} if home == "datasets.0" else {}), **extra}}
                cases.append((f"{name}.{key}", base, f"{home}.{key}", _shaped(str(p.annotation), finite)))
    return cases


CASES = class_cases() + [(name, base, key, FINITE.get(key.rsplit(".", 1)[-1], 0.5)) for name, base, key in NESTED]


def _config(edits: dict[str, Any], key: str, value: Any, gguf: str, work: Path) -> dict[str, Any]:
    cfg: dict[str, Any] = {"models": [{"type": "DeterministicModel", "abbr": "m"}],
                           "datasets": [json.loads(json.dumps(DATASET))], "work_dir": str(work / "out")}
    for where, sub in [*edits.items(), *([(key, value)] if key else [])]:
        *parents, last = where.split(".")
        target: Any = cfg
        for part in parents:
            target = target[int(part)] if isinstance(target, list) else target.setdefault(part, {})
        copy = json.loads(json.dumps(sub))
        if isinstance(target, list):
            target[int(last)] = copy
        else:
            target[last] = copy
    return json.loads(json.dumps(cfg).replace(json.dumps(GGUF), json.dumps(gguf)))


def _write(cfg: dict[str, Any], way: str, bad: str | None, path: Path) -> Path:
    """The config as a ``way`` file, the BAD placeholder spelled as that way writes ``bad``."""
    text = json.dumps(cfg) if way != "py" else "\n".join(f"{k} = {v!r}" for k, v in cfg.items())
    quoted = json.dumps(BAD) if way != "py" else repr(BAD)
    text = text.replace(quoted, SPELLING[way][bad] if bad else "0.5")
    out = path.with_suffix(f".{way}")
    out.write_text(text + "\n")
    return out


class Case(NamedTuple):
    config: Path
    key: str
    value: str
    res: subprocess.CompletedProcess[str]


def _cli(cli: ForkedCLI, config: Path, cache: Path) -> subprocess.CompletedProcess[str]:
    """``run.py CONFIG --dry-run`` (forked: ``tests/cli_fork.py``); one that does not end in 180 s
    (an lm-eval task's probe with a NaN setting, before: it was not refused first) is a result of
    its own, not the whole module's."""
    argv = [sys.executable, "run.py", str(config), "--dry-run"]
    try:
        return cli.run(argv, cwd=REPO, capture_output=True, text=True, timeout=180,
                       env={**os.environ, "ORCHESTRA_CACHE_DIR": str(cache)})
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(argv, -9, "", "did not end within 180 s")


def _shown(key: str) -> str:
    """A dotted config key as errors name it (``models.0.batch`` -> ``models[0].batch``)."""
    parts = key.split(".")
    out = parts[0]
    for part in parts[1:]:
        out += f"[{part}]" if part.isdigit() else f".{part}"
    return out


def _like(finite: Any, value: Any) -> Any:
    """``value`` where ``finite`` holds its number (``[1]`` -> ``[value]``, ``{'d': 1}`` -> ``{'d': value}``)."""
    if isinstance(finite, list):
        return [value]
    if isinstance(finite, dict):
        return {k: value for k in finite}
    return value


def _base(edits: dict[str, Any]) -> str:
    """The name of a case's config without its bad value: cases of one base share one control."""
    return json.dumps(edits, sort_keys=True)


#: bases whose control is not run: an lm-eval task (its index takes seconds; not what is tested here)
UNCONTROLLED = {_base(edits) for name, edits, _, _ in CASES if "LmEval" in name or "lm-eval" in name}


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory, cli: ForkedCLI) -> dict[str, Case]:
    """Every case and every base (``control <base>``, its values all finite) through the CLI, four at
    a time; the cases take turns at the ways a config is written and at nan, inf and -inf."""
    work = tmp_path_factory.mktemp("finite")
    gguf = work / "model.gguf"
    gguf.write_bytes(b"GGUF")
    ways, values = list(SPELLING), list(SPELLING["py"])
    jobs: dict[str, tuple[Path, str, str]] = {}
    for i, (name, edits, key, finite) in enumerate(CASES):
        way, bad = ways[i % 3], values[(i // 3) % 3]
        shown = _shown(key) if key else "(sweep variant 'm[delay_s="
        cfg = _config(edits, key, _like(finite, BAD), str(gguf), work)
        jobs[name] = (_write(cfg, way, bad, work / f"case{i}"), shown, bad)
        control = f"control {_base(edits)}"
        if _base(edits) not in UNCONTROLLED and control not in jobs:
            jobs[control] = (_write(_config(edits, "", None, str(gguf), work), way, None, work / f"control{i}"), "", "")
    with ThreadPoolExecutor(max_workers=4) as pool:
        done = pool.map(lambda job: _cli(cli, job[0], work / "cache"), jobs.values())
        return {name: Case(*job, res) for (name, job), res in zip(jobs.items(), done)}


@pytest.mark.parametrize("name", [c[0] for c in CASES])
def test_a_non_finite_setting_is_one_line_naming_file_key_and_value(name: str, results: dict[str, Case]) -> None:
    case = results[name]
    lines = case.res.stderr.splitlines()
    assert case.res.returncode == 2 and len(lines) == 1 and "Traceback" not in case.res.stderr, (
        f"exit {case.res.returncode}\n{case.res.stderr}\n{case.res.stdout[-500:]}")
    line = lines[0]
    assert line.startswith(f"orchestra: error: {case.config}: "), line
    assert case.key in line and f"got {case.value}" in line.replace("got float ", "got "), line
    assert "expected" in line, line  # and what is valid
    assert case.res.stdout == ""


#: each base's control, named after its first case
CONTROLS = {_base(edits): name for name, edits, _, _ in reversed(CASES) if _base(edits) not in UNCONTROLLED}


@pytest.mark.parametrize("base", sorted(CONTROLS), ids=[CONTROLS[b] for b in sorted(CONTROLS)])
def test_each_config_plans_with_finite_values(base: str, results: dict[str, Case]) -> None:
    res = results[f"control {base}"].res
    assert res.returncode == 0 and "\n[infer] " in res.stdout and res.stderr == "", res.stderr


@pytest.mark.parametrize(("name", "text", "where", "value"), [
    ("aliyun.yaml", "dlc_sleep_time: .inf\n", "dlc_sleep_time", "inf"),
    ("aliyun.json", '{"worker_cpu": 4, "extra": {"poll": [1, NaN]}}', "extra.poll[1]", "nan"),
    ("aliyun.cfg", "priority = -1e999\n", "priority", "-inf"),
])
def test_a_non_finite_value_in_an_aliyun_cfg_file_is_one_line(tmp_path: Path, name: str, text: str, where: str,
                                                              value: str, cli: ForkedCLI) -> None:
    """``DLCRunner(aliyun_cfg='~/.aliyun.cfg')``: the settings file is read as data
    (``orchestra.keyvalues``), and a NaN or an infinity in it is refused as in the config."""
    settings = tmp_path / name
    settings.write_text("workspace_id = 'w'\nresource_id = 'r'\nworker_image = 'i'\n" + text if name.endswith(".cfg")
                        else text.replace("{", '{"workspace_id": "w", "resource_id": "r", "worker_image": "i", ', 1)
                        if name.endswith(".json") else f"workspace_id: w\nresource_id: r\nworker_image: i\n{text}")
    cfg = _write(_config({"infer.runner": {"type": "DLCRunner", "aliyun_cfg": str(settings)}}, "", None, "", tmp_path),
                 "json", None, tmp_path / "cfg")
    res = _cli(cli, cfg, tmp_path / "cache")
    lines = res.stderr.splitlines()
    assert res.returncode == 2 and len(lines) == 1, res.stderr + res.stdout[-500:]
    assert lines[0].startswith(f"orchestra: error: {cfg}: infer.runner: {settings}: {where}: expected a finite "
                               f"number, got {value} "), lines[0]


@pytest.mark.parametrize(("key", "extra"), [
    ("server.startup_timeout_s", "server=dict(engine='command', model='m', command=['python', '-c', 'pass', '{port}'], "
                                 "startup_timeout_s=10**400)"),
    ("batch.poll_s", "batch=dict(poll_s=10**400)"),
])
def test_an_integer_too_large_for_a_float_is_refused_as_infinity(tmp_path: Path, key: str, extra: str,
                                                                 cli: ForkedCLI) -> None:
    """``10**400`` is an int, which the NaN/infinity check passed, yet no float holds it: every use
    overflows.  It is one line, exit 2, as ``inf`` is.  Before: ``server.startup_timeout_s`` was a
    bare OverflowError traceback (exit 1), and ``batch.poll_s`` planned, to overflow in the run."""
    cfg = tmp_path / "cfg.py"
    cfg.write_text(f"datasets = [{DATASET!r}]\n"
                   f"models = [dict(type='OpenAIAPI', **{API!r}, {extra})]\n"
                   f"work_dir = {str(tmp_path / 'work')!r}\n")
    res = _cli(cli, cfg, tmp_path / "cache")
    lines = res.stderr.splitlines()
    assert res.returncode == 2 and len(lines) == 1, res.stderr[-2000:] + res.stdout[-500:]
    want = f"orchestra: error: {cfg}: models[0].{key}: expected a finite number, got inf "
    assert lines[0].startswith(want), lines[0]
