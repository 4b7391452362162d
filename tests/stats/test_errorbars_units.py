"""The eval task's estimates (orchestra/tasks/errorbars.py) on inputs a real run rarely makes:
lm-eval's metric shapes, an evaluator's counts and grades, one sample, no sample."""

from __future__ import annotations

from typing import Any

import pytest

from orchestra.evaluators import BaseEvaluator, ExactMatchEvaluator
from orchestra.tasks.errorbars import evaluator_estimates, lmeval_estimates

DATASET: dict[str, Any] = {"abbr": "d", "eval_cfg": {}}


def _records(preds: list[str], gold: str = "a") -> list[dict[str, Any]]:
    return [{"id": i, "prediction": p, "gold": gold} for i, p in enumerate(preds)]


def test_lm_evals_stderr_passes_through_and_its_per_document_scores_pair() -> None:
    metrics = {"acc,none": 0.5, "acc_norm,none": 0.75, "acc_stderr,none": 0.25, "acc_norm_stderr,none": 0.2,
               "word_perplexity,none": 31.5}
    details = [{"id": i, "doc_id": i, "filter": "none", "acc": float(i % 2), "acc_norm": float(i != 0)}
               for i in range(4)]
    out = lmeval_estimates(metrics, details, 4)
    assert set(out) == {"acc,none", "acc_norm,none", "word_perplexity,none"}
    assert out["acc,none"]["method"] == "lm-eval" and out["acc,none"]["stderr"] == 0.25
    assert out["acc,none"]["ci"] == pytest.approx([0.5 - 1.959964 * 0.25, 0.5 + 1.959964 * 0.25])
    assert out["word_perplexity,none"]["stderr"] is None and "no stderr" in out["word_perplexity,none"]["note"]
    assert [d["scores"] for d in details] == [{"acc,none": 0.0, "acc_norm,none": 0.0},
                                               {"acc,none": 1.0, "acc_norm,none": 1.0},
                                               {"acc,none": 0.0, "acc_norm,none": 1.0},
                                               {"acc,none": 1.0, "acc_norm,none": 1.0}]


def test_a_per_document_mean_that_is_not_the_metric_is_not_paired() -> None:
    """A group's metric weighted otherwise than by documents: its per-document scores are not its
    mean, so no pairing is offered for it."""
    metrics = {"acc,none": 0.9, "acc_stderr,none": 0.1}
    details = [{"id": i, "filter": "none", "acc": float(i % 2)} for i in range(4)]
    lmeval_estimates(metrics, details, 4)
    assert all("scores" not in d for d in details)


class Graded(BaseEvaluator):
    """Right or wrong per sample, a count of refusals and a letter grade: only the first is a mean."""

    count_metrics = frozenset({"refusals"})

    def judge(self, record: dict[str, Any]) -> dict[str, Any]:
        return {"right": record["prediction"] == record["gold"]}

    def score(self, records: list[dict[str, Any]]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        metrics, details = super().score(records)
        return {**metrics, "refusals": 2.0, "grade": "B+"}, details


def test_counts_and_grades_get_no_made_up_interval() -> None:
    ev = Graded()
    records = _records(["a", "b", "a", "a"])
    metrics, details = ev.score(records)
    out = evaluator_estimates(DATASET, ev, records, metrics, details)
    assert set(out) == {"right", "refusals"}  # the grade is not a number: nothing to estimate
    assert out["right"]["method"] == "clt" and out["right"]["n"] == 4
    assert out["refusals"]["stderr"] is None and "count" in out["refusals"]["note"]
    assert [d["scores"] for d in details] == [{"right": 1.0}, {"right": 0.0}, {"right": 1.0}, {"right": 1.0}]


@pytest.mark.parametrize("preds,why", [(["a"], "n = 1"), (["a", "a", "a"], "all 3 scores equal"),
                                       (["b", "b"], "all 2 scores equal")])
def test_one_sample_or_no_spread_states_why(preds: list[str], why: str) -> None:
    ev = ExactMatchEvaluator()
    records = _records(preds)
    metrics, details = ev.score(records)
    est = evaluator_estimates(DATASET, ev, records, metrics, details)["exact_match"]
    assert est["stderr"] is None and est["ci"] is None and why in est["note"]


def test_failed_samples_score_zero_as_the_metric_counts_them() -> None:
    ev = ExactMatchEvaluator()
    records = _records(["a", "a", "b"]) + [{"id": 3, "prediction": None, "gold": "a", "error": "timeout"}]
    metrics, details = ev.score(records)
    est = evaluator_estimates(DATASET, ev, records, metrics, details)["exact_match"]
    assert est["value"] == metrics["exact_match"] == 0.5 and est["n"] == 4 and est["method"] == "clt"
    assert details[3]["scores"] == {"exact_match": 0.0}


def test_no_samples() -> None:
    ev = ExactMatchEvaluator()
    metrics, details = ev.score([])
    assert evaluator_estimates(DATASET, ev, [], metrics, details) == {}
