"""Process-group helpers shared by the backends that start local processes."""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence

_PR_SET_PDEATHSIG = 1


def die_with_parent(sig: signal.Signals) -> Callable[[], None]:
    """A ``preexec_fn``: the child gets ``sig`` when the orchestrator dies, even by SIGKILL.

    Call it in the process that starts the child, right before the start: the child compares its
    parent with this process, since an orchestrator that died between the fork and the ``prctl``
    never sends the signal (the child, adopted by another, would run on outside every ledger).
    """
    parent = os.getpid()

    def setup() -> None:
        try:
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, sig)
        except (OSError, AttributeError):
            return  # not Linux: Ctrl-C and SIGTERM still clean up; only SIGKILL of us would not
        if os.getppid() != parent:  # the orchestrator died before the prctl: die as it would have made us
            os.kill(os.getpid(), sig)
            os._exit(128 + int(sig))  # a handler the child inherited caught it: end all the same

    return setup


def start_group(
    argv: Sequence[str],
    env: dict[str, str],
    log_path: str,
    parent_death_signal: signal.Signals = signal.SIGKILL,
    stdin: int | None = subprocess.DEVNULL,
    pass_fds: Sequence[int] = (),
    stdout: int | None = None,
) -> subprocess.Popen[bytes]:
    """Start ``argv`` with ``env`` added to ours, its output appended to ``log_path``
    (only its stderr when ``stdout`` is given, e.g. ``subprocess.PIPE`` to read it).

    The child leads its own process group (Ctrl-C is the orchestrator's to pass on, and a
    whole group can be stopped at once) and gets ``parent_death_signal`` if the orchestrator
    dies, even by SIGKILL.  Every backend that starts a local process starts it here.
    """
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            list(argv),
            stdout=log if stdout is None else stdout,
            stderr=subprocess.STDOUT if stdout is None else log,
            stdin=stdin,
            env={**os.environ, **env},
            pass_fds=tuple(pass_fds),
            start_new_session=True,
            preexec_fn=die_with_parent(parent_death_signal),
        )


def signal_group(pid: int, sig: signal.Signals) -> None:
    """Send ``sig`` to the process group led by ``pid``, if it still exists."""
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def reap_group(proc: subprocess.Popen[bytes]) -> int | None:
    """The exit code of a group's leader once it has ended (None while it runs), what it left
    running in its group (a server it started, a worker pool) killed first: a crashed task's
    children would hold its GPU and outlive the run.  The leader is looked at without being
    reaped (``WNOWAIT``), so its group id cannot be another group's by the time it is signalled."""
    if proc.returncode is not None:
        return proc.returncode
    try:
        if os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
            return None
    except ChildProcessError:  # reaped already, by another thread's wait
        return proc.poll()
    signal_group(proc.pid, signal.SIGKILL)
    return proc.wait()


def stop_groups(procs: Sequence[subprocess.Popen[bytes]], grace_s: float) -> None:
    """SIGTERM each process group, wait up to ``grace_s``, then SIGKILL and reap them."""
    for proc in procs:
        signal_group(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(p.poll() is None for p in procs):
        time.sleep(0.02)
    for proc in procs:
        # SIGKILL the whole group even if the leader exited: its children may linger.
        signal_group(proc.pid, signal.SIGKILL)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass


def signal_name(sig: int) -> str:
    """``9`` -> ``"SIGKILL"`` (the number itself for a signal Python does not name)."""
    try:
        return signal.Signals(sig).name
    except ValueError:
        return str(sig)


def describe_status(wait_status: int | None) -> tuple[int, str]:
    """A raw wait status as ``(exit code, words)``: ``(3, "exit code 3")``, ``(-9, "signal SIGKILL")``."""
    if wait_status is None:
        return -1, "exit status unknown"
    code, sig = wait_status >> 8, wait_status & 0x7F
    if sig:
        return -sig, f"signal {signal_name(sig)}"
    return code, f"exit code {code}"
