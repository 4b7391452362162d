"""A server that leaves the replica's process group (``setsid``, a daemon, a container's proxy):
its port is always held by a process outside the group.  The pool takes that for a lost race
for the port and started the replica again on another one, forever (the run hung, the ledger
grew); the watchdog, asked to stop, signalled only its group and waited for the server forever.
Also: a server command that does not exist, and a server still loading (``/health`` 503).
Real processes: the watchdog, ``setsid`` and the keyed stub server through ``run.py``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import REPO, jsonl, run_cli, run_dirs, wait_for
from tests.serving.test_managed_runs import alive, config, replica_pids

pytestmark = pytest.mark.slow

STUB = str(REPO / "tests/serving/keyed_stub.py")


def test_a_watchdog_asked_to_stop_stops_a_server_that_left_its_group(tmp_path: Path) -> None:
    key_file = tmp_path / "k"
    key_file.write_text("k" * 20)
    log = tmp_path / "w.log"
    with open(log, "wb") as out:
        dog = subprocess.Popen([sys.executable, "-m", "orchestra.serving.watchdog", "--key-env", "ORCHESTRA_SERVER_KEY",
                                "--grace-s", "2", "--", "setsid", sys.executable, "-c", "import time; time.sleep(120)"],
                               stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                               env={**os.environ, "ORCHESTRA_SERVER_KEY_FILE": str(key_file)})
    try:
        line = wait_for(lambda: [ln for ln in log.read_text().splitlines() if ln.startswith("watchdog: server pid")],
                        30, "the server's pid")
        server = int(line[0].split()[-1])
        wait_for(lambda: os.getpgid(server) != dog.pid, 30, "setsid to take the server out of the group")
        dog.send_signal(signal.SIGTERM)
        assert dog.wait(timeout=15) != 0  # before the fix: waited for the server forever
        assert not alive(server)
    finally:
        if dog.poll() is None:
            dog.kill()
            dog.wait()


def test_a_server_whose_port_is_never_its_groups_fails_in_one_line_instead_of_restarting_forever(
        tmp_path: Path) -> None:
    server = dict(engine="command", model="m", command=["setsid", sys.executable, STUB, "{port}"], max_restarts=1)
    t0 = time.monotonic()
    res = run_cli(config(tmp_path, server, rows=2), timeout=150)  # before the fix: no end (TimeoutExpired)
    assert res.returncode == 1, res.stderr[-2000:]
    assert time.monotonic() - t0 < 120
    (line,) = [ln for ln in res.stderr.splitlines() if ln.startswith("FAILED: infer task")]
    assert "is held by another process, 3 times in a row" in line, line
    (run,) = run_dirs(tmp_path / "out")
    starts = [r for r in jsonl(run / "servers/ledger.jsonl") if r["state"] == "started"]
    assert len(starts) == 6  # 3 ports each for the first start and its one restart
    assert not [p for p in replica_pids(run) if alive(p)]


def test_a_server_command_that_does_not_exist_fails_the_run_in_one_line(tmp_path: Path) -> None:
    server = dict(engine="command", model="m", command=["orchestra-no-such-server", "--port", "{port}"],
                  max_restarts=1)
    res = run_cli(config(tmp_path, server, rows=2), timeout=120)
    assert res.returncode == 1, res.stderr[-2000:]
    (line,) = [ln for ln in res.stderr.splitlines() if ln.startswith("FAILED: infer task")]
    assert "command replica 0 of smol exited with code 127 before it was ready" in line, line
    assert "watchdog: cannot start 'orchestra-no-such-server'" in line, line
    (run,) = run_dirs(tmp_path / "out")
    assert len([r for r in jsonl(run / "servers/ledger.jsonl") if r["state"] == "started"]) == 2  # one restart


def test_a_replica_still_loading_is_not_listed_before_it_answers_its_ready_path(tmp_path: Path) -> None:
    """``/health`` 503 while the server loads: the replica is not offered to tasks before it
    answers 200, and the run then completes on it."""
    warm_s = 3.0
    server = dict(engine="command", model="m", command=[sys.executable, STUB, "{port}", "--warm", str(warm_s)],
                  max_restarts=0, startup_timeout_s=60)
    res = run_cli(config(tmp_path, server, rows=2), timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    (run,) = run_dirs(tmp_path / "out")
    (ready,) = [e for e in jsonl(run / "events.jsonl") if e.get("event") == "server_ready"]
    assert ready["startup_s"] >= warm_s
    log = (run / "servers/smol/replica-0.log").read_text()
    assert log.count("request GET /health") >= 2  # asked again while it answered 503
