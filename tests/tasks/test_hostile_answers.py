"""Answers of a wrong shape from a model (a user's model class, or one whose endpoint misbehaves)
reach the inferencer kinds, the one place a prediction is recorded: the real CLI, real task
processes, a model class from a module of the test's own.

A short list of log-likelihoods used to become a prediction among the choices that had one, a
NaN one made ``max`` pick whatever came first, and a generation that was not text was sealed as
the prediction: all without a word, into the results.  Each is now a failed sample with one line.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.tasks.test_eval_heavy import REPO, only_run, write_jsonl

MODEL = '''
import math
from orchestra.models.fake import DeterministicModel


class BentModel(DeterministicModel):
    """The deterministic model, with the answer to a prompt naming a bend bent that way."""

    def loglikelihood_batch(self, requests):
        out = super().loglikelihood_batch(requests)
        for i, r in enumerate(requests):
            if "SHORT" in str(r.context):
                out[i] = out[i][:1]
            elif "NAN" in str(r.context):
                out[i] = [math.nan] + out[i][1:]
            elif "INF" in str(r.context):
                out[i] = [math.inf] + out[i][1:]
            elif "TEXT" in str(r.context):
                out[i] = ["0.0"] * len(out[i])
        return out

    def generate_batch(self, requests):
        out = super().generate_batch(requests)
        return [None if "NONE" in str(r.prompt) else 42 if "NUMBER" in str(r.prompt) else o
                for r, o in zip(requests, out)]
'''

LOGLIK_BENDS = {"SHORT": "1 log-likelihood(s) for 2 continuations", "NAN": "log-likelihood nan",
                "INF": "log-likelihood inf", "TEXT": "log-likelihood '0.0'"}
GEN_BENDS = {"NONE": "NoneType", "NUMBER": "int"}


def run_bent(tmp_path: Path, kind: str, rows: list[dict[str, object]], tolerance: float = 0.0, model: str = MODEL
             ) -> tuple[subprocess.CompletedProcess[str], Path]:
    (tmp_path / "bent_model.py").write_text(model)
    data = write_jsonl(tmp_path / "d.jsonl", rows)
    inferencer = ("dict(type='loglik', choices_column='choices')" if kind == "loglik"
                  else "dict(type='gen', max_out_len=8)")
    cfg = tmp_path / "cfg.py"
    cfg.write_text(f"""
from orchestra.datasets import JsonlDataset
from orchestra.runners import LocalRunner
from orchestra.tasks import InferTask

models = [dict(type='bent_model.BentModel', abbr='bent')]
datasets = [dict(type=JsonlDataset, abbr='d', path={str(data)!r},
                 reader_cfg=dict(input_columns=['q'], output_column='a'),
                 infer_cfg=dict(prompt_template='{{q}}', inferencer={inferencer}),
                 eval_cfg=dict(evaluator='{"accuracy" if kind == "loglik" else "exact_match"}'))]
infer = dict(runner=dict(type=LocalRunner, task=dict(type=InferTask, error_tolerance={tolerance})))
work_dir = {str(tmp_path / 'out')!r}
""")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    res = subprocess.run([sys.executable, "run.py", str(cfg)], cwd=REPO, capture_output=True, text=True,
                         timeout=120, env=env)
    return res, only_run(tmp_path)


@pytest.mark.parametrize("bend", list(LOGLIK_BENDS))
def test_a_bent_log_likelihood_answer_fails_its_sample_not_the_results(tmp_path: Path, bend: str) -> None:
    rows = [{"q": f"w{i}" + (f" {bend}" if i == 2 else ""), "choices": ["x", f"w{i}"], "a": 1} for i in range(4)]
    res, run = run_bent(tmp_path, "loglik", rows)
    assert res.returncode == 1, res.stdout + res.stderr
    log = (run / "logs" / "infer" / "infer_bent_d.log").read_text()
    assert "Traceback" not in log, log
    failed = [line for line in log.splitlines() if "FAILED" in line]
    assert len(failed) == 1 and "1/4 samples failed (first: sample 2: " in failed[0], log
    assert LOGLIK_BENDS[bend] in failed[0], failed[0]
    assert not (run / "predictions" / "bent" / "d.jsonl").exists()
    assert not (run / "results" / "bent" / "d.json").exists()


def test_minus_infinity_is_a_log_likelihood_like_any_other(tmp_path: Path) -> None:
    """A continuation the model gives no chance at all: ``-inf``, a real answer, never refused."""
    rows = [{"q": f"w{i}", "choices": ["x", f"w{i}"], "a": 1} for i in range(3)]
    model = MODEL.replace('elif "INF" in str(r.context):\n                out[i] = [math.inf]',
                          'elif True:\n                out[i] = [-math.inf]')
    assert model != MODEL
    res, run = run_bent(tmp_path, "loglik", rows, model=model)
    assert res.returncode == 0, res.stdout + res.stderr
    lines = (run / "predictions" / "bent" / "d.jsonl").read_text().splitlines()[1:]
    records = [json.loads(line) for line in lines]
    assert [r["prediction"] for r in records] == [1, 1, 1]
    assert all(r["logliks"][0] == -math.inf for r in records)


@pytest.mark.parametrize("bend", list(GEN_BENDS))
def test_a_generation_that_is_not_text_fails_its_sample(tmp_path: Path, bend: str) -> None:
    rows = [{"q": f"What is {i} + 1?" + (f" {bend}" if i == 1 else ""), "a": str(i + 1)} for i in range(4)]
    res, run = run_bent(tmp_path, "gen", rows, tolerance=0.5)  # the task ends; the sample is counted failed
    assert res.returncode == 0, res.stdout + res.stderr
    records = {r["id"]: r for r in map(json.loads, (run / "predictions" / "bent" / "d.jsonl").read_text()
                                       .splitlines()[1:])}
    assert f"answered {GEN_BENDS[bend]}, not text" in records[1]["error"], records[1]
    assert [records[i]["prediction"] for i in (0, 2, 3)] == ["1", "3", "4"]
    results = json.loads((run / "results" / "bent" / "d.json").read_text())
    assert results["num_failed_samples"] == 1 and results["metrics"]["exact_match"] == 0.75
