"""Each isolation method, with real namespaces, real limits and real hostile programs.

Every test that runs a program also checks that nothing is left: no process of a sandbox
user and no sandbox folder (the ``nothing_left`` fixture).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from orchestra.limits.concurrency import HostSlots
from orchestra.sandbox import IsolationUnavailable, Sandbox, SandboxResult
from orchestra.sandbox.process import SCOPE_NAME
from orchestra.sandbox.sandbox import boxes_dir
from tests.sandbox.conftest import no_sandbox_process_left, slot_dirs

PY3 = "/usr/bin/python3"
METHODS = ["bwrap", "unshare"]


def run(sandbox: Sandbox, program: str, **files: str) -> SandboxResult:
    async def go() -> SandboxResult:
        await sandbox.start()
        return await sandbox.run({"main.py": textwrap.dedent(program), **files}, [PY3, "main.py"])

    return asyncio.run(go())


@pytest.mark.parametrize("method", METHODS)
def test_a_correct_program_runs_in_a_private_work_folder(method: str, nothing_left: None) -> None:
    res = run(Sandbox(method), """
        import json, os
        open("out.txt", "w").write("kept inside")
        print(json.dumps({"uid": os.getuid(), "cwd": os.getcwd(), "files": sorted(os.listdir(".")),
                          "env": sorted(os.environ), "pid": os.getpid()}))
    """)
    assert res.status == "ok", res.stderr
    seen = json.loads(res.stdout)
    assert seen["uid"] >= 1_900_000_000
    assert seen["files"] == ["main.py", "out.txt"]
    assert set(seen["env"]) - {"PWD", "LC_CTYPE"} == {"HOME", "LANG", "PATH", "PYTHONDONTWRITEBYTECODE",
                                                        "PYTHONHASHSEED", "TMPDIR"}
    assert seen["pid"] <= 3  # its own PID namespace


@pytest.mark.parametrize("method", METHODS)
def test_the_process_limit_holds_and_is_per_program(method: str, nothing_left: None) -> None:
    program = """
        import os, time
        made = 0
        for _ in range(200):
            try:
                pid = os.fork()
            except OSError:
                break
            if pid == 0:
                time.sleep(30)
                os._exit(0)
            made += 1
        print(made)
    """
    sandbox = Sandbox(method, limits=dict(max_processes=12, timeout_s=60), max_sandboxes=2)

    async def two_at_once() -> list[SandboxResult]:
        await sandbox.start()
        files = {"main.py": textwrap.dedent(program)}
        return list(await asyncio.gather(*(sandbox.run(files, [PY3, "main.py"]) for _ in range(2))))

    results = asyncio.run(two_at_once())
    for res in results:
        assert res.status == "ok", res.stderr
        # 12 tasks for its user: itself and at most 11 children, whatever the other program does
        assert 5 <= int(res.stdout) <= 11
    assert {r.slot for r in results} == {0, 1}


@pytest.mark.parametrize("method", METHODS)
def test_memory_limit_stops_an_8gb_allocation_at_once(method: str, nothing_left: None) -> None:
    res = run(Sandbox(method, limits=dict(mem_mb=512, timeout_s=60)), """
        block = bytearray(8 << 30)
        print("allocated", len(block))
    """)
    assert res.status == "memory_limit" and "MemoryError" in res.stderr
    assert "allocated" not in res.stdout


@pytest.mark.parametrize("method", METHODS)
def test_cpu_and_wall_clock_limits(method: str, nothing_left: None) -> None:
    spin = run(Sandbox(method, limits=dict(cpu_s=1, timeout_s=60)), "while True: pass\n")
    assert spin.status == "cpu_limit"
    t0 = time.monotonic()
    sleeper = run(Sandbox(method, limits=dict(timeout_s=1)), "import time\ntime.sleep(60)\n")
    assert sleeper.status == "timeout" and time.monotonic() - t0 < 60


@pytest.mark.parametrize("method", METHODS)
def test_work_folder_size_and_file_size_limits(method: str, nothing_left: None) -> None:
    res = run(Sandbox(method, limits=dict(disk_mb=4)), """
        written = 0
        try:
            with open("big", "wb") as f:
                for _ in range(64):
                    f.write(b"x" * (1 << 20)); f.flush(); written += 1
        except OSError as exc:
            print("stopped", type(exc).__name__)
        print(written)
    """)
    assert res.status in ("ok", "killed"), res.stderr  # EFBIG/ENOSPC, or SIGXFSZ
    if res.status == "ok":
        assert "stopped" in res.stdout and int(res.stdout.split()[-1]) <= 4


@pytest.mark.parametrize("method", METHODS)
def test_nothing_outside_the_work_folder_is_writable(method: str, tmp_path: Path, nothing_left: None) -> None:
    targets = ["/tmp/orchestra-escape", "/var/tmp/orchestra-escape", "/dev/shm/orchestra-escape",
               "/root/orchestra-escape", "/orchestra-escape", str(tmp_path / "escape"), "/etc/orchestra-escape"]
    res = run(Sandbox(method), f"""
        import os
        ok = []
        for path in {targets!r}:
            if os.path.dirname(path) == os.getcwd():
                continue  # its own work folder (unshare mounts it on /tmp)
            try:
                with open(path, "w") as f:
                    f.write("x")
                ok.append(path)
            except OSError:
                pass
        print(ok)
    """)
    assert res.status == "ok", res.stderr
    assert res.stdout.strip() == "[]"
    assert not any(os.path.exists(p) for p in targets)


class Listener:
    """A TCP listener on 127.0.0.1 that counts the connections it gets."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.05)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.accepted += 1
            conn.close()

    def close(self) -> None:
        """Stop, then count the connections still in the backlog: a connect that returned is
        counted whether or not the thread had accepted it yet."""
        self._stop.set()
        self._thread.join()
        self.sock.setblocking(False)
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                break
            self.accepted += 1
            conn.close()
        self.sock.close()


