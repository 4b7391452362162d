"""Config-time refusals around managed servers, through ``run.py``: one line, exit 2, before
any server starts (no ``servers/`` folder, no replica process).

* an lm-eval task whose output type is scored by prompt log-probs (``multiple_choice``,
  ``loglikelihood_rolling``) on a llama.cpp server, which returns none;
* a judge model with ``server=`` (the eval stage starts no managed server).

The lm-eval tasks are two tiny YAMLs written here, over a local JSON file (no network).
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from orchestra.datasets.lmeval import LmEvalDataset
from tests.helpers import REPO, run_cli
from tests.serving.test_managed_runs import gguf, llama

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


def test_a_judge_with_a_managed_server_is_refused_at_config_time(tmp_path: Path) -> None:
    judge = dict(type="OpenAIAPI", path="judge", endpoint="completions",
                 server=dict(engine="llama.cpp", model=gguf()))
    data = (f"dict(type=JsonlDataset, abbr='arith', path={str(REPO / 'configs/data/arith.jsonl')!r}, "
            "reader_cfg=dict(input_columns=['question'], output_column='answer', test_range='[0:2]'), "
            "infer_cfg=dict(prompt_template='Q: {question}', inferencer=dict(type='gen', max_out_len=4)), "
            f"eval_cfg=dict(evaluator=dict(type=JudgeEvaluator, judge={judge!r})))")
    line = refused(tmp_path, run_config(tmp_path, data, "from orchestra.evaluators.judge import JudgeEvaluator"))
    assert "datasets[0]" in line and "eval_cfg.evaluator.judge.server: a judge cannot use a managed server yet" \
        in line, line
    assert line.startswith(f"orchestra: error: {tmp_path / 'cfg.py'}: datasets[0]"), line
