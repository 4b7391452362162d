"""``orchestra compare`` of two log-likelihood runs whose answer choices differ (real runs of the
deterministic model through ``run.py``).

A log-likelihood sample is its prompt *and* the continuations scored after it.  Choices given in
the config (``infer_cfg.inferencer.choices``) or a ``continuation_template`` are no part of the
row, so neither the sample key nor the prompt's digest saw them change: two runs that asked
different questions (here the label index points at the other word) were compared as paired
samples of one question, exit 0.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.helpers import run_argv

REPO = Path(__file__).resolve().parents[2]
N = 20


def _run(tmp_path: Path, name: str, choices: list[str], template: str = " {choice}") -> Path:
    data = tmp_path / "colours.jsonl"
    if not data.exists():
        data.write_text("".join(json.dumps({"q": f"Say {'red' if i % 2 else 'blue'} {i}.", "label": i % 2}) + "\n"
                                for i in range(N)))
    cfg = tmp_path / f"{name}.py"
    cfg.write_text(f"""
from orchestra.datasets import JsonlDataset
from orchestra.models import DeterministicModel

models = [dict(type=DeterministicModel, abbr='det')]
datasets = [dict(type=JsonlDataset, abbr='colours', path={str(data)!r},
                 reader_cfg=dict(input_columns=['q'], output_column='label'),
                 infer_cfg=dict(prompt_template='{{q}}',
                                inferencer=dict(type='loglik', choices={choices!r},
                                                continuation_template={template!r})),
                 eval_cfg=dict(evaluator='accuracy'))]
work_dir = {str(tmp_path / ('work_' + name))!r}
""")
    proc = run_argv([sys.executable, "run.py", str(cfg)], timeout=120)  # forked: tests/cli_fork.py
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (folder,) = (tmp_path / f"work_{name}").iterdir()
    return folder


def _compare(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return run_argv([sys.executable, "run.py", "compare", *map(str, args)], timeout=120)


def test_other_answer_choices_are_refused_like_another_prompt(tmp_path: Path) -> None:
    a = _run(tmp_path, "a", ["blue", "red"])
    swapped = _run(tmp_path, "swapped", ["red", "blue"])  # label 1 now means blue: another question
    reworded = _run(tmp_path, "reworded", ["blue", "red"], template=" colour: {choice}")
    same = _run(tmp_path, "same", ["blue", "red"])
    for other in (swapped, reworded):
        proc = _compare(a, other)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert proc.stdout == "" and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
        assert f"{N} sample(s) were sent a different prompt or other answer choices" in proc.stderr
        assert "(colours: 20)" in proc.stderr and "--allow-changed" in proc.stderr
        proc = _compare(a, other, "--allow-changed", "--json")
        assert proc.returncode == 2 or json.loads(proc.stdout)["tests"] == [], proc.stdout
    proc = _compare(a, same, "--json")  # the same choices still meet, sample by sample
    assert proc.returncode == 0, proc.stderr
    (acc, norm) = json.loads(proc.stdout)["tests"]
    assert (acc["metric"], acc["n"], acc["diff"], acc["a"]["value"]) == ("accuracy", N, 0.0, 1.0)
