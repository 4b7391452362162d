"""The local backend: subprocesses or warm worker processes on this machine, and ``--debug``'s
in-process runner."""

from orchestra.runners.local.inprocess import InProcessRunner
from orchestra.runners.local.runner import DEFAULT_WORKERS, LocalRunner, cpu_share, detect_gpus

__all__ = ["DEFAULT_WORKERS", "InProcessRunner", "LocalRunner", "cpu_share", "detect_gpus"]
