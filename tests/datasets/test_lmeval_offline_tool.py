"""tools/lmeval_offline_tasks.py's ``--shortest-first``: the named tasks' evaluated rows reordered, and MMLU's dev
splits (the shots lm-eval takes from the top), nothing else."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TOOL = str(REPO / "tools" / "lmeval_offline_tasks.py")


def _rows(path: Path) -> list[str]:
    """The JSON lines of a data file, as written (not splitlines(): the rows hold U+2028)."""
    return path.read_text(encoding="utf-8").split("\n")[:-1]


def _lengths(rows: list[str]) -> list[int]:
    """The length of each row as the tool measures it (its JSON, non-ASCII kept)."""
    return [len(json.dumps(json.loads(row), ensure_ascii=False)) for row in rows]


def test_shortest_first_reorders_the_named_tasks_evaluated_rows_and_nothing_else(tmp_path: Path) -> None:
    for name, flags in (("plain", []), ("short", ["--shortest-first", "mmlu,gsm8k"])):
        subprocess.run([sys.executable, TOOL, *flags, str(tmp_path / name)], check=True, capture_output=True)
    plain, short = tmp_path / "plain" / "data", tmp_path / "short" / "data"
    reordered = sorted(plain.glob("mmlu/*/test.jsonl")) + sorted(plain.glob("mmlu/*/dev.jsonl"))
    assert len(reordered) == 2 * 57
    moved = 0
    for path in reordered:
        before, after = _rows(path), _rows(short / path.relative_to(plain))
        assert sorted(before) == sorted(after), path  # the same rows
        assert _lengths(after) == sorted(_lengths(after)), path  # shortest first
        moved += before != after
    assert moved > 57  # in another order: every test split, most dev splits (of 5 rows; a few were in order)
    untouched = [p for p in sorted(plain.rglob("*.jsonl")) if p not in reordered and p.parent.name != "gsm8k"]
    assert len(untouched) == 7  # the seven tasks that cannot be named (their shots come from the split they evaluate)
    for path in untouched + [plain / "gsm8k" / "train.jsonl"]:
        assert _rows(path) == _rows(short / path.relative_to(plain)), path
    # GSM8K: rows 1000 on are its few-shot pool (train.jsonl); only the rows before them are reordered
    test_plain, test_short = _rows(plain / "gsm8k" / "test.jsonl"), _rows(short / "gsm8k" / "test.jsonl")
    assert test_short[1000:] == test_plain[1000:] == _rows(plain / "gsm8k" / "train.jsonl")
    assert sorted(test_short[:1000]) == sorted(test_plain[:1000]) and test_short[:1000] != test_plain[:1000]
    assert _lengths(test_short[:1000]) == sorted(_lengths(test_short[:1000]))
    # the task YAMLs are the same but for the folder they name
    for yaml in sorted((tmp_path / "plain" / "tasks").iterdir()):
        text = yaml.read_text(encoding="utf-8").replace(str(tmp_path / "plain"), str(tmp_path / "short"))
        assert text == (tmp_path / "short" / "tasks" / yaml.name).read_text(encoding="utf-8"), yaml.name


def test_a_task_whose_pool_is_its_evaluated_split_is_refused_in_one_line(tmp_path: Path) -> None:
    """ARC draws its few-shot examples from the split it evaluates: reordering it would change its shots."""
    proc = subprocess.run([sys.executable, TOOL, "--shortest-first", "mmlu,arc_challenge", str(tmp_path)],
                          capture_output=True, text=True)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()], proc.stderr
    assert "--shortest-first arc_challenge: valid names are gsm8k,mmlu" in proc.stderr, proc.stderr
    assert not (tmp_path / "data").exists()  # refused before anything is written
