"""orchestra's own datasets agree with lm-eval where they claim to: HellaSwag's clean-up and
``accuracy_norm`` (lm-eval's ``acc_norm``), checked against lm-eval's own code."""

from __future__ import annotations

import importlib.util
import os
from typing import Any

from orchestra.datasets.olmo import OlmoEvalDataset
from orchestra.evaluators.basic import AccuracyEvaluator
from orchestra.inferencers import LoglikInferencer


def _lmeval_hellaswag_utils() -> Any:
    """lm-eval's tasks/hellaswag/utils.py, loaded from its file (the peer's own preprocessing)."""
    spec = importlib.util.find_spec("lm_eval")
    assert spec is not None and spec.origin, "lm_eval is a test dependency (tools/setup.sh installs it)"
    path = os.path.join(os.path.dirname(spec.origin), "tasks", "hellaswag", "utils.py")
    mod_spec = importlib.util.spec_from_file_location("lmeval_hellaswag_utils", path)
    assert mod_spec is not None and mod_spec.loader is not None
    module = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(module)
    return module


def test_hellaswag_rows_are_lm_evals_on_every_row() -> None:
    ds = OlmoEvalDataset(abbr="hs", path="hellaswag", reader_cfg={}, infer_cfg={})
    utils = _lmeval_hellaswag_utils()
    from orchestra.datasets.tabular import read_arrow

    raw = read_arrow(ds.data_files()[0])
    ours = ds.load_rows()
    assert len(raw) == len(ours) == 10042
    differ = 0
    wikihow = 0
    for doc, row in zip(raw, ours, strict=True):
        ctx = doc["ctx_a"] + " " + doc["ctx_b"].capitalize()
        query = utils.preprocess(doc["activity_label"] + ": " + ctx)
        choices = [utils.preprocess(e) for e in doc["endings"]]
        wikihow += "[" in doc["ctx"] or any("[" in e for e in doc["endings"])
        differ += (row["context"], row["choices"], row["label"]) != (query, choices, int(doc["label"]))
    assert wikihow > 1000  # the rows where the clean-up matters are there
    assert differ == 0


def test_accuracy_norm_divides_by_the_choice_length_as_lm_evals_acc_norm() -> None:
    # ' a' / ' bbb' are 2 / 4 characters, 'a' / 'bbb' 1 / 3: the two definitions disagree here.
    sample = LoglikInferencer().build({"type": "loglik", "choices": ["a", "bbb"]}, 0, {}, "Q:", 1, "here")
    assert sample.loglik is not None and sample.loglik.continuations == (" a", " bbb")
    record = {"id": 0, "gold": 1, "logliks": [-1.0, -2.5], "continuations": list(sample.loglik.continuations),
              "choices": list(sample.choices)}
    verdict = AccuracyEvaluator().judge(record)
    assert verdict == {"accuracy": False, "accuracy_norm": True}  # -1.0/1 < -2.5/3
    # a record from before choices were recorded: the continuation less its one leading space
    old = {k: v for k, v in record.items() if k != "choices"}
    assert AccuracyEvaluator().judge(old)["accuracy_norm"] is True
