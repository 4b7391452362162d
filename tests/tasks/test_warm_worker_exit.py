"""A model that ends its process (``sys.exit`` in a user's model class) inside a warm worker:
the real CLI, a real warm worker, a model class from a module of the test's own.

The worker must answer for the task (exit code 1, the reason in one line), keep what the task
finished in its checkpoint, and go on serving the next task with the loaded model.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.tasks.test_eval_heavy import REPO, only_run, write_jsonl

MODEL = '''
import sys
from orchestra.models.fake import DeterministicModel


class ExitingModel(DeterministicModel):
    """Ends the process (exit status 3) on a prompt that says EXIT."""

    def generate_batch(self, requests):
        if any("EXIT" in str(r.prompt) for r in requests):
            sys.exit(3)
        return super().generate_batch(requests)
'''


def test_a_model_that_calls_sys_exit_fails_its_task_and_the_worker_serves_the_next(tmp_path: Path) -> None:
    (tmp_path / "exiting_model.py").write_text(MODEL)
    rows = [{"question": f"What is {i} + 1?" + (" EXIT" if i == 1 else ""), "answer": str(i + 1)} for i in range(8)]
    data = write_jsonl(tmp_path / "arith.jsonl", rows)
    cfg = tmp_path / "cfg.py"
    cfg.write_text(f"""
from orchestra.datasets import JsonlDataset
from orchestra.partitioners import SizePartitioner
from orchestra.runners import LocalRunner
from orchestra.tasks import InferTask

models = [dict(type='exiting_model.ExitingModel', abbr='ex', batch_size=1)]
datasets = [dict(type=JsonlDataset, abbr='arith', path={str(data)!r},
                 reader_cfg=dict(input_columns=['question'], output_column='answer'),
                 infer_cfg=dict(prompt_template='{{question}}', inferencer=dict(type='gen', max_out_len=8)),
                 eval_cfg=dict(evaluator='numeric_match'))]
infer = dict(partitioner=dict(type=SizePartitioner, max_task_size=4, gen_task_coef=1, granularity=1),
             runner=dict(type=LocalRunner, max_num_workers=1, reuse_workers=True, retry=1, retry_backoff_s=0.1,
                         task=dict(type=InferTask)))
work_dir = {str(tmp_path / 'out')!r}
""")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    res = subprocess.run([sys.executable, "run.py", str(cfg), "--mode", "infer"], cwd=REPO, capture_output=True,
                         text=True, timeout=120, env=env)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "Traceback" not in res.stdout + res.stderr, res.stdout + res.stderr
    assert "infer_ex_arith_0 (exit code 1; worker: task crashed: SystemExit: 3)" in res.stderr, res.stderr
    run = only_run(tmp_path)
    assert len(list((run / "logs" / "workers").glob("*.log"))) == 1  # one worker served every attempt
    log = (run / "logs" / "infer" / "infer_ex_arith_0.log").read_text()
    first, second = log.split("===== orchestra: attempt 2 of ")
    assert "arith_0: 4 samples, 0 from checkpoint, 4 to run" in first and "worker: task crashed: SystemExit: 3" in first
    assert "arith_0: 4 samples, 1 from checkpoint, 3 to run" in second, second  # sample 0 was kept
    assert "worker: task crashed: SystemExit: 3" in second
    lines = (run / "predictions" / "ex" / "arith_1.jsonl").read_text().splitlines()[1:]
    assert [json.loads(line)["prediction"] for line in lines] == ["5", "6", "7", "8"]
    assert not (run / "predictions" / "ex" / "arith_0.jsonl").exists()
