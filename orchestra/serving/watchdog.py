"""The guard of one replica: it runs the server and makes sure nothing of it outlives its owner.

    python -m orchestra.serving.watchdog [--owner PID] [--key-env NAME ...] [--grace-s 5] -- ARGV...

The orchestrator starts this process as the leader of a new process group, with a parent-death
signal (SIGTERM when the orchestrator's thread that started it dies, SIGKILL included).  It puts
the run's key (read from ``ORCHESTRA_SERVER_KEY_FILE``) into the variables named by ``--key-env``,
starts ``ARGV`` in its own group (so an engine's worker processes are in it too), and then:

* when the server exits, it stops what the server left in the group and exits with its code;
* what the server prints goes to the watchdog's stdout (the replica's log) with the key
  replaced by ``***``;
* on SIGTERM / SIGINT, or once its parent is gone, it sends SIGTERM to the whole group, waits
  ``--grace-s``, SIGKILLs whatever is left and exits.

A parent-death signal alone would stop only the server's first process, not vLLM's engine
workers or SGLang's schedulers; a group is stopped whole here.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import IO

_PR_SET_PDEATHSIG = 1


def group_members(pgid: int) -> list[int]:
    """The live processes of group ``pgid`` (from /proc)."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", encoding="ascii", errors="replace") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if len(fields) > 3 and fields[0] != "Z" and int(fields[2]) == pgid:
            out.append(int(name))
    return out


def _kill_rest(sig: signal.Signals, child: subprocess.Popen[bytes]) -> None:
    """Signal every other process of our group, and ``child`` (the server) even if it left the
    group (``setsid``: such a server was never stopped, and the watchdog waited for it forever)."""
    child.send_signal(sig)  # only while not reaped: its pid is still its own
    me = os.getpid()
    for pid in group_members(os.getpgid(0)):
        if pid != me:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass


def _die_with(parent: int) -> Callable[[], None]:
    """``preexec_fn`` of the server: SIGKILL when ``parent`` (this watchdog) dies; if it died
    already, between the fork and the ``prctl``, the server is not started at all."""
    def arm() -> None:
        try:
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        except (OSError, AttributeError):
            pass
        if os.getppid() != parent:
            os._exit(1)
    return arm


def _pump(pipe: IO[bytes], key: bytes) -> None:
    """Copy what the server prints to our stdout (the replica's log), the key replaced by
    ``***`` (SGLang prints its arguments, the key among them, when it starts).  Lines are
    read at most 1 MiB at a time; the last ``len(key) - 1`` bytes of a longer line wait for
    the next piece, so a key split between two pieces is still found."""
    out = sys.stdout.buffer
    held = b""
    keep = max(len(key) - 1, 0)
    while True:
        piece = pipe.readline(1 << 20)
        if not piece:
            break
        text = held + piece
        if key:
            text = text.replace(key, b"***")
        if not text.endswith(b"\n") and keep:
            text, held = text[:-keep], text[-keep:]
        else:
            held = b""
        try:
            out.write(text)
            out.flush()
        except OSError:
            pass
    if held:
        out.write(held.replace(key, b"***") if key else held)
        out.flush()


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m orchestra.serving.watchdog")
    ap.add_argument("--key-env", action="append", default=[])
    ap.add_argument("--grace-s", type=float, default=5.0)
    ap.add_argument("--owner", type=int, default=0, help="the pid that started this watchdog")
    ap.add_argument("argv", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    argv = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    if not argv:
        raise SystemExit("watchdog: no server command after --")
    # The owner's parent-death signal was armed before exec: an owner already gone (it died
    # between the fork and the prctl) is seen here, before anything starts.
    if args.owner and os.getppid() != args.owner:
        print("watchdog: owner gone before the server started", flush=True)
        sys.exit(1)
    env = dict(os.environ)
    try:
        with open(env.get("ORCHESTRA_SERVER_KEY_FILE", ""), encoding="utf-8") as fh:
            key = fh.read().strip()
    except OSError as exc:
        if args.key_env:  # the server would get no key: it never starts (one line in its log)
            raise SystemExit(f"watchdog: cannot read the key file ({exc}); a replica never serves without a key") \
                from None
        key = ""
    env.update({name: key for name in args.key_env})
    parent = os.getppid()
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: stop.set())
    try:
        child = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, preexec_fn=_die_with(os.getpid()))
    except OSError as exc:
        print(f"watchdog: cannot start {argv[0]!r}: {exc}", file=sys.stderr, flush=True)
        sys.exit(127)
    print(f"watchdog: server pid {child.pid}", flush=True)
    assert child.stdout is not None
    pump = threading.Thread(target=_pump, args=(child.stdout, key.encode()), daemon=True)
    pump.start()
    while child.poll() is None and not stop.is_set() and os.getppid() == parent:
        stop.wait(0.2)
    if child.poll() is None:
        reason = "stop asked" if stop.is_set() else "owner gone"
        print(f"watchdog: {reason}; stopping the server's process group", flush=True)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)
        _kill_rest(signal.SIGTERM, child)
        deadline = time.monotonic() + args.grace_s
        while child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
    _kill_rest(signal.SIGKILL, child)
    code = child.wait()
    pump.join(timeout=5)  # the group is gone: the pipe ends
    print(f"watchdog: server exited with code {code}", flush=True)
    sys.exit(code if code >= 0 else 128 - code)


if __name__ == "__main__":
    main()
