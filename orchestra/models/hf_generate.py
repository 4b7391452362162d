"""Generation batches for HFCausalLM: sizes from the KV cache, per-row stops, OOM splits.

Prompts of one sampling setting are sorted by length and cut into batches of at most
``batch_size`` rows whose KV cache (rows x (padded prompt + new tokens)) fits the budget.
Each row stops on its own (its stop strings or its length) while the others go on; the
check moves the newest tokens of all rows to the host once per step and decodes only a
short tail of each row that is still running.  A batch that runs out of memory is split in
two and retried; later batches stay at most as large as the last one that failed, halved.

torch and transformers are imported inside functions only.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

log = logging.getLogger(__name__)

#: Tokens of a row's tail decoded per step for each character of its longest stop string.  A
#: byte-level token holds at least one byte and a character at most four, so a stop string
#: that first appears at this step lies inside a tail of 4 tokens per character, plus the
#: newest token (+ a margin).
_TAIL_TOKENS_PER_CHAR = 4
_TAIL_MARGIN = 4


def kv_bytes_per_token(config: Any, itemsize: int) -> int | None:
    """Bytes of keys and values one token keeps in the cache of a standard decoder
    (``None`` when the config does not say enough to tell)."""
    layers = getattr(config, "num_hidden_layers", None)
    heads = getattr(config, "num_attention_heads", None)
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None)
    hidden = getattr(config, "hidden_size", None)
    if head_dim is None and hidden and heads:
        head_dim = hidden // heads
    if not (layers and kv_heads and head_dim):
        return None
    return 2 * int(layers) * int(kv_heads) * int(head_dim) * itemsize


def cut_batches(
    lengths: Sequence[int], new_tokens: Sequence[int], max_rows: int, max_kv_tokens: int | None
) -> list[list[int]]:
    """Indices of the prompts, shortest first, cut into batches of at most ``max_rows`` rows
    whose cache, rows x (longest prompt + most new tokens), stays within ``max_kv_tokens``
    (``None``: no limit).  A prompt too large alone gets a batch of its own."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    batches: list[list[int]] = []
    cur: list[int] = []
    width = new = 0
    for i in order:
        w, m = max(width, lengths[i]), max(new, new_tokens[i])
        if cur and (len(cur) >= max_rows or (max_kv_tokens is not None and (len(cur) + 1) * (w + m) > max_kv_tokens)):
            batches.append(cur)
            cur, w, m = [], lengths[i], new_tokens[i]
        cur.append(i)
        width, new = w, m
    if cur:
        batches.append(cur)
    return batches


class RoundState:
    """What one round of ``generate`` knows about its rows, on the host.

    A row is done once it emits an end-of-sequence token, reaches its length, or its text
    holds one of its stop strings.  A stop string can only first appear with a token whose
    text holds its last character (or a byte of one), so the tail is decoded only after
    such a token; what each token's text holds is looked up once.  The round itself is cut
    short (every row reported done) once at least half the rows are done and the steps left
    for the done rows would cost more than reading the open rows again in a new round (one
    token read ~ one row-step).
    """

    def __init__(
        self, decode: Callable[[list[int]], str], width: int, limits: Sequence[int], stops: Sequence[Sequence[str]],
        eos_ids: set[int], lengths: Sequence[int], may_cut: bool,
    ) -> None:
        self.decode = decode
        self.width = width
        self.limits = list(limits)
        self.stops = [tuple(s for s in row if s) for row in stops]
        self.eos_ids = eos_ids
        self.lengths = list(lengths)
        self.may_cut = may_cut and len(limits) > 1
        longest = max((len(s) for row in self.stops for s in row), default=0)
        self.tail = _TAIL_TOKENS_PER_CHAR * longest + _TAIL_MARGIN
        self.done = [False] * len(limits)
        self.cut = False
        self._ends = {s[-1] for row in self.stops for s in row}
        self._may_end: dict[int, bool] = {}

    def _could_end_a_stop(self, token: int) -> bool:
        hit = self._may_end.get(token)
        if hit is None:
            text = self.decode([token])
            # a lone byte of a multi-byte character decodes to U+FFFD: decode the tail to be sure
            hit = "\ufffd" in text or any(c in text for c in self._ends)
            self._may_end[token] = hit
        return hit

    def step(self, new: int, tails: list[list[int]]) -> list[bool]:
        """Mark rows done after ``new`` tokens; ``tails`` are each row's newest tokens."""
        for r, ids in enumerate(tails):
            if self.done[r]:
                continue
            if ids[-1] in self.eos_ids or new >= self.limits[r]:
                self.done[r] = True
            elif self.stops[r] and self._could_end_a_stop(ids[-1]):
                text = self.decode(ids[-min(self.tail, new) :])
                self.done[r] = any(s in text for s in self.stops[r])
        if self.may_cut and not all(self.done):
            closed = sum(self.done)
            open_rows = [r for r, d in enumerate(self.done) if not d]
            left = max(self.limits[r] for r in open_rows) - new
            reread = sum(self.lengths[r] + new for r in open_rows)
            self.cut = closed >= len(open_rows) and left * closed > reread
        return [True] * len(self.done) if self.cut else self.done


