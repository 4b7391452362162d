"""The ``batch`` option of an API model: what the user sets, checked once, with every bad value
named in one line (``batch.size must be ...``)."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

from orchestra.errors import check_known_keys


@dataclass(frozen=True)
class BatchOptions:
    """The ``batch`` option of an API model.

    Args:
        size: most requests in one batch (the provider's limit is 50,000).
        max_bytes: most bytes of one batch's input file (the provider's limit is 200 MB).
        poll_s: seconds between two status checks of a batch.
        flush_s: how long requests gather before a batch smaller than ``size`` is sent.
        max_requests_in_flight: requests in batches (or waiting for one) at once.
        cancel_wait_s: on Ctrl-C, how long cancelled batches are watched for ``cancelled``.
        window_s: how long a batch is waited for, from its creation, before it is cancelled
            and its rows go into a later batch (the provider's own window is 24 h; 25 h leaves
            it an hour to finish and report).
    """

    size: int = 50_000
    max_bytes: int = 190 * 1024 * 1024
    poll_s: float = 30.0
    flush_s: float = 2.0
    max_requests_in_flight: int = 100_000
    cancel_wait_s: float = 2.0
    window_s: float = 25 * 3600.0

    @classmethod
    def parse(cls, value: Any) -> BatchOptions | None:
        """``False``/``None``: no batch mode; ``True``: defaults; a dict: these settings."""
        if value is None or value is False:
            return None
        if value is True:
            return cls()
        valid = [f.name for f in fields(cls)]
        if not isinstance(value, dict):
            raise ValueError(f"batch must be True, False or a dict with keys {', '.join(valid)}; got {value!r}")
        check_known_keys(sorted(value), valid, "batch", error=ValueError)
        opts = cls(**value)
        limits = {"size": (1, 50_000), "max_bytes": (1, 200 * 1024 * 1024), "max_requests_in_flight": (1, None)}
        for name, (low, high) in limits.items():
            v = getattr(opts, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < low or (high is not None and v > high):
                raise ValueError(f"batch.{name} must be an integer in [{low}, {high or 'inf'}], got {v!r}")
        for name in ("poll_s", "flush_s", "cancel_wait_s"):
            v = getattr(opts, name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or v < 0 or (name == "poll_s" and v == 0):
                raise ValueError(f"batch.{name} must be a number of seconds > 0, got {v!r}")
        w = opts.window_s  # a batch that never ends must end the wait: a finite window
        if not isinstance(w, (int, float)) or isinstance(w, bool) or not 0 < w < math.inf:
            raise ValueError(f"batch.window_s must be a number of seconds > 0 (finite), got {w!r}")
        return opts
