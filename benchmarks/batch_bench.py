"""Benchmark: batch mode of OpenAIAPI (2,000 requests) against the Files + Batches double.

    python benchmarks/batch_bench.py                         # prints a markdown table
    python benchmarks/batch_bench.py --n 2000 --turnaround-s 5 --poll-s 1 --size 500
    python benchmarks/batch_bench.py --provider anthropic     # Message Batches
    python benchmarks/batch_bench.py --tasks 4 --size 1000 --flush-s 3   # 4 tasks sharing batches

The double (tests/servers/openai_batch_server.py, or anthropic_server.py) runs on a thread of this process with a
fixed turnaround per batch; ``python run.py CONFIG`` runs the whole pipeline in a child process,
whose CPU time (orchestrator + task processes, start-up included) is read from
``RUSAGE_CHILDREN``.  Measures: HTTP calls per request (every call the double answered: uploads,
creates, polls, file reads), polls per batch, and the span from the first call to the last
answer, against the turnaround (goal: span <= turnaround + 2 poll intervals + flush_s).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "servers"))

from loader import load_anthropic_server_module, load_batch_server_module  # noqa: E402


def config(folder: Path, base_url: str, n: int, size: int, poll_s: float, flush_s: float, tasks: int,
           model: str) -> Path:
    data = folder / "rows.jsonl"
    with open(data, "w") as f:
        for i in range(n):
            f.write(json.dumps({"question": f"What is {i} + {i + 1}?", "answer": str(2 * i + 1)}) + "\n")
    cfg = folder / "cfg.py"
    cfg.write_text(f"""
from orchestra.datasets import JsonlDataset
from orchestra.models import AnthropicAPI, OpenAIAPI
from orchestra.partitioners import NaivePartitioner, SizePartitioner
from orchestra.runners import LocalRunner
from orchestra.tasks import EvalTask, InferTask

models = [dict(type={model}, abbr='gpt-batch', path='test-model', base_url={base_url!r}, key_env=None,
               max_out_len=16, batch=dict(size={size}, poll_s={poll_s}, flush_s={flush_s}))]
datasets = [dict(type=JsonlDataset, abbr='rows', path={str(data)!r},
                 reader_cfg=dict(input_columns=['question'], output_column='answer'),
                 infer_cfg=dict(prompt_template='{{question}}', inferencer=dict(type='gen', max_out_len=16)),
                 eval_cfg=dict(evaluator='numeric_match'))]
infer = dict(partitioner=dict(type=SizePartitioner, max_task_size={-(-n // tasks)}, gen_task_coef=1),
             runner=dict(type=LocalRunner, max_num_workers={tasks}, task=dict(type=InferTask)))
eval = dict(partitioner=dict(type=NaivePartitioner), runner=dict(type=LocalRunner, task=dict(type=EvalTask)))
work_dir = {str(folder / 'out')!r}
""")
    return cfg


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n", type=int, default=2000)
    p.add_argument("--turnaround-s", type=float, default=5.0)
    p.add_argument("--poll-s", type=float, default=1.0)
    p.add_argument("--flush-s", type=float, default=0.5)
    p.add_argument("--size", type=int, default=500)
    p.add_argument("--tasks", type=int, default=1)
    p.add_argument("--provider", choices=("openai", "anthropic"), default="openai")
    args = p.parse_args()
    if args.provider == "openai":
        mod = load_batch_server_module()
        double, model = mod.BatchServerThread(mod.BatchConfig(turnaround_s=args.turnaround_s)), "OpenAIAPI"
    else:
        mod = load_anthropic_server_module()
        double, model = mod.AnthropicServerThread(mod.AnthropicConfig(turnaround_s=args.turnaround_s)), "AnthropicAPI"
    with double as srv, tempfile.TemporaryDirectory() as tmp:
        cfg = config(Path(tmp), srv.base_url, args.n, args.size, args.poll_s, args.flush_s, args.tasks, model)
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.monotonic()
        res = subprocess.run([sys.executable, "run.py", str(cfg)], cwd=ROOT, capture_output=True, text=True,
                             env={**os.environ, "PYTHONPATH": str(ROOT)})
        wall = time.monotonic() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if res.returncode != 0:
            print(res.stderr[-3000:], file=sys.stderr)
            return 1
        st = srv.stats()
        batches = srv.batches()
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        calls = sum(st.calls.values())
        polls = [st.gets[b["id"]] for b in batches]
        span = st.last_call_t - st.first_call_t
        goal = args.turnaround_s + 2 * args.poll_s + args.flush_s
        assert len(st.submitted) == args.n and set(st.submitted.values()) == {1}
        rows = [
            ("provider (double)", args.provider),
            ("requests", str(args.n)),
            ("infer tasks (processes at once)", str(args.tasks)),
            ("batches (size)", f"{len(batches)} ({args.size})"),
            ("turnaround / poll_s / flush_s", f"{args.turnaround_s:g} / {args.poll_s:g} / {args.flush_s:g} s"),
            ("HTTP calls (per request)", f"{calls} ({calls / args.n:.4f})"),
            ("polls per batch (min-max)", f"{min(polls)}-{max(polls)}"),
            ("span, first call to last answer", f"{span:.2f} s (goal <= {goal:g} s)"),
            ("run.py wall (start-up, eval, report included)", f"{wall:.2f} s"),
            ("orchestrator + task CPU", f"{cpu:.2f} s ({cpu / args.n * 1000:.2f} ms per request)"),
        ]
        print("| measure | value |\n|---|---:|")
        for k, v in rows:
            print(f"| {k} | {v} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
