"""Eval tasks in the infer stage's warm workers, through ``run.py`` with the real lm-eval bridge.

With ``reuse_workers=True`` on both stages' LocalRunner, the run keeps one pool of warm workers:
an eval task (which loads no model) scores in a worker the infer stage warmed, once no infer task
still to start wants it, instead of in a new process that imports lm-eval again.  It must give the
numbers fresh processes give (a worker leaks nothing between tasks that changes a result), and
``reuse_workers=False`` on the eval stage keeps one fresh process per eval task.

The tasks are tests/datasets/lmeval_toy.py's, answered by ``DeterministicModel``: ``arith`` (all
right) and the group ``pair`` whose ``small`` subtask's gold answers are wrong (5 of 7 right).
"""

from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.helpers import alive, jsonl_so_far, wait_for
from tests.lmeval_seed import LmEvalIndex

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "tests" / "datasets"))
import lmeval_toy as toy  # noqa: E402

sys.path.pop(0)

DATASETS = ("dict(type=LmEvalDataset, abbr='arith', task='arith', include_path={tasks!r}), "
            "dict(type=LmEvalDataset, abbr='pair', task='pair', include_path={tasks!r})")


def _run(tmp: Path, name: str, tasks: Path, eval_warm: bool) -> Path:
    """``run.py`` on both datasets, one warm infer worker, the eval stage warm or not: the run folder.  The eval
    stage after the infer stage (``overlap=False``): beside it, an eval task ready while an infer task that
    wants the worker is still to start takes a worker of its own (which one it gets would be timing)."""
    cfg = toy.config(tmp / f"{name}.py", tasks, tmp / name, DATASETS)
    cfg.write_text(cfg.read_text() + (
        "from orchestra.runners import LocalRunner\n"
        "from orchestra.tasks import EvalTask, InferTask\n"
        "infer = dict(runner=dict(type=LocalRunner, max_num_workers=1, reuse_workers=True,\n"
        "                         task=dict(type=InferTask)))\n"
        f"eval = dict(overlap=False, runner=dict(type=LocalRunner, max_num_workers=1, reuse_workers={eval_warm}, "
        "task=dict(type=EvalTask)))\n"))
    done = toy.run(cfg, environ=toy.env(tmp / "cache"))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    (run,) = glob.glob(str(tmp / name / "*"))
    return Path(run)


def _pids(run: Path) -> dict[str, list[int]]:
    """The pid each task's attempts started in, by stage."""
    pids: dict[str, list[int]] = {"infer": [], "eval": []}
    for line in (run / "events.jsonl").read_text().splitlines():
        event = json.loads(line)
        if event.get("event") == "started":
            pids[event["stage"]].append(event["where"]["pid"])
    return pids


def _scores(run: Path) -> dict[str, Any]:
    """Each dataset's metrics and per-sample details."""
    out = {}
    for abbr in ("arith", "pair"):
        result = json.loads((run / "results" / "det" / f"{abbr}.json").read_text())
        details = (run / "results" / "det" / f"{abbr}.details.jsonl").read_text().splitlines()
        out[abbr] = (result["metrics"], [json.loads(d) for d in details if d.strip()])
    return out


def test_eval_tasks_score_in_the_infer_workers_with_the_numbers_of_fresh_processes(
        tmp_path: Path, lmeval_index: LmEvalIndex) -> None:
    lmeval_index.seed(tmp_path / "cache")  # lm-eval's stock index, built once per session
    lay = tmp_path / "lay"
    tasks = toy.write(lay)
    toy.write_data(lay, "small", wrong=True)

    warm = _run(tmp_path, "warm", tasks, eval_warm=True)
    pids = _pids(warm)
    assert len(set(pids["infer"])) == 1 and len(pids["eval"]) == 2, pids
    # both datasets scored one after the other in the worker that ran the inference (was: a pool of the eval
    # stage's own, a new process importing lm-eval again)
    assert set(pids["eval"]) == set(pids["infer"]), pids

    cold = _run(tmp_path, "cold", tasks, eval_warm=False)
    cold_pids = _pids(cold)
    # reuse_workers=False on the eval stage: a fresh process per eval task, none of them the infer worker
    assert len(set(cold_pids["eval"])) == 2 and not set(cold_pids["eval"]) & set(cold_pids["infer"]), cold_pids

    got, want = _scores(warm), _scores(cold)
    assert got["arith"][0]["exact_match,none"] == 1.0
    assert abs(got["pair"][0]["exact_match,none"] - 5 / 7) < 1e-9, got["pair"][0]
    assert got == want


