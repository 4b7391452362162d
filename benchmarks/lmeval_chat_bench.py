"""lm-eval's chat-template path vs orchestra's on the same rows: wall time, peak memory, equal numbers.

    python benchmarks/lmeval_chat_bench.py [--mc-limit 16] [--gsm8k-limit 8] [--shots 2] [--quick]

Issue 37 point 5.  For each configuration (with and without ``--system_instruction``, few-shot
examples as turns in both) and each workload (multiple choice: ARC-Challenge and HellaSwag,
``--mc-limit`` documents each; generation: GSM8K with its filters, ``--gsm8k-limit`` documents),
``python -m lm_eval --model hf --apply_chat_template --fewshot_as_multiturn [--system_instruction S]
--num_fewshot SHOTS`` and ``run.py`` on ``LmEvalDataset(apply_chat_template=True,
fewshot_as_multiturn=True[, system_instruction=S], num_fewshot=SHOTS)`` run one after the other,
as subprocesses, on the same model (SmolLM2-135M-Instruct float32 on the CPU, batch size 16;
orchestra's ``HFCausalLM`` in 2 infer tasks on 2 warm LocalRunner workers), alternating which side
goes first.  Each whole command is measured: wall time (start-up, task loading, model load,
inference, scoring) and the peak memory of its process tree (RSS summed over the processes, and
anonymous RSS summed: the same without file-backed pages such as shared libraries, which every
process of a tree counts again).  Prints one table (side, wall s, peak MB, the
ratio orchestra / lm-eval, whether every metric is equal to 4 decimals), every metric side by
side, and where orchestra's time went (from its run folder's ``events.jsonl``).
``--quick``: 4 multiple-choice documents and 2 GSM8K ones, a smoke run.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench_common import TreeRun, read_events
from lmeval_common import dataset_entry, metric_pairs, metrics_equal, offline_tasks, run_lmeval, run_orchestra

SYSTEM = "You are a careful assistant. Answer briefly."
#: configuration -> (lm_eval's flags besides --apply_chat_template --fewshot_as_multiturn, LmEvalDataset's keys)
CONFIGS: dict[str, tuple[tuple[str, ...], dict[str, Any]]] = {
    "system instruction": (("--system_instruction", SYSTEM), {"system_instruction": SYSTEM}),
    "no system instruction": ((), {}),
}
WORKLOADS = {"multiple choice": ["arc_challenge", "hellaswag"], "gsm8k": ["gsm8k"]}
#: LocalRunner keys besides 2 workers: warm workers, so lm-eval's task index is built once per worker
RUNNER = ", reuse_workers=True"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (``--quick`` sets the document counts of a smoke run)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mc-limit", type=int, default=16, help="documents of ARC-Challenge and of HellaSwag")
    ap.add_argument("--gsm8k-limit", type=int, default=8, help="GSM8K documents (generation)")
    ap.add_argument("--shots", type=int, default=2, help="few-shot examples of every task (as turns)")
    ap.add_argument("--gen-kwargs", default="max_gen_toks=128", help="lm-eval's --gen_kwargs, both sides")
    ap.add_argument("--quick", action="store_true", help="smoke run: 4 multiple-choice and 2 GSM8K documents")
    ap.add_argument("--configs", nargs="+", choices=sorted(CONFIGS), default=list(CONFIGS))
    args = ap.parse_args(argv)
    if args.quick:
        args.mc_limit, args.gsm8k_limit = 4, 2
    return args


def lmeval_flags(args: argparse.Namespace, conf: str) -> tuple[str, ...]:
    """lm-eval's chat flags of configuration ``conf``."""
    return ("--apply_chat_template", "--fewshot_as_multiturn", *CONFIGS[conf][0], "--num_fewshot", str(args.shots),
            "--gen_kwargs", args.gen_kwargs)


def orchestra_entries(args: argparse.Namespace, conf: str, tasks: Path, names: list[str], limit: int) -> list[str]:
    """orchestra's dataset entries with the same options as :func:`lmeval_flags`."""
    return [dataset_entry(n, tasks, limit, num_fewshot=args.shots, apply_chat_template=True,
                          fewshot_as_multiturn=True, gen_kwargs=args.gen_kwargs, **CONFIGS[conf][1])
            for n in names]


def _from_logs(run: Path, pattern: str) -> list[float]:
    """The seconds each infer task's log gives on a line matching ``pattern`` (one group)."""
    found = []
    for log in (run / "logs" / "infer").glob("*.log"):
        found += [float(m) for m in re.findall(pattern, log.read_text(errors="replace"))]
    return found


