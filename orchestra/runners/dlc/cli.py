"""The ``dlc`` command-line client of Alibaba Cloud PAI-DLC, as ``DLCRunner`` uses it.

Every call is an argv list (no shell), bounded by a timeout, started in a session of its own
(a Ctrl-C at the terminal reaches the orchestrator, never a ``dlc submit`` in flight, whose job
would then exist without a recorded id), and rate-limited (``max_calls_per_s``) except for stops.
A call that outlives its timeout is killed with its whole process group (a wrapper script's
children too).  Once the run is stopped (``abort``), a submit or a status check still in flight
gets ``ABORT_GRACE_S`` to answer, then is killed the same way: Ctrl-C never waits for a hung client.
What the runner relies on, from Alibaba's PAI-DLC CLI and GetJob documentation:

* ``dlc submit pytorchjob ... --name N`` prints the new job's id (``dlc`` + 13 lower-case letters
  and digits) in a table row; the id is matched anywhere in the output, not the layout.
* ``dlc get job ID`` prints the job as JSON, sometimes after a first status line (``[OK]``);
  ``Status`` is one of :data:`STATUSES`, with ``ReasonCode``/``ReasonMessage``, ``GmtCreateTime``,
  ``GmtFinishTime`` and ``Pods[]`` (``PodId`` ``<id>-master-0``).
* ``dlc logs ID POD --start_time T1 --end_time T2 --max_events_num N`` prints the pod's lines
  logged in that window (times ``2020-11-08T16:00:00Z``, whole seconds), or
  ``[WARN] No logs found for the pod``.
* ``dlc stop job ID --force`` asks for the stop (``Stopping``, then ``Stopped``).
* Service errors print ``[FAILED] code: N ...`` and exit non-zero.
"""

from __future__ import annotations

import json
import re
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from orchestra.cluster.client import CLIClient

#: every ``Status`` a DLC job reports
STATUSES = (
    "Creating", "Queuing", "Bidding", "EnvPreparing", "SanityChecking", "Running", "Restarting", "Stopping",
    "SucceededReserving", "FailedReserving", "Succeeded", "Failed", "Stopped",
)
WAITING = frozenset({"Creating", "Queuing", "Bidding"})  # no resources yet: what queue_timeout_s bounds
LOGGING = frozenset({"Running", "Restarting", "Stopping"})  # the pod runs (or just ran) the command
SUCCEEDED = frozenset({"Succeeded", "SucceededReserving"})
FAILED = frozenset({"Failed", "FailedReserving"})
TERMINAL = SUCCEEDED | FAILED | {"Stopped"}  # the job will never run the command again

JOB_ID = re.compile(r"(?<![0-9A-Za-z])dlc[0-9a-z]{13}(?![0-9A-Za-z])")
NO_LOGS = "[WARN] No logs found for the pod"
_FAILED_LINE = re.compile(r"\[FAILED\][^\n]*")
_TIME_FORMAT = "%Y-%m-%dT%H:%M:%SZ"
ABORT_GRACE_S = 2.0  # how long a submit in flight may still finish once the run is stopped


class DLCError(RuntimeError):
    """A ``dlc`` call failed: could not start, timed out, exited non-zero or answered garbage."""


@dataclass(frozen=True)
class DLCJobStatus:
    """What ``dlc get job`` says about one job."""

    job_id: str
    status: str
    reason_code: str = ""
    reason_message: str = ""
    create_time: float | None = None  # service clock, epoch seconds
    finish_time: float | None = None
    pod_id: str = ""

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL

    def describe(self) -> str:
        """``'Failed (NodeLost: the node went away)'``."""
        why = ": ".join(x for x in (self.reason_code, self.reason_message) if x)
        return f"{self.status} ({why})" if why else self.status


def parse_time(text: object) -> float | None:
    """A DLC time (``2021-01-26T09:02:16Z``, optionally with fractions or ``+00:00``; UTC without a
    zone) as epoch seconds; None when it is not one."""
    try:
        when = datetime.fromisoformat(text.strip()) if isinstance(text, str) and "T" in text else None
    except ValueError:
        return None
    return None if when is None else (when if when.tzinfo else when.replace(tzinfo=timezone.utc)).timestamp()


def format_time(epoch_s: int) -> str:
    """Whole epoch seconds as the CLI's ``--start_time``/``--end_time`` (UTC)."""
    return time.strftime(_TIME_FORMAT, time.gmtime(epoch_s))


def parse_job_id(output: str) -> str | None:
    """The one job id in ``submit``'s output; None when there is none, or more than one."""
    ids = set(JOB_ID.findall(output))
    return ids.pop() if len(ids) == 1 else None