CRASHING = '''
import os
import time
from orchestra.evaluators.basic import NumericMatchEvaluator


class CrashOnce(NumericMatchEvaluator):
    """Ends its process (exit status 3) the first time it scores, as a segfaulting metric would."""

    def score(self, records):
        marker = os.environ["CRASH_MARKER"]
        if not os.path.exists(marker):
            open(marker, "w").close()
            os._exit(3)
        return super().score(records)


class RunsTheAnswer(NumericMatchEvaluator):
    """Runs a program for each answer, as a code scorer runs a model's code, without saying where its
    input comes from; the program reads its standard input to the end (a model's ``input()``)."""

    def score(self, records):
        import subprocess, sys
        for _ in records:
            done = subprocess.run([sys.executable, "-c", "import sys; print(len(sys.stdin.buffer.read()))"],
                                  stdout=subprocess.PIPE, text=True, timeout=20)
            assert done.stdout.strip() == "0", done.stdout
        return super().score(records)


class WritesOnTheAnswerPipe(NumericMatchEvaluator):
    """Writes a line that is no answer on the worker's answer pipe (as code it runs in a forked
    process, such as a model's program under lm-eval's code scorer, could)."""

    def score(self, records):
        os.write(int(os.environ["ORCHESTRA_WORKER_FD"]), b"not an answer\\n")
        return super().score(records)


class ForksAndExits(NumericMatchEvaluator):
    """Scores after a forked process of its own ends with ``sys.exit(0)`` (code that forks a helper
    without exec, as a scorer may), waiting for that process."""

    def score(self, records):
        import sys
        pid = os.fork()
        if pid == 0:
            sys.exit(0)
        os.waitpid(pid, 0)
        return super().score(records)


class Slow(NumericMatchEvaluator):
    """Scores after its marker says it started and a long wait (the test interrupts it)."""

    def score(self, records):
        open(os.environ["CRASH_MARKER"], "w").close()
        time.sleep(120)
        return super().score(records)
'''


def _jsonl_config(tmp_path: Path, evaluator: str) -> Path:
    """``plain`` (numeric_match) and ``crashy`` (scored by ``evaluator``, a class of ``crashing_eval.py``
    beside the config): one warm worker per stage, one retry, the eval stage after the infer stage."""
    (tmp_path / "crashing_eval.py").write_text(CRASHING)
    entries = []
    for abbr, scorer in (("plain", "'numeric_match'"), ("crashy", evaluator)):
        data = tmp_path / f"{abbr}.jsonl"
        data.write_text("".join(json.dumps({"question": f"{i} + 1 =", "answer": str(i + 1)}) + "\n" for i in range(3)))
        entries.append(f"dict(type=JsonlDataset, abbr={abbr!r}, path={str(data)!r}, reader_cfg=dict("
                       "input_columns=['question'], output_column='answer'), infer_cfg=dict(prompt_template="
                       f"'{{question}}', inferencer=dict(type='gen', max_out_len=8)), "
                       f"eval_cfg=dict(evaluator={scorer}))")
    cfg = tmp_path / "cfg.py"
    cfg.write_text(
        "from orchestra.datasets import JsonlDataset\n"
        "from orchestra.models.fake import DeterministicModel\n"
        "from orchestra.runners import LocalRunner\n"
        "from orchestra.tasks import EvalTask, InferTask\n"
        "models = [dict(type=DeterministicModel, abbr='det')]\n"
        f"datasets = [{', '.join(entries)}]\n"
        "_runner = dict(type=LocalRunner, max_num_workers=1, reuse_workers=True, retry=1, retry_backoff_s=0.1)\n"
        "infer = dict(runner=dict(_runner, task=dict(type=InferTask)))\n"
        "eval = dict(overlap=False, runner=dict(_runner, task=dict(type=EvalTask)))\n"
        f"work_dir = {str(tmp_path / 'out')!r}\n")
    return cfg


def _env(tmp_path: Path) -> dict[str, str]:
    return {**toy.env(tmp_path / "cache"), "CRASH_MARKER": str(tmp_path / "crashed"),
            "PYTHONPATH": f"{tmp_path}:{REPO}"}


def _events(run: Path) -> list[dict[str, Any]]:
    """The events of a run that has ended (every line whole)."""
    return [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines() if line.strip()]


def test_an_eval_task_that_kills_the_borrowed_worker_is_retried_in_a_new_one(tmp_path: Path) -> None:
    cfg = _jsonl_config(tmp_path, "dict(type='crashing_eval.CrashOnce')")
    done = toy.run(cfg, environ=_env(tmp_path))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    (run,) = glob.glob(str(tmp_path / "out" / "*"))
    events = _events(Path(run))
    started = [(e["task_id"], e["where"]["pid"]) for e in events if e.get("event") == "started"]
    infer_pids = {pid for task, pid in started if task.startswith("infer_")}
    crashy = [pid for task, pid in started if task == "eval_det_crashy"]
    # the first attempt died with the infer worker it borrowed; the retry ran in a new worker
    assert len(infer_pids) == 1 and len(crashy) == 2, started
    assert crashy[0] in infer_pids and crashy[1] not in infer_pids, started
    retry = next(e for e in events if e.get("event") == "retry" and e["task_id"] == "eval_det_crashy")
    assert "warm worker exited with code 3 during the task" in json.dumps(retry), retry
    plain, crashed = (json.loads((Path(run) / "results" / "det" / f"{abbr}.json").read_text())["metrics"]
                      for abbr in ("plain", "crashy"))
    assert crashed == plain and plain["numeric_match"] > 0, (plain, crashed)


