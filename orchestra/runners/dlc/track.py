"""What ``DLCSession`` does for one job, called from its verbs: submit it, look at it, copy its log,
decide how the attempt ended, stop it.

``look(job)`` runs in the session's pool, started by a poll round for every job that is due: a ``dlc get job``, the log
windows that settled since, and the next look scheduled: every ``poll_interval_s`` after a change,
1.5x longer per unchanged answer up to ``max_poll_interval_s``, 1 s once the command's exit code
file exists.  Everything it learns goes to the task log, the run folder's ledger and the event log.
``stop`` is ``core.stop_each`` with ``dlc stop job --force`` for each job at once and ``dlc get
job`` to confirm (bounded), the stop sent again to a job still running 5 s later.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

from orchestra.events import EventLog
from orchestra.runners.core.contract import Exit
from orchestra.runners.core.ledger import Ledger, record_stop
from orchestra.runners.core.run import note
from orchestra.runners.core.shell import read_exit_file
from orchestra.runners.core.stop_each import UNKNOWN, outcome, stop_each
from orchestra.runners.dlc.cli import LOGGING, TERMINAL, WAITING, DLCClient, DLCError, DLCJobStatus
from orchestra.runners.dlc.job import DLCJob, Timings, attempt_exit
from orchestra.runners.dlc.logs import LogCursor, copy_final, copy_settled

RESTOP_AFTER_S = 5.0
FINAL_LOG_RETRY_S = 30.0  # the read of an ended job's last log window is tried again this long (lost_after_s if less)
STOP_CONCURRENCY = 64  # stop (and confirm) calls in flight at once: a Ctrl-C on a big run ends fast
_CONFIRM_POLL_S = 0.25


class Tracker:
    """Submits, watches and stops DLC jobs through ``client``, recording into ``ledger`` and ``events``."""

    def __init__(self, client: DLCClient, ledger: Ledger, events: EventLog, timings: Timings) -> None:
        self.client = client
        self.ledger = ledger
        self.events = events
        self.t = timings
        self._offset: float | None = None  # the service's clock minus ours (a lower bound)
        self._lock = threading.Lock()

    def submit(self, h: DLCJob) -> Exit | None:
        """Submit the job (its turn at the shared rate first); an ``Exit`` when that failed."""
        self.client.take_turn()
        self.ledger.claim([h.name])  # this launch's job: no other launch of this process touches it
        self.record("submitting", h)
        try:
            job_id = self.client.submit(h.argv, urgent=True)  # (its turn was taken above)
        except DLCError as exc:
            h.over = True
            self.record("submit_failed", h, error=str(exc))
            self.emit("dlc_submit_failed", h, error=str(exc))
            self.log(h, [f"===== dlc: submit failed: {exc}"])
            return Exit(-1, f"dlc submit failed: {exc}", infra=True)
        h.job_id, h.submitted_wall = job_id, time.time()
        self.record("submitted", h)
        self.emit("dlc_submitted", h, job_id=job_id)
        self.log(h, [f"===== dlc: submitted job {job_id} as {h.name}"])
        self._schedule(h, changed=True)
        return None

    def look(self, h: DLCJob) -> Exit | None:
        """One look at a submitted job; its ``Exit`` once the attempt is decided.  A job this runner
        must stop first (queued too long, lost) gets ``h.verdict`` and ``h.stop_reason`` instead."""
        if h.drain_at is not None and h.info is not None:
            return self._conclude(h, h.info)
        return self._check(h)

    def _check(self, h: DLCJob) -> Exit | None:
        assert h.job_id is not None
        try:
            info = self.client.get(h.job_id)
        except DLCError as exc:  # a transient garbled or failed answer is not the task's failure
            h.get_error_since = h.get_error_since or time.monotonic()
            if time.monotonic() - h.get_error_since < self.t.lost_after_s:
                self._schedule(h, changed=False)
                return None
            h.stop_reason = "lost: dlc get job kept failing"
            h.verdict = Exit(-1, f"DLC job {h.job_id} lost: dlc get job failed for {self.t.lost_after_s:g} s ({exc})",
                             infra=True)
            return None
        h.get_error_since = None
        if h.info is None and not h.adopted and info.create_time is not None:
            self._observe_offset(info.create_time - h.submitted_wall)
        changed = h.info is None or info.status != h.info.status
        h.info = info
        if changed:
            if not info.terminal:  # the end is written after the log's last lines
                self.log(h, [f"===== dlc: job {h.job_id} {info.describe()}"])
            self.emit("dlc_status", h, job_id=h.job_id, status=info.status, reason_code=info.reason_code)
        if info.terminal:
            return self._conclude(h, info)
        if info.status in WAITING:
            h.waiting_since = h.waiting_since or time.monotonic()
            if self.t.queue_timeout_s is not None and time.monotonic() - h.waiting_since > self.t.queue_timeout_s:
                h.stop_reason = f"queue_timeout_s: still {info.status} after {self.t.queue_timeout_s:g} s"
                h.verdict = Exit(-1, f"DLC job {h.job_id} still {info.status} after queue_timeout_s="
                                     f"{self.t.queue_timeout_s:g} s; stopped it", infra=True)
                return None
        else:
            h.waiting_since = None
        if info.status in LOGGING:
            cursor = self._cursor(h, info)
            try:  # the cursor moves on only once a read succeeded: the next look reads the same windows
                copy_settled(cursor, self.client, h.job_id, info.pod_id, self._service_now(), self.t.log_settle_s,
                             lambda lines: self.log(h, lines))
            except DLCError:
                pass  # a transient failure of the log service is not the task's
        self._schedule(h, changed)
        return None

    def _conclude(self, h: DLCJob, info: DLCJobStatus) -> Exit | None:
        """The job is over: copy its log to the end, then decide how the attempt ended."""
        assert h.job_id is not None
        cursor = self._cursor(h, info)
        finished = info.finish_time if info.finish_time is not None else self._service_now()
        read_from = self._service_now()  # when this read began: its answers hold what was visible by then
        try:
            copy_final(cursor, self.client, h.job_id, info.pod_id, int(finished) + 2, lambda lines: self.log(h, lines))
        except DLCError as exc:
            # The cursor did not move: the same window is read again at the next look, for a while
            # (a transient failure of the log service must not cut the task's last lines off).
            give_up_s = min(FINAL_LOG_RETRY_S, self.t.lost_after_s)
            h.final_log_error_since = h.final_log_error_since or time.monotonic()
            if time.monotonic() - h.final_log_error_since < give_up_s:
                h.drain_at = h.drain_at or finished
                h.next_check = time.monotonic() + min(self.t.poll_interval_s, 1.0)
                return None
            if not h.final_log_given_up:  # the drain's further looks fail the same way: said once
                h.final_log_given_up = True
                self.log(h, [f"===== dlc: could not read the job's log for {give_up_s:g} s: {exc}"])
        # No footer yet: lines may still be on their way into the log service.  Read again once
        # they have settled, and keep reading (each settle period, or each second) until the
        # footer shows or a read that began after a second settle period found none (a job killed
        # before its footer).  When the read began, not when it ended, decides: a read split into
        # many windows on a slow service can end past that time having read its last window early.
        now = self._service_now()
        if not cursor.footer_seen and read_from < finished + 2 * self.t.log_settle_s:
            first = finished + self.t.log_settle_s
            h.drain_at = first
            wait = first - now if now < first else min(self.t.log_settle_s, 1.0)
            h.next_check = time.monotonic() + max(0.0, wait)
            return None
        h.over = True
        code = read_exit_file(h.exit_file)
        ended = attempt_exit(h.job_id, info, code, cursor.tail_text())
        self.log(h, [f"===== dlc: job {h.job_id} ended {info.describe()}"
                      + (f", task exit code {code}" if code is not None else ", no task exit code recorded")])
        self.record("ended", h, status=info.status, reason_code=info.reason_code, exit_code=code)
        self.emit("dlc_ended", h, job_id=h.job_id, status=info.status, reason_code=info.reason_code,
                   reason_message=info.reason_message, exit_code=code)
        return ended

    # -- clocks, schedules, logs -----------------------------------------------------------------------
    def _schedule(self, h: DLCJob, changed: bool) -> None:
        if h.exit_seen:  # the command is over; the job's status follows soon
            h.interval = min(self.t.poll_interval_s, 1.0)
        elif changed or not h.interval:
            h.interval = self.t.poll_interval_s
        else:
            h.interval = min(h.interval * 1.5, self.t.max_poll_interval_s)
        h.next_check = time.monotonic() + h.interval

    def _observe_offset(self, offset: float) -> None:
        with self._lock:
            self._offset = offset if self._offset is None else min(self._offset, offset)

    def _service_now(self) -> float:
        return time.time() + (self._offset or 0.0)

    def _cursor(self, h: DLCJob, info: DLCJobStatus) -> LogCursor:
        if h.cursor is None:
            start = info.create_time if info.create_time is not None else h.submitted_wall + (self._offset or 0.0)
            h.cursor = LogCursor(int(start) - 1)
        return h.cursor

    def log(self, h: DLCJob, lines: list[str]) -> None:
        if lines:
            with h.lock:
                note(h.log_path, "\n".join(lines) + "\n")

    def record(self, state: str, h: DLCJob, **fields: Any) -> None:
        self.ledger.record(state, h.name, **self._fields(h), **fields)

    @staticmethod
    def _fields(h: DLCJob) -> dict[str, Any]:
        """What every ledger line of the job carries."""
        return {"task_id": h.task_id, "stage": h.stage, "attempt": h.attempt, "seq": h.seq, "digest": h.digest,
                "job_id": h.job_id or ""}

    def emit(self, event: str, h: DLCJob, **fields: Any) -> None:
        self.events.emit(event, task_id=h.task_id, stage=h.stage, attempt=h.attempt, name=h.name, **fields)

    def stop(self, handles: list[DLCJob], reason: str) -> None:
        """Stop these jobs (``dlc stop job --force``, ``STOP_CONCURRENCY`` calls at once), wait until
        ``dlc get job`` shows each over (at most ``cancel_timeout_s``), record the outcome of each:
        ``stopped`` (Stopped, or it had already ended), ``stop_acknowledged`` (still Stopping) or
        ``stop_unconfirmed`` (no answer that shows either)."""
        for h in handles:
            h.stop_reason = reason
        seen: dict[str, str] = {}

        def stop() -> dict[str, tuple[str, dict[str, Any]]]:
            status = stop_each([h.job_id for h in handles if h.job_id], self.client.stop,
                               lambda job_id: self.client.get(job_id, urgent=True).status, terminal=TERMINAL,
                               ending={"Stopping"}, errors=(DLCError,), timeout_s=self.t.cancel_timeout_s,
                               resend_after_s=RESTOP_AFTER_S, poll_s=_CONFIRM_POLL_S,
                               concurrency=STOP_CONCURRENCY, name="dlc")
            seen.update({h.name: status.get(h.job_id or "", UNKNOWN) for h in handles})
            return {name: (outcome(state, TERMINAL, {"Stopping"}), {"status": state, "reason": reason})
                    for name, state in seen.items()}

        outcomes = record_stop(self.ledger, {h.name: (f"DLC job {h.job_id}", self._fields(h)) for h in handles},
                               reason, stop)
        unconfirmed = []
        for h in handles:
            h.over = outcomes[h.name] == "stopped"
            self.emit("dlc_stopped", h, job_id=h.job_id, reason=reason, status=seen[h.name], confirmed=h.over)
            self.log(h, [f"===== dlc: stopped job {h.job_id} ({reason}); the service shows it {seen[h.name]}"])
            if outcomes[h.name] == "stop_unconfirmed":
                unconfirmed.append(str(h.job_id))
        if unconfirmed:
            print(f"orchestra: warning: DLC job(s) {', '.join(unconfirmed)} not shown over "
                  f"{self.t.cancel_timeout_s:g} s after 'dlc stop job --force'; check them in the console "
                  "(orchestra -r stops them again)", file=sys.stderr)
