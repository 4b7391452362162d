"""End to end with an API model: ``python run.py`` against a real local OpenAI-compatible server."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import run_argv, server_settled

REPO = Path(__file__).resolve().parents[2]


def write_data(folder: Path, n: int, bad: tuple[int, ...] = (), seed: int = 0) -> tuple[Path, list[str]]:
    rng = random.Random(seed)
    rows, expected = [], []
    for i in range(n):
        a, b = rng.randint(1, 999), rng.randint(1, 999)
        q = f"#{i}: {a} + {b}" + (" BAD_REQUEST" if i in bad else "")
        rows.append({"question": q, "answer": a + b})
        expected.append(str(a + b))
    path = folder / f"arith_{n}.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path, expected


def write_config(folder: Path, base_url: str, data: Path, *, key_env: str | None = None, connections: int = 8,
                 retry: int = 0, tolerance: float = 0.0, chat: bool = False, workers: int = 1,
                 max_task_size: int = 100000, reuse_workers: bool = False) -> Path:
    chat_ds = ""
    if chat:
        chat_path = str(REPO / "configs" / "data" / "chat_arith.jsonl")
        chat_ds = (f", dict(type=JsonlDataset, abbr='chat', path={chat_path!r}, "
                   "reader_cfg=dict(input_columns=['turns'], output_column='answer'), "
                   "infer_cfg=dict(prompt_template='', inferencer=dict(type='chat', turns_column='turns', "
                   "max_out_len=16)), eval_cfg=dict(evaluator=dict(type='numeric_match')))")
    cfg = folder / "eval_api.py"
    cfg.write_text(f"""
from orchestra.datasets import JsonlDataset
from orchestra.models import OpenAIAPI
from orchestra.partitioners import NaivePartitioner, SizePartitioner
from orchestra.runners import LocalRunner
from orchestra.tasks import EvalTask, InferTask

models = [dict(type=OpenAIAPI, abbr='api', path='test-model', base_url={base_url!r}, key_env={key_env!r},
               max_connections={connections}, max_out_len=16)]
datasets = [dict(type=JsonlDataset, abbr='arith', path={str(data)!r},
                 reader_cfg=dict(input_columns=['question'], output_column='answer'),
                 infer_cfg=dict(prompt_template='{{question}}', inferencer=dict(type='gen', max_out_len=16)),
                 eval_cfg=dict(evaluator=dict(type='numeric_match'))){chat_ds}]
infer = dict(partitioner=dict(type=SizePartitioner, max_task_size={max_task_size}, gen_task_coef=1),
             runner=dict(type=LocalRunner, max_num_workers={workers}, retry={retry}, retry_backoff_s=0.1,
                         reuse_workers={reuse_workers}, task=dict(type=InferTask, error_tolerance={tolerance})))
eval = dict(partitioner=dict(type=NaivePartitioner),
            runner=dict(type=LocalRunner, max_num_workers=2, task=dict(type=EvalTask)))
