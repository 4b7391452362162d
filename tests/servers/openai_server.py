"""A real OpenAI-compatible HTTP server for tests and benchmarks (aiohttp, 127.0.0.1 only).

Answers are a deterministic function of the prompt, so correctness can be checked:

* the last ``a + b`` / ``a - b`` / ``a * b`` in the last user message is computed;
* a user message ``plus N`` / ``minus N`` / ``times N`` applies to the number in the previous
  assistant message (multi-turn conversations check that the history is sent);
* otherwise the last word of the message, upper-cased.

Completions with ``echo`` + ``logprobs`` score one token per character: ``0`` for characters
of a continuation that occurs in the context, ``-1`` otherwise.

Knobs (``ServerConfig``): latency, a concurrency cap (429 beyond it), a token-bucket rate
limit answering 429 with ``Retry-After`` and ``retry-after-ms``, random 500s (seeded), a
number of 500s per prompt before it succeeds, a required API key, and a marker that gets
a 400.  Counters of what it served: requests per status, per prompt (and 200s per prompt),
peak concurrency, and the first-request / last-response times (``time.time()``).

Run it as a process: ``python tests/servers/openai_server.py --port 0 --latency-s 0.2``
prints ``PORT <n>`` and serves until SIGTERM, ``--max-lifetime-s``, or EOF on stdin with ``--stop-on-eof``.
Control endpoints: ``GET /_stats``, ``POST /_reset``, ``POST /_config`` (JSON of config fields).
In tests, :class:`ServerThread` runs it on its own thread and event loop.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import dataclasses
import json
import math
import random
import re
import sys
import threading
import time
import urllib.parse
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

_BINARY = re.compile(r"(-?\d+)\s*([-+*])\s*(-?\d+)")
_RELATIVE = re.compile(r"^\s*(plus|minus|times)\s+(-?\d+)\s*$", re.IGNORECASE)
_NUMBER = re.compile(r"-?\d+")


@dataclass
class ServerConfig:
    """What the server does; every field can be changed at run time."""

    latency_s: float = 0.0
    max_concurrency: int | None = None  # answered 429 beyond this many requests in progress
    rate: float | None = None  # token bucket: requests per second
    burst: float | None = None  # bucket size (default: one second of ``rate``)
    fail_rate: float = 0.0  # probability of a 500 (after the latency)
    fail_first: int = 0  # the first N requests of every prompt are answered 500
    seed: int = 0
    api_key: str | None = None  # required bearer key (401 otherwise, echoing what was sent)
    bad_marker: str = "BAD_REQUEST"  # a prompt containing it gets a 400
    hang_marker: str = "HANG_FOREVER"  # a prompt containing it never gets an answer
    fail_once_marker: str = "FAIL_ONCE"  # a prompt containing it gets a 500 on its first request
    #: a prompt containing it is answered with the bearer key it came with, encoded as HTTP stacks
    #: echo it (:func:`key_echoes`); with ``_ERR`` after it, as a 400 whose text body holds them (cut short
    #: when quoted), with ``_CUT``, as a 400 whose text body ends in the key where a quote of it is cut
    echo_marker: str = "ECHO_KEY"


@dataclass
class ServerStats:
    """What the server served."""

    requests: int = 0
    by_status: Counter[int] = field(default_factory=Counter)
    per_prompt: Counter[str] = field(default_factory=Counter)
    ok_per_prompt: Counter[str] = field(default_factory=Counter)
    in_progress: int = 0
    peak_concurrency: int = 0
    first_request_t: float | None = None
    last_response_t: float | None = None
    log: list[tuple[float, str, int]] = field(default_factory=list)  # (arrival, prompt key, status)

    def to_json(self) -> dict[str, Any]:
        span = None
        if self.first_request_t is not None and self.last_response_t is not None:
            span = self.last_response_t - self.first_request_t
        return {
            "requests": self.requests,
            "by_status": {str(k): v for k, v in self.by_status.items()},
            "per_prompt": dict(self.per_prompt),
            "ok_per_prompt": dict(self.ok_per_prompt),
            "peak_concurrency": self.peak_concurrency,
            "in_progress": self.in_progress,
            "first_request_t": self.first_request_t,
            "last_response_t": self.last_response_t,
            "span_s": span,
        }


def answer(messages: list[dict[str, Any]]) -> str:
    """The deterministic reply to a conversation (see the module docstring)."""
    users = [str(m.get("content", "")) for m in messages if m.get("role") == "user"]
    last = users[-1] if users else ""
    found = _BINARY.findall(last)
    if found:
        a, op, b = found[-1]
        x, y = int(a), int(b)
        return str(x + y if op == "+" else x - y if op == "-" else x * y)
    rel = _RELATIVE.match(last)
    if rel:
        prev = [str(m.get("content", "")) for m in messages if m.get("role") == "assistant"]
        nums = _NUMBER.findall(prev[-1]) if prev else []
        base = int(nums[-1]) if nums else 0
        n = int(rel.group(2))
        op = rel.group(1).lower()
        return str(base + n if op == "plus" else base - n if op == "minus" else base * n)
    words = last.split()
    return words[-1].upper() if words else ""


def prompt_key(messages: list[dict[str, Any]]) -> str:
    """What requests are counted by: the first user message, and the turn for later turns."""
    users = [str(m.get("content", "")) for m in messages if m.get("role") == "user"]
    if not users:
        return ""
    return users[0] if len(users) == 1 else f"{users[0]}#turn{len(users)}"


def key_echoes(key: str) -> list[str]:
    """``key`` as a hostile endpoint echoes it: percent-encoded (upper and lower case), base64 (of
    the key, of ``user:key`` as a ``Basic`` header carries it, URL-safe), split across lines, and
    JSON-escaped character by character."""
    raw = key.encode()
    pct = urllib.parse.quote(key, safe="")
    return [pct, re.sub("%[0-9A-F]{2}", lambda m: m.group().lower(), pct), base64.b64encode(raw).decode(),
            "Basic " + base64.b64encode(b"user:" + raw).decode(), base64.urlsafe_b64encode(b"ab:" + raw).decode(),
            key[: len(key) // 2] + "\n  " + key[len(key) // 2:], "".join(f"\\u{ord(c):04x}" for c in key)]


def _json(obj: Any) -> web.Response:
    return web.Response(body=json.dumps(obj).encode(), content_type="application/json")


def _error(status: int, message: str, kind: str, headers: dict[str, str] | None = None) -> web.Response:
    body = {"error": {"message": message, "type": kind, "code": kind}}
    return web.json_response(body, status=status, headers=headers)


class OpenAIServer:
    """The aiohttp application and its state."""

    def __init__(self, config: ServerConfig | None = None) -> None:
        self.config = config or ServerConfig()
        self.stats = ServerStats()
        self._tokens = 0.0
        self._bucket_t = 0.0
        self._rng = random.Random(self.config.seed)
        self.hanging: set[asyncio.Task[Any]] = set()
        self.reset()
        self.app = web.Application(client_max_size=16 * 1024 * 1024)
        self.app.router.add_post("/v1/chat/completions", self.chat)
        self.app.router.add_post("/v1/completions", self.completions)
        self.app.router.add_get("/v1/models", self.models)
        self.app.router.add_get("/_stats", self.get_stats)
        self.app.router.add_post("/_reset", self.post_reset)
        self.app.router.add_post("/_config", self.post_config)

    def reset(self) -> None:
        self.stats = ServerStats()
        self._rng = random.Random(self.config.seed)
        self._tokens = self._burst()
        self._bucket_t = time.monotonic()

    def configure(self, **changes: Any) -> None:
        self.config = dataclasses.replace(self.config, **changes)
        self.reset()

    def _burst(self) -> float:
        c = self.config
        if c.rate is None:
            return 0.0
        return float(c.burst if c.burst is not None else c.rate)

    def _take_token(self) -> float | None:
        """None if the request may go, else seconds until the next token."""
        c = self.config
        if c.rate is None:
            return None
        now = time.monotonic()
        self._tokens = min(self._burst(), self._tokens + (now - self._bucket_t) * c.rate)
        self._bucket_t = now
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return None
        return (1.0 - self._tokens) / c.rate

    # -- request handling ---------------------------------------------------------------
    async def _serve(self, request: web.Request, messages: list[dict[str, Any]], body: dict[str, Any],
                     respond: Any) -> web.Response:
        st = self.stats
        now = time.time()
        if st.first_request_t is None:
            st.first_request_t = now
        st.requests += 1
        key = prompt_key(messages)
        st.per_prompt[key] += 1
        status, resp = await self._decide(request, messages, body, key, respond)
        st.by_status[status] += 1
        if status == 200:
            st.ok_per_prompt[key] += 1
        st.log.append((now, key, status))
        st.last_response_t = time.time()
        return resp

    async def _decide(self, request: web.Request, messages: list[dict[str, Any]], body: dict[str, Any],
                      key: str, respond: Any) -> tuple[int, web.Response]:
        c, st = self.config, self.stats
        if c.api_key is not None:
            sent = request.headers.get("Authorization", "")
            if sent != f"Bearer {c.api_key}":
                return 401, _error(401, f"Incorrect API key provided: {sent[7:]!r}", "invalid_api_key")
        text = " ".join(str(m.get("content", "")) for m in messages)
        if c.echo_marker and c.echo_marker in text:
            sent = request.headers.get("Authorization", "").removeprefix("Bearer ")
            echoed = "; ".join(key_echoes(sent))
            if c.echo_marker + "_ERR" in text:  # not JSON: quoted as it is, cut at 500 characters (in the last form)
                return 400, web.Response(status=400, text=f"bad key {echoed}", content_type="text/plain")
            if c.echo_marker + "_CUT" in text:  # the key itself where the quote is cut, 10 characters in
                return 400, web.Response(status=400, text="bad key " + "." * 482 + sent, content_type="text/plain")
            return 200, respond(messages, body, f"your key: {echoed}")
        if c.bad_marker and c.bad_marker in text:
            return 400, _error(400, f"Invalid request: the prompt contains {c.bad_marker}", "invalid_request")
        if c.max_concurrency is not None and st.in_progress >= c.max_concurrency:
            return 429, _error(429, "Too many concurrent requests", "concurrency", {"Retry-After": "1"})
        wait = self._take_token()
        if wait is not None:
            headers = {"Retry-After": str(max(1, math.ceil(wait))), "retry-after-ms": str(int(wait * 1000) + 1)}
            return 429, _error(429, "Rate limit reached for requests", "rate_limit_exceeded", headers)
        st.in_progress += 1
        st.peak_concurrency = max(st.peak_concurrency, st.in_progress)
        try:
            if c.hang_marker and c.hang_marker in text:
                task = asyncio.current_task()
                if task is not None:
                    self.hanging.add(task)
                await asyncio.sleep(3600)
            if c.latency_s:
                await asyncio.sleep(c.latency_s)
            fail = (st.per_prompt[key] <= c.fail_first
                    or (c.fail_once_marker and c.fail_once_marker in text and st.per_prompt[key] == 1)
                    or (c.fail_rate and self._rng.random() < c.fail_rate))
            if fail:
                return 500, _error(500, "Internal server error (injected)", "server_error")
            return 200, respond(messages, body)
        finally:
            st.in_progress -= 1

    async def chat(self, request: web.Request) -> web.Response:
        body = json.loads(await request.read())
        messages = body.get("messages") or []

        def respond(msgs: list[dict[str, Any]], b: dict[str, Any], said: str | None = None) -> web.Response:
            text = answer(msgs)[: int(b.get("max_tokens") or 1 << 30)] if said is None else said
            return _json({
                "id": "chatcmpl-test", "object": "chat.completion", "model": b.get("model"),
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                             "finish_reason": "stop"}],
                "usage": {"prompt_tokens": sum(len(str(m.get("content", ""))) for m in msgs),
                          "completion_tokens": len(text)},
            })

        return await self._serve(request, messages, body, respond)

    async def completions(self, request: web.Request) -> web.Response:
        body = json.loads(await request.read())
        prompt = str(body.get("prompt", ""))
        messages = [{"role": "user", "content": prompt}]

        def respond(msgs: list[dict[str, Any]], b: dict[str, Any], said: str | None = None) -> web.Response:
            choice: dict[str, Any] = {"index": 0, "finish_reason": "stop"}
            if said is not None:
                choice["text"] = said
            elif b.get("echo"):
                # One token per character, scored as the module docstring says.
                choice["text"] = prompt
                tokens = list(prompt)
                choice["logprobs"] = {
                    "tokens": tokens,
                    "text_offset": list(range(len(tokens))),
                    "token_logprobs": [None] + [self._char_logprob(prompt, i) for i in range(1, len(tokens))],
                }
            else:
                choice["text"] = answer(msgs)[: int(b.get("max_tokens") or 1 << 30)]
            return _json({"id": "cmpl-test", "object": "text_completion", "model": b.get("model"),
                                      "choices": [choice], "usage": {"prompt_tokens": len(prompt),
                                                                     "completion_tokens": 0}})

        return await self._serve(request, messages, body, respond)

    @staticmethod
    def _char_logprob(prompt: str, i: int) -> float:
        """-1 per character, 0 for characters of a trailing word that already occurred before it."""
        tail_start = prompt.rstrip().rfind(" ") + 1
        if i >= tail_start:
            word = prompt[tail_start:].strip()
            if word and word in prompt[:tail_start]:
                return 0.0
        return -1.0

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "test-model", "object": "model"}]})

    async def get_stats(self, request: web.Request) -> web.Response:
        out = self.stats.to_json()
        if request.query.get("log"):
            out["log"] = self.stats.log
        return web.json_response(out)

    async def post_reset(self, request: web.Request) -> web.Response:
        self.reset()
        return web.json_response({"ok": True})

    async def post_config(self, request: web.Request) -> web.Response:
        changes = await request.json()
        valid = {f.name for f in dataclasses.fields(ServerConfig)}
        unknown = sorted(set(changes) - valid)
        if unknown:
            return _error(400, f"unknown config keys {unknown}; valid: {sorted(valid)}", "invalid_request")
        self.configure(**changes)
        return web.json_response(dataclasses.asdict(self.config))


class ServerThread:
    """The server on its own thread and event loop, on 127.0.0.1 and a free port."""

    def __init__(self, config: ServerConfig | None = None) -> None:
        self.server = OpenAIServer(config)
        self.port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        asyncio.set_event_loop(loop)

        async def serve() -> None:
            runner = web.AppRunner(self.server.app, access_log=None)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0, backlog=1024)
            await site.start()
            self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
            self._stop = asyncio.Event()
            self._ready.set()
            await self._stop.wait()
            for task in self.server.hanging:
                task.cancel()
            await runner.cleanup()

        loop.run_until_complete(serve())
        loop.close()

    def start(self) -> ServerThread:
        self._thread = threading.Thread(target=self._run, name="openai-test-server", daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("test server did not start in 10 s")
        return self

    def call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """Run ``fn`` on the server's loop (state is only touched there)."""
        assert self._loop is not None
        done = threading.Event()
        out: list[Any] = []

        def run() -> None:
            out.append(fn(*args, **kwargs))
            done.set()

        self._loop.call_soon_threadsafe(run)
        done.wait(10)
        return out[0] if out else None

    def configure(self, **changes: Any) -> None:
        self.call(self.server.configure, **changes)

    def reset(self) -> None:
        self.call(self.server.reset)

    def stats(self) -> dict[str, Any]:
        return self.call(lambda: {**self.server.stats.to_json(), "log": list(self.server.stats.log)})

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(10)

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--max-lifetime-s", type=float, default=900.0, help="stop by itself after this long")
    p.add_argument("--stop-on-eof", action="store_true", help="stop when stdin closes (its parent died)")
    for f in dataclasses.fields(ServerConfig):
        flag = "--" + f.name.replace("_", "-")
        kind = {"float": float, "int": int, "str": str}.get(str(f.type).split(" ")[0].split("|")[0], str)
        p.add_argument(flag, type=kind, default=None)
    args = p.parse_args(argv)
    changes = {f.name: getattr(args, f.name) for f in dataclasses.fields(ServerConfig)
               if getattr(args, f.name) is not None}
    server = OpenAIServer(ServerConfig(**changes))

    async def serve() -> None:
        runner = web.AppRunner(server.app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", args.port, backlog=1024)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        print(f"PORT {port}", flush=True)
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        if args.stop_on_eof:
            fut = loop.run_in_executor(None, sys.stdin.read)
            fut.add_done_callback(lambda _: stop.set())
        try:
            await asyncio.wait_for(stop.wait(), timeout=args.max_lifetime_s)
        except asyncio.TimeoutError:
            pass
        await runner.cleanup()

    try:
        asyncio.run(serve())
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
