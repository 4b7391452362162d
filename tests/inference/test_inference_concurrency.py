"""Named concurrency scopes; host-wide limits across real processes."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

import pytest

from orchestra.limits.concurrency import HostSlots, ProcessSlots, concurrency, drop_scope

CLIENT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "slot_client.py")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_scopes_are_shared_by_name() -> None:
    a = concurrency("t-shared", 3)
    assert concurrency("t-shared", 3) is a
    assert concurrency("t-other", 3) is not a
    drop_scope("t-shared")
    drop_scope("t-other")


def test_process_slots_bound_and_survive_cancellation() -> None:
    slots = ProcessSlots("t", 2)
    peak = 0

    async def one(delay: float) -> None:
        nonlocal peak
        async with slots():
            peak = max(peak, slots.in_use())
            await asyncio.sleep(delay)

    async def main() -> None:
        tasks = [asyncio.ensure_future(one(0.01)) for _ in range(10)]
        waiting = asyncio.ensure_future(one(0.01))
        await asyncio.sleep(0)
        waiting.cancel()  # a cancelled waiter must not swallow a slot
        await asyncio.gather(*tasks)
        assert slots.in_use() == 0

    asyncio.run(main())
    assert peak == 2


def test_host_slots_in_one_process(tmp_path: Any) -> None:
    a = HostSlots("t-host", 2, str(tmp_path))
    b = HostSlots("t-host", 2, str(tmp_path))  # a second "process" (own file descriptors)

    async def main() -> list[int]:
        s1, s2 = await a.acquire(), await a.acquire()
        waiter = asyncio.ensure_future(b.acquire())
        await asyncio.sleep(0.05)
        assert not waiter.done()  # both slots are taken on the host
        a.release(s1)
        got = await asyncio.wait_for(waiter, 5)
        b.release(got)
        a.release(s2)
        return [s1, s2, got]

    s1, s2, got = asyncio.run(main())
    assert {s1, s2} == {0, 1} and got == s1
    a.close()
    b.close()


def _client(server: Any, conns: int, tag: str, n: int, prompt: str | None = None) -> subprocess.Popen[str]:
    argv = [sys.executable, CLIENT, server.base_url, str(conns), tag, str(n)] + ([prompt] if prompt else [])
    env = {**os.environ, "PYTHONPATH": ROOT}
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


@pytest.mark.slow
def test_max_connections_holds_across_two_processes(server: Any) -> None:
    server.configure(latency_s=0.05)
    procs = [_client(server, 4, tag, 40) for tag in ("a", "b")]
    outs = [p.communicate(timeout=60) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err
        assert json.loads(out) == [str(i + 1) for i in range(40)]
    st = server.stats()
    assert st["by_status"] == {"200": 80}
    assert st["peak_concurrency"] == 4  # reached, and never 8
    keys = [key[0] for _, key, _ in st["log"]]
    assert keys.count("a") == 40 and keys.count("b") == 40


@pytest.mark.slow
def test_slots_of_a_killed_process_are_freed(server: Any) -> None:
    holder = _client(server, 2, "h", 2, "HANG_FOREVER {i}")
    deadline = time.monotonic() + 20
    while server.stats()["in_progress"] < 2:
        assert time.monotonic() < deadline, "the holder never sent its requests"
        time.sleep(0.02)
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    other = _client(server, 2, "o", 4)
    out, err = other.communicate(timeout=30)
    assert other.returncode == 0, err
    assert json.loads(out) == ["1", "2", "3", "4"]


def test_a_scope_asked_for_with_another_limit_is_rebuilt_when_idle_refused_when_busy(tmp_path: Any,
                                                                                     monkeypatch: Any) -> None:
    """A warm worker's next task may set another max_connections: an idle host-wide scope is
    rebuilt with it (its slot files closed); one with a slot taken refuses, naming both limits."""
    monkeypatch.setenv("ORCHESTRA_LOCK_DIR", str(tmp_path / "locks"))

    async def main() -> None:
        first = concurrency("t-limit", 2, host_wide=True)
        async with first():
            with pytest.raises(ValueError, match="is in use with limit 2; asked for 3"):
                concurrency("t-limit", 3, host_wide=True)
            assert first.in_use() == 1
        second = concurrency("t-limit", 3, host_wide=True)
        assert second is not first and second.limit == 3 and isinstance(second, HostSlots)
        async with second(), second(), second():
            assert second.in_use() == 3
        with pytest.raises(ValueError, match="limit must be an integer >= 1"):
            concurrency("t-limit", 0)

    try:
        asyncio.run(main())
    finally:
        drop_scope("t-limit", host_wide=True)


_DEFAULT_DIR = """
import asyncio, os, sys
from orchestra.limits.concurrency import HostSlots
async def main():
    slots = HostSlots("t-default", 2)
    async with slots():
        print(slots.dir)
try:
    asyncio.run(main())
except Exception as exc:
    print(f"{type(exc).__name__}: {exc}")
    sys.exit(2)
"""


def test_the_default_slot_folder_is_private_and_a_planted_link_is_refused(tmp_path: Any) -> None:
    """Without ORCHESTRA_LOCK_DIR the slot files live in <tmp>/orchestra-<uid>/slots, made 0700.
    Another local user who planted <tmp>/orchestra-<uid> as a link to a folder of theirs gets a
    one-line refusal, and no file of ours in their folder."""
    env = {k: v for k, v in os.environ.items() if k != "ORCHESTRA_LOCK_DIR"}
    env["PYTHONPATH"] = ROOT
    mine, theirs = tmp_path / "mine", tmp_path / "theirs"
    mine.mkdir()
    theirs.mkdir()
    res = subprocess.run([sys.executable, "-c", _DEFAULT_DIR], env={**env, "TMPDIR": str(mine)},
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    top = mine / f"orchestra-{os.getuid()}"
    assert res.stdout.strip().startswith(str(top / "slots")) and (top.stat().st_mode & 0o777) == 0o700
    planted = tmp_path / "planted"
    planted.mkdir()
    os.symlink(theirs, planted / f"orchestra-{os.getuid()}")
    res = subprocess.run([sys.executable, "-c", _DEFAULT_DIR], env={**env, "TMPDIR": str(planted)},
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "UnsafeFolderError" in res.stdout and "symbolic link" in res.stdout, res.stdout
    assert len(res.stdout.strip().splitlines()) == 1 and list(theirs.iterdir()) == []


def test_two_members_clearing_one_dead_member_at_once(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two tasks started after a SIGKILL both clear the dead task's member file: the one that
    found it gone as it unlinked it failed a sample with FileNotFoundError (found by the chaos test)."""
    import fcntl

    from orchestra.limits import concurrency as module

    a = HostSlots("t-dead-member", 4, lock_dir=str(tmp_path))
    b = HostSlots("t-dead-member", 4, lock_dir=str(tmp_path))
    dead = os.path.join(a.dir, "members", "999999-deadbeef")
    os.close(os.open(dead, os.O_WRONLY | os.O_CREAT, 0o600))  # nobody holds its lock: its process died
    real_flock = fcntl.flock
    raced: list[int] = []

    def flock_after_the_other(fd: int, op: int) -> None:
        if not raced and os.readlink(f"/proc/self/fd/{fd}") == dead:
            raced.append(fd)
            a._count_members(force=True)  # the other member clears it between our open and our lock
        real_flock(fd, op)

    monkeypatch.setattr(module.fcntl, "flock", flock_after_the_other)
    b._count_members(force=True)
    assert raced and not os.path.exists(dead) and b.fair_share() == 4
