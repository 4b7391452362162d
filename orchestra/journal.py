"""The one ledger primitive: an append-only JSON-lines file that records a thing *before* anything
relies on it, so that a later orchestrator on the same run folder (``-r``, even after a SIGKILL)
knows what an earlier one started and may have left.

Three ledgers stand on it, each in its own file and with its own words, kept for the run folders
that earlier versions wrote; every word belongs to one :data:`PHASES` of a thing's life:

    phase      runners (<backend>/jobs.jsonl)        batch (batches/<model>.jsonl)        serving (servers/ledger.jsonl)
    intent     submitting                            submitting                           submitting (a cluster job)
    started    submitted, adopted                    created                              started
    stop_sent  stop_sent, stop_acknowledged,         cancel_sent, cancel_unconfirmed      (none)
               stop_unconfirmed
    ended      stopped, ended                        cancelled, ended                     stopped, reaped
    failed     submit_failed, submit_unknown         not_created                          submit_failed

``intent`` is written before the call that starts the thing (its id is not known yet: a later
orchestrator looks for it by name), ``started`` once its id is known and before the id is used,
``stop_sent`` before a stop goes out (and when one went out but the thing was not seen over),
``ended`` once it is known to be over, ``failed`` when it never started.  A thing whose latest
phase is ``intent``, ``started`` or ``stop_sent`` may still be alive.

What the primitive does, in one place: :meth:`Journal.append` writes one whole line with a
single ``write`` on an ``O_APPEND`` descriptor and fsyncs it before returning
(:func:`orchestra.fileio.append_line`); a word outside the journal's vocabulary is refused.
:meth:`Journal.fold` folds the lines into the latest state of each key; :meth:`Journal.tail`
reads the whole lines appended since an offset.  Reading skips a line that is not JSON (one torn
by a crash or a full disk, wherever it is: a later append starts on a line of its own).
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Literal

from orchestra.fileio import append_line

#: the phases of a recorded thing's life, in order (see the module's table)
Phase = Literal["intent", "started", "stop_sent", "ended", "failed"]
PHASES: tuple[Phase, ...] = ("intent", "started", "stop_sent", "ended", "failed")


def words_in(states: Mapping[str, Phase], *phases: Phase) -> frozenset[str]:
    """The words of a vocabulary that stand for one of ``phases``."""
    return frozenset(word for word, phase in states.items() if phase in phases)


class Journal:
    """One append-only ledger file whose lines are ``{ts, state, <key field>: key, ...}`` (thread-safe).

    Args:
        path: the file (its folder is made).
        key: the field naming what a line is about (``name``, ``key``).
        states: the journal's words and the phase each stands for; :meth:`append` refuses others.
        mode: of a new file, before the umask.
    """

    def __init__(self, path: str, key: str, states: Mapping[str, Phase], mode: int = 0o666) -> None:
        unknown = sorted(set(states.values()) - set(PHASES))
        if unknown:
            raise ValueError(f"journal {path}: unknown phase(s) {unknown}; valid: {', '.join(PHASES)}")
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        self.path, self.key, self.states, self.mode = path, key, dict(states), mode
        self._lock = threading.Lock()

    def append(self, state: str, key: str, /, **fields: Any) -> None:
        """Append ``{ts, state, <key field>: key, **fields}``; durable (fsynced) when this returns.
        A write the disk cuts short raises ``OSError`` naming the file, and never spoils the next line."""
        if state not in self.states:
            raise ValueError(f"journal {self.path}: unknown state {state!r}; valid: {', '.join(self.states)}")
        line = json.dumps({"ts": round(time.time(), 3), "state": state, self.key: key, **fields},
                          ensure_ascii=False, default=str) + "\n"
        with self._lock:
            append_line(self.path, line.encode("utf-8"), sync=True, mode=self.mode)

    def entries(self) -> Iterator[tuple[int, Any]]:
        """``(line number, value)`` of every line that is JSON (from 1; a torn line is skipped)."""
        try:
            f = open(self.path, "rb")
        except FileNotFoundError:
            return
        with f:
            for n, raw in enumerate(f, 1):
                if not raw.strip():
                    continue
                try:
                    yield n, json.loads(raw)
                except (ValueError, RecursionError):
                    continue  # torn by a crash or a full disk (see fileio.append_line)

    def fold(self, check: Callable[[int, Any], None] | None = None) -> dict[str, dict[str, Any]]:
        """The latest of each key, every line folded in order: a line's ``state`` and ``ts``
        replace the earlier ones, and each other field does unless it is ``""`` or None (a later
        line need not repeat what an earlier one said).  A line that is not an object, or whose key
        field is not a string, is skipped; ``check(line number, value)`` sees every line first and
        may raise instead (a ledger that must not guess)."""
        out: dict[str, dict[str, Any]] = {}
        for n, value in self.entries():
            if check is not None:
                check(n, value)
            if not isinstance(value, dict) or not isinstance(value.get(self.key), str):
                continue
            latest = out.setdefault(value[self.key], {})
            latest.update({k: v for k, v in value.items() if k in ("state", "ts") or v not in ("", None)})
        return out

    def tail(self, offset: int) -> tuple[list[dict[str, Any]], int]:
        """The lines (objects with the key field) appended since byte ``offset``, another process's
        too, and the offset after them; a line still being written is left for the next call."""
        try:
            with open(self.path, "rb") as f:
                f.seek(offset)
                blob = f.read()
        except FileNotFoundError:
            return [], offset
        end = blob.rfind(b"\n") + 1
        out: list[dict[str, Any]] = []
        for raw in blob[:end].splitlines():
            try:
                line = json.loads(raw)
            except (ValueError, RecursionError):
                continue  # a torn line
            if isinstance(line, dict) and self.key in line:
                out.append(line)
        return out, offset + end
