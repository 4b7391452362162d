"""lm-eval's torch seed without importing torch: torch's generator is as lm-eval leaves it.

``simple_evaluate(torch_random_seed=1234)`` would import torch (seconds of CPU, hundreds of MB)
only to seed it; orchestra seeds torch when the task process first imports it instead (an HF
model loads after the requests are collected and may sample from torch's global generator).
Each case collects a toy task's requests (tests/datasets/lmeval_toy.py) with lm-eval in a fresh
process, then draws ``torch.rand(3)``: it must equal ``torch.manual_seed(1234); torch.rand(3)``
whether torch was imported after the collection (a ``find_spec`` probe first, as transformers and
datasets make one) or before it (its generator used, then lm-eval seeds it again).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.lmeval_seed import LmEvalIndex

sys.path.insert(0, str(Path(__file__).resolve().parent))
import lmeval_toy as toy  # noqa: E402

sys.path.pop(0)

#: the task process's part: collect arith's requests, then draw from torch's global generator
SCRIPT = """\
import importlib.util, json, sys
from orchestra.datasets import lmeval_harness
from orchestra.datasets.lmeval import LmEvalDataset

if sys.argv[2] == "before":
    import torch
    torch.rand(5)  # the generator used before lm-eval seeds it
docs = lmeval_harness.collect(LmEvalDataset(task="arith", include_path=sys.argv[1], test_range="[0:2]").settings)
torch_after_collect = "torch" in sys.modules
assert importlib.util.find_spec("torch") is not None  # a probe imports nothing, and leaves the seed pending
import torch

drawn = torch.rand(3).tolist()
torch.manual_seed(1234)
print(json.dumps({"docs": len(docs), "torch_after_collect": torch_after_collect, "drawn": drawn,
                  "seeded": torch.rand(3).tolist(), "hooks_left": [type(f).__name__ for f in sys.meta_path]}))
"""


@pytest.mark.parametrize("imported", ["after", "before"])
def test_torchs_generator_is_as_lmevals_seed_leaves_it(tmp_path: Path, lmeval_index: LmEvalIndex,
                                                       imported: str) -> None:
    tasks = toy.write(tmp_path / "lay")
    env = {**toy.env(lmeval_index.seed(tmp_path / "cache")), "HF_DATASETS_CACHE": str(tmp_path / "hf")}
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(tasks), imported], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["docs"] == 2
    assert out["torch_after_collect"] == (imported == "before")  # collecting imported no torch
    assert out["drawn"] == out["seeded"]
    assert "_SeedOnImport" not in out["hooks_left"]  # the one-shot hook is gone once torch is seeded