work_dir = {str(folder / 'outputs')!r}
""")
    return cfg


def orchestra(*args: Any, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return run_argv([sys.executable, "run.py", *map(str, args)], timeout=timeout,
                    env={**os.environ, **(env or {})})  # forked: tests/cli_fork.py


def latest_run(folder: Path) -> Path:
    return sorted((folder / "outputs").iterdir())[-1]


def predictions(run: Path, dataset: str = "arith") -> dict[int, dict[str, Any]]:
    out: dict[int, dict[str, Any]] = {}
    for path in sorted((run / "predictions" / "api").glob(f"{dataset}*.jsonl")):
        for line in path.read_text().splitlines()[1:]:
            rec = json.loads(line)
            out[rec["id"]] = rec
    return out


def test_run_answers_right_and_the_key_never_lands_on_disk(server: Any, tmp_path: Path) -> None:
    secret = "sk-e2e-" + "".join(random.choice("abcdef0123456789") for _ in range(24))
    server.configure(api_key=secret, latency_s=0.01)
    data, expected = write_data(tmp_path, 40)
    cfg = write_config(tmp_path, server.base_url, data, key_env="ORCHESTRA_E2E_KEY", chat=True)
    res = orchestra(cfg, env={"ORCHESTRA_E2E_KEY": secret})
    assert res.returncode == 0, res.stderr + res.stdout
    run = latest_run(tmp_path)
    preds = predictions(run)
    assert [preds[i]["prediction"] for i in range(40)] == expected
    chat = predictions(run, "chat")
    assert len(chat) == 20 and all(len(r["prediction"]) == 3 for r in chat.values())
    assert server.stats()["by_status"] == {"200": 40 + 60}
    # The key: not in the run folder (config, task specs, logs, events, outputs), nor in output.
    for path in run.rglob("*"):
        if path.is_file():
            assert secret.encode() not in path.read_bytes(), path
    assert secret not in res.stdout + res.stderr
    assert "ORCHESTRA_E2E_KEY" in (run / "config.py").read_text()  # only the variable's name
    progress = [json.loads(x) for x in (run / "events.jsonl").read_text().splitlines()]
    progress = [e for e in progress if e["event"] == "progress"]
    # one task ran both datasets together: 40 samples and 20 conversations (60 requests)
    assert progress and progress[-1]["samples_done"] == 60 and progress[-1]["samples_total"] == 60
    assert progress[-1]["requests_done"] == 100
    assert {"in_flight", "requests_done", "rate_limited", "retries", "errors", "samples_failed"} <= set(progress[-1])


def test_wrong_key_fails_every_sample_without_showing_it(server: Any, tmp_path: Path) -> None:
    wrong = "sk-wrong-" + "7" * 20
    server.configure(api_key="sk-right")  # its 401 message echoes the key it was sent
    data, _ = write_data(tmp_path, 5)
    cfg = write_config(tmp_path, server.base_url, data, key_env="ORCHESTRA_E2E_KEY")
    res = orchestra(cfg, "--mode", "infer", env={"ORCHESTRA_E2E_KEY": wrong})
    assert res.returncode == 1
    run = latest_run(tmp_path)
    assert "HTTP 401" in (run / "logs" / "infer" / "infer_api_arith.log").read_text()
    for path in run.rglob("*"):
        if path.is_file():
            assert wrong.encode() not in path.read_bytes(), path
    assert server.stats()["by_status"] == {"401": 5}  # a 401 is final: no retries


def test_failed_samples_fail_the_task_and_the_rerun_sends_only_them(server: Any, tmp_path: Path) -> None:
    data, expected = write_data(tmp_path, 20, bad=(3, 11))
    cfg = write_config(tmp_path, server.base_url, data)
    res = orchestra(cfg, "--mode", "infer")
    assert res.returncode == 1
    log = (latest_run(tmp_path) / "logs" / "infer" / "infer_api_arith.log").read_text()
    assert "2/20 samples failed" in log and "HTTP 400" in log and "contains BAD_REQUEST" in log
    first = server.stats()["per_prompt"]
    assert len(first) == 20 and set(first.values()) == {1}
    server.configure(bad_marker="NOTHING_IS_BAD")
    res = orchestra(cfg, "--mode", "infer", "-r", "latest")
    assert res.returncode == 0, res.stderr
    counts = server.stats()["per_prompt"]  # configure() reset the counters
    assert sorted(counts) == sorted(k for k in first if "BAD_REQUEST" in k) and set(counts.values()) == {1}
    preds = predictions(latest_run(tmp_path))
    assert [preds[i]["prediction"] for i in range(20)] == expected


def test_error_tolerance_lets_a_few_failures_through(server: Any, tmp_path: Path) -> None:
    data, _ = write_data(tmp_path, 20, bad=(5,))
    cfg = write_config(tmp_path, server.base_url, data, tolerance=0.1)
    res = orchestra(cfg, "--mode", "infer")
    assert res.returncode == 0, res.stderr
    preds = predictions(latest_run(tmp_path))
    assert "HTTP 400" in preds[5]["error"] and sum("error" in r for r in preds.values()) == 1


@pytest.mark.slow
def test_two_tasks_of_one_model_share_max_connections(server: Any, tmp_path: Path) -> None:
    server.configure(latency_s=0.05)
    data, expected = write_data(tmp_path, 64)
    cfg = write_config(tmp_path, server.base_url, data, connections=3, workers=2, max_task_size=32)
    res = orchestra(cfg, "--mode", "infer")
    assert res.returncode == 0, res.stderr
    run = latest_run(tmp_path)
    assert len(list((run / "tasks").glob("infer_*.py"))) == 2  # two task processes at once
    preds = predictions(run)
    assert [preds[i]["prediction"] for i in range(64)] == expected
    assert server.stats()["peak_concurrency"] == 3


def test_a_warm_worker_runs_several_tasks_with_one_model(server: Any, tmp_path: Path) -> None:
    server.configure(rate=400.0, burst=4.0)  # a few 429s too, across the tasks' event loops
    data, expected = write_data(tmp_path, 48)
    cfg = write_config(tmp_path, server.base_url, data, connections=4, max_task_size=16, reuse_workers=True)
    res = orchestra(cfg, "--mode", "infer")
    assert res.returncode == 0, res.stderr
    run = latest_run(tmp_path)
    assert len(list((run / "tasks").glob("infer_*.py"))) == 3
    preds = predictions(run)
    assert [preds[i]["prediction"] for i in range(48)] == expected
    assert server.stats()["by_status"]["200"] == 48


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


@pytest.mark.slow
def test_sigkill_then_resume_sends_no_completed_sample_again(server: Any, tmp_path: Path) -> None:
    server.configure(latency_s=0.1)
    n = 200
    data, expected = write_data(tmp_path, n)
    cfg = write_config(tmp_path, server.base_url, data, connections=10)
    proc = subprocess.Popen([sys.executable, "run.py", str(cfg), "--mode", "infer"], cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while server.stats()["by_status"].get("200", 0) < n // 2:
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.01)
    for pid in [*reversed(_descendants(proc.pid)), proc.pid]:  # the task, then the orchestrator
        os.kill(pid, signal.SIGKILL)
    proc.wait()
    before = server_settled(server)["per_prompt"]  # the server answers what was in flight; nobody reads it
    ckpt = next((latest_run(tmp_path) / "predictions" / "api").glob("*.ckpt"))
    rows = [json.loads(x)["question"] for x in data.read_text().splitlines()]
    saved = {rows[json.loads(x)["id"]] for x in ckpt.read_text().splitlines()[1:]}
    assert n // 4 < len(saved) < n
    res = orchestra(cfg, "--mode", "infer", "-r", "latest")
    assert res.returncode == 0, res.stderr
    after = server.stats()["per_prompt"]
    assert all(after[q] == before[q] == 1 for q in saved)  # not one checkpointed sample sent again
    resent = [q for q in before if after[q] > before[q]]
    assert len(resent) <= 10  # at most what was in flight (max_connections)
    assert sum(after.values()) == n + len(resent)
    preds = predictions(latest_run(tmp_path))
    assert [preds[i]["prediction"] for i in range(n)] == expected


def test_bad_api_settings_are_config_errors(tmp_path: Path) -> None:
    data, _ = write_data(tmp_path, 3)
    cfg = write_config(tmp_path, "localhost:8000/v1", data)
    res = orchestra(cfg, "--dry-run")
    assert res.returncode == 2
    assert "models[0]: base_url must start with http:// or https://" in res.stderr


def test_a_500_then_200_is_sent_twice_and_its_sample_written_once(server: Any, tmp_path: Path) -> None:
    """Rows whose first request is answered 500: each is retried once (at once: the endpoint
    answers most requests) and its sample is written once; no other prompt is sent twice."""
    data, expected = write_data(tmp_path, 30)
    rows = [json.loads(line) for line in data.read_text().splitlines()]
    for i in (0, 7, 29):
        rows[i]["question"] += " FAIL_ONCE"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    res = orchestra(write_config(tmp_path, server.base_url, data, connections=4))
    assert res.returncode == 0, res.stderr[-3000:]
    counts = server.stats()["per_prompt"]
    assert {k: n for k, n in counts.items() if n != 1} == {rows[i]["question"]: 2 for i in (0, 7, 29)}
    assert server.stats()["by_status"] == {"200": 30, "500": 3}
    run = latest_run(tmp_path)
    ids = [json.loads(line)["id"] for path in (run / "predictions" / "api").glob("arith*.jsonl")
           for line in path.read_text().splitlines()[1:]]
    assert sorted(ids) == list(range(30))  # each sample once
    assert [predictions(run)[i]["prediction"] for i in range(30)] == expected
    events = [json.loads(x) for x in (run / "events.jsonl").read_text().splitlines()]
    assert [e for e in events if e["event"] == "progress"][-1]["retries"] == 3
