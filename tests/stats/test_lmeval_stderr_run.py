"""An lm-eval dataset keeps lm-eval's own standard error: a real run through ``run.py``.

The deterministic model answers lm-eval's ARC-Easy requests (a choice whose text occurs in the
question scores highest), lm-eval scores them in the eval task, and the result's estimates must
carry lm-eval's ``acc_stderr,none`` (method ``lm-eval``), equal to lm-eval's own ``mean_stderr``
of the per-document scores, and the table must show it as ``±`` without a row of its own.
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.lmeval_seed import LmEvalIndex

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_lmeval_datasets_keep_lm_evals_stderr(tmp_path: Path, lmeval_index: LmEvalIndex) -> None:
    from lm_eval.api.metrics import mean_stderr

    subprocess.run([sys.executable, str(REPO / "tools" / "lmeval_offline_tasks.py"), str(tmp_path / "off")],
                   check=True, capture_output=True)
    cfg = tmp_path / "cfg.py"
    cfg.write_text(
        "from orchestra.datasets.lmeval import LmEvalDataset\n"
        "from orchestra.models import DeterministicModel\n"
        "from orchestra.runners import LocalRunner\n"
        "models = [dict(type=DeterministicModel, abbr='det')]\n"
        f"datasets = [dict(type=LmEvalDataset, abbr='arc', task='arc_easy',\n"
        f"                 include_path={str(tmp_path / 'off' / 'tasks')!r},\n"
        "                 test_range='[0:40]')]\n"
        f"work_dir = {str(tmp_path / 'out')!r}\n"
        # both stages in one warm worker (the eval task borrows it): lm-eval imported and its index read once
        "_runner = dict(type=LocalRunner, max_num_workers=1, reuse_workers=True)\n"
        "infer = dict(runner=dict(_runner, task=dict(type='InferTask')))\n"
        "eval = dict(runner=dict(_runner, task=dict(type='EvalTask')))\n")
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1",
           "ORCHESTRA_CACHE_DIR": str(lmeval_index.seed(tmp_path / "cache"))}
    proc = subprocess.run([sys.executable, str(REPO / "run.py"), str(cfg)], capture_output=True, text=True,
                          env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert lmeval_index.untouched(tmp_path / "cache")  # the seeded stock index was read, not built again
    (run,) = glob.glob(str(tmp_path / "out" / "*"))
    result = json.loads(Path(run, "results", "det", "arc.json").read_text())
    details = [json.loads(line) for line in open(Path(run, "results", "det", "arc.details.jsonl"))]
    est = result["estimates"]
    assert set(est) == {"acc,none", "acc_norm,none"}
    for name in ("acc", "acc_norm"):
        e = est[f"{name},none"]
        per_doc = [float(d[name]) for d in details if d["filter"] == "none"]
        assert len(per_doc) == e["n"] == 40 and 0 < e["value"] < 1
        assert e["method"] == "lm-eval"
        assert e["stderr"] == result["metrics"][f"{name}_stderr,none"]
        assert e["stderr"] == pytest.approx(mean_stderr(per_doc), rel=1e-9)  # lm-eval's own formula
        assert e["ci"] == pytest.approx([e["value"] - 1.959964 * e["stderr"], e["value"] + 1.959964 * e["stderr"]])
        # per-document scores for pairing, where their mean is the metric
        assert [d["scores"][f"{name},none"] for d in details] == per_doc
    table = proc.stdout
    acc = est["acc,none"]
    assert f"{acc['value']:.3f} ± {acc['stderr']:.3f}" in table, table
    assert "acc_stderr" not in table and "lm-eval's own: arc/acc,none, arc/acc_norm,none" in table, table
