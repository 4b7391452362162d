"""Benchmark: what GPU sampling costs a long run's files and its report.

    python benchmarks/gpu_samples_bench.py                 # 1 h and 10 h of 8 GPUs at 1 s
    python benchmarks/gpu_samples_bench.py --hours 24 --gpus 8

Writes ``gpu.jsonl`` as the sampler does (``GpuSample.record`` lines, one ``append_line`` each,
the first record of a GPU with its uuid), then times reading it back for the report
(``summary/gpu.gpu_report``: parse, clamp, downsample, busy means) and measures the bytes the
report and the trace carry.  Prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from orchestra.fileio import append_line  # noqa: E402
from orchestra.paths import RunPaths  # noqa: E402
from orchestra.runners.local.gpumon import GpuSample  # noqa: E402
from orchestra.summary.gpu import gpu_counters, gpu_report, read_gpu_series  # noqa: E402
from orchestra.summary.runlog import RunLog  # noqa: E402


def one_case(hours: float, gpus: int) -> dict[str, str]:
    """Write ``hours`` of 1 s samples of ``gpus`` GPUs, then read them back as the report does."""
    with tempfile.TemporaryDirectory(prefix="gpubench-") as root:
        paths = RunPaths(root)
        t0 = 1.7e9
        n = int(hours * 3600)
        started = time.perf_counter()
        for i in range(n):
            for g in range(gpus):
                s = GpuSample(g, f"GPU-{g:08d}-0000-0000-0000-000000000000", (i * 7 + g) % 101, 20000 + i % 997, 143771)
                line = json.dumps(s.record(t0 + i, first=i == 0), separators=(",", ":")).encode() + b"\n"
                append_line(paths.gpu_samples, line)
        write_s = time.perf_counter() - started
        size = os.path.getsize(paths.gpu_samples)
        started = time.perf_counter()
        lanes, busy = gpu_report(paths, RunLog(invocations=[], tasks={}, usage={}), t0)
        report_s = time.perf_counter() - started
        started = time.perf_counter()
        counters = gpu_counters(paths, lambda ts: int((ts - t0) * 1e6), 1)  # the parse is cached by now
        trace_s = time.perf_counter() - started
        assert lanes is not None and len(read_gpu_series(paths)) == gpus and busy == []
        return {"samples": f"{n * gpus:,}", "file MB": f"{size / 1e6:.1f}",
                "write µs/line": f"{write_s / (n * gpus) * 1e6:.0f}",
                "report s (parse + downsample)": f"{report_s:.2f}",
                "report lanes KB": f"{len(json.dumps(lanes, separators=(',', ':'))) / 1e3:.0f}",
                "trace s (cached parse)": f"{trace_s:.2f}",
                "trace counters KB": f"{len(json.dumps(counters, separators=(',', ':'))) / 1e3:.0f}"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hours", type=float, nargs="+", default=[1.0, 10.0])
    parser.add_argument("--gpus", type=int, default=8)
    args = parser.parse_args()
    rows = [{"run": f"{h:g} h x {args.gpus} GPUs @ 1 s", **one_case(h, args.gpus)} for h in args.hours]
    keys = list(rows[0])
    print("| " + " | ".join(keys) + " |")
    print("|" + "---|" * len(keys))
    for row in rows:
        print("| " + " | ".join(row[k] for k in keys) + " |")


if __name__ == "__main__":
    main()
