"""The guard of one replica: it runs the server and makes sure nothing of it outlives its owner.

    python -m orchestra.serving.watchdog [--owner PID] [--key-env NAME ...] [--grace-s 5] -- ARGV...

The orchestrator starts this process as the leader of a new process group, with a parent-death
signal (SIGTERM when the orchestrator's thread that started it dies, SIGKILL included).  It puts
the run's key (read from ``ORCHESTRA_SERVER_KEY_FILE``) into the variables named by ``--key-env``,
starts ``ARGV`` in its own group (so an engine's worker processes are in it too), and then:

* when the server exits, it stops what the server left in the group and exits with its code;
* what the server prints goes to the watchdog's stdout (the replica's log) with the key
  replaced by ``***``; a log that is a file is capped (:class:`CappedLog`): it keeps its first
  :data:`LOG_HEAD_BYTES` and its last :data:`LOG_TAIL_BYTES` or so, never more than
  :data:`LOG_MAX_BYTES` in all (a chatty server wrote 40 MB in 20 s);
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
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import IO

_PR_SET_PDEATHSIG = 1
#: a replica's log keeps its first this many bytes (the command, the engine's settings and first
#: words) ...
LOG_HEAD_BYTES = 1 << 20
#: ... and at least its last this many (where the cause of a crash is) ...
LOG_TAIL_BYTES = 4 << 20
#: ... and is never larger than this; what lies between is cut out, and one line says how much.
#: The room above head + tail is what is written between two cuts (a cut copies the tail once, so
#: it is made once per ``LOG_MAX_BYTES - LOG_HEAD_BYTES - LOG_TAIL_BYTES`` written, not per line)
#: and must hold one piece of the pump (1 MiB).
LOG_MAX_BYTES = 8 << 20
#: how often the log's size is read from the file, in writes, and how near the cap it is read at every one
#: (what other writers append between two looks, a few lines, must stay under _SLACK)
_LOOK_EVERY, _SLACK = 256, 64 << 10
#: the line put where bytes were cut out (its number is the bytes cut there in all)
CUT_LINE = b"===== orchestra: %d bytes of this log were cut out here (it keeps its first and its last part)\n"
_CUT_PREFIX = CUT_LINE.split(b"%d")[0]


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


class CappedLog:
    """The replica's log (our stdout, opened for appending), written whole or, once it would grow
    past :data:`LOG_MAX_BYTES`, cut: its head (up to :data:`LOG_HEAD_BYTES`, at a line end) stays,
    one :data:`CUT_LINE` replaces the middle, and the last :data:`LOG_TAIL_BYTES` (from a line
    start) follow.  The size is read from the file (every few hundred writes, and at each one near
    the cap), so the lines other writers append (a cluster agent's, a restart's header) count too
    and land after the cut.  A log that is not
    a regular file (a pipe, a terminal) is written as it is.  One lock: the pump's thread and the
    main thread's lines never interleave with a cut."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.lock = threading.Lock()
        try:
            st = os.fstat(fd)
            self.capped, self.known = stat.S_ISREG(st.st_mode), st.st_size
        except OSError:
            self.capped, self.known = False, 0
        self.since = 0  # writes since the size was last read from the file

    def write(self, data: bytes) -> None:
        """Append ``data`` (cutting the log first if it would pass the cap); errors are ignored
        (a full disk must not stop the server)."""
        with self.lock:
            try:
                if self.capped:
                    # The size is read from the file (other writers append too) every
                    # _LOOK_EVERY writes and near the cap, not at every line: a chatty
                    # server's lines are many, and one stat costs as much as one write.
                    if self.since >= _LOOK_EVERY or self.known + len(data) > LOG_MAX_BYTES - _SLACK:
                        self.known, self.since = os.fstat(self.fd).st_size, 0
                    if self.known + len(data) > LOG_MAX_BYTES:
                        self._cut()
                        self.known = os.fstat(self.fd).st_size
                self._write_all(data)
                self.known, self.since = self.known + len(data), self.since + 1
            except OSError:
                pass

    def line(self, text: str) -> None:
        self.write(text.encode("utf-8", "replace") + b"\n")

    def _write_all(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(self.fd, view):]

    def _cut(self) -> None:
        # the log was opened for writing only (``>>`` in a shell too): read it through another fd
        reader = os.open(f"/proc/self/fd/{self.fd}", os.O_RDONLY | os.O_CLOEXEC)
        try:
            self._cut_with(reader)
        finally:
            os.close(reader)

    def _cut_with(self, reader: int) -> None:
        size = os.fstat(self.fd).st_size
        window = os.pread(reader, LOG_HEAD_BYTES + len(CUT_LINE) + 24, 0)
        at = window.find(b"\n" + _CUT_PREFIX)  # an earlier cut's line: the head ends before it
        if 0 <= at < LOG_HEAD_BYTES and b"\n" in window[at + 1:]:
            keep = at + 1
            old_line = window.index(b"\n", keep) + 1 - keep
            digits = window[keep + len(_CUT_PREFIX):keep + old_line].split(b" ", 1)[0]
            before = int(digits) if digits.isdigit() else 0  # what earlier cuts took out
        else:
            keep = window.rfind(b"\n", 0, LOG_HEAD_BYTES) + 1 or min(len(window), LOG_HEAD_BYTES)
            old_line = before = 0
        start = max(keep + old_line, size - LOG_TAIL_BYTES)
        tail = os.pread(reader, size - start, start)
        newline = tail.find(b"\n")
        if start > keep + old_line and 0 <= newline < len(tail) - 1:
            start, tail = start + newline + 1, tail[newline + 1:]  # from a line's start
        cut = before + start - keep - old_line
        os.ftruncate(self.fd, keep)
        os.lseek(self.fd, 0, os.SEEK_END)  # a log not opened for appending: write at the new end, not past it
        self._write_all(CUT_LINE % cut + tail)


def _pump(pipe: IO[bytes], key: bytes, log: CappedLog) -> None:
    """Copy what the server prints to ``log`` (the replica's log), the key replaced by
    ``***`` (SGLang prints its arguments, the key among them, when it starts).  Lines are
    read at most 1 MiB at a time; the last ``len(key) - 1`` bytes of a longer line wait for
    the next piece, so a key split between two pieces is still found."""
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
        log.write(text)
    if held:
        log.write(held.replace(key, b"***") if key else held)


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
    sys.stdout.flush()
    log = CappedLog(sys.stdout.fileno())
    log.line(f"watchdog: server pid {child.pid}")
    assert child.stdout is not None
    pump = threading.Thread(target=_pump, args=(child.stdout, key.encode(), log), daemon=True)
    pump.start()
    while child.poll() is None and not stop.is_set() and os.getppid() == parent:
        stop.wait(0.2)
    if child.poll() is None:
        reason = "stop asked" if stop.is_set() else "owner gone"
        log.line(f"watchdog: {reason}; stopping the server's process group")
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)
        _kill_rest(signal.SIGTERM, child)
        deadline = time.monotonic() + args.grace_s
        while child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
    _kill_rest(signal.SIGKILL, child)
    code = child.wait()
    pump.join(timeout=5)  # the group is gone: the pipe ends
    log.line(f"watchdog: server exited with code {code}")
    sys.exit(code if code >= 0 else 128 - code)


if __name__ == "__main__":
    main()
