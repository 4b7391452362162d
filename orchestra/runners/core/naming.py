"""Names that tie a cluster job to its run folder, task and attempt (Slurm, DLC, Ray actors)."""

from __future__ import annotations

import hashlib
import os
import re

_NAME_UNSAFE = re.compile(r"[^A-Za-z0-9._+-]+")


def run_tag(root: str) -> str:
    """Eight hex digits naming one run folder in job names (``orc-<tag>-...``)."""
    return hashlib.sha1(os.path.normpath(os.path.abspath(root)).encode()).hexdigest()[:8]


def job_name(tag: str, task_id: str, attempt: int) -> str:
    """The job name of one attempt of one task: unique, so ``squeue --name`` finds it."""
    return f"orc-{tag}-{_NAME_UNSAFE.sub('_', task_id)}-a{attempt}"
