"""A per-machine cache of GGUF checkpoints converted to ordinary Hugging Face folders.

transformers dequantises a GGUF file on every load (~15 s for a 135M model on two cores).
The converted model and its tokenizer are saved once with ``save_pretrained`` in a folder
keyed by the GGUF's path, size and modification time; later loads read that folder (~0.2 s).
Several workers that start at once convert only once: the conversion is guarded by a
``filelock.FileLock`` and written to a temporary folder that is renamed into place, so a
folder that exists is always complete.

The cache lives in ``$ORCHESTRA_CACHE_DIR/weights`` (default ``~/.cache/orchestra/weights``)
unless a model passes its own ``cache_dir``; if that cannot be written, in the private temporary
folder of :func:`fallback_dir`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from filelock import FileLock, Timeout

from orchestra.errors import ModelError
from orchestra.privdir import cache_folder, private_dir, temp_folder

log = logging.getLogger(__name__)

#: Bump when the layout of a cached folder changes; old entries are then ignored.
CACHE_FORMAT = 1
#: Files every complete entry holds (written last, so its presence means "finished").
MANIFEST = "orchestra_source.json"


def default_cache_dir() -> str:
    """``$ORCHESTRA_CACHE_DIR/weights``, or ``~/.cache/orchestra/weights``
    (:func:`orchestra.privdir.cache_folder`)."""
    return os.path.join(cache_folder(), "weights")  # refused if another user could write the cache


def fallback_dir() -> str:
    """``<tmp>/orchestra-weights-<uid>``, where converted weights go when the cache cannot be
    written: created 0700, or refused (:class:`~orchestra.privdir.UnsafeFolderError`) if it is
    not a private folder of this user, so weights another user planted are never loaded."""
    return private_dir(temp_folder("weights"))


def gguf_content_key(gguf_path: str, extra: str = "") -> str:
    """A key that changes when the file (its real path, size or mtime) or ``extra`` changes."""
    real = os.path.realpath(gguf_path)
    st = os.stat(real)
    blob = json.dumps([CACHE_FORMAT, real, st.st_size, st.st_mtime_ns, extra])
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


@dataclass(frozen=True)
class CacheEntry:
    """Where the converted copy of one GGUF file lives (or will live)."""

    root: str
    name: str

    @property
    def path(self) -> str:
        return os.path.join(self.root, self.name)

    @property
    def lock_path(self) -> str:
        return os.path.join(self.root, f".{self.name}.lock")

    def is_complete(self) -> bool:
        return os.path.isfile(os.path.join(self.path, MANIFEST))


def entry_for(gguf_path: str, cache_dir: str | None = None, extra: str = "") -> CacheEntry:
    """The cache entry of ``gguf_path``: ``<cache_dir>/<file stem>-<content key>``."""
    root = os.path.abspath(os.path.expanduser(cache_dir or default_cache_dir()))
    stem = os.path.splitext(os.path.basename(gguf_path))[0]
    return CacheEntry(root=root, name=f"{stem}-{gguf_content_key(gguf_path, extra)}")


def get_or_convert(
    entry: CacheEntry,
    convert: Callable[[str], Any],
    source: dict[str, Any],
    lock_timeout_s: float = 1800.0,
) -> tuple[str, Any]:
    """Return ``(folder, converted)`` for ``entry``, converting at most once per machine.

    ``convert(tmp_folder)`` must write a loadable model folder into ``tmp_folder`` and may
    return the objects it built (so the caller that converted need not reload them); it is
    called only when no complete entry exists, under the entry's file lock.  ``converted``
    is ``None`` when the folder already existed.
    """
    # Only a private folder of ours is trusted: converted weights another user could plant
    # would be loaded as the model (created 0700 when missing; else UnsafeFolderError).
    private_dir(entry.root, env="ORCHESTRA_CACHE_DIR")
    if entry.is_complete():
        return entry.path, None
    lock = FileLock(entry.lock_path, timeout=lock_timeout_s)
    try:
        with lock:
            if entry.is_complete():  # another worker finished while we waited
                return entry.path, None
            tmp = tempfile.mkdtemp(prefix=f".{entry.name}.tmp-", dir=entry.root)
            try:
                started = time.monotonic()
                converted = convert(tmp)
                manifest = {**source, "format": CACHE_FORMAT, "convert_s": round(time.monotonic() - started, 2)}
                with open(os.path.join(tmp, MANIFEST), "w") as fh:
                    json.dump(manifest, fh, indent=1)
                    fh.flush()
                    os.fsync(fh.fileno())
                if os.path.exists(entry.path):  # an incomplete leftover of a killed writer
                    shutil.rmtree(entry.path, ignore_errors=True)
                os.replace(tmp, entry.path)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
    except Timeout:
        raise ModelError(
            f"waited {lock_timeout_s:.0f} s for another process converting {source.get('gguf')} "
            f"(lock {entry.lock_path}); remove the lock file if no such process is alive"
        ) from None
    log.info("cached converted weights in %s", entry.path)
    return entry.path, converted