def generate_rounds(
    torch: Any, transformers: Any, model: Any, tokenizer: Any, left_pad: Callable[[list[list[int]]], tuple[Any, ...]],
    prompts: Sequence[list[int]], limits: Sequence[int], stops: Sequence[Sequence[str]], config: dict[str, Any],
    static: str | None = None,
) -> tuple[list[list[int]], int]:
    """The new tokens of each prompt (at most its limit; after an end-of-sequence token the
    rest is padding), generated in rounds: when most rows are done, the round ends and only
    the open rows go on, their text so far read again as a prompt.

    ``static``: ``None`` runs each round through ``model.generate``; ``'eager'`` or
    ``'graph'`` through :func:`~orchestra.models.hf_decode.decode_greedy` (greedy only; with
    its step replayed as a CUDA graph for ``'graph'``).  Returns the tokens and the number
    of rounds."""
    eos = config.get("eos_token_id")
    eos_ids = set(eos if isinstance(eos, (list, tuple)) else [eos] if eos is not None else [])

    def decode(ids: list[int]) -> str:
        return str(tokenizer.decode(ids, skip_special_tokens=True))

    class _Stop(transformers.StoppingCriteria):
        def __init__(self, rows: RoundState) -> None:
            self.rows = rows

        def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
            new = input_ids.shape[1] - self.rows.width
            done = self.rows.step(new, input_ids[:, -min(self.rows.tail, new) :].tolist())  # one copy to the host
            return torch.tensor(done, dtype=torch.bool, device=input_ids.device)

    out: list[list[int]] = [[] for _ in prompts]
    open_rows = list(range(len(prompts)))
    rounds = 0
    while open_rows:
        rounds += 1
        inputs = [list(prompts[r]) + out[r] for r in open_rows]
        left = [limits[r] - len(out[r]) for r in open_rows]
        ids, mask, _ = left_pad(inputs)
        width = ids.shape[1]
        rows = RoundState(decode, width, left, [stops[r] for r in open_rows], eos_ids, [len(x) for x in inputs], True)

        if static is not None:
            new_ids = _decode_static(torch, model, ids, mask, max(left), config, rows, static == "graph")
        else:
            gen_cfg = transformers.GenerationConfig(max_new_tokens=max(left), **config)
            with torch.inference_mode():
                result = model.generate(
                    input_ids=ids, attention_mask=mask, generation_config=gen_cfg,
                    stopping_criteria=transformers.StoppingCriteriaList([_Stop(rows)]),
                )
            new_ids = result[:, width:].tolist()
        still = []
        for k, r in enumerate(open_rows):
            out[r].extend(new_ids[k][: left[k]])
            if not rows.done[k] and len(out[r]) < limits[r]:
                still.append(r)
        open_rows = still
    return out, rounds


def _decode_static(
    torch: Any, model: Any, ids: Any, mask: Any, max_new: int, config: dict[str, Any], rows: RoundState, graph: bool
) -> list[list[int]]:
    """One round through the static-cache loop, each row's tail kept on the host for the stop check."""
    from orchestra.models.hf_decode import decode_greedy

    kept: list[list[int]] = [[] for _ in range(ids.shape[0])]

    def is_done(new: int, newest: list[int]) -> list[bool]:
        for row, token in zip(kept, newest):
            row.append(token)
            if len(row) > rows.tail:
                del row[0]
        return rows.step(new, kept)

    pad = config.get("pad_token_id")
    tokens, mode = decode_greedy(torch, model, ids, mask, max_new, int(pad if pad is not None else 0), is_done, graph)
    log.info("a round of %d rows: %d steps with a static cache (%s)", ids.shape[0], tokens.shape[1], mode)
    return list(tokens.tolist())


def generated_tokens(ids: list[int], ends: set[int]) -> int:
    """Tokens a row generated: up to its first end-of-sequence token (the rest is padding)."""
    for i, t in enumerate(ids):
        if t in ends:
            return i + 1
    return len(ids)
