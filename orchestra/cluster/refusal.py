"""When to submit again after a cluster refused a submission for now: one schedule for every
submitter (the runners' ``core.refused`` queue, a Slurm-placed replica's job).

A refusal for now (a job limit such as Slurm's ``MaxJobCount``, a busy, drained or unreachable
controller) is an infrastructure outcome: the submission waits 5, 10, 20, 40, then every 60 s
after each refusal in a row, and ends (``infra``) once it has waited ``SUBMIT_WAIT_S``.
"""

from __future__ import annotations

from collections.abc import Sequence

SUBMIT_BACKOFF_S = (5.0, 10.0, 20.0, 40.0, 60.0)  # waits after 1, 2, ... refusals in a row (then the last)
SUBMIT_WAIT_S = 3600.0  # how long a submission the cluster keeps refusing waits before it ends (infra)


def backoff_after(refusals: int, backoff_s: Sequence[float] = SUBMIT_BACKOFF_S) -> float:
    """The wait after ``refusals`` (>= 1) refusals in a row: ``backoff_s``'s entry, then its last."""
    return backoff_s[min(refusals, len(backoff_s)) - 1]
