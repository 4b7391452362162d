"""The loop's options are declared once (``LoopOptions`` in ``runners/core/loop.py``): no runner
restates them in its signature, each keeps its documented defaults, and the config check reads
them from the TypedDict."""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import pytest

from examples.subprocess_runner import SubprocessRunner
from orchestra.config.schema import check_kwargs
from orchestra.errors import ConfigError
from orchestra.runners import DLCRunner, LocalRunner, RayRunner, SlurmRunner
from orchestra.runners.base import CommandLoopOptions, LoopOptions

RUNNERS = [LocalRunner, SlurmRunner, DLCRunner, RayRunner, SubprocessRunner]


@pytest.mark.parametrize("cls", RUNNERS, ids=lambda c: c.__name__)
def test_no_runner_restates_a_loop_option_in_its_signature(cls: type) -> None:
    own = set(inspect.signature(cls.__init__).parameters)
    assert not own & set(CommandLoopOptions.__annotations__), own & set(CommandLoopOptions.__annotations__)
    assert "loop" in own


def _aliyun(tmp_path: Path) -> str:
    path = tmp_path / "aliyun.json"
    path.write_text(json.dumps({"workspace_id": "w", "resource_id": "r", "worker_image": "img",
                                "python_env_path": "/opt/py"}))
    return str(path)


def test_each_runner_keeps_its_documented_defaults(tmp_path: Path) -> None:
    srun, sbatch = SlurmRunner(), SlurmRunner(launcher="sbatch")
    assert (srun.max_num_workers, srun.max_infra_retries, srun.poll_interval_s) == (32, 3, 0.1)
    assert sbatch.poll_interval_s == 1.0
    local = LocalRunner(gpus=[])
    assert (local.max_num_workers, local.max_infra_retries, local.poll_interval_s) == (4, 0, 0.02)
    assert LocalRunner(gpus=[str(i) for i in range(6)]).max_num_workers == 6  # one per GPU slot
    ray = RayRunner()
    assert (ray.max_num_workers, ray.max_infra_retries, ray.poll_interval_s) == (32, 3, 0.02)
    dlc = DLCRunner(_aliyun(tmp_path))
    assert (dlc.max_num_workers, dlc.retry_backoff_s, dlc.max_infra_retries) == (32, 10.0, 3)
    assert SlurmRunner(max_num_workers=None).max_num_workers == 32  # None: the runner's default
    given = SlurmRunner(max_num_workers=5, retry=2, retry_backoff_s=0.5, timeout_s=9, infra_retry=0)
    assert (given.max_num_workers, given.retry, given.retry_backoff_s, given.timeout_s,
            given.max_infra_retries) == (5, 2, 0.5, 9, 0)


def test_the_config_check_reads_the_loop_options_from_the_typed_dict() -> None:
    check_kwargs(SlurmRunner, {"max_num_workers": 2, "template": "env {task_cmd}"}, "infer.runner")
    with pytest.raises(ConfigError, match=r"infer.runner.retry: expected int, got str '3'"):
        check_kwargs(SlurmRunner, {"retry": "3"}, "infer.runner")
    with pytest.raises(ConfigError, match="unknown key 'max_workers'"):
        check_kwargs(LocalRunner, {"max_workers": 2}, "infer.runner")
    with pytest.raises(ConfigError, match="unknown key 'template'"):  # a Ray task is no command
        check_kwargs(RayRunner, {"template": "env {task_cmd}"}, "infer.runner")
    assert set(LoopOptions.__annotations__) < set(CommandLoopOptions.__annotations__)
