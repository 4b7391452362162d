"""Report size, build time and time to first paint for a 2,000-task, 100,000-sample run.

    python benchmarks/report_bench.py [--keep DIR]

Builds a synthetic run folder through the real config, plan and file formats: 5 models x
(10 datasets of 1,000 rows + 1 of 10,000), each dataset cut into 40 shards packed into 400
infer tasks per model (2,000 infer tasks, 55 eval tasks).  Prompts are a 3-shot prefix per
dataset plus a ~40-word question of random words (Zipf-distributed over 3,000 made-up words),
so they compress about as well as real benchmark prompts, not better.  The schedule is
simulated on 4 hosts x 8 worker slots: 5% of tasks fail once and are retried, 1% fail twice.
Then the real ``build_summary`` + ``write_report`` write ``report.html`` and ``trace.json``,
and headless Chromium opens the report (DevTools protocol) to measure first paint, the load
event, and the per-sample drill-down of the 10,000-sample dataset (open, search).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_common import REPO, print_table

sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests" / "report"))

MODELS, SMALL, SMALL_ROWS, BIG_ROWS, SPLIT, WORKERS = 5, 10, 1000, 10_000, 40, 400
HOSTS, SLOTS = 4, 8


def _words(rng: random.Random) -> list[str]:
    syll = ["ka", "lo", "mi", "ne", "ru", "ta", "so", "vi", "pe", "do", "ga", "hu", "ze", "bo", "fi", "ya"]
    out: set[str] = set()
    while len(out) < 3000:
        out.add("".join(rng.choice(syll) for _ in range(rng.randint(1, 4))))
    return sorted(out)


def write_inputs(folder: Path, rng: random.Random) -> Path:
    """Datasets and a config whose plan has 2,000 infer tasks."""
    vocab = _words(rng)
    weights = [1 / (i + 1) for i in range(len(vocab))]
    data = folder / "data"
    data.mkdir(parents=True)
    abbrs = [f"bench{i:02d}" for i in range(SMALL)] + ["bigset"]
    for abbr in abbrs:
        rows = BIG_ROWS if abbr == "bigset" else SMALL_ROWS
        with open(data / f"{abbr}.jsonl", "w") as f:
            for _ in range(rows):
                q = " ".join(rng.choices(vocab, weights, k=rng.randint(25, 55)))
                f.write(json.dumps({"question": q.capitalize() + "?", "answer": str(rng.randint(0, 999))}) + "\n")
    shots = {a: "\n\n".join(f"Question: {' '.join(rng.choices(vocab, weights, k=30))}?\nAnswer: {rng.randint(0, 999)}"
                            for _ in range(3)) for a in abbrs}
    cfg = folder / "bench_cfg.py"
    datasets = ",\n".join(
        f"    dict(type=JsonlDataset, abbr={a!r}, path={str(data / (a + '.jsonl'))!r},"
        f" reader_cfg=dict(input_columns=['question'], output_column='answer'),"
        f" infer_cfg=dict(prompt_template={shots[a] + chr(10) * 2 + 'Question: {question}' + chr(10) + 'Answer:'!r},"
        f" inferencer=dict(type='gen', max_out_len=32)), eval_cfg=dict(evaluator=dict(type='exact_match')))"
        for a in abbrs)
    models = ",\n".join(f"    dict(type=DeterministicModel, abbr='model-{i}')" for i in range(MODELS))
    cfg.write_text(f"""
from orchestra.datasets import JsonlDataset
from orchestra.models import DeterministicModel
from orchestra.partitioners import NaivePartitioner, NumWorkerPartitioner
from orchestra.runners import LocalRunner
from orchestra.tasks import EvalTask, InferTask

models = [
{models}
]
datasets = [
{datasets}
]
infer = dict(partitioner=dict(type=NumWorkerPartitioner, num_worker={WORKERS}, num_split={SPLIT}),
             runner=dict(type=LocalRunner, max_num_workers={HOSTS * SLOTS}, retry=1, task=dict(type=InferTask)))
