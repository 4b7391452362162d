"""Eval task script: ``python -m orchestra.tasks.eval <run>/tasks/<task_id>.py``.

Scores every shard's predictions of a dataset together and writes the dataset's results
(metrics, with the content hash) and per-sample details.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from orchestra.errors import TaskFailedError
from orchestra.evaluators import build_evaluator
from orchestra.fileio import atomic_write_json, atomic_write_jsonl, read_sealed_jsonl
from orchestra.paths import RunPaths
from orchestra.tasks.spec import TaskSpec, output_done


def run_task(spec: TaskSpec) -> None:
    """Run one eval task in this process (raises on failure)."""
    paths = RunPaths(spec.run_dir)
    for unit in spec.units:
        records: list[dict[str, Any]] = []
        for path, expected in unit.inputs:
            if not output_done(path, expected):
                raise TaskFailedError(
                    f"{unit.dataset_abbr}: predictions {os.path.relpath(path, spec.run_dir)} are missing or "
                    "from other settings (did its infer task fail?)"
                )
            sealed = read_sealed_jsonl(path)
            if sealed is None:  # damaged since it was checked
                raise TaskFailedError(f"{unit.dataset_abbr}: predictions {path} are damaged; run infer again")
            records.extend(sealed[1])
        evaluator_cfg = unit.dataset.get("eval_cfg", {}).get("evaluator", "accuracy")
        evaluator = build_evaluator(evaluator_cfg)
        metrics, details = evaluator.score(records)
        atomic_write_jsonl(paths.details(spec.model_abbr, unit.dataset_abbr), details)
        atomic_write_json(
            unit.output,
            {
                "hash": unit.hash,
                "model": spec.model_abbr,
                "dataset": unit.dataset_abbr,
                "metrics": metrics,
                "num_samples": len(records),
                "num_failed_samples": len([r for r in records if r.get("error") is not None]),
            },
        )
        shown = ", ".join(f"{k}={v:.4f}" for k, v in metrics.items())
        print(f"[{spec.task_id}] {unit.dataset_abbr}: {shown}", flush=True)


def main(argv: list[str] | None = None) -> int:
    from orchestra.tasks.entry import task_main

    return task_main(argv, run_task)


if __name__ == "__main__":
    sys.exit(main())
