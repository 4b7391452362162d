"""A chatty replica's log is capped through ``run.py``: it keeps its first and its last part.

Before, a ``command`` replica's log grew as long as the server talked (40 MB in 20 s from a real
one).  Here a real ``command`` replica (:mod:`tests.serving.keyed_stub`) prints 24 MiB of numbered
lines and then its last words, and either exits (the run fails, and its one line names the log and
quotes the last words) or serves the run; either way the log is under ``LOG_MAX_BYTES`` and holds
its head (orchestra's header, the command, the server's first lines), one line saying how much was
cut, and an unbroken tail ending with the last words and the watchdog's lines.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from tests.helpers import events, run_cli, run_dirs
from tests.serving.keyed_stub import CHATTER_LINE
from tests.serving.test_managed_runs import config
from tests.serving.test_serving_hardening import stub

pytestmark = pytest.mark.slow

CHATTER_MB = 24
#: the cap docs/serving.md states (a replica's log keeps its first 1 MiB and its last 4 MiB, 8 MiB at most)
LOG_HEAD_BYTES, LOG_TAIL_BYTES, LOG_MAX_BYTES = 1 << 20, 4 << 20, 8 << 20


@pytest.mark.parametrize("exits", [True, False], ids=["crashes", "serves"])
def test_a_chatty_replicas_log_keeps_its_head_and_its_tail_under_the_cap(tmp_path: Path, exits: bool) -> None:
    told = tmp_path / "told.key"
    flags = ("--tell", str(told), "--chatter", str(CHATTER_MB), *(("--exit-after-print",) if exits else ()))
    res = run_cli(config(tmp_path, stub(*flags, max_restarts=0), rows=2), timeout=300)
    assert res.returncode == (1 if exits else 0), res.stderr[-3000:]
    (run,) = run_dirs(tmp_path / "out")
    log = run / "servers/smol/replica-0.log"
    data = log.read_bytes()
    written = CHATTER_MB << 20
    assert len(data) <= LOG_MAX_BYTES < written, len(data)
    text = data.decode()
    key = told.read_text()
    assert key not in text and "api_key=***" in text  # the key is scrubbed as before

    # the head: orchestra's header and the command, then the server's first words, in order
    head = text[:LOG_HEAD_BYTES]
    assert head.startswith("===== orchestra: replica 0 of "), head[:200]
    order = [head.index(s) for s in ("===== command: ", "watchdog: server pid ", "server_args: port=",
                                     "chatter 000000 ")]
    assert order == sorted(order), order
    # one line says what was cut, right after the head
    (cut_line,) = [ln for ln in text.splitlines() if "bytes of this log were cut out here" in ln]
    cut = int(re.match(r"===== orchestra: (\d+) bytes", cut_line).group(1))  # type: ignore[union-attr]
    assert cut >= written - LOG_MAX_BYTES
    before, after = text.split(cut_line + "\n")
    assert len(before) <= LOG_HEAD_BYTES and before.endswith("\n")
    assert LOG_TAIL_BYTES <= len(after.encode()) <= LOG_MAX_BYTES - LOG_HEAD_BYTES
    # the tail: whole chatter lines, numbered without a gap, up to the last one and the last words
    lines = after.splitlines()
    numbers = [int(ln.split()[1]) for ln in lines if ln.startswith("chatter ")]
    assert all(len(ln) + 1 == len(CHATTER_LINE) for ln in lines if ln.startswith("chatter "))
    assert numbers == list(range(numbers[0], written // len(CHATTER_LINE)))
    last = lines.index("last words: the weights did not fit (key ***)")
    assert lines[last - 1].startswith(f"chatter {numbers[-1]:06d} ")
    assert lines[-1].startswith("watchdog: server exited with code")
    from orchestra.serving import watchdog  # the numbers tested are the code's

    assert (watchdog.LOG_HEAD_BYTES, watchdog.LOG_TAIL_BYTES, watchdog.LOG_MAX_BYTES) == (
        LOG_HEAD_BYTES, LOG_TAIL_BYTES, LOG_MAX_BYTES)
    # what the run says still points at the log
    (started,) = [e for e in events(run) if e["event"] == "server_started"]
    assert started["log"] == str(log)
    if exits:
        (line,) = [ln for ln in res.stderr.splitlines() if ln.startswith("FAILED: infer task")]
        assert "exited with code 3 before it was ready" in line and "last words: the weights did not fit" in line
        assert f"(log: {log})" in line, line[-300:]
        (ev,) = [e for e in events(run) if e["event"] == "server_exited"]
        assert f"(log: {log})" in ev["reason"]


@pytest.mark.parametrize("flags", [os.O_APPEND, 0], ids=["appending", "not-appending"])
def test_a_log_is_cut_at_line_starts_with_no_hole_however_it_was_opened(tmp_path: Path, flags: int) -> None:
    """The watchdog's log as a file opened for appending (``>>``, the orchestrator's) or not:
    after a cut the next line goes to the new end, never past it (a hole of NUL bytes)."""
    from orchestra.serving.watchdog import CappedLog

    path = tmp_path / "replica-0.log"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | flags, 0o600)
    try:
        log = CappedLog(fd)
        lines = 3 * LOG_MAX_BYTES // len(CHATTER_LINE)
        for i in range(lines):
            log.write(CHATTER_LINE.format(i).encode())
    finally:
        os.close(fd)
    data = path.read_bytes()
    assert len(data) <= LOG_MAX_BYTES and b"\0" not in data
    kept = data.decode().splitlines()
    assert sum("bytes of this log were cut out here" in ln for ln in kept) == 1
    assert kept[0].startswith("chatter 000000 ") and kept[-1].startswith(f"chatter {lines - 1:06d} ")
