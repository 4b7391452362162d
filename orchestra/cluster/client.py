"""The calls of one launch to a cluster service's command-line client, as a backend makes them.

``CLIClient.run`` is ``cli.call`` with what every backend that drives a service through its
CLI needs around it (DLC's ``dlc``, Slurm's ``squeue``/``sacct``/``scancel``): each call waits its
turn at the account's shared rate (``shared_limiter``) unless it is urgent (a stop must never wait)
or the service sets no rate, the calls are counted by verb (benchmarks and tests read the counts),
and a call the run's stop flag may cut short is killed ``abort_grace_s`` after a stop.  A failure
is one error of the backend's own class whose message names the call (never its argv, which may
be long) and the setting that bounds it.
"""

from __future__ import annotations

import subprocess
import threading
from collections import Counter
from collections.abc import Hashable

from orchestra.cluster.cli import CallError, CallTimeout, call, shared_limiter


class CLIClient:
    """Counted, paced, bounded calls of one client program.

    Args:
        program: what errors call the client (``"dlc"``).
        account: calls of every client with the same account share one rate.
        timeout_s: the longest one call may take (``timeout_name`` is the setting that says so; ``""``:
            a fixed bound, no setting).
        max_calls_per_s: the rate of all calls but urgent ones (None: calls are not paced).
        abort: the run's stop flag (calls run with ``abortable`` give up ``abort_grace_s`` after it).
        error: the exception class a failed call raises.
    """

    def __init__(self, program: str, account: Hashable, timeout_s: float, max_calls_per_s: float | None,
                 abort: threading.Event | None, error: type[Exception], *, timeout_name: str = "cli_timeout_s",
                 abort_grace_s: float = 2.0) -> None:
        self.program = program
        self.timeout_s = timeout_s
        self.timeout_name = timeout_name
        self.limiter = shared_limiter(account, max_calls_per_s) if max_calls_per_s is not None else None
        self.calls: Counter[str] = Counter()
        self.abort = abort
        self.abort_grace_s = abort_grace_s
        self.error = error
        self._lock = threading.Lock()

    def take_turn(self) -> None:
        """Wait for this client's turn at the shared rate (then make the call ``urgent``)."""
        if self.limiter is not None:
            self.limiter.acquire()

    def run(self, verb: str, argv: list[str], urgent: bool = False, what: str = "",
            abortable: bool = False) -> tuple[int, str]:
        """Run one call; ``(exit code, stdout + stderr)``.  ``self.error`` if it cannot run in time.

        ``what`` names the call in errors (``submit (job N)``; default: the verb).
        """
        res = self.call(verb, argv, urgent, what, abortable)
        return res.returncode, res.stdout + res.stderr

    def call(self, verb: str, argv: list[str], urgent: bool = False, what: str = "",
             abortable: bool = False) -> subprocess.CompletedProcess[str]:
        """``run``'s call with stdout and stderr apart (a client whose errors and answers differ)."""
        if not urgent:
            self.take_turn()
        with self._lock:
            self.calls[verb] += 1
        label = f"{self.program} {what or verb}"
        try:
            return call(argv, self.timeout_s, self.abort if abortable else None, self.abort_grace_s)
        except CallError as exc:
            raise self.error(str(exc)) from None
        except CallTimeout as exc:
            if exc.aborted:
                raise self.error(f"{label} was still running when the run was stopped; killed it and its "
                                 "child processes") from None
            bound = f"{self.timeout_name}={self.timeout_s:g} s" if self.timeout_name else f"{self.timeout_s:g} s"
            raise self.error(f"{label} did not answer within {bound}; killed it and its child processes") from None
