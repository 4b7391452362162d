"""The converted-weights cache (orchestra/models/weights_cache.py) around its lock: a converter
that holds the lock too long (another process, alive) ends the wait with one line naming the lock
file, and a folder a killed writer left without its manifest is replaced, not trusted."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestra.errors import ModelError
from orchestra.models import weights_cache

_HOLD = """
import sys, time
from filelock import FileLock
with FileLock(sys.argv[1]):
    print("held", flush=True)
    time.sleep(30)
"""


def test_a_lock_held_past_the_timeout_is_one_line_naming_the_lock(tmp_path: Path) -> None:
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF" + b"\0" * 8)
    entry = weights_cache.entry_for(str(gguf), str(tmp_path / "cache"))
    os.makedirs(entry.root)
    holder = subprocess.Popen([sys.executable, "-c", _HOLD, entry.lock_path], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        began = time.monotonic()
        with pytest.raises(ModelError) as err:
            weights_cache.get_or_convert(entry, lambda out: None, {"gguf": str(gguf)}, lock_timeout_s=0.5)
        assert time.monotonic() - began < 5
    finally:
        holder.kill()
        holder.wait(10)
    text = str(err.value)
    assert entry.lock_path in text and "remove the lock file if no such process is alive" in text and "\n" not in text
    assert not os.path.exists(entry.path)


def test_a_folder_without_its_manifest_is_converted_again(tmp_path: Path) -> None:
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF" + b"\0" * 8)
    entry = weights_cache.entry_for(str(gguf), str(tmp_path / "cache"))
    os.makedirs(entry.path)
    Path(entry.path, "config.json").write_text("half written")  # a killed writer's leftover

    def convert(out: str) -> str:
        Path(out, "config.json").write_text("{}")
        return "fresh"

    folder, converted = weights_cache.get_or_convert(entry, convert, {"gguf": str(gguf)})
    assert folder == entry.path and converted == "fresh" and entry.is_complete()
    assert Path(folder, "config.json").read_text() == "{}"
    again, converted = weights_cache.get_or_convert(entry, convert, {"gguf": str(gguf)})
    assert again == folder and converted is None
