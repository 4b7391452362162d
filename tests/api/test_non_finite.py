"""The Python API refuses NaN and infinity as ``run.py`` does: a ``ConfigError`` naming the key,
before anything is written (``tests/config/test_finite_settings.py`` covers every key through the
CLI).  Before, ``orchestra.run(..., **{"infer.runner.timeout_s": math.inf})`` ran the whole
evaluation, and ``plan()`` planned a NaN temperature and an infinite delay."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

import orchestra
from orchestra.errors import ConfigError
from tests.api.test_python_api import config


def _nan_in_the_dict() -> dict[str, Any]:
    cfg = config()
    cfg["models"][0]["generation_kwargs"] = {"temperature": math.nan}
    return cfg


@pytest.mark.parametrize(("call", "key", "value"), [
    (lambda work: orchestra.run(config(), work_dir=work, quiet=True, **{"infer.runner.timeout_s": math.inf}),
     r"infer\.runner\.timeout_s", "inf"),
    (lambda work: orchestra.plan(_nan_in_the_dict(), work_dir=work), r"models\[0\]\.generation_kwargs\.temperature",
     "nan"),
    (lambda work: orchestra.plan(config(), work_dir=work, cfg_options=["models.1.load_s=1e999"]),
     r"--cfg-options 'models\.1\.load_s=1e999'", "inf"),
    (lambda work: orchestra.plan(config(), work_dir=work, **{"eval.runner.retry_backoff_s": math.inf}),
     r"eval\.runner\.retry_backoff_s", "inf"),
], ids=["run-override", "plan-dict", "plan-cfg-options", "plan-override"])
def test_nan_or_infinity_is_a_config_error_naming_the_key(tmp_path: Path, call: Any, key: str, value: str) -> None:
    work = tmp_path / "out"
    with pytest.raises(ConfigError, match=rf"{key}: expected .*got (float )?{value}\b") as err:
        call(str(work))
    assert "\n" not in str(err.value)
    assert not work.exists()
