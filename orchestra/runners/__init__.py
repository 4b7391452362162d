"""Runners: execute a stage's tasks on some backend through one scheduling loop."""

from orchestra.runners.base import BaseRunner, TaskResult, TaskState
from orchestra.runners.dlc.runner import DLCRunner
from orchestra.runners.local.runner import LocalRunner
from orchestra.runners.ray.runner import RayRunner
from orchestra.runners.slurm.runner import SlurmRunner

__all__ = ["BaseRunner", "DLCRunner", "LocalRunner", "RayRunner", "SlurmRunner", "TaskResult", "TaskState"]
