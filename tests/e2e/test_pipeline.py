"""End to end: the real CLI as a subprocess, real task processes, the deterministic model."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import alive, run_argv, wait_for

REPO = Path(__file__).resolve().parents[2]


def write_config(tmp_path: Path, model: str = "", runner: str = "", max_task_size: int = 400,
                 name: str = "cfg.py", arith_rows: int = 60) -> Path:
    """A config with the deterministic model on two small datasets, in ``tmp_path``."""
    data = tmp_path / "data"
    data.mkdir(exist_ok=True)
    with open(data / "arith.jsonl", "w") as f:
        for i in range(arith_rows):
            f.write(json.dumps({"question": f"What is {i} + {2 * i}?", "answer": str(3 * i)}) + "\n")
    with open(data / "pick.jsonl", "w") as f:
        for i in range(20):
            f.write(json.dumps({"q": f"The word is w{i}.", "choices": ["x", f"w{i}", "y"], "label": 1}) + "\n")
    cfg = tmp_path / name
    cfg.write_text(f"""
from orchestra.datasets import JsonlDataset
from orchestra.models import DeterministicModel
from orchestra.partitioners import NaivePartitioner, SizePartitioner
from orchestra.runners import LocalRunner
from orchestra.tasks import EvalTask, InferTask

models = [dict(type=DeterministicModel, abbr='det', batch_size=4{model})]
datasets = [
    dict(type=JsonlDataset, abbr='arith', path={str(data / 'arith.jsonl')!r},
         reader_cfg=dict(input_columns=['question'], output_column='answer'),
         infer_cfg=dict(prompt_template='Q: {{question}}\\nA:', inferencer=dict(type='gen', max_out_len=16)),
         eval_cfg=dict(evaluator=dict(type='numeric_match'))),
    dict(type=JsonlDataset, abbr='pick', path={str(data / 'pick.jsonl')!r},
         reader_cfg=dict(input_columns=['q'], output_column='label'),
         infer_cfg=dict(prompt_template='{{q}}', inferencer=dict(type='loglik', choices_column='choices')),
         eval_cfg=dict(evaluator='accuracy')),
]
infer = dict(
    partitioner=dict(type=SizePartitioner, max_task_size={max_task_size}, gen_task_coef=10, granularity=1),
    runner=dict(type=LocalRunner, max_num_workers=2, retry_backoff_s=0.1{runner}, task=dict(type=InferTask)),
)
eval = dict(
    partitioner=dict(type=NaivePartitioner),
    runner=dict(type=LocalRunner, max_num_workers=2, task=dict(type=EvalTask)),
)
work_dir = {str(tmp_path / 'out')!r}
""")
    return cfg


def orchestra(*args: str | Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return run_argv([sys.executable, "run.py", *map(str, args)], timeout=timeout)  # forked: tests/cli_fork.py


def run_dirs(tmp_path: Path) -> list[Path]:
    out = tmp_path / "out"
    return sorted(p for p in out.iterdir() if p.is_dir()) if out.exists() else []


def events(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]


def started_since_last_run(run: Path) -> list[str]:
    evs = events(run)
    last = max(i for i, e in enumerate(evs) if e["event"] == "run_started")
    return [e["task_id"] for e in evs[last:] if e["event"] == "started"]


def test_run_prints_table_and_writes_run_folder(tmp_path: Path) -> None:
    cfg = write_config(tmp_path)
    res = orchestra(cfg)
    assert res.returncode == 0, res.stderr
    assert "numeric_match" in res.stdout and "1.0000" in res.stdout
    (run,) = run_dirs(tmp_path)
    for name in ("config.py", "events.jsonl", "summary/summary.csv", "summary/summary.md", "summary/summary.json"):
        assert (run / name).exists(), name
    summary = json.loads((run / "summary/summary.json").read_text())
    values = {(r["dataset"], r["metric"]): r["det"] for r in summary["rows"]}
    assert values[("arith", "numeric_match")] == 1.0
    assert values[("pick", "accuracy")] == 1.0
    # arith costs 60 x 10 = 600 > 400: split into two shards, each predictions file complete
    preds = sorted((run / "predictions" / "det").glob("*.jsonl"))
    assert [p.name for p in preds] == ["arith_0.jsonl", "arith_1.jsonl", "pick.jsonl"]
    rows = sum(len(p.read_text().splitlines()) - 1 for p in preds[:2])
    assert rows == 60
    assert not list((run / "predictions").rglob("*.ckpt")), "checkpoints are removed once final"


def test_dry_run_plans_both_stages_and_writes_nothing(tmp_path: Path) -> None:
    cfg = write_config(tmp_path)
    res = orchestra(cfg, "--dry-run")
    assert res.returncode == 0, res.stderr
    assert "[infer] 2 task(s)" in res.stdout and "[eval] 2 task(s)" in res.stdout
    assert "-m orchestra.tasks.infer" in res.stdout and "-m orchestra.tasks.eval" in res.stdout
    assert "cost=" in res.stdout
    assert not (tmp_path / "out").exists()


def test_reuse_latest_launches_nothing_after_a_finished_run(tmp_path: Path) -> None:
    cfg = write_config(tmp_path)
    assert orchestra(cfg).returncode == 0
    res = orchestra(cfg, "-r")
    assert res.returncode == 0, res.stderr
    (run,) = run_dirs(tmp_path)
    assert started_since_last_run(run) == []
    assert "1.0000" in res.stdout


def test_changed_generation_setting_reruns_only_affected_tasks(tmp_path: Path) -> None:
    cfg = write_config(tmp_path)
    assert orchestra(cfg).returncode == 0
    (run,) = run_dirs(tmp_path)
    old_pick = (run / "predictions/det/pick.jsonl").read_text()
    old_arith = (run / "predictions/det/arith_0.jsonl").read_text()
    # max_out_len=1 cuts every answer to one character: arith must be re-run and rescored.
    res = orchestra(cfg, "-r", "latest", "--cfg-options", "datasets.0.infer_cfg.inferencer.max_out_len=1")
    assert res.returncode == 0, res.stderr
    started = started_since_last_run(run)
    assert sorted(started) == ["eval_det_arith", "infer_det_arith_0", "infer_det_arith_1"]
    assert (run / "predictions/det/pick.jsonl").read_text() == old_pick
    assert (run / "predictions/det/arith_0.jsonl").read_text() != old_arith
    summary = json.loads((run / "summary/summary.json").read_text())
    arith = next(r for r in summary["rows"] if r["dataset"] == "arith")
    assert arith["det"] < 0.5  # one-character answers are mostly wrong: old outputs were not mixed in


def test_changed_shard_boundaries_rerun_without_mixing(tmp_path: Path) -> None:
    cfg = write_config(tmp_path)
    assert orchestra(cfg).returncode == 0
    (run,) = run_dirs(tmp_path)
    res = orchestra(cfg, "-r", "--cfg-options", "infer.partitioner.max_task_size=250")
    assert res.returncode == 0, res.stderr
    started = started_since_last_run(run)
    assert "eval_det_arith" in started and not any("pick" in t for t in started)
    # 600 / 250 -> 3 shards; the eval task scored exactly the new shards, all 60 rows once
    result = json.loads((run / "results/det/arith.json").read_text())
    assert result["num_samples"] == 60
    assert result["metrics"]["numeric_match"] == 1.0


def test_always_failing_task_exits_1_and_names_task_and_log(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, model=", fail_always=True", runner=", retry=1")
    res = orchestra(cfg)
    assert res.returncode == 1
    (run,) = run_dirs(tmp_path)
    for task in ("infer_det_arith_0+1", "infer_det_arith_1"):
        log = run / "logs" / "infer" / f"{task}.log"
        assert f"FAILED: infer task {task}" in res.stderr and str(log) in res.stderr
        text = log.read_text()
        assert "attempt 1 of" in text and "attempt 2 of" in text  # retried, log appended
    assert "skipped" in res.stderr.lower() or "SKIPPED" in res.stderr
    assert "- det / arith: infer task" in res.stdout


def test_task_failing_once_is_retried_and_run_succeeds(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, model=", fail_attempts=1", runner=", retry=2")
    res = orchestra(cfg)
    assert res.returncode == 0, res.stderr
    (run,) = run_dirs(tmp_path)
    retries = [e for e in events(run) if e["event"] == "retry"]
    assert len(retries) == 2  # each infer task failed its first attempt once
    log = (run / "logs/infer/infer_det_arith_1.log").read_text()
    assert "configured to fail on attempt 1" in log and "attempt 2 of" in log


def test_hanging_task_is_killed_at_timeout(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, model=", hang=True", runner=", timeout_s=2, kill_grace_s=1")
    t0 = time.monotonic()
    res = orchestra(cfg)
    assert res.returncode == 1
    assert time.monotonic() - t0 < 30
    assert "timed out after 2 s" in res.stderr


def _descendants(pid: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out: set[int] = set()
    stack = [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            out.add(child)
            stack.append(child)
    return out


@pytest.mark.parametrize("reuse_workers", [False, True])
def test_sigint_stops_everything_and_reuse_finishes(tmp_path: Path, reuse_workers: bool) -> None:
    # 12 tasks of ~2.5 s each on 2 workers: the run cannot end before the signal arrives.
    cfg = write_config(tmp_path, model=", delay_s=0.5", runner=f", reuse_workers={reuse_workers}",
                       max_task_size=100, arith_rows=80)
    proc = subprocess.Popen([sys.executable, "run.py", str(cfg)], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    kids: set[int] = set()
    started = False
    while time.monotonic() < deadline and not (started and kids):
        kids |= _descendants(proc.pid)
        runs = run_dirs(tmp_path)
        started = bool(runs) and (runs[0] / "events.jsonl").exists() and \
            any(e["event"] == "started" for e in events(runs[0]))
        assert proc.poll() is None, "the run ended before it could be interrupted"
        time.sleep(0.1)
    assert started and kids, "no task process started"
    time.sleep(0.5)
    kids |= _descendants(proc.pid)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert time.monotonic() - t0 < 10
    # a SIGKILL sent at the end of the grace takes effect when the kernel next runs the process
    wait_for(lambda: not [pid for pid in kids if alive(pid)], 5, "every task process to be gone")
    (run,) = run_dirs(tmp_path)
    assert any(e["event"] == "cancelled" for e in events(run))
    res = orchestra(cfg, "-r")
    assert res.returncode == 0, res.stderr
    assert "1.0000" in res.stdout


def test_sigkill_of_orchestrator_takes_its_tasks_along(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, model=", delay_s=1.0", max_task_size=100, arith_rows=80)
    proc = subprocess.Popen([sys.executable, "run.py", str(cfg)], cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    kids: set[int] = set()
    while time.monotonic() < deadline and len(kids) < 2:
        kids |= _descendants(proc.pid)
        assert proc.poll() is None, "the run ended before it could be killed"
        time.sleep(0.1)
    assert kids
    proc.kill()
    proc.wait()
    # the tasks die with their parent (parent-death signal / watchdog): within seconds, on a busy box too
    wait_for(lambda: not [pid for pid in kids if alive(pid)], 5, "every task process to be gone")


def test_second_orchestrator_on_same_run_folder_is_refused(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, model=", delay_s=0.5")
    first = subprocess.Popen([sys.executable, "run.py", str(cfg)], cwd=REPO, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not list((tmp_path / "out").glob("*/events.jsonl")):
            time.sleep(0.05)
        res = orchestra(cfg, "-r")
        assert res.returncode == 2
        assert "in use by another orchestrator" in res.stderr
        assert len(res.stderr.strip().splitlines()) == 1
    finally:
        first.wait(timeout=60)


def test_gpu_slots_give_each_task_its_own_device(tmp_path: Path) -> None:
    wrapper = "[\"bash\", \"-c\", \"echo SEEN_GPUS=$CUDA_VISIBLE_DEVICES; exec \\\"$@\\\"\", \"_\", \"{task_cmd}\"]"
    cfg = write_config(tmp_path, model=", delay_s=0.3, run_cfg=dict(num_gpus=1)",
                       runner=f", gpus=['0', '1'], template={wrapper}", max_task_size=150)
    res = orchestra(cfg)
    assert res.returncode == 0, res.stderr
    (run,) = run_dirs(tmp_path)
    seen = {}
    for log in (run / "logs/infer").glob("*.log"):
        lines = [ln for ln in log.read_text().splitlines() if ln.startswith("SEEN_GPUS=")]
        assert len(lines) == 1
        seen[log.stem] = lines[0].split("=", 1)[1]
    assert len(seen) >= 4 and set(seen.values()) <= {"0", "1"}
    # two tasks at a time on two GPUs: the runner never gave one GPU to two running tasks
    starts = {e["task_id"]: e for e in events(run) if e["event"] == "started" and e["stage"] == "infer"}
    assert {tuple(e["resources"]["gpu_ids"]) for e in starts.values()} <= {("0",), ("1",)}


def test_gpu_task_without_gpus_fails_clearly(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, model=", run_cfg=dict(num_gpus=1)", runner=", gpus=[]")
    res = orchestra(cfg)
    assert res.returncode == 1
    assert "needs 1 GPU(s) but this runner has 0" in res.stderr


def test_warm_workers_load_the_model_once_per_worker(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, model=", load_s=1.0", runner=", reuse_workers=True",
                       max_task_size=100, arith_rows=80)
    res = orchestra(cfg)
    assert res.returncode == 0, res.stderr
    (run,) = run_dirs(tmp_path)
    logs = list((run / "logs/infer").glob("*.log"))
    assert len(logs) >= 6
    loads = []
    for log in logs:
        for line in log.read_text().splitlines():
            if " ready in " in line:
                loads.append(float(line.split(" ready in ")[1].split()[0]))
    assert len(loads) == len(logs)
    assert sum(1 for s in loads if s >= 0.9) <= 2  # at most one real load per worker
    assert len(list((run / "logs/workers").glob("*.log"))) <= 3  # 2 infer workers (+eval has its own runner)


def test_viz_rebuilds_summary_without_touching_the_run(tmp_path: Path) -> None:
    cfg = write_config(tmp_path)
    assert orchestra(cfg).returncode == 0
    (run,) = run_dirs(tmp_path)
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file() and "summary" not in p.parts}
    (run / "summary/summary.csv").unlink()
    res = orchestra(cfg, "--mode", "viz")
    assert res.returncode == 0, res.stderr
    assert "numeric_match" in res.stdout and (run / "summary/summary.csv").exists()
    after = {p: p.read_bytes() for p in run.rglob("*") if p.is_file() and "summary" not in p.parts}
    assert before == after


def test_viz_without_a_run_folder_is_a_usage_error(tmp_path: Path) -> None:
    res = orchestra(write_config(tmp_path), "--mode", "viz")
    assert res.returncode == 2
    assert res.stderr.strip().count("\n") == 0 and "no run folder" in res.stderr


def test_eval_mode_rescoring_reuses_predictions(tmp_path: Path) -> None:
    cfg = write_config(tmp_path)
    assert orchestra(cfg, "--mode", "infer").returncode == 0
    (run,) = run_dirs(tmp_path)
    assert not (run / "results").exists() or not list((run / "results").rglob("*.json"))
    res = orchestra(cfg, "--mode", "eval")
    assert res.returncode == 0, res.stderr
    assert sorted(started_since_last_run(run)) == ["eval_det_arith", "eval_det_pick"]


def test_debug_runs_tasks_in_process_and_shows_tracebacks(tmp_path: Path) -> None:
    cfg = write_config(tmp_path)
    res = orchestra(cfg, "--debug")
    assert res.returncode == 0, res.stderr
    (run,) = run_dirs(tmp_path)
    assert not list((run / "logs").rglob("*.log")), "--debug runs no task process, so writes no task log"
    assert json.loads((run / "results/det/arith.json").read_text())["metrics"]["numeric_match"] == 1.0
    (tmp_path / "bad").mkdir()
    res = orchestra(write_config(tmp_path / "bad", model=", fail_always=True"), "--debug")
    assert res.returncode != 0
    assert "Traceback" in res.stderr and "configured to fail" in res.stderr


def test_run_folders_are_claimed_and_latest_ignores_other_folders(tmp_path: Path) -> None:
    cfg = write_config(tmp_path)
    first = subprocess.Popen([sys.executable, "run.py", str(cfg)], cwd=REPO, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    second = subprocess.Popen([sys.executable, "run.py", str(cfg)], cwd=REPO, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    for proc in (first, second):
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err  # started together, neither found the other's folder locked
    runs = run_dirs(tmp_path)
    assert len(runs) == 2
    (tmp_path / "out" / "zz_not_a_run").mkdir()
    res = orchestra(cfg, "-r")
    assert res.returncode == 0, res.stderr
    assert f"run folder: {runs[-1]}" in res.stderr
    assert not list((tmp_path / "out" / "zz_not_a_run").iterdir())


def test_a_dry_run_writes_no_run_folder_but_keeps_what_it_learned_of_the_data(tmp_path: Path) -> None:
    """Issue 40: what planning learns (row counts, file digests) is cached by a dry run too, so the
    run after it does not read the same data again; the run folder is still not made."""
    cfg = write_config(tmp_path)
    env = {**os.environ, "ORCHESTRA_CACHE_DIR": str(tmp_path / "cache")}
    res = run_argv([sys.executable, "run.py", str(cfg), "--dry-run"], env=env, timeout=60)
    assert res.returncode == 0, res.stderr
    assert not (tmp_path / "out").exists()
    facts = json.loads((tmp_path / "cache" / "dataset_info.json").read_text())
    assert sorted(f["num_rows"] for f in facts.values()) == [20, 60], facts  # pick.jsonl and arith.jsonl


def test_ctrl_c_in_debug_mode_interrupts_the_running_task(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, model=", delay_s=1.0")
    proc = subprocess.Popen([sys.executable, "run.py", str(cfg), "--debug"], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not list((tmp_path / "out").glob("*/events.jsonl")):
        time.sleep(0.05)
    time.sleep(1.0)  # inside the first task: each batch of the model takes 1 s
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert "CANCELLED: infer task" in err


def test_eval_starts_as_soon_as_its_predictions_are_done(tmp_path: Path) -> None:
    """The eval of a (model, dataset) overlaps the rest of inference (DESIGN: stages overlap)."""
    cfg = write_config(tmp_path, max_task_size=100000)
    text = cfg.read_text().replace(
        "models = [dict(type=DeterministicModel, abbr='det', batch_size=4)]",
        "models = [dict(type=DeterministicModel, abbr='det', batch_size=4),\n"
        "          dict(type=DeterministicModel, abbr='slow', path='slow', batch_size=4, load_s=4.0)]")
    cfg.write_text(text)
    res = orchestra(cfg)
    assert res.returncode == 0, res.stderr
    (run,) = run_dirs(tmp_path)
    evs = events(run)
    slow_infer_done = max(e["ts"] for e in evs if e["event"] == "done" and e["task_id"].startswith("infer_slow"))
    first_eval_start = min(e["ts"] for e in evs if e["event"] == "started" and e["stage"] == "eval")
    assert first_eval_start < slow_infer_done, "an eval task waited for all of inference"
    no_overlap = tmp_path / "seq"
    no_overlap.mkdir()
    cfg2 = write_config(no_overlap, max_task_size=100000)
    cfg2.write_text(text.replace(str(tmp_path / "out"), str(no_overlap / "out")).replace(
        "eval = dict(\n", "eval = dict(overlap=False,\n"))
    assert orchestra(cfg2).returncode == 0
    (run2,) = run_dirs(no_overlap)
    evs2 = events(run2)
    last_infer_end = max(e["ts"] for e in evs2 if e["event"] == "done" and e["stage"] == "infer")
    assert min(e["ts"] for e in evs2 if e["event"] == "started" and e["stage"] == "eval") >= last_infer_end


def test_sigterm_ends_a_task_stuck_in_its_model_within_seconds(tmp_path: Path) -> None:
    """SIGTERM to an infer task whose model is stuck in a call that cancelling cannot interrupt
    (here: loading) still ends the process within seconds: the stop is not left to a SIGKILL."""
    cfg = write_config(tmp_path, model=", hang=True", runner=", timeout_s=600")
    proc = subprocess.Popen([sys.executable, "run.py", str(cfg), "--mode", "infer"], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        tasks: set[int] = set()
        while time.monotonic() < deadline and not tasks:
            time.sleep(0.2)
            for pid in _descendants(proc.pid):
                try:
                    with open(f"/proc/{pid}/cmdline", "rb") as f:
                        if b"orchestra.tasks.infer" in f.read():
                            tasks.add(pid)
                except OSError:
                    pass
        assert tasks, "no infer task process started"
        time.sleep(1.0)  # the task is inside the model's load now
        for pid in tasks:
            os.kill(pid, signal.SIGTERM)
        # STOP_GRACE_S is 1.5 s; the deadline is a hang guard on a loaded machine
        wait_for(lambda: not any(alive(pid) for pid in tasks), 10, "the task to end on SIGTERM")
    finally:
        proc.send_signal(signal.SIGINT)  # stops the rest of the run (a retry of the task) too
        try:
            proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
