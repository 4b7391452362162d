"""Replicas on Unix sockets (as vLLM runs: ``vllm serve --uds``), through ``run.py``.

vLLM checks its key only on ``/v1`` routes, so a vLLM replica listens on a Unix socket in a
0700 folder of this user instead of a loopback port: another local user cannot connect at all,
to any route.  vLLM cannot run here (no GPU), so the same plumbing is driven end to end by a
``command`` server that listens on ``{socket}`` (tests/serving/keyed_stub.py): the pool's
readiness checks over the socket, the task's requests over the socket, and a connect as another
user (``nobody``, from a forked child of this root test) that fails.
"""

from __future__ import annotations

import http.client
import json
import os
import pwd
import shutil
import socket
import stat
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from orchestra.serving.presets import launch
from orchestra.serving.spec import parse_server
from tests.helpers import born, events, jsonl, run_cli, start_cli, still_alive, wait_for
from tests.serving.test_managed_runs import OWNER_GONE_S, config, predictions, replica_pids, the_run

pytestmark = pytest.mark.slow

STUB = str(Path(__file__).with_name("keyed_stub.py"))


def test_vllm_listens_on_a_unix_socket_not_a_port() -> None:
    """vLLM's documented ``--uds`` (host and port are then ignored): no ``--host``/``--port``."""
    spec = parse_server(dict(engine="vllm", model="org/m", tensor_parallel_size=2))
    assert spec.on_socket
    how = launch(spec, "m", 0, "/k", ["0", "1"], "/tmp/orchestra-serve-0/sockets-x/a.sock")
    assert how.argv == ("vllm", "serve", "org/m", "--uds", "/tmp/orchestra-serve-0/sockets-x/a.sock",
                        "--served-model-name", "m", "--tensor-parallel-size", "2")
    assert "--port" not in how.argv and "--host" not in how.argv
    for engine, extra in (("sglang", {}), ("command", {"command": ["srv", "{port}"]})):
        assert not parse_server(dict(engine=engine, model="org/m", **extra)).on_socket  # their key guards all
    assert parse_server(dict(engine="command", model="m", command=["srv", "--uds", "{socket}"])).on_socket


def _get(path: str, route: str, key: str | None) -> int:
    """GET ``route`` over the Unix socket ``path``: the HTTP status."""
    conn = http.client.HTTPConnection("localhost", timeout=10)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(10)
    sock.connect(path)
    conn.sock = sock
    try:
        conn.request("GET", route, headers={"Authorization": f"Bearer {key}"} if key else {})
        return conn.getresponse().status
    finally:
        conn.close()


def _connect_as_nobody(path: str) -> str:
    """Fork; the child drops to ``nobody`` and connects to ``path``: what happened, in a word."""
    nobody = pwd.getpwnam("nobody")
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        try:
            os.close(read)
            os.setgroups([])
            os.setgid(nobody.pw_gid)
            os.setuid(nobody.pw_uid)
            try:
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                    sock.connect(path)
                word = b"connected"
            except PermissionError:
                word = b"denied"
            except OSError as exc:
                word = f"oserror {exc.errno}".encode()
            os.write(write, word)
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as fh:
        word = fh.read().decode()
    os.waitpid(pid, 0)
    return word


