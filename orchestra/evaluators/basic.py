"""The built-in evaluators: accuracy, exact match, numeric match."""

from __future__ import annotations

import abc
import math
import re
import string
from typing import Any, ClassVar


class BaseEvaluator(abc.ABC):
    """Scores prediction records; returns metrics (first one is the headline) and details."""

    #: constructor arguments that hold a model config (checked like ``models`` entries)
    model_keys: ClassVar[tuple[str, ...]] = ()
    #: metrics that count things (unparsed answers, ...): shown without an interval
    count_metrics: ClassVar[frozenset[str]] = frozenset()

    @classmethod
    def identity(cls, cfg: dict[str, Any]) -> Any:
        """What a result's content hash covers of this evaluator's config ``cfg`` (None: the
        config as written)."""
        return None

    @classmethod
    def resources(cls, cfg: dict[str, Any]) -> dict[str, int]:
        """What an eval task scoring with this evaluator (config ``cfg``) occupies while it
        runs: ``num_gpus`` and ``num_procs`` (cores).  Light evaluators: one core."""
        return {"num_gpus": 0, "num_procs": 1}

    @classmethod
    def check_config(cls, cfg: dict[str, Any], dataset: dict[str, Any], where: str) -> None:
        """Raise ``ConfigError`` if ``cfg`` cannot work for ``dataset`` (run while the config
        is validated, after its keys were checked; must be cheap)."""

    @abc.abstractmethod
    def judge(self, record: dict[str, Any]) -> dict[str, Any]:
        """Per-sample verdict: metric name -> value (usually bool), plus anything useful."""

    def score(self, records: list[dict[str, Any]]) -> tuple[dict[str, float], list[dict[str, Any]]]:
        details = []
        sums: dict[str, float] = {}
        for rec in records:
            if rec.get("error") is not None:
                verdict: dict[str, Any] = {"error": rec["error"]}
            else:
                verdict = self.judge(rec)
            details.append({"id": rec["id"], "gold": rec.get("gold"), "prediction": rec.get("prediction"), **verdict})
            for key, value in verdict.items():
                if isinstance(value, bool):
                    sums[key] = sums.get(key, 0.0) + float(value)
        n = len(records)
        # Failed samples count as wrong: a metric never looks better because samples failed.
        metrics = {key: (total / n if n else math.nan) for key, total in sums.items() if key != "error"}
        return metrics, details

    def sample_scores(self, records: list[dict[str, Any]], details: list[dict[str, Any]]
                      ) -> dict[str, list[float | None]]:
        """Each metric's per-sample scores, one per details line (None: not scored, left out
        of the mean), for the metrics that are their mean; the eval task derives standard
        errors and paired differences from them.  Here: a details key of the metric's name
        holding a bool or a number; a line without it (a failed sample) scores 0, as
        :meth:`score` counts it.  The eval task keeps a metric's scores only where their mean
        equals the metric, so a key that merely shares a name does no harm."""
        out: dict[str, list[float | None]] = {}
        names = {k for d in details for k, v in d.items() if isinstance(v, (bool, int, float))} - {"id"}
        for name in sorted(names):
            out[name] = [float(d[name]) if isinstance(d.get(name), (bool, int, float)) else 0.0 for d in details]
        return out

    def metrics_of(self, records: list[dict[str, Any]], details: list[dict[str, Any]]) -> dict[str, float]:
        """The metrics of a subset of ``records`` whose details are known (a bootstrap resample
        of a metric that is not a per-sample mean): light evaluators judge them again."""
        return self.score(records)[0]


def normalize_text(text: Any) -> str:
    s = str(text).strip().lower()
    s = s.strip(string.punctuation + " ")
    return " ".join(s.split())


class AccuracyEvaluator(BaseEvaluator):
    """Multiple choice: the highest-scoring choice is right.

    For log-likelihood records both ``accuracy`` (raw summed log-probabilities) and
    ``accuracy_norm`` are reported; ``accuracy_norm`` is lm-eval's ``acc_norm``: each
    log-probability divided by the length in characters of the choice itself (not of the
    continuation, which carries the ``' '`` before it).  Records written before ``choices``
    were recorded fall back to the continuation without that one leading space.
    For generated answers the normalised text must equal the gold answer.
    """

    def judge(self, record: dict[str, Any]) -> dict[str, Any]:
        gold = record.get("gold")
        if "logliks" in record:
            lls = record["logliks"]
            conts = record.get("continuations") or [""] * len(lls)
            choices = record.get("choices") or [c[1:] if c.startswith(" ") else c for c in conts]
            raw = max(range(len(lls)), key=lls.__getitem__)
            norm = max(range(len(lls)), key=lambda i: lls[i] / max(len(str(choices[i])), 1))
            gold_idx = gold if isinstance(gold, int) else next(
                (i for i, c in enumerate(conts) if normalize_text(c) == normalize_text(gold)), -1
            )
            return {"accuracy": raw == gold_idx, "accuracy_norm": norm == gold_idx}
        return {"accuracy": normalize_text(record.get("prediction", "")) == normalize_text(gold)}


class ExactMatchEvaluator(BaseEvaluator):
    """The generated text, normalised (case, outer punctuation, whitespace), equals the gold."""

    def judge(self, record: dict[str, Any]) -> dict[str, Any]:
        gold = record.get("gold")
        golds = gold if isinstance(gold, list) else [gold]
        pred = normalize_text(record.get("prediction", ""))
        return {"exact_match": any(pred == normalize_text(g) for g in golds)}


_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def extract_number(text: Any) -> float | None:
    """The final number of a text (after ``####`` if present), commas and ``$`` ignored."""
    s = str(text)
    if "####" in s:
        s = s.split("####")[-1]
    found = _NUMBER.findall(s.replace("$", ""))
    if not found:
        return None
    try:
        return float(found[-1].replace(",", "").rstrip("."))
    except ValueError:
        return None


class NumericMatchEvaluator(BaseEvaluator):
    """The last number in the prediction equals the gold number (GSM8K style)."""

    def __init__(self, tolerance: float = 1e-6) -> None:
        self.tolerance = tolerance

    def judge(self, record: dict[str, Any]) -> dict[str, Any]:
        pred = extract_number(record.get("prediction", ""))
        gold = extract_number(record.get("gold"))
        ok = pred is not None and gold is not None and abs(pred - gold) <= self.tolerance
        return {"numeric_match": ok, "extracted": pred}
