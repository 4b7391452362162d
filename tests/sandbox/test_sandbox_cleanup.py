"""What is left when a program ends, and whose failure it is when it never started.

``isolation='none'`` has no PID namespace to die with: what the program leaves is killed with
``kill(-1, SIGKILL)`` run as the slot's own user, which no fork can outrun (a sweep of
``/proc`` by pid could be: a chain that forks its next link and exits moves to a new pid
faster than a sweep reads ``/proc``).
"""

from __future__ import annotations

import asyncio
import os
import signal
import textwrap
import time

import pytest

from orchestra.sandbox import Sandbox, SandboxError, SandboxResult
from tests.sandbox.conftest import no_sandbox_process_left, sandbox_processes

PY3 = "/usr/bin/python3"

# Three chains of pid-hopping processes, each in its own session (out of the program's process
# group), each link forking the next and exiting at once; bounded: 3 x 800 forks, then the last
# link of each chain sleeps.
HOPPERS = """
    import os, time
    ready_r, ready_w = os.pipe()
    for _ in range(3):
        if os.fork() == 0:
            os.setsid()
            os.write(ready_w, b".")
            for _ in range(800):
                try:
                    if os.fork() > 0:
                        os._exit(0)
                except OSError:
                    pass
            time.sleep(30)
            os._exit(0)
    ready = b""
    while len(ready) < 3:  # every chain left the process group: the program may end
        ready += os.read(ready_r, 3 - len(ready))
    print("hopping", os.getuid())
"""


def run(sandbox: Sandbox, program: str) -> SandboxResult:
    async def go() -> SandboxResult:
        await sandbox.start()
        return await sandbox.run({"main.py": textwrap.dedent(program)}, [PY3, "main.py"])

    return asyncio.run(go())


def of_user(uid: int) -> list[tuple[int, int, str]]:
    """The live processes of one sandbox user (other sandboxes on the host are not ours)."""
    return [p for p in sandbox_processes() if p[1] == uid]


def survivors_after_hopping(uid: int, max_wait_s: float = 5.0) -> list[tuple[int, int, str]]:
    """The processes of ``uid`` once any chain that escaped had time to stop hopping."""
    deadline = time.monotonic() + max_wait_s
    while time.monotonic() < deadline:
        time.sleep(0.5)
        left = of_user(uid)
        if not left:
            return []
        if all("main.py" in cmd for _, _, cmd in left) and len(left) <= 3:
            states = {pid: _state(pid) for pid, _, _ in left}
            if all(s == "S" for s in states.values()):
                return left  # the chains' last links, asleep: survivors
    return of_user(uid)


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


def zombies_reaped(uid: int, max_wait_s: float = 20.0) -> None:
    """Wait until the host's init reaped the exited links (zombies count towards the process
    limit of the next run of the slot)."""
    deadline = time.monotonic() + max_wait_s
    while time.monotonic() < deadline:
        owners = []
        for entry in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{entry}/status", encoding="utf-8") as f:
                    owners.append(int(f.read().split("\nUid:", 1)[1].split()[0]))
            except (OSError, IndexError):
                continue
        if uid not in owners:
            return
        time.sleep(0.1)


def test_isolation_none_leaves_no_process_even_when_pids_keep_moving(nothing_left: None) -> None:
    sandbox = Sandbox("none", limits=dict(timeout_s=20, max_processes=4000), allow_unisolated=True)
    survivors: list[list[tuple[int, int, str]]] = []
    uids: set[int] = set()
    try:
        for _ in range(4):
            for uid in uids:
                zombies_reaped(uid)
            res = run(sandbox, HOPPERS)
            assert res.status == "ok" and "hopping" in res.stdout, res.stderr
            uid = int(res.stdout.split()[-1])
            uids.add(uid)
            survivors.append(survivors_after_hopping(uid))
    finally:
        # a failed check must not leave its sleepers to later tests (only this test's own user)
        for pid, _, _ in [p for uid in uids for p in of_user(uid)]:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
    assert survivors == [[]] * 4


@pytest.mark.parametrize("method", ["bwrap", "unshare", "none"])
def test_a_wrapper_that_cannot_start_the_program_is_a_sandbox_error(method: str, nothing_left: None) -> None:
    sandbox = Sandbox(method, allow_unisolated=True)

    async def go() -> SandboxResult:
        await sandbox.start()
        return await sandbox.run({}, ["/nonexistent/python3", "main.py"])

    with pytest.raises(SandboxError, match="did not start the program: .*/nonexistent/python3"):
        asyncio.run(go())
    no_sandbox_process_left()
