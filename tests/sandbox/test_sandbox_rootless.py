"""The sandbox when orchestra does not run as root (most users): a real unprivileged user.

Every other sandbox test runs as root, where each slot gets its own user id.  Here a driver
process runs as ``nobody`` (``setpriv``), with a clean environment, and uses ``Sandbox`` the way
an eval task of an ordinary user does: ``bwrap`` maps that user into a user namespace, the
process limit is the user's own task count plus ``max_processes``
(``sandbox.count_tasks``), and ``none`` runs the program as that user in a host folder.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import REPO, wait_for
from tests.sandbox.test_sandbox_isolation import Listener

NOBODY = pwd.getpwnam("nobody").pw_uid

DRIVER = textwrap.dedent("""
    import asyncio, json, sys
    from orchestra.sandbox import Sandbox

    PROGRAMS = {
        "inside": '''
    import json, os, socket
    open("out.txt", "w").write("kept inside")
    try:
        socket.create_connection(("127.0.0.1", PORT), timeout=2)
        net = "reached the host"
    except OSError as exc:
        net = "refused"
    print(json.dumps({"uid": os.getuid(), "cwd": os.getcwd(), "files": sorted(os.listdir(".")),
                      "pid": os.getpid(), "env": sorted(os.environ), "net": net}))
    ''',
        "fork bomb": '''
    import os
    while True:
        try:
            os.fork()
        except OSError:
            pass
    ''',
        "locked": '''
    import os
    os.makedirs("x/y")
    open("x/y/f", "w").write("kept")
    os.chmod("x/y", 0o500)
    os.chmod("x", 0)
    os.chmod(".", 0o500)
    print("locked")
    ''',
        "daemon": '''
    import os, time
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            time.sleep(300)
        os._exit(0)
    print("started a daemon")
    ''',
    }

    async def main(method, port, names):
        sandbox = Sandbox(method, limits=dict(timeout_s=3, max_processes=16), allow_unisolated=True,
                          max_sandboxes=2)
        await sandbox.start()
        out = {"describe": sandbox.describe()}
        for name in names:
            try:
                program = PROGRAMS[name].replace("PORT", port)
                res = await sandbox.run({"main.py": program}, ["/usr/bin/python3", "main.py"])
                seen = {"status": res.status, "stdout": res.stdout, "stderr": res.stderr[-500:]}
            except Exception as exc:
                seen = {"status": "raised " + type(exc).__name__, "stdout": "", "stderr": str(exc)}
            out[name] = out.get(name, []) + [seen]
        print(json.dumps(out))

    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3].split(",")))
""")


@pytest.fixture
def home() -> Iterator[Path]:
    """A folder the unprivileged user owns (tmp_path lies under root's private folder)."""
    folder = Path(tempfile.mkdtemp(prefix="orchestra-rootless-", dir="/tmp"))
    os.chmod(folder, 0o755)
    os.chown(folder, NOBODY, NOBODY)
    (folder / "driver.py").write_text(DRIVER)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def nobody_processes() -> list[str]:
    """The command lines of the live processes of ``nobody``: one that ends between the reads of
    its status and its command line is gone, so not listed."""
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            status = Path(f"/proc/{entry}/status").read_text()
            uid = int(status.split("\nUid:")[1].split()[0])
            if uid == NOBODY and "zombie" not in status:
                found.append(Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode())
        except OSError:
            continue
    return found


def as_nobody(home: Path, method: str, port: int, names: list[str]) -> dict:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(home), "TMPDIR": str(home), "PYTHONPATH": str(REPO),
           "OPENAI_API_KEY": "sk-rootless-secret"}
    argv = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--",
            sys.executable, str(home / "driver.py"), method, str(port), ",".join(names)]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, cwd=home)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_bwrap_without_root_isolates_limits_and_leaves_nothing(home: Path) -> None:
    assert nobody_processes() == []
    listener = Listener()
    try:
        out = as_nobody(home, "bwrap", listener.port, ["inside", "fork bomb", "daemon", "locked", "locked"])
    finally:
        listener.close()
    assert out["describe"]["isolation"] == "bwrap" and out["describe"]["user"] == f"uid {NOBODY} (not root)"
    assert out["inside"][0]["status"] == "ok", out["inside"]
    seen = json.loads(out["inside"][0]["stdout"])
    assert seen["uid"] == NOBODY and seen["cwd"] == "/sandbox" and seen["files"] == ["main.py", "out.txt"]
    assert seen["pid"] <= 3 and seen["net"] == "refused" and "OPENAI_API_KEY" not in seen["env"]
    assert listener.accepted == 0
    assert out["fork bomb"][0]["status"] in ("timeout", "cpu_limit"), out["fork bomb"]
    assert out["daemon"][0]["status"] == "ok"
    assert [r["status"] for r in out["locked"]] == ["ok", "ok"]
    # the daemon and the bomb's processes died with their sandbox: SIGKILLed, each ends when the kernel
    # next runs it (the sandbox reaped its own child only; on a loaded machine, a moment later)
    wait_for(lambda: nobody_processes() == [], 10, "the sandbox's processes to be gone")
    assert not any((home / f"orchestra-sandbox-{NOBODY}").rglob("box-*"))
    assert not (home / "out.txt").exists()


def test_none_without_root_limits_the_program_and_runs_it_as_the_user(home: Path) -> None:
    listener = Listener()
    try:
        out = as_nobody(home, "none", listener.port, ["locked", "inside", "fork bomb", "locked", "locked"])
    finally:
        listener.close()
    assert out["describe"]["isolation"] == "none" and out["describe"]["network_isolated"] is False
    seen = json.loads(out["inside"][0]["stdout"])
    assert seen["uid"] == NOBODY and seen["net"] == "reached the host" and "OPENAI_API_KEY" not in seen["env"]
    assert seen["cwd"].startswith(str(home / f"orchestra-sandbox-{NOBODY}")) and seen["files"] == ["main.py", "out.txt"]
    assert out["fork bomb"][0]["status"] in ("timeout", "cpu_limit"), out["fork bomb"]
    # A program that locks its folder (read-only, unreadable subfolders) as the same user: the
    # folder is still removed, and the next program in that slot still starts.
    assert [r["status"] for r in out["locked"]] == ["ok"] * 3, out["locked"]
    assert out["inside"][0]["status"] == "ok", out["inside"]
    wait_for(lambda: nobody_processes() == [], 10, "the fork bomb's SIGKILLed processes to be gone")
    assert not any((home / f"orchestra-sandbox-{NOBODY}").rglob("box-*"))
