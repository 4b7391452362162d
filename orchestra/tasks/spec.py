"""``TaskSpec``: the frozen description of one task, dumped as a file its command points at.

A task is a list of *units*.  An infer unit is one shard of one dataset (rows
``[start, end)``) whose predictions go to one file; an eval unit is one whole dataset
whose shards' predictions are scored together into one results file.  Every unit carries
the content hash its output must bear: a task is done when all its outputs exist and carry
their hashes, so a changed model, dataset, prompt, generation setting or shard boundary
produces a new hash and the work is redone.
"""

from __future__ import annotations

import ast
import json
import os
import pprint
import threading
from dataclasses import asdict, dataclass, field
from typing import Any

from orchestra.fileio import read_sealed_jsonl


@dataclass(frozen=True, slots=True)  # slots: a 100,000-task plan holds 200,000 of them
class Unit:
    """One output of a task."""

    dataset: dict[str, Any]  # the dataset's config, ``type`` as a dotted path
    dataset_abbr: str
    start: int
    end: int
    shard: int | None  # None when the dataset is not split
    num_shards: int
    output: str  # prediction file (infer) or results file (eval)
    hash: str  # the content hash ``output`` must carry to count as done
    cost: float
    inputs: tuple[tuple[str, str], ...] = ()  # eval: (prediction file, hash) of every shard

    @property
    def name(self) -> str:
        return self.dataset_abbr if self.shard is None else f"{self.dataset_abbr}_{self.shard}"


@dataclass(frozen=True, slots=True)
class TaskSpec:
    """Everything a task script needs, and nothing about the runner that starts it."""

    stage: str  # 'infer' | 'eval'
    task_id: str
    run_dir: str
    model: dict[str, Any]
    model_abbr: str
    units: tuple[Unit, ...]
    task_cfg: dict[str, Any] = field(default_factory=dict)  # options of InferTask / EvalTask
    num_gpus: int = 0
    num_procs: int = 1
    #: what a warm worker must have loaded to run this task (tasks with equal keys share a worker)
    worker_key: str = ""

    @property
    def cost(self) -> float:
        return sum(u.cost for u in self.units)

    @property
    def num_samples(self) -> int:
        """Rows this task runs (infer) or scores (eval)."""
        return sum(u.end - u.start for u in self.units)

    @property
    def display_name(self) -> str:
        """A name people can read, e.g. ``infer/smollm2-135m/arc_easy[0:200]``, for events,
        logs and the report (file names keep the file-safe ``task_id``)."""
        parts = [u.dataset_abbr if u.shard is None else f"{u.dataset_abbr}[{u.start}:{u.end}]" for u in self.units]
        if len(parts) > 3:
            parts = [*parts[:3], f"+{len(parts) - 3} more"]
        return f"{self.stage}/{self.model_abbr}/{','.join(parts)}"

    @property
    def outputs(self) -> list[tuple[str, str]]:
        return [(u.output, u.hash) for u in self.units]

    def missing_inputs(self) -> list[str]:
        """Input files (an eval task's predictions) that are missing or from other settings."""
        return [path for u in self.units for path, h in u.inputs if not output_done(path, h)]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TaskSpec:
        units = tuple(
            Unit(**{**u, "inputs": tuple(tuple(i) for i in u.get("inputs", ()))}) for u in data["units"]
        )
        return cls(**{**data, "units": units})

    def dump(self, path: str) -> None:
        """Write the spec as a Python literal (readable, diffable, loaded without exec).

        Atomic (a temporary file, then ``os.replace``) but not fsynced: a spec is not an output,
        it is written again before a task's first attempt of every run, and an fsync per task
        was the largest cost the loop paid per task in a run of 10,000.
        """
        body = pprint.pformat(self.to_dict(), width=100, sort_dicts=False)
        tmp = f"{path}.tmp-{os.getpid()}-{threading.get_ident()}"
        try:
            try:
                f = open(tmp, "w", encoding="utf-8")
            except FileNotFoundError:
                os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
                f = open(tmp, "w", encoding="utf-8")
            with f:
                f.write(f"# orchestra task spec: {self.task_id}\nSPEC = {body}\n")
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise

    @classmethod
    def load(cls, path: str) -> TaskSpec:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        _, sep, literal = text.partition("SPEC = ")
        if not sep:
            raise ValueError(f"{path}: not an orchestra task spec (no 'SPEC = ')")
        return cls.from_dict(ast.literal_eval(literal))


def output_hash(path: str) -> str | None:
    """The content hash an output file carries, or None if it is missing, unreadable or not
    whole.

    Prediction files (``.jsonl``) carry it in a first ``{"_meta": {...}}`` line that also seals
    the records (count and checksum, :func:`~orchestra.fileio.write_sealed_jsonl`): a
    truncated or damaged file carries no hash, so its shard is redone.  Results files
    (``.json``) carry it in a top-level ``"hash"`` key.
    """
    if path.endswith(".jsonl"):
        sealed = read_sealed_jsonl(path)
        return sealed[0].get("hash") if sealed else None
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f).get("hash")
    except (OSError, ValueError, AttributeError):
        return None


def output_done(path: str, expected_hash: str) -> bool:
    return os.path.exists(path) and output_hash(path) == expected_hash
