"""Small file helpers: atomic writes, JSON lines, content hashes."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Callable, Iterable
from typing import Any


def atomic_write_text(path: str, text: str) -> None:
    """Write ``text`` to ``path`` so that readers see the old file or the whole new one."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix=os.path.basename(path))
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_write_json(path: str, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, ensure_ascii=False, default=str) + "\n")


def atomic_write_jsonl(path: str, records: Iterable[Any]) -> None:
    atomic_write_text(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))


def read_jsonl(path: str, on_damaged: Callable[[int, str], None] | None = None) -> list[Any]:
    """Read an append-only JSON-lines file, skipping what a crash may leave behind.

    A line cut short (a crash or a full disk mid-append) is skipped, wherever it is: a later
    append may have started right after the torn bytes.  ``on_damaged(lineno, text)`` is
    told about each skipped line.
    """
    out: list[Any] = []
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            line = raw.strip()
            if not line:
                continue
            try:
                out.append(json.loads(line))
            except ValueError:
                if on_damaged is not None:
                    on_damaged(lineno, raw[:120].decode("utf-8", "replace"))
    return out


def append_line(path: str, line: bytes) -> None:
    """Append one whole line with a single ``write`` (lines of several processes never mix).

    If the file does not end with a newline (an earlier append was torn), a newline goes
    first, so the torn bytes stay alone on their line instead of spoiling this one.
    """
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            line = b"\n" + line
        os.write(fd, line)
    finally:
        os.close(fd)


def write_sealed_jsonl(path: str, meta: dict[str, Any], records: Iterable[Any]) -> None:
    """Write records atomically after a ``{"_meta": ...}`` line that seals them: the meta
    holds the record count and the SHA-256 of the record lines, so a truncated or damaged
    file is recognised (:func:`read_sealed_jsonl`) instead of trusted."""
    body = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records).encode("utf-8")
    seal = {**meta, "count": body.count(b"\n"), "sha256": hashlib.sha256(body).hexdigest()}
    atomic_write_text(path, json.dumps({"_meta": seal}, ensure_ascii=False) + "\n" + body.decode("utf-8"))


def read_sealed_jsonl(path: str) -> tuple[dict[str, Any], list[Any]] | None:
    """``(meta, records)`` of a file written by :func:`write_sealed_jsonl`, or None if it is
    missing, unsealed, truncated or damaged (count or checksum do not match)."""
    try:
        with open(path, "rb") as f:
            first = f.readline()
            body = f.read()
        meta = json.loads(first).get("_meta")
        if not isinstance(meta, dict) or not first.endswith(b"\n"):
            return None
        if body.count(b"\n") != meta.get("count") or hashlib.sha256(body).hexdigest() != meta.get("sha256"):
            return None
        return meta, [json.loads(line) for line in body.splitlines()]
    except (OSError, ValueError, AttributeError):
        return None


def stable_hash(obj: Any, length: int = 16) -> str:
    """A hash of ``obj`` that is the same across processes and runs (JSON, sorted keys)."""
    blob = json.dumps(obj, sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:length]