CONNECT = """
    import socket
    try:
        socket.create_connection(("127.0.0.1", {port}), timeout=3).close()
        print("connected")
    except OSError as exc:
        print("refused", exc)
"""


@pytest.mark.parametrize("method", METHODS)
def test_no_network_even_to_the_hosts_loopback(method: str, nothing_left: None) -> None:
    listener = Listener()
    try:
        res = run(Sandbox(method), CONNECT.format(port=listener.port))
    finally:
        listener.close()
    assert res.stdout.startswith("refused") and listener.accepted == 0


def test_isolation_none_needs_an_opt_in_and_then_reaches_the_network(nothing_left: None) -> None:
    with pytest.raises(ValueError, match="allow_unisolated=True"):
        Sandbox("none")
    listener = Listener()  # the same listener as above: this shows the check can see a connection
    try:
        res = run(Sandbox("none", allow_unisolated=True), CONNECT.format(port=listener.port))
    finally:
        listener.close()
    assert res.stdout.startswith("connected") and listener.accepted == 1


SPY = """
    import os
    found = [k for k, v in os.environ.items() if "{secret}" in v]
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{{pid}}/environ", "rb") as f:
                    if b"{secret}" in f.read():
                        found.append(pid)
            except OSError:
                pass
    print(found)
"""


@pytest.mark.parametrize("method", [*METHODS, "none"])
def test_the_callers_secrets_are_out_of_reach(method: str, monkeypatch: pytest.MonkeyPatch,
                                              nothing_left: None) -> None:
    secret = "sk-test-" + os.urandom(8).hex()
    monkeypatch.setenv("OPENAI_API_KEY", secret)
    sandbox = Sandbox(method, allow_unisolated=True)
    assert run(sandbox, SPY.format(secret=secret)).stdout.strip() == "[]"

    async def given_on_purpose() -> SandboxResult:  # the check finds a secret that is there
        return await sandbox.run({"main.py": textwrap.dedent(SPY.format(secret=secret))}, [PY3, "main.py"],
                                 env={"GIVEN": secret})

    assert "GIVEN" in asyncio.run(given_on_purpose()).stdout


@pytest.mark.parametrize("method", METHODS)
def test_killing_its_parent_and_everything_fails(method: str, nothing_left: None) -> None:
    res = run(Sandbox(method), """
        import os, signal
        for target in (os.getppid(), 1):
            try:
                os.kill(target, signal.SIGKILL)
                print("killed", target)
            except OSError as exc:
                print("refused", target, exc.errno)
        os.kill(-1, signal.SIGKILL)  # every process it may signal: only itself is left
        print("still here")
    """)
    assert "killed" not in res.stdout and res.stdout.count("refused") == 2


@pytest.mark.parametrize("method", [*METHODS, "none"])
def test_daemons_and_fork_bombs_die_with_the_program(method: str, nothing_left: None) -> None:
    daemon = run(Sandbox(method, allow_unisolated=True), """
        import os, time
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                time.sleep(300)
            os._exit(0)
        print("started a daemon")
    """)
    assert daemon.status == "ok"
    bomb = run(Sandbox(method, limits=dict(timeout_s=2, max_processes=16), allow_unisolated=True), """
        import os
        while True:
            try:
                os.fork()
            except OSError:
                pass
    """)
    assert bomb.status in ("timeout", "cpu_limit")


