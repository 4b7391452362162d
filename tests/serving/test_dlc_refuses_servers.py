"""DLC cannot host managed replicas: a served model's tasks fail with one line naming why, and no
DLC job is submitted (the DLC double of tests/runners/dlc stands in for the ``dlc`` client)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO
from tests.serving.test_managed_runs import config, llama

sys.path[:0] = [str(REPO / "tests/runners/dlc"), str(REPO / "tests")]
from dlc_helpers import Double, aliyun_cfg, dlc_runner, run_cli  # noqa: E402

pytestmark = pytest.mark.slow


def test_a_served_model_on_dlc_fails_in_one_line_and_submits_nothing(tmp_path: Path) -> None:
    (tmp_path / "aliyun.json").write_text(json.dumps(aliyun_cfg(tmp_path)))
    cfg = config(tmp_path, llama(replicas=1), rows=4)
    runner = dlc_runner(tmp_path).replace("type=DLCRunner", "type='DLCRunner'")
    runner = f"dict({runner}, task=dict(type='InferTask'))"
    cfg.write_text(cfg.read_text().replace("dict(type='LocalRunner', task=dict(type='InferTask'), gpus=[])", runner))
    assert "DLCRunner" in cfg.read_text()
    cloud = Double(tmp_path / "cloud")
    state = cloud.state
    res = run_cli(state, cfg, timeout=120)
    assert res.returncode == 1, res.stderr[-2000:]
    (line,) = [ln for ln in res.stderr.splitlines() if ln.startswith("FAILED: infer task")]
    assert "managed servers (server=dict(...)) cannot run on DLC: a DLC job cannot host a replica" in line
    assert cloud.job_ids() == [] and not cloud.calls("submit")
    assert not list((tmp_path / "out").rglob("servers/ledger.jsonl"))  # no replica was started anywhere
