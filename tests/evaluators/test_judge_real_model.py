"""A real model as judge: SmolLM2-135M-Instruct served by llama.cpp (xllamacpp) on 127.0.0.1.

The model is small and grades badly; what is tested is that a real model's answers go the
whole way: a run through the command line whose eval stage asks the judge over HTTP, reads its
grades, records what does not parse, and whose rerun judges nothing again.
"""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestra.evaluators.judge import JudgeEvaluator

pytestmark = pytest.mark.slow  # loads a real model

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def llama() -> Iterator[str]:
    """The base URL of a llama.cpp server with SmolLM2 (stopped at the end)."""
    proc = subprocess.Popen([sys.executable, str(REPO / "tools/llama_server.py"), "--port", str(free_port()),
                             "--parallel", "4"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # 'ready <url>' once it answers (it exits if it cannot start)
        assert line.startswith("ready "), f"llama server did not start (exit {proc.poll()})"
        yield line.split()[1]
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def judge(base_url: str) -> dict[str, object]:
    return {"type": "orchestra.models.OpenAIAPI", "path": "smollm2", "base_url": base_url, "key_env": None,
            "endpoint": "completions", "max_connections": 4, "max_out_len": 8}


def test_a_run_judged_by_a_real_model(llama: str, tmp_path: Path) -> None:
    cfg = tmp_path / "judged.py"
    cfg.write_text(textwrap.dedent(f"""
        from orchestra.models.fake import DeterministicModel
        from orchestra.datasets import JsonlDataset
        models = [dict(type=DeterministicModel, abbr='det')]
        datasets = [dict(type=JsonlDataset, abbr='arith', path={str(REPO / 'configs/data/arith.jsonl')!r},
                         reader_cfg=dict(input_columns=['question'], output_column='answer', test_range='[0:12]'),
                         infer_cfg=dict(prompt_template='Question: {{question}}\\nAnswer:',
                                        inferencer=dict(type='gen', max_out_len=16)),
                         eval_cfg=dict(evaluator=dict(type='judge', judge={judge(llama)!r},
                                                      answer_prefix='Rating: [[', max_out_len=8)))]
        work_dir = {str(tmp_path / 'out')!r}
    """))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    res = subprocess.run([sys.executable, str(REPO / "run.py"), str(cfg)], capture_output=True, text=True, env=env,
                         timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    (run,) = [p for p in (tmp_path / "out").iterdir() if p.is_dir()]
    (result_file,) = (run / "results").rglob("*.json")
    result = json.loads(result_file.read_text())
    (details_file,) = (run / "results").rglob("*details*")
    details = [json.loads(line) for line in details_file.read_text().splitlines()]
    assert len(details) == 12
    turns = [d["turns"][0] for d in details]
    # Every answer came from the model: each starts with the prefix and its continuation.
    assert all(t["judge_output"].startswith("Rating: [[") and len(t["judge_output"]) > len("Rating: [[")
               for t in turns)
    parsed = [t["rating"] for t in turns if not t.get("unparsed")]
    assert all(1 <= r <= 10 for r in parsed)
    assert len(parsed) >= 9, turns  # greedy decoding writes a grade after the prefix nearly always
    metrics = result["metrics"] if "metrics" in result else result
    assert metrics["judge_unparsed"] == 12 - len(parsed)
    assert math.isclose(metrics["judge_score"], sum(parsed) / len(parsed))
    # A rerun on the same folder finds the verdicts done and judges nothing again.
    again = subprocess.run([sys.executable, str(REPO / "run.py"), str(cfg), "-r"], capture_output=True, text=True,
                           env=env, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads(result_file.read_text()) == result


def test_pairwise_with_a_real_model_reads_every_verdict_or_records_it(llama: str) -> None:
    ev = JudgeEvaluator(judge=judge(llama), mode="pairwise", answer_prefix="Verdict: [[", max_out_len=4)
    records = [{"id": i, "prompt": f"What is {i} + {i}?", "prediction": str(2 * i), "gold": str(2 * i + 1)}
               for i in range(6)]
    metrics, details = ev.score(records)
    for d in details:
        (turn,) = d["turns"]
        assert all(o.startswith("Verdict: [[") for o in turn["judge_outputs"])
        if turn.get("unparsed"):
            assert turn["outcome"] is None and None in turn["verdicts"]
        else:
            assert turn["outcome"] in ("win", "loss", "tie") and set(turn["verdicts"]) <= {"A", "B", "C"}
    unparsed = sum(1 for d in details if d["turns"][0].get("unparsed"))
    assert metrics.get("judge_unparsed", 0.0) == unparsed
