"""RayRunner without a cluster: Ray stays unimported until a launch, a missing Ray or a bad option
is one line, and the embedded default (``address=None``) runs a whole evaluation on a local Ray
that is gone when the run ends."""

from __future__ import annotations

import concurrent.futures
import contextlib
import http.server
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO, ray_env
from ray_helpers import events, outputs, run_cli, run_dir, stage_events, write_config

pytestmark = pytest.mark.ray


def python(code: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60,
                          env={**ray_env(), **(env or {})})


def test_the_orchestrator_and_a_built_ray_runner_never_import_ray() -> None:
    # .importlinter lets runners/ray/connection.py, pool.py and session.py import ray; nothing may import them early
    res = python(
        "import sys\n"
        "import orchestra, orchestra.api, orchestra.cli.main, orchestra.runners, orchestra.planner\n"
        "from orchestra.registry import RUNNERS\n"
        "runner = RUNNERS.resolve('RayRunner', 'test')(address='auto', max_num_workers=2)\n"
        "mine = ('orchestra.runners.ray.connection', 'orchestra.runners.ray.pool', 'orchestra.runners.ray.session')\n"
        "print(sorted(m for m in sys.modules if m == 'ray' or m.startswith(('ray.', *mine))))\n"
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "[]"


@pytest.fixture
def no_ray(tmp_path: Path) -> dict[str, str]:
    """The environment of a Python where ``import ray`` fails as on a machine without it."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import sys\n"
        "class _NoRay:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'ray' or name.startswith('ray.'):\n"
        "            raise ModuleNotFoundError(f\"No module named {name!r}\", name=name)\n"
        "        return None\n"
        "sys.meta_path.insert(0, _NoRay())\n"
    )
    return {"PYTHONPATH": f"{site}{os.pathsep}{ray_env()['PYTHONPATH']}"}


def test_missing_ray_is_one_line_naming_the_extra(tmp_path: Path, no_ray: dict[str, str]) -> None:
    cfg = write_config(tmp_path, "type=RayRunner, address='auto'")
    res = run_cli(cfg, env=no_ray)
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == [
        f"orchestra: error: {cfg}: infer.runner: RayRunner needs Ray, which is not installed: "
        "pip install 'orchestra[ray]'"
    ]
    assert not (tmp_path / "out").exists()  # refused before a run folder was made
    # a LocalRunner config runs on the same machine as ever
    local = write_config(tmp_path / "local", "type=LocalRunner")
    assert run_cli(local, "--dry-run", env=no_ray).returncode == 0


def test_launch_without_ray_is_a_user_error_naming_the_extra() -> None:
    # built where Ray is found, launched where it is not (it went away, or a broken install)
    res = python(
        "import sys\n"
        "from orchestra.errors import UserError\n"
        "from orchestra.runners.ray.runner import RayRunner\n"
        "runner = RayRunner(address='auto')\n"
        "class NoRay:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'ray' or name.startswith('ray.'):\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
        "sys.meta_path.insert(0, NoRay())\n"
        "try:\n"
        "    runner.launch([], None)\n"
        "except UserError as exc:\n"
        "    print(exc)\n"
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("RayRunner needs Ray: pip install 'orchestra[ray]'"), res.stdout


@pytest.mark.parametrize("option, message", [
    ("address=' '", "address must be None, 'auto', 'host:port' or 'ray://host:port', got ' '"),
    ("address=6379", "infer.runner.address: expected str | None, got int 6379"),
    ("mem_gb=0", "mem_gb must be > 0, got 0"),
    ("connect_timeout_s=0", "connect_timeout_s must be > 0, got 0"),
    ("connect_timeout_s='60'", "infer.runner.connect_timeout_s: expected float, got str '60'"),
    ("runtime_env='pip'", "infer.runner.runtime_env: expected dict[str, Any] | None, got str 'pip'"),
    ("forward_env='OPENAI_API_KEY'", "forward_env: expected list[str] | tuple[str, ...], got str"),
    ("infra_retry=-1", "infra_retry must be an integer >= 0, got -1"),
    ("template='numactl {task_cmd}'", "unknown key 'template'"),
])
def test_bad_option_is_one_line(tmp_path: Path, option: str, message: str) -> None:
    cfg = write_config(tmp_path, f"type=RayRunner, {option}")
    res = run_cli(cfg, "--dry-run")
    assert res.returncode == 2
    assert len(res.stderr.strip().splitlines()) == 1 and message in res.stderr, res.stderr


def test_dry_run_shows_each_task_and_connects_to_nothing(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, "type=RayRunner, address='ray://nowhere.invalid:10001'")
    res = run_cli(cfg, "--dry-run")
    assert res.returncode == 0, res.stderr
    assert "runner RayRunner (max_num_workers=32, retry=0)" in res.stdout
    assert "-m orchestra.tasks.infer" in res.stdout


@pytest.mark.parametrize("mode", ["infer", "all"])
def test_unreachable_cluster_is_one_line_at_once(tmp_path: Path, mode: str) -> None:
    """Only that line (the stage headers and progress lines of both stages were printed before it,
    the eval stage's from its own thread), and no task started."""
    address = "type=RayRunner, address='127.0.0.1:9'"  # nothing listens on port 9
    cfg = write_config(tmp_path, address, eval_runner=f"dict({address}, task=dict(type=EvalTask))")
    res = run_cli(cfg, "--mode", mode, "-w", tmp_path / "out", timeout=60)  # Ray alone would retry for minutes
    assert res.returncode == 2, res.stderr[-2000:]
    assert res.stderr == ("orchestra: error: RayRunner could not connect to the Ray cluster at 127.0.0.1:9: "
                          "Connection refused\n"), res.stderr
    (run,) = (tmp_path / "out").iterdir()
    assert not (run / "logs").exists() or not any((run / "logs").rglob("*.log"))


@pytest.mark.slow
def test_local_default_runs_the_evaluation_and_stops_its_ray(tmp_path: Path) -> None:
    """``address=None``: a Ray started on this machine for the run, shared by both stages, gone
    when the run ends."""
    on_ray = write_config(tmp_path / "ray", "type=RayRunner, max_num_workers=2", model=", load_s=0.2",
                          eval_runner="dict(type=RayRunner, task=dict(type=EvalTask))")
    local = write_config(tmp_path / "local", "type=LocalRunner, max_num_workers=2", model=", load_s=0.2")
    proc = subprocess.Popen([sys.executable, "run.py", str(on_ray)], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=ray_env(), start_new_session=True)
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err[-3000:]
    assert run_cli(local).returncode == 0
    run = run_dir(tmp_path / "ray")
    assert outputs(run) == outputs(run_dir(tmp_path / "local"))
    assert len(stage_events(run, "infer", "done")) == 5 and len(stage_events(run, "eval", "done")) == 2
    clusters = [e for e in events(run) if e["event"] == "ray_cluster"]
    assert [c["nodes"] for c in clusters] == [1, 1]
    assert clusters[0]["gcs_address"] and clusters[0]["gcs_address"] == clusters[1]["gcs_address"]  # one Ray
    # nothing of the run's Ray outlives it: not its workers, not Ray's own processes (they share
    # the orchestrator's process group)
    pids = {e["pid"] for e in events(run) if e["event"] == "worker_ready"}
    assert pids and not [p for p in pids if os.path.exists(f"/proc/{p}")]
    group = subprocess.run(["ps", "-o", "pid=,args=", "-g", str(proc.pid)], capture_output=True, text=True).stdout
    assert group.strip() == "", group


def test_ray_client_start_failure_is_tried_again_then_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """The head's client server sometimes fails to start a client's server ("Initialization failure
    from server:" and nothing more): the connection is tried again, and in the end is one line."""
    from orchestra.errors import UserError
    from orchestra.runners.ray import connection as ray_session

    calls: list[str] = []

    def init(address: str, **_: object) -> None:
        calls.append(address)
        if len(calls) < 3:
            raise ConnectionAbortedError("Initialization failure from server:\n")

    monkeypatch.setattr(ray_session.ray, "init", init)
    monkeypatch.setattr(ray_session.time, "sleep", lambda s: None)
    ray_session._ray_init("ray://h:10001", "ray://h:10001", None, 30)  # the third try connects
    assert calls == ["ray://h:10001"] * 3
    calls.clear()
    monkeypatch.setattr(ray_session, "CLIENT_INIT_TRIES", 2)
    with pytest.raises(UserError) as err:
        ray_session._ray_init("ray://h:10001", "ray://h:10001", None, 30)
    assert len(calls) == 2
    assert str(err.value) == ("RayRunner could not connect to the Ray cluster at ray://h:10001: Initialization "
                              "failure from server: no reason given (the head's logs/ray_client_server*.err may "
                              "say more)")
    calls.clear()
    with pytest.raises(UserError):  # not Ray Client: no second try
        ray_session._ray_init("h:6379", "h:6379", None, 30)
    assert calls == ["h:6379"]


@contextlib.contextmanager
def silent_ray_head(ping: bool = True) -> Iterator[tuple[int, list[str]]]:
    """A gRPC server that answers Ray Client's ping, as a head's client server does, then takes
    each connection's data stream and never answers a request on it (a head whose server for the
    client crashed while starting); ``ping=False``: not even the ping is answered.  Yields its port
    and the client ids of the streams it took."""
    import grpc
    from ray.core.generated import ray_client_pb2, ray_client_pb2_grpc

    streams: list[str] = []
    stop = threading.Event()

    class Driver(ray_client_pb2_grpc.RayletDriverServicer):
        def ClusterInfo(self, request: Any, context: Any) -> Any:  # noqa: N802 - gRPC's name
            while not ping and context.is_active() and not stop.wait(0.1):
                pass
            return ray_client_pb2.ClusterInfoResponse(json="{}")

    class Data(ray_client_pb2_grpc.RayletDataStreamerServicer):
        def Datapath(self, request_iterator: Any, context: Any) -> Iterator[Any]:  # noqa: N802
            streams.append(dict(context.invocation_metadata()).get("client_id", "?"))
            while context.is_active() and not stop.wait(0.1):
                pass  # reads nothing, answers nothing: the client waits on its Init
            yield from ()

    server = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=8))
    ray_client_pb2_grpc.add_RayletDriverServicer_to_server(Driver(), server)
    ray_client_pb2_grpc.add_RayletDataStreamerServicer_to_server(Data(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield port, streams
    finally:
        stop.set()
        server.stop(grace=None)


def test_a_ray_client_connection_the_head_never_answers_is_cut_tried_again_and_one_line(tmp_path: Path) -> None:
    """Ray Client waits for the head's answer to its first request with no deadline: after
    ``connect_timeout_s`` the connection is cut and made again, three times, then the run ends with
    one line naming the address and the option, exit 2; what Ray Client logs about the closed
    channel stays off the terminal."""
    with silent_ray_head() as (port, streams):
        address = f"ray://127.0.0.1:{port}"
        cfg = write_config(tmp_path, f"type=RayRunner, address={address!r}, connect_timeout_s=3")
        res = run_cli(cfg, "--mode", "infer", timeout=90)  # a hang guard: 3 x 3 s, the cuts, the retries' pauses
    assert res.returncode == 2, res.stderr[-2000:]
    lines = res.stderr.strip().splitlines()
    assert lines[-1] == (f"orchestra: error: RayRunner could not connect to the Ray cluster at {address}: no answer "
                         "within connect_timeout_s=3 s, 3 times (a runtime_env that the head installs may need "
                         "longer; the head's logs/ray_client_server*.err may say more)"), res.stderr[-2000:]
    assert not [line for line in lines if "ERROR" in line or "rror in data channel" in line], res.stderr[-2000:]
    assert len(streams) == 3 and len(set(streams)) == 3, streams  # three connections, each a new client


def test_a_cut_ray_client_connection_leaves_the_process_able_to_connect_again() -> None:
    """In one process: a connection to a head that never answers is cut, the next one to the same
    head is cut too, and nothing of either is left: no connecting thread, no Ray Client mode."""
    code = textwrap.dedent("""
        import sys, threading
        from orchestra.runners.ray import connection
        connection.CLIENT_INIT_TRIES = 2
        from orchestra.errors import UserError
        for attempt in range(2):
            try:
                connection._ray_init(sys.argv[1], sys.argv[1], None, 3)
            except UserError as exc:
                print("refused:", exc)
        import ray
        from ray._private.client_mode_hook import is_client_mode_enabled
        left = [t.name for t in threading.enumerate() if t.name == "orchestra-ray-connect"]
        print("initialized:", ray.is_initialized(), "client mode:", is_client_mode_enabled,
              "connecting threads:", left)
    """)
    with silent_ray_head() as (port, streams):
        res = subprocess.run([sys.executable, "-c", code, f"ray://127.0.0.1:{port}"], cwd=REPO,
                             capture_output=True, text=True, timeout=120, env=ray_env())
    assert res.returncode == 0, res.stderr[-3000:]
    out = res.stdout.splitlines()
    assert [line.split(":")[0] for line in out] == ["refused", "refused", "initialized"], \
        res.stdout + res.stderr[-2000:]
    assert "no answer within connect_timeout_s=3 s, 2 times" in out[0]
    assert out[2] == "initialized: False client mode: False connecting threads: []", out
    assert len(set(streams)) == 4, streams


def test_a_ray_client_still_dialling_a_head_that_never_answers_its_ping_is_one_line(tmp_path: Path) -> None:
    """A head that takes the gRPC connection and never answers Ray Client's ping (which Ray sends
    with no deadline): nothing to cut yet, so after ``connect_timeout_s`` and the wait for the cut
    the run ends with one line saying Ray Client was still dialling."""
    with silent_ray_head(ping=False) as (port, streams):
        address = f"ray://127.0.0.1:{port}"
        cfg = write_config(tmp_path, f"type=RayRunner, address={address!r}, connect_timeout_s=2")
        res = run_cli(cfg, "--mode", "infer", timeout=120)
    assert res.returncode == 2, res.stderr[-2000:]
    assert res.stderr.strip().splitlines()[-1] == (
        f"orchestra: error: RayRunner could not connect to the Ray cluster at {address}: no answer within "
        "connect_timeout_s=2 s, and Ray Client was still dialling the head"), res.stderr[-2000:]
    assert streams == []


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_while_ray_client_waits_for_the_head_stops_the_run_in_seconds(tmp_path: Path, sig: int) -> None:
    """Ctrl-C (or SIGTERM) while the connection waits for a head that never answers: the run's
    handler only sets its stop flag, so the wait itself must look at it; the connection is cut and
    the run ends as interrupted (130) in seconds, not after ``connect_timeout_s``."""
    from helpers import wait_for
    from ray_helpers import start_cli

    with silent_ray_head() as (port, streams):
        cfg = write_config(tmp_path, f"type=RayRunner, address='ray://127.0.0.1:{port}', connect_timeout_s=300")
        proc = start_cli(cfg, "--mode", "infer")
        try:
            wait_for(lambda: streams, timeout_s=60, what="the client's data stream at the head")
            start = time.monotonic()
            os.killpg(proc.pid, sig)
            out, err = proc.communicate(timeout=60)
            took = time.monotonic() - start
        finally:
            proc.kill()
    assert proc.returncode == 130, err[-2000:]
    assert f"{signal.Signals(sig).name} received" in err, err[-2000:]
    assert took < 30, took  # a hang guard: the cut takes well under a second; the connect would take 300 s


class _Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_error(404)

    def log_message(self, *args: object) -> None:
        pass


@pytest.mark.parametrize("kind", ["http", "silent", "http-ray-client"])
def test_an_address_where_no_ray_head_listens_is_one_line_in_seconds(tmp_path: Path, kind: str) -> None:
    """An HTTP server (as on Ray's dashboard port) or a socket that accepts and says nothing, at the
    address of RayRunner: one line naming the address and what was expected, exit 2, in seconds (Ray
    alone hangs there for 10+ minutes)."""
    with contextlib.ExitStack() as stack:
        if kind == "silent":
            listener = stack.enter_context(socket.create_server(("127.0.0.1", 0)))
            held: list[socket.socket] = []
            accepting = threading.Thread(target=lambda: held.append(listener.accept()[0]), daemon=True)
            accepting.start()
            port = listener.getsockname()[1]
        else:
            server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hello)
            stack.callback(server.server_close)
            stack.callback(server.shutdown)
            threading.Thread(target=server.serve_forever, daemon=True).start()
            port = server.server_address[1]
        address = f"{'ray://' if kind == 'http-ray-client' else ''}127.0.0.1:{port}"
        cfg = write_config(tmp_path, f"type=RayRunner, address={address!r}")
        start = time.monotonic()
        res = run_cli(cfg, "--mode", "infer", timeout=120)
        took = time.monotonic() - start
    assert res.returncode == 2, res.stderr[-2000:]
    errors = [line for line in res.stderr.splitlines() if "error" in line]
    assert len(errors) == 1 and errors[0] == res.stderr.strip().splitlines()[-1], res.stderr
    assert errors[0].startswith(f"orchestra: error: RayRunner could not connect to the Ray cluster at {address}: ")
    assert "expected a Ray head's gRPC port" in errors[0] or "not a Ray head's gRPC port" in errors[0], errors[0]
    assert ("HTTP/1 server" if kind != "silent" else "said nothing within") in errors[0]
    assert took < 60, took  # a hang guard only (the probe gives up after 3 s)


def test_a_ray_error_is_described_in_rays_words_without_its_traceback_or_boilerplate() -> None:
    import traceback

    from ray import exceptions as rex

    from orchestra.runners.ray.pool import describe

    try:
        raise RuntimeError("Failed to create conda env orchestra-no-such-env: not found")
    except RuntimeError:
        setup = rex.RuntimeEnvSetupError(error_message=traceback.format_exc())
    assert describe(setup) == ("Failed to set up runtime environment. "
                               "RuntimeError: Failed to create conda env orchestra-no-such-env: not found")
    died = RuntimeError("The actor died unexpectedly before finishing this task.\n\tclass_name: TaskWorker\n"
                        "\tactor_id: 0a1b\n\tpid: 4242\n\tname: orc-w1\n\tnamespace: ns\n\tip: 10.0.0.7\n"
                        "The actor is dead because its worker process has died. Worker exit type: SYSTEM_ERROR")
    assert describe(died) == ("The actor died unexpectedly before finishing this task. The actor is dead because "
                              "its worker process has died. Worker exit type: SYSTEM_ERROR")
    assert describe(rex.RayError()) == "RayError"