def test_host_wide_cap_holds_across_processes(lock_dir: Path, nothing_left: None) -> None:
    """Two processes, four programs each, max_sandboxes=2: never more than two at once."""
    script = textwrap.dedent(f"""
        import asyncio, sys
        sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r})
        from orchestra.sandbox import Sandbox
        async def main():
            sb = Sandbox("bwrap", max_sandboxes=2)
            await sb.start()
            files = {{"main.py": "import time; time.sleep(0.5)"}}
            results = await asyncio.gather(*(sb.run(files, ["{PY3}", "main.py"]) for _ in range(4)))
            assert all(r.ok for r in results), results
        asyncio.run(main())
    """)
    env = {**os.environ, "ORCHESTRA_LOCK_DIR": str(lock_dir)}
    procs = [subprocess.Popen([sys.executable, "-c", script], env=env) for _ in range(2)]
    peak = 0
    while any(p.poll() is None for p in procs):
        peak = max(peak, len(slot_dirs(lock_dir)))
        time.sleep(0.005)
    assert [p.returncode for p in procs] == [0, 0]
    assert peak == 2


def test_an_unavailable_isolation_is_one_clear_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap, unshare, setpriv or prlimit here
    with pytest.raises(IsolationUnavailable) as info:
        asyncio.run(Sandbox("auto").start())
    message = str(info.value)
    assert "\n" not in message
    assert "'bwrap' needs the 'bwrap' program" in message and "'unshare' needs the 'unshare' program" in message
    assert "allow_unisolated=True" in message


def test_leftover_folders_of_a_killed_run_are_wiped(lock_dir: Path, nothing_left: None) -> None:
    sandbox = Sandbox("bwrap", max_sandboxes=1)
    res = run(sandbox, "print('first')")
    assert res.ok and slot_dirs(lock_dir) == []
    box = Path(boxes_dir(HostSlots(SCOPE_NAME, 1, lock_dir=str(lock_dir)).dir)) / "box-0"
    (box / "work").mkdir(parents=True)
    (box / "work" / "stale").write_text("from a task killed mid-run")
    res = run(sandbox, "import os; print(os.listdir('.'))")
    assert res.stdout.strip() == "['main.py']" and not box.exists()
    no_sandbox_process_left()


def test_auto_falls_back_to_none_only_when_allowed_and_says_so(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                                nothing_left: None) -> None:
    """Neither bubblewrap nor unshare on PATH: ``auto`` with ``allow_unisolated=True`` runs the
    program under ``none`` (limits and a slot user still apply) and describes itself as not
    network isolated."""
    tools = tmp_path / "bin"
    tools.mkdir()
    for name in ("setpriv", "prlimit"):
        (tools / name).symlink_to(shutil.which(name) or f"/usr/bin/{name}")
    monkeypatch.setenv("PATH", str(tools))
    with pytest.raises(IsolationUnavailable):
        asyncio.run(Sandbox("auto").start())
    sandbox = Sandbox("auto", allow_unisolated=True)
    res = run(sandbox, "import os; print(os.getuid())")
    assert sandbox.method.name == "none" and res.ok and int(res.stdout) >= 1_900_000_000
    assert sandbox.describe()["network_isolated"] is False and sandbox.snapshot()["sandboxes_started"] == 1


@pytest.mark.parametrize(("kwargs", "message"), [
    (dict(isolation="docker"), "isolation must be one of auto, bwrap, unshare, none; got 'docker'"),
    (dict(isolation="none"), "set allow_unisolated=True to accept that"),
    (dict(max_sandboxes=0), "max_sandboxes must be an integer within 1..256, got 0"),
    (dict(max_sandboxes=True), "max_sandboxes must be an integer within 1..256, got True"),
    (dict(uid_base=0), "uid_base must be an integer >= 1000"),
    (dict(extra_paths=["opt/python"]), "extra_paths must be absolute folders, got 'opt/python'"),
])
def test_bad_sandbox_settings_are_refused(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError) as info:
        Sandbox(**kwargs)
    assert message in str(info.value)


def test_what_a_program_is_given_is_checked_before_anything_starts(nothing_left: None) -> None:
    """File names that could leave the work folder, a relative program path and more input than
    the start socket holds are refused before a slot is taken; a Sandbox not started says so."""
    sandbox = Sandbox("bwrap")
    with pytest.raises(RuntimeError, match="start"):
        _ = sandbox.method

    async def refused() -> list[str]:
        await sandbox.start()
        started = sandbox.started  # the trial run of start(), once per process
        out = []
        for files, argv, stdin in (({"../escape.py": ""}, [PY3], b""), ({".hidden": ""}, [PY3], b""),
                                   ({"a/b.py": ""}, [PY3], b""), ({}, ["python3"], b""), ({}, [], b""),
                                   ({}, [PY3], b"x" * 16385)):
            with pytest.raises(ValueError) as info:
                await sandbox.run(files, argv, stdin=stdin)
            out.append(str(info.value))
        assert sandbox.started == started and sandbox.running == 0
        return out

    messages = asyncio.run(refused())
    assert sum("plain names" in m for m in messages) == 3
    assert sum("argv[0] must be an absolute path" in m for m in messages) == 2
    assert "stdin holds at most 16384 bytes" in messages[-1]
