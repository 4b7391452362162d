"""Log-likelihoods (and lm-eval's ``is_greedy``) through an OpenAI-compatible ``/completions``
endpoint: the prompt echoed with its log-probabilities, ``max_tokens`` 0.

:class:`EchoScoring` is the scoring half of :class:`~orchestra.models.openai_api.OpenAIAPI`: it
builds the scoring requests and reads their replies through
:mod:`orchestra.models.echo_logprobs`, which checks a reply's shape before anything is summed;
sending (retries, slots, batch mode) is the model's :meth:`EchoScoring.post`.
"""

from __future__ import annotations

import abc
import asyncio
from typing import Any

from orchestra.errors import ModelError
from orchestra.models.echo_logprobs import BadEcho, continuation_greedy, continuation_logprob
from orchestra.requests import LoglikRequest, prompt_text

#: ``logprobs`` asked when ``is_greedy`` is: the best token at each position, as lm-eval's
#: ``local-completions`` asks (vLLM adds the prompt's own token to it)
GREEDY_TOP_K = 1


class EchoScoring(abc.ABC):
    """Scoring through ``/completions`` with ``echo`` and ``logprobs``, for an HTTP model that
    sends (:meth:`post`) and names itself (``abbr``, ``path``, ``endpoint``, ``server``)."""

    abbr: str
    path: str
    endpoint: str
    server: Any
    completions_url: str
    generation_kwargs: dict[str, Any]

    @abc.abstractmethod
    async def post(self, url: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST ``body`` as JSON and return the decoded answer (with the model's retries)."""

    @abc.abstractmethod
    def _count_usage(self, data: dict[str, Any]) -> None:
        """Count a reply's token usage."""

    @abc.abstractmethod
    def _scrub(self, text: str) -> str:
        """``text`` without the API key."""

    @classmethod
    def reports_greedy(cls, cfg: dict[str, Any]) -> bool:
        """Where the model scores (a completions endpoint, a managed server's ``/completions``);
        the chat endpoint returns no prompt log-probabilities."""
        return cfg.get("endpoint", "chat") == "completions" or bool(cfg.get("server"))

    async def loglikelihood(self, request: LoglikRequest) -> list[float]:
        """Sum of the log-probabilities of each continuation's tokens, from ``echo`` logprobs.

        Needs a completions endpoint that echoes prompt logprobs (vLLM, many others).  Tokens
        that end after the context, its trailing whitespace left out, count as the continuation's,
        as HFCausalLM splits them: ``' Paris'`` after ``'... is '`` is the continuation's.  A reply
        whose shape does not add up fails the request (:mod:`orchestra.models.echo_logprobs`).
        """
        return [value for value, _ in await self._scores(request, greedy=False)]

    async def loglikelihood_greedy(self, request: LoglikRequest) -> list[tuple[float, bool]]:
        """:meth:`loglikelihood` with lm-eval's ``is_greedy``, read from the echo's
        ``top_logprobs`` as lm-eval's ``local-completions`` reads it; a reply without them, or
        whose entries do not add up, fails the request as any bad reply does."""
        return await self._scores(request, greedy=True)

    async def _scores(self, request: LoglikRequest, greedy: bool) -> list[tuple[float, bool]]:
        if self.endpoint != "completions" and self.server is None:
            raise ModelError(f"model {self.abbr}: log-likelihoods need endpoint='completions' (echo + logprobs)")
        context = prompt_text(request.context)
        return list(await asyncio.gather(*(self._score(context, c, greedy) for c in request.continuations)))

    async def _score(self, context: str, continuation: str, greedy: bool) -> tuple[float, bool]:
        prompt = context + continuation
        body = {**self.generation_kwargs, "model": self.path, "prompt": prompt, "max_tokens": 0,
                "echo": True, "logprobs": GREEDY_TOP_K if greedy else 0, "temperature": 0.0}
        data = await self.post(self.completions_url, body)
        self._count_usage(data)
        cut = len(context.rstrip())
        try:
            if greedy:
                return continuation_greedy(data, prompt, cut, GREEDY_TOP_K)
            return continuation_logprob(data, prompt, cut), False
        except BadEcho as exc:  # a wrong number that looks right is worse than a failed sample
            raise ModelError(f"model {self.abbr}: refused the scoring reply of /completions: "
                             f"{self._scrub(str(exc))}") from None
