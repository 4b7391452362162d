"""lm-eval's ``is_greedy`` through a completions endpoint on orchestra gives lm-eval's own numbers.

One real scoring server (tests/servers/loglik_server.py: the bundled SmolLM2-135M in float32,
vLLM's echo format with ``top_logprobs``), and beside it, on the same LAMBADA-style documents
(``lambada_local``, lm-eval's stock ``lambada_openai`` YAML over the texts of
test_lmeval_greedy_rolling.py):

- lm-eval's own ``local-completions`` model (its prompts sent as token ids, ``max_tokens`` 1,
  ``logprobs`` 1, its ``is_greedy`` read by its ``parse_logprobs``);
- ``run.py`` with ``OpenAIAPI(endpoint='completions')`` (text prompts, ``max_tokens`` 0,
  ``logprobs`` 1).

Every sample's log-likelihood, ``is_greedy`` and per-sample metrics must agree, and ``acc`` /
``perplexity`` to 4 decimals.
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.datasets.test_lmeval_greedy_rolling import LIMIT, ONE_WARM_WORKER, _compare, _weights_folder, lambada_config
from tests.lmeval_reference import lm_eval_runs
from tests.lmeval_seed import LmEvalIndex

REPO = Path(__file__).resolve().parents[2]
SERVER = REPO / "tests" / "servers" / "loglik_server.py"
KEY = "greedy-api-test-key-0123456789"

pytestmark = pytest.mark.slow


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", **extra}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """The scoring server on a free port (``http://127.0.0.1:PORT/v1``) and its request record."""
    record = tmp_path_factory.mktemp("greedy_api_server") / "requests.jsonl"
    proc = subprocess.Popen([sys.executable, str(SERVER), "0", "--record", str(record)], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, env=_env(ORCHESTRA_SERVER_KEY=KEY))
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # printed once the model is loaded and the port is open
        assert line.startswith("loglik server on 127.0.0.1:"), f"server said {line!r}, exit {proc.poll()}"
        port = int(line.split("127.0.0.1:")[1].split()[0])
        yield f"http://127.0.0.1:{port}/v1", record
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture(scope="module")
def both(server: tuple[str, Path], tmp_path_factory: pytest.TempPathFactory,
         lmeval_stock_index: Path) -> dict[str, Any]:
    """orchestra's results and details, lm-eval's results and logged samples, and the requests
    the server got, for ``lambada_local``."""
    base_url, record = server
    tmp = tmp_path_factory.mktemp("greedy_api")
    tasks = tmp / "tasks"
    cfg = lambada_config(tmp, "openai_api.OpenAIAPI", f"abbr='api', path='smollm2', base_url={base_url!r}, "
                         "endpoint='completions', key_env='GREEDY_API_KEY', max_connections=2, max_retries=1",
                         f", test_range='[0:{LIMIT}]'", stages=ONE_WARM_WORKER)
    proc = subprocess.run([sys.executable, str(REPO / "run.py"), str(cfg)], capture_output=True, text=True,
                          env=_env(GREEDY_API_KEY=KEY), cwd=tmp, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    n_ours = len(open(record).readlines())
    (run,) = glob.glob(str(tmp / "out" / "*" / "results" / "api"))
    out = tmp / "ref"
    lm_eval_runs(  # `python -m lm_eval ARGV` (tests/lmeval_reference.py)
        [["--model", "local-completions", "--model_args",
          f"base_url={base_url}/completions,model=smollm2,tokenizer={_weights_folder()},"
          "tokenizer_backend=huggingface,max_retries=1",
          "--include_path", str(tasks), "--tasks", "lambada_local", "--limit", str(LIMIT), "--log_samples",
          "--output_path", str(out)]], cwd=tmp, env=_env(OPENAI_API_KEY=KEY), stock_index=lmeval_stock_index,
        timeout=600)
    (res,) = glob.glob(str(out / "**" / "results_*.json"), recursive=True)
    (samples,) = glob.glob(str(out / "**" / "samples_lambada_local_*.jsonl"), recursive=True)
    return {"ours": {"lambada_local": json.loads(Path(run, "lambada_local.json").read_text())},
            "details": {"lambada_local": [json.loads(line) for line in open(Path(run, "lambada_local.details.jsonl"))]},
            "ref": json.loads(Path(res).read_text())["results"],
            "ref_samples": {"lambada_local": [json.loads(line) for line in open(samples)]},
            "requests": [json.loads(line) for line in open(record)], "n_ours": n_ours}


def test_is_greedy_through_completions_is_lm_evals_sample_for_sample(both: dict[str, Any]) -> None:
    """The same log-likelihoods (within 1e-3 nats per 100), the same ``is_greedy`` and per-sample
    metrics for every document, and the same ``acc`` and ``perplexity`` to 4 decimals."""
    worst = _compare(both, "lambada_local")
    greedy = [d["acc"] for d in both["details"]["lambada_local"]]
    assert 0 < sum(greedy) < len(greedy), greedy  # both answers occur: the flag is really compared
    assert worst < 1e-3, worst
    for key in ("acc,none", "perplexity,none"):
        ours, ref = both["ours"]["lambada_local"]["metrics"][key], both["ref"]["lambada_local"][key]
        assert round(ours, 4) == round(ref, 4), (key, ours, ref)


def test_both_asked_the_same_server_for_top_logprobs(both: dict[str, Any]) -> None:
    """Each side's requests reached the server: orchestra's as text with ``max_tokens`` 0, lm-eval's
    as token ids with ``max_tokens`` 1, both with ``echo`` and ``logprobs`` 1 (one per document)."""
    ours, theirs = both["requests"][:both["n_ours"]], both["requests"][both["n_ours"]:]
    assert len(ours) == len(theirs) == LIMIT, (ours, theirs)
    for request in ours:
        assert request == {"path": "/v1/completions", "echo": True, "logprobs": 1, "max_tokens": 0}, request
    for request in theirs:
        assert request == {"path": "/v1/completions", "echo": True, "logprobs": 1, "max_tokens": 1}, request


def test_the_chat_endpoint_is_still_refused_at_planning(tmp_path: Path, lmeval_index: LmEvalIndex) -> None:
    """A chat endpoint returns no prompt log-probabilities: with a LAMBADA-style task it stays a
    config error (one line, exit 2, before anything runs), which names the endpoint that can."""
    cfg = lambada_config(tmp_path, "openai_api.OpenAIAPI", "abbr='chat', path='smollm2', "
                         "base_url='http://127.0.0.1:9/v1', endpoint='chat', key_env=None")
    proc = subprocess.run([sys.executable, str(REPO / "run.py"), str(cfg), "--dry-run"], capture_output=True,
                          text=True, timeout=600,
                          env=_env(ORCHESTRA_CACHE_DIR=str(lmeval_index.seed(tmp_path / "cache"))))
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    for part in ("models[0] ('chat', OpenAIAPI) cannot report is_greedy", "'lambada_local'",
                 "use HFCausalLM or OpenAIAPI(endpoint='completions')"):
        assert part in lines[0], lines[0]
