"""GPU utilisation of a run, read back from ``gpu.jsonl`` for the report and the trace.

The local runner's sampler (``runners/local/gpumon.py``) writes one record per GPU and sample:
``{"t", "gpu", "util", "mem_mib", ...}``.  The file is read as untrusted (a record that is not
well formed is skipped, values are clamped) and each GPU's series is cut down to at most
``MAX_POINTS`` points (means over equal runs of samples), so a week-long run stays small.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any

from orchestra.fileio import read_jsonl
from orchestra.paths import RunPaths
from orchestra.summary.runlog import RunLog

#: the most points one GPU's series keeps in the report, and in the trace (two counters a point)
MAX_POINTS, MAX_TRACE_POINTS = 2000, 1000


@dataclass
class GpuSeries:
    """One GPU's samples, oldest first: times (unix s), utilisation (%), memory used (MiB or None)."""

    gpu: int
    t: list[float] = field(default_factory=list)
    util: list[float] = field(default_factory=list)
    mem_mib: list[float | None] = field(default_factory=list)


def _num(value: Any, low: float, high: float) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return min(max(float(value), low), high)


_cache: dict[str, tuple[tuple[int, int], list[GpuSeries]]] = {}  # path -> (mtime, size), its series


def read_gpu_series(paths: RunPaths) -> list[GpuSeries]:
    """Every sampled GPU's series, by GPU index ([] when nothing was sampled).  The report and
    the trace both ask: a file unchanged since the last call is not parsed again."""
    try:
        st = os.stat(paths.gpu_samples)
    except OSError:
        return []
    stamp = (st.st_mtime_ns, st.st_size)
    cached = _cache.get(paths.gpu_samples)
    if cached is not None and cached[0] == stamp:
        return cached[1]
    try:
        records = read_jsonl(paths.gpu_samples)
    except OSError:
        return []
    _cache.clear()  # one run folder at a time: a long-lived process does not keep old runs
    _cache[paths.gpu_samples] = (stamp, _series(records))
    return _cache[paths.gpu_samples][1]


def _series(records: list[Any]) -> list[GpuSeries]:
    series: dict[int, GpuSeries] = {}
    for rec in records:
        if not isinstance(rec, dict):
            continue
        gpu, t, util = rec.get("gpu"), _num(rec.get("t"), 0.0, 1e11), _num(rec.get("util"), 0.0, 100.0)
        if not isinstance(gpu, int) or isinstance(gpu, bool) or not 0 <= gpu < 10000 or t is None or util is None:
            continue
        s = series.setdefault(gpu, GpuSeries(gpu))
        s.t.append(t)
        s.util.append(util)
        s.mem_mib.append(_num(rec.get("mem_mib"), 0.0, 1e9))
    for g, s in series.items():  # appends of one sampler are in order; two resumed runs need not be
        if any(b < a for a, b in zip(s.t, s.t[1:])):
            order = sorted(range(len(s.t)), key=s.t.__getitem__)
            series[g] = GpuSeries(g, [s.t[i] for i in order], [s.util[i] for i in order], [s.mem_mib[i] for i in order])
    return [series[g] for g in sorted(series)]


def downsample(s: GpuSeries, max_points: int = MAX_POINTS) -> GpuSeries:
    """At most ``max_points`` points: each the mean time and utilisation, and the peak memory,
    of an equal run of consecutive samples."""
    n = len(s.t)
    if n <= max_points:
        return s
    out = GpuSeries(s.gpu)
    for k in range(max_points):
        lo, hi = k * n // max_points, (k + 1) * n // max_points
        out.t.append(sum(s.t[lo:hi]) / (hi - lo))
        out.util.append(sum(s.util[lo:hi]) / (hi - lo))
        mems = [m for m in s.mem_mib[lo:hi] if m is not None]
        out.mem_mib.append(max(mems) if mems else None)
    return out


def busy_pct(s: GpuSeries, start: float, end: float) -> float | None:
    """Mean utilisation of the samples taken from ``start`` to ``end`` (None: none taken then)."""
    inside = [u for t, u in zip(s.t, s.util) if start <= t <= end]
    return sum(inside) / len(inside) if inside else None


def infer_window(run: RunLog) -> tuple[float, float] | None:
    """From the first inference attempt's start to the last one's end."""
    spans = [(a.start, a.end or a.start) for a in run.attempts if a.stage == "infer"]
    return (min(s for s, _ in spans), max(e for _, e in spans)) if spans else None


def gpu_report(paths: RunPaths, run: RunLog, t0: float) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """The timeline's GPU lanes (times in seconds since ``t0``, as the task bars; None without
    samples) and the mean busy % per GPU over the infer stage, for the overview."""
    series = read_gpu_series(paths)
    if not series:
        return None, []
    window = infer_window(run)
    busy = []
    for s in series:
        pct = busy_pct(s, *window) if window else None
        if pct is not None:
            busy.append({"gpu": s.gpu, "pct": round(pct, 1)})
    lanes = [downsample(s) for s in series]
    return ({"gpus": [s.gpu for s in lanes],
             "t": [[round(t - t0, 2) for t in s.t] for s in lanes],
             "util": [[round(u, 1) for u in s.util] for s in lanes]}, busy)


def gpu_counters(paths: RunPaths, us: Any, pid: int) -> list[dict[str, Any]]:
    """Chrome trace counter events: one track per GPU (utilisation %, memory used), under ``pid``."""
    out: list[dict[str, Any]] = []
    for s in (downsample(s, MAX_TRACE_POINTS) for s in read_gpu_series(paths)):
        for t, u, m in zip(s.t, s.util, s.mem_mib):
            out.append({"ph": "C", "name": f"GPU {s.gpu} busy %", "pid": pid, "tid": 0, "ts": us(t),
                        "args": {"util": round(u, 1)}})
            if m is not None:
                out.append({"ph": "C", "name": f"GPU {s.gpu} memory MiB", "pid": pid, "tid": 0, "ts": us(t),
                            "args": {"mem_mib": int(m)}})
    if out:
        out.insert(0, {"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": "GPUs"}})
    return out
