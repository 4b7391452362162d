"""LmEvalDataset's samples are the same in every process and every shard: what checkpoints,
resume (-r) and the eval stage's request check rely on.  GSM8K draws its 5 few-shot examples
at random (lm-eval's seeded sampler), so a shard must see the draws of the documents before it.

Each process reads lm-eval's stock task index from a cache of the test's own, seeded with the index
built once per session (``tests/lmeval_seed.py``): not the user's ``~/.cache/orchestra``, where the
first process would build it (~13 s of CPU) when no earlier run had, and which is shared machine-wide."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.lmeval_seed import LmEvalIndex

REPO = Path(__file__).resolve().parents[2]

SCRIPT = """
import json, sys
from orchestra.datasets.lmeval import LmEvalDataset
ds = LmEvalDataset(abbr='g', task='gsm8k', include_path=sys.argv[1], test_range='[0:6]')
lo, hi = int(sys.argv[2]), int(sys.argv[3])
print(json.dumps([[s.id, s.gold, s.calls] for s in ds.build_samples(lo, hi)]))
"""


def _samples(tasks: Path, cache: Path, lo: int, hi: int) -> list[list[object]]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1",
           "ORCHESTRA_CACHE_DIR": str(cache)}
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(tasks), str(lo), str(hi)], capture_output=True,
                          text=True, env=env, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_samples_are_the_same_in_every_process_and_shard(tmp_path: Path, lmeval_index: LmEvalIndex) -> None:
    cache = lmeval_index.seed(tmp_path / "cache")
    subprocess.run([sys.executable, str(REPO / "tools" / "lmeval_offline_tasks.py"), str(tmp_path)], check=True,
                   capture_output=True)
    whole = _samples(tmp_path / "tasks", cache, 0, 6)
    assert [s[0] for s in whole] == list(range(6))
    assert [s[1] for s in whole] == [{"task": "gsm8k", "doc_id": i} for i in range(6)]
    prompts = [s[2][0]["args"][0] for s in whole]
    assert all(p.count("Question:") == 6 for p in prompts)  # 5 shots, then the question
    shots = [p.split("Question:")[1] for p in prompts]
    assert len(set(shots)) > 1  # the few-shot examples differ from document to document
    assert _samples(tmp_path / "tasks", cache, 3, 6) == whole[3:]  # a later shard, in a new process
    assert _samples(tmp_path / "tasks", cache, 0, 6) == whole
