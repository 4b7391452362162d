"""Helpers of the sandbox tests: they need root (CI runs as root) and look at real processes."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestra.limits.concurrency import HostSlots, drop_scope
from orchestra.sandbox.process import SCOPE_NAME
from orchestra.sandbox.sandbox import _OFFSETS, DEFAULT_UID_BASE, MAX_SLOTS, boxes_dir
from tests.helpers import wait_for


def sandbox_processes() -> list[tuple[int, int, str]]:
    """(pid, uid, command) of every live process that runs as a sandbox user."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status", encoding="utf-8") as f:
                status = f.read()
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode("utf-8", "replace")
        except OSError:
            continue
        uid_line = next((ln for ln in status.splitlines() if ln.startswith("Uid:")), "")
        state = next((ln for ln in status.splitlines() if ln.startswith("State:")), "")
        uid = int(uid_line.split()[1]) if uid_line else -1
        if DEFAULT_UID_BASE <= uid < DEFAULT_UID_BASE + _OFFSETS * MAX_SLOTS and "zombie" not in state:
            found.append((int(entry), uid, cmd))
    return found


def no_sandbox_process_left() -> None:
    """Wait (10 s) until no process of a sandbox user lives: one the sandbox SIGKILLed ends when the
    kernel next runs it, on a loaded machine a moment after the program's result (one still exiting,
    with an empty command line, failed a one-look check once); a process that survives fails."""
    wait_for(lambda: sandbox_processes() == [], 10, "the sandbox's SIGKILLed processes to end")


def slot_dirs(lock_dir: Path) -> list[Path]:
    """The sandbox folders (``box-<slot>``) of the host-wide scope kept under ``lock_dir``."""
    scope_dir = HostSlots(SCOPE_NAME, 1, lock_dir=str(lock_dir)).dir
    folder = Path(boxes_dir(scope_dir))
    return sorted(folder.glob("box-*")) if folder.exists() else []


@pytest.fixture(autouse=True)
def _fresh_scope() -> Iterator[None]:
    """Each test gets the sandbox scope of its own lock folder (scopes are cached by name)."""
    drop_scope(SCOPE_NAME, host_wide=True)
    yield
    drop_scope(SCOPE_NAME, host_wide=True)


@pytest.fixture
def lock_dir(tmp_path: Path) -> Path:
    return tmp_path / "locks"  # the autouse fixture of tests/conftest.py points ORCHESTRA_LOCK_DIR here


@pytest.fixture(autouse=True)
def _needs_root() -> None:
    if os.geteuid() != 0:
        pytest.fail("the sandbox tests need root (namespaces, one user id per slot); CI runs them as root")


@pytest.fixture
def nothing_left(lock_dir: Path) -> Iterator[None]:
    """After the test: no sandbox process alive (:func:`no_sandbox_process_left`) and no sandbox folder left."""
    yield
    no_sandbox_process_left()
    assert slot_dirs(lock_dir) == []
