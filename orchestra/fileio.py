"""Small file helpers: atomic writes, JSON lines, content hashes, encodable text."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import re
import secrets
from collections.abc import Iterable, Iterator
from typing import Any

# A UTF-16 surrogate code point on its own: valid in JSON (``"\ud83d"``) and in a Python
# str, but not encodable as UTF-8.
_SURROGATE = re.compile("[\ud800-\udfff]")
# The JSON escape of one (a high or low surrogate), in the text of a JSON document.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


def encodable(value: Any) -> Any:
    """``value`` with every lone surrogate in its strings (dict keys too, lists and dicts
    walked) replaced by U+FFFD, so that it can be written as UTF-8.

    Text from outside (a model's answer, a data row) can hold one: JSON allows ``"\ud83d"``,
    and a server that cuts an emoji's surrogate pair at ``max_tokens`` sends exactly that.
    Text without one is returned as it is (the same object), so outputs stay byte-identical.
    """
    if isinstance(value, str):
        return _SURROGATE.sub("\ufffd", value) if _SURROGATE.search(value) else value
    if isinstance(value, list):
        return [encodable(v) for v in value]
    if isinstance(value, dict):
        return {encodable(k): encodable(v) for k, v in value.items()}
    return value


def may_hold_surrogates(json_text: str) -> bool:
    """Whether a JSON document's text escapes a surrogate (then :func:`encodable` its value)."""
    return "\\u" in json_text and _SURROGATE_ESCAPE.search(json_text) is not None


def utf8(text: str) -> bytes:
    """``text`` as UTF-8, a lone surrogate written as U+FFFD instead of raising."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return str(encodable(text)).encode("utf-8")


def _create_temp(folder: str, name: str) -> tuple[int, str]:
    """A new file next to the target, mode 0666 less the umask (as ``open`` would make it;
    ``mkstemp`` would make every output 0600 whatever the umask)."""
    for _ in range(100):
        tmp = os.path.join(folder, f".tmp-{secrets.token_hex(4)}{name}")
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666), tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name for {name} in {folder}")


#: the name of an atomic write's temporary file: ``.tmp-`` eight hex digits, the target's name
_TEMP_NAME = re.compile(r"\.tmp-[0-9a-f]{8}(.+)")


def temp_target(path: str) -> str | None:
    """The file that ``path``, an atomic write's temporary file, was to become (None: not one)."""
    found = _TEMP_NAME.fullmatch(os.path.basename(path))
    return os.path.join(os.path.dirname(path), found.group(1)) if found else None


def remove_stale_temps(targets: Iterable[str]) -> list[str]:
    """Remove the temporary files that atomic writes of ``targets`` left behind (a writer killed
    between its write and its rename); one listing per folder.  Only for targets that nobody
    else writes now: the caller holds their writer's lock, or they are finished.  Returns the
    removed paths."""
    by_folder: dict[str, set[str]] = {}
    for target in targets:
        by_folder.setdefault(os.path.dirname(os.path.abspath(target)), set()).add(os.path.basename(target))
    removed = []
    for folder, names in by_folder.items():
        try:
            entries = os.listdir(folder)
        except FileNotFoundError:
            continue
        for entry in entries:
            found = _TEMP_NAME.fullmatch(entry)
            if found and found.group(1) in names:
                path = os.path.join(folder, entry)
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    continue
                removed.append(path)
    return removed


@contextlib.contextmanager
def writers_lock(path: str, exclusive: bool = False) -> Iterator[bool]:
    """Hold the lock file ``path`` (made if missing, 0600): shared, by each process that writes
    files in its folder (waits only while one holds it exclusively, for an instant); or
    ``exclusive``, never waiting, by who clears the temporary files of killed writers there:
    True when taken, False while a writer is at work (its temporary files are not stale).  Where
    the lock cannot be had at all (a file system without locks), True: as if nobody held it."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError:
        yield True  # the writes themselves will say what is wrong with the folder
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB if exclusive else fcntl.LOCK_SH)
        except BlockingIOError:
            yield False
            return
        except OSError:  # ENOLCK, EOPNOTSUPP: no locks here
            pass
        yield True
    finally:
        os.close(fd)


def atomic_write_bytes(path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers see the old file or the whole new one.

    The new file gets the mode a plain ``open`` would give it (0666 less the process umask):
    under ``umask 002`` a group shares the outputs, under ``umask 077`` they are private.
    """
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = _create_temp(folder, os.path.basename(path))
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        if os.path.exists(tmp):
            os.unlink(tmp)
        if isinstance(exc, OSError) and exc.filename is None and exc.errno is not None:
            raise OSError(exc.errno, exc.strerror, path) from exc  # a full disk: say which file
        raise


def atomic_write_text(path: str, text: str) -> None:
    """:func:`atomic_write_bytes` of ``text`` as UTF-8 (see :func:`utf8`)."""
    atomic_write_bytes(path, utf8(text))


def atomic_write_json(path: str, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, ensure_ascii=False, default=str) + "\n")


