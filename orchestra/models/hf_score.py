"""Scoring log-likelihood rows with a loaded transformers model, pass by pass.

:class:`LoglikScorer` runs the passes :mod:`orchestra.models.hf_pack` plans: each request's
context read once with its choices on top (a block mask), short requests packed side by
side, passes sized by a token budget.  Only the positions that predict a scored token go
through the output head, and only those logits are cast to float for the log-softmax.  A
pass that runs out of memory is split in two and retried, and the budget is lowered for
the passes after it; only one sequence that cannot fit alone is an error.

Two things are checked once per loaded model, on a probe, before they are relied on: that
the decoder's hidden states through the output head give the model's own logits (else the
full forward is used), and that a packed pass scores what separate sequences score (else
every row is run as its own sequence, as for attention kernels that take no custom mask).

torch is reached through the :class:`~orchestra.models.hf_load.LoadedLM`; nothing is
imported at module level.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Sequence
from typing import Any

from orchestra.errors import ModelError
from orchestra.models.base import ModelStats
from orchestra.models.hf_common import LoglikRow
from orchestra.models.hf_load import LoadedLM
from orchestra.models.hf_pack import PackedBatch, build_batch, group_rows, plan_batches, split_group

log = logging.getLogger(__name__)

#: Attention implementations that take a custom 4-D mask (bool for sdpa, additive for eager).
MASKED_ATTENTION = ("sdpa", "eager")
#: Scored positions whose logits are computed at once.
_HEAD_CHUNK = 512
_PROBE_TEXT = "Question: Which gas do plants take in from the air?\nAnswer:"
_PROBE_CHOICES = (" carbon dioxide", " oxygen and water vapour", " nitrogen")


def is_oom(exc: BaseException) -> bool:
    """True for an allocation that failed: CUDA's ``OutOfMemoryError``, the CPU allocator's
    ``RuntimeError`` ("can't allocate memory"), or Python's ``MemoryError``."""
    if isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError":
        return True
    if isinstance(exc, RuntimeError):
        text = str(exc)
        return "out of memory" in text.lower() or "can't allocate memory" in text
    return False


