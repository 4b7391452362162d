"""A model folder damaged on disk (a weights file cut short by a full disk or an interrupted
copy, a config that is not JSON) fails HFCausalLM.load with one line naming the model and the
path, as a task error, not a traceback.  The folder is a real (tiny, randomly initialised) Llama
that transformers saves and loads."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from orchestra.errors import ModelError
from orchestra.models.hf import HFCausalLM


def _tiny_llama(folder: Path) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=2)
    LlamaForCausalLM(cfg).save_pretrained(folder)


@pytest.mark.parametrize("damage", ["weights-cut-short", "config-not-json"])
def test_a_damaged_model_folder_is_one_line_model_error(tmp_path: Path, damage: str) -> None:
    folder = tmp_path / "tiny"
    _tiny_llama(folder)
    if damage == "weights-cut-short":
        weights = folder / "model.safetensors"
        os.truncate(weights, weights.stat().st_size // 2)
    else:
        (folder / "config.json").write_text("{not json")
    model = HFCausalLM(abbr="tiny", path=str(folder), device="cpu", num_threads=1)
    with pytest.raises(ModelError) as err:
        model.load()
    text = str(err.value)
    assert text.startswith(f"model tiny: cannot load {folder}: ") and "\n" not in text, text
