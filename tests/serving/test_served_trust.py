"""What a hostile process that can write the run folder gets out of ``servers/``: nothing.

``servers/ledger.jsonl`` and ``servers/<model>/replicas.json`` live in the run folder.  A forged
ledger line must not make ``-r`` kill a process that is not a replica's watchdog, nor delete a
file or folder outside this user's private serving folder; a forged ``replicas.json`` must not
make a task send the run's key anywhere but a replica of this user: a loopback port another user
listens on, a URL whose host only looks like loopback, or a Unix socket outside the run's
private socket folder.  Real processes, real listening sockets (one of them as ``nobody``).
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

from orchestra.privdir import temp_folder
from orchestra.serving.balance import ReplicaSet
from orchestra.serving.pool import reap
from orchestra.serving.replica import start_time


def _ledger(servers: Path, **rec: object) -> None:
    servers.mkdir(parents=True, exist_ok=True)
    with open(servers / "ledger.jsonl", "a", encoding="utf-8") as fh:
        fh.write(json.dumps({"ts": 1.0, "state": "started", "name": "smol/0/0/1.000", **rec}) + "\n")


def test_a_forged_ledger_line_kills_no_other_process_and_deletes_nothing_outside(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    (victim / "keep").mkdir(parents=True)
    (victim / "keep" / "work.txt").write_text("precious")
    (victim / "a.key").write_text("not a key of ours")
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        _ledger(tmp_path / "servers", pid=bystander.pid, start_time=start_time(bystander.pid), port=0,
                key_file=str(victim / "a.key"), socket=str(victim / "keep" / "s.sock"), gpus=[])
        _ledger(tmp_path / "servers", name="smol/1/0/1.000", pid=None, start_time=None, port=0,
                key_file=str(victim / "orchestra-serve-0" / ".." / "a.key"),
                socket=str(victim / "orchestra-serve-0" / ".." / "keep" / "s.sock"), gpus=[])
        assert reap(str(tmp_path / "servers")) == []
        assert bystander.poll() is None  # not a watchdog of ours: never signalled
        assert (victim / "keep" / "work.txt").read_text() == "precious"
        assert (victim / "a.key").exists()
    finally:
        bystander.kill()
        bystander.wait()


def test_reap_still_removes_a_crashed_launchs_own_socket_folder_and_key(tmp_path: Path) -> None:
    root = temp_folder("serve")
    os.makedirs(root, mode=0o700, exist_ok=True)
    folder = tempfile.mkdtemp(prefix="sockets-", dir=root)
    fd, key_file = tempfile.mkstemp(suffix=".key", dir=root)
    os.close(fd)
    _ledger(tmp_path / "servers", pid=None, start_time=None, port=0, key_file=key_file,
            socket=os.path.join(folder, "ab.sock"), gpus=[])
    reap(str(tmp_path / "servers"))
    assert not os.path.exists(folder) and not os.path.exists(key_file)


def _listen_unix(path: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(path)
    sock.listen(4)
    return sock


def _write(path: Path, replicas: list[dict[str, str]]) -> None:
    path.write_text(json.dumps({"model": "m", "replicas": replicas}))


def test_a_task_trusts_only_sockets_in_the_runs_private_socket_folder(tmp_path: Path) -> None:
    root = temp_folder("serve")
    os.makedirs(root, mode=0o700, exist_ok=True)
    folder = tempfile.mkdtemp(prefix="sockets-", dir=root)
    ours = _listen_unix(os.path.join(folder, "ok.sock"))
    elsewhere = _listen_unix(str(tmp_path / "planted.sock"))  # a socket outside the private folder
    os.symlink(str(tmp_path / "planted.sock"), os.path.join(folder, "link.sock"))
    listed = tmp_path / "replicas.json"
    try:
        for bad in (str(tmp_path / "planted.sock"), os.path.join(folder, "link.sock"),
                    os.path.join(folder, "..", os.path.basename(folder), "ok.sock")):
            _write(listed, [{"url": "http://localhost/v1", "socket": bad}])
            assert ReplicaSet(str(listed), socket_root=root).pick() is None, bad
        _write(listed, [{"url": "http://localhost/v1", "socket": os.path.join(folder, "ok.sock")}])
        target = ReplicaSet(str(listed), socket_root=root).pick()
        assert target is not None and target.socket == os.path.join(folder, "ok.sock")
        assert ReplicaSet(str(listed)).pick() is None  # no socket folder known: no socket trusted
    finally:
        ours.close()
        elsewhere.close()
        shutil.rmtree(folder)


def _listen_tcp_as(uid: int, dual_stack: bool = False) -> tuple[int, subprocess.Popen[bytes]]:
    """A process of ``uid`` listening on a loopback port (``dual_stack``: on ``[::]``, which takes
    connections to 127.0.0.1 too): (port, process)."""
    bind = ("s = socket.socket(socket.AF_INET6); s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0); "
            "s.bind(('::', 0))" if dual_stack else "s = socket.socket(); s.bind(('127.0.0.1', 0))")
    code = ("import os, socket, sys, time\n"
            f"os.setgid({pwd.getpwuid(uid).pw_gid}); os.setuid({uid})\n"
            f"{bind}; s.listen(4)\n"
            "print(s.getsockname()[1], flush=True); time.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    assert proc.stdout is not None
    return int(proc.stdout.readline()), proc


def test_a_task_trusts_only_loopback_ports_this_user_listens_on(tmp_path: Path) -> None:
    port, other = _listen_tcp_as(pwd.getpwnam("nobody").pw_uid)
    port6, other6 = _listen_tcp_as(pwd.getpwnam("nobody").pw_uid, dual_stack=True)
    mine = socket.socket()
    mine.bind(("127.0.0.1", 0))
    mine.listen(4)
    with socket.socket() as gone:  # a port nothing listens on
        gone.bind(("127.0.0.1", 0))
        free = gone.getsockname()[1]
    listed = tmp_path / "replicas.json"
    try:
        for bad in (f"http://127.0.0.1:{port}/v1",  # another user's listener
                    f"http://127.0.0.1:{port6}/v1",  # another user's, on every address (IPv6 and IPv4)
                    f"http://127.0.0.1:{mine.getsockname()[1]}@10.0.0.5:80/v1",  # userinfo: the host is 10.0.0.5
                    f"http://127.0.0.1.example.com:{mine.getsockname()[1]}/v1",  # a name, not loopback
                    f"http://127.0.0.1:{free}/v1"):  # nothing listens
            _write(listed, [{"url": bad}])
            assert ReplicaSet(str(listed)).pick() is None, bad
        good = f"http://127.0.0.1:{mine.getsockname()[1]}/v1"
        _write(listed, [{"url": good}])
        target = ReplicaSet(str(listed)).pick()
        assert target is not None and target.url == good
    finally:
        mine.close()
        for proc in (other, other6):
            proc.send_signal(signal.SIGKILL)
            proc.wait()


def test_every_listener_shown_at_a_socket_path_is_found(tmp_path: Path) -> None:
    """/proc/net/unix lists the path a socket was bound to: one bound to the same name (here: to
    a name since unlinked) is listed too, so the replica's own socket must be looked for among
    all of them, not only the first one listed."""
    from orchestra.serving.replica import owns_socket, unix_listeners

    path = str(tmp_path / "r.sock")
    first = _listen_unix(path)
    os.unlink(path)
    second = _listen_unix(path)
    try:
        inodes = unix_listeners(path)
        assert sorted(inodes) == sorted(os.fstat(s.fileno()).st_ino for s in (first, second))
        assert all(owns_socket([os.getpid()], inode) for inode in inodes)
    finally:
        first.close()
        second.close()


def test_a_serving_folder_planted_by_another_user_is_refused_before_any_server(tmp_path: Path) -> None:
    """``<tmp>/orchestra-serve-<uid>`` made first by another user (or a link to a folder of theirs)
    would let them reach the key and the sockets: one line, exit 2, nothing started."""
    from tests.helpers import run_cli, run_dirs
    from tests.serving.test_managed_runs import config

    stub = str(Path(__file__).with_name("keyed_stub.py"))
    server = dict(engine="command", model="m", command=[sys.executable, stub, "{socket}"])
    nobody = pwd.getpwnam("nobody")
    for planted in ("folder", "link"):
        tmp = tmp_path / planted / "tmp"
        tmp.mkdir(parents=True)
        theirs = tmp / f"orchestra-serve-{os.getuid()}"
        if planted == "folder":
            theirs.mkdir(mode=0o777)
            os.chown(theirs, nobody.pw_uid, nobody.pw_gid)
        else:
            (tmp_path / planted / "elsewhere").mkdir(mode=0o700)
            theirs.symlink_to(tmp_path / planted / "elsewhere")
        work = tmp_path / planted
        res = run_cli(config(work, server, rows=2), env={**os.environ, "TMPDIR": str(tmp)}, timeout=120)
        assert res.returncode == 2, res.stderr[-3000:]
        lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1 and str(theirs) in lines[0], lines
        assert not [p for d in run_dirs(work / "out") for p in (d / "servers").glob("*/replica-*.log")]
        assert os.listdir(theirs) == []


def test_reap_skips_garbage_lines_and_never_kills_another_users_process_that_looks_like_a_watchdog(
        tmp_path: Path) -> None:
    """Lines that are no JSON object or name nothing are skipped; a process of another user whose
    argv reads ``-m orchestra.serving.watchdog`` (as root, any pid could be signalled) is left alone."""
    nobody = pwd.getpwnam("nobody")
    code = (f"import os, time\nos.setgid({nobody.pw_gid}); os.setuid({nobody.pw_uid})\n"
            "print('up', flush=True); time.sleep(60)\n")
    other = subprocess.Popen([sys.executable, "-c", code, "-m", "orchestra.serving.watchdog"], stdout=subprocess.PIPE)
    try:
        assert other.stdout is not None and other.stdout.readline().strip() == b"up"
        servers = tmp_path / "servers"
        servers.mkdir()
        (servers / "ledger.jsonl").write_text('not json\n[1, 2]\n{"state": "started", "name": 7}\n"started"\n')
        _ledger(servers, pid=other.pid, start_time=start_time(other.pid), port=0, gpus=[])
        assert reap(str(servers)) == []
        assert other.poll() is None
        assert [r.get("state") for r in map(json.loads, (servers / "ledger.jsonl").read_text().splitlines()[4:])] == [
            "started", "reaped"]
    finally:
        other.kill()
        other.wait()


def test_reap_reads_a_servers_ledger_written_before_the_journal(tmp_path: Path) -> None:
    """``-r`` of a run folder an earlier version wrote (its pool's lines: a local replica whose
    start a SIGKILL left recorded, a Slurm replica recorded stopped): the one left is reaped, once,
    and the stopped Slurm job is not cancelled again."""
    servers = tmp_path / "servers"
    servers.mkdir()
    key_file = str(tmp_path / "x.key")
    (servers / "ledger.jsonl").write_text(
        '{"ts": 1795925149.394, "state": "started", "name": "smol/0/0/1764380000.123", "model": "smol", '
        '"replica": 0, "pid": null, "start_time": null, "port": 41234, "socket": null, "gpus": [], '
        f'"key_file": "{key_file}"}}\n'
        '{"ts": 1795925149.397, "state": "started", "name": "smol/1/0/1764380000.124", "model": "smol", '
        '"replica": 1, "slurm_job": "4260", "job_name": "orc-serve-5f3a-smol-1", "port": null, "socket": null, '
        f'"gpus": [], "key_file": "{key_file}"}}\n'
        '{"ts": 1795925149.401, "state": "stopped", "name": "smol/1/0/1764380000.124", "model": "smol", '
        '"replica": 1, "exit_code": 0}\n')
    assert reap(str(servers)) == []
    added = [json.loads(line) for line in (servers / "ledger.jsonl").read_text().splitlines()[3:]]
    assert [(r["state"], r["name"], r["pid"]) for r in added] == [("reaped", "smol/0/0/1764380000.123", None)]
    assert reap(str(servers)) == [] and len((servers / "ledger.jsonl").read_text().splitlines()) == 4
