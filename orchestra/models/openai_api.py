"""Any OpenAI-compatible endpoint (chat or completions), called with async HTTP.

The client is aiohttp: at 100 concurrent connections httpx (which the openai SDK uses)
spent ~18 ms of CPU per request on this project's 2-core machines and aiohttp ~0.3 ms (see
docs/api.md).  aiohttp is imported on first use, so that importing this module to validate
a config stays cheap.

This module builds request bodies, sends one attempt and parses answers.  The retry loop
around each attempt (host-wide connection slots, the adaptive rate, classification, backoff
without the slot, ``max_retries`` and ``timeout_s``, counters) is
:func:`orchestra.limits.retry.send_with_retries`, shared with any other HTTP model.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
from collections.abc import Callable
from typing import Any

from orchestra.errors import ModelError
from orchestra.fileio import encodable
from orchestra.limits.concurrency import HostSlots, ProcessSlots, concurrency
from orchestra.limits.ratelimit import AdaptiveRate
from orchestra.limits.retry import (
    Outcome,
    RetryDecision,
    RetryPolicy,
    classify_exception,
    classify_status,
    send_with_retries,
)
from orchestra.models.base import BaseModel
from orchestra.models.batch.batcher import Batcher
from orchestra.models.batch.openai import OpenAIBatches
from orchestra.models.batch.options import BatchOptions
from orchestra.models.batch.provider import BatchProvider
from orchestra.models.batch.transport import BatchTransport
from orchestra.models.chat_template import endpoint_problem
from orchestra.models.echo_scoring import EchoScoring
from orchestra.models.http_body import (
    MAX_BODY_BYTES,
    count_usage,
    is_redirect,
    read_capped,
    redirect_reason,
    scrub_answer,
    text_parts,
)
from orchestra.models.http_session import Secret, env_proxy, open_session
from orchestra.models.key_scrub import scrub_key
from orchestra.paths import RunPaths, safe_name
from orchestra.requests import GenRequest, Message, Prompt, prompt_text
from orchestra.serving.balance import ReplicaSet
from orchestra.serving.presets import KEY_FILE_ENV, REMOTE_ENV, SERVERS_DIR_ENV
from orchestra.serving.spec import parse_server

ENDPOINTS = ("chat", "completions")


class OpenAIAPI(EchoScoring, BaseModel):
    """A model behind an OpenAI-compatible HTTP API (OpenAI, vLLM, SGLang, LiteLLM, ...).

    Args:
        abbr: name in the run folder and the summary.
        path: the model name the endpoint expects (``"gpt-4o-mini"``).
        base_url: the API root, e.g. ``"http://127.0.0.1:8000/v1"``.
        key_env: name of the environment variable that holds the API key (the key itself
            never appears in a config, a spec file or a log).  Unset or empty: no
            ``Authorization`` header (local servers).
        endpoint: ``"chat"`` (``/chat/completions``) or ``"completions"`` (``/completions``;
            needed for log-likelihoods, which use ``echo`` + ``logprobs``).
        system_prompt: a system message put before every chat prompt.
        max_out_len: generation length (``max_tokens``) of requests whose dataset sets none.
        generation_kwargs: body fields of every generation request (``frequency_penalty``,
            ``max_completion_tokens``, ...).  Sampling follows :meth:`BaseModel.sampling`, as
            for local models: a greedy, unseeded request (the default) sends the model's
            ``temperature`` / ``top_p`` / ``seed`` from here; a request that sets its own
            sampling sends its own (and no ``seed`` unless it has one).  A request's ``stop``
            and length always win over same-named keys.
        max_connections: requests in flight at once, for all tasks of this endpoint and
            model on this host together.
        max_retries: retries after errors (5xx, connection errors, timeouts) per request;
            429 answers are retried within ``timeout_s`` without counting here.
        timeout_s: total time of one request, all attempts and waits included.
        attempt_timeout_s: time limit of one attempt.
        rate_limit: a known limit in requests per second; never exceeded (None: learn the
            limit from 429 answers only).
        batch: send every request through the endpoint's Batch API (half the token price,
            answers within 24 h): ``True`` or a dict of
            :class:`~orchestra.models.batch.options.BatchOptions` (``size``, ``poll_s``,
            ``flush_s``, ...).  See docs/api.md, "Batch mode".
        server: a managed server the run starts for this model (``dict(engine='vllm',
            model='/ckpt', replicas=2, ...)``, see :class:`~orchestra.serving.spec.ServerSpec` and
            docs/serving.md); ``path`` is then the name it serves the model as, ``base_url`` and
            ``key_env`` are orchestra's, and ``max_connections`` counts per replica.
    """

    validate_by_construction = True  # the constructor only checks values: no network, no key
    speed_keys = BaseModel.speed_keys | {"max_connections", "max_retries", "timeout_s", "attempt_timeout_s",
                                         "key_env", "rate_limit", "batch"}

    def __init__(
        self,
        abbr: str,
        path: str,
        base_url: str = "https://api.openai.com/v1",
        key_env: str | None = "OPENAI_API_KEY",
        endpoint: str = "chat",
        system_prompt: str | None = None,
        max_out_len: int = 256,
        generation_kwargs: dict[str, Any] | None = None,
        max_connections: int = 32,
        max_retries: int = 8,
        timeout_s: float = 600.0,
        attempt_timeout_s: float = 120.0,
        rate_limit: float | None = None,
        batch: bool | dict[str, Any] | None = None,
        server: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(abbr, path, max_out_len=max_out_len, generation_kwargs=generation_kwargs)
        if not path:
            raise ValueError("path (the model name the endpoint expects) must not be empty")
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must start with http:// or https://, got {base_url!r}")
        if endpoint not in ENDPOINTS:
            raise ValueError(f"endpoint must be one of {', '.join(ENDPOINTS)}, got {endpoint!r}")
        if not isinstance(max_connections, int) or max_connections < 1:
            raise ValueError(f"max_connections must be an integer >= 1, got {max_connections!r}")
        if rate_limit is not None and rate_limit <= 0:
            raise ValueError(f"rate_limit must be > 0 requests per second, got {rate_limit}")
        self.server = parse_server(server) if server is not None else None
        if self.server is not None:
            if batch:
                raise ValueError("a managed server (server=...) has no Batch API: drop batch=")
            base_url, key_env = "http://127.0.0.1/v1", None  # the replicas' addresses come at run time
            max_connections *= self.server.replicas
        self._replicas: ReplicaSet | None = None
        self.base_url = base_url.rstrip("/")
        self.key_env = key_env
        self.endpoint = endpoint
        self.system_prompt = system_prompt
        self.max_connections = max_connections
        self.policy = RetryPolicy(max_retries=max_retries, timeout_s=timeout_s, attempt_timeout_s=attempt_timeout_s)
        self.url = f"{self.base_url}/{'chat/completions' if endpoint == 'chat' else 'completions'}"
        self.completions_url = f"{self.base_url}/completions"
        self._key: Secret | None = None  # read on first use, inside the task (see _secret)
        self.scope_name = f"openai-api:{self.base_url}|{path}" if self.server is None else f"served:{abbr}|{path}"
        self.rate = AdaptiveRate(max_rate=rate_limit, ramp_requests=max_connections)
        self._slots: ProcessSlots | HostSlots | None = None
        self._session: Any = None
        self._sockets: dict[str, Any] = {}  # socket path -> session, for managed replicas on Unix sockets
        self._proxy: Any = None
        self._proxy_auth: Any = None
        self._session_loop: asyncio.AbstractEventLoop | None = None
        self.batch_options = BatchOptions.parse(batch)  # None: direct calls
        if self.batch_options is not None:  # room to cancel the batches in flight on SIGTERM
            self.stop_grace_s = self.batch_options.cancel_wait_s + 5.0
        self._batcher: Batcher | None = None

    @classmethod
    def identity(cls, cfg: dict[str, Any]) -> str:
        """A managed server's weights, engine and flags can change answers; how many replicas,
        threads, slots or restarts it has cannot (changing those reuses predictions)."""
        server = cfg.get("server")
        if isinstance(server, dict):
            cfg = {**cfg, "server": {k: server.get(k) for k in ("engine", "model", "args", "command", "ctx_size")}}
        return super().identity(cfg)

    @classmethod
    def chat_template_problem(cls, cfg: dict[str, Any], scoring: bool) -> str | None:
        """See :func:`~orchestra.models.chat_template.endpoint_problem` (the server renders chats)."""
        return endpoint_problem(str(cfg.get("endpoint", "chat")), scoring)

    def __repr__(self) -> str:
        return f"OpenAIAPI(abbr={self.abbr!r}, path={self.path!r}, base_url={self.base_url!r})"

    def max_concurrency(self) -> int:
        if self.batch_options is not None:
            return self.batch_options.max_requests_in_flight
        return self.max_connections

    # -- batch mode (orchestra/models/batch/) --------------------------------------------
    def _batch_provider(self, transport: BatchTransport) -> BatchProvider:
        """The provider's batch calls (Anthropic's differ)."""
        return OpenAIBatches(transport)

    def bind_task(self, run_dir: str, task_id: str, emit: Callable[..., None]) -> None:
        if self.batch_options is None:
            return
        if self._batcher is None:
            transport = BatchTransport(self.base_url, self._client, lambda: (self._proxy, self._proxy_auth),
                                       self.policy, self._explain, self.scope_name)
            self._batcher = Batcher(self.batch_options, self._batch_provider(transport), self.policy, self.stats,
                                    self.path, self._scrub)
        self._batcher.bind(RunPaths(run_dir).batch_ledger(self.abbr), os.path.basename(os.path.abspath(run_dir)),
                           task_id, emit)

    # -- plumbing -----------------------------------------------------------------------
    def _secret(self) -> Secret:
        """The API key, read from ``key_env`` when the first request is made (in the task, not
        when the orchestrator validates the config) and kept out of repr, errors and logs."""
        if self._key is None:
            self._key = Secret(os.environ.get(self.key_env, "") if self.key_env else "")
            if self.server is not None:
                try:
                    with open(os.environ.get(KEY_FILE_ENV, ""), encoding="utf-8") as fh:
                        self._key = Secret(fh.read().strip())
                except OSError:
                    raise ModelError(f"model {self.abbr}: the managed server's key file is not readable "
                                     f"(${KEY_FILE_ENV}); this model runs only inside a run") from None
        return self._key

    def _scrub(self, text: str) -> str:
        """Never let the key into an error message or an answer (some servers echo what they were
        sent, and an answer goes to predictions, results and the report)."""
        return scrub_key(text, self._secret().value)

    def _scrub_answer(self, text: str) -> str:
        """An answer with an echoed key replaced by ``***``, unless the key is short enough to be
        an ordinary word of an answer (``EMPTY``, ``1``: a local server's placeholder key)."""
        return scrub_answer(text, self._secret().value)

    def _client(self, socket_path: str = "") -> Any:
        """The session for the endpoint, or for the managed replica on the Unix socket ``socket_path``."""
        loop = asyncio.get_running_loop()
        if self._session_loop is not loop:  # sessions of another event loop are not usable here
            self._session, self._sockets = None, {}
        if socket_path:
            session = self._sockets.get(socket_path)
            if session is None or session.closed:
                session = self._sockets[socket_path] = open_session(self.max_connections, self._headers(), socket_path)
            self._session_loop = loop
            return session
        if self._session is None or self._session.closed:
            # A managed replica is on 127.0.0.1 and gets the run's key: never through a proxy.
            self._proxy, self._proxy_auth = env_proxy(self.url) if self.server is None else (None, None)
            self._session = open_session(self.max_connections, self._headers())
            self._session_loop = loop
        return self._session

    def _headers(self) -> dict[str, str]:
        return {"Content-Type": "application/json", **self._auth_headers()}

    def _auth_headers(self) -> dict[str, str]:
        """Headers that carry the key (a provider with another scheme overrides this)."""
        key = self._secret().value
        return {"Authorization": f"Bearer {key}"} if key else {}

    def _scope(self) -> ProcessSlots | HostSlots:
        if self._slots is None:
            self._slots = concurrency(self.scope_name, self.max_connections, host_wide=True)
        return self._slots

    async def aclose(self) -> None:
        if self._batcher is not None:
            await self._batcher.aclose()  # cancels what is still in flight (Ctrl-C, a failed task)
        for session in [self._session, *self._sockets.values()]:
            if session is not None and not session.closed and self._session_loop is asyncio.get_running_loop():
                await session.close()
        self._session, self._sockets = None, {}
        if isinstance(self._slots, HostSlots):
            self._slots.close()  # leave the host's membership; slots reopen lazily
        self._slots = None

    # -- one request: an attempt, run by the retry loop ------------------------------------
    async def _attempt(self, url: str, payload: bytes, budget_s: float) -> Outcome:
        """One HTTP attempt, its failure (if any) classified."""
        import aiohttp

        target = None
        if self.server is not None:  # a managed replica: the least busy one this process knows
            target = self._replica_set().pick()
            if target is None:
                return Outcome(0, None, RetryDecision.transient("no replica of the managed server is ready"))
            url = target.url + url[len(self.base_url):]
        try:
            return await self._send(url, payload, budget_s, target.socket if target is not None else "")
        except (aiohttp.ClientConnectorError, aiohttp.ServerDisconnectedError, ConnectionError) as exc:
            if target is not None:  # a replica gone: set it aside; the retry goes to another one
                self._replica_set().done(target, refused=True)
                target = None
            return Outcome(0, None, classify_exception(exc))
        finally:
            if target is not None:
                self._replica_set().done(target)

    def _replica_set(self) -> ReplicaSet:
        if self._replicas is None:
            folder = os.environ.get(SERVERS_DIR_ENV, "")
            self._replicas = ReplicaSet(os.path.join(folder, safe_name(self.abbr), "replicas.json"),
                                        socket_root=os.path.dirname(os.environ.get(KEY_FILE_ENV, "")),
                                        remote_ok=os.environ.get(REMOTE_ENV) == "1")
        return self._replicas

    async def _send(self, url: str, payload: bytes, budget_s: float, socket_path: str = "") -> Outcome:
        """POST once (over ``socket_path`` if given); a refused or dropped connection is raised
        (the caller knows the replica)."""
        import aiohttp

        try:
            async with self._client(socket_path).post(
                    url, data=payload, proxy=self._proxy, proxy_auth=self._proxy_auth, allow_redirects=False,
                    timeout=aiohttp.ClientTimeout(total=max(budget_s, 0.001))) as resp:
                if is_redirect(resp.status):  # never followed: the key would go along (see is_redirect)
                    return Outcome(resp.status, None, RetryDecision.no(redirect_reason(resp.status, resp.headers, url)))
                raw = await read_capped(resp)
                if raw is None:
                    return Outcome(resp.status, None, RetryDecision.no(
                        f"HTTP {resp.status} with a response body over {MAX_BODY_BYTES >> 20} MiB (refused)"))
                if resp.status != 200:
                    return Outcome(resp.status, None, classify_status(resp.status, resp.headers, raw))
        except (aiohttp.ClientConnectorError, aiohttp.ServerDisconnectedError, ConnectionError):
            raise
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
            return Outcome(0, None, classify_exception(exc))
        try:
            data = json.loads(raw)
        except ValueError:
            return Outcome(200, None, RetryDecision.transient(f"HTTP 200 with a body that is not JSON: {raw[:200]!r}"))
        if not isinstance(data, dict):
            return Outcome(200, None, RetryDecision.no(f"HTTP 200 with unexpected JSON: {str(data)[:200]}"))
        return Outcome(200, data)

    def _explain(self, status: int, reason: str) -> str:
        """A failure's text: without the key, and naming an unset key variable on 401/403."""
        reason = self._scrub(reason)
        if status in (401, 403) and not self._secret().value and self.key_env:
            reason += f" (environment variable {self.key_env} is not set)"
        return reason

    async def post(self, url: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST ``body`` as JSON and return the decoded answer, retrying what is worth it
        (:func:`~orchestra.limits.retry.send_with_retries`); in batch mode, as one row of a batch."""
        if self.batch_options is not None:
            if self._batcher is None:
                raise ModelError(f"model {self.abbr}: batch mode needs a run folder; it runs in infer tasks only")
            return await self._batcher.submit(url[len(self.base_url):], body)
        payload = json.dumps(body, ensure_ascii=False).encode("utf-8")
        return await send_with_retries(functools.partial(self._attempt, url, payload), self.policy,
                                       self._scope(), self.rate, self.stats, self._explain)

    # -- the BaseModel contract -----------------------------------------------------------------
    def _messages(self, prompt: Prompt) -> list[Message]:
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
        if self.system_prompt and not (messages and messages[0].get("role") == "system"):
            messages.insert(0, {"role": "system", "content": self.system_prompt})
        return messages

    def request_body(self, request: GenRequest) -> dict[str, Any]:
        """The JSON body of a generation request."""
        body: dict[str, Any] = dict(self.generation_kwargs)
        settings = self.sampling(request)  # greedy and unseeded: the model's generation_kwargs
        body["temperature"], body["top_p"] = settings["temperature"], settings["top_p"]
        if settings["seed"] is not None:
            body["seed"] = settings["seed"]
        else:
            body.pop("seed", None)
        body["model"] = self.path
        if self.endpoint == "chat":
            body["messages"] = self._messages(request.prompt)
        else:
            body["prompt"] = prompt_text(request.prompt)
        body["max_tokens"] = self.out_len(request)
        if request.stop:
            body["stop"] = list(request.stop)
        return body

    def _count_usage(self, data: dict[str, Any]) -> None:
        count_usage(self.stats.extra, data)

    async def generate(self, request: GenRequest) -> str:
        data = await self.post(self.url, self.request_body(request))
        self._count_usage(data)
        try:
            choice = data["choices"][0]
            text = choice["message"]["content"] if self.endpoint == "chat" else choice["text"]
        except (KeyError, IndexError, TypeError):
            raise ModelError(f"answer without choices: {self._scrub(json.dumps(data)[:300])}") from None
        if isinstance(text, list) and self.endpoint == "chat":
            text = text_parts(text, self.abbr)
        if text is not None and not isinstance(text, str):  # a list would pass for num_samples answers
            raise ModelError(f"model {self.abbr}: the answer's text is {type(text).__name__}, not text")
        # a lone surrogate (a pair cut at max_tokens) becomes U+FFFD; an echoed key becomes ***
        return self._scrub_answer(encodable(text or ""))
