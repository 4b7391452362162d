"""``Unit.make`` and ``TaskSpec.make`` (the planner's fast constructors) build what the classes'
own constructors build, field for field, and stay frozen."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from orchestra.tasks.spec import TaskSpec, Unit


def _values(cls: type) -> dict[str, object]:
    """A distinct value for every field of ``cls``, so a field set from another's argument shows."""
    return {f.name: (f"{f.name}-value" if f.type == "str" else (f.name,)) for f in dataclasses.fields(cls)}


def test_unit_make_equals_the_dataclass_constructor() -> None:
    unit_values = {**_values(Unit), "dataset": {"abbr": "d"}, "start": 3, "end": 9, "shard": 1, "num_shards": 2,
                   "cost": 6.5, "inputs": (("p.jsonl", "h"),)}
    made = Unit.make(**unit_values)  # type: ignore[arg-type]
    assert made == Unit(**unit_values)  # type: ignore[arg-type]
    assert [getattr(made, f.name) for f in dataclasses.fields(Unit)] == list(unit_values.values())
    assert Unit.make({}, "d", 0, 1, None, 1, "o", "h", 1.0).inputs == ()  # the default, as Unit's
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.start = 0  # type: ignore[misc]


def test_task_spec_make_equals_the_dataclass_constructor_and_round_trips(tmp_path: Path) -> None:
    unit = Unit.make({"abbr": "d"}, "d", 0, 4, None, 1, str(tmp_path / "p.jsonl"), "abc", 4.0)
    values = {**_values(TaskSpec), "stage": "eval", "model": {"abbr": "m"}, "units": (unit,), "task_cfg": {"k": 1},
              "num_gpus": 2, "num_procs": 3}
    made = TaskSpec.make(**values)  # type: ignore[arg-type]
    assert made == TaskSpec(**values)  # type: ignore[arg-type]
    assert [getattr(made, f.name) for f in dataclasses.fields(TaskSpec)] == list(values.values())
    made.dump(str(tmp_path / "spec.py"))
    assert TaskSpec.load(str(tmp_path / "spec.py")) == made
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.task_id = "x"  # type: ignore[misc]
