"""The steps every ledger-keeping backend (Slurm, DLC) takes on ``-r``: ``recover_left``; and the
ledger's lines around a stop (``record_stop``, ``Ledger.record_anyway``).  A real ledger file on
disk; the backend's looks and stops are plain functions (a unit test of these functions)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from orchestra.runners.core.ledger import JobRecord, Ledger, Seen, record_stop, spec_digest
from orchestra.runners.core.recovery import NOT_NEEDED, recover_left
from orchestra.tasks.spec import TaskSpec


def lines(ledger: Ledger) -> list[dict[str, Any]]:
    with open(ledger.path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def task(task_id: str, tmp_path: Path, model: str = "m") -> TaskSpec:
    return TaskSpec(stage="infer", task_id=task_id, run_dir=str(tmp_path), model={"abbr": model}, model_abbr=model,
                    units=())


def test_recover_left_adopts_records_and_stops_in_order(tmp_path: Path) -> None:
    ledger = Ledger(str(tmp_path / "svc"))
    a, b, c = task("a", tmp_path), task("b", tmp_path), task("c", tmp_path)
    ledger.record("submitting", "j0", task_id="z", stage="infer")  # killed inside the submit call
    for name, t, job_id in (("j1", a, "11"), ("j2", b, "12"), ("j3", c, "13")):
        ledger.record("submitting", name, task_id=t.task_id, stage="infer", attempt=1, digest=spec_digest(t))
        ledger.record("submitted", name, job_id=job_id)
    ledger.record("submitting", "j4", task_id="d", stage="eval", digest="x")  # another stage: not claimed
    ledger.record("submitted", "j4", job_id="14")
    steps: list[tuple[str, list[str]]] = []

    def see(known: list[JobRecord]) -> Mapping[str, Seen]:
        steps.append(("see", [r.name for r in known]))
        return {"j1": "alive", "j2": "over"}  # j3: no answer

    adopt: list[JobRecord] = []

    def keep(recs: list[JobRecord]) -> None:
        steps.append(("keep", [r.name for r in recs]))
        adopt.extend(recs)

    # b is not run by this launch (done): its job over is recorded ended (one of a wanted task would be
    # adopted, its end that task's attempt's: test_ledger.test_triage_adopts_a_job_of_a_wanted_task...)
    recover_left(ledger, "infer", [a, task("c", tmp_path, model="changed")], see,
                 interrupted=lambda recs: steps.append(("interrupted", [r.name for r in recs])),
                 ended=lambda rec: steps.append(("ended", [rec.name])), keep=keep,
                 stop=lambda recs, why: steps.append((f"stop: {why}", [r.name for r in recs])))
    assert [(r.name, r.task_id, r.job_id) for r in adopt] == [("j1", "a", "11")]
    # the adoptable job is kept before any stop: a stop that fails cannot lose it
    assert steps == [("interrupted", ["j0"]), ("see", ["j1", "j2", "j3"]), ("ended", ["j2"]), ("keep", ["j1"]),
                     (f"stop: {NOT_NEEDED}", ["j3"])]
    # claimed: a second launch of the stage in this process finds nothing, and asks nothing
    recover_left(ledger, "infer", [a], see, interrupted=pytest.fail, ended=pytest.fail,
                 keep=lambda recs: pytest.fail("kept twice"), stop=lambda recs, why: pytest.fail("stopped twice"))
    assert len(steps) == 5


def test_recover_left_asks_nothing_when_nothing_may_be_alive(tmp_path: Path) -> None:
    ledger = Ledger(str(tmp_path / "svc"))
    ledger.record("submitted", "j1", task_id="a", stage="infer", job_id="1")
    ledger.record("stopped", "j1", job_id="1")
    recover_left(ledger, "infer", [], lambda known: pytest.fail("asked"), interrupted=pytest.fail,
                 ended=pytest.fail, keep=lambda recs: pytest.fail("kept"),
                 stop=lambda recs, why: pytest.fail("stopped"))


def test_record_stop_writes_a_line_before_and_after_the_stop(tmp_path: Path) -> None:
    ledger = Ledger(str(tmp_path / "svc"))
    seen_before: list[list[tuple[str, str]]] = []

    def stop() -> dict[str, tuple[str, dict[str, Any]]]:
        seen_before.append([(line["state"], line["name"]) for line in lines(ledger)])
        return {"j1": ("stopped", {"status": "Stopped"}), "j2": ("stop_acknowledged", {"status": "Stopping"})}

    words = record_stop(ledger, {"j1": ("job 1", {"job_id": "1"}), "j2": ("job 2", {"job_id": "2"}),
                                 "j3": ("job 3", {"job_id": "3"})}, "cancelled", stop)
    assert seen_before == [[("stop_sent", "j1"), ("stop_sent", "j2"), ("stop_sent", "j3")]]
    assert words == {"j1": "stopped", "j2": "stop_acknowledged", "j3": "stop_unconfirmed"}  # j3: no outcome
    after = lines(ledger)[3:]
    assert [(line["state"], line["name"], line["job_id"], line.get("status")) for line in after] == [
        ("stopped", "j1", "1", "Stopped"), ("stop_acknowledged", "j2", "2", "Stopping"),
        ("stop_unconfirmed", "j3", "3", None)]
    assert all(line["reason"] == "cancelled" for line in lines(ledger)[:3])
    assert {name: rec.state for name, rec in ledger.jobs().items()} == words
    assert record_stop(None, {"j9": ("job 9", {})}, "x", lambda: {"j9": ("stopped", {})}) == {"j9": "stopped"}


def test_a_stop_goes_out_when_the_ledger_cannot_be_written(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                                           ) -> None:
    ledger = Ledger(str(tmp_path / "svc"))
    ledger.path = "/dev/full"  # every write fails with ENOSPC, as on a full disk
    stopped: list[str] = []

    def stop() -> dict[str, tuple[str, dict[str, Any]]]:
        stopped.append("j1")
        return {"j1": ("stopped", {})}

    words = record_stop(ledger, {"j1": ("Slurm job 1", {"job_id": "1"})}, "cancelled", stop)
    assert stopped == ["j1"] and words == {"j1": "stopped"}
    err = capsys.readouterr().err
    assert "orchestra: warning: cannot record stop_sent of Slurm job 1 in /dev/full: [Errno 28]" in err
    assert "orchestra: warning: cannot record stopped of Slurm job 1 in /dev/full" in err
    with pytest.raises(OSError):
        ledger.record("submitting", "j2")  # a line something relies on still fails loudly
