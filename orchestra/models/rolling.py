"""Rolling windows: how a text longer than a model's context is scored, as lm-eval scores it.

lm-eval's ``loglikelihood_rolling`` (perplexity tasks such as wikitext) scores every token of a
text exactly once: the first window predicts up to ``max_len`` tokens from the model's start
token; each later window predicts the next up to ``max_len`` tokens from the tokens just before
them, so that every window reads ``max_len`` tokens.  The text's log-likelihood is the sum over
its windows.  :func:`rolling_windows` gives those windows in the disjoint form lm-eval's models
score (its ``get_rolling_token_windows`` with ``context_len=1`` followed by
``make_disjoint_window``): each window's context tokens, then its scored tokens.
Pure Python; ``tests/models/test_rolling.py`` checks it against lm-eval's own functions.
"""

from __future__ import annotations


def rolling_windows(tokens: list[int], prefix: int, max_len: int) -> list[tuple[list[int], list[int]]]:
    """``(context, scored)`` windows that together score each of ``tokens`` once, in order:
    ``context + scored[:-1]`` is what the model reads (at most ``max_len`` tokens), ``prefix``
    (the start token) the context of the first window.  No tokens: no window."""
    if max_len < 1:
        raise ValueError(f"max_len must be >= 1, got {max_len}")
    if not tokens:
        return []
    first = min(max_len, len(tokens))
    windows = [([prefix], tokens[:first])]
    done = first
    while done < len(tokens):
        end = min(len(tokens), done + max_len)
        # the model reads the max_len tokens before `end`'s last one: those not scored are context
        windows.append((tokens[end - max_len - 1 : done], tokens[done:end]))
        done = end
    return windows
