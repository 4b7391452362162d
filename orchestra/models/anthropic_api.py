"""A model behind Anthropic's Messages API (``POST /v1/messages``), direct or in batch mode.

The HTTP plumbing, limits, retries, key handling and batch mode are :class:`OpenAIAPI`'s; this
class changes what differs: the key header (``x-api-key`` with ``anthropic-version``), the body
(``system`` as a top-level field, ``stop_sequences``, no ``seed``), the answer (text blocks of
``content``; ``usage.input_tokens`` / ``output_tokens``) and the batch calls (Message Batches).
"""

from __future__ import annotations

import json
from typing import Any

from orchestra.errors import ModelError
from orchestra.models.batch.anthropic import AnthropicBatches
from orchestra.models.batch.provider import BatchProvider
from orchestra.models.batch.transport import BatchTransport
from orchestra.models.http_body import count_usage
from orchestra.models.openai_api import OpenAIAPI
from orchestra.requests import GenRequest, LoglikRequest


class AnthropicAPI(OpenAIAPI):
    """A Claude model over the Messages API.

    Args are those of :class:`OpenAIAPI` (``max_connections``, ``max_retries``, ``timeout_s``,
    ``attempt_timeout_s``, ``rate_limit``, ``batch``, ``generation_kwargs``, ...) except
    ``endpoint``, with these defaults: ``base_url='https://api.anthropic.com/v1'``,
    ``key_env='ANTHROPIC_API_KEY'``; and:
        anthropic_version: the ``anthropic-version`` header.
    Sampling follows :meth:`BaseModel.sampling` as for every model; the Messages API has no
    ``seed``, so a seed is not sent.  Log-likelihoods are not offered by the API.
    """

    speed_keys = OpenAIAPI.speed_keys

    def __init__(
        self,
        abbr: str,
        path: str,
        base_url: str = "https://api.anthropic.com/v1",
        key_env: str | None = "ANTHROPIC_API_KEY",
        anthropic_version: str = "2023-06-01",
        system_prompt: str | None = None,
        max_out_len: int = 256,
        generation_kwargs: dict[str, Any] | None = None,
        max_connections: int = 32,
        max_retries: int = 8,
        timeout_s: float = 600.0,
        attempt_timeout_s: float = 120.0,
        rate_limit: float | None = None,
        batch: bool | dict[str, Any] | None = None,
    ) -> None:
        super().__init__(abbr, path, base_url=base_url, key_env=key_env, system_prompt=system_prompt,
                         max_out_len=max_out_len, generation_kwargs=generation_kwargs,
                         max_connections=max_connections, max_retries=max_retries, timeout_s=timeout_s,
                         attempt_timeout_s=attempt_timeout_s, rate_limit=rate_limit, batch=batch)
        self.anthropic_version = anthropic_version
        self.url = f"{self.base_url}/messages"
        self.scope_name = f"anthropic-api:{self.base_url}|{path}"

    def __repr__(self) -> str:
        return f"AnthropicAPI(abbr={self.abbr!r}, path={self.path!r}, base_url={self.base_url!r})"

    def _auth_headers(self) -> dict[str, str]:
        key = self._secret().value
        return {"anthropic-version": self.anthropic_version, **({"x-api-key": key} if key else {})}

    def _batch_provider(self, transport: BatchTransport) -> BatchProvider:
        return AnthropicBatches(transport)

    def request_body(self, request: GenRequest) -> dict[str, Any]:
        body: dict[str, Any] = {k: v for k, v in self.generation_kwargs.items()
                                if k not in ("temperature", "top_p", "seed", "max_tokens", "stop")}
        settings = self.sampling(request)
        body["temperature"], body["top_p"] = settings["temperature"], settings["top_p"]
        messages = self._messages(request.prompt)
        system = [str(m.get("content", "")) for m in messages if m.get("role") == "system"]
        if system:
            body["system"] = "\n\n".join(system)
        body["model"] = self.path
        body["messages"] = [m for m in messages if m.get("role") != "system"]
        body["max_tokens"] = self.out_len(request)
        if request.stop:
            body["stop_sequences"] = list(request.stop)
        return body

    def _count_usage(self, data: dict[str, Any]) -> None:
        count_usage(self.stats.extra, data, (("input_tokens", "prompt_tokens"), ("output_tokens", "completion_tokens")))

    async def generate(self, request: GenRequest) -> str:
        data = await self.post(self.url, self.request_body(request))
        self._count_usage(data)
        content = data.get("content")
        if not isinstance(content, list):
            raise ModelError(f"answer without content: {self._scrub(json.dumps(data)[:300])}")
        texts = [b.get("text", "") for b in content if isinstance(b, dict) and b.get("type") == "text"]
        if not all(isinstance(t, str) for t in texts):  # str() of a list would look like an answer
            raise ModelError(f"model {self.abbr}: a text block of the answer is not text")
        return self._scrub_answer("".join(texts))  # an endpoint may echo the key it was sent

    async def loglikelihood(self, request: LoglikRequest) -> list[float]:
        raise ModelError(f"model {self.abbr}: Anthropic's Messages API gives no log-probabilities; "
                         "use a gen dataset with this model")
