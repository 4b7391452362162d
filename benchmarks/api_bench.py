"""Benchmark: OpenAIAPI + the inference engine against a real local OpenAI-compatible server.

    python benchmarks/api_bench.py              # every case, prints a markdown table
    python benchmarks/api_bench.py --cases c100 rate --n 500
    python benchmarks/api_bench.py --cases err500 --seeds 1 2 3 --timeline   # where an error run's span goes

The server (tests/servers/openai_server.py) runs as its own process on 127.0.0.1, so the
client's CPU time is measured alone: each case runs the real infer task function
(``orchestra.tasks.infer.run_task``: checkpoint, engine, model) in a child process whose
CPU time (user + system, interpreter start-up and imports included) is read with
``wait4``.  The ``kill`` case drives the whole pipeline: ``python run.py CONFIG`` is killed
with SIGKILL (with its task process) at about half the samples, then resumed with
``-r latest``; the server's per-prompt counters show what was sent again.

The server measures the request span: from the first request's arrival to the last
response.  The limit is N x latency / connections, or for a rate limit of R requests/s
with a bucket of B: (N - B) / R + latency.  With random 500s the server's seeded draws set a
floor of their own, the same for every client (``api_timeline.py``): the table shows it.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, replace
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SERVER = os.path.join(ROOT, "tests", "servers", "openai_server.py")
sys.path.insert(0, ROOT)

from api_timeline import floor_rounds, render_timeline  # noqa: E402  (this folder, beside the script)


# -- the server process ------------------------------------------------------------------------
class Server:
    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, SERVER, "--port", "0", "--stop-on-eof", "--max-lifetime-s", "3600"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line.startswith("PORT "):
            raise RuntimeError(f"server did not start: {line!r}")
        self.port = int(line.split()[1])
        self.base_url = f"http://127.0.0.1:{self.port}/v1"

    def _call(self, method: str, path: str, body: Any = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as resp:
            return json.loads(resp.read())

    def configure(self, **cfg: Any) -> None:
        base = dict(latency_s=0.0, max_concurrency=None, rate=None, burst=None, fail_rate=0.0, fail_first=0,
                    seed=0, api_key=None)
        self._call("POST", "/_config", {**base, **cfg})

    def stats(self, log: bool = False) -> dict[str, Any]:
        return self._call("GET", "/_stats?log=1" if log else "/_stats")

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


# -- data and specs --------------------------------------------------------------------------------
def write_data(folder: str, n: int, turns: int, seed: int = 1) -> tuple[str, list[Any]]:
    """``n`` arithmetic rows (or ``turns``-turn conversations) and their expected replies."""
    rng = random.Random(seed)
    path = os.path.join(folder, f"data_{n}_{turns}.jsonl")
    expected = []
    with open(path, "w", encoding="utf-8") as f:
        for i in range(n):
            a, b = rng.randint(1, 999), rng.randint(1, 999)
            if turns == 1:
                row: dict[str, Any] = {"question": f"#{i}: {a} + {b}", "answer": a + b}
                expected.append(str(a + b))
            else:
                msgs, replies, value = [f"#{i}: {a} + {b}"], [str(a + b)], a + b
                for k in range(1, turns):
                    c = rng.randint(1, 9)
                    if k % 2:
                        msgs.append(f"plus {c}")
                        value += c
                    else:
                        msgs.append(f"times {c}")
                        value *= c
                    replies.append(str(value))
                row = {"turns": msgs, "answer": value}
                expected.append(replies)
            f.write(json.dumps(row) + "\n")
    return path, expected


def dataset_cfg(path: str, turns: int) -> dict[str, Any]:
    if turns == 1:
        inferencer = {"type": "gen", "max_out_len": 16}
        return {"type": "orchestra.datasets.files.JsonlDataset", "abbr": "arith", "path": path,
                "reader_cfg": {"input_columns": ["question"], "output_column": "answer"},
                "infer_cfg": {"prompt_template": "{question}", "inferencer": inferencer},
                "eval_cfg": {"evaluator": {"type": "numeric_match"}}}
    return {"type": "orchestra.datasets.files.JsonlDataset", "abbr": "chat", "path": path,
            "reader_cfg": {"input_columns": ["turns"], "output_column": "answer"},
            "infer_cfg": {"prompt_template": "", "inferencer": {"type": "chat", "turns_column": "turns",
                                                                "max_out_len": 16}},
            "eval_cfg": {"evaluator": {"type": "numeric_match"}}}


def model_cfg(base_url: str, connections: int) -> dict[str, Any]:
    return {"type": "orchestra.models.openai_api.OpenAIAPI", "abbr": "bench", "path": "test-model",
            "base_url": base_url, "key_env": None, "max_connections": connections, "max_out_len": 16}


def make_spec(run_dir: str, model: dict[str, Any], dataset: dict[str, Any], n: int) -> str:
    from orchestra.paths import RunPaths
    from orchestra.tasks.spec import TaskSpec, Unit

    paths = RunPaths(run_dir)
    paths.make_dirs()
    unit = Unit(dataset=dataset, dataset_abbr=dataset["abbr"], start=0, end=n, shard=None, num_shards=1,
                output=paths.predictions(model["abbr"], dataset["abbr"], None), hash="bench", cost=float(n))
    spec = TaskSpec(stage="infer", task_id="infer_bench", run_dir=run_dir, model=model, model_abbr="bench",
                    units=(unit,))
    spec_path = paths.task_spec(spec.task_id)
    spec.dump(spec_path)
    return spec_path


def client_main(spec_path: str) -> int:
    """Child process: run the real infer task on a spec; print its own timings."""
    from orchestra.tasks.infer import run_task
    from orchestra.tasks.spec import TaskSpec

    spec = TaskSpec.load(spec_path)
    c0, t0 = os.times(), time.monotonic()
    run_task(spec)
    c1, t1 = os.times(), time.monotonic()
    print(json.dumps({"task_wall_s": t1 - t0,
                      "task_cpu_s": (c1.user - c0.user) + (c1.system - c0.system)}))
    return 0


def run_measured(argv: list[str], env: dict[str, str] | None = None, timeout_s: float = 600) -> tuple[int, float, str]:
    """Run a child and read its CPU time with wait4 (its own, not the server's)."""
    with tempfile.TemporaryFile(mode="w+") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})},
                                cwd=ROOT)
        deadline = time.monotonic() + timeout_s
        while True:
            pid, status, ru = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > deadline:
                proc.kill()
                pid, status, ru = os.wait4(proc.pid, 0)
                break
            time.sleep(0.02)
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        return proc.returncode, ru.ru_utime + ru.ru_stime, out.read()


