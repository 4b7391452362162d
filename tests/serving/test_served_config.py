"""Config-time refusals around managed servers, through ``run.py``: one line, exit 2, before
any server starts (no ``servers/`` folder, no replica process).

* an lm-eval task whose output type is scored by prompt log-probs (``multiple_choice``,
  ``loglikelihood_rolling``) on a llama.cpp server, which returns none;
* a judge whose server needs more GPUs than the eval runner has, or whose abbr names another
  served model.

And a judge with ``server=`` served by the eval stage's own replicas, and stopped with them on Ctrl-C.

The lm-eval tasks are two tiny YAMLs written here, over a local JSON file (no network).
"""

from __future__ import annotations

import json
import os
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from orchestra.datasets.lmeval import LmEvalDataset
from tests.helpers import REPO, events, jsonl, run_cli, run_dirs
from tests.serving.test_managed_runs import llama

pytestmark = pytest.mark.slow

TASK = """\
task: {name}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: {kind}
doc_to_text: "Question: {{{{q}}}}\\nAnswer:"
{extra}
"""


def tasks(tmp_path: Path) -> Path:
    """An include_path with ``tiny_mc`` (multiple_choice) and ``tiny_gen`` (generate_until)."""
    folder = tmp_path / "tasks"
    folder.mkdir()
    data = folder / "data.jsonl"
    data.write_text("".join(json.dumps({"q": f"What is {i}+1?", "choices": [str(i + 1), str(i + 2)], "label": 0})
                            + "\n" for i in range(3)))
    mc = 'doc_to_target: label\ndoc_to_choice: "{{choices}}"\nmetric_list:\n  - metric: acc'
    gen = ('doc_to_target: "{{choices[label]}}"\ngeneration_kwargs:\n  until: ["\\n"]\n'
           'metric_list:\n  - metric: exact_match')
    for name, kind, extra in (("tiny_mc", "multiple_choice", mc), ("tiny_gen", "generate_until", gen)):
        (folder / f"{name}.yaml").write_text(TASK.format(name=name, data=data, kind=kind, extra=extra))
    return folder


def run_config(tmp_path: Path, datasets: str, extra_import: str = "") -> Path:
    cfg = tmp_path / "cfg.py"
    cfg.write_text(textwrap.dedent(f"""
        from orchestra.models import OpenAIAPI
        from orchestra.datasets.lmeval import LmEvalDataset
        from orchestra.datasets import JsonlDataset
        {extra_import}
        models = [dict(type=OpenAIAPI, abbr='smol', path='smollm2', endpoint='completions',
                       server={llama()!r})]
        datasets = [{datasets}]
        work_dir = {str(tmp_path / 'out')!r}
        infer = dict(runner=dict(type='LocalRunner', task=dict(type='InferTask'), gpus=[]))
    """))
    return cfg


def refused(tmp_path: Path, cfg: Path) -> str:
    res = run_cli(cfg, timeout=120, env={"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"})
    assert res.returncode == 2, res.stderr[-3000:]
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, lines
    assert not list((tmp_path / "out").rglob("servers"))  # refused before any server started
    return lines[0]


def test_an_lmeval_multiple_choice_task_on_llama_cpp_is_refused_at_config_time(tmp_path: Path) -> None:
    folder = tasks(tmp_path)
    gen = f"dict(type=LmEvalDataset, abbr='gen', task='tiny_gen', include_path={str(folder)!r})"
    mc = f"dict(type=LmEvalDataset, abbr='mc', task='tiny_mc', include_path={str(folder)!r})"
    line = refused(tmp_path, run_config(tmp_path, f"{gen}, {mc}"))
    assert line == (f"orchestra: error: {tmp_path / 'cfg.py'}: models[0].server.engine 'llama.cpp' returns no "
                    "prompt log-probs, so it cannot score lm-eval task 'tiny_mc' (output_type 'multiple_choice') "
                    "of dataset 'mc'; use engine 'vllm' or 'sglang', or a local model"), line
    # the generating task alone needs no log-probs
    assert LmEvalDataset.needs_loglik(dict(abbr="gen", task="tiny_gen", include_path=str(folder))) is None


STUB = str(Path(__file__).with_name("keyed_stub.py"))


def judged_config(tmp_path: Path, judge_server: dict[str, Any], judge_abbr: str = "judge") -> Path:
    """The infer model a ``command`` stub server (answers ``3``); the judge ``judge_server``."""
    judge = dict(type="OpenAIAPI", abbr=judge_abbr, path="smollm2", max_connections=2, server=judge_server)
    data = (f"dict(type=JsonlDataset, abbr='arith', path={str(REPO / 'configs/data/arith.jsonl')!r}, "
            "reader_cfg=dict(input_columns=['question'], output_column='answer', test_range='[0:2]'), "
            "infer_cfg=dict(prompt_template='Q: {question}', inferencer=dict(type='gen', max_out_len=4)), "
            f"eval_cfg=dict(evaluator=dict(type=JudgeEvaluator, judge={judge!r}, max_out_len=8)))")
    cfg = run_config(tmp_path, data, "from orchestra.evaluators.judge import JudgeEvaluator")
    text = cfg.read_text().replace(repr(llama()), repr(dict(engine="command", model="m", command=[
        sys.executable, STUB, "{port}"])), 1)  # the infer model's server only
    cfg.write_text(text + "eval = dict(runner=dict(type='LocalRunner', task=dict(type='EvalTask'), gpus=[]))\n")
    return cfg


