"""The summary at 10,000 tasks (issue 23): task specs and events are read only to explain a
missing result, never for a run whose results are all there."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestra.paths import RunPaths
from orchestra.summary import table
from orchestra.tasks.spec import Unit


def _eval_unit(paths: RunPaths, model: str, dataset: str) -> Unit:
    pred = paths.predictions(model, dataset, None)
    return Unit(dataset={"type": "x.Dataset"}, dataset_abbr=dataset, start=0, end=4, shard=None, num_shards=1,
                output=paths.results(model, dataset), hash=f"r-{model}-{dataset}", cost=4.0,
                inputs=((pred, f"p-{model}-{dataset}"),))


def test_specs_are_read_only_when_a_result_is_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    paths = RunPaths(str(tmp_path / "run"))
    paths.make_dirs()
    units = [("m", _eval_unit(paths, "m", f"d{i}")) for i in range(3)]
    for _, unit in units:
        Path(unit.output).parent.mkdir(parents=True, exist_ok=True)
        Path(unit.output).write_text(json.dumps({"hash": unit.hash, "metrics": {"accuracy": 0.5}}))
    looked: list[str] = []
    real = table._task_index
    monkeypatch.setattr(table, "_task_index", lambda p: looked.append(p.root) or real(p))
    whole = table.build_summary(paths, ["m"], units)
    assert [row["m"] for row in whole.rows] == [0.5, 0.5, 0.5] and not whole.missing
    assert looked == []
    Path(units[1][1].output).unlink()
    partial = table.build_summary(paths, ["m"], units)
    assert [m["dataset"] for m in partial.missing] == ["d1"] and partial.missing[0]["reason"] == "not run yet"
    assert looked == [paths.root]
