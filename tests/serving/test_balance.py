"""The task side of managed replicas: the least busy replica first, a refused one set aside."""

from __future__ import annotations

import json
import os
from pathlib import Path

from orchestra.serving.balance import ReplicaSet


def write(path: Path, urls: list[str], mtime: float) -> None:
    path.write_text(json.dumps({"model": "m", "replicas": [{"url": u} for u in urls]}))
    os.utime(path, (mtime, mtime))


def test_least_outstanding_first_and_a_refused_replica_set_aside(tmp_path: Path) -> None:
    path = tmp_path / "replicas.json"
    a, b = "http://127.0.0.1:1001/v1", "http://127.0.0.1:1002/v1"
    write(path, [a, b], 1000.0)
    replicas = ReplicaSet(str(path))
    first, second, third = replicas.pick(), replicas.pick(), replicas.pick()
    assert first and second and third
    assert {first.url, second.url} == {a, b}  # one each before either gets a second
    replicas.done(first)
    assert replicas.pick().url == first.url  # now the one with fewer in flight
    replicas.done(second, refused=True)  # its replica is gone
    picks = [replicas.pick() for _ in range(4)]
    assert all(t is not None and t.url != second.url for t in picks)
    write(path, [b], 2000.0)  # the pool restarted it (or dropped the other): the set changes
    replicas._looked = 0.0
    assert replicas.pick().url == b


def test_nothing_listed_or_a_foreign_scheme_gives_no_replica(tmp_path: Path) -> None:
    path = tmp_path / "replicas.json"
    assert ReplicaSet(str(path)).pick() is None
    write(path, ["https://127.0.0.1:1/v1", "file:///etc/passwd", "ftp://10.0.0.5/v1"], 1000.0)
    assert ReplicaSet(str(path)).pick() is None  # only the plain http addresses the pool writes
    write(path, ["http://10.0.0.5:8000/v1"], 2000.0)  # a replica on a cluster node: its own address
    picked = ReplicaSet(str(path)).pick()
    assert picked is not None and picked.url == "http://10.0.0.5:8000/v1"
