"""LmEvalDataset through an OpenAI-compatible API: lm-eval's requests over real HTTP.

The project's test server (tests/servers/openai_server.py) answers deterministically: a
completion is the result of the last ``a + b`` in the prompt, and ``echo`` log-probabilities
are -1 per character (0 for a trailing word seen before).  So every recorded answer of an
lm-eval request is known exactly: GSM8K's ``generate_until`` texts (then lm-eval's regex
filters) and ARC's ``loglikelihood`` pairs.

The run keeps one warm worker for both stages: its four tasks share one process that imports
lm-eval once, instead of a fresh one per task (~5 s of CPU each).  No process of the run imports
torch (an API model needs none; lm-eval's torch seed is set only if torch is ever imported,
:mod:`orchestra.datasets.torch_seed`): a ``sitecustomize`` module on ``PYTHONPATH``, which every
Python process of the run imports at start, notes each process that imports lm-eval's evaluator
and each whose torch module starts executing.
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.lmeval_seed import LmEvalIndex

REPO = Path(__file__).resolve().parents[2]
#: notes ``evaluator-PID`` when a process imports lm-eval's evaluator and ``torch-PID`` when its
#: torch module starts executing (not on ``importlib.util.find_spec('torch')``, which imports nothing)
_SITE = """\
import json, os, sys


def _note(what):
    with open(os.path.join(os.environ['ORCHESTRA_TEST_IMPORT_LOG'], f'{what}-{os.getpid()}'), 'w') as f:
        json.dump(sys.orig_argv, f)


class _Loader:
    def __init__(self, loader):
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        _note('torch')
        module.__loader__ = module.__spec__.loader = self.loader
        self.loader.exec_module(module)


class _Watch:
    def find_spec(self, name, path, target=None):
        if name == 'lm_eval.evaluator':
            _note('evaluator')
        if name != 'torch':
            return None
        for finder in sys.meta_path:
            spec = None if finder is self else finder.find_spec(name, path, target)
            if spec is not None:
                spec.loader = _Loader(spec.loader)
                return spec
        return None


if os.environ.get('ORCHESTRA_TEST_IMPORT_LOG'):
    sys.meta_path.insert(0, _Watch())
"""


@pytest.fixture(scope="module")
def offline(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("lmeval_offline_api")
    subprocess.run([sys.executable, str(REPO / "tools" / "lmeval_offline_tasks.py"), str(out)], check=True,
                   capture_output=True)
    return out / "tasks"


def _server_module() -> Any:
    sys.path.insert(0, str(REPO / "tests" / "servers"))
    try:
        import openai_server

        return openai_server
    finally:
        sys.path.pop(0)


def _predictions(tmp_path: Path, name: str) -> list[dict[str, Any]]:
    (path,) = glob.glob(str(tmp_path / "out" / "*" / "predictions" / "api" / f"{name}.jsonl"))
    return [r for r in (json.loads(line) for line in open(path) if line.strip()) if "_meta" not in r]


@pytest.mark.slow
def test_gsm8k_and_arc_through_the_openai_compatible_api(tmp_path: Path, offline: Path, server: Any,
                                                         lmeval_index: LmEvalIndex) -> None:
    cfg = tmp_path / "api.py"
    cfg.write_text(
        "from orchestra.datasets.lmeval import LmEvalDataset\n"
        "from orchestra.models.openai_api import OpenAIAPI\n"
        f"models = [dict(type=OpenAIAPI, abbr='api', path='test-model', base_url={server.base_url!r},\n"
        "               endpoint='completions', key_env=None, max_connections=4)]\n"
        f"datasets = [dict(type=LmEvalDataset, abbr='gsm8k', task='gsm8k', include_path={str(offline)!r},\n"
        "                 test_range='[0:3]'),\n"
        f"            dict(type=LmEvalDataset, abbr='arc', task='arc_easy', include_path={str(offline)!r},\n"
        "                 test_range='[0:4]')]\n"
        f"work_dir = {str(tmp_path / 'out')!r}\n"
        "from orchestra.runners import LocalRunner\n"
        "from orchestra.tasks import EvalTask, InferTask\n"
        "infer = dict(runner=dict(type=LocalRunner, max_num_workers=1, reuse_workers=True,\n"
        "                         task=dict(type=InferTask)))\n"
        "eval = dict(overlap=False,  # after the infer stage: every eval task finds the warm worker\n"
        "            runner=dict(type=LocalRunner, max_num_workers=1, reuse_workers=True, task=dict(type=EvalTask)))\n"
    )
    site, log = tmp_path / "site", tmp_path / "imports"
    site.mkdir()
    log.mkdir()
    (site / "sitecustomize.py").write_text(_SITE)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(REPO)]), "HF_DATASETS_OFFLINE": "1",
           "HF_HUB_OFFLINE": "1", "ORCHESTRA_CACHE_DIR": str(lmeval_index.seed(tmp_path / "cache")),
           "ORCHESTRA_TEST_IMPORT_LOG": str(log)}
    proc = subprocess.run([sys.executable, str(REPO / "run.py"), str(cfg)], capture_output=True, text=True,
                          env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert lmeval_index.untouched(tmp_path / "cache")  # the seeded stock index was read, not built again
    notes = {p.name: json.loads(p.read_text()) for p in log.iterdir()}
    workers = [argv for name, argv in notes.items() if name.startswith("evaluator-")]
    assert any("orchestra.tasks.worker" in argv for argv in workers), notes  # the task worker was watched
    assert not [argv for name, argv in notes.items() if name.startswith("torch-")], notes  # no torch imported
    (run,) = glob.glob(str(tmp_path / "out" / "*" / "results" / "api"))
    srv = _server_module()

    gsm = json.loads(Path(run, "gsm8k.json").read_text())
    assert set(gsm["metrics"]) == {"exact_match,strict-match", "exact_match_stderr,strict-match",
                                   "exact_match,flexible-extract", "exact_match_stderr,flexible-extract"}
    preds = _predictions(tmp_path, "gsm8k")
    assert len(preds) == 3
    details = [json.loads(line) for line in open(Path(run, "gsm8k.details.jsonl"))]
    for pred in preds:
        (call,) = pred["calls"]
        prompt, gen = call["args"]
        assert call["type"] == "generate_until" and "Question:" in gen["until"]
        assert prompt.count("Question:") == 6  # lm-eval's 5-shot context, then the question
        expected = srv.answer([{"role": "user", "content": prompt}])
        assert pred["responses"] == [expected]
        flexible = next(d for d in details
                        if d["doc_id"] == pred["gold"]["doc_id"] and d["filter"] == "flexible-extract")
        assert flexible["filtered_resps"] == [expected]  # lm-eval's regex keeps the number

    arc = json.loads(Path(run, "arc.json").read_text())
    assert {"acc,none", "acc_norm,none"} <= set(arc["metrics"])
    preds = _predictions(tmp_path, "arc")
    assert len(preds) == 4
    for pred in preds:
        assert len(pred["calls"]) >= 3 and all(c["type"] == "loglikelihood" for c in pred["calls"])
        for call, (ll, _greedy) in zip(pred["calls"], pred["responses"], strict=True):
            ctx, cont = call["args"]
            text = ctx + cont
            assert ll == sum(srv.OpenAIServer._char_logprob(text, i) for i in range(len(ctx), len(text)))
