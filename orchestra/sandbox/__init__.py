"""Run untrusted programs (model-written code) isolated, limited, and capped host-wide.

* :class:`Sandbox` runs one program: namespaces (bubblewrap or ``unshare``), resource
  limits, its own user, session and temp folder; nothing it started outlives it.
* :func:`run_process` is the one async helper every scoring subprocess goes through, and
  :func:`subprocess_slots` the host-wide scope that caps how many run at once.

Nothing here knows about datasets, evaluators or tasks.
"""

from __future__ import annotations

from orchestra.sandbox.isolation import ISOLATIONS
from orchestra.sandbox.limits import SandboxLimits
from orchestra.sandbox.process import ProcessResult, default_max_sandboxes, run_process, subprocess_slots
from orchestra.sandbox.sandbox import IsolationUnavailable, Sandbox, SandboxError, SandboxResult

__all__ = [
    "ISOLATIONS",
    "IsolationUnavailable",
    "ProcessResult",
    "Sandbox",
    "SandboxError",
    "SandboxLimits",
    "SandboxResult",
    "default_max_sandboxes",
    "run_process",
    "subprocess_slots",
]
