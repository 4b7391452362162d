"""A continuation's log-likelihood from a completions reply that echoes the prompt with ``logprobs``.

The reply comes from an endpoint we do not control, so its shape is checked before anything is
summed: a reply that lines up only partly would otherwise become a wrong number that looks
right.  :func:`continuation_logprob` refuses, with :class:`BadEcho` (one line naming the field),
a reply whose ``choices[0].text`` does not start with the prompt sent; whose
``logprobs.text_offset``, ``token_logprobs`` and ``tokens`` differ in length; whose offsets are not
integers, go backwards, or fall outside the echoed text; or whose log-probabilities are not finite
numbers <= 0 (the first token's may be null: nothing predicts it).

vLLM echoes a model's BOS token (``<s>``, ``<|begin_of_text|>``) as the first token, with a null
log-probability, and counts its length in the offsets of the tokens after it although the echoed
text does not hold it; such offsets are read back to the text (:func:`_without_bos`) before they
are checked, or every such reply would be refused or scored on the wrong tokens.

:func:`continuation_greedy` also tells whether the continuation is the model's greedy one, as
lm-eval's ``local-completions`` does (``is_greedy``: each continuation token's log-probability is
the largest of its ``top_logprobs`` entry), after checking ``top_logprobs`` too: a list as long
as the tokens; for every continuation token an object of 1 to ``k + 1`` finite numbers <= 0 (vLLM
adds the token itself to its ``k`` best); its largest value not below the token's own
log-probability when the token is not in it; and the token's own value where its text is a key
(unless that text holds U+FFFD: several byte tokens decode to it, so the value may be another
token's).
"""

from __future__ import annotations

import math
from typing import Any


class BadEcho(ValueError):
    """A scoring reply that cannot be trusted; the message names the field and what is wrong."""


def _list(lp: dict[str, Any], key: str) -> list[Any]:
    value = lp.get(key)
    if not isinstance(value, list):
        raise BadEcho(f"logprobs.{key} is {type(value).__name__}, not a list")
    return value


def _offsets(values: list[Any], text_len: int) -> list[int]:
    """The token start offsets, checked: integers, never going back, within the echoed text."""
    last = 0
    for i, offset in enumerate(values):
        if isinstance(offset, bool) or not isinstance(offset, int):
            raise BadEcho(f"logprobs.text_offset[{i}] is {offset!r:.40}, not an integer")
        if offset < 0:
            raise BadEcho(f"logprobs.text_offset[{i}] is {offset!r:.40}, before the start of the echoed text")
        if offset < last:
            raise BadEcho(f"logprobs.text_offset[{i}] is {offset!r:.40}, before the offset of the token before it "
                          f"({last}): offsets must not go backwards")
        if offset > text_len:
            raise BadEcho(f"logprobs.text_offset[{i}] is {offset!r:.40}, past the echoed text ({text_len} characters)")
        last = offset
    return values


def _logprob(i: int, value: Any) -> float | None:
    """A token's log-probability, checked: a finite number <= 0; null only for the first token."""
    if value is None and i == 0:
        return None
    try:  # a JSON integer may have hundreds of digits: float() of it overflows
        number = float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else math.nan
    except OverflowError:
        number = math.nan
    if not math.isfinite(number) or number > 0:
        raise BadEcho(f"logprobs.token_logprobs[{i}] is {value!r:.40}, not a finite number <= 0")
    return number


def _without_bos(offsets: list[Any], values: list[Any], tokens: Any, text: str) -> list[Any]:
    """``offsets`` as positions in ``text``: when the offsets are the running sum of the tokens'
    lengths (as vLLM computes them), the first token is one the text does not start with and has
    no log-probability, and the tokens end that token's length past the text's end (vLLM's echo
    of a BOS token), that length is taken off every later offset and the first token covers
    nothing.  Any other reply is left as it came to the checks (their messages quote it)."""
    if not (isinstance(tokens, list) and len(tokens) >= 2 and values[0] is None and isinstance(tokens[0], str)
            and tokens[0] and not text.startswith(tokens[0])):
        return offsets
    if not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets):
        return offsets  # refused by the checks, naming the offset
    if not all(isinstance(t, str) for t in tokens):
        return offsets
    running = [0]
    for token in tokens[:-1]:
        running.append(running[-1] + len(token))
    if offsets != running or running[-1] + len(tokens[-1]) != len(text) + len(tokens[0]):
        return offsets
    return [0, *(o - len(tokens[0]) for o in offsets[1:])]


