"""Copy a DLC job's log into its task log while it runs, and to the very end once it is over.

``dlc logs`` answers for a time window of whole seconds (the service's clock), capped at
``--max_events_num`` lines.  The runner reads consecutive windows ``[start, end)`` (half-open, as
Alibaba's log service counts them), each once it has *settled*: its end lies ``settle_s`` in the
past, so lines the service ingests late are not lost.  A window whose answer reaches the cap is
split in halves until none does (a single second is asked again with a ten times larger cap).
Once the job is over, the last window ``[start, finish + 2)`` is read at once and, unless it ends
with the task's exit-code footer (the log is then complete), read again after ``settle_s`` and then
each second until the footer shows or a read begun after a second ``settle_s`` finds none; lines
already copied from it are skipped.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from orchestra.runners.dlc.cli import DLCClient
from orchestra.runners.dlc.config import FOOTER

MAX_EVENTS = 2000  # the CLI's own default cap
_MAX_EVENTS_ONE_SECOND = 100_000


class LogCursor:
    """How far a job's log has been copied: windows before ``next_s`` entirely, plus the first
    ``taken`` lines of the (unsettled, final) window that starts at ``next_s``."""

    def __init__(self, start_s: int) -> None:
        self.next_s = start_s
        self.taken = 0
        self.footer_seen = False
        self.tail: deque[str] = deque(maxlen=12)  # the last lines of the task's own output

    def note(self, lines: list[str]) -> None:
        for line in lines:
            if line.startswith(FOOTER):
                self.footer_seen = True
            elif line.strip():
                self.tail.append(line.rstrip())

    def tail_text(self, lines: int = 4, limit: int = 400) -> str:
        """The last lines of output, joined with `` | `` for a one-line failure message."""
        text = " | ".join(list(self.tail)[-lines:])
        return text if len(text) <= limit else "..." + text[-limit:]


def read_window(client: DLCClient, job_id: str, pod_id: str, start_s: int, end_s: int,
                max_events: int = MAX_EVENTS) -> list[str]:
    """Every line of ``[start_s, end_s)``: windows that hit the cap are split until none does."""
    if end_s <= start_s:
        return []
    lines = client.logs(job_id, pod_id, start_s, end_s, max_events)
    if len(lines) < max_events:
        return lines
    if end_s - start_s >= 2:
        mid = (start_s + end_s) // 2
        # The later half first: lines become readable in the order they were written, so the
        # earlier half, asked after it, holds at least every line before the later half's first,
        # and the two together are always a prefix of the log (never a hole with lines after it).
        later = read_window(client, job_id, pod_id, mid, end_s, max_events)
        return read_window(client, job_id, pod_id, start_s, mid, max_events) + later
    if max_events < _MAX_EVENTS_ONE_SECOND:
        return read_window(client, job_id, pod_id, start_s, end_s, _MAX_EVENTS_ONE_SECOND)
    return [*lines, f"===== orchestra: more than {max_events} lines in one second of the DLC log; some are missing"]


def copy_settled(cursor: LogCursor, client: DLCClient, job_id: str, pod_id: str, service_now: float,
                 settle_s: float, write: Callable[[list[str]], None]) -> None:
    """While the job runs: copy the windows that have settled since the last call."""
    end = int(service_now - settle_s)
    if end <= cursor.next_s:
        return
    lines = read_window(client, job_id, pod_id, cursor.next_s, end)[cursor.taken:]
    cursor.next_s, cursor.taken = end, 0
    cursor.note(lines)
    write(lines)


def copy_final(cursor: LogCursor, client: DLCClient, job_id: str, pod_id: str, end_s: int,
               write: Callable[[list[str]], None]) -> None:
    """After the job: copy what is new in ``[next_s, end_s)`` (may be called again for late lines)."""
    lines = read_window(client, job_id, pod_id, cursor.next_s, end_s)
    new = lines[cursor.taken:]
    cursor.taken = max(cursor.taken, len(lines))
    cursor.note(new)
    write(new)
