"""The watchdog's owner check and a stop that never signals a reaped pid (real processes; a
watchdog always leads its own process group, as the pool starts it)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestra.serving import replica as replica_module
from orchestra.serving.replica import Replica
from orchestra.serving.spec import parse_server


def test_a_watchdog_whose_owner_is_already_gone_starts_nothing(tmp_path: Path) -> None:
    """``--owner`` names a pid that is not its parent (the owner died between the fork and the
    parent-death signal): the watchdog exits at once and the server never runs."""
    marker = tmp_path / "ran"
    server = [sys.executable, "-c", f"open({str(marker)!r}, 'w').close()"]
    not_parent = 1  # init: never the parent of a process this test starts
    res = subprocess.run([sys.executable, "-m", "orchestra.serving.watchdog", "--owner", str(not_parent), "--",
                          *server], capture_output=True, text=True, timeout=60, start_new_session=True,
                         env={**os.environ, "ORCHESTRA_SERVER_KEY_FILE": str(tmp_path / "none")})
    assert res.returncode == 1, res.stdout + res.stderr
    assert "owner gone before the server started" in res.stdout
    assert not marker.exists()
    ok = subprocess.run([sys.executable, "-m", "orchestra.serving.watchdog", "--owner", str(os.getpid()), "--",
                         *server], capture_output=True, text=True, timeout=60, start_new_session=True,
                        env={**os.environ, "ORCHESTRA_SERVER_KEY_FILE": str(tmp_path / "none")})
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert marker.exists()


def test_stop_does_not_signal_the_pid_of_a_reaped_watchdog(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = parse_server(dict(engine="command", model="m", command=["srv", "{port}"]))
    rep = Replica(spec, "m", 0, str(tmp_path / "r.log"))
    rep.proc = subprocess.Popen([sys.executable, "-c", "pass"])
    rep.proc.wait()  # reaped: its pid is free for any new process
    sent: list[int] = []
    monkeypatch.setattr(replica_module.os, "kill", lambda pid, sig: sent.append(pid))
    rep.stop(grace_s=0.1)
    assert rep.proc.pid not in sent and rep.state == "stopped"


def test_a_watchdog_whose_key_file_is_gone_says_so_in_one_line_and_starts_nothing(tmp_path: Path) -> None:
    """The key file removed before the replica starts (a cleaner of the temp folder): before, a
    traceback in the replica's log; now one line, and the server never runs without its key."""
    marker = tmp_path / "ran"
    res = subprocess.run([sys.executable, "-m", "orchestra.serving.watchdog", "--key-env", "ORCHESTRA_SERVER_KEY",
                          "--", sys.executable, "-c", f"open({str(marker)!r}, 'w').close()"],
                         capture_output=True, text=True, timeout=60, start_new_session=True,
                         env={**os.environ, "ORCHESTRA_SERVER_KEY_FILE": str(tmp_path / "gone.key")})
    assert res.returncode != 0 and not marker.exists()
    assert res.stderr.strip().startswith("watchdog: cannot read the key file (") and "gone.key" in res.stderr
    assert "Traceback" not in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr


def test_a_watchdog_without_a_server_command_refuses_in_one_line() -> None:
    res = subprocess.run([sys.executable, "-m", "orchestra.serving.watchdog", "--"], capture_output=True, text=True,
                         timeout=60, start_new_session=True)
    assert res.returncode == 1 and res.stderr.strip() == "watchdog: no server command after --", res.stderr


def test_a_key_split_over_a_long_line_and_an_unterminated_last_line_never_reach_the_log(tmp_path: Path) -> None:
    """The watchdog reads what the server prints 1 MiB at a time: a key that straddles that edge,
    and a key in a last line with no newline, are both replaced by ``***``; nothing else is lost."""
    key = "K3y" * 12
    key_file = tmp_path / "k"
    key_file.write_text(key)
    pad = (1 << 20) - 10
    code = ("import os, sys\nk = os.environ['ORCHESTRA_SERVER_KEY']\n"
            f"sys.stdout.write('a' * {pad} + k + 'tail\\n' + 'last ' + k + ' end'); sys.stdout.flush()\n")
    res = subprocess.run([sys.executable, "-m", "orchestra.serving.watchdog", "--key-env", "ORCHESTRA_SERVER_KEY",
                          "--", sys.executable, "-c", code], capture_output=True, timeout=60, start_new_session=True,
                         env={**os.environ, "ORCHESTRA_SERVER_KEY_FILE": str(key_file)})
    assert res.returncode == 0, res.stderr
    out = res.stdout.decode()
    assert key not in out and key[:10] not in out.replace("a" * pad, "")
    assert "a" * pad + "***tail\n" in out and "last *** end" in out


def test_launch_with_key_without_a_key_file_or_a_module_refuses_in_one_line(tmp_path: Path) -> None:
    env = {**os.environ, "ORCHESTRA_SERVER_KEY_FILE": str(tmp_path / "none.key")}
    for argv, expected in [([], "usage: python -m orchestra.serving.launch_with_key FLAG MODULE"),
                           (["--api-key", "json.tool"],
                            "orchestra.serving.launch_with_key: cannot read the key file: ")]:
        res = subprocess.run([sys.executable, "-m", "orchestra.serving.launch_with_key", *argv], capture_output=True,
                             text=True, timeout=60, env=env)
        assert res.returncode == 1 and res.stderr.startswith(expected) and "Traceback" not in res.stderr, res.stderr
