"""orchestra's rolling windows are lm-eval's: every text length and window size, against
lm-eval's own ``get_rolling_token_windows`` (``context_len=1``) and ``make_disjoint_window``."""

from __future__ import annotations

import pytest

from orchestra.models.rolling import rolling_windows


def test_rolling_windows_are_lm_evals_for_every_length_and_window() -> None:
    from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

    compared = 0
    for n in range(0, 60):
        tokens = list(range(1000, 1000 + n))
        for max_len in range(1, 20):
            ref = [tuple(list(part) for part in make_disjoint_window(w))
                   for w in get_rolling_token_windows(token_list=tokens, prefix_token=7, max_seq_len=max_len,
                                                      context_len=1)]
            ours = rolling_windows(tokens, 7, max_len)
            assert [tuple(w) for w in ours] == ref, (n, max_len)
            # every token scored once, in order; no window reads more than max_len tokens
            assert [t for _, scored in ours for t in scored] == tokens
            assert all(len(ctx) + len(scored) - 1 <= max_len for ctx, scored in ours)
            compared += 1
    assert compared == 60 * 19


def test_a_window_of_no_tokens_is_refused() -> None:
    with pytest.raises(ValueError, match="max_len must be >= 1"):
        rolling_windows([1, 2], 0, 0)