def test_a_program_an_eval_task_starts_reads_no_request_of_the_borrowed_worker(tmp_path: Path) -> None:
    """A warm worker reads its requests on stdin, and a program a task started without an input of
    its own inherited that pipe: a model's code that reads its input (run by a scorer) waited there
    for ever (here: until its 20 s timeout failed the eval task, twice), where a task process of its
    own reads end of input at once.  The worker's tasks now read /dev/null there, in the same worker."""
    cfg = _jsonl_config(tmp_path, "dict(type='crashing_eval.RunsTheAnswer')")
    done = toy.run(cfg, environ=_env(tmp_path))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    (run,) = glob.glob(str(tmp_path / "out" / "*"))
    started = [(e["task_id"], e["where"]["pid"]) for e in _events(Path(run)) if e.get("event") == "started"]
    assert len({pid for _, pid in started}) == 1, started  # all in the infer worker
    assert not [e for e in _events(Path(run)) if e.get("event") == "retry"]  # each task once
    plain, scored = (json.loads((Path(run) / "results" / "det" / f"{abbr}.json").read_text())["metrics"]
                     for abbr in ("plain", "crashy"))
    assert scored == plain and plain["numeric_match"] > 0, (plain, scored)


def test_a_line_on_the_answer_pipe_that_is_no_answer_fails_the_task_not_the_run(tmp_path: Path) -> None:
    """A line on a warm worker's answer pipe that is not ``{"code": N}`` used to end the orchestrator
    with a JSONDecodeError traceback; the task fails (its retry too) with one line, the worker is
    stopped, and the run ends with its summary and exit code 1."""
    cfg = _jsonl_config(tmp_path, "dict(type='crashing_eval.WritesOnTheAnswerPipe')")
    done = toy.run(cfg, environ=_env(tmp_path))
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    said = "warm worker's answer pipe held b'not an answer', not an exit code; the worker was stopped"
    assert f"FAILED: eval task eval_det_crashy ({said})" in done.stderr, done.stderr[-3000:]
    (run,) = glob.glob(str(tmp_path / "out" / "*"))
    assert json.loads((Path(run) / "results" / "det" / "plain.json").read_text())["metrics"]["numeric_match"] > 0


def test_a_process_a_task_forks_that_exits_with_sys_exit_is_no_second_worker(tmp_path: Path) -> None:
    """``sys.exit()`` in a process an eval task forked (no exec) raised SystemExit up through the warm
    worker's own code, which took it for the task's end: the child answered ``{"code": 0}`` on the
    worker's answer pipe, before the task had scored, and went on reading the worker's requests, so
    the task waiting for it never ended.  A forked process that gets back to the worker's code now
    ends there, with its exit status, answering nothing; the task scores as in a process of its own."""
    cfg = _jsonl_config(tmp_path, "dict(type='crashing_eval.ForksAndExits')")
    done = toy.run(cfg, environ=_env(tmp_path))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    (run,) = glob.glob(str(tmp_path / "out" / "*"))
    plain, scored = (json.loads((Path(run) / "results" / "det" / f"{abbr}.json").read_text())["metrics"]
                     for abbr in ("plain", "crashy"))
    assert scored == plain and plain["numeric_match"] > 0, (plain, scored)


def test_ctrl_c_during_an_eval_task_in_a_borrowed_worker_stops_it_and_r_finishes(tmp_path: Path) -> None:
    cfg = _jsonl_config(tmp_path, "dict(type='crashing_eval.Slow')")
    proc = subprocess.Popen([sys.executable, str(REPO / "run.py"), str(cfg)], env=_env(tmp_path), cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: (tmp_path / "crashed").exists() or proc.poll() is not None, 120, "the slow eval to start")
        assert proc.poll() is None, "the run ended before it could be interrupted"
        (run,) = glob.glob(str(tmp_path / "out" / "*"))
        # the orchestrator writes a task's "started" once its submit returned: the worker may be in
        # the evaluator (the marker) a moment before that line is there
        live = Path(run) / "events.jsonl"  # the run writes on while these lines read it
        wait_for(lambda: any(e.get("event") == "started" and e["task_id"] == "eval_det_crashy"
                             for e in jsonl_so_far(live)), 30, "the slow eval's started event")
        started = [(e["task_id"], e["where"]["pid"]) for e in jsonl_so_far(live) if e.get("event") == "started"]
        pids = {pid for _, pid in started}
        assert len(pids) == 1 and started[-1][0] == "eval_det_crashy", started  # in the infer worker
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130
    wait_for(lambda: not any(os.path.exists(f"/proc/{pid}") and alive(pid) for pid in pids), 10,
             "the warm worker to be gone")
    assert any(e.get("event") == "cancelled" and e["task_id"] == "eval_det_crashy" for e in _events(Path(run)))
    (tmp_path / "crashing_eval.py").write_text(CRASHING.replace("time.sleep(120)", "pass"))
    again = toy.run(cfg, "-r", environ=_env(tmp_path))
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
    assert json.loads((Path(run) / "results" / "det" / "crashy.json").read_text())["metrics"]["numeric_match"] > 0

