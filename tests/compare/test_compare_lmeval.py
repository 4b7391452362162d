"""``orchestra compare`` on two real runs of an lm-eval task (lm-eval builds the prompts and
scores: its details carry one row per document and filter, its metrics are ``acc,none``).

The planted model reverses its log-likelihoods on the documents of run B whose context hashes
to a multiple of 3, so some answers change; the comparison must agree with scipy on the
documents paired by lm-eval's own ``doc_id``.

Each run keeps one warm worker for both stages (``reuse_workers=True``): the eval task scores in
the process that ran the inference, which has imported lm-eval and torch already, instead of a
fresh one importing them again (~5 s of CPU a run; ``tests/runners/local/test_warm_eval.py`` shows
a warm worker scores as fresh processes do).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from planted import PLUGIN, REPO
from scipy import stats as sps

from tests.lmeval_seed import LmEvalIndex

pytestmark = pytest.mark.slow  # each run imports lm-eval in its probe and its tasks
DOCS = 20
#: one warm worker for both stages, the eval stage after the infer stage (so the eval task always finds the worker)
WARM = """from orchestra.runners import LocalRunner
from orchestra.tasks import EvalTask, InferTask
infer = dict(runner=dict(type=LocalRunner, max_num_workers=1, reuse_workers=True, task=dict(type=InferTask)))
eval = dict(overlap=False,
            runner=dict(type=LocalRunner, max_num_workers=1, reuse_workers=True, task=dict(type=EvalTask)))
"""


def _run(root: Path, name: str, flip_every: int, env: dict[str, str]) -> Path:
    cfg = root / f"{name}.py"
    cfg.write_text(f"""
from orchestra.datasets.lmeval import LmEvalDataset

models = [dict(type='planted_compare.PlantedModel', abbr='planted', flip_every={flip_every})]
datasets = [dict(type=LmEvalDataset, abbr='arc_easy', task='arc_easy', include_path={str(root / 'lm' / 'tasks')!r},
                 test_range='[0:{DOCS}]')]
work_dir = {str(root / name)!r}
{WARM}""")
    proc = subprocess.run([sys.executable, "run.py", str(cfg)], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (folder,) = (root / name).iterdir()
    return folder


def _by_doc(run: Path) -> dict[int, dict]:
    lines = (run / "results" / "planted" / "arc_easy.details.jsonl").read_text().splitlines()
    return {r["doc_id"]: r for r in map(json.loads, lines)}


def test_compare_two_lm_eval_runs(tmp_path: Path, lmeval_index: LmEvalIndex) -> None:
    import os

    subprocess.run([sys.executable, str(REPO / "tools" / "lmeval_offline_tasks.py"), str(tmp_path / "lm")], check=True,
                   capture_output=True)
    (tmp_path / "plugins").mkdir()
    (tmp_path / "plugins" / "planted_compare.py").write_text(PLUGIN)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "plugins"), str(REPO)]),
           "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "ORCHESTRA_LOCK_DIR": str(tmp_path / "locks"),
           "ORCHESTRA_CACHE_DIR": str(lmeval_index.seed(tmp_path / "cache"))}
    a, b = _run(tmp_path, "a", 0, env), _run(tmp_path, "b", 3, env)
    proc = subprocess.run([sys.executable, "run.py", "compare", str(a), str(b), "--json", "--flips", "50"], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    da, db = _by_doc(a), _by_doc(b)
    assert sorted(da) == sorted(db) == list(range(DOCS))
    assert [t["metric"] for t in doc["tests"]] == ["acc,none", "acc_norm,none"]  # the stderrs are not metrics here
    for t in doc["tests"]:
        name = t["metric"].split(",")[0]
        fixed = sum(1 for i in da if db[i][name] > da[i][name])
        broken = sum(1 for i in da if db[i][name] < da[i][name])
        assert (t["n"], t["fixed"], t["broken"]) == (DOCS, fixed, broken)
        assert t["diff"] == pytest.approx((fixed - broken) / DOCS)
        if fixed + broken:
            assert t["p_value"] == pytest.approx(sps.binomtest(min(fixed, broken), fixed + broken, 0.5).pvalue)
    assert sum(t["fixed"] + t["broken"] for t in doc["tests"]) > 0, "the planted flips changed no answer"
    for f in doc["flips"]:
        assert f["key"].startswith("arc_easy:") and f["prompt"].startswith("Question: ")
        assert f["id_a"] == f["id_b"]
