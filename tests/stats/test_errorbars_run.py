"""Error bars and paired differences through ``run.py`` on a real run with planted differences.

Two deterministic models answer the same arithmetic questions: ``full`` writes the whole
sum, ``short`` only its first two characters (``max_out_len=2``).  The gold answers are
planted so that the 2x2 table of (full right, short right) is known: both right on 30 rows,
only ``full`` on 18, only ``short`` on 6, neither on 6.  The numbers the run shows are
checked against scipy / statsmodels on scores the test derives from that plan, never from
orchestra's own files.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import statsmodels.api as sm
from scipy import stats as sps
from statsmodels.stats.multitest import multipletests

from tests.helpers import run_cli

PLAN = [("both", 30), ("full", 18), ("short", 6), ("neither", 6)]
SUBJECTS = 12

EVALUATOR = '''
"""A test evaluator: a corpus-level digit recall (not a per-sample mean) and a per-sample closeness."""
from orchestra.evaluators import BaseEvaluator


class Digits(BaseEvaluator):
    def judge(self, record):
        pred, gold = str(record.get("prediction") or "").strip(), str(record.get("gold"))
        matched = sum(1 for a, b in zip(pred, gold) if a == b)
        return {"matched": matched, "gold_digits": len(gold), "closeness": matched / len(gold)}

    def score(self, records):
        details = [{"id": r["id"], "gold": r.get("gold"), "prediction": r.get("prediction"), **self.judge(r)}
                   for r in records]
        recall = sum(d["matched"] for d in details) / sum(d["gold_digits"] for d in details)
        return {"digit_recall": recall, "closeness": sum(d["closeness"] for d in details) / len(details)}, details
'''


def _rows() -> list[dict[str, Any]]:
    """The planted rows: question, gold, subject, and which model is right."""
    rows = []
    i = 0
    for kind, count in PLAN:
        for _ in range(count):
            if kind == "both":
                a, b = i % 40, 10  # a two-digit sum: both models write it whole
            else:
                a, b = 100 + i, 3  # a three-digit sum: short writes its first two digits
            v = a + b
            gold = {"both": v, "full": v, "short": v // 10, "neither": v + 1000}[kind]
            subject = f"s{i // (60 // SUBJECTS)}"  # consecutive rows: the plan's blocks make clusters matter
            rows.append({"question": f"What is {a} + {b}?", "answer": str(gold), "subject": subject,
                         "kind": kind, "full_pred": str(v), "short_pred": str(v)[:2]})
            i += 1
    return rows


def _closeness(pred: str, gold: str) -> float:
    return sum(1 for a, b in zip(pred, gold) if a == b) / len(gold)


def write_planted(folder: Path) -> tuple[Path, dict[str, str]]:
    """The planted run's data, evaluator module and config in ``folder``; the config and the
    environment that finds the evaluator."""
    rows = _rows()
    data = folder / "plant.jsonl"
    data.write_text("".join(json.dumps({k: r[k] for k in ("question", "answer", "subject")}) + "\n" for r in rows))
    (folder / "plantevals.py").write_text(EVALUATOR)
    common = f"""path={str(data)!r}, reader_cfg=dict(input_columns=['question'], output_column='answer'),
         infer_cfg=dict(prompt_template='Q: {{question}}\\nA:', inferencer=dict(type='gen'))"""
    cfg = folder / "cfg.py"
    cfg.write_text(f"""
from orchestra.datasets import JsonlDataset
from orchestra.models import DeterministicModel

models = [dict(type=DeterministicModel, abbr='full', max_out_len=16),
          dict(type=DeterministicModel, abbr='short', max_out_len=2)]