class LoglikScorer:
    """Scores :class:`~orchestra.models.hf_common.LoglikRow` lists with one loaded model.

    Args:
        lm: the loaded model.
        max_batch_tokens: padded tokens of one forward pass; lowered after an out-of-memory
            error for the rest of the scorer's life.
        stats: the model's counters; ``oom_splits`` counts passes split after running out of
            memory.
        abbr: the model's name, for messages.
    """

    def __init__(self, lm: LoadedLM, max_batch_tokens: int, stats: ModelStats, abbr: str) -> None:
        self.lm = lm
        self.budget = max_batch_tokens
        self.stats = stats
        self.abbr = abbr
        model = lm.model
        self._base: Any = model.get_decoder() if hasattr(model, "get_decoder") else None
        self._head: Any = model.get_output_embeddings()
        self._attn = getattr(model.config, "_attn_implementation", None)
        self.packed = self._attn in MASKED_ATTENTION
        self.head_only = self._base is not None and self._head is not None
        self._checked = False

    # -- the public call -------------------------------------------------------------------
    def score(self, rows: Sequence[LoglikRow]) -> list[float]:
        """The summed log-probability of each row's last ``n`` tokens, in order."""
        if not rows:
            return []
        if not self._checked:
            self._checked = True
            self._check()
        return self._score(rows, self.packed)

    def launch(self, rows: Sequence[LoglikRow]) -> Any:
        """Queue the passes that score ``rows`` without waiting for them; :meth:`collect`
        reads the values.  On a GPU the host can then tokenise and plan the next rows while
        the device runs these."""
        if not self._checked:
            self._checked = True
            self._check()
        return self._launch(rows, self.packed)

    def collect(self, launched: Sequence[Any]) -> list[list[float]]:
        """The values of several :meth:`launch` calls, read back in one copy."""
        torch = self.lm.torch
        flat = iter(torch.cat(list(launched)).tolist()) if launched else iter(())
        return [[float(next(flat)) for _ in range(t.shape[0])] for t in launched]

    def score_greedy(self, rows: Sequence[LoglikRow]) -> list[tuple[float, bool]]:
        """Each row's summed log-probability, and whether each of its scored tokens is the
        model's argmax at its position (lm-eval's ``is_greedy``), in order."""
        if not rows:
            return []
        if not self._checked:
            self._checked = True
            self._check()
        misses = self.lm.torch.zeros(len(rows), dtype=self.lm.torch.long, device=self.lm.input_device)
        values = self._launch(rows, self.packed, misses).tolist()
        return [(float(v), int(m) == 0) for v, m in zip(values, misses.tolist(), strict=True)]

    def _score(self, rows: Sequence[LoglikRow], packed: bool) -> list[float]:
        return [float(v) for v in self._launch(rows, packed).tolist()]

    def _launch(self, rows: Sequence[LoglikRow], packed: bool, misses: Any = None) -> Any:
        """Queue the passes that score ``rows``; the values land in the returned tensor, and
        (with ``misses``) each row's count of scored tokens that are not the argmax in ``misses``."""
        torch = self.lm.torch
        total = torch.zeros(len(rows), dtype=torch.float64, device=self.lm.input_device)
        pad = int(self.lm.tokenizer.pad_token_id)
        groups = group_rows(rows, share_prefix=packed)
        todo = deque(plan_batches(groups, self.budget, pad, pack=packed))
        while todo:
            batch = todo.popleft()
            try:
                self._forward(batch, total, misses)
            except Exception as exc:
                if not is_oom(exc):
                    raise
                self._free()
                smaller = self._split(batch, pad)
                self.budget = max(1, min(self.budget, batch.tokens // 2))
                self.stats.extra["oom_splits"] = self.stats.extra.get("oom_splits", 0) + 1
                log.warning(
                    "%s: a pass of %d rows x %d tokens ran out of memory; split in %d, token budget now %d",
                    self.abbr, batch.rows, batch.width, len(smaller), self.budget,
                )
                todo.extendleft(reversed(smaller))
        return total

    def _split(self, batch: PackedBatch, pad: int) -> list[PackedBatch]:
        rows = batch.row_groups
        if len(rows) > 1:
            half = len(rows) // 2
            return [build_batch(rows[:half], pad), build_batch(rows[half:], pad)]
        (only,) = rows
        if len(only) > 1:
            half = len(only) // 2
            return [build_batch([only[:half]], pad), build_batch([only[half:]], pad)]
        (group,) = only
        if len(group.branches) > 1:
            return [build_batch([[g] for g in split_group(group)], pad)]
        raise ModelError(
            f"model {self.abbr}: one sequence of {group.size} tokens does not fit in memory; "
            "lower max_seq_len or use a larger device"
        )

    def _free(self) -> None:
        torch = self.lm.torch
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    # -- one forward pass --------------------------------------------------------------------
    def _forward(self, batch: PackedBatch, total: Any, misses: Any = None) -> None:
        torch = self.lm.torch
        dev = self.lm.input_device

        def tensor(values: list[int]) -> Any:
            host = torch.tensor(values, dtype=torch.long)
            if dev.type != "cuda":
                return host
            # pinned and asynchronous: the host builds the next pass while this one runs
            return host.pin_memory().to(dev, non_blocking=True)

        shape = (batch.rows, batch.width)
        segment = tensor(batch.segment).view(shape)
        mask = (segment >= 0).long() if batch.plain else self._block_mask(segment, tensor(batch.branch).view(shape))
        args = {"input_ids": tensor(batch.ids).view(shape), "attention_mask": mask,
                "position_ids": tensor(batch.positions).view(shape)}
        pred, targets, slots = tensor(batch.pred_index), tensor(batch.targets), tensor(batch.slots)
        with torch.inference_mode():
            if self.head_only:
                states = self._base(**args, use_cache=False).last_hidden_state
            else:
                states = self.lm.model(**args, use_cache=False).logits
            states = states.reshape(-1, states.shape[-1])
            # A few hundred positions at a time: their logits over the whole vocabulary are
            # the largest tensors of the pass.
            for lo in range(0, len(batch.pred_index), _HEAD_CHUNK):
                hi = lo + _HEAD_CHUNK
                picked = states.index_select(0, pred[lo:hi])
                logits = (self._head(picked) if self.head_only else picked).float()
                target = targets[lo:hi].unsqueeze(1)
                logprobs = logits.gather(1, target).squeeze(1) - torch.logsumexp(logits, dim=-1)
                total.index_add_(0, slots[lo:hi], logprobs.to(total.dtype))
                if misses is not None:
                    missed = (logits.argmax(dim=-1) != targets[lo:hi]).long()
                    misses.index_add_(0, slots[lo:hi], missed)

    def _block_mask(self, segment: Any, branch: Any) -> Any:
        """(rows, 1, width, width), on the model's device: each token sees itself, and
        earlier tokens of its own group that are in the prefix or in its own branch."""
        torch = self.lm.torch
        width = segment.shape[1]
        dev = segment.device
        causal = torch.ones(width, width, dtype=torch.bool, device=dev).tril()
        same = segment[:, :, None] == segment[:, None, :]
        visible = (branch[:, None, :] == 0) | (branch[:, :, None] == branch[:, None, :])
        allowed = (same & visible & causal) | torch.eye(width, dtype=torch.bool, device=dev)
        allowed = allowed[:, None, :, :]
        if self._attn == "sdpa":
            return allowed
        dtype = self.lm.model.dtype
        return torch.zeros(allowed.shape, dtype=dtype, device=dev).masked_fill(~allowed, torch.finfo(dtype).min)

    # -- checks on a probe, once per loaded model ----------------------------------------------
    def _check(self) -> None:
        """Fall back to the slower forms where this model does not give the same numbers."""
        from orchestra.models.hf_common import loglik_rows
        from orchestra.requests import LoglikRequest

        rows = loglik_rows(self.lm.tokenizer, [LoglikRequest(_PROBE_TEXT, _PROBE_CHOICES)], False)
        tol = self._tolerance()
        if self.head_only:
            self.head_only = False
            full = self._score(rows, packed=False)
            self.head_only = True
            fast = self._score(rows, packed=False)
            if not _close(full, fast, tol):
                log.warning("%s: output head alone differs from the model's logits (%s vs %s); using full logits",
                            self.abbr, fast, full)
                self.head_only = False
        if self.packed:
            plain = self._score(rows, packed=False)
            packed = self._score(rows, packed=True)
            if not _close(plain, packed, tol):
                log.warning("%s: packed scoring differs from separate sequences (%s vs %s); scoring each row alone",
                            self.abbr, packed, plain)
                self.packed = False
        elif self._attn not in MASKED_ATTENTION:
            log.info("%s: attention %r takes no custom mask; each choice is scored as its own sequence",
                     self.abbr, self._attn)

    def _tolerance(self) -> float:
        # float32 agrees to ~1e-4 nats; bfloat16 sums drift by up to ~0.2 nats (seen on GPU
        # against an unbatched loop).  A mask the attention ignores lets a choice see its
        # siblings, which moves a score by whole nats.
        torch = self.lm.torch
        return 1e-3 if self.lm.model.dtype == torch.float32 else 0.25


def _close(a: Sequence[float], b: Sequence[float], tol: float) -> bool:
    return all(abs(x - y) <= tol * max(1.0, abs(x)) for x, y in zip(a, b, strict=True))

