"""Heavy scoring through the real CLI: sandboxed code and a judge model, end to end.

The CLI runs as a subprocess with real task processes; models are the deterministic model
or the repository's OpenAI-compatible test server; programs run in real sandboxes.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import run_argv, server_settled, wait_for
from tests.sandbox.conftest import no_sandbox_process_left, sandbox_processes, slot_dirs

REPO = Path(__file__).resolve().parents[2]


def orchestra(*args: str | Path, env: dict[str, str] | None = None,
              timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return run_argv([sys.executable, "run.py", *map(str, args)], timeout=timeout, env=env)  # tests/cli_fork.py


def only_run(tmp_path: Path) -> Path:
    (run,) = sorted(p for p in (tmp_path / "out").iterdir() if p.is_dir())
    return run


def events(run: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def code_config(tmp_path: Path, rows: list[dict[str, Any]], evaluator: str = "dict(type='code_exec')",
                output_column: str = "tests") -> Path:
    data = write_jsonl(tmp_path / "code.jsonl", rows)
    cfg = tmp_path / "cfg.py"
    cfg.write_text(f"""
from orchestra.datasets import JsonlDataset
from orchestra.models import DeterministicModel

models = [dict(type=DeterministicModel, abbr='det')]
datasets = [dict(type=JsonlDataset, abbr='code', path={str(data)!r},
                 reader_cfg=dict(input_columns=['question'], output_column={output_column!r}),
                 infer_cfg=dict(prompt_template='Q: {{question}}\\nA:', inferencer=dict(type='gen', max_out_len=16)),
                 eval_cfg=dict(evaluator={evaluator}))]
work_dir = {str(tmp_path / 'out')!r}
""")
    return cfg


def answer_rows(n: int, right: int, prefix: str = "") -> list[dict[str, Any]]:
    """Rows 'What is i + 1?': the deterministic model answers i + 1; the first ``right`` rows'
    tests expect that, the others expect something else."""
    rows = []
    for i in range(n):
        expected = i + 1 if i < right else i + 2
        rows.append({"question": f"What is {i} + 1?", "plain": str(i + 1),
                     "tests": {"prompt": f"{prefix}answer = ", "entry_point": None,
                               "test": f"assert answer == {expected}\n"}})
    return rows


def test_code_execution_end_to_end(tmp_path: Path) -> None:
    res = orchestra(code_config(tmp_path, answer_rows(4, right=3)))
    assert res.returncode == 0, res.stderr
    run = only_run(tmp_path)
    results = json.loads((run / "results/det/code.json").read_text())
    assert results["metrics"] == {"pass@1": 0.75}
    assert results["scorer"]["isolation"] == "bwrap" and results["scorer"]["network_isolated"] is True
    assert results["statuses"] == {"ok": 3, "failed": 1}
    log = next((run / "logs/eval").glob("*.log")).read_text()
    assert "sandbox isolation=bwrap (network isolated)" in log and "max_sandboxes=" in log
    evs = events(run)
    scorer = [e for e in evs if e["event"] == "scorer"]
    assert len(scorer) == 1 and scorer[0]["isolation"] == "bwrap" and scorer[0]["dataset"] == "code"
    progress = [e for e in evs if e["event"] == "progress" and e.get("stage") == "eval"]
    assert progress and progress[-1]["samples_done"] == 4 and "max_sandboxes" in progress[-1]
    assert not list((run / "results").rglob("*.ckpt*"))
    details = [json.loads(line) for line in (run / "results/det/code.details.jsonl").read_text().splitlines()]
    assert [d["passed"] for d in details] == [True, True, True, False]
    assert "AssertionError" in details[3]["stderr"]
    no_sandbox_process_left()


def test_bundled_humaneval_and_mbpp_configs_run(tmp_path: Path) -> None:
    cfg = tmp_path / "cfg.py"
    cfg.write_text(f"""
from mmengine.config import read_base
from orchestra.models import DeterministicModel
with read_base():
    from .configs.datasets.humaneval import humaneval_datasets
    from .configs.datasets.mbpp import mbpp_datasets
models = [dict(type=DeterministicModel, abbr='det')]
datasets = [{{**d, 'reader_cfg': {{**d['reader_cfg'], 'test_range': '[0:3]'}}}}
            for d in (humaneval_datasets[0], mbpp_datasets[0])]