def test_a_judge_with_a_managed_server_is_served_in_the_eval_stage(tmp_path: Path) -> None:
    """The judge (llama.cpp, SmolLM2) gets its replica when the eval stage needs it, grades both
    answers through it, and the replica stops with the stage; the key stays out of the run folder."""
    res = run_cli(judged_config(tmp_path, llama()), timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    (run,) = run_dirs(tmp_path / "out")
    evs = events(run)
    judge_ready = [i for i, e in enumerate(evs) if e["event"] == "server_ready" and e["model"] == "judge"]
    infer_done = [i for i, e in enumerate(evs) if e["event"] == "done" and e.get("stage") == "infer"]
    assert len(judge_ready) == 1 and infer_done and judge_ready[0] > infer_done[0], [e["event"] for e in evs]
    assert [e["model"] for e in evs if e["event"] == "server_stopped"] == ["smol", "judge"]
    log = (run / "servers/judge/replica-0.log").read_text(errors="replace")
    assert log.count("launch_slot_") >= 2, log[-2000:]  # the judge's replica graded both answers
    (started,) = [r for r in jsonl(run / "servers/ledger.jsonl") if r["state"] == "started" and r["model"] == "judge"]
    assert not [r for r in jsonl(run / "servers/ledger.jsonl") if r["state"] == "reaped"]
    (results,) = (run / "results").rglob("*.json")
    assert "judge" in results.read_text()
    assert not os.path.exists(started["key_file"])


def test_a_judge_server_that_cannot_fit_or_clashes_is_refused_at_config_time(tmp_path: Path) -> None:
    line = refused(tmp_path, judged_config(tmp_path, dict(engine="vllm", model="org/m", tensor_parallel_size=2)))
    assert "datasets[0].eval_cfg.evaluator.judge: server needs 1 replica(s) x 2 GPU(s)" in line, line
    line = refused(tmp_path, judged_config(tmp_path, llama(), judge_abbr="smol"))
    assert "datasets[0].eval_cfg.evaluator.judge: abbr 'smol' is a served model of the infer stage" in line, line


def test_ctrl_c_while_a_judge_replica_grades_stops_it_and_frees_its_folder(tmp_path: Path) -> None:
    """A judge on a Unix socket whose every answer takes 60 s: Ctrl-C in the eval stage ends the
    run (130) within seconds, and the judge's replica, key file and socket folder are gone."""
    import signal
    import time

    from tests.helpers import start_cli, wait_for
    from tests.serving.test_managed_runs import alive, replica_pids

    judge = dict(engine="command", model="m", max_restarts=0,
                 command=[sys.executable, STUB, "{socket}", "--slow", "60"])
    proc = start_cli(judged_config(tmp_path, judge), new_session=True)
    try:
        run = wait_for(lambda: run_dirs(tmp_path / "out")[-1:] and run_dirs(tmp_path / "out")[-1], 60, "a run")
        wait_for(lambda: any(e["event"] == "server_ready" and e["model"] == "judge" for e in events(run)), 120,
                 "the judge's replica")
        (started,) = [r for r in jsonl(run / "servers/ledger.jsonl") if r["state"] == "started"
                      and r["model"] == "judge"]
        pids = wait_for(lambda: [p for p in replica_pids(run) if alive(p)], 30, "the judge's processes")
        time.sleep(1.0)  # its requests are in flight now
        proc.send_signal(signal.SIGINT)
        t0 = time.monotonic()
        proc.communicate(timeout=60)
        assert proc.returncode == 130
        assert time.monotonic() - t0 < 20
        wait_for(lambda: not [p for p in pids if alive(p)], 10, "the judge's processes to be gone")
        assert not os.path.exists(started["key_file"])
        assert not os.path.exists(os.path.dirname(started["socket"]))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_judge_named_like_a_served_infer_model_is_refused_even_with_the_same_server(tmp_path: Path) -> None:
    """The eval stage serves its judges with replicas of its own (its own key), and eval tasks start
    while other infer tasks still run: a judge with a served infer model's abbr would share
    ``servers/<abbr>/replicas.json`` with it, and the infer tasks' requests went to the judge's
    replica with the infer key (HTTP 401, the infer task failed).  Refused at config time."""
    same = dict(engine="command", model="m", command=[sys.executable, STUB, "{port}"])  # the infer model's server
    line = refused(tmp_path, judged_config(tmp_path, same, judge_abbr="smol"))
    assert "datasets[0].eval_cfg.evaluator.judge: abbr 'smol' is a served model of the infer stage" in line, line


def test_two_judges_of_one_abbr_with_other_servers_are_refused(tmp_path: Path) -> None:
    cfg = judged_config(tmp_path, llama())
    text = cfg.read_text()
    i = text.index("datasets = [") + len("datasets = [")
    first = text[i:text.index("\n", i)].rstrip("]")
    second = first.replace("abbr='arith'", "abbr='arith2'").replace("'threads': 1", "'threads': 2")
    assert second != first.replace("abbr='arith'", "abbr='arith2'")  # the second judge's server differs
    cfg.write_text(text[:i] + first + ", " + second + "]" + text[text.index("\n", i):])
    line = refused(tmp_path, cfg)
    assert "datasets[1].eval_cfg.evaluator.judge: abbr 'judge' names another served judge" in line, line
