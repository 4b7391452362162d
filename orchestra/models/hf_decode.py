"""Greedy decoding with a static KV cache, its one-token step replayed as a CUDA graph.

``model.generate`` spends most of a decoding step in Python on a GPU: on an H100 a 1B
model at batch 32 took ~29 ms per step where the kernels need ~2 ms, so the GPU sat idle
most of the time.  :func:`decode_greedy` runs the same greedy loop with a
:class:`transformers.StaticCache` (fixed shapes, written in place), so that on CUDA one
step can be captured once as a CUDA graph and then replayed: one launch per step instead
of hundreds.  Elsewhere (the CPU, or where capture fails) the same loop runs eagerly.

It produces what ``generate`` produces for greedy decoding: left-padded prompts, position
ids counted over real tokens only, a row that is done gets the pad token from then on,
and the loop ends when every row is done.  Whether a row is done is the caller's
``is_done`` (end-of-sequence, length, stop strings), asked once per step with each row's
newest token, so only one small copy per step reaches the host.

Masks are built here as 4-D boolean tensors (each query token sees the real tokens up to
itself, and always itself, so a padding position never has an empty row), which the
model uses as given: nothing in a step depends on the data, as graph capture needs.

torch and transformers are reached through arguments or imported inside functions.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

#: generation_config fields that make ``generate`` change logits or stop on its own: where
#: a model's defaults set any of them, the static loop would not give the same text.
_PROCESSORS = (
    "no_repeat_ngram_size", "bad_words_ids", "suppress_tokens", "begin_suppress_tokens",
    "forced_bos_token_id", "forced_eos_token_id", "sequence_bias", "min_length", "min_new_tokens",
    "encoder_no_repeat_ngram_size", "exponential_decay_length_penalty", "max_time", "stop_strings",
)
#: Eager steps run before a step is captured (lazy set-up inside the libraries; and a round
#: whose rows all stop within these steps never pays for a capture).
_WARM_STEPS = 4


def static_decode_fits(model: Any, config: dict[str, Any]) -> bool:
    """True when :func:`decode_greedy` gives what ``generate`` would for ``config``: greedy,
    no repetition penalty, and no logits processor set by the model's own defaults."""
    if config.get("do_sample") or float(config.get("repetition_penalty") or 1.0) != 1.0:
        return False
    if getattr(model.config, "is_encoder_decoder", False) or _cache_arg(model) is None:
        return False
    if getattr(model.config, "_attn_implementation", None) != "sdpa":  # the boolean 4-D mask is sdpa's form
        return False
    gen = getattr(model, "generation_config", None)
    if gen is not None:
        for name in _PROCESSORS:
            value = getattr(gen, name, None)
            if value not in (None, 0, [], {}) and not (name == "min_length" and value == 0):
                return False
    try:
        import transformers

        return hasattr(transformers, "StaticCache")
    except ImportError:
        return False


def _cache_arg(model: Any) -> str | None:
    """The keyword ``forward`` takes the cache by (renamed in transformers 5.x)."""
    params = inspect.signature(model.forward).parameters
    for name in ("cache", "past_key_values"):
        if name in params:
            return name
    return None


class _Step:
    """One decoding step of a fixed batch: feed ``ids`` (rows x 1), get the next tokens.

    Holds the static buffers (ids, positions, mask) the step reads; ``graph``: replay a
    captured CUDA graph instead of calling the model."""

    def __init__(self, torch: Any, model: Any, cache: Any, mask: Any, positions: Any) -> None:
        self.torch = torch
        self.model = model
        self.cache = cache
        self.cache_arg = _cache_arg(model) or "past_key_values"
        self.mask = mask  # (rows, 1, 1, L) bool: what the newest token may see
        self.positions = positions  # (rows, 1) long
        self.ids = torch.zeros_like(positions)
        self.next = torch.zeros(positions.shape[0], dtype=torch.long, device=positions.device)
        self.graph: Any = None

    def eager(self) -> None:
        kwargs = {self.cache_arg: self.cache}
        out = self.model(input_ids=self.ids, attention_mask=self.mask, position_ids=self.positions,
                         use_cache=True, logits_to_keep=1, **kwargs)
        self.next.copy_(out.logits[:, -1].argmax(-1))

    def capture(self) -> None:
        """Record one step as a CUDA graph; the caller has already run it eagerly on this
        cache (so nothing is set up for the first time inside the capture)."""
        torch = self.torch
        lengths = [layer.cumulative_length.clone() for layer in self.cache.layers]
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self.eager()
        # capture records kernels without running them; the cache's write positions must
        # still be where they were
        for layer, n in zip(self.cache.layers, lengths):
            layer.cumulative_length.copy_(n)
        self.graph = graph

    def __call__(self) -> None:
        if self.graph is not None:
            self.graph.replay()
        else:
            self.eager()


