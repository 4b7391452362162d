"""Sample-level checkpoints: an append-only JSON-lines file per prediction file.

The first line carries the content hash of the predictions being built; a checkpoint with
another hash is stale and is discarded.  Each finished sample is one line, written with a
single ``write`` to a file opened with ``O_APPEND``, *before* the sample counts as done.

What "durable" means here:

* **Process death** (SIGKILL, OOM kill, a crash): a line is safe once ``write`` returns, since
  it is then in the kernel's page cache.  A killed task resumes with every sample whose line
  was written and re-sends only the samples that were in flight.
* **Power loss / kernel crash**: lines are ``fdatasync``-ed in groups by one background
  thread at most ``fsync_interval_s`` after they were written (group commit), and once more
  when the checkpoint closes, so at most the last interval of samples is sent again.  The
  final prediction file is written atomically (temporary file, fsync, rename).

A line cut short by a crash is cut off on load; a line that is not valid JSON is ignored
(its sample simply runs again).  One task writes a checkpoint at a time: an exclusive lock
on ``<checkpoint>.lock`` is held while it is open, so a second process (say, an orphaned
attempt still running) fails fast instead of interleaving its lines.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import threading
import time
from typing import Any

from orchestra.errors import TaskFailedError
from orchestra.fileio import encodable, write_sealed_jsonl, write_whole


class _Syncer:
    """One daemon thread that fdatasyncs every dirty checkpoint file every interval."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._dirty: dict[int, float] = {}  # fd -> interval
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def mark(self, fd: int, interval_s: float) -> None:
        if fd in self._dirty:  # already due for the next sync (a plain read; the common case)
            return
        with self._lock:
            self._dirty[fd] = interval_s
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="orchestra-ckpt-sync", daemon=True)
                self._thread.start()

    def forget(self, fd: int) -> None:
        with self._lock:
            self._dirty.pop(fd, None)

    def _run(self) -> None:
        while True:
            with self._lock:
                interval = min(self._dirty.values(), default=1.0)
            self._wake.wait(interval)
            with self._lock:
                fds = list(self._dirty)
                self._dirty.clear()
            for fd in fds:
                try:
                    os.fdatasync(fd)
                except OSError:
                    pass  # closed meanwhile: its close() synced it


_SYNCER = _Syncer()

#: how long a writer waits for the lock of a checkpoint another process still holds
LOCK_WAIT_S = 30.0


def _load_lines(path: str) -> tuple[list[dict[str, Any]], int]:
    """The valid JSON objects of a checkpoint file, and the byte length of its whole lines."""
    with open(path, "rb") as f:
        data = f.read()
    end = data.rfind(b"\n") + 1  # anything after the last newline is a torn append
    records = []
    for raw in data[:end].splitlines():
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw)
        except ValueError:
            continue
        if isinstance(obj, dict):
            records.append(obj)
    return records, end


class Checkpoint:
    """The checkpoint of one prediction file.

    Args:
        path: the checkpoint file (``<prediction>.ckpt``).
        content_hash: the hash the finished predictions will carry.
        fsync_interval_s: group-commit interval for power-loss safety (0: fsync every line).
    """

    def __init__(self, path: str, content_hash: str, fsync_interval_s: float = 1.0) -> None:
        self.path = path
        self.hash = content_hash
        self.fsync_interval_s = fsync_interval_s
        self.records: dict[int, dict[str, Any]] = {}
        self._fd: int | None = None
        self._lock_fd: int | None = None
        self._take_lock()  # before _load: it may truncate or delete the file
        self._load()

    def _take_lock(self) -> None:
        folder = os.path.dirname(os.path.abspath(self.path))
        os.makedirs(folder, exist_ok=True)
        lock_fd = os.open(self.path + ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
        # An earlier attempt may still be ending (a cluster job whose cancel raced its start, a
        # process still being killed): wait for it a while, then fail as before.
        deadline = time.monotonic() + LOCK_WAIT_S
        while True:
            try:
                fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError:
                if time.monotonic() < deadline:
                    time.sleep(0.2)
                    continue
                os.close(lock_fd)
                raise TaskFailedError(f"{self.path} is being written by another process (an earlier attempt "
                                      f"still running {LOCK_WAIT_S:g} s later?)") from None
        self._lock_fd = lock_fd

    def _load(self) -> None:
        if not os.path.exists(self.path):
            return
        lines, whole = _load_lines(self.path)
        meta = lines[0].get("_meta") if lines else None
        if not isinstance(meta, dict) or meta.get("hash") != self.hash:
            os.unlink(self.path)  # built for other settings: never mix it in
            return
        if whole != os.path.getsize(self.path):
            os.truncate(self.path, whole)  # drop a torn last line before appending after it
        for rec in lines[1:]:
            rid = rec.get("id")
            if isinstance(rid, float) and rid.is_integer():
                rid = int(rid)
            if isinstance(rid, int) and not isinstance(rid, bool):  # any other line: its sample runs again
                self.records[rid] = rec  # a later line for the same id wins

    def done_ids(self) -> set[int]:
        """Samples finished without error (failed ones are sent again)."""
        return {i for i, r in self.records.items() if r.get("error") is None}

    def errors(self) -> list[dict[str, Any]]:
        return [r for r in self.records.values() if r.get("error") is not None]

    def _open(self) -> int:
        if self._lock_fd is None:
            self._take_lock()  # reopened after close()
        new = not os.path.exists(self.path) or os.path.getsize(self.path) == 0
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o666)  # the umask decides
        if new:
            os.write(fd, (json.dumps({"_meta": {"hash": self.hash}}) + "\n").encode())
        self._fd = fd
        return fd

    def open(self) -> None:
        """Open the file for appending now (appending opens it on first use anyway)."""
        if self._fd is None:
            self._open()

    def append(self, record: dict[str, Any]) -> None:
        """Record one finished (or failed) sample; it is safe from a crash once this returns."""
        fd = self._fd if self._fd is not None else self._open()
        try:
            line = (json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate from a model or a row: U+FFFD, not a lost task
            record = encodable(record)
            line = (json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8")
        write_whole(fd, line, self.path)  # a torn line raises: the sample is not taken as recorded
        self.records[int(record["id"])] = record
        if self.fsync_interval_s <= 0:
            os.fdatasync(fd)
        else:
            _SYNCER.mark(fd, self.fsync_interval_s)

    def close(self) -> None:
        if self._fd is not None:
            _SYNCER.forget(self._fd)
            os.fsync(self._fd)
            os.close(self._fd)
            self._fd = None
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def finalize(self, output: str, meta: dict[str, Any]) -> None:
        """Write the complete prediction file atomically, then drop the checkpoint."""
        self.close()
        records = [self.records[i] for i in sorted(self.records)]
        write_sealed_jsonl(output, {**meta, "hash": self.hash}, records)
        for path in (self.path, self.path + ".lock"):
            with contextlib.suppress(FileNotFoundError):  # -r clears those of a sealed shard too
                os.unlink(path)
