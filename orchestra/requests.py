"""What flows between datasets, inferencer kinds, the engine and models: plain request types.

This module sits below every layer that uses it and imports nothing of orchestra, so a
dataset can build requests and a model can answer them without either knowing the other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

Message = dict[str, str]
"""One chat message: ``{"role": "user" | "assistant" | "system", "content": "..."}``."""

Prompt = str | list[Message]
"""A plain-text prompt, or a list of chat messages."""

#: How chat messages become one text for a model that takes plain text (no chat template, or
#: a completions endpoint).  One separator for every backend: the same config must send the
#: same prompt wherever it runs.
MESSAGE_SEPARATOR = "\n\n"


def prompt_text(prompt: Prompt) -> str:
    """The plain text of a prompt: a string as it is, chat messages' contents joined by
    :data:`MESSAGE_SEPARATOR`."""
    if isinstance(prompt, str):
        return prompt
    return MESSAGE_SEPARATOR.join(m["content"] for m in prompt)


@dataclass(frozen=True)
class GenRequest:
    """Generate a continuation of ``prompt``.

    ``max_out_len=None`` leaves the length to the model's own ``max_out_len``.

    ``lmeval_chat=True``: ``prompt`` holds chat messages to read as ``lm_eval
    --apply_chat_template`` does.  A model with a chat template renders them with it (a
    generation prompt after a final user message; a final assistant message, lm-eval's
    ``gen_prefix``, is continued instead; a template that refuses the system role gets the
    messages without it), then reads the text as lm-eval reads any context: trailing whitespace
    moves into a continuation, special tokens are added unless the text starts with the BOS
    token.  A chat endpoint gets the messages as they are.
    """

    prompt: Prompt
    max_out_len: int | None = None
    stop: tuple[str, ...] = ()
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    lmeval_chat: bool = False

    def is_default_sampling(self) -> bool:
        """Greedy and unseeded: the request leaves sampling to the model's ``generation_kwargs``."""
        return self.temperature == 0.0 and self.seed is None and self.top_p == 1.0


@dataclass(frozen=True)
class LoglikRequest:
    """Score each continuation: the summed log-probability of its tokens after ``context``."""

    context: Prompt
    continuations: tuple[str, ...]
    lmeval_chat: bool = False  # as :attr:`GenRequest.lmeval_chat`


@dataclass
class Sample:
    """One unit of inference work: what to send, and what a right answer looks like.

    ``kind`` names the inferencer kind (:mod:`orchestra.inferencers`) that built the sample
    and that runs it.
    """

    id: int
    kind: str  # 'gen' | 'loglik' | 'chat' | 'lmeval'
    gold: Any
    gen: GenRequest | None = None
    loglik: LoglikRequest | None = None
    turns: list[str] = field(default_factory=list)
    chat_template: GenRequest | None = None  # settings for every turn of a 'chat' sample
    num_samples: int = 1  # 'gen': completions per row (a list prediction when > 1, for pass@k)
    #: 'loglik': the choices as the dataset gives them (``accuracy_norm`` divides by their length)
    choices: tuple[str, ...] = ()
    #: 'lmeval': lm-eval's requests of one document, ``{"type", "args", "idx"}`` each
    calls: list[dict[str, Any]] = field(default_factory=list)
