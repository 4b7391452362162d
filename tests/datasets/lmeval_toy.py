"""A small lm-eval task folder for the edge tests: arithmetic questions that orchestra's
``DeterministicModel`` answers, laid out as ``tools/lmeval_offline_tasks.py`` lays out its own
(``OUT/data`` beside ``OUT/tasks``), with a base YAML and the Python its ``!function`` names
outside ``include_path`` (``OUT/shared``).

Tasks: ``arith`` (4 documents), ``other`` (an unrelated task in the same folder), ``small`` (2)
and ``big`` (5) in the group ``pair`` (aggregated by size).  Gold answers are right for
``DeterministicModel`` (``'2 + 3 ='`` -> ``5``), so a task scores 1.0 until its data change.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

BASE = """output_type: generate_until
dataset_path: json
dataset_name: null
test_split: train
doc_to_text: !function helpers.prompt
doc_to_target: "{{answer}}"
generation_kwargs:
  until: ["\\n"]
  do_sample: false
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
metadata:
  version: 1.0
"""
#: the Python the base YAML's ``!function`` names; it notes, on import, which process imported it
#: (``probe`` for the planning probe) and the names of the environment variables it saw
HELPERS = """import json, os, sys

with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "imported.jsonl"), "a") as _f:
    _f.write(json.dumps({"argv": sys.argv[1:2], "env": sorted(os.environ)}) + "\\n")


def prompt(doc):
    return doc["q"]
"""
GROUP = """group: pair
task: [small, big]
aggregate_metric_list:
  - metric: exact_match
    aggregation: mean
    weight_by_size: true
metadata:
  version: 1.0
"""
SIZES = {"arith": 4, "other": 3, "small": 2, "big": 5}


def rows(n: int, wrong: bool = False) -> list[dict[str, str]]:
    """``n`` questions ``'i + 1 ='`` with their answers (off by one when ``wrong``)."""
    return [{"q": f"{i} + 1 =", "answer": str(i + 1 + int(wrong))} for i in range(n)]


def write_data(out: Path, name: str, wrong: bool = False) -> Path:
    path = out / "data" / f"{name}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows(SIZES[name], wrong)))
    return path


def task_yaml(out: Path, name: str, extra: str = "") -> str:
    return (f"include: ../shared/base.yaml\ntask: {name}\n"
            f"dataset_kwargs:\n  data_files:\n    train: {write_data(out, name)}\n{extra}")


def write(out: Path) -> Path:
    """Write the layout under ``out``; the ``include_path`` (``out/tasks``)."""
    (out / "shared").mkdir(parents=True, exist_ok=True)
    (out / "tasks").mkdir(parents=True, exist_ok=True)
    (out / "shared" / "base.yaml").write_text(BASE)
    (out / "shared" / "helpers.py").write_text(HELPERS)
    for name in SIZES:
        (out / "tasks" / f"{name}.yaml").write_text(task_yaml(out, name))
    (out / "tasks" / "pair.yaml").write_text(GROUP)
    return out / "tasks"


def config(path: Path, tasks: Path, work: Path, datasets: str, model: str = "dict(type=DeterministicModel, abbr='det')"
           ) -> Path:
    """A config of ``DeterministicModel`` and the given ``datasets`` entries (``{tasks}`` is the include_path)."""
    path.write_text(
        "from orchestra.datasets.lmeval import LmEvalDataset\n"
        "from orchestra.models.fake import DeterministicModel\n"
        f"models = [{model}]\n"
        f"datasets = [{datasets.format(tasks=str(tasks))}]\n"
        f"work_dir = {str(work)!r}\n"
    )
    return path


def env(cache: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1",
            "ORCHESTRA_CACHE_DIR": str(cache)}


def run(cfg: Path, *args: str, environ: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``python run.py CFG ARGS`` to its end."""
    return subprocess.run([sys.executable, str(REPO / "run.py"), str(cfg), *args], capture_output=True, text=True,
                          env=environ, cwd=cfg.parent, timeout=600)
