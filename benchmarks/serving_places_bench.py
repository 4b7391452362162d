"""Managed replicas placed locally, on Slurm and on Ray: start-up time and requests/s through run.py.

    SLURM_CONF=/tmp/orchestra-slurm/slurm.conf python benchmarks/serving_places_bench.py [--n 200] [--rounds 2]

The same ``--n`` short chats (SmolLM2-135M-Instruct GGUF on llama.cpp through xllamacpp, CPU) as
one infer task of an ``OpenAIAPI`` model with two managed replicas (1 thread, 4 slots each), the
infer stage on ``LocalRunner`` (replicas: processes), ``SlurmRunner`` (replicas: one job each, the
task an ``srun``) and ``RayRunner`` (replicas: one actor each, on a local Ray cluster of one
4-CPU node this script starts).  Start-up: from the first ``server_started`` to the last
``server_ready`` event (Slurm and Ray: submission or actor creation included).  Requests/s:
``--n`` over the infer task's started-to-done time.  Rounds alternate the order.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tools")]

from benchmarks.serving_bench import gguf, run, task_rate, write_config  # noqa: E402

LOCAL = "dict(type='LocalRunner', task=dict(type='InferTask'), gpus=[])"


def placed(folder: Path, where: str, runner: str, n: int, out_len: int, env: dict[str, str]) -> tuple[float, float]:
    server = dict(engine="llama.cpp", model=gguf(), replicas=2, threads=1, parallel=4)
    cfg = write_config(folder, where, n, out_len, f"max_connections=4, server={server!r}")
    cfg.write_text(cfg.read_text().replace(LOCAL, runner))
    _, evs = run(cfg, env)
    first = min(e["ts"] for e in evs if e["event"] == "server_started")
    ready = max(e["ts"] for e in evs if e["event"] == "server_ready")
    return ready - first, task_rate(evs, n)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--out-len", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    if not os.environ.get("SLURM_CONF"):
        raise SystemExit("serving_places_bench: set SLURM_CONF (the local cluster: tools/slurm_cluster.sh)")
    from ray_cluster import ClusterProcess, ray_env

    env = ray_env([str(REPO)])
    cluster = ClusterProcess(env)
    try:
        cluster.add_node(cpus=4)
        runners = {"local": LOCAL, "slurm": "dict(type='SlurmRunner', task=dict(type='InferTask'))",
                   "ray": f"dict(type='RayRunner', address={cluster.address!r}, task=dict(type='InferTask'))"}
        results: dict[str, list[tuple[float, float]]] = {k: [] for k in runners}
        for r in range(args.rounds):
            order = list(runners) if r % 2 == 0 else list(reversed(runners))
            with tempfile.TemporaryDirectory(prefix="serving_places_") as tmp:
                for where in order:
                    results[where].append(placed(Path(tmp), where, runners[where], args.n, args.out_len, env))
    finally:
        cluster.stop()
    for r in range(args.rounds):
        print(f"round {r + 1}: " + "  ".join(f"{k}: {v[r][0]:.2f} s, {v[r][1]:.2f} req/s" for k, v in results.items()))
    mean = {k: (sum(s for s, _ in v) / len(v), sum(q for _, q in v) / len(v)) for k, v in results.items()}
    print(f"{args.n} chats, max_out_len {args.out_len}, 2 replicas x 1 thread, {args.rounds} round(s), "
          f"{os.cpu_count()} cores")
    print(f"{'placement':<10} {'start-up s':>10} {'ratio':>6} {'req/s':>8} {'ratio':>6}")
    for k, (s, q) in mean.items():
        print(f"{k:<10} {s:>10.2f} {s / mean['local'][0]:>6.2f} {q:>8.2f} {q / mean['local'][1]:>6.2f}")


if __name__ == "__main__":
    main()
