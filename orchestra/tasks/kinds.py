"""The task kinds a runner's ``task=dict(type=...)`` names, with their options.

These classes hold options only; the work is done by the scripts
``python -m orchestra.tasks.infer SPEC`` and ``python -m orchestra.tasks.eval SPEC``, whose
``run_task`` functions :func:`run_task` also calls in process (warm workers, ``--debug``).
"""

from __future__ import annotations

import importlib
import sys

from orchestra.tasks.spec import TaskSpec


class InferTask:
    """Run a model over dataset shards and write predictions.

    Args:
        max_samples: samples in progress at once (None: the model's own default; for an
            API model allowing ``c`` connections that is ``max(2c, c + 16)``).
        error_tolerance: fraction of samples that may fail without failing the task.
    """

    stage = "infer"
    module = "orchestra.tasks.infer"

    def __init__(self, max_samples: int | None = None, error_tolerance: float = 0.0) -> None:
        if max_samples is not None and max_samples < 1:
            raise ValueError(f"max_samples must be >= 1, got {max_samples}")
        if not 0.0 <= error_tolerance <= 1.0:
            raise ValueError(f"error_tolerance must be within [0, 1], got {error_tolerance}")


class EvalTask:
    """Score all predictions of a dataset and write its results."""

    stage = "eval"
    module = "orchestra.tasks.eval"

    def __init__(self) -> None:
        pass


TASK_MODULES = {"infer": InferTask.module, "eval": EvalTask.module}


def task_argv(stage: str, spec_path: str) -> list[str]:
    """The command that runs one task: the current interpreter, the stage's module, the spec."""
    return [sys.executable, "-m", TASK_MODULES[stage], spec_path]


def run_task(spec: TaskSpec) -> None:
    """Run one task in this process (its stage's script, without a new interpreter); raises on failure."""
    module = importlib.import_module(TASK_MODULES[spec.stage])
    module.run_task(spec)