datasets = [
    dict(type=JsonlDataset, abbr='plant', {common}, eval_cfg=dict(evaluator='numeric_match')),
    dict(type=JsonlDataset, abbr='plant_cl', {common},
         eval_cfg=dict(evaluator='numeric_match', cluster_key='subject')),
    dict(type=JsonlDataset, abbr='digits', {common}, eval_cfg=dict(evaluator='plantevals.Digits')),
]
summarizer = dict(baseline='short')
work_dir = {str(folder / 'out')!r}
""")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(folder), os.environ.get("PYTHONPATH", "")])}
    return cfg, env


@pytest.fixture(scope="module")
def planted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    folder = tmp_path_factory.mktemp("planted")
    rows = _rows()
    cfg, env = write_planted(folder)
    res = run_cli(cfg, env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    run = next(p for p in (folder / "out").iterdir() if p.is_dir())
    return {"rows": rows, "res": res, "run": run, "cfg": cfg, "env": env}


def _result(run: Path, model: str, dataset: str) -> dict[str, Any]:
    return json.loads((run / "results" / model / f"{dataset}.json").read_text())


def _right(rows: list[dict[str, Any]], model: str) -> list[float]:
    return [1.0 if r["kind"] in ("both", model) else 0.0 for r in rows]


def test_results_carry_stderr_ci_n_method_equal_to_scipy(planted: dict[str, Any]) -> None:
    rows, run = planted["rows"], planted["run"]
    for model, mean in (("full", 0.8), ("short", 0.6)):
        x = _right(rows, model)
        est = _result(run, model, "plant")["estimates"]["numeric_match"]
        assert est["method"] == "clt" and est["n"] == 60
        assert est["value"] == pytest.approx(mean)
        assert est["stderr"] == pytest.approx(float(sps.sem(x)), rel=1e-9)
        lo, hi = sps.t.interval(0.95, 59, loc=np.mean(x), scale=sps.sem(x))
        assert est["ci"] == pytest.approx([lo, hi], rel=1e-8)


def test_declared_clusters_give_the_statsmodels_clustered_stderr(planted: dict[str, Any]) -> None:
    rows, run = planted["rows"], planted["run"]
    groups = np.asarray([int(r["subject"][1:]) for r in rows])
    for model in ("full", "short"):
        fit = sm.OLS(np.asarray(_right(rows, model)), np.ones((60, 1))).fit(
            cov_type="cluster", cov_kwds={"groups": groups}, use_t=True)
        est = _result(run, model, "plant_cl")["estimates"]["numeric_match"]
        assert est["method"] == "clustered" and est["clusters"] == SUBJECTS
        assert est["stderr"] == pytest.approx(float(fit.bse[0]), rel=1e-9)
        assert est["ci"] == pytest.approx(list(fit.conf_int()[0]), rel=1e-8)


def test_a_corpus_metric_gets_a_seeded_bootstrap_and_a_mean_one_the_clt(planted: dict[str, Any]) -> None:
    rows, run = planted["rows"], planted["run"]
    est = _result(run, "full", "digits")["estimates"]
    matched = np.asarray([_closeness(r["full_pred"], r["answer"]) * len(r["answer"]) for r in rows])
    digits = np.asarray([len(r["answer"]) for r in rows], dtype=float)
    assert est["digit_recall"]["method"] == "bootstrap"
    assert est["digit_recall"]["value"] == pytest.approx(matched.sum() / digits.sum())
    ref = sps.bootstrap((matched, digits), lambda m, d: m.sum() / d.sum(), paired=True, vectorized=False,
                        n_resamples=2000, method="percentile", random_state=np.random.default_rng(1))
    assert est["digit_recall"]["stderr"] == pytest.approx(ref.standard_error, rel=0.2)
    closeness = [_closeness(r["full_pred"], r["answer"]) for r in rows]
    assert est["closeness"]["method"] == "clt"
    assert est["closeness"]["stderr"] == pytest.approx(float(sps.sem(closeness)), rel=1e-9)
    # the counts the evaluator left in its details are not metrics: no estimate for them
    assert set(est) == {"digit_recall", "closeness"}


def test_the_table_prints_value_plus_minus_stderr(planted: dict[str, Any]) -> None:
    rows, out = planted["rows"], planted["res"].stdout
    for model, mean in (("full", 0.8), ("short", 0.6)):
        se = float(sps.sem(_right(rows, model)))
        assert f"{mean:.3f} ± {se:.3f}" in out, out
    line = next(ln for ln in out.splitlines() if ln.startswith("plant ") and "numeric_match" in ln)
    assert re.search(r"0\.800 ± 0\.052\s+0\.600 ± 0\.064", line), line
    assert "± is the standard error" in out and "clustered: plant_cl/numeric_match" in out
    assert "bootstrap: digits/digit_recall" in out
    summary = json.loads((planted["run"] / "summary" / "summary.json").read_text())
    found = {(e["dataset"], e["metric"], e["model"]): e for e in summary["estimates"]}
    se_full = float(sps.sem(_right(rows, "full")))
    assert found[("plant", "numeric_match", "full")]["stderr"] == pytest.approx(se_full)
    csv_text = (planted["run"] / "summary" / "estimates.csv").read_text()
    assert csv_text.splitlines()[0] == "dataset,metric,model,value,stderr,ci_low,ci_high,n,method,clusters,note"
    assert f"plant,numeric_match,full,0.8,{se_full!r}" in csv_text.replace("0.8000000000000002", "0.8"), csv_text


def test_paired_differences_against_the_declared_baseline(planted: dict[str, Any]) -> None:
    rows, run, out = planted["rows"], planted["run"], planted["res"].stdout
    comp = json.loads((run / "summary" / "comparison.json").read_text())
    assert comp["baseline"] == "short" and comp["correction"]["method"] == "holm"
    pairs = {(p["dataset"], p["metric"]): p for p in comp["pairs"]}
    assert {p["model"] for p in comp["pairs"]} == {"full"}
    full, short = _right(rows, "full"), _right(rows, "short")
    d = np.subtract(full, short)
    p = pairs[("plant", "numeric_match")]
    assert p["test"] == "mcnemar-exact" and (p["a_only"], p["b_only"], p["n"]) == (18, 6, 60)
    assert p["diff"] == pytest.approx(0.2)
    assert p["stderr"] == pytest.approx(float(sps.sem(d)), rel=1e-9)
    assert p["p_value"] == pytest.approx(sps.binomtest(6, 24, 0.5).pvalue, rel=1e-9)
    assert p["ci"] == pytest.approx(list(sps.ttest_rel(full, short).confidence_interval()), rel=1e-8)
    # clustered: the t-test of the differences with cluster-robust errors, as statsmodels
    groups = np.asarray([int(r["subject"][1:]) for r in rows])
    fit = sm.OLS(d, np.ones((60, 1))).fit(cov_type="cluster", cov_kwds={"groups": groups}, use_t=True)
    pc = pairs[("plant_cl", "numeric_match")]
    assert pc["test"] == "clustered-t" and (pc["a_only"], pc["b_only"]) == (18, 6)
    assert pc["stderr"] == pytest.approx(float(fit.bse[0]), rel=1e-9)
    assert pc["p_value"] == pytest.approx(float(fit.pvalues[0]), rel=1e-7)
    # a per-sample score that is not 0/1: the paired t-test
    ca = [_closeness(r["full_pred"], r["answer"]) for r in rows]
    cb = [_closeness(r["short_pred"], r["answer"]) for r in rows]
    pt = pairs[("digits", "closeness")]
    assert pt["test"] == "paired-t" and pt["a_only"] is None
    assert pt["p_value"] == pytest.approx(sps.ttest_rel(ca, cb).pvalue, rel=1e-8)
    assert ("digits", "digit_recall") not in pairs  # not a per-sample mean: no paired test inside a run
    # Holm over every p-value of the run
    keys = list(pairs)
    expected = multipletests([pairs[k]["p_value"] for k in keys], method="holm")[1]
    assert [pairs[k]["p_holm"] for k in keys] == pytest.approx(list(expected), rel=1e-12)
    assert comp["correction"]["family_size"] == len(keys) == 3
    # the printed section
    assert "Paired differences against short" in out and "Holm over 3 tests" in out
    line = next(ln for ln in out.splitlines() if ln.startswith("plant ") and "full" in ln and "[" in ln)
    assert f"+0.200 ± {float(sps.sem(d)):.3f}" in line and "18/6" in line, line


def test_viz_rebuilds_the_same_numbers_and_the_baseline_defaults_to_the_first_model(planted: dict[str, Any]) -> None:
    run = planted["run"]
    before = (run / "summary" / "comparison.json").read_text()
    res = run_cli(planted["cfg"], "--mode", "viz", env=planted["env"])
    assert res.returncode == 0, res.stderr
    assert (run / "summary" / "comparison.json").read_text() == before
    # the same run, read without a declared baseline: full (the first model) is the baseline
    from orchestra.paths import RunPaths
    from orchestra.summary.paired import build_comparison
    from orchestra.tasks.spec import TaskSpec

    units = [(s.model_abbr, u) for f in sorted((run / "tasks").glob("eval_*.py"))
             for s in [TaskSpec.load(str(f))] for u in s.units]
    comp = build_comparison(RunPaths(str(run)), ["full", "short"], units, None)
    assert comp is not None and comp.baseline == "full"
    p = next(p for p in comp.pairs if p["dataset"] == "plant")
    assert p["model"] == "short" and p["diff"] == pytest.approx(-0.2) and (p["a_only"], p["b_only"]) == (6, 18)


def test_a_baseline_that_is_no_model_is_one_line_exit_2(tmp_path: Path, planted: dict[str, Any]) -> None:
    text = planted["cfg"].read_text().replace("baseline='short'", "baseline='nope'")
    cfg = tmp_path / "bad.py"
    cfg.write_text(text)
    res = run_cli(cfg, "--dry-run", env=planted["env"])
    assert res.returncode == 2
    assert res.stderr.strip().splitlines()[-1].endswith(
        "summarizer.baseline='nope' is not a model of this config; valid: full, short"), res.stderr


def test_a_cluster_key_that_is_no_column_is_one_line_exit_2(tmp_path: Path, planted: dict[str, Any]) -> None:
    text = planted["cfg"].read_text().replace("cluster_key='subject'", "cluster_key='topic'")
    cfg = tmp_path / "bad.py"
    cfg.write_text(text)
    res = run_cli(cfg, "--dry-run", env=planted["env"])
    assert res.returncode == 2
    last = res.stderr.strip().splitlines()[-1]
    assert "eval_cfg.cluster_key='topic' is not a column of" in last
    assert "columns are: answer, question, subject" in last


@pytest.mark.parametrize("old,new,message", [
    ("summarizer = dict(baseline='short')", "summarizer = dict(baseline='short', alpha=0.1)",
     "summarizer: unknown key 'alpha'; valid keys: baseline"),
    ("summarizer = dict(baseline='short')", "summarizer = 'short'",
     "summarizer: expected a dict such as dict(baseline='full'), got 'short'"),
    ("cluster_key='subject'", "cluster_key=3",
     "datasets[1].eval_cfg.cluster_key: expected a column name such as 'subject', got 3"),
])
def test_other_bad_statistics_keys_are_one_line_exit_2(tmp_path: Path, planted: dict[str, Any], old: str, new: str,
                                                       message: str) -> None:
    cfg = tmp_path / "bad.py"
    cfg.write_text(planted["cfg"].read_text().replace(old, new))
    res = run_cli(cfg, "--dry-run", env=planted["env"])
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].endswith(message), res.stderr
