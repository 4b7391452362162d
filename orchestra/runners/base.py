"""The names backends and callers have always imported from here (the code is in ``runners/core``)."""

from orchestra.runners.core.contract import CannotStart, Exit, Job, NoResources, Resources, Session
from orchestra.runners.core.loop import BaseRunner
from orchestra.runners.core.options import CommandLoopOptions, LoopOptions
from orchestra.runners.core.run import RunContext, TaskResult, TaskState

__all__ = ["BaseRunner", "CannotStart", "CommandLoopOptions", "Exit", "Job", "LoopOptions", "NoResources",
           "Resources", "RunContext", "Session", "TaskResult", "TaskState"]
