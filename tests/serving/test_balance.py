"""The task side of managed replicas: the least busy replica first, a refused one set aside.

Only a loopback port this user listens on is used, so the replicas here are real listening
sockets (nothing answers on them: only the choice is under test)."""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestra.serving.balance import ReplicaSet


def write(path: Path, urls: list[str], mtime: float) -> None:
    path.write_text(json.dumps({"model": "m", "replicas": [{"url": u} for u in urls]}))
    os.utime(path, (mtime, mtime))


@pytest.fixture
def ports() -> Iterator[list[int]]:
    """Two loopback ports this process listens on."""
    socks = [socket.socket() for _ in range(2)]
    for sock in socks:
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)
    yield [sock.getsockname()[1] for sock in socks]
    for sock in socks:
        sock.close()


def test_least_outstanding_first_and_a_refused_replica_set_aside(tmp_path: Path, ports: list[int]) -> None:
    path = tmp_path / "replicas.json"
    a, b = (f"http://127.0.0.1:{port}/v1" for port in ports)
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


def test_nothing_listed_or_a_foreign_address_gives_no_replica(tmp_path: Path, ports: list[int]) -> None:
    path = tmp_path / "replicas.json"
    assert ReplicaSet(str(path)).pick() is None
    write(path, ["http://10.0.0.5:8000/v1", f"https://127.0.0.1:{ports[0]}/v1", "file:///etc/passwd"], 1000.0)
    assert ReplicaSet(str(path)).pick() is None  # only loopback http addresses are trusted


def test_a_cluster_node_address_is_taken_only_where_replicas_are_placed_on_a_cluster(tmp_path: Path) -> None:
    path = tmp_path / "replicas.json"
    forged = ["http://127.0.0.1:80@10.0.0.6:8000/v1", "http://node1.example.com:8000/v1", "http://0.0.0.0:8000/v1",
              "http://10.0.0.7:8000/v1/../x", "https://10.0.0.8:8000/v1"]
    write(path, ["http://10.0.0.5:8000/v1", *forged], 1000.0)
    assert ReplicaSet(str(path)).pick() is None  # a local launch: never a node's address
    remote = ReplicaSet(str(path), remote_ok=True)
    picked = remote.pick()
    assert picked is not None and picked.url == "http://10.0.0.5:8000/v1"
    assert set(remote.targets) == {"http://10.0.0.5:8000/v1"}  # none of the forged forms


def test_malformed_addresses_in_the_file_are_dropped_and_the_good_ones_kept(tmp_path: Path, ports: list[int]) -> None:
    """A replicas.json with addresses urllib cannot parse (a port past 65535, a bracket left open),
    another scheme, no path, a user part, or a socket that is gone: none of them gets the key,
    and the one good replica is still used."""
    path = tmp_path / "replicas.json"
    good = f"http://127.0.0.1:{ports[0]}/v1"
    bad = ["http://127.0.0.1:99999/v1", "http://[::1/v1", f"https://127.0.0.1:{ports[1]}/v1",
           f"http://127.0.0.1:{ports[1]}", f"http://me@127.0.0.1:{ports[1]}/v1", "http://127.0.0.1/v1"]
    write(path, [*bad, good], 1000.0)
    rs = ReplicaSet(str(path), socket_root=str(tmp_path))
    assert [t.url for t in [rs.pick(), rs.pick()] if t] == [good, good]
    gone = tmp_path / "sockets-x" / "a.sock"
    path.write_text(json.dumps({"model": "m", "replicas": [{"url": "http://localhost/v1", "socket": str(gone)}]}))
    os.utime(path, (2000.0, 2000.0))
    rs2 = ReplicaSet(str(path), socket_root=str(tmp_path))
    assert rs2.pick() is None
