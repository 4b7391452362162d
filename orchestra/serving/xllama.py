"""One llama.cpp replica: llama.cpp's OpenAI-compatible server from the ``xllamacpp`` wheel.

    python -m orchestra.serving.xllama --model FILE.gguf [--host ADDR] --port P --alias NAME
        [--threads 1] [--parallel 4] [--ctx 8192] [--set name=value ...]

Listens on ``--host`` only (127.0.0.1 unless placed on a cluster node) and demands the key read from the file named by
``ORCHESTRA_SERVER_KEY_FILE`` (``/health`` stays public, as in llama.cpp; every other route
answers 401 without the key).  xllamacpp runs the server on threads of this process, so this
process *is* the replica: it serves until SIGTERM or SIGINT and exits 0, or exits 3 when the
model cannot be loaded.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from typing import Any

from orchestra.serving.spec import LLAMA_RESERVED

_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def _value(old: Any, raw: str) -> Any:
    """``raw`` as the type of the field's current value ``old`` (ValueError: it is not one)."""
    if isinstance(old, bool):
        if raw.lower() not in _TRUE + _FALSE:
            raise ValueError(f"expected one of {', '.join(_TRUE + _FALSE)}")
        return raw.lower() in _TRUE
    if isinstance(old, int):
        return int(raw)
    if isinstance(old, float):
        return float(raw)
    if isinstance(old, str):
        return raw
    raise ValueError(f"the field holds a {type(old).__name__}, not a number, a flag or a string")


def _apply(params: Any, setting: str) -> None:
    """``name=value`` on ``CommonParams`` (value read as int, float, bool or str, like the field);
    a setting that is not one exits with one line naming it (not a traceback, not a silent
    ``false`` for a misspelt ``true``)."""
    name, sep, raw = setting.partition("=")
    if not sep or name.startswith("_") or not hasattr(params, name):
        raise SystemExit(f"xllama: --set {setting!r}: expected name=value with a CommonParams field name")
    if name in LLAMA_RESERVED:
        raise SystemExit(f"xllama: --set {setting!r}: orchestra sets {name} itself")
    try:
        setattr(params, name, _value(getattr(params, name), raw))
    except (ValueError, TypeError) as exc:
        raise SystemExit(f"xllama: --set {setting!r}: not a value for {name}: {exc}") from None


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m orchestra.serving.xllama")
    ap.add_argument("--model", required=True)
    ap.add_argument("--host", default="127.0.0.1", help="the address to listen on (a cluster node's own)")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--alias", required=True)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--parallel", type=int, default=4)
    ap.add_argument("--ctx", type=int, default=8192)
    ap.add_argument("--set", action="append", default=[], dest="settings")
    args = ap.parse_args()
    try:
        with open(os.environ["ORCHESTRA_SERVER_KEY_FILE"], encoding="utf-8") as fh:
            key = fh.read().strip()
    except (KeyError, OSError) as exc:
        raise SystemExit(f"xllama: no key file ({exc}); a replica never serves without a key") from None
    if not key:
        raise SystemExit("xllama: the key file is empty; a replica never serves without a key")
    if not os.path.isfile(args.model):
        print(f"xllama: model file not found: {args.model}", file=sys.stderr, flush=True)
        sys.exit(3)
    import xllamacpp

    params = xllamacpp.CommonParams()
    params.model.path = args.model
    params.model_alias = {args.alias}
    params.hostnames = [args.host]
    params.port = args.port
    params.api_keys = [key]
    params.n_parallel = args.parallel
    params.n_ctx = args.ctx
    params.cpuparams.n_threads = args.threads
    params.cpuparams_batch.n_threads = args.threads
    for setting in args.settings:
        _apply(params, setting)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        server = xllamacpp.Server(params)
    except Exception as exc:  # noqa: BLE001 - the engine's own error, reported in the replica's log
        print(f"xllama: llama.cpp could not start: {exc}", file=sys.stderr, flush=True)
        sys.exit(3)
    print(f"xllama: serving {args.alias} on {args.host}:{args.port}", flush=True)
    stop.wait()
    del server
    sys.exit(0)


if __name__ == "__main__":
    main()
