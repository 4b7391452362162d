"""Every path inside a run folder comes from ``RunPaths``; nothing is relative to the cwd."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

_UNSAFE = re.compile(r"[^A-Za-z0-9._+-]+")


def safe_name(name: str) -> str:
    """A file-name-safe form of a model or dataset abbreviation."""
    cleaned = _UNSAFE.sub("_", name).strip("._")
    return cleaned or "_"


@dataclass(frozen=True)
class RunPaths:
    """The layout of one run folder ``<work_dir>/<timestamp>/``."""

    root: str

    @property
    def config(self) -> str:
        return os.path.join(self.root, "config.py")

    @property
    def events(self) -> str:
        return os.path.join(self.root, "events.jsonl")

    @property
    def lock(self) -> str:
        return os.path.join(self.root, ".orchestra.lock")

    @property
    def summary_dir(self) -> str:
        return os.path.join(self.root, "summary")

    @property
    def slurm_dir(self) -> str:
        """Batch job scripts and Slurm's own job output (``SlurmRunner(launcher='sbatch')``)."""
        return os.path.join(self.root, "slurm")

    def task_spec(self, task_id: str) -> str:
        return os.path.join(self.root, "tasks", f"{task_id}.py")

    def task_log(self, stage: str, task_id: str) -> str:
        return os.path.join(self.root, "logs", stage, f"{task_id}.log")

    def predictions(self, model_abbr: str, dataset_abbr: str, shard: int | None) -> str:
        suffix = "" if shard is None else f"_{shard}"
        return os.path.join(
            self.root, "predictions", safe_name(model_abbr), f"{safe_name(dataset_abbr)}{suffix}.jsonl"
        )

    def checkpoint(self, prediction_path: str) -> str:
        """The append-only sample checkpoint that becomes ``prediction_path`` when complete."""
        return prediction_path + ".ckpt"

    def results(self, model_abbr: str, dataset_abbr: str) -> str:
        return os.path.join(self.root, "results", safe_name(model_abbr), f"{safe_name(dataset_abbr)}.json")

    def details(self, model_abbr: str, dataset_abbr: str) -> str:
        return os.path.join(
            self.root, "results", safe_name(model_abbr), f"{safe_name(dataset_abbr)}.details.jsonl"
        )

    def make_dirs(self) -> None:
        for sub in ("tasks", "logs", "predictions", "results", "summary"):
            os.makedirs(os.path.join(self.root, sub), exist_ok=True)
