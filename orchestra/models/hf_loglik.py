"""The log-likelihood side of :class:`~orchestra.models.hf.HFCausalLM`: requests to scored rows.

- :func:`score_batch`: each continuation's summed log-probability (the rows of
  :func:`~orchestra.models.hf_common.loglik_rows`), in chunks on CUDA so that the host plans
  chunk k+1 while the device runs chunk k.
- :func:`greedy_batch`: the same, with whether each continuation is the model's greedy
  continuation (lm-eval's ``is_greedy``: every scored token is the argmax at its position).
- :func:`rolling_batch`: whole texts scored in lm-eval's rolling windows
  (:func:`~orchestra.models.rolling.rolling_windows`), each window read by the model as lm-eval
  reads it (at most ``max_len`` tokens), the text's value the sum over its windows.

torch is reached through the :class:`~orchestra.models.hf_load.LoadedLM`.
"""

from __future__ import annotations

from collections.abc import Callable

from orchestra.models.hf_common import LoglikRow, encode_many, loglik_rows, loglik_scores
from orchestra.models.hf_load import LoadedLM
from orchestra.models.hf_score import LoglikScorer
from orchestra.models.rolling import rolling_windows
from orchestra.requests import LoglikRequest

#: records tokens read (``prompt``, ``completion``) in the model's counters
Count = Callable[[int, int], None]


def score_batch(lm: LoadedLM, scorer: LoglikScorer, requests: list[LoglikRequest], use_chat_template: bool | None,
                max_len: int, chunk: int | None, count: Count) -> list[list[float]]:
    """One summed log-probability per continuation of each request; ``chunk``: requests per
    chunk (None: the batch at once)."""
    if chunk is None:
        rows = loglik_rows(lm.tokenizer, requests, use_chat_template, max_len)
        count(sum(len(row.ids) for row in rows), 0)
        return loglik_scores(requests, rows, scorer.score(rows))
    parts = [requests[i : i + chunk] for i in range(0, len(requests), chunk)]
    row_lists, launched = [], []
    for part in parts:
        rows = loglik_rows(lm.tokenizer, part, use_chat_template, max_len)
        row_lists.append(rows)
        launched.append(scorer.launch(rows))
    values = scorer.collect(launched)
    out: list[list[float]] = []
    for part, rows, vals in zip(parts, row_lists, values):
        out.extend(loglik_scores(part, rows, vals))
        count(sum(len(row.ids) for row in rows), 0)
    return out


def greedy_batch(lm: LoadedLM, scorer: LoglikScorer, requests: list[LoglikRequest], use_chat_template: bool | None,
                 max_len: int, count: Count) -> list[list[tuple[float, bool]]]:
    """``(summed log-probability, is greedy)`` per continuation of each request; a continuation
    without tokens scores ``(0.0, True)``, as lm-eval's ``all()`` of no tokens."""
    rows = loglik_rows(lm.tokenizer, requests, use_chat_template, max_len)
    count(sum(len(row.ids) for row in rows), 0)
    out = [[(0.0, True)] * len(req.continuations) for req in requests]
    for row, answer in zip(rows, scorer.score_greedy(rows), strict=True):
        out[row.request][row.choice] = answer
    return out


def rolling_batch(lm: LoadedLM, scorer: LoglikScorer, requests: list[LoglikRequest], max_len: int,
                  count: Count) -> list[list[float]]:
    """The log-likelihood of each request's one continuation, a whole text, summed over its
    rolling windows of ``max_len`` tokens from the start token (BOS, else EOS)."""
    tok = lm.tokenizer
    prefix = tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id
    rows: list[LoglikRow] = []
    for ri, (ids, _req) in enumerate(zip(encode_many(tok, [r.continuations[0] for r in requests], False), requests,
                                         strict=True)):
        for wi, (context, scored) in enumerate(rolling_windows(ids, prefix, max_len)):
            rows.append(LoglikRow(ri, wi, context + scored, len(scored)))
    count(sum(len(row.ids) for row in rows), 0)
    totals = [0.0] * len(requests)
    for row, value in zip(rows, scorer.score(rows), strict=True):
        totals[row.request] += value
    return [[t] for t in totals]
