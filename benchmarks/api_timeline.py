"""Where an API run's span goes: the request timeline the test server logged, and the floor that
its seeded 500s set for any client (used by ``api_bench.py --timeline``).

The test server (tests/servers/openai_server.py) draws one random number per request it
answers, after the latency, in the order it answers them, and appends the request to its log
right then: the log is in draw order, and the k-th answer (0-based) is a 500 or not whatever
the client sends.  A client that keeps ``C`` requests in flight, each taking the latency ``L``,
has answered at most ``C * floor(t / L)`` requests by ``t`` (each connection answers one
request per ``L``).  So answer ``d`` comes no earlier than ``L * ceil((d + 1) / C)``, a 500 in
it costs one more ``L`` for its retry, and the span is at least
``L * max(ceil(total / C), max over failed answers d of ceil((d + 1) / C) + 1)``.  A client that
fills every round trip and retries at once reaches it; :func:`floor_rounds` plays that client.
"""

from __future__ import annotations

import random
from typing import Any


def floor_rounds(requests: int, connections: int, fail_rate: float, seed: int) -> tuple[int, int, list[int]]:
    """Round trips, requests sent and failed answers (draw numbers) of the ideal client.

    Every round sends ``min(connections, pending)`` requests; the server's draws (same seed,
    same ``random.Random`` as the test server) decide which of them answer 500; those are
    pending again in the next round.
    """
    rng = random.Random(seed)
    pending, rounds, sent, failed = requests, 0, 0, []
    while pending:
        k = min(connections, pending)
        rounds += 1
        for _ in range(k):
            if rng.random() < fail_rate:
                failed.append(sent)
            sent += 1
        pending -= k - sum(1 for d in failed if d >= sent - k)
    return rounds, sent, failed


def waves(log: list[Any], latency_s: float) -> list[list[tuple[int, float, str, int]]]:
    """The server's log (arrival time, prompt, status; in answer order) cut into round trips:
    a new one starts where two consecutive arrivals are more than a quarter latency apart."""
    rows = sorted(((d, float(t), str(k), int(s)) for d, (t, k, s) in enumerate(log)), key=lambda r: r[1])
    out: list[list[tuple[int, float, str, int]]] = []
    for row in rows:
        if not out or row[1] - out[-1][-1][1] > latency_s / 4:
            out.append([])
        out[-1].append(row)
    return out


def render_timeline(log: list[Any], latency_s: float, span_s: float) -> str:
    """One line per round trip (when its requests were sent, how many were retries, which
    answered 500), then each 500 of the last two round trips with its retry's send time.
    Times are seconds from the first arrival; an answer is taken to come ``latency_s`` after
    its request arrived (the server sleeps exactly that before it draws)."""
    if not log:
        return "(no requests)"
    t0 = min(float(t) for t, _, _ in log)
    seen: dict[str, int] = {}
    lines = []
    groups = waves(log, latency_s)
    retry_sent: dict[tuple[str, int], float] = {}
    for group in groups:
        for _, t, key, _ in group:
            seen[key] = seen.get(key, 0) + 1
            retry_sent[(key, seen[key])] = t - t0
    seen.clear()
    for i, group in enumerate(groups, 1):
        retries = 0
        for _, _, key, _ in group:
            seen[key] = seen.get(key, 0) + 1
            retries += seen[key] > 1
        fails = sorted(d for d, _, _, s in group if s == 500)
        first, last = group[0][1] - t0, group[-1][1] - t0
        lines.append(f"round {i}: {len(group):3d} sent +{first:.3f}..+{last:.3f} s, {retries:3d} of them retries, "
                     f"500s at answers {fails or '-'}")
    lines.append(f"last answer +{span_s:.3f} s")
    seen.clear()
    gaps = []
    for i, group in enumerate(groups, 1):
        for d, t, key, status in group:
            seen[key] = seen.get(key, 0) + 1
            if status != 500:
                continue
            answered = t - t0 + latency_s
            nxt = retry_sent.get((key, seen[key] + 1))
            if nxt is not None:
                gaps.append(nxt - answered)
            if i < len(groups) - 2:
                continue
            gap = f"retry sent +{nxt:.3f} s ({nxt - answered:+.3f} s after the 500)" if nxt is not None else "no retry"
            lines.append(f"  answer {d} (round {i}): sent +{t - t0:.3f} s, 500 at ~+{answered:.3f} s, {gap}")
    if gaps:
        gaps.sort()
        lines.append(f"from a 500 to its retry's send: median {gaps[len(gaps) // 2]:.3f} s, max {gaps[-1]:.3f} s "
                     f"({len(gaps)} retries)")
    return "\n".join(lines)
