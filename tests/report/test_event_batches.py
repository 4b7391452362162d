"""``EventLog.emit_many``: the events of queueing 100,000 tasks appended in a few large writes,
each line whole and in order, as ``emit`` would write them one by one."""

from __future__ import annotations

from pathlib import Path

from orchestra.events import EventLog, read_events


def test_many_events_are_appended_whole_and_in_order_across_chunks(tmp_path: Path) -> None:
    log = EventLog(str(tmp_path / "events.jsonl"))
    log.CHUNK_BYTES = 1000  # a few events per write: the chunk boundaries are crossed many times
    log.emit("run_started", tasks=3)
    log.emit_many([("queued", {"task_id": f"t{i}", "name": "é" * (i % 7), "cost": i}) for i in range(500)])
    log.emit_many([])
    log.emit("run_finished")
    events = read_events(log.path)
    assert [e["event"] for e in events] == ["run_started", *["queued"] * 500, "run_finished"]
    assert [e["task_id"] for e in events[1:-1]] == [f"t{i}" for i in range(500)]
    assert all(e["name"] == "é" * (e["cost"] % 7) for e in events[1:-1])
    assert (tmp_path / "events.jsonl").read_bytes().count(b"\n") == 502