def test_a_replica_on_a_unix_socket_serves_the_run_and_no_other_user_can_connect(tmp_path: Path) -> None:
    assert os.geteuid() == 0, "this test drops to 'nobody' in a forked child: it runs as root"
    # control: 'nobody' can connect to a socket in a folder open to all, so a 'denied' below is the 0700 folder's
    open_dir = tempfile.mkdtemp(prefix="orchestra-uds-control-", dir="/tmp")
    try:
        os.chmod(open_dir, 0o755)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listening:
            listening.bind(os.path.join(open_dir, "s.sock"))
            os.chmod(os.path.join(open_dir, "s.sock"), 0o777)
            listening.listen(1)
            assert _connect_as_nobody(os.path.join(open_dir, "s.sock")) == "connected"
    finally:
        shutil.rmtree(open_dir, ignore_errors=True)
    server: dict[str, Any] = dict(engine="command", model="m", replicas=2, max_restarts=0,
                                  command=[sys.executable, STUB, "{socket}", "--slow", "0.4"])
    proc = start_cli(config(tmp_path, server, rows=12), new_session=True)
    try:
        run = the_run(tmp_path)
        listing = run / "servers/smol/replicas.json"
        listed = wait_for(lambda: listing.exists() and len(json.loads(listing.read_text())["replicas"]) == 2
                          and json.loads(listing.read_text())["replicas"], 60, "two ready replicas")
        (started, _) = [r for r in jsonl(run / "servers/ledger.jsonl") if r["state"] == "started"]
        key = Path(started["key_file"]).read_text().strip()
        for entry in listed:
            path = entry["socket"]
            assert entry["url"] == "http://localhost/v1" and os.path.isabs(path)
            folder = os.stat(os.path.dirname(path))
            assert stat.S_IMODE(folder.st_mode) == 0o700 and folder.st_uid == os.geteuid()
            assert stat.S_ISSOCK(os.stat(path).st_mode)
            assert _get(path, "/v1/models", None) == 401  # the key is still demanded
            assert _get(path, "/v1/models", key) == 200
            assert _connect_as_nobody(path) == "denied"
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert len(predictions(run)) == 12
    assert all(r["prediction"].strip() == "3" for r in predictions(run))
    evs = events(run)
    ready = [e for e in evs if e["event"] == "server_ready"]
    assert len(ready) == 2 and all(e["port"] == 0 and e["socket"] for e in ready)
    served = [log.read_text().count("request POST /v1/completions") for log in (run / "servers/smol").glob("*.log")]
    assert sum(served) >= 12 and min(served) >= 2, served  # both replicas answered over their sockets
    assert not os.path.exists(os.path.dirname(listed[0]["socket"]))  # the socket folder goes with the run


def test_sigkill_of_the_orchestrator_leaves_no_socket_replica_and_r_clears_its_folder(tmp_path: Path) -> None:
    server: dict[str, Any] = dict(engine="command", model="m", max_restarts=0,
                                  command=[sys.executable, STUB, "{socket}", "--slow", "0.5"])
    cfg = config(tmp_path, server, rows=40)
    proc = start_cli(cfg, new_session=True)
    run = the_run(tmp_path)
    wait_for(lambda: any(e["event"] == "server_ready" for e in events(run)), 60, "a ready replica")
    procs = born(wait_for(lambda: len(replica_pids(run)) == 2 and replica_pids(run), 30, "the replica's pids"))
    assert len(still_alive(procs)) == 2
    (started,) = [r for r in jsonl(run / "servers/ledger.jsonl") if r["state"] == "started"]
    folder = os.path.dirname(started["socket"])
    proc.kill()
    proc.wait()
    # by pid and start time: a pid reused meanwhile is not the replica left alive
    wait_for(lambda: not still_alive(procs), OWNER_GONE_S, "the replica to die with its owner")
    assert os.path.isdir(folder)  # nobody removed the crashed launch's socket folder yet
    res = run_cli(cfg, "-r", timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    assert len(predictions(run)) == 40
    assert not os.path.exists(folder)  # -r reaped it with the ledger's record


def test_a_socket_path_too_long_for_a_unix_socket_is_one_line_before_any_server_starts(tmp_path: Path) -> None:
    """A deep TMPDIR makes the socket path longer than ``sun_path`` holds: the server's own bind
    would fail only after it loaded its model (minutes for vLLM, each restart again)."""
    deep = tmp_path / ("d" * 90)
    deep.mkdir()
    server: dict[str, Any] = dict(engine="command", model="m", command=[sys.executable, STUB, "{socket}"])
    res = run_cli(config(tmp_path, server, rows=2), env={**os.environ, "TMPDIR": str(deep)}, timeout=120)
    assert res.returncode != 0
    lines = [ln for ln in res.stderr.splitlines() if "a Unix socket takes" in ln]
    assert lines and "set TMPDIR to a shorter folder" in lines[0], res.stderr[-3000:]
    run = the_run(tmp_path)
    assert not [r for r in jsonl(run / "servers/ledger.jsonl") if r["state"] == "started"]
