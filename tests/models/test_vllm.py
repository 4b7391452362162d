"""VLLMModel without a GPU: argument handling, what it hands to vLLM, the data-parallel
split, and the error when vllm is missing.  A small stand-in ``vllm`` package (written to a
temporary folder) records what the model builds; real vLLM runs need a CUDA machine."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from orchestra.errors import ConfigError, ModelError
from orchestra.models.vllm import VLLMModel, replica_devices, run_cfg_for, visible_gpus
from orchestra.ranges import even_ranges
from orchestra.requests import GenRequest, LoglikRequest

FAKE_VLLM = textwrap.dedent(
    '''
    """A stand-in for vllm's offline API: char-level tokens, answers that say where they ran."""
    import os
    from types import SimpleNamespace

    CREATED = []


    class SamplingParams:
        def __init__(self, **kwargs):
            self.kwargs = kwargs
            for k, v in kwargs.items():
                setattr(self, k, v)


    class _Tokenizer:
        bos_token_id = None
        eos_token_id = 0
        chat_template = None

        def __call__(self, text, add_special_tokens=True):
            return {"input_ids": [ord(c) for c in text]}


    class LLM:
        def __init__(self, **kwargs):
            self.kwargs = kwargs
            CREATED.append(kwargs)

        def get_tokenizer(self):
            return _Tokenizer()

        def generate(self, prompts, params, use_tqdm=True):
            params = params if isinstance(params, list) else [params] * len(prompts)
            outs = []
            for prompt, p in zip(prompts, params):
                ids = prompt["prompt_token_ids"]
                if getattr(p, "prompt_logprobs", None):
                    per_pos = [None] + [{t: SimpleNamespace(logprob=-1.0)} for t in ids[1:]]
                    outs.append(SimpleNamespace(prompt_logprobs=per_pos, outputs=[]))
                else:
                    devices = os.environ.get("CUDA_VISIBLE_DEVICES")
                    text = "%s|%s|%d|STOP tail" % (devices, "".join(map(chr, ids)), p.max_tokens)
                    outs.append(SimpleNamespace(outputs=[SimpleNamespace(text=text)]))
            return outs
    '''
)


@pytest.fixture
def fake_vllm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    pkg = tmp_path / "fake" / "vllm"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(FAKE_VLLM)
    monkeypatch.syspath_prepend(str(tmp_path / "fake"))
    monkeypatch.delitem(sys.modules, "vllm", raising=False)
    import vllm

    yield vllm
    sys.modules.pop("vllm", None)


# --------------------------------------------------------------------------------------
# arguments


@pytest.mark.parametrize(
    "kwargs, key",
    [
        (dict(tensor_parallel_size=0), "tensor_parallel_size"),
        (dict(data_parallel_size=0), "data_parallel_size"),
        (dict(gpu_memory_utilization=1.5), "gpu_memory_utilization"),
        (dict(dtype="int4"), "dtype"),
        (dict(generation_kwargs={"beam_width": 4}), "beam_width"),
    ],
)
def test_bad_arguments(kwargs: dict, key: str) -> None:
    with pytest.raises(ConfigError) as exc:
        VLLMModel(abbr="v", path="/ckpt", **kwargs)
    assert key in str(exc.value) and "\n" not in str(exc.value)


def test_gpus_one_task_needs() -> None:
    assert VLLMModel.resources(dict(abbr="v", path="/ckpt", tensor_parallel_size=2, data_parallel_size=4)) == {
        "num_gpus": 8,
        "num_procs": 1,
    }
    assert run_cfg_for(dict(path="/ckpt", tensor_parallel_size=4)) == {"num_gpus": 4, "num_procs": 1}
    assert run_cfg_for(dict(tensor_parallel_size=4, run_cfg=dict(num_gpus=8)))["num_gpus"] == 8


def test_replica_devices() -> None:
    assert replica_devices(["4", "5", "6", "7"], 2, 2) == ["4,5", "6,7"]
    assert replica_devices(["0", "1", "2"], 1, 3) == ["0", "1", "2"]
    assert replica_devices(["0", "1", "2", "3", "4"], 4, 1) == ["0,1,2,3"]
    with pytest.raises(ModelError) as exc:
        replica_devices(["0", "1"], 2, 2)
    assert "needs 4 GPUs" in str(exc.value) and "num_gpus=4" in str(exc.value)


def test_visible_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert visible_gpus(2) == ["0", "1"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3, 5")
    assert visible_gpus(2) == ["3", "5"]


def test_batches_split_evenly_across_replicas() -> None:
    assert even_ranges(5, 2) == [(0, 3), (3, 5)]
    assert even_ranges(1, 3) == [(0, 1), (1, 1), (1, 1)]


def test_sampling_kwargs() -> None:
    model = VLLMModel(abbr="v", path="/ckpt")
    assert model.sampling_kwargs(GenRequest("p", max_out_len=32, stop=("\n",))) == {
        "max_tokens": 32,
        "temperature": 0.0,
        "top_p": 1.0,
        "stop": ["\n"],
    }
    sampled = model.sampling_kwargs(GenRequest("p", temperature=0.7, top_p=0.9, seed=3))
    assert (sampled["temperature"], sampled["top_p"], sampled["seed"]) == (0.7, 0.9, 3)
    # a model's generation_kwargs are the defaults of greedy, unseeded requests
    tuned = VLLMModel(abbr="v", path="/ckpt", generation_kwargs=dict(temperature=0.6, top_p=0.95, top_k=20))
    got = tuned.sampling_kwargs(GenRequest("p"))
    assert (got["temperature"], got["top_p"], got["top_k"]) == (0.6, 0.95, 20)


def test_llm_kwargs() -> None:
    model = VLLMModel(
        abbr="v",
        path="/ckpt",
        tensor_parallel_size=2,
        max_model_len=4096,
        dtype="bfloat16",
        engine_kwargs=dict(enforce_eager=True),
    )
    assert model.llm_kwargs() == {
        "model": "/ckpt",
        "tensor_parallel_size": 2,
        "gpu_memory_utilization": 0.9,
        "dtype": "bfloat16",
        "trust_remote_code": False,
        "seed": 0,
        "max_model_len": 4096,
        "enforce_eager": True,
    }
    assert "max_model_len" not in VLLMModel(abbr="v", path="/ckpt").llm_kwargs()


def test_missing_vllm_is_one_clear_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "vllm", None)
    model = VLLMModel(abbr="v", path="/ckpt")
    with pytest.raises(ModelError) as exc:
        model.generate_batch([GenRequest("hi")])
    assert "pip install vllm" in str(exc.value) and "\n" not in str(exc.value)
    with pytest.raises(ModelError):
        VLLMModel(abbr="v", path="/ckpt", data_parallel_size=2).generate_batch([GenRequest("hi")])


# --------------------------------------------------------------------------------------
# what reaches vLLM (stand-in package)


def test_one_replica_in_process(fake_vllm, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2")
    model = VLLMModel(abbr="v", path="/ckpt", max_model_len=128)
    outs = model.generate_batch([GenRequest("ab", max_out_len=5, stop=("STOP",)), GenRequest("c", max_out_len=7)])
    assert outs == ["2|ab|5|", "2|c|7|STOP tail"]
    assert fake_vllm.CREATED[-1]["model"] == "/ckpt" and fake_vllm.CREATED[-1]["max_model_len"] == 128
    # char-level tokens, every prompt token scored -1: the sum counts continuation tokens
    scores = model.loglikelihood_batch([LoglikRequest("Answer:", (" yes", " no", "")), LoglikRequest("", ("xy",))])
    assert scores == [[-4.0, -3.0, 0.0], [-2.0]]
    # a row longer than max_model_len - 1 (room for the token vLLM generates) loses its left end
    cut = VLLMModel(abbr="v", path="/ckpt", max_model_len=8)
    assert cut.loglikelihood_batch([LoglikRequest("a" * 20, ("b" * 10, "c"))]) == [[-6.0, -1.0]]


def test_data_parallel_replicas_get_their_own_gpus(fake_vllm, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")
    model = VLLMModel(abbr="v", path="/ckpt", tensor_parallel_size=2, data_parallel_size=2)
    try:
        outs = model.generate_batch([GenRequest(p, max_out_len=3) for p in ("a", "b", "c")])
        assert outs == ["4,5|a|3|STOP tail", "4,5|b|3|STOP tail", "6,7|c|3|STOP tail"]
        assert model.loglikelihood_batch([LoglikRequest("q", (" a",)), LoglikRequest("q", (" bc",))]) == [
            [-2.0],
            [-3.0],
        ]
    finally:
        import asyncio

        asyncio.run(model.aclose())
    assert model._replicas == []