def read_predictions(run_dir: str) -> dict[int, Any]:
    preds: dict[int, Any] = {}
    for folder, _, files in os.walk(os.path.join(run_dir, "predictions")):
        for name in files:
            if name.endswith(".jsonl"):
                with open(os.path.join(folder, name), encoding="utf-8") as f:
                    for line in f.readlines()[1:]:
                        rec = json.loads(line)
                        preds[rec["id"]] = rec.get("prediction") if rec.get("error") is None else None
    return preds


def last_progress(run_dir: str) -> dict[str, Any]:
    last: dict[str, Any] = {}
    path = os.path.join(run_dir, "events.jsonl")
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            for line in f:
                ev = json.loads(line)
                if ev.get("event") == "progress":
                    last = ev
    return last


# -- the cases ---------------------------------------------------------------------------------------
@dataclass
class Case:
    name: str
    what: str
    connections: int
    latency_s: float = 0.2
    turns: int = 1
    server: dict[str, Any] | None = None
    target: float | None = None  # required ratio of span to limit


CASES = {
    "c10": Case("c10", "10 connections", 10, target=1.10),
    "c50": Case("c50", "50 connections", 50, target=1.10),
    "c100": Case("c100", "100 connections", 100, target=1.10),
    "rate": Case("rate", "50 req/s limit (bucket 50), 100 connections", 100, server={"rate": 50.0, "burst": 50.0},
                 target=1.20),
    "err500": Case("err500", "5% random 500s, 100 connections", 100, server={"fail_rate": 0.05, "seed": 7}),
    "chat": Case("chat", "3-turn conversations, 50 connections", 50, turns=3, target=1.20),
    # Not run by default: conversations whose turns get random 500s (a retried turn holds up its
    # conversation's next one), and harsher limiters than the 1-second bucket of the required case.
    "chat_err500": Case("chat_err500", "3-turn conversations, 5% random 500s, 50 connections", 50, turns=3,
                        server={"fail_rate": 0.05, "seed": 7}),
    "rate_b10": Case("rate_b10", "50 req/s limit (bucket 10), 100 connections", 100,
                     server={"rate": 50.0, "burst": 10.0}),
    "rate_b1": Case("rate_b1", "50 req/s limit (bucket 1), 100 connections", 100,
                    server={"rate": 50.0, "burst": 1.0}),
}
DEFAULT_CASES = ["c10", "c50", "c100", "rate", "err500", "chat", "kill"]


