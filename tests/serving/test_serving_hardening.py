"""Hardening of managed servers through ``run.py``: the key never goes to an HTTP proxy, a task
that fails for good frees its model's replicas, what a server prints never shows the key."""

from __future__ import annotations

import os
import socket
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import events, run_cli, run_dirs
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


STUB = str(Path(__file__).with_name("keyed_stub.py"))


def stub(*flags: str, **extra: Any) -> dict[str, Any]:
    """A ``command`` server running :mod:`tests.serving.keyed_stub`."""
    return dict(engine="command", model="m", command=[sys.executable, STUB, "{port}", *flags], **extra)


def two_models(tmp_path: Path, first: dict[str, Any], second: dict[str, Any]) -> Path:
    """A run of models ``a`` (``first``) and ``b`` (``second``) on the runner's one GPU '0'."""
    cfg = config(tmp_path, first, rows=2)
    text = cfg.read_text()
    model_b = text.split("models = [", 1)[1].split("]\n", 1)[0].replace("abbr='smol'", "abbr='b'")
    model_b = model_b.replace(repr(first), repr(second))
    text = text.replace("abbr='smol'", "abbr='a'").replace("gpus=[]", "gpus=['0']")
    head, rest = text.split("models = [", 1)
    model_a, tail = rest.split("]\n", 1)
    cfg.write_text(f"{head}models = [{model_a}, {model_b}]\n{tail}")
    return cfg


def test_a_task_that_fails_for_good_frees_its_replicas_gpus_for_the_next_model(tmp_path: Path) -> None:
    """Model a's one task fails (every request a 400): a's replica must stop, so b's replica
    can take GPU '0' and b's task runs; the run ends with a's failure named."""
    cfg = two_models(tmp_path, stub("--fail", gpus=1, max_restarts=0), stub(gpus=1, max_restarts=0))
    res = run_cli(cfg, timeout=90)
    assert res.returncode == 1, res.stderr[-3000:]
    failed = [ln for ln in res.stderr.splitlines() if ln.startswith("FAILED: infer task")]
    assert len(failed) == 1 and "infer_a_arith" in failed[0] and "HTTP 400" in failed[0], failed
    (run,) = run_dirs(tmp_path / "out")
    evs = events(run)
    assert [e["model"] for e in evs if e["event"] == "server_started"] == ["a", "b"]
    assert [e["task_id"] for e in evs if e["event"] == "done" and e["stage"] == "infer"] == ["infer_b_arith"]
    stopped_a = next(i for i, e in enumerate(evs) if e["event"] == "server_stopped" and e["model"] == "a")
    started_b = next(i for i, e in enumerate(evs) if e["event"] == "server_started" and e["model"] == "b")
    assert stopped_a < started_b  # b's replica got GPU '0' once a's gave it back


@pytest.mark.parametrize("exits", [True, False], ids=["exits-at-once", "serves"])
def test_a_key_the_server_prints_shows_in_no_file_event_or_failed_line(tmp_path: Path, exits: bool) -> None:
    told = tmp_path / "told.key"
    flags = ("--tell", str(told), *(("--exit-after-print",) if exits else ()))
    res = run_cli(config(tmp_path, stub(*flags, max_restarts=0), rows=2), timeout=60)
    key = told.read_text()
    assert len(key) >= 32
    assert res.returncode == (1 if exits else 0), res.stderr[-3000:]
    assert key not in res.stdout + res.stderr
    (run,) = run_dirs(tmp_path / "out")
    log = run / "servers/smol/replica-0.log"
    assert "server_args: port=" in log.read_text() and "api_key=***" in log.read_text()
    assert oct(log.stat().st_mode & 0o777) == "0o600"
    files = [p for p in run.rglob("*") if p.is_file()]
    assert [p for p in files if key.encode() in p.read_bytes()] == []
    if exits:
        (line,) = [ln for ln in res.stderr.splitlines() if ln.startswith("FAILED: infer task")]
        assert "exited with code 3 before it was ready" in line and "api_key=***" in line, line
        (ev,) = [e for e in events(run) if e["event"] == "server_exited"]
        assert "api_key=***" in ev["reason"]


@pytest.mark.parametrize("bad, expected", [
    ("setting", "xllama: --set 'verbose_prompt=maybe': not a value for verbose_prompt"),
    ("weights", "xllama: llama.cpp could not start"),
])
def test_a_bad_llama_cpp_setting_or_corrupt_weights_fail_the_run_in_one_line(tmp_path: Path, bad: str,
                                                                              expected: str) -> None:
    """A setting the launcher cannot read (before: a misspelt flag was silently ``false`` and the run
    went on) and a file that is no GGUF model: the replica exits, the task fails in one line."""
    server = llama(replicas=1, startup_timeout_s=90, max_restarts=0)
    if bad == "setting":
        server["args"] = ["verbose_prompt=maybe"]
    else:
        junk = tmp_path / "junk.gguf"
        junk.write_bytes(b"GGUF" + b"\0" * 64)
        server["model"] = str(junk)
    res = run_cli(config(tmp_path, server, rows=2), timeout=200)
    assert res.returncode == 1, res.stderr[-2000:]
    (line,) = [ln for ln in res.stderr.splitlines() if ln.startswith("FAILED: infer task")]
    assert "llama.cpp replica 0 of smol exited with code" in line and "Traceback" not in line, line
    (run,) = run_dirs(tmp_path / "out")
    log = (run / "servers/smol/replica-0.log").read_text(errors="replace")
    # the setting's line is the launcher's only output; llama.cpp's own lines may follow its refusal
    assert expected in (line if bad == "setting" else log), (line, log[-2000:])
