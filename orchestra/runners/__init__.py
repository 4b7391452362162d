"""Runners: execute a stage's tasks on some backend through one scheduling loop."""

from orchestra.runners.base import BaseRunner, TaskResult, TaskState
from orchestra.runners.dlc import DLCRunner
from orchestra.runners.local import LocalRunner
from orchestra.runners.slurm import SlurmRunner

__all__ = ["BaseRunner", "DLCRunner", "LocalRunner", "SlurmRunner", "TaskResult", "TaskState"]
