"""Units of the node agent (orchestra/serving/agent.py): its spec travels whole, it binds
127.0.0.1 when the orchestrator is on its machine, and the listener lookup follows the address."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestra.serving.agent import EXIT_NO_ADDRESS, check_placed, node_address, spec_from_json, spec_json
from orchestra.serving.presets import KEY_FILE_ENV
from orchestra.serving.replica import Replica, listener
from orchestra.serving.spec import ServerSpec
from tests.helpers import wait_for


def test_a_spec_survives_its_trip_through_json() -> None:
    spec = ServerSpec("command", "m", replicas=2, gpus=1, args=("--x", "1"), command=("srv", "{port}"),
                      env=(("A", "b"),), startup_timeout_s=5.0)
    assert spec_from_json(json.loads(json.dumps(spec_json(spec)))) == spec


def test_the_orchestrators_own_machine_means_loopback() -> None:
    assert node_address(socket.gethostname()) == "127.0.0.1"
    assert node_address("") == "127.0.0.1"


def test_listener_finds_a_socket_on_the_address_it_is_asked_about() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        found = listener(port, "127.0.0.1")
        assert found is not None and found[1] is False
        assert listener(port, "127.0.0.2") is None  # another address: not this socket


def test_an_unresolvable_orchestrator_host_is_one_line_and_exit_4(tmp_path: Path) -> None:
    """The agent started for real (as a Slurm job or a Ray actor starts it), told that the
    orchestrator is on a host name nothing resolves: one line in its log, no traceback, a failed
    status that names why, and exit 4, which the orchestrator's look at it reports with that line."""
    spec_path, key_path = tmp_path / "spec.json", tmp_path / "key"
    spec = ServerSpec("command", "m", command=("true", "{port}"))
    spec_path.write_text(json.dumps(spec_json(spec)))
    key_path.write_text("k" * 32)
    key_path.chmod(0o600)
    log, status = tmp_path / "agent.log", tmp_path / "status.json"
    with open(log, "wb") as out:
        res = subprocess.run([sys.executable, "-m", "orchestra.serving.agent", "--spec", str(spec_path), "--name", "m",
                              "--index", "0", "--log", str(tmp_path / "replica.log"), "--status", str(status),
                              "--heartbeat", str(tmp_path / "heartbeat"), "--owner-host", "no-such-host.invalid",
                              "--job", "77"], stdout=out, stderr=subprocess.STDOUT, timeout=60,
                             env={**os.environ, KEY_FILE_ENV: str(key_path)})
    lines = log.read_text().strip().splitlines()
    assert res.returncode == EXIT_NO_ADDRESS == 4, lines
    assert len(lines) == 1 and "Traceback" not in lines[0], lines
    assert lines[0].startswith("agent: cannot resolve the orchestrator's host name 'no-such-host.invalid'"), lines
    got = json.loads(status.read_text())
    assert {k: got[k] for k in ("state", "why", "code", "job")} == \
        {"state": "failed", "why": "no-address", "code": 4, "job": "77"}
    # what the pool sees of it: an exit with code 4, and the agent's line as the log's tail
    replica = Replica(spec, "m", 0, str(log))
    replica.started = time.monotonic()
    assert check_placed(replica, got, got["code"], "k" * 32) == "exited" and replica.code == 4
    assert replica.tail("k" * 32) == lines[0]


def test_node_address_names_the_host_it_cannot_resolve() -> None:
    with pytest.raises(OSError, match="cannot resolve the orchestrator's host name 'no-such-host.invalid'"):
        node_address("no-such-host.invalid")


def test_a_stop_while_the_resolver_waits_ends_the_agent_at_once(tmp_path: Path) -> None:
    """A node whose DNS server does not answer: the resolver waits tens of seconds while SIGTERM
    (scancel, Ctrl-C at the orchestrator) only sets a flag, so the agent lived on until the
    resolver gave up.  The slow resolver is made by ``sitecustomize`` in the agent process
    (``socket.gethostbyname`` of one name sleeps); the agent and the signal are real."""
    entered = tmp_path / "resolving"
    (tmp_path / "sitecustomize.py").write_text(
        "import socket, time\n_real = socket.gethostbyname\n"
        "def _slow(name):\n    if name == 'slow-dns.test':\n"
        f"        open({str(entered)!r}, 'w').close()\n        time.sleep(120)\n    return _real(name)\n"
        "socket.gethostbyname = _slow\n")
    spec_path, key_path = tmp_path / "spec.json", tmp_path / "key"
    spec_path.write_text(json.dumps(spec_json(ServerSpec("command", "m", command=("true", "{port}")))))
    key_path.write_text("k" * 32)
    key_path.chmod(0o600)
    paths = os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])
    proc = subprocess.Popen([sys.executable, "-m", "orchestra.serving.agent", "--spec", str(spec_path), "--name", "m",
                             "--index", "0", "--log", str(tmp_path / "replica.log"), "--status",
                             str(tmp_path / "status.json"), "--heartbeat", str(tmp_path / "heartbeat"),
                             "--owner-host", "slow-dns.test"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            env={**os.environ, KEY_FILE_ENV: str(key_path), "PYTHONPATH": paths})
    try:
        wait_for(entered.exists, 30, "the agent to ask the resolver")
        proc.terminate()
        t0 = time.monotonic()
        proc.wait(timeout=10)
        assert time.monotonic() - t0 < 3 and proc.returncode == 3
        assert not (tmp_path / "status.json").exists()  # stopped, as while starting: no failed status
    finally:
        proc.kill()
        proc.wait()
