"""Where a normal run spends its time before its first task starts (issue 40): a cProfile of
``orchestra.cli.main`` on ``scale_bench.py``'s N x N x 1,000-row config, stopped at the first
``started`` event.  Both stage threads are profiled (the eval stage's queueing runs beside the
infer stage's); the garbage collector's pauses are timed apart (cProfile does not see them).

    python benchmarks/first_task_profile.py [--side 316] [--top 30]
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import os
import pstats
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench_common import REPO

sys.path.insert(0, str(REPO))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--side", type=int, default=316)
    ap.add_argument("--top", type=int, default=30, help="functions shown, by cumulative time")
    args = ap.parse_args()
    from scale_bench import write_plan_config

    from orchestra.cli.main import main as cli_main
    from orchestra.events import EventLog

    profiles: list[cProfile.Profile] = []
    gc_s = [0.0]
    gc_t0 = [0.0]
    gc_long: list[str] = []

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            gc_t0[0] = time.perf_counter()
        else:
            took = time.perf_counter() - gc_t0[0]
            gc_s[0] += took
            if took > 0.05:  # a long pass: where it fell
                import traceback

                where = traceback.extract_stack(limit=6)[:-1]
                gc_long.append(f"  {took:.2f} s, generation {info['generation']}, in "
                               + " < ".join(f"{Path(f.filename).name}:{f.lineno}" for f in reversed(where)))

    emit_many = EventLog.emit_many
    t0 = time.perf_counter()
    cpu0 = [0.0]

    def watched(self: EventLog, events: object, *a: object, **kw: object) -> None:
        events = list(events)  # type: ignore[call-overload]
        emit_many(self, events, *a, **kw)
        if any(e[0] == "started" for e in events):
            wall = time.perf_counter() - t0
            for p in profiles:
                p.disable()
            stats = pstats.Stats(profiles[0], stream=(out := io.StringIO()))
            for p in profiles[1:]:
                stats.add(p)
            stats.sort_stats("cumulative").print_stats(args.top)
            stats.print_callees(r"api.py:\d+\(_execute\)|loop.py:\d+\(launch\)|stages.py:\d+\(run_stages\)")
            stats.sort_stats("tottime").print_stats(args.top)
            print(out.getvalue())
            print(f"start to the first 'started' event: {wall:.2f} s wall, {time.process_time() - cpu0[0]:.2f} s CPU, "
                  f"garbage collector {gc_s[0]:.2f} s")
            print("\n".join(gc_long))
            sys.stdout.flush()
            os._exit(0)

    EventLog.emit_many = watched  # type: ignore[method-assign]
    original_run = threading.Thread.run

    def profiled_run(self: threading.Thread) -> None:  # every thread the run starts is profiled too
        prof = cProfile.Profile()
        profiles.append(prof)
        prof.enable()
        original_run(self)

    threading.Thread.run = profiled_run  # type: ignore[method-assign]
    gc.callbacks.append(on_gc)
    with tempfile.TemporaryDirectory() as tmp:
        cfg = write_plan_config(Path(tmp), args.side)
        os.environ["ORCHESTRA_CACHE_DIR"] = str(Path(tmp) / "cache")
        main_prof = cProfile.Profile()
        profiles.insert(0, main_prof)
        t0 = time.perf_counter()
        cpu0[0] = time.process_time()
        main_prof.enable()
        cli_main([str(cfg), "-w", str(Path(tmp) / "w")])
    raise SystemExit("the run ended before a task started")


if __name__ == "__main__":
    main()