work_dir = {str(tmp_path / 'out')!r}
""")
    (tmp_path / "configs").symlink_to(REPO / "configs")
    res = orchestra(cfg)
    assert res.returncode == 0, res.stderr
    run = only_run(tmp_path)
    for name in ("humaneval", "mbpp"):
        results = json.loads((run / f"results/det/{name}.json").read_text())
        # the deterministic model echoes a word: real prompts, real tests, all fail
        assert results["metrics"] == {"pass@1": 0.0} and results["num_samples"] == 3


def test_ctrl_c_stops_running_sandboxes_within_seconds(tmp_path: Path) -> None:
    rows = answer_rows(4, right=4, prefix="import time\ntime.sleep(600)\n")
    cfg = code_config(tmp_path, rows, evaluator="dict(type='code_exec', timeout_s=900)")
    proc = subprocess.Popen([sys.executable, "run.py", str(cfg)], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(3000):
            if len(sandbox_processes()) >= 2:
                break
            time.sleep(0.02)
        assert sandbox_processes(), "no sandbox started"
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0
    # SIGKILL takes effect when each process next runs (the deadline was 5 s)
    wait_for(lambda: sandbox_processes() == [], 30, "every sandbox process to be gone")
    assert slot_dirs(Path(os.environ["ORCHESTRA_LOCK_DIR"])) == []  # the task removed them before it exited


def test_unavailable_isolation_fails_the_task_in_one_line(tmp_path: Path) -> None:
    cfg = code_config(tmp_path, answer_rows(2, right=2))
    env = {**os.environ, "PATH": str(tmp_path / "empty")}  # neither bwrap, unshare nor setpriv
    res = orchestra(cfg, env=env)
    assert res.returncode == 1
    run = only_run(tmp_path)
    log = next((run / "logs/eval").glob("*.log")).read_text()
    failed = [line for line in log.splitlines() if "FAILED" in line]
    assert len(failed) == 1 and "isolation 'bwrap' needs the 'bwrap' program" in failed[0]
    assert "allow_unisolated=True" in failed[0] and "Traceback" not in log
    assert not (run / "results/det/code.json").exists()


def test_a_dataset_without_tests_fails_in_one_line(tmp_path: Path) -> None:
    cfg = code_config(tmp_path, answer_rows(2, right=2), output_column="plain")
    res = orchestra(cfg)
    assert res.returncode == 1
    log = next((only_run(tmp_path) / "logs/eval").glob("*.log")).read_text()
    failed = [line for line in log.splitlines() if "FAILED" in line]
    assert len(failed) == 1 and "2/2 samples could not be scored" in failed[0] and "no tests" in failed[0]


@pytest.mark.parametrize("evaluator, fragment, where", [
    ("dict(type='code_exec', isolation='magic')", "'magic' is not valid; valid: auto, bwrap, unshare, none",
     "eval_cfg.evaluator.isolation"),
    ("dict(type='code_exec', isolation='none')", "set allow_unisolated=True", "eval_cfg.evaluator"),
    ("dict(type='code_exec', timeout_s=0)", "timeout_s must be a number > 0", "eval_cfg.evaluator"),
    ("dict(type='judge')", "missing required key 'judge'", "eval_cfg.evaluator"),
    ("dict(type='judge', judge=dict(type='OpenAIAPI', path='j', base_url='http://127.0.0.1:9/v1', max_conn=2))",
     "unknown key 'max_conn' for OpenAIAPI", "eval_cfg.evaluator.judge"),
    ("dict(type='judge', judge=dict(type='NoSuchJudge'))", "unknown model type 'NoSuchJudge'",
     "eval_cfg.evaluator.judge"),
    ("dict(type='judge', judge=dict(type='OpenAIAPI', path='j'), prompt_template='{answr}')",
     "unknown field {answr}", "eval_cfg.evaluator"),
])
def test_bad_scoring_configs_are_one_line_and_exit_2(tmp_path: Path, evaluator: str, fragment: str,
                                                     where: str) -> None:
    res = orchestra(code_config(tmp_path, answer_rows(1, right=1), evaluator=evaluator))
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0] and where in lines[0], lines


def test_code_exec_without_a_tests_column_is_a_config_error(tmp_path: Path) -> None:
    data = write_jsonl(tmp_path / "d.jsonl", [{"question": "What is 1 + 1?"}])
    cfg = tmp_path / "cfg.py"
    cfg.write_text(f"""
from orchestra.datasets import JsonlDataset
from orchestra.models import DeterministicModel
models = [dict(type=DeterministicModel, abbr='det')]
datasets = [dict(type=JsonlDataset, abbr='d', path={str(data)!r}, reader_cfg=dict(input_columns=['question']),
                 infer_cfg=dict(prompt_template='{{question}}'), eval_cfg=dict(evaluator='code_exec'))]
""")
    res = orchestra(cfg)
    assert res.returncode == 2 and "code_exec needs the dataset's tests" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


def judge_config(tmp_path: Path, server: Any, rows: int, max_connections: int = 2) -> Path:
    data = write_jsonl(tmp_path / "q.jsonl", [{"question": f"Pick {1 + i % 9}", "ref": "x"} for i in range(rows)])
    cfg = tmp_path / "cfg.py"
    cfg.write_text(f"""
from orchestra.datasets import JsonlDataset
from orchestra.models import OpenAIAPI
models = [dict(type=OpenAIAPI, abbr='api', path='answer-model', base_url={server.base_url!r}, key_env=None)]
_judge = dict(type=OpenAIAPI, path='judge-model', base_url={server.base_url!r}, key_env=None,
              max_connections={max_connections})
