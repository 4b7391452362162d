"""The one way ``DLCRunner`` stops DLC jobs: ``core.stopping.stop_and_confirm`` with ``dlc stop job
--force`` for each at once to stop and ``dlc get job`` to confirm (bounded), sending the stop again to
a job that still runs a few seconds later.  Used on Ctrl-C/SIGTERM, timeouts, queue timeouts, orchestrator
errors and shutdown, and for jobs an earlier orchestrator left behind."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from orchestra.runners.core.stopping import stop_and_confirm
from orchestra.runners.dlc.cli import TERMINAL, DLCClient, DLCError

RESTOP_AFTER_S = 5.0
STOP_CONCURRENCY = 64  # stop (and confirm) calls in flight at once: a Ctrl-C on a big run ends fast
_CONFIRM_POLL_S = 0.25


def stop_jobs(client: DLCClient, job_ids: list[str], timeout_s: float) -> dict[str, tuple[str, str]]:
    """Stop these jobs; ``{job id: (last status seen, outcome)}``.

    The outcome is ``'stopped'`` (the service shows the job over: Stopped, or it had already
    Succeeded/Failed), ``'stop_acknowledged'`` (still ``Stopping`` at the deadline) or
    ``'stop_unconfirmed'`` (no answer that shows either).
    """
    ids = [j for j in dict.fromkeys(job_ids) if j]
    if not ids:
        return {}
    status = dict.fromkeys(ids, "unknown")
    with ThreadPoolExecutor(min(STOP_CONCURRENCY, len(ids)), thread_name_prefix="dlc-stop") as pool:

        def send(job_id: str) -> None:
            try:
                client.stop(job_id)
            except DLCError:
                pass  # the confirmation decides

        def send_all(some: list[str]) -> None:
            list(pool.map(send, some))

        def look(job_id: str) -> str:
            try:
                return client.get(job_id, urgent=True).status
            except DLCError:
                return "unknown"

        def alive(waiting: list[str]) -> dict[str, str]:
            for job_id, state in zip(waiting, pool.map(look, waiting)):
                status[job_id] = state if state != "unknown" else status[job_id]
            return {j: status[j] for j in waiting if status[j] not in TERMINAL}

        stop_and_confirm(ids, send_all, alive, timeout_s=timeout_s,
                         resend_after_s=RESTOP_AFTER_S, poll_s=_CONFIRM_POLL_S, ending={"Stopping"})
    out = {}
    for job_id in ids:
        if status[job_id] in TERMINAL:
            out[job_id] = (status[job_id], "stopped")
        elif status[job_id] == "Stopping":
            out[job_id] = (status[job_id], "stop_acknowledged")
        else:
            out[job_id] = (status[job_id], "stop_unconfirmed")
    return out