def breakdown(done: TreeRun, run: Path) -> list[tuple[str, float]]:
    """Where orchestra's wall time went, from its events and task logs: start-up, planning, the infer
    stage (within it, per task: the model load, lm-eval's requests, inference), the eval tail."""
    events = read_events(run)
    begun = next(e["ts"] for e in events if e["event"] == "run_started")
    finished = next(e["ts"] for e in events if e["event"] == "run_finished")
    task_start: dict[str, float] = {}
    first_tick: dict[str, float] = {}
    ends: dict[str, list[float]] = {"infer": [], "eval": []}
    for e in events:
        if e.get("stage") == "infer" and e["event"] == "started":
            task_start[e["task_id"]] = e["ts"]
        elif e["event"] == "progress" and e.get("task_id") in task_start:
            first_tick.setdefault(e["task_id"], e["ts"])
        elif e["event"] == "done" and e.get("stage") in ends:
            ends[e["stage"]].append(e["ts"])
    infer0, infer1 = min(task_start.values()), max(ends["infer"])
    starts = [first_tick[t] - task_start[t] for t in first_tick]
    loads = _from_logs(run, r"model \S+ ready in ([0-9.]+) s")
    inference = _from_logs(run, r"ran \d+ samples in ([0-9.]+) s")
    return [("process start to run_started (imports, config)", begun - done.started_at),
            ("planning (run_started to first infer task)", infer0 - begun),
            ("infer stage (first task start to last task end)", infer1 - infer0),
            ("  per infer task, max: start to first sample (model load, lm-eval's requests)", max(starts)),
            ("  per infer task, max: of which the model load (its log)", max(loads, default=0.0)),
            ("  per infer task, max: inference (its log)", max(inference, default=0.0)),
            ("eval after the last infer task (eval tasks overlap the infer stage)", max(ends["eval"]) - infer1),
            ("last task end to run_finished (summary, report)", finished - max(ends["eval"])),
            ("run_finished to process exit", done.started_at + done.wall_s - finished)]


def print_report(args: argparse.Namespace, load: list[str], rows: list[tuple[str, str, TreeRun, float, bool]],
                 metric_lines: list[str], profiles: list[tuple[str, list[tuple[str, float]]]]) -> None:
    """The table (side, wall, peak memory, ratio, metrics equal), the metrics side by side, and
    where orchestra's time went."""
    print(f"load average before: {' '.join(load)}; after: {' '.join(Path('/proc/loadavg').read_text().split()[:3])}"
          f"; {len(os.sched_getaffinity(0))} CPUs; shots {args.shots}; --gen_kwargs {args.gen_kwargs}")
    print(f"\n{'workload':<80} {'side':<10} {'wall s':>7} {'peak RSS MB':>12} {'peak anon MB':>12} "
          f"{'orch/lm-eval':>12}  equal")
    for what, who, m, ratio, equal in rows:
        tail = f"{ratio:>12.2f}  {'yes' if equal else 'NO'}" if who == "orchestra" else ""
        print(f"{what:<80} {who:<10} {m.wall_s:>7.1f} {m.peak_rss_mb:>12.0f} {m.peak_anon_mb:>12.0f} {tail}")
    print(f"\n{'configuration':<22} {'task':<14} {'metric':<26} {'orchestra':>9} {'lm-eval':>9}  equal")
    print("\n".join(metric_lines))
    for what, parts in profiles:
        print(f"\norchestra's time, {what}:")
        for name, seconds in parts:
            print(f"  {name:<70} {seconds:>7.1f} s")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    load = Path("/proc/loadavg").read_text().split()[:3]
    rows: list[tuple[str, str, TreeRun, float, bool]] = []
    metric_lines: list[str] = []
    profiles: list[tuple[str, list[tuple[str, float]]]] = []
    with tempfile.TemporaryDirectory(prefix="lmeval_chat_bench_") as folder:
        tmp = Path(folder)
        tasks = offline_tasks(tmp)
        # warm-up (not timed): the weights cache (lm-eval reads its float32 folder), the dataset-size
        # cache, HF datasets' cache of the local files (both sides read it afterwards)
        run_orchestra(tmp, orchestra_entries(args, args.configs[0], tasks, ["arc_challenge", "hellaswag", "gsm8k"],
                                             1), RUNNER)
        turn = 0
        for conf in args.configs:
            for workload, names in WORKLOADS.items():
                limit = args.gsm8k_limit if workload == "gsm8k" else args.mc_limit
                order = ["lm-eval", "orchestra"] if turn % 2 == 0 else ["orchestra", "lm-eval"]
                turn += 1
                measured: dict[str, TreeRun] = {}
                got: dict[str, Any] = {}
                for who in order:
                    if who == "lm-eval":
                        measured[who], got[who] = run_lmeval(tmp, tasks, names, limit, lmeval_flags(args, conf))
                    else:
                        measured[who], run, got[who] = run_orchestra(
                            tmp, orchestra_entries(args, conf, tasks, names, limit), RUNNER)
                        profiles.append((f"{conf}, {workload}", breakdown(measured[who], run)))
                what = f"{conf}, {workload} ({', '.join(names)}; {limit} docs each)"
                equal = metrics_equal(got["orchestra"], got["lm-eval"])
                ratio = measured["orchestra"].wall_s / measured["lm-eval"].wall_s
                for who in ("lm-eval", "orchestra"):
                    rows.append((what, who, measured[who], ratio, equal))
                    print(f"{what} | {who}: {measured[who].wall_s:.1f} s, peak RSS {measured[who].peak_rss_mb:.0f} MB, "
                          f"anon {measured[who].peak_anon_mb:.0f} MB", flush=True)
                for task, key, ours, ref, same in metric_pairs(got["orchestra"], got["lm-eval"]):
                    ref_text = "-" if ref is None else f"{ref:.4f}"
                    metric_lines.append(f"{conf:<22} {task:<14} {key:<26} {ours:>9.4f} {ref_text:>9}  "
                                        f"{'yes' if same else 'NO'}")
                    print(metric_lines[-1], flush=True)
    print_report(args, load, rows, metric_lines, profiles)
    return 0


if __name__ == "__main__":
    sys.exit(main())
