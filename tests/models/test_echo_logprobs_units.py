"""``echo_logprobs.continuation_logprob`` on hand-made replies (a unit test of one function): the
BOS correction for vLLM's echo, and what it must leave alone."""

from __future__ import annotations

from typing import Any

import pytest

from orchestra.models.echo_logprobs import BadEcho, continuation_logprob


def reply(text: str, tokens: list[str], logprobs: list[Any]) -> dict[str, Any]:
    """A reply whose offsets are the running sum of the tokens' lengths, as vLLM computes them."""
    offsets, at = [], 0
    for token in tokens:
        offsets.append(at)
        at += len(token)
    return {"choices": [{"text": text, "logprobs": {"tokens": tokens, "token_logprobs": logprobs,
                                                     "text_offset": offsets}}]}


def test_a_bos_token_the_text_lacks_is_taken_out_of_the_offsets() -> None:
    data = reply("Answer: Paris", ["<|begin_of_text|>", "Answer", ":", " Paris"], [None, -1.0, -2.0, -3.0])
    assert continuation_logprob(data, "Answer: Paris", len("Answer:")) == -3.0


def test_a_first_token_spelled_otherwise_is_not_taken_for_a_bos() -> None:
    """A raw sentencepiece token ('▁Answer', one character longer than 'Answer') without a BOS: the
    tokens end one character past the text, not the whole first token past it, so nothing is
    shifted (shifting by 7 would count ' Paris' alone, -3)."""
    data = reply("Answer: Paris", ["▁Answer", ":", "▁Paris"], [None, -2.0, -3.0])
    assert continuation_logprob(data, "Answer: Paris", len("Answer:")) == -5.0


def test_a_bos_shaped_reply_whose_offsets_are_not_the_running_sum_is_still_checked() -> None:
    data = reply("Answer: Paris", ["<s>", "Answer", ":", " Paris"], [None, -1.0, -2.0, -3.0])
    data["choices"][0]["logprobs"]["text_offset"][2] = 99
    with pytest.raises(BadEcho, match=r"text_offset\[2\] is 99"):
        continuation_logprob(data, "Answer: Paris", len("Answer:"))


@pytest.mark.parametrize(("data", "message"), [
    ({}, "choices[0] is missing"),
    ({"choices": []}, "choices[0] is missing"),
    ({"choices": "Answer: Paris"}, "choices[0] is not an object"),
    ({"choices": [["Answer: Paris"]]}, "choices[0] is not an object"),
    ({"choices": [{"text": "Answer: Paris", "logprobs": [-1.0]}]}, "choices[0].logprobs is list, not an object"),
    ({"choices": [{"text": "Answer: Paris", "logprobs": {"token_logprobs": [], "text_offset": []}}]},
     "logprobs.token_logprobs is empty for a prompt that is not"),
], ids=["no-choices", "empty-choices", "choices-string", "choice-list", "logprobs-list", "no-tokens"])
def test_a_reply_without_the_parts_a_score_needs_is_refused_naming_the_field(data: Any, message: str) -> None:
    with pytest.raises(BadEcho) as err:
        continuation_logprob(data, "Answer: Paris", len("Answer:"))
    assert str(err.value) == message


def test_a_bos_shaped_reply_with_offsets_or_tokens_of_the_wrong_type_is_left_to_the_checks() -> None:
    """The BOS correction only reads replies it can: an offset that is not an integer is refused by
    the checks (naming it), and tokens that are not all strings leave the offsets as they came (the
    reply is read as one without tokens)."""
    data = reply("Answer: Paris", ["<s>", "Answer", ":", " Paris"], [None, -1.0, -2.0, -3.0])
    data["choices"][0]["logprobs"]["text_offset"][1] = "3"
    with pytest.raises(BadEcho, match=r"text_offset\[1\] is '3', not an integer"):
        continuation_logprob(data, "Answer: Paris", len("Answer:"))
    data = reply("Answer: Paris", ["<s>", "Answer", ":", " Paris"], [None, -1.0, -2.0, -3.0])
    data["choices"][0]["logprobs"]["tokens"][2] = 58  # not a string: scored as a reply without tokens
    bare = reply("Answer: Paris", ["<s>", "Answer", ":", " Paris"], [None, -1.0, -2.0, -3.0])
    del bare["choices"][0]["logprobs"]["tokens"]
    assert continuation_logprob(data, "Answer: Paris", len("Answer:")) == \
        continuation_logprob(bare, "Answer: Paris", len("Answer:")) == -6.0
