"""Read task logs: each attempt's section, its tail, and the line that explains a failure.

A task's log holds every attempt, appended; the scheduling loop starts each one with a
``===== orchestra: attempt N of ...`` header.  A failed task's reason is then more than
``exit code 1``: the exception line (``RuntimeError: ...``) or the task's own ``FAILED:``
message, found from the end of its attempt's section.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

#: how much of a log is read from its end (older attempts of a huge log are then not shown)
MAX_READ_BYTES = 1 << 20
_HEADER = re.compile(r"^===== orchestra: attempt (\d+) of ", re.MULTILINE)
_SLURM = re.compile(r"^===== slurm: job (\S+) on (\S+?), CUDA_VISIBLE_DEVICES=(.*?), started", re.MULTILINE)
# ``RuntimeError: msg``, ``ValueError``, ``torch.cuda.OutOfMemoryError: ...``, ``KeyboardInterrupt``
_EXCEPTION = re.compile(r"^(?:[A-Za-z_][\w]*\.)*[A-Za-z_]\w*(?:Error|Exception|Exit|Interrupt|Fault)\b(?::.*)?$")
_TASK_FAILED = re.compile(r"\] FAILED: (.+)$")
_NOISE = ("===== ", "Traceback (most recent call last)", "  File ", "During handling", "The above exception")


@dataclass
class AttemptLog:
    """One attempt's part of a task log."""

    attempt: int
    text: str
    slurm: dict[str, str] = field(default_factory=dict)  # job id, node, GPUs, when Slurm wrote its header

    def tail(self, lines: int = 12, width: int = 240) -> str:
        """The last ``lines`` lines of the task's own output (the loop's header lines left
        out); when it ends in a traceback, from the traceback's first line, its middle cut."""
        own = [ln[:width] for ln in self.text.splitlines() if ln.strip() and not ln.startswith("===== ")]
        start = max((i for i, ln in enumerate(own) if ln.startswith("Traceback (most recent call last)")),
                    default=None)
        if start is None or len(own) - start <= lines:
            return "\n".join(own[-lines:])
        keep = own[start:]
        cut = len(keep) - lines
        return "\n".join([keep[0], f"  … {cut} lines …", *keep[-(lines - 1):]])

    def explanation(self) -> str:
        """The line that says why this attempt failed, or ``""`` when its log shows none."""
        return explain(self.text)


def explain(text: str) -> str:
    """The most telling line of a failed attempt's output: the task's ``FAILED:`` message,
    else the last exception line of a traceback, else the last line that is not noise."""
    lines = [ln.rstrip() for ln in text.splitlines() if ln.strip()]
    for line in reversed(lines):
        m = _TASK_FAILED.search(line)
        if m and "unexpected error (traceback above)" not in line:
            return m.group(1).strip()[:400]
    for line in reversed(lines):
        if _EXCEPTION.match(line.strip()):
            return line.strip()[:400]
    for line in reversed(lines):
        if not line.startswith(_NOISE) and "FAILED with an unexpected error" not in line:
            return line.strip()[:400]
    return ""


def read_sections(log_path: str) -> list[AttemptLog]:
    """Every attempt's section of a task log, oldest first (a ``-r`` rerun starts again at
    attempt 1, so numbers may repeat; only the last :data:`MAX_READ_BYTES` are read)."""
    try:
        size = os.path.getsize(log_path)
        with open(log_path, "rb") as f:
            if size > MAX_READ_BYTES:
                f.seek(size - MAX_READ_BYTES)
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return []
    out: list[AttemptLog] = []
    heads = list(_HEADER.finditer(text))
    for i, m in enumerate(heads):
        end = heads[i + 1].start() if i + 1 < len(heads) else len(text)
        section = text[m.start():end]
        slurm = _SLURM.search(section)
        info = {"job_id": slurm.group(1), "node": slurm.group(2), "gpus": slurm.group(3)} if slurm else {}
        out.append(AttemptLog(int(m.group(1)), section, info))
    if not heads and text.strip():  # a log without headers (e.g. written by hand): one section
        out.append(AttemptLog(1, text))
    return out


def read_attempts(log_path: str) -> dict[int, AttemptLog]:
    """The latest section of each attempt number in a task log."""
    return {section.attempt: section for section in read_sections(log_path)}


def failure_excerpt(log_path: str, attempt: int | None = None) -> str:
    """Why the given (default: the last) attempt in ``log_path`` failed, from its output."""
    attempts = read_attempts(log_path)
    if not attempts:
        return ""
    section = attempts.get(attempt if attempt is not None else max(attempts))
    return section.explanation() if section else ""


def with_excerpt(reason: str, log_path: str, attempt: int | None = None) -> str:
    """``reason`` followed by the failure line of the log, unless the reason already says it."""
    excerpt = failure_excerpt(log_path, attempt)
    if not excerpt or excerpt in reason:
        return reason
    return f"{reason}; {excerpt}" if reason else excerpt
