"""Task kinds and the spec format; the task scripts live in ``infer.py`` and ``eval.py``."""

from orchestra.tasks.kinds import EvalTask, InferTask
from orchestra.tasks.spec import TaskSpec, Unit

__all__ = ["EvalTask", "InferTask", "TaskSpec", "Unit"]
