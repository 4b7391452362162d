"""The converted-weights cache (orchestra/models/weights_cache.py) around its lock: a converter
that holds the lock too long (another process, alive) ends the wait with one line naming the lock
file, and a folder a killed writer left without its manifest is replaced, not trusted."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestra.errors import ModelError
from orchestra.models import weights_cache
from tests.helpers import wait_for

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


# Two real interpreters racing on one empty cache: each converts through get_or_convert, whose
# conversion writes a file, says so on stdout, then waits for a go-ahead file before finishing
# (so the race and a kill mid-conversion happen at a point the test chooses, not by timing).
_RACE = """
import os, sys, time
from pathlib import Path
from orchestra.models import weights_cache
gguf, cache, go = sys.argv[1:4]
entry = weights_cache.entry_for(gguf, cache)

def convert(out):
    Path(out, "weights.bin").write_bytes(str(os.getpid()).encode())
    print("converting", out, flush=True)
    while not os.path.exists(go):
        time.sleep(0.02)
    return os.getpid()

folder, converted = weights_cache.get_or_convert(entry, convert, {"gguf": gguf}, lock_timeout_s=60)
print("done", folder, Path(folder, "weights.bin").read_text(), converted is not None, flush=True)
"""


def _racer(gguf: Path, cache: Path, go: Path) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", _RACE, str(gguf), str(cache), str(go)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_two_processes_racing_convert_once_and_load_the_same_folder(tmp_path: Path) -> None:
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF" + b"\0" * 8)
    cache, go = tmp_path / "cache", tmp_path / "go"
    racers = [_racer(gguf, cache, go) for _ in range(2)]
    try:
        # one of them holds the lock and is half-way through its conversion (its temporary folder)
        wait_for(lambda: cache.is_dir() and any(".tmp-" in p.name for p in cache.iterdir()), 60, "a conversion")
        go.touch()
        lines = [p.communicate(timeout=60)[0] for p in racers]
    finally:
        for p in racers:
            p.kill()
    assert sum("converting" in text for text in lines) == 1, lines  # one conversion
    done = [next(ln for ln in text.splitlines() if ln.startswith("done")).split() for text in lines]
    assert done[0][1:3] == done[1][1:3], done  # the same folder, the same converted bytes
    assert sorted(d[3] for d in done) == ["False", "True"]  # one converted, the other loaded its result


def test_a_converter_killed_mid_write_leaves_nothing_that_counts_as_done(tmp_path: Path) -> None:
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF" + b"\0" * 8)
    cache, go = tmp_path / "cache", tmp_path / "go"
    victim = _racer(gguf, cache, go)
    try:
        assert victim.stdout is not None and victim.stdout.readline().startswith("converting")
        victim.send_signal(signal.SIGKILL)
        victim.wait(30)
    finally:
        victim.kill()
    entry = weights_cache.entry_for(str(gguf), str(cache))
    assert not entry.is_complete() and not os.path.exists(entry.path)
    go.touch()
    after = _racer(gguf, cache, go)
    out, err = after.communicate(timeout=60)
    assert after.returncode == 0, err
    assert "converting" in out and entry.is_complete()  # converted again, not trusted half-written
    assert Path(entry.path, "weights.bin").read_text() == str(after.pid)
