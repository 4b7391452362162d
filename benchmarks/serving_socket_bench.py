"""A managed replica on a loopback port vs on a Unix socket: requests/s through run.py.

    python benchmarks/serving_socket_bench.py [--n 2000] [--conns 16] [--rounds 3]

vLLM replicas listen on a Unix socket in a 0700 folder (docs/serving.md, "Why vLLM is on a
socket"), so every request of a served vLLM model goes over aiohttp's ``UnixConnector`` instead
of TCP.  vLLM cannot run on this machine, so the same ``--n`` completions go to one managed
``command`` replica of tests/serving/keyed_stub.py (stdlib HTTP server, answers at once: the
transport's and the client's cost is what is left to see), once on ``{port}`` and once on
``{socket}``, alternating which goes first per round.  Requests/s: ``--n`` over the infer task's
started-to-done time (the replica up).  Prints one table with the socket's ratio to the port.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.bench_common import read_events  # noqa: E402

STUB = str(REPO / "tests" / "serving" / "keyed_stub.py")


def write_config(folder: Path, name: str, n: int, conns: int, where: str) -> Path:
    data = folder / "rows.jsonl"
    if not data.exists():
        with open(data, "w") as fh:
            for i in range(n):
                fh.write(json.dumps({"question": f"What is {i} plus 1?", "answer": str(i + 1)}) + "\n")
    server = dict(engine="command", model="m", command=[sys.executable, STUB, where], max_restarts=0)
    cfg = folder / f"{name}.py"
    cfg.write_text(f"""
from orchestra.datasets import JsonlDataset
from orchestra.models import OpenAIAPI
models = [dict(type=OpenAIAPI, abbr='stub', path='m', endpoint='completions', max_out_len=4,
               max_connections={conns}, max_retries=2, server={server!r})]
datasets = [dict(type=JsonlDataset, abbr='rows', path={str(data)!r},
                 reader_cfg=dict(input_columns=['question'], output_column='answer'),
                 infer_cfg=dict(prompt_template='{{question}}', inferencer=dict(type='gen', max_out_len=4)))]
infer = dict(runner=dict(type='LocalRunner', task=dict(type='InferTask'), gpus=[]))
work_dir = {str(folder / ('out_' + name))!r}
""")
    return cfg


def rate(folder: Path, name: str, n: int, conns: int, where: str, env: dict[str, str]) -> float:
    cfg = write_config(folder, name, n, conns, where)
    res = subprocess.run([sys.executable, str(REPO / "run.py"), str(cfg), "--mode", "infer"], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=3600)
    if res.returncode != 0:
        raise SystemExit(f"serving_socket_bench: {name} failed:\n{res.stderr[-3000:]}")
    (run_dir,) = [p for p in (folder / f"out_{name}").iterdir() if p.is_dir()]
    evs: list[dict[str, Any]] = read_events(run_dir)
    start = min(e["ts"] for e in evs if e["event"] == "started" and e.get("stage") == "infer")
    end = max(e["ts"] for e in evs if e["event"] == "done" and e.get("stage") == "infer")
    return n / (end - start)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--conns", type=int, default=16, help="max_connections of the model")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    rates: dict[str, list[float]] = {"port": [], "socket": []}
    for r in range(args.rounds):
        order = ["port", "socket"] if r % 2 == 0 else ["socket", "port"]
        with tempfile.TemporaryDirectory(prefix="serving_socket_bench_") as tmp:
            for which in order:
                where = "{port}" if which == "port" else "{socket}"
                rates[which].append(rate(Path(tmp), f"{which}_{r}", args.n, args.conns, where, env))
        print(f"round {r + 1}: " + "  ".join(f"{k}: {v[-1]:.1f} req/s" for k, v in rates.items()), flush=True)
    mean = {k: sum(v) / len(v) for k, v in rates.items()}
    print(f"{args.n} completions, max_connections {args.conns}, {args.rounds} round(s), {os.cpu_count()} cores")
    print(f"{'replica listens on':<34} {'req/s':>8} {'ratio':>6}")
    for k, label in (("port", "127.0.0.1 port (TCP)"), ("socket", "Unix socket in a 0700 folder")):
        print(f"{label:<34} {mean[k]:>8.1f} {mean[k] / mean['port']:>6.2f}")


if __name__ == "__main__":
    main()