datasets = [dict(type=JsonlDataset, abbr='q', path={str(data)!r},
                 reader_cfg=dict(input_columns=['question'], output_column='ref'),
                 infer_cfg=dict(prompt_template='{{question}}'),
                 eval_cfg=dict(evaluator=dict(type='judge', judge=_judge,
                                              prompt_template='JUDGE Rating: [[{{answer}}]]')))]
work_dir = {str(tmp_path / 'out')!r}
""")
    return cfg


def _writer_gone(lock: Path) -> bool:
    fd = os.open(lock, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False
    finally:
        os.close(fd)
    return True


def test_a_killed_judge_run_resumes_without_judging_finished_samples_again(tmp_path: Path, server: Any) -> None:
    n = 30
    cfg = judge_config(tmp_path, server, rows=n)
    assert orchestra(cfg, "--mode", "infer").returncode == 0
    run = only_run(tmp_path)
    server.reset()
    server.configure(latency_s=0.25)
    ckpt = run / "results/api/q.json.ckpt"
    proc = subprocess.Popen([sys.executable, "run.py", str(cfg), "-r", "--mode", "eval"], cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(3000):
            if ckpt.exists() and len(ckpt.read_text().splitlines()) >= 9:
                break
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    # the eval task dies with the orchestrator (parent-death signal): its checkpoint is final once
    # its lock is free (before: 5 s, then read whatever the checkpoint held)
    wait_for(lambda: _writer_gone(Path(str(ckpt) + ".lock")), 30, "the killed eval task to release its checkpoint")
    kept = len(ckpt.read_text().splitlines()) - 1
    first = server_settled(server)["requests"]  # what was in flight at the kill is counted
    assert 8 <= kept < n and kept <= first <= kept + 2  # at most the judge's 2 connections were in flight
    res = orchestra(cfg, "-r", "--mode", "eval")
    assert res.returncode == 0, res.stderr
    assert server.stats()["requests"] - first == n - kept  # only the samples without a verdict
    log = (run / "logs/eval/eval_api_q.log").read_text()
    assert f"{n} samples, {kept} from checkpoint, {n - kept} to score" in log
    results = json.loads((run / "results/api/q.json").read_text())
    expected = sum(1 + i % 9 for i in range(n)) / n  # the test server's "grade" is the answer itself
    assert results["metrics"]["judge_score"] == pytest.approx(expected) and results["metrics"]["judge_unparsed"] == 0


def test_judge_settings_are_part_of_the_results_hash(tmp_path: Path, server: Any) -> None:
    cfg = judge_config(tmp_path, server, rows=3)
    assert orchestra(cfg).returncode == 0
    run = only_run(tmp_path)

    def eval_starts() -> int:
        return [e["task_id"] for e in events(run) if e["event"] == "started"].count("eval_api_q")

    # how fast the judge runs changes no verdict: the results are reused
    res = orchestra(cfg, "-r", "--cfg-options", "datasets.0.eval_cfg.evaluator.judge.max_connections=7")
    assert res.returncode == 0 and eval_starts() == 1, res.stderr
    # another judge model: judged again, and only judged (the predictions are reused)
    res = orchestra(cfg, "-r", "--cfg-options", "datasets.0.eval_cfg.evaluator.judge.path=another-judge")
    assert res.returncode == 0 and eval_starts() == 2, res.stderr
    assert [e["task_id"] for e in events(run) if e["event"] == "started"].count("infer_api_q") == 1


def test_several_answers_per_row_give_pass_at_k(tmp_path: Path) -> None:
    cfg = code_config(tmp_path, answer_rows(4, right=3), evaluator="dict(type='code_exec', k=[1, 2, 3])")
    cfg.write_text(cfg.read_text().replace("inferencer=dict(type='gen', max_out_len=16)",
                                           "inferencer=dict(type='gen', max_out_len=16, n=2, seed=7)"))
    res = orchestra(cfg)
    assert res.returncode == 0, res.stderr
    run = only_run(tmp_path)
    preds = [json.loads(line) for line in (run / "predictions/det/code.jsonl").read_text().splitlines()[1:]]
    assert [p["prediction"] for p in preds] == [["1", "1"], ["2", "2"], ["3", "3"], ["4", "4"]]
    results = json.loads((run / "results/det/code.json").read_text())
    assert results["metrics"] == {"pass@1": 0.75, "pass@2": 0.75}  # 2 answers each: no pass@3
    bad = code_config(tmp_path, answer_rows(1, right=1))
    bad.write_text(bad.read_text().replace("max_out_len=16)", "max_out_len=16, n=0)"))
    res = orchestra(bad)
    assert res.returncode == 2 and "infer_cfg.inferencer.n: expected an integer >= 1" in res.stderr
