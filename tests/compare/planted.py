"""Real runs with planted differences, made by ``python run.py``, for the ``orchestra compare``
tests (the ``runs`` fixture in conftest.py makes them once per module).

A model of the test's own (a module on ``PYTHONPATH``) answers the sums of a 200-row dataset
right, except on the questions its ``off`` setting names: there it is off by that much, or
(offset 0) answers hostile text (terminal escapes, HTML).  Run A and run B plant different
questions; run B reads the same rows from a shuffled file, so its sample ids differ from A's
and only the sample keys can align them.  Two datasets read the rows: ``sums`` scored 0/1
(numeric match), ``near`` scored ``1 / (1 + |answer - gold|)`` by an evaluator of the test's own.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
N = 200
HOSTILE = "\x1b[H\x1b[J\x07<img src=x onerror=\"document.title='pwned'\">"  # no digit: no number to extract

PLUGIN = '''
import re
import zlib

from orchestra.evaluators.basic import BaseEvaluator, extract_number
from orchestra.models.fake import DeterministicModel

HOSTILE = HOSTILE_TEXT


class PlantedModel(DeterministicModel):
    """The deterministic model, off by a planted offset on chosen questions (``q<N>:``)."""

    def __init__(self, abbr, off=(), flip_every=0, **kwargs):
        super().__init__(abbr, **kwargs)
        self.off = {int(q): int(d) for q, d in off}
        self.flip_every = flip_every

    def loglikelihood_batch(self, requests):
        """Log-likelihoods reversed for contexts whose CRC-32 is a multiple of ``flip_every``."""
        out = super().loglikelihood_batch(requests)
        if self.flip_every:
            out = [o[::-1] if zlib.crc32(str(r.context).encode()) % self.flip_every == 0 else o
                   for r, o in zip(requests, out)]
        return out

    def generate_batch(self, requests):
        out = super().generate_batch(requests)
        answers = []
        for r, o in zip(requests, out):
            m = re.search(r"q(\\d+):", str(r.prompt))
            d = self.off.get(int(m.group(1))) if m else None
            answers.append(o if d is None else HOSTILE if d == 0 else str(int(o) + d))
        return answers


class Closeness(BaseEvaluator):
    """A score between 0 and 1 per sample: 1 / (1 + |answer - gold|), 0 without a number."""

    def judge(self, record):
        p, g = extract_number(record.get("prediction", "")), extract_number(record.get("gold"))
        return {"closeness": 0.0 if p is None or g is None else 1.0 / (1.0 + abs(p - g))}

    def score(self, records):
        details = [{"id": r["id"], "gold": r.get("gold"), "prediction": r.get("prediction"), **self.judge(r)}
                   for r in records]
        return {"closeness": sum(d["closeness"] for d in details) / len(details)}, details
'''.replace("HOSTILE_TEXT", repr(HOSTILE))

#: question -> offset of each run's model (0: the hostile answer)
A_OFF = {**{i: 1 for i in range(0, 30)}}
B_OFF = {**{i: 2 for i in range(20, 60)}, 150: 0}


def rows() -> list[dict[str, str]]:
    rng = random.Random(7)
    out = []
    for i in range(N):
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        out.append({"q": f"q{i}: What is {a} + {b}?", "answer": str(a + b)})
    return out


def shuffled(data: list[dict[str, str]]) -> list[dict[str, str]]:
    """The rows in run B's order."""
    out = list(data)
    random.Random(3).shuffle(out)
    return out


def expected_scores(off: dict[int, int]) -> tuple[list[float], list[float]]:
    """Each question's (numeric match, closeness) score under ``off``, in question order."""
    match = [0.0 if i in off else 1.0 for i in range(N)]
    near = [1.0 if i not in off else 0.0 if off[i] == 0 else 1.0 / (1.0 + abs(off[i])) for i in range(N)]
    return match, near


@dataclass
class Runs:
    """The module's run folders and the environment that made them."""

    root: Path
    env: dict[str, str]
    a: Path
    b: Path

    def config(self, name: str, off: dict[int, int], *, data: Path, near_template: str = "{q}\\nA:",
               sums_evaluator: str = "numeric_match", abbr: str = "planted") -> Path:
        cfg = self.root / f"{name}.py"
        cfg.write_text(f"""
from orchestra.datasets import JsonlDataset

models = [dict(type='planted_compare.PlantedModel', abbr={abbr!r}, off={sorted(off.items())!r})]
_reader = dict(input_columns=['q'], output_column='answer')
datasets = [
    dict(type=JsonlDataset, abbr='sums', path={str(data)!r}, reader_cfg=_reader,
         infer_cfg=dict(prompt_template='{{q}}\\nA:', inferencer=dict(type='gen', max_out_len=16)),
         eval_cfg=dict(evaluator=dict(type={sums_evaluator!r}))),
    dict(type=JsonlDataset, abbr='near', path={str(data)!r}, reader_cfg=_reader,
         infer_cfg=dict(prompt_template={near_template!r}, inferencer=dict(type='gen', max_out_len=16)),
         eval_cfg=dict(evaluator=dict(type='planted_compare.Closeness'))),
]
work_dir = {str(self.root / ('work_' + name))!r}
""")
        return cfg

    def make(self, name: str, off: dict[int, int], *, data: Path | None = None, mode: str = "all",
             **kw: str) -> Path:
        """A real run of ``python run.py``; its run folder."""
        cfg = self.config(name, off, data=data or self.root / "rows.jsonl", **kw)
        proc = subprocess.run([sys.executable, "run.py", str(cfg), "--mode", mode], cwd=REPO, env=self.env,
                              capture_output=True, text=True, timeout=240)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        (folder,) = (self.root / f"work_{name}").iterdir()
        return folder

    def compare(self, *args: str | Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """``orchestra compare ARGS`` as a real process (through run.py, as the console script does)."""
        return subprocess.run([sys.executable, "run.py", "compare", *map(str, args)], cwd=REPO, env=self.env,
                              capture_output=True, text=True, timeout=timeout)


def make_runs(root: Path) -> Runs:
    """Run A and run B under ``root`` (with the plugin module and both data files)."""
    (root / "plugins").mkdir()
    (root / "plugins" / "planted_compare.py").write_text(PLUGIN)
    data = rows()
    (root / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in data))
    (root / "shuffled.jsonl").write_text("".join(json.dumps(r) + "\n" for r in shuffled(data)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root / "plugins"), os.environ.get("PYTHONPATH", "")]),
           "ORCHESTRA_LOCK_DIR": str(root / "locks"), "ORCHESTRA_CACHE_DIR": str(root / "cache")}
    made = Runs(root, env, Path(), Path())
    made.a = made.make("a", A_OFF)
    made.b = made.make("b", B_OFF, data=root / "shuffled.jsonl")
    return made
