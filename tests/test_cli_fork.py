"""The ``cli`` fixture (``tests/cli_fork.py``) runs ``run.py`` as ``subprocess.run`` does: the same
exit status, stdout and stderr as a fresh process for the same argv, folder and environment; its
own environment, folder and descriptors; a signal's death and a timeout as ``subprocess`` gives
them.  The config suites trust their assertions on exit codes and messages to it."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli_fork import FORKED_CPU_S, ForkedCLI
from tests.helpers import gone_within

REPO = Path(__file__).resolve().parents[1]
GOOD = "configs/eval_demo.py"

#: a config that reports what its process sees, then ends as ``END`` says
PROBE = """json, os, sys, time = (__import__(m) for m in ("json", "os", "sys", "time"))
_out = open(os.environ["PROBE_OUT"], "w")
_out.write(json.dumps({"pid": os.getpid(), "cwd": os.getcwd(), "argv": sys.argv, "orig_argv": sys.orig_argv[1:],
                       "fds": sorted(int(fd) for fd in os.listdir("/proc/self/fd")),
                       "env": os.environ.get("ONLY_HERE"), "main": sys.modules["__main__"].__file__,
                       "path0": sys.path[0], "umask": os.umask(0o022)}))
_out.close()
_end = os.environ.get("END", "")
_ = _end == "kill" and os.kill(os.getpid(), 9)
_ = _end == "sleep" and time.sleep(300)
_ = _end == "exit" and (sys.stderr.write("bye\\r\\n"), os._exit(7))
models = 1
"""


def _both(cli: ForkedCLI, args: list[str], env: dict[str, str], cwd: Path = REPO
          ) -> tuple[subprocess.CompletedProcess[str], subprocess.CompletedProcess[str]]:
    """The same run forked and as a fresh process."""
    argv = [sys.executable, "run.py", *args]
    before, cpu = cli.forked, FORKED_CPU_S[0]
    forked = cli.run(argv, cwd=cwd, env=env, timeout=120)
    assert cli.forked == before + 1, cli.why_fresh(argv, str(cwd), env)  # it did go through the fork server
    assert FORKED_CPU_S[0] > cpu  # and its CPU counts in --cpu-durations
    fresh = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    return forked, fresh


@pytest.mark.parametrize("args", [
    [GOOD, "--dry-run"],  # exit 0 and its plan on stdout
    ["tests/bad_configs/negative_retry.py", "--dry-run"],  # exit 2, one line on stderr
    ["tests/bad_configs/negative_retry.py", "--dry-run", "--debug"],  # the uncaught exception's traceback, exit 1
    ["--mode", "bogus", GOOD],  # argparse's usage error
    [],  # no config: usage
])
def test_a_forked_run_is_the_fresh_processs_exit_status_stdout_and_stderr(cli: ForkedCLI, tmp_path: Path,
                                                                       args: list[str]) -> None:
    env = {**os.environ, "ORCHESTRA_CACHE_DIR": str(tmp_path / "cache")}
    forked, fresh = _both(cli, [*args, "-w", str(tmp_path / "w")] if args else [], env)
    stamp = re.compile(r"/w/\d{8}_\d{6}")  # the run folder planned: named after the second it was planned in
    assert (forked.returncode, stamp.sub("", forked.stdout), forked.stderr) == (
        fresh.returncode, stamp.sub("", fresh.stdout), fresh.stderr)
    assert forked.args == fresh.args


def _probe(cli: ForkedCLI, tmp_path: Path, end: str) -> tuple[subprocess.CompletedProcess[str], ...]:
    cfg = tmp_path / "probe.py"
    cfg.write_text(PROBE)
    out = []
    for way in ("forked", "fresh"):
        env = {**os.environ, "PROBE_OUT": str(tmp_path / f"{way}.json"), "END": end, "ONLY_HERE": way,
               "ORCHESTRA_CACHE_DIR": str(tmp_path / "cache")}
        argv = [sys.executable, "run.py", str(cfg), "--dry-run"]
        out.append(cli.run(argv, cwd=REPO, env=env, timeout=120) if way == "forked" else
                   subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=120))
    return tuple(out)


@pytest.mark.parametrize(("end", "code"), [("kill", -signal.SIGKILL), ("exit", 7)])
def test_a_forked_process_sees_its_own_argv_folder_environment_and_descriptors(cli: ForkedCLI, tmp_path: Path,
                                                                              end: str, code: int) -> None:
    import json

    forked, fresh = _probe(cli, tmp_path, end)
    assert forked.returncode == fresh.returncode == code  # a signal's death: negative, as subprocess gives it
    assert forked.stderr == fresh.stderr == ("bye\n" if end == "exit" else "")  # universal newlines, as text=True
    seen = {way: json.loads((tmp_path / f"{way}.json").read_text()) for way in ("forked", "fresh")}
    assert seen["forked"].pop("env") == "forked" and seen["fresh"].pop("env") == "fresh"
    assert seen["forked"].pop("pid") != seen["fresh"].pop("pid")
    assert seen["forked"] == seen["fresh"]  # argv, folder, sys.path[0], __main__, open descriptors
    assert seen["forked"]["cwd"] == str(REPO)


def test_a_forked_run_past_its_timeout_is_killed_as_subprocess_kills_it(cli: ForkedCLI, tmp_path: Path) -> None:
    import json

    cfg = tmp_path / "probe.py"
    cfg.write_text(PROBE)
    env = {**os.environ, "PROBE_OUT": str(tmp_path / "pid.json"), "END": "sleep"}
    with pytest.raises(subprocess.TimeoutExpired):
        cli.run([sys.executable, "run.py", str(cfg), "--dry-run"], cwd=REPO, env=env, timeout=10)
    pid = json.loads((tmp_path / "pid.json").read_text())["pid"]
    assert gone_within(pid, 30)


@pytest.mark.parametrize("key", ["PYTHONPATH", "TZ"])
def test_a_different_interpreter_start_up_runs_a_fresh_process(cli: ForkedCLI, tmp_path: Path, key: str) -> None:
    """``PYTHONPATH`` (or locale, ``PYTHON*``) read by the interpreter at start-up, ``TZ`` read once
    by ``time`` (the run folder's name is local time): not forked."""
    value = str(tmp_path) if key == "PYTHONPATH" else "Pacific/Kiritimati"
    env = {**os.environ, key: value, "ORCHESTRA_CACHE_DIR": str(tmp_path / "cache")}
    before = cli.forked
    argv = [sys.executable, "run.py", GOOD, "--dry-run", "-w", str(tmp_path)]
    res = cli.run(argv, cwd=REPO, env=env, timeout=120)
    assert res.returncode == 0 and "[infer]" in res.stdout, res.stderr
    assert cli.forked == before
    assert cli.why_fresh(argv, str(REPO), env) == f"start-up variables differ: {key}"


def test_a_forked_process_has_the_umask_a_fresh_one_inherits(cli: ForkedCLI, tmp_path: Path) -> None:
    """A test's ``os.umask`` (``tests/security/test_run_folder_trust.py``) reaches the CLI as it
    reaches a fresh child, although the server started with another."""
    import json

    old = os.umask(0o027)
    try:
        forked, fresh = _probe(cli, tmp_path, "exit")
    finally:
        os.umask(old)
    seen = {way: json.loads((tmp_path / f"{way}.json").read_text()) for way in ("forked", "fresh")}
    assert seen["forked"]["umask"] == seen["fresh"]["umask"] == 0o027


def test_what_the_servers_imports_read_from_the_environment_runs_a_fresh_process(cli: ForkedCLI,
                                                                               tmp_path: Path) -> None:
    """mmengine's yapf reads ``HOME`` and ``XDG_CONFIG_HOME`` when imported (where a yapf style
    file is): another value would leave the forked process with the server's, so it is not forked."""
    assert {"HOME", "XDG_CONFIG_HOME"} <= set(cli.read_at_import)
    before = cli.forked
    for key in ("HOME", "XDG_CONFIG_HOME"):
        env = {**os.environ, key: str(tmp_path / key), "ORCHESTRA_CACHE_DIR": str(tmp_path / "cache")}
        res = cli.run([sys.executable, "run.py", GOOD, "--dry-run", "-w", str(tmp_path / "w")], cwd=REPO, env=env,
                      timeout=120)
        assert res.returncode == 0 and "[infer]" in res.stdout, res.stderr
    assert cli.forked == before
    res = cli.run([sys.executable, "run.py", GOOD, "--dry-run", "-w", str(tmp_path / "w")], cwd=REPO,
                  env={**os.environ, "ORCHESTRA_CACHE_DIR": str(tmp_path / "cache")}, timeout=120)
    assert res.returncode == 0 and cli.forked == before + 1  # a variable nothing read at import: forked


def test_a_changed_resource_limit_runs_a_fresh_process(cli: ForkedCLI, tmp_path: Path) -> None:
    """A child inherits this process's resource limits; the server has those of its start."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_CORE)
    before = cli.forked
    resource.setrlimit(resource.RLIMIT_CORE, (0 if soft != 0 else 1, hard))
    try:
        argv = [sys.executable, "run.py", GOOD, "--dry-run", "-w", str(tmp_path / "w")]
        env = {**os.environ, "ORCHESTRA_CACHE_DIR": str(tmp_path / "cache")}
        res = cli.run(argv, cwd=REPO, env=env, timeout=120)
        assert cli.why_fresh(argv, str(REPO), env).startswith("resource limits, signals, process group or session")
    finally:
        resource.setrlimit(resource.RLIMIT_CORE, (soft, hard))
    assert res.returncode == 0 and cli.forked == before


def test_run_cli_goes_through_this_processs_fork_server(cli: ForkedCLI, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """``tests.helpers.run_cli`` forks from the same server as the ``cli`` fixture, except in the
    tests of ``tests.helpers.FRESH``, whose CLI is a fresh process."""
    from tests import cli_fork
    from tests.helpers import FRESH, run_cli

    assert cli is cli_fork.shared()
    before = cli.forked
    res = run_cli(GOOD, "--dry-run", "-w", tmp_path / "w")
    assert res.returncode == 0 and "[infer]" in res.stdout, res.stderr
    assert cli.forked == before + 1
    for prefix in FRESH:
        monkeypatch.setenv("PYTEST_CURRENT_TEST", f"{prefix}test_x.py::test_y (call)")
        res = run_cli(GOOD, "--dry-run", "-w", tmp_path / "w")
        assert res.returncode == 0 and "[infer]" in res.stdout, res.stderr
    assert cli.forked == before + 1
