"""CodeExecEvaluator on real data, in real sandboxes: canonical solutions, hostile programs,
bad input, several samples per problem."""

from __future__ import annotations

import json
import math
import os
import textwrap
from pathlib import Path
from typing import Any

import pytest

from orchestra.datasets.olmo import OlmoEvalDataset
from orchestra.evaluators.code import CodeExecEvaluator
from tests.sandbox.conftest import no_sandbox_process_left, slot_dirs
from tests.sandbox.test_sandbox_isolation import Listener


def bundled(name: str) -> list[dict[str, Any]]:
    ds = OlmoEvalDataset(abbr=name, path=name, reader_cfg=dict(input_columns=[], output_column="tests"),
                         infer_cfg={})
    return ds.rows()


def records(completions: list[Any], tests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"id": i, "prediction": c, "gold": t} for i, (c, t) in enumerate(zip(completions, tests))]


def test_humaneval_canonical_solutions_all_pass(tmp_path: Path) -> None:
    rows = bundled("humaneval")
    assert len(rows) == 164
    metrics, details = CodeExecEvaluator().score(records([r["canonical_solution"] for r in rows],
                                                         [r["tests"] for r in rows]))
    failed = [(d["id"], d.get("status"), d.get("stderr", "")[-200:]) for d in details if not d.get("passed")]
    assert failed == [] and metrics == {"pass@1": 1.0}


def test_humaneval_wrong_solutions_fail() -> None:
    rows = bundled("humaneval")[:8]
    metrics, details = CodeExecEvaluator().score(records(["    return None\n"] * 8, [r["tests"] for r in rows]))
    assert metrics["pass@1"] == 0.0 and {d["status"] for d in details} == {"failed"}


@pytest.mark.slow
def test_mbpp_canonical_solutions_all_pass() -> None:
    rows = bundled("mbpp")
    assert len(rows) == 500
    # MBPP/123 (amicable numbers below 10,000) alone takes 3-7 CPU seconds: room for a busy machine.
    evaluator = CodeExecEvaluator(timeout_s=60)
    metrics, details = evaluator.score(records([r["code"] for r in rows], [r["tests"] for r in rows]))
    failed = [(d["id"], d.get("status"), d.get("stderr", "")[-200:]) for d in details if not d.get("passed")]
    assert failed == [] and metrics == {"pass@1": 1.0}


def hostile_programs(tmp_path: Path, port: int, secret: str) -> dict[str, str]:
    """Completions whose test passes only if the attack worked (contained means scored 0)."""
    outside = [str(tmp_path / "escape"), "/var/tmp/orchestra-escape", "/dev/shm/orchestra-escape",
               "/root/orchestra-escape", "/etc/orchestra-escape", "/orchestra-escape"]
    programs = {
        "infinite loop": """
            def attack():
                while True:
                    pass
        """,
        "8 GB allocation": """
            def attack():
                block = bytearray(8 << 30)
                return len(block) > 0
        """,
        "fork bomb": """
            def attack():
                import os
                while True:
                    try:
                        os.fork()
                    except OSError:
                        pass
        """,
        "write outside": f"""
            def attack():
                done = False
                for path in {outside!r}:
                    try:
                        with open(path, "w") as f:
                            f.write("x")
                        done = True
                    except OSError:
                        pass
                return done
        """,
        "connect to 127.0.0.1": f"""
            def attack():
                import socket
                socket.create_connection(("127.0.0.1", {port}), timeout=3).close()
                return True
        """,
        "read the API key": f"""
            def attack():
                import os
                if any({secret!r} in v for v in os.environ.values()):
                    return True
                for pid in os.listdir("/proc"):
                    try:
                        with open(f"/proc/{{pid}}/environ", "rb") as f:
                            if {secret!r}.encode() in f.read():
                                return True
                    except OSError:
                        pass
                return False
        """,
        "kill its parent": """
            def attack():
                import os, signal
                os.kill(os.getppid(), signal.SIGKILL)
                return True
        """,
        "correct": """
            def attack():
                return True
        """,
    }
    return {name: textwrap.dedent(code).lstrip("\n") for name, code in programs.items()}


