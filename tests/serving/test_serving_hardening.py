"""Hardening of managed servers through ``run.py``: the key never goes to an HTTP proxy, a task
that fails for good frees its model's replicas, what a server prints never shows the key."""

from __future__ import annotations

import os
import socket
import threading
from pathlib import Path

import pytest

from tests.helpers import run_cli, run_dirs
from tests.serving.test_managed_runs import config, llama, predictions

pytestmark = pytest.mark.slow


class RecordingProxy:
    """A real TCP server on 127.0.0.1 that records every connection made to it (and answers none)."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.port = int(self.sock.getsockname()[1])
        self.seen: list[bytes] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except (TimeoutError, OSError):
                continue
            with conn:
                conn.settimeout(1.0)
                try:
                    self.seen.append(conn.recv(4096) or b"<connected>")
                except OSError:
                    self.seen.append(b"<connected>")

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        self.sock.close()


def test_the_key_never_goes_to_the_environments_http_proxy(tmp_path: Path) -> None:
    proxy = RecordingProxy()
    try:
        url = f"http://127.0.0.1:{proxy.port}"
        env = {k: v for k, v in os.environ.items() if k.lower() not in ("no_proxy", "http_proxy", "https_proxy")}
        env.update(http_proxy=url, HTTP_PROXY=url, https_proxy=url, HTTPS_PROXY=url, all_proxy=url)
        server = llama(replicas=1, startup_timeout_s=90, max_restarts=0)
        res = run_cli(config(tmp_path, server, rows=4), timeout=300, env=env)
        assert res.returncode == 0, res.stderr[-3000:]
        (run,) = run_dirs(tmp_path / "out")
        assert len(predictions(run)) == 4
    finally:
        proxy.close()
    assert proxy.seen == [], proxy.seen[:3]