def limit_s(case: Case, n: int) -> float:
    requests = n * case.turns
    limit = requests * case.latency_s / case.connections
    srv = case.server or {}
    if srv.get("rate"):
        burst = srv.get("burst") or srv["rate"]
        limit = max(limit, (requests - burst) / srv["rate"] + case.latency_s)
    return limit


def floor_s(case: Case, n: int) -> float | None:
    """The span no client within the case's connections can beat against the server's seeded
    500s (api_timeline.py); None for a case without random 500s or with several turns."""
    srv = case.server or {}
    if not srv.get("fail_rate") or case.turns != 1:
        return None
    rounds, _, _ = floor_rounds(n, case.connections, srv["fail_rate"], srv.get("seed", 0))
    return rounds * case.latency_s


def run_case(server: Server, case: Case, n: int, work: str, timeline: bool = False) -> dict[str, Any]:
    data, expected = write_data(work, n, case.turns)
    run_dir = tempfile.mkdtemp(prefix=f"{case.name}-", dir=work)
    spec_path = make_spec(run_dir, model_cfg(server.base_url, case.connections), dataset_cfg(data, case.turns), n)
    server.configure(latency_s=case.latency_s, **(case.server or {}))
    t0 = time.monotonic()
    code, cpu_s, out = run_measured([sys.executable, __file__, "--client", spec_path])
    wall = time.monotonic() - t0
    if code != 0:
        raise RuntimeError(f"case {case.name}: client failed:\n{out[-3000:]}")
    inner = json.loads(out.strip().splitlines()[-1])
    st = server.stats(log=timeline)
    if timeline:
        print(f"-- {case.what}: timeline (api_timeline.py)\n"
              f"{render_timeline(st.pop('log'), case.latency_s, st['span_s'])}", file=sys.stderr)
    preds = read_predictions(run_dir)
    correct = sum(1 for i, exp in enumerate(expected) if preds.get(i) == exp)
    prog = last_progress(run_dir)
    lim = limit_s(case, n)
    floor = floor_s(case, n)
    return {
        "case": case.name, "what": case.what, "samples": n, "requests_min": n * case.turns,
        "limit_s": round(lim, 2), "wall_s": round(wall, 2), "task_wall_s": round(inner["task_wall_s"], 2),
        "span_s": round(st["span_s"], 2), "ratio": round(st["span_s"] / lim, 3), "target": case.target,
        "floor_s": floor, "span_over_floor": round(st["span_s"] / floor, 3) if floor else None,
        "requests": st["requests"], "http_429": st["by_status"].get("429", 0),
        "http_500": st["by_status"].get("500", 0), "retries": prog.get("retries"),
        "peak_concurrency": st["peak_concurrency"],
        "cpu_ms_per_sample": round(cpu_s / n * 1000, 2),
        "task_cpu_ms_per_sample": round(inner["task_cpu_s"] / n * 1000, 2),
        "correct": correct,
    }


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="utf-8") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        for c in children.get(p, []):
            out.append(c)
            todo.append(c)
    return out