def parse_job_info(output: str, job_id: str) -> DLCJobStatus:
    """``get job``'s JSON (after any status lines); ``ValueError`` when there is none."""
    decoder = json.JSONDecoder()
    data: dict[str, Any] | None = None
    start = output.find("{")
    while start >= 0:  # the first object that decodes and has a Status (status lines may come first)
        try:
            candidate, _ = decoder.raw_decode(output[start:])
        except ValueError:
            candidate = None
        if isinstance(candidate, dict) and isinstance(candidate.get("Status"), str):
            data = candidate
            break
        start = output.find("{", start + 1)
    if data is None:
        raise ValueError("no JSON object with a Status in the answer")
    pods = data["Pods"] if isinstance(data.get("Pods"), list) else []
    pod_ids = [str(p.get("PodId")) for p in pods if isinstance(p, dict) and p.get("PodId")]
    master = next((p for p in pod_ids if "master" in p), pod_ids[0] if pod_ids else "")
    return DLCJobStatus(str(data.get("JobId") or job_id), data["Status"], str(data.get("ReasonCode") or ""),
                   str(data.get("ReasonMessage") or ""), parse_time(data.get("GmtCreateTime")),
                   parse_time(data.get("GmtFinishTime")), master or f"{job_id}-master-0")


def short(output: str, limit: int = 300) -> str:
    """One line of a CLI answer for a message: its ``[FAILED]`` line if it has one."""
    m = _FAILED_LINE.search(output)
    text = m.group(0) if m else output
    text = " ".join(text.split())
    return text[:limit] + ("..." if len(text) > limit else "") if text else "(no output)"


class DLCClient(CLIClient):
    """The ``dlc`` calls of one launch, counted by verb (``submit``, ``get``, ``logs``, ``stop``).

    Args:
        dlc_bin: the client's path or name on PATH.
        config_path: ``--config`` for every call (None: the client's default config).
        timeout_s: the longest one call may take.
        max_calls_per_s: the rate of all calls but stops (which are never delayed).
        abort: the run's stop flag: once set, submits and status checks in flight give up.
    """

    def __init__(self, dlc_bin: str, config_path: str | None, timeout_s: float, max_calls_per_s: float,
                 abort: threading.Event | None = None) -> None:
        super().__init__("dlc", (dlc_bin, config_path), timeout_s, max_calls_per_s, abort, DLCError,
                         abort_grace_s=ABORT_GRACE_S)
        self.dlc_bin = dlc_bin
        self.config = ["--config", config_path] if config_path else []

    def submit(self, argv: list[str], urgent: bool = False) -> str:
        """Run a prepared ``dlc submit`` argv; the new job's id."""
        name = argv[argv.index("--name") + 1] if "--name" in argv[:-1] else "?"
        code, out = self.run("submit", argv, urgent, f"submit (job {name})", abortable=True)
        job_id = parse_job_id(out)
        if code != 0:
            raise DLCError(f"dlc submit exited {code}: {short(out)}")
        if job_id is None:
            raise DLCError(f"no job id in dlc submit's answer: {short(out)}")
        return job_id

    def get(self, job_id: str, urgent: bool = False) -> DLCJobStatus:
        code, out = self.run("get", [self.dlc_bin, "get", "job", job_id, *self.config], urgent, f"get job {job_id}",
                             abortable=not urgent)
        if code != 0:
            raise DLCError(f"dlc get job {job_id} exited {code}: {short(out)}")
        try:
            return parse_job_info(out, job_id)
        except ValueError as exc:
            raise DLCError(f"dlc get job {job_id}: {exc}: {short(out)}") from None

    def logs(self, job_id: str, pod_id: str, start_s: int, end_s: int, max_events: int) -> list[str]:
        """The pod's lines logged in ``[start_s, end_s)`` (whole epoch seconds, service clock)."""
        argv = [self.dlc_bin, "logs", job_id, pod_id, "--start_time", format_time(start_s), "--end_time",
                format_time(end_s), "--max_events_num", str(max_events), *self.config]
        code, out = self.run("logs", argv, what=f"logs {job_id}")
        if code != 0:
            raise DLCError(f"dlc logs {job_id} exited {code}: {short(out)}")
        lines = out.splitlines()
        if len(lines) <= 2 and any(line.strip() == NO_LOGS for line in lines):
            return []
        return lines

    def stop(self, job_id: str) -> None:
        """``dlc stop job ID --force``; its answer is not read: ``dlc get job`` shows whether it took."""
        self.run("stop", [self.dlc_bin, "stop", "job", job_id, "--force", *self.config], urgent=True,
                 what=f"stop job {job_id}")