def _scored(data: Any, prompt: str, cut: int) -> tuple[dict[str, Any], list[int], list[float]]:
    """The checked ``logprobs`` object of the reply, the indices of the tokens of ``prompt`` that
    end after character ``cut``, and their log-probabilities (see :func:`continuation_logprob`)."""
    try:
        choice = data["choices"][0]
    except (KeyError, IndexError, TypeError):
        raise BadEcho("choices[0] is missing") from None
    if not isinstance(choice, dict):
        raise BadEcho("choices[0] is not an object")
    text = choice.get("text")
    if not isinstance(text, str):
        raise BadEcho(f"choices[0].text is {type(text).__name__}, not the echoed prompt")
    if not text.startswith(prompt):
        raise BadEcho("choices[0].text does not start with the prompt sent (echo is not the prompt)")
    lp = choice.get("logprobs")
    if not isinstance(lp, dict):
        raise BadEcho(f"choices[0].logprobs is {type(lp).__name__}, not an object")
    values, offsets = _list(lp, "token_logprobs"), _list(lp, "text_offset")
    if not values and prompt:
        raise BadEcho("logprobs.token_logprobs is empty for a prompt that is not")
    if len(offsets) != len(values):
        raise BadEcho(f"logprobs.text_offset has {len(offsets)} entries, logprobs.token_logprobs {len(values)}")
    tokens = lp.get("tokens")
    if tokens is not None and (not isinstance(tokens, list) or len(tokens) != len(values)):
        size = f"{len(tokens)} entries" if isinstance(tokens, list) else type(tokens).__name__
        raise BadEcho(f"logprobs.tokens has {size}, logprobs.token_logprobs {len(values)} entries")
    starts = _offsets(_without_bos(offsets, values, tokens, text), len(text))
    logprobs = [_logprob(i, v) for i, v in enumerate(values)]
    ends = [*starts[1:], len(text)]
    picked = [i for i, (start, end, v) in enumerate(zip(starts, ends, logprobs))
              if start < len(prompt) and end > cut and v is not None]
    return lp, picked, [logprobs[i] or 0.0 for i in picked]


def continuation_logprob(data: Any, prompt: str, cut: int) -> float:
    """Sum of the log-probabilities of the tokens of ``prompt`` that end after character ``cut``
    (a token ends where the next one starts, the last one with the echoed text; one that starts
    at or after the prompt's end was generated, not echoed, and never counts), read from the
    decoded JSON ``data`` of a completions reply with ``echo`` and ``logprobs``.  Raises
    :class:`BadEcho`."""
    return sum(_scored(data, prompt, cut)[2])


def _top(i: int, entry: Any, k: int) -> dict[str, float]:
    """Token ``i``'s ``top_logprobs`` entry, checked: 1 to ``k + 1`` texts -> finite numbers <= 0."""
    if not isinstance(entry, dict):
        raise BadEcho(f"logprobs.top_logprobs[{i}] is {type(entry).__name__}, not an object")
    if not 1 <= len(entry) <= k + 1:
        raise BadEcho(f"logprobs.top_logprobs[{i}] has {len(entry)} entries for logprobs={k} (1 to {k + 1} expected)")
    out = {}
    for text, value in entry.items():
        try:
            number = _logprob(1, value)  # never null here
        except BadEcho:
            number = None
        if number is None:
            raise BadEcho(f"logprobs.top_logprobs[{i}][{text!r:.40}] is {value!r:.40}, not a finite number <= 0")
        out[text] = number
    return out


def continuation_greedy(data: Any, prompt: str, cut: int, k: int) -> tuple[float, bool]:
    """:func:`continuation_logprob` and whether each of those tokens is the model's most likely
    one (lm-eval's ``is_greedy``: its log-probability equals the largest in its ``top_logprobs``
    entry), from a reply to ``logprobs=k``.  Raises :class:`BadEcho` (see the module's text)."""
    lp, picked, values = _scored(data, prompt, cut)
    tops, tokens = lp.get("top_logprobs"), lp.get("tokens")
    if not isinstance(tops, list):
        raise BadEcho(f"logprobs.top_logprobs is {type(tops).__name__}, not a list (is_greedy needs it)")
    if len(tops) != len(lp["token_logprobs"]):
        raise BadEcho(f"logprobs.top_logprobs has {len(tops)} entries, logprobs.token_logprobs "
                      f"{len(lp['token_logprobs'])}")
    greedy = True
    for i, value in zip(picked, values):
        top = _top(i, tops[i], k)
        token = tokens[i] if isinstance(tokens, list) and isinstance(tokens[i], str) else None
        if token is not None and token in top and "\ufffd" not in token and top[token] != value:
            raise BadEcho(f"logprobs.top_logprobs[{i}] gives the token {token!r:.40} {top[token]!r}, "
                          f"logprobs.token_logprobs[{i}] {value!r}")
        best = max(top.values())
        if value > best and token not in top:
            raise BadEcho(f"logprobs.token_logprobs[{i}] ({value!r}) is above every value of logprobs.top_logprobs[{i}]"
                          " (not the most likely tokens)")
        greedy = greedy and value == best
    return sum(values), greedy