def run_kill_case(server: Server, n: int, work: str, connections: int = 50) -> dict[str, Any]:
    """``python run.py`` killed by SIGKILL at ~half the samples, then ``-r latest``."""
    data, expected = write_data(work, n, 1, seed=3)
    folder = os.path.join(work, "kill")
    os.makedirs(folder, exist_ok=True)
    cfg_path = os.path.join(folder, "eval_kill.py")
    model = model_cfg(server.base_url, connections)
    model["type"] = "OpenAIAPI"
    ds = dataset_cfg(data, 1)
    ds["type"] = "JsonlDataset"
    with open(cfg_path, "w", encoding="utf-8") as f:
        f.write(
            "from orchestra.datasets import JsonlDataset\nfrom orchestra.models import OpenAIAPI\n"
            "from orchestra.runners import LocalRunner\nfrom orchestra.tasks import InferTask\n"
            f"models = [{_literal(model)}]\ndatasets = [{_literal(ds)}]\n"
            "infer = dict(runner=dict(type=LocalRunner, max_num_workers=1, task=dict(type=InferTask)))\n"
            f"work_dir = {os.path.join(folder, 'outputs')!r}\n"
        )
    server.configure(latency_s=0.2)
    argv = [sys.executable, os.path.join(ROOT, "run.py"), cfg_path, "--mode", "infer"]
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        ok = sum(server.stats()["ok_per_prompt"].values())
        if ok >= n // 2:
            break
        time.sleep(0.02)
    victims = [proc.pid, *_descendants(proc.pid)]
    for pid in reversed(victims):  # the task process first, then the orchestrator
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait()
    time.sleep(0.3)  # let the server finish answering what was in flight
    before = server.stats()
    runs = sorted(os.listdir(os.path.join(folder, "outputs")))
    ckpts = []
    for d, _, files in os.walk(os.path.join(folder, "outputs", runs[-1], "predictions")):
        ckpts += [os.path.join(d, x) for x in files if x.endswith(".ckpt")]
    completed: set[str] = set()
    rows = [json.loads(x)["question"] for x in open(data, encoding="utf-8")]
    for path in ckpts:
        for line in open(path, encoding="utf-8").read().splitlines()[1:]:
            rec = json.loads(line)
            if rec.get("error") is None:
                completed.add(rows[rec["id"]])
    served_before = {k: v for k, v in before["ok_per_prompt"].items()}
    code, cpu_s, out = run_measured([*argv, "-r", "latest"])
    after = server.stats()
    resent_completed = sum(1 for k in completed if after["per_prompt"].get(k, 0) > before["per_prompt"].get(k, 0))
    resent_total = sum(1 for k, v in after["per_prompt"].items() if v > before["per_prompt"].get(k, 0)
                       and k in before["per_prompt"])
    answered_not_saved = sum(1 for k in served_before if k not in completed)
    preds = read_predictions(os.path.join(folder, "outputs", runs[-1]))
    correct = sum(1 for i, exp in enumerate(expected) if preds.get(i) == exp)
    return {
        "case": "kill", "what": f"SIGKILL run.py at ~{n // 2} samples, then -r latest ({connections} conn.)",
        "samples": n, "exit_code": code, "completed_at_kill": len(completed),
        "answered_not_saved": answered_not_saved, "resent_completed": resent_completed,
        "resent_total": resent_total, "correct": correct,
        "resume_requests": after["requests"] - before["requests"],
    }


def _literal(d: dict[str, Any]) -> str:
    items = ", ".join(f"{k}={v!r}" if k != "type" else f"type={v}" for k, v in d.items())
    return f"dict({items})"