def atomic_write_jsonl(path: str, records: Iterable[Any]) -> None:
    atomic_write_text(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))


def read_jsonl(path: str) -> list[Any]:
    """Read an append-only JSON-lines file, skipping what a crash may leave behind.

    A line cut short (a crash or a full disk mid-append) is skipped, wherever it is: a later
    append may have started right after the torn bytes.
    """
    out: list[Any] = []
    with open(path, "rb") as f:
        for raw in f:
            line = raw.strip()
            if not line:
                continue
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
    return out


def append_line(path: str, line: bytes, *, sync: bool = False, mode: int = 0o666) -> None:
    """Append one whole line with a single ``write`` (lines of several processes never mix);
    ``sync``: fsync it before returning.  ``mode``: of a new file, before the umask.

    If the file does not end with a newline (an earlier append was torn), a newline goes
    first, so the torn bytes stay alone on their line instead of spoiling this one.  A write
    the disk cuts short raises ``OSError`` naming the file (see :func:`write_whole`).
    """
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, mode)
    try:
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            line = b"\n" + line
        write_whole(fd, line, path)
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)


def write_whole(fd: int, data: bytes, path: str) -> None:
    """One ``write`` of ``data``; a short one (a full disk, a file size limit: the error itself
    comes only with the next write) raises ``OSError`` naming ``path``, so that a caller never
    takes a torn line for a recorded one.  The rest is not written after it: another process's
    line may already follow."""
    written = os.write(fd, data)
    if written != len(data):
        raise OSError(errno.ENOSPC, f"only {written} of {len(data)} bytes written (disk full or file size "
                      "limit reached)", path)


def write_sealed_jsonl(path: str, meta: dict[str, Any], records: Iterable[Any]) -> None:
    """Write records atomically after a ``{"_meta": ...}`` line that seals them: the meta
    holds the record count and the SHA-256 of the record lines, so a truncated or damaged
    file is recognised (:func:`read_sealed_jsonl`) instead of trusted."""
    body = utf8("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
    seal = {**meta, "count": body.count(b"\n"), "sha256": hashlib.sha256(body).hexdigest()}
    atomic_write_bytes(path, utf8(json.dumps({"_meta": seal}, ensure_ascii=False) + "\n") + body)


def read_sealed_jsonl(path: str) -> tuple[dict[str, Any], list[Any]] | None:
    """``(meta, records)`` of a file written by :func:`write_sealed_jsonl`, or None if it is
    missing, unsealed, truncated or damaged (count or checksum do not match)."""
    sealed = _read_sealed(path)
    if sealed is None:
        return None
    try:
        return sealed[0], [json.loads(line) for line in sealed[1].splitlines()]
    except ValueError:
        return None


def read_sealed_slice(path: str, start: int, end: int) -> tuple[dict[str, Any], list[Any]] | None:
    """``(meta, records[start:end])`` of a file written by :func:`write_sealed_jsonl` (the whole
    file checked as :func:`read_sealed_jsonl` checks it, only the slice parsed), or None."""
    sealed = _read_sealed(path)
    if sealed is None:
        return None
    try:
        return sealed[0], [json.loads(line) for line in sealed[1].splitlines()[start:end]]
    except ValueError:
        return None


def sealed_meta(path: str) -> dict[str, Any] | None:
    """The meta of a whole sealed file (:func:`read_sealed_jsonl`'s checks), its records left
    unparsed: what deciding that 10,000 outputs are done needs."""
    sealed = _read_sealed(path)
    return sealed[0] if sealed is not None else None


def _read_sealed(path: str) -> tuple[dict[str, Any], bytes] | None:
    """The meta and the record bytes of a sealed file whose count and checksum match, or None."""
    try:
        with open(path, "rb") as f:
            blob = f.read()
    except (OSError, ValueError):
        return None
    return parse_sealed(blob)


def parse_sealed(blob: bytes) -> tuple[dict[str, Any], bytes] | None:
    """The meta and the record bytes of ``blob``, a sealed file's content (read by a caller that
    chose how to open it), if its count and checksum match; else None."""
    first, newline, body = blob.partition(b"\n")
    try:
        meta = json.loads(first).get("_meta")
    except (ValueError, AttributeError, RecursionError):
        return None
    if not newline or not isinstance(meta, dict):
        return None
    if body.count(b"\n") != meta.get("count") or hashlib.sha256(body).hexdigest() != meta.get("sha256"):
        return None
    return meta, body


def stable_hash(obj: Any, length: int = 16) -> str:
    """A hash of ``obj`` that is the same across processes and runs (JSON, sorted keys)."""
    blob = json.dumps(obj, sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:length]


def json_lines(blob: bytes) -> list[Any]:
    """The lines of a JSON-lines file's content that parse: a torn, damaged or too deeply nested
    line is skipped (the callers treat a missing line as a row still to do, or not there)."""
    out = []
    for line in blob.splitlines():
        if line.strip():
            try:
                out.append(json.loads(line))
            except (ValueError, RecursionError):
                continue
    return out