eval = dict(partitioner=dict(type=NaivePartitioner), runner=dict(type=LocalRunner, task=dict(type=EvalTask)))
work_dir = {str(folder / 'out')!r}
""")
    return cfg


class Scheduler:
    """Slots of simulated hosts; each attempt takes the slot that frees first."""

    def __init__(self, t0: float) -> None:
        self.free = [(t0, h, s) for h in range(HOSTS) for s in range(SLOTS)]

    def take(self, duration: float) -> tuple[float, float, int, int]:
        self.free.sort()
        start, host, slot = self.free.pop(0)
        end = start + duration
        self.free.append((end + 0.05, host, slot))
        return start, end, host, slot


def synthesize(cfg_path: Path, rng: random.Random) -> tuple[Any, Any, Any]:
    """Plan the config for real, then write what a run would have: specs, predictions,
    results, details, logs and events."""
    from orchestra.config import load_config, validate
    from orchestra.datasets.base import build_dataset
    from orchestra.datasets.info import dataset_infos
    from orchestra.events import EventLog
    from orchestra.fileio import atomic_write_json, atomic_write_jsonl, write_sealed_jsonl
    from orchestra.paths import RunPaths, choose_run_folder
    from orchestra.planner import make_plan

    cfg = validate(load_config(str(cfg_path), []), str(cfg_path))
    infos = dataset_infos(cfg.datasets, str(cfg_path), write_cache=False)
    root, _ = choose_run_folder(cfg.work_dir, None)
    paths = RunPaths(root)
    paths.make_dirs()
    plan = make_plan(cfg, infos, paths)
    assert len(plan.tasks["infer"]) == MODELS * WORKERS, len(plan.tasks["infer"])
    events = EventLog(paths.events)
    t0 = time.time() - 4 * 3600
    sched = Scheduler(t0)
    events.emit("run_started", mode="all", pid=1)
    prompts = {}
    for info in infos:
        ds = build_dataset(info.cfg)
        prompts[info.abbr] = {s.id: (s.gen.prompt if s.gen else "", s.gold) for s in ds.build_samples(0, info.size)}
    failed_units: set[str] = set()
    answers = {}
    for task in plan.tasks["infer"]:
        task.dump(paths.task_spec(task.task_id))
        events.emit("queued", task_id=task.task_id, stage="infer", cost=task.cost, name=task.display_name,
                    model=task.model_abbr, samples=task.num_samples, num_gpus=0)
        fate = rng.random()
        attempts = 2 if fate < 0.06 else 1
        log = paths.task_log("infer", task.task_id)
        os.makedirs(os.path.dirname(log), exist_ok=True)
        lines = []
        for attempt in range(1, attempts + 1):
            fails = attempt == 1 and attempts == 2 or fate < 0.01
            dur = task.num_samples * rng.uniform(0.4, 0.9) * (0.2 if fails else 1.0)
            start, end, host, slot = sched.take(dur)
            _emit_at(events, start, "started", task_id=task.task_id, stage="infer", attempt=attempt, resources={},
                     log=log, name=task.display_name, slot=host * SLOTS + slot, runner="LocalRunner",
                     where={"host": f"node{host + 1:02d}", "pid": rng.randint(1000, 99999)})
            lines.append(f"===== orchestra: attempt {attempt} of {task.task_id} ({task.display_name}) at {start}\n")
            lines.append(f"[{task.task_id}] model {task.model_abbr} ready in 3.1 s\n")
            model_api = task.model_abbr in ("model-0", "model-1")
            for k in (1, 2):
                snap = {"samples_total": task.num_samples, "samples_done": task.num_samples * k // 3,
                        "samples_failed": 0, "in_flight": 8, "requests_done": task.num_samples * k // 3,
                        "rate_limited": rng.randint(0, 3) if model_api else 0,
                        "retries": rng.randint(0, 3) if model_api else 0, "errors": 0, "samples_resumed": 0}
                if model_api:
                    snap.update(prompt_tokens=snap["requests_done"] * 180, completion_tokens=snap["requests_done"] * 12)
                _emit_at(events, start + dur * k / 3, "progress", task_id=task.task_id, stage="infer",
                         model=task.model_abbr, attempt=attempt, **snap)
            if fails:
                lines.append("Traceback (most recent call last):\n  File \"orchestra/tasks/infer.py\", line 80\n"
                             "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n"
                             f"[{task.task_id}] FAILED with an unexpected error (traceback above)\n"
                             f"===== orchestra: attempt {attempt} failed: exit code 1\n")
                last = attempt == attempts
                _emit_at(events, end, "failed" if last else "retry", task_id=task.task_id, stage="infer",
                         attempt=attempt, reason="exit code 1", exit_code=1, timed_out=False,
                         slot=host * SLOTS + slot, duration_s=dur, log=log)
                if last:
                    failed_units.update(u.output for u in task.units)
                continue
            lines.append(f"[{task.task_id}] ran {task.num_samples} samples in {dur:.2f} s\n[{task.task_id}] done\n")
            _emit_at(events, end, "done", task_id=task.task_id, stage="infer", attempt=attempt, duration_s=dur,
                     exit_code=0, slot=host * SLOTS + slot)
            for unit in task.units:
                recs = []
                for i in range(unit.start, unit.end):
                    prompt, gold = prompts[unit.dataset_abbr][i]
                    pred = gold if rng.random() < 0.7 else str(rng.randint(0, 999))
                    answers[(task.model_abbr, unit.dataset_abbr, i)] = pred
                    recs.append({"id": i, "prompt": prompt, "prediction": pred, "gold": gold})
                write_sealed_jsonl(unit.output, {"hash": unit.hash, "task_id": task.task_id}, recs)
        with open(log, "w") as f:
            f.writelines(lines)
    eval_sched = Scheduler(max(t for t, _, _ in sched.free))
    for task in plan.tasks["eval"]:
        unit = task.units[0]
        if any(path in failed_units for path, _ in unit.inputs):
            _emit_at(events, eval_sched.free[0][0], "skipped", task_id=task.task_id, stage="eval",
                     reason="predictions missing", name=task.display_name, model=task.model_abbr)
            continue
        task.dump(paths.task_spec(task.task_id))
        start, end, host, slot = eval_sched.take(rng.uniform(2, 8))
        _emit_at(events, start, "started", task_id=task.task_id, stage="eval", attempt=1, resources={},
                 log=paths.task_log("eval", task.task_id), name=task.display_name, slot=host * SLOTS + slot,
                 runner="LocalRunner", where={"host": f"node{host + 1:02d}"})
        details = [{"id": i, "gold": prompts[unit.dataset_abbr][i][1],
                    "prediction": answers[(task.model_abbr, unit.dataset_abbr, i)],
                    "exact_match": answers[(task.model_abbr, unit.dataset_abbr, i)] == prompts[unit.dataset_abbr][i][1]}
                   for i in range(unit.start, unit.end)]
        atomic_write_jsonl(paths.details(task.model_abbr, unit.dataset_abbr), details)
        score = sum(d["exact_match"] for d in details) / len(details)
        atomic_write_json(unit.output, {"hash": unit.hash, "model": task.model_abbr, "dataset": unit.dataset_abbr,
                                        "metrics": {"exact_match": score}, "num_samples": len(details),
                                        "num_failed_samples": 0})
        _emit_at(events, end, "done", task_id=task.task_id, stage="eval", attempt=1, duration_s=end - start,
                 exit_code=0, slot=host * SLOTS + slot)
    _emit_at(events, max(t for t, _, _ in eval_sched.free), "run_finished", interrupted=False, failed=[])
    return cfg, paths, plan


def _emit_at(events: Any, ts: float, event: str, **fields: Any) -> None:
    """Append an event with a simulated timestamp (EventLog.emit stamps the current time)."""
    from orchestra.fileio import append_line

    line = json.dumps({"ts": round(ts, 3), "event": event, **fields}, ensure_ascii=False) + "\n"
    append_line(events.path, line.encode())


def measure_browser(report: Path) -> list[tuple[str, str]]:
    from chromium import Chromium

    rows = []
    with Chromium() as chrome:
        load = chrome.open(str(report))
        fcp = chrome.wait_for("(performance.getEntriesByType('paint').find(e => e.name === "
                              "'first-contentful-paint') || {}).startTime")
        rows.append(("time to first contentful paint (headless Chromium)", f"{fcp / 1000:.2f} s"))
        rows.append(("time to load event (all of the page parsed, timeline drawn)", f"{load:.2f} s"))
        bars = chrome.eval("+document.getElementById('tl').dataset.bars")
        rows.append(("timeline bars drawn", str(bars)))
        t = time.monotonic()
        chrome.eval("[...document.querySelectorAll('#results-table td[data-pair]')].find(td => "
                    "td.parentElement.cells[0].innerText === 'bigset').click()")
        chrome.wait_for("document.getElementById('drill-count').innerText.includes('of 10000')", timeout_s=60)
        rows.append(("drill-down: open 10,000 samples (inflate, parse, first page)", f"{time.monotonic() - t:.2f} s"))
        t = time.monotonic()
        chrome.eval("const s = document.getElementById('drill-search'); s.value = 'question: ka'; "
                    "s.dispatchEvent(new Event('input'))")
        chrome.wait_for("!document.getElementById('drill-count').innerText.includes('of 10000')", timeout_s=60)
        rows.append(("drill-down: search 10,000 samples (incl. 150 ms debounce)", f"{time.monotonic() - t:.2f} s"))
        if chrome.console:
            rows.append(("console errors", str(chrome.console)))
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keep", help="build the run folder here and keep it (default: a temporary folder)")
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory(prefix="report-bench-") as tmp:
        folder = Path(args.keep or tmp)
        os.environ.setdefault("ORCHESTRA_CACHE_DIR", str(folder / "cache"))
        t = time.monotonic()
        cfg, paths, plan = synthesize(write_inputs(folder, rng), rng)
        made = time.monotonic() - t
        from orchestra.summary.report import write_report
        from orchestra.summary.table import build_summary

        t = time.monotonic()
        summary = build_summary(paths, [m["abbr"] for m in cfg.models], plan.all_units["eval"])
        t_summary = time.monotonic() - t
        t = time.monotonic()
        files = write_report(paths, summary, plan.all_units["eval"], {"model-0", "model-1"},
                             {"model-0": {"input_per_1m_tokens": 0.15, "output_per_1m_tokens": 0.6, "currency": "USD"}})
        t_report = time.monotonic() - t
        with open(paths.events) as f:
            kinds = [json.loads(line)["event"] for line in f]
        rows = [
            ("run: tasks (infer + eval) / samples", f"{len(plan.tasks['infer'])} + {len(plan.tasks['eval'])} / "
                                                      f"{MODELS * (SMALL * SMALL_ROWS + BIG_ROWS)}"),
            ("run: events / attempts", f"{len(kinds)} / {kinds.count('started')}"),
            ("synthetic run folder written in", f"{made:.1f} s"),
            ("build_summary (the table, as every run does)", f"{t_summary:.2f} s"),
            ("write_report (report.html + trace.json)", f"{t_report:.2f} s"),
            ("report.html size", f"{os.path.getsize(files.report) / 1e6:.2f} MB"),
            ("trace.json size", f"{os.path.getsize(files.trace) / 1e6:.2f} MB"),
        ]
        rows += measure_browser(Path(files.report))
        print_table(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
