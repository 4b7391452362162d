"""Sample-level checkpoints: an append-only JSON-lines file per prediction file.

The first line carries the content hash of the predictions being built; a checkpoint with
another hash is stale and is discarded.  Each finished sample is one appended line; a
sample counts as done only once its line is written.  A killed task therefore resumes
with every sample whose line made it to the file and re-sends only the rest.
"""

from __future__ import annotations

import json
import os
from typing import Any

from orchestra.fileio import atomic_write_jsonl, read_jsonl


class Checkpoint:
    """The checkpoint of one prediction file."""

    def __init__(self, path: str, content_hash: str, fsync_every: int = 64) -> None:
        self.path = path
        self.hash = content_hash
        self.fsync_every = fsync_every
        self.records: dict[int, dict[str, Any]] = {}
        self._fd: int | None = None
        self._unsynced = 0
        self._load()

    def _load(self) -> None:
        if not os.path.exists(self.path):
            return
        lines = read_jsonl(self.path)
        if not lines or lines[0].get("_meta", {}).get("hash") != self.hash:
            os.unlink(self.path)  # built for other settings: never mix it in
            return
        for rec in lines[1:]:
            self.records[int(rec["id"])] = rec

    def done_ids(self) -> set[int]:
        """Samples finished without error (failed ones are sent again)."""
        return {i for i, r in self.records.items() if r.get("error") is None}

    def append(self, record: dict[str, Any]) -> None:
        """Durably record one finished (or failed) sample."""
        if self._fd is None:
            os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
            new = not os.path.exists(self.path)
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            if new:
                os.write(self._fd, (json.dumps({"_meta": {"hash": self.hash}}) + "\n").encode())
        os.write(self._fd, (json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8"))
        self.records[int(record["id"])] = record
        self._unsynced += 1
        if self._unsynced >= self.fsync_every:
            os.fsync(self._fd)
            self._unsynced = 0

    def close(self) -> None:
        if self._fd is not None:
            os.fsync(self._fd)
            os.close(self._fd)
            self._fd = None

    def finalize(self, output: str, meta: dict[str, Any]) -> None:
        """Write the complete prediction file atomically, then drop the checkpoint."""
        self.close()
        records = [self.records[i] for i in sorted(self.records)]
        atomic_write_jsonl(output, [{"_meta": {**meta, "hash": self.hash}}, *records])
        if os.path.exists(self.path):
            os.unlink(self.path)
