"""Content digests of data files, and the one copy of each file's rows in a process.

A dataset's content key (which the planner puts into prediction hashes and the size cache)
is made from the SHA-256 of its files, not their path or mtime: a file restored or copied
with new timestamps is not redone, an edit that keeps the size is.  Hashing is cached by
(path, size, mtime, inode) in this process and in ``<cache>/file_digests.json``, so an
unchanged file is read once per machine.  Rows read from a file are kept per process, so
2,000 datasets slicing one file read it once.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import threading
from collections.abc import Callable, Iterator
from typing import Any

from orchestra.privdir import cache_folder, private_cache_dir

_LOCK = threading.Lock()
_DIGESTS: dict[str, str] = {}
_ROWS: dict[tuple[str, str], Any] = {}
_PERSIST = [True]


def persist_digests(enabled: bool) -> None:
    """Whether new digests go to the on-disk cache (not when a report is rebuilt with ``--mode viz``)."""
    _PERSIST[0] = enabled


def persisting() -> bool:
    """Whether this process writes its caches (False under ``--dry-run``)."""
    return _PERSIST[0]


def cache_dir() -> str:
    """The per-user cache folder (``ORCHESTRA_CACHE_DIR`` or ``~/.cache/orchestra``), refused
    when another user could write it (:func:`orchestra.privdir.cache_folder`)."""
    return cache_folder()


def _stamp(path: str) -> str | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return f"{os.path.abspath(path)}|{st.st_size}|{st.st_mtime_ns}|{st.st_ino}"


_ON_DISK: list[Any] = [None, {}]  # (stamp of file_digests.json, its entries) last read
_PENDING: dict[str, str] = {}  # digests to write when the batch open in this process ends
_BATCHES = [0]


def _stored() -> dict[str, str]:
    """The digests of ``<cache>/file_digests.json`` (not to be changed: it is the copy kept for
    the next call): read again only when the file changed (316 datasets planned read it once)."""
    path = os.path.join(cache_dir(), "file_digests.json")
    stamp = _stamp(path)
    with _LOCK:
        if stamp is not None and stamp == _ON_DISK[0]:
            return _ON_DISK[1]
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return {}
    data = data if isinstance(data, dict) else {}
    with _LOCK:
        _ON_DISK[:] = [stamp, data]
    return data


@contextlib.contextmanager
def batched_stores() -> Iterator[None]:
    """Within the block, new digests are written to the on-disk cache once, when it ends (one
    read, one write and one fsync for a plan of 316 files, not one each)."""
    with _LOCK:
        _BATCHES[0] += 1
    try:
        yield
    finally:
        with _LOCK:
            _BATCHES[0] -= 1
            flush = dict(_PENDING) if _BATCHES[0] == 0 else {}
            if flush:
                _PENDING.clear()
        if flush:
            _store(flush)


def _store(new: dict[str, str]) -> None:
    """Remember digests on disk; a cache that cannot be written is only slower, not wrong."""
    from filelock import FileLock

    from orchestra.fileio import atomic_write_json

    path = os.path.join(cache_dir(), "file_digests.json")
    try:
        private_cache_dir()
        with FileLock(path + ".lock", timeout=30):
            data = {**_stored(), **new}
            if len(data) > 20000:  # keep the file small: drop the oldest entries
                data = dict(list(data.items())[-10000:])
            atomic_write_json(path, data)
    except OSError:
        pass


def file_digest(path: str) -> str | None:
    """SHA-256 of a file's bytes (None if it cannot be read)."""
    stamp = _stamp(path)
    if stamp is None:
        return None
    with _LOCK:
        if stamp in _DIGESTS:
            return _DIGESTS[stamp]
    digest = _stored().get(stamp)
    if not isinstance(digest, str):  # unknown (or not a digest: a hand-edited cache)
        h = hashlib.sha256()
        try:
            with open(path, "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    h.update(block)
        except OSError:
            return None
        digest = h.hexdigest()
        if _PERSIST[0]:
            with _LOCK:
                later = _BATCHES[0] > 0
                if later:
                    _PENDING[stamp] = digest
            if not later:
                _store({stamp: digest})
    with _LOCK:
        _DIGESTS[stamp] = digest
    return digest


def files_stamp(files: list[str]) -> list[Any]:
    """The content digest of each file (its path where it cannot be read): what a content key
    is made of."""
    return [file_digest(f) or f"unreadable:{f}" for f in files]


def stamped_key(kind: str, stamp: Any, reader_cfg: dict[str, Any]) -> str:
    """A dataset's content key from its kind, its files' stamp and its reader settings."""
    blob = json.dumps([kind, stamp, reader_cfg], sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def shared_rows(path: str, options: Any, read: Callable[[], Any]) -> Any:
    """``read()``'s rows of ``path``, read once per process for each file version and reader
    ``options``; callers must not change the rows they get."""
    stamp = _stamp(path)
    if stamp is None:
        return read()
    key = (stamp, json.dumps(options, sort_keys=True, default=str))
    with _LOCK:
        if key in _ROWS:
            return _ROWS[key]
    rows = read()
    with _LOCK:
        _ROWS[key] = rows
    return rows


def _short_sha(blob: str) -> str:
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:16]


def row_keys(rows: list[Any]) -> list[str]:
    """Each row's sample key: what aligns one sample across runs (``orchestra compare``).

    A key is the SHA-256 of the row's content (its JSON, keys sorted), so it holds wherever the
    row moves in the file and whatever else the file gains or loses; the k-th repeat of an
    identical row gets ``~k`` appended (k >= 2), so repeats stay distinct.
    """
    seen: dict[str, int] = {}
    keys = []
    for row in rows:
        base = _short_sha(json.dumps(row, sort_keys=True, ensure_ascii=False, default=str))
        seen[base] = seen.get(base, 0) + 1
        keys.append(base if seen[base] == 1 else f"{base}~{seen[base]}")
    return keys


def prompt_digest(prompt: Any) -> str:
    """A digest of what a model was sent for one sample (a text, chat messages, user turns):
    two runs sent the same prompt exactly when the digests are equal."""
    return _short_sha(prompt if isinstance(prompt, str) else json.dumps(prompt, sort_keys=True, ensure_ascii=False,
                                                                          default=str))
