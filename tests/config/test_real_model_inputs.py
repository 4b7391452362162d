"""Bad inputs for the real-model demo config: each a one-line error naming the key, exit 2."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.helpers import run_argv

REPO = Path(__file__).resolve().parents[2]


def _not_gguf(tmp_path: Path) -> str:
    path = tmp_path / "weights.gguf"
    path.write_text("definitely not gguf")
    return str(path)


CASES = [
    (lambda t: [f"models.0.path={t / 'missing' / 'model.gguf'}"], "models[0]: model smollm2-135m: model path"),
    (lambda t: [f"models.0.path={_not_gguf(t)}"], "is not a GGUF file"),
    (lambda t: ["datasets.0.reader_cfg.input_columns=['questionz']"], "column 'questionz' not in arc_easy"),
    (lambda t: ["datasets.0.infer_cfg.prompt_template=Q: {nope}"], "uses unknown field {nope}"),
    (lambda t: ["models.0.torch_dtype=bf16"], "torch_dtype='bf16' is not valid"),
]


@pytest.mark.parametrize("make_options, expected", CASES)
def test_bad_real_model_input_is_one_line_exit_2(tmp_path: Path, make_options, expected: str) -> None:
    res = run_argv([sys.executable, "run.py", "configs/eval_llama.py", "-w", str(tmp_path / "out"), "--cfg-options",
                    *make_options(tmp_path)], timeout=120)  # forked: tests/cli_fork.py
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert "configs/eval_llama.py" in lines[0] and expected in lines[0]
    assert not (tmp_path / "out").exists()
