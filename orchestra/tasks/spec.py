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
from dataclasses import MISSING, asdict, dataclass, field, fields
from typing import Any

from orchestra.fileio import sealed_meta


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

    @classmethod
    def make(cls, dataset: dict[str, Any], dataset_abbr: str, start: int, end: int, shard: int | None,
             num_shards: int, output: str, hash: str, cost: float, inputs: tuple[tuple[str, str], ...] = ()
             ) -> Unit:
        """The same unit as ``Unit(...)``, built in a third of the time: a plan of 100,000 tasks
        builds 200,000 units, and a frozen dataclass's own ``__init__`` sets each field through
        ``object.__setattr__`` looked up anew (``tests/tasks/test_spec_make.py`` holds the two equal)."""
        unit = _new(cls)
        _UNIT_SET[0](unit, dataset)
        _UNIT_SET[1](unit, dataset_abbr)
        _UNIT_SET[2](unit, start)
        _UNIT_SET[3](unit, end)
        _UNIT_SET[4](unit, shard)
        _UNIT_SET[5](unit, num_shards)
        _UNIT_SET[6](unit, output)
        _UNIT_SET[7](unit, hash)
        _UNIT_SET[8](unit, cost)
        _UNIT_SET[9](unit, inputs)
        return unit


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

    @classmethod
    def make(cls, stage: str, task_id: str, run_dir: str, model: dict[str, Any], model_abbr: str,
             units: tuple[Unit, ...], task_cfg: dict[str, Any], num_gpus: int, num_procs: int, worker_key: str
             ) -> TaskSpec:
        """The same spec as ``TaskSpec(...)`` with every field given, built faster (see :meth:`Unit.make`)."""
        spec = _new(cls)
        _SPEC_SET[0](spec, stage)
        _SPEC_SET[1](spec, task_id)
        _SPEC_SET[2](spec, run_dir)
        _SPEC_SET[3](spec, model)
        _SPEC_SET[4](spec, model_abbr)
        _SPEC_SET[5](spec, units)
        _SPEC_SET[6](spec, task_cfg)
        _SPEC_SET[7](spec, num_gpus)
        _SPEC_SET[8](spec, num_procs)
        _SPEC_SET[9](spec, worker_key)
        return spec

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
        """The spec in the file at ``path``; ``ValueError`` (one line, without the path: callers name
        it) for a file that is not one, whatever it holds: the run folder's files may have been
        edited since they were written."""
        with open(path, encoding="utf-8") as f:
            return cls.parse(f.read())

    @classmethod
    def parse(cls, text: str) -> TaskSpec:
        """The spec in ``text``, a spec file's content; ``ValueError`` as for :meth:`load`."""
        _, sep, literal = text.partition("SPEC = ")
        if not sep:
            raise ValueError("not an orchestra task spec (no 'SPEC = ')")
        try:
            data = ast.literal_eval(literal)
        except (RecursionError, MemoryError):
            raise ValueError("nested too deeply to read") from None
        problem = _shape_problem(data)
        if problem:
            raise ValueError(f"not an orchestra task spec ({problem})")
        return cls.from_dict(data)


_new = object.__new__
#: each field's slot setter, in field order (what :meth:`Unit.make` and :meth:`TaskSpec.make` call)
_UNIT_SET = [getattr(Unit, f.name).__set__ for f in fields(Unit)]
_SPEC_SET = [getattr(TaskSpec, f.name).__set__ for f in fields(TaskSpec)]

#: the type every field of a spec file must have (``bool`` is refused where a number is meant)
_SPEC_TYPES: dict[str, tuple[type, ...]] = {
    "stage": (str,), "task_id": (str,), "run_dir": (str,), "model": (dict,), "model_abbr": (str,),
    "units": (list, tuple), "task_cfg": (dict,), "num_gpus": (int,), "num_procs": (int,), "worker_key": (str,)}
_UNIT_TYPES: dict[str, tuple[type, ...]] = {
    "dataset": (dict,), "dataset_abbr": (str,), "start": (int,), "end": (int,), "shard": (int, type(None)),
    "num_shards": (int,), "output": (str,), "hash": (str,), "cost": (int, float), "inputs": (list, tuple)}
STAGES = ("infer", "eval")


def _fields_problem(data: Any, cls: type, types: dict[str, tuple[type, ...]], where: str) -> str | None:
    """What keeps ``data`` from being the fields of ``cls``, or None."""
    if not isinstance(data, dict):
        return f"{where}: expected a dict, got {type(data).__name__}"
    required = [f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING]
    unknown = sorted(str(k) for k in data if k not in types)
    missing = [k for k in required if k not in data]
    if unknown or missing:
        return f"{where}: " + "; ".join([*(f"unknown field {k!r}" for k in unknown[:1]),
                                         *(f"missing field {k!r}" for k in missing[:1])])
    for key, value in data.items():
        if isinstance(value, bool) or not isinstance(value, types[key]):
            return f"{where}.{key}: {type(value).__name__} is not {' or '.join(t.__name__ for t in types[key])}"
    return None


def _shape_problem(data: Any) -> str | None:
    """Why ``data`` is not a task spec's dict (fields, their types, stage, units), or None."""
    problem = _fields_problem(data, TaskSpec, _SPEC_TYPES, "SPEC")
    if problem:
        return problem
    if data["stage"] not in STAGES:
        return f"SPEC.stage: {data['stage']!r} is not one of {', '.join(STAGES)}"
    for i, unit in enumerate(data["units"]):
        problem = _fields_problem(unit, Unit, _UNIT_TYPES, f"SPEC.units[{i}]")
        if problem:
            return problem
        for inp in unit.get("inputs", ()):
            if not (isinstance(inp, (list, tuple)) and len(inp) == 2 and all(isinstance(x, str) for x in inp)):
                return f"SPEC.units[{i}].inputs: {inp!r} is not a (prediction file, hash) pair"
    return None


def output_hash(path: str) -> str | None:
    """The content hash an output file carries, or None if it is missing, unreadable or not
    whole.

    Prediction files (``.jsonl``) carry it in a first ``{"_meta": {...}}`` line that also seals
    the records (count and checksum, :func:`~orchestra.fileio.write_sealed_jsonl`): a
    truncated or damaged file carries no hash, so its shard is redone.  Results files
    (``.json``) carry it in a top-level ``"hash"`` key.
    """
    if path.endswith(".jsonl"):
        meta = sealed_meta(path)
        return meta.get("hash") if meta else None
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f).get("hash")
    except (OSError, ValueError, AttributeError):
        return None


def output_done(path: str, expected_hash: str) -> bool:
    return os.path.exists(path) and output_hash(path) == expected_hash
