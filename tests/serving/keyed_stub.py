"""A small OpenAI-compatible server for tests of managed ``command`` servers (stdlib only).

    python tests/serving/keyed_stub.py PORT|SOCKET [--fail] [--exit-after-print] [--tell PATH] [--slow S]
        [--warm S] [--chatter MB]

It takes its key from ``ORCHESTRA_SERVER_KEY`` and, like SGLang, prints its arguments, the key
among them, when it starts.  ``/health`` answers 200; ``/v1/models`` and ``/v1/completions``
demand the key (401 otherwise).  Completions answer ``3`` (``--fail``: every completion is a
400, so the task fails for good).  ``--exit-after-print``: exit 3 right after printing.
``--tell PATH``: write the key to PATH (outside the run folder), so a test knows what to look for.
An absolute path instead of a port: listen on that Unix socket (as ``vllm serve --uds``).
``--chatter MB``: right after printing its arguments, print MB MiB of numbered lines
(``chatter 000000 yyy...``), then ``last words: ...`` (a chatty server, and where a crash's cause is).
``--slow S``: each completion takes S seconds.  ``--warm S``: for its first S seconds ``/health``
answers 503 and ``/v1/models`` 503 even with the key (a server still loading its weights).
"""

from __future__ import annotations

import json
import os
import socket
import socketserver
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

KEY = os.environ.get("ORCHESTRA_SERVER_KEY", "")
FAIL = "--fail" in sys.argv
SLOW_S = float(sys.argv[sys.argv.index("--slow") + 1]) if "--slow" in sys.argv else 0.0
WARM_UNTIL = time.monotonic() + (float(sys.argv[sys.argv.index("--warm") + 1]) if "--warm" in sys.argv else 0.0)


class Handler(BaseHTTPRequestHandler):
    """Answers the few routes a managed replica needs."""

    def _answer(self, status: int, body: dict[str, object]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _keyed(self) -> bool:
        if self.headers.get("Authorization") == f"Bearer {KEY}" and KEY:
            return True
        self._answer(401, {"error": {"message": "bad key"}})
        return False

    def do_GET(self) -> None:  # noqa: N802 - the http.server name
        warm = time.monotonic() >= WARM_UNTIL
        if self.path == "/health":
            self._answer(200 if warm else 503, {"ok": warm})
        elif self.path == "/v1/models" and self._keyed():
            self._answer(200 if warm else 503, {"data": [{"id": "m"}]})

    def do_POST(self) -> None:  # noqa: N802 - the http.server name
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if not self._keyed():
            return
        time.sleep(SLOW_S)
        if FAIL:
            self._answer(400, {"error": {"message": "this model refuses every request"}})
            return
        self._answer(200, {"choices": [{"index": 0, "text": " 3", "finish_reason": "stop"}],
                           "usage": {"prompt_tokens": 5, "completion_tokens": 1}})

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the http.server name
        print(f"request {self.command} {self.path}", flush=True)


class StubServer(ThreadingHTTPServer):
    """A listen backlog as servers use (uvicorn: 2048), not socketserver's 5: on a Unix socket a
    full backlog makes asyncio's connect look done and the request's write fail."""

    request_queue_size = 256


class UnixHTTPServer(StubServer):
    """The same server on a Unix socket (no host name to look up)."""

    address_family = socket.AF_UNIX

    def server_bind(self) -> None:
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = "localhost", 0


#: one chatter line: its number, then filler up to 1 KiB
CHATTER_LINE = "chatter {:06d} " + "y" * 1008 + "\n"


def chatter(size: int) -> None:
    """Print ``size`` bytes of numbered lines, then the last words (with the key, as a crash's
    traceback may quote it)."""
    out = sys.stdout
    for i in range(size // len(CHATTER_LINE)):
        out.write(CHATTER_LINE.format(i))
    print(f"last words: the weights did not fit (key {KEY})", flush=True)


def main() -> None:
    if "--tell" in sys.argv:
        with open(sys.argv[sys.argv.index("--tell") + 1], "w", encoding="utf-8") as fh:
            fh.write(KEY)
    print(f"server_args: port={sys.argv[1]} api_key={KEY} served_model_name=m", flush=True)
    if "--chatter" in sys.argv:
        chatter(int(float(sys.argv[sys.argv.index("--chatter") + 1]) * (1 << 20)))
    if "--exit-after-print" in sys.argv:
        sys.exit(3)
    if sys.argv[1].startswith("/"):
        UnixHTTPServer(sys.argv[1], Handler).serve_forever()  # type: ignore[arg-type]
    else:
        StubServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()


if __name__ == "__main__":
    main()