def decode_greedy(
    torch: Any, model: Any, ids: Any, mask: Any, max_new: int, pad_id: int,
    is_done: Callable[[int, list[int]], list[bool]], use_graph: bool,
) -> tuple[Any, str]:
    """Greedy continuations of the left-padded batch ``ids`` / ``mask`` (rows x width, on
    the model's device): at most ``max_new`` tokens per row, as a (rows x steps) tensor
    where a row's tokens after it is done are ``pad_id``.

    ``is_done(step, newest)`` gets the step count (1 for the first new token) and each
    row's newest token and says which rows are done.  ``use_graph``: capture the step as a
    CUDA graph (falls back to eager steps, with a warning, where capture fails).  Returns
    the tokens and how the steps ran (``'graph'`` or ``'eager'``).
    """
    import transformers

    use_graph = use_graph and ids.device.type == "cuda"
    rows, width = ids.shape
    total = width + max_new
    dev = ids.device
    cache = transformers.StaticCache(config=model.config, max_cache_len=total)
    real = torch.zeros(rows, total, dtype=torch.bool, device=dev)
    real[:, :width] = mask.bool()
    q = torch.arange(width, device=dev)[:, None]
    k = torch.arange(total, device=dev)[None, :]
    sees = ((k <= q)[None] & real[:, None, :]) | (k == q)[None]  # (rows, width, total)
    positions = (mask.long().cumsum(-1) - 1).clamp(min=0)
    with torch.inference_mode():
        out = model(input_ids=ids, attention_mask=sees[:, None], position_ids=positions, use_cache=True,
                    logits_to_keep=1, **{_cache_arg(model) or "past_key_values": cache})
        first = out.logits[:, -1].argmax(-1)
        del out, sees
        step = _Step(torch, model, cache, real[:, None, None, :].clone(), positions[:, -1:].clone())
        return _loop(torch, step, first, width, max_new, pad_id, is_done, use_graph)


def _loop(
    torch: Any, step: _Step, first: Any, width: int, max_new: int, pad_id: int,
    is_done: Callable[[int, list[int]], list[bool]], use_graph: bool,
) -> tuple[Any, str]:
    rows = first.shape[0]
    done_before = torch.zeros(rows, dtype=torch.bool, device=first.device)
    done_host = [False] * rows
    columns = []
    nxt = first
    mode = "eager"
    for t in range(max_new):
        token = torch.where(done_before, torch.full_like(nxt, pad_id), nxt)
        columns.append(token)
        done = is_done(t + 1, token.tolist())  # the one copy to the host per step
        if all(done) or t + 1 == max_new:
            break
        if done != done_host:
            done_host = list(done)
            done_before = torch.tensor(done_host, dtype=torch.bool).to(first.device)
        # the token just chosen goes in at position width + t
        step.ids.copy_(token[:, None])
        step.positions.add_(1)
        step.mask[:, :, :, width + t] = True
        if use_graph and step.graph is None and t >= _WARM_STEPS:
            try:
                step.capture()
                mode = "graph"
            except Exception as exc:  # noqa: BLE001 - any capture failure means: run eagerly
                log.warning("decoding step could not be captured as a CUDA graph (%s); running it eagerly", exc)
                use_graph = False
                torch.cuda.synchronize()
        step()
        nxt = step.next
    return torch.stack(columns, dim=1), mode