def render(rows: list[dict[str, Any]], kill: dict[str, Any] | None) -> str:
    head = ("| case | limit s | request span s | span / limit | range of runs | target | floor s (500s) | wall s | "
            "requests | 429s | 500s | retries | peak conc. | client CPU ms/sample (process / task) | correct |")
    lines = [head, "|" + "---|" * 15]
    for r in rows:
        target = f"<= {r['target']:.2f}" if r["target"] else "-"
        lo, hi = r.get("ratio_range", (r["ratio"], r["ratio"]))
        floor = f"{r['floor_s']:.2f}" if r.get("floor_s") else "-"
        lines.append(
            f"| {r['what']} | {r['limit_s']:.2f} | {r['span_s']:.2f} | {r['ratio']:.3f} | {lo:.3f}-{hi:.3f} | "
            f"{target} | {floor} | {r['wall_s']:.2f} | {r['requests']} | {r['http_429']} | {r['http_500']} | "
            f"{r['retries']} | "
            f"{r['peak_concurrency']} | {r['cpu_ms_per_sample']:.2f} / {r['task_cpu_ms_per_sample']:.2f} | "
            f"{r['correct']}/{r['samples']} |"
        )
    if kill:
        lines += ["", "| kill + resume | samples checkpointed at kill | answered but not checkpointed | "
                  "checkpointed samples sent again | samples sent again | resume exit code | correct |",
                  "|---|---|---|---|---|---|---|",
                  f"| {kill['what']} | {kill['completed_at_kill']} | {kill['answered_not_saved']} | "
                  f"{kill['resent_completed']} | {kill['resent_total']} | {kill['exit_code']} | "
                  f"{kill['correct']}/{kill['samples']} |"]
    return "\n".join(lines)


def _expand(names: list[str], seeds: list[int] | None) -> list[tuple[str, Case]]:
    """The cases to run: a case with random 500s once per seed when seeds are given."""
    out: list[tuple[str, Case]] = []
    for name in names:
        case = CASES.get(name, Case(name, name, 0))
        if seeds and (case.server or {}).get("fail_rate"):
            out += [(name, replace(case, what=f"{case.what}, seed {s}", server={**(case.server or {}), "seed": s}))
                    for s in seeds]
        else:
            out.append((name, case))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--cases", nargs="+", default=DEFAULT_CASES, choices=[*CASES, "kill"])
    p.add_argument("--n", type=int, default=500, help="samples per case")
    p.add_argument("--repeat", type=int, default=3, help="runs per case; the table shows the median run")
    p.add_argument("--json", help="also write the results here")
    p.add_argument("--seeds", type=int, nargs="+",
                   help="run each case with random 500s once per seed of the server's draws (default: its own)")
    p.add_argument("--timeline", action="store_true",
                   help="print each run's round trips and its 500s' retries (stderr; api_timeline.py)")
    p.add_argument("--client", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.client:
        return client_main(args.client)
    os.environ.setdefault("ORCHESTRA_LOCK_DIR", tempfile.mkdtemp(prefix="orchestra-bench-locks-"))
    server = Server()
    rows: list[dict[str, Any]] = []
    kill = None
    try:
        with tempfile.TemporaryDirectory(prefix="orchestra-bench-") as work:
            for name, case in _expand(args.cases, args.seeds):
                if name == "kill":
                    kill = run_kill_case(server, args.n, work)
                    print(json.dumps(kill), file=sys.stderr)
                    continue
                runs = []
                for _ in range(max(1, args.repeat)):
                    runs.append(run_case(server, case, args.n, work, args.timeline))
                    print(json.dumps(runs[-1]), file=sys.stderr)
                runs.sort(key=lambda r: r["ratio"])
                row = dict(runs[len(runs) // 2], ratio_range=(runs[0]["ratio"], runs[-1]["ratio"]), runs=len(runs))
                rows.append(row)
    finally:
        server.close()
    print(render(rows, kill))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"rows": rows, "kill": kill}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