@pytest.mark.parametrize("isolation", ["bwrap", "unshare"])
def test_hostile_programs_are_contained_and_scored_zero(isolation: str, tmp_path: Path, lock_dir: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    secret = "sk-test-" + os.urandom(8).hex()
    monkeypatch.setenv("OPENAI_API_KEY", secret)
    listener = Listener()
    try:
        programs = hostile_programs(tmp_path, listener.port, secret)
        tests = {"prompt": "", "entry_point": "attack", "test": "assert attack() is True\n"}
        evaluator = CodeExecEvaluator(isolation=isolation, timeout_s=3, cpu_s=2, mem_mb=512, max_processes=16,
                                      max_sandboxes=4)
        metrics, details = evaluator.score(records(list(programs.values()), [tests] * len(programs)))
    finally:
        listener.close()
    outcome = {name: (d["passed"], d["status"]) for name, d in zip(programs, details)}
    assert outcome["correct"] == (True, "ok")
    assert all(not passed for name, (passed, _) in outcome.items() if name != "correct"), outcome
    assert outcome["8 GB allocation"][1] == "memory_limit"
    assert outcome["infinite loop"][1] in ("timeout", "cpu_limit")
    assert outcome["fork bomb"][1] in ("timeout", "cpu_limit")
    assert math.isclose(metrics["pass@1"], 1 / len(programs))
    assert listener.accepted == 0
    assert not any(os.path.exists(p) for p in (tmp_path / "escape", "/var/tmp/orchestra-escape",
                                                "/dev/shm/orchestra-escape", "/root/orchestra-escape"))
    no_sandbox_process_left()
    assert slot_dirs(lock_dir) == []


@pytest.fixture
def lock_dir(tmp_path: Path) -> Path:
    return tmp_path / "locks"


def test_text_is_required_and_is_visible_when_missing() -> None:
    tests = {"prompt": "", "entry_point": "f", "test": "assert f() == 1\n"}
    metrics, details = CodeExecEvaluator().score(
        records([None, 42, ["def f():\n    return 1\n", {"code": 1}], "def f():\n    return 1\n"], [tests] * 4))
    assert details[0]["status"] == "not_text" and details[1]["status"] == "not_text"
    assert [r["status"] for r in details[2]["results"]] == ["ok", "not_text"]
    assert details[3]["status"] == "ok"
    assert metrics["pass@1"] == (0 + 0 + 0.5 + 1) / 4


def test_a_sample_without_tests_is_an_error_not_a_zero() -> None:
    metrics, details = CodeExecEvaluator().score(records(["def f():\n    return 1\n"], ["just an answer"]))
    assert "no tests" in details[0]["error"] and "passed" not in details[0]


def test_pass_at_k_from_several_samples_per_problem() -> None:
    tests = {"prompt": "", "entry_point": "f", "test": "assert f() == 1\n"}
    right, wrong = "def f():\n    return 1\n", "def f():\n    return 2\n"
    metrics, details = CodeExecEvaluator(k=[1, 2, 5]).score(records([[right, wrong, wrong, right]], [tests]))
    assert details[0]["n"] == 4 and details[0]["num_passed"] == 2
    assert metrics["pass@1"] == 0.5
    assert math.isclose(metrics["pass@2"], 1 - 1 / 6)
    assert "pass@5" not in metrics  # 4 samples cannot estimate pass@5


def test_a_program_that_exits_before_its_tests_fails() -> None:
    tests = {"prompt": "", "entry_point": "f", "test": "assert f() == 2\n"}
    completion = "import sys\n\ndef f():\n    return 1\n\nsys.exit(0)\n"
    _, details = CodeExecEvaluator().score(records([completion], [tests]))
    assert details[0]["status"] == "left_early" and details[0]["passed"] is False


def test_a_completion_too_deep_to_parse_is_a_failed_program_not_a_failed_task(tmp_path: Path) -> None:
    """A model that answers with 100,000 nested unary minus signs: Python's parser gives up with
    ``MemoryError`` (``1+1+...`` with ``RecursionError``), which the post-processing took for a
    scoring error, so the eval task failed on every retry and the dataset had no result."""
    from tests.tasks.test_eval_heavy import only_run, orchestra, write_jsonl

    deep = "-" * 100_000 + "1"
    data = write_jsonl(tmp_path / "code.jsonl", [
        {"question": "Say 1", "tests": {"prompt": "answer = ", "entry_point": None, "test": "assert answer == 1\n"}},
        {"question": f"Say {deep}", "tests": {"prompt": "", "entry_point": None, "test": "assert True\n"}},
    ])
    cfg = tmp_path / "cfg.py"
    cfg.write_text(
        "from orchestra.datasets import JsonlDataset\n"
        "from orchestra.models import DeterministicModel\n"
        "models = [dict(type=DeterministicModel, abbr='det')]\n"
        f"datasets = [dict(type=JsonlDataset, abbr='code', path={str(data)!r},\n"
        "                 reader_cfg=dict(input_columns=['question'], output_column='tests'),\n"
        "                 infer_cfg=dict(prompt_template='{question}',\n"
        "                                inferencer=dict(type='gen', max_out_len=200000)),\n"
        "                 eval_cfg=dict(evaluator=dict(type='code_exec', isolation='bwrap')))]\n"
        f"work_dir = {str(tmp_path / 'out')!r}\n")
    res = orchestra(cfg)
    run = only_run(tmp_path)
    assert res.returncode == 0, (res.stderr[-2000:], [p.read_text()[-2000:] for p in (run / "logs/eval").glob("*")])
    details = [json.loads(line) for line in (run / "results/det/code.details.jsonl").read_text().splitlines()]
    assert details[1]["prediction"] == deep
    assert [d["passed"] for d in details] == [True, False] and "error" not in details[1]
    assert json.loads((run / "results/det/code.json").read_text())["metrics"] == {"pass@1": 0.5}
    no_sandbox_process_left()


@pytest.mark.parametrize(("setting", "fragment"), [
    # non-finite values meet the one check of every setting first (issue 35, point 7)
    ("timeout_s=float('inf')", "evaluator.timeout_s: expected a finite number, got inf"),
    ("cpu_s=float('nan')", "evaluator.cpu_s: expected a finite number, got nan"),
    ("isolation='docker'", "isolation: 'docker' is not valid; valid: auto, bwrap, unshare, none"),
    ("k=[1, 0]", "k must be an integer >= 1 or a list of them, got [1, 0]"),
    ("python='python3'", "python must be an absolute path, got 'python3'"),
])
def test_a_code_exec_setting_that_cannot_work_is_one_line_before_the_run(tmp_path: Path, setting: str,
                                                                         fragment: str) -> None:
    """``timeout_s=float('inf')`` (no limit, one might think) passed the check and then failed
    every task of the run (its spec cannot be written); now it is refused with one line."""
    from tests.tasks.test_eval_heavy import code_config, orchestra

    rows = [{"question": "q", "tests": {"prompt": "", "entry_point": None, "test": "assert True\n"}}]
    res = orchestra(code_config(tmp_path, rows, evaluator=f"dict(type='code_exec', {setting})"), "--dry-run")
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1 and "Traceback" not in res.stderr, res.stderr[-3000:]
    assert fragment in lines[0] and "eval_cfg.evaluator" in lines[0], lines[0]


def test_a_failed_prediction_and_an_empty_list_count_as_failed_samples() -> None:
    """Inference failed for a sample (its record carries ``error``), or ``gen`` with ``n`` gave
    no completion at all: each is a failed sample in pass@k and in the status counts, not an
    error of the scoring."""
    tests = {"prompt": "", "entry_point": "f", "test": "assert f() == 1\n"}
    records = [{"id": 0, "prediction": None, "error": "model timed out", "gold": tests},
               {"id": 1, "prediction": [], "gold": tests},
               {"id": 2, "prediction": "def f():\n    return 1\n", "gold": tests}]
    ev = CodeExecEvaluator()
    metrics, details = ev.score(records)
    assert details[0]["prediction_error"] == "model timed out" and "error" not in details[0]
    assert details[1]["status"] == "not_text" and details[1]["n"] == 0
    assert details[2]["passed"] is True
    assert math.isclose(metrics["pass@1"], 1 / 3)
    verdicts = {d["id"]: {k: v for k, v in d.items() if k not in ("id", "gold", "prediction")} for d in details}
    assert ev.statuses(verdicts) == {"prediction_error": 1, "not_text": 1, "ok": 1}
    assert all(math.isnan(v) for v in ev.aggregate([], {}).values())


def test_floods_of_output_and_self_inflicted_signals_are_failed_programs() -> None:
    """A completion that prints 50 MB (terminal escape sequences included) on stdout or stderr is
    killed at ``max_output_bytes`` and scored ``output_limit``, with at most the last 2,000
    characters of its stderr kept; one that kills itself with a signal is ``killed``."""
    tests = {"prompt": "", "entry_point": "f", "test": "assert f() == 1\n"}
    flood = "\x1b]0;pwned\x07\x1b[2J" + "A" * 1000 + "\n"
    right = "def f():\n    return 1\n"
    completions = {
        "stdout flood": f"import sys\nfor _ in range(50000):\n    sys.stdout.write({flood!r})\n{right}",
        "stderr flood": f"import sys\nfor _ in range(50000):\n    sys.stderr.write({flood!r})\n{right}",
        "segfault": "import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\ndef f():\n    return 1\n",
        "right": "def f():\n    return 1\n",
    }
    ev = CodeExecEvaluator(isolation="bwrap", max_output_bytes=64 * 1024, timeout_s=20)
    metrics, details = ev.score(records(list(completions.values()), [tests] * len(completions)))
    outcome = {name: (d["passed"], d["status"]) for name, d in zip(completions, details)}
    assert outcome == {"stdout flood": (False, "output_limit"), "stderr flood": (False, "output_limit"),
                       "segfault": (False, "killed"), "right": (True, "ok")}
    assert len(details[1]["stderr"]) <= 2000 and details[1]["duration_s"] < 15
    assert metrics["pass@1"] == 0.25
    no_sandbox_process_left()
