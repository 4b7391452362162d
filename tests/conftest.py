"""Fixtures shared by the whole test tree."""

from __future__ import annotations

import importlib.util
import json
import os
import resource
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

_LOADER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "servers", "loader.py")

# One OpenMP thread in every process the tests start (lm_eval's reference runs, run.py and its
# task workers, the torch in this process): the suite runs several pytest-xdist workers on a
# 2-core machine, and a torch that takes every core in each of them spin-waits for cores the others
# hold (libgomp spins before it sleeps).  lm-eval's reference runs and orchestra's tasks then
# compute with the same thread count (LocalRunner keeps a user's OMP_NUM_THREADS), as the
# comparisons to 4 decimals want.  Set before torch is imported anywhere; a test of the thread
# settings themselves sets or removes it with monkeypatch.  docs/dev/testing.md has the numbers.
os.environ["OMP_NUM_THREADS"] = "1"

# the environment the CLI fork server starts with (``tests/cli_fork.py``): this one, before any test's
# monkeypatch; imported here, after the setting above, so that it takes this process's as it is now
from tests import cli_fork  # noqa: E402

# How pytest-xdist shares the tests out (tools/test.sh runs several workers): a unit of work is a
# test module, whose module fixtures are then built once, or one of these groups, whose tests run
# one after another on one worker because they share something machine-wide: the Slurm cluster
# and the Ray clusters (their CPUs, the jobs they list), and the sandbox (its tests look for any
# live process of the sandbox users' ids on the machine).  The controller that schedules sees test
# ids only, so the groups are named by path; collection checks that every test marked ``slurm``
# or ``ray`` lies in its group.
_GROUPS = {
    "slurm": ("tests/runners/slurm/", "tests/serving/test_slurm_replicas.py", "tests/serving/test_cluster_hostile.py",
              "tests/serving/test_slurm_replica_submit.py", "tests/e2e/test_chaos_cluster.py"),
    "ray": ("tests/runners/ray/", "tests/serving/test_ray_replicas.py"),
    "sandbox": ("tests/sandbox/", "tests/evaluators/test_code_", "tests/tasks/test_eval_heavy.py",
                "tests/security/test_shared_folders.py"),
}
# modules whose parameters go to different groups: the parameter's id names the group
_PARAM_GROUPS = {"tests/runners/contract/": {"srun": "slurm", "sbatch": "slurm", "ray": "ray"}}


def work_unit(nodeid: str) -> str:
    """The unit of work a test belongs to: its group, or else its module."""
    path = nodeid.split("::", 1)[0]
    for prefix, by_param in _PARAM_GROUPS.items():
        if path.startswith(prefix) and nodeid.endswith("]"):
            param = nodeid[nodeid.rindex("[") + 1:-1]
            return by_param.get(param, path)
    return next((name for name, paths in _GROUPS.items() if path.startswith(paths)), path)


# What each unit took in a whole run (wall seconds of its tests' phases, written by
# ``--record-units``): the units that take longest are handed out first, so that the run does not end
# waiting on one long unit started last.  A unit the file does not know (a new module) counts as
# ``_UNKNOWN_CLUSTER_S`` when it is a cluster group (many tests, each minutes), ``_UNKNOWN_SLOW_S``
# when it has a slow test, else as 0.
# (ORCHESTRA_TEST_UNIT_SECONDS names another file: tests/test_work_units.py.)
UNIT_SECONDS = os.environ.get("ORCHESTRA_TEST_UNIT_SECONDS") or os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "unit_seconds.json")
_UNKNOWN_CLUSTER_S = 600.0
_UNKNOWN_SLOW_S = 30.0


def _recorded_seconds() -> dict[str, float]:
    try:
        with open(UNIT_SECONDS, encoding="utf-8") as f:
            return {str(unit): float(seconds) for unit, seconds in json.load(f).items()}
    except FileNotFoundError:
        return {}


def _guessed_seconds(item: pytest.Item) -> float:
    """What a unit the record does not know is taken to last, from this one of its tests."""
    if work_unit(item.nodeid) in ("slurm", "ray"):
        return _UNKNOWN_CLUSTER_S
    return _UNKNOWN_SLOW_S if item.get_closest_marker("slow") is not None else 0.0


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        for marker in ("slurm", "ray"):
            if item.get_closest_marker(marker) is not None and work_unit(item.nodeid) != marker:
                raise pytest.UsageError(f"{item.nodeid} is marked {marker!r} but its module is not in "
                                        f"tests/conftest.py's _GROUPS[{marker!r}]: add it there")
    recorded = _recorded_seconds()
    weight: dict[str, float] = {}
    for item in items:
        unit = work_unit(item.nodeid)
        weight[unit] = recorded[unit] if unit in recorded else max(weight.get(unit, 0.0), _guessed_seconds(item))
    first = {}  # each unit's tests together (tests/unit_end.py counts on it), in collection order within it
    for index, item in enumerate(items):
        first.setdefault(work_unit(item.nodeid), index)
    items.sort(key=lambda item: (-weight[work_unit(item.nodeid)], first[work_unit(item.nodeid)]))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """After the fixtures of a unit's last test here are torn down, end what the unit started."""
    result = yield
    unit = work_unit(item.nodeid)
    if nextitem is None or work_unit(nextitem.nodeid) != unit:
        from tests.unit_end import end_unit

        end_unit(unit)
    return result


@pytest.fixture(autouse=True)
def _breakpoint_hook_put_back() -> Iterator[None]:
    """``ray.init`` in this process (the runner contract's Ray backend is a driver here) sets
    ``PYTHONBREAKPOINT`` to Ray's debugger hook and leaves it: a variable the interpreter reads at
    start-up, so every later ``run_cli`` of this xdist worker ran a fresh process instead of a forked
    one, and ``tests/test_cli_fork.py`` failed when it ran on that worker after the contract's Ray
    tests.  Put back as it was before each test."""
    before = os.environ.get("PYTHONBREAKPOINT")
    yield
    if before is None:
        os.environ.pop("PYTHONBREAKPOINT", None)
    else:
        os.environ["PYTHONBREAKPOINT"] = before


class _WorkUnits:
    """xdist's scheduler, sharing out the units of :func:`work_unit` in collection order."""

    @pytest.hookimpl(tryfirst=True)
    def pytest_xdist_make_scheduler(self, config: pytest.Config, log: Any) -> Any:
        from xdist.scheduler import LoadScopeScheduling

        class Scheduling(LoadScopeScheduling):  # type: ignore[misc]
            def _split_scope(self, nodeid: str) -> str:
                return work_unit(nodeid)

        config.option.loadscopereorder = False  # keep the order pytest_collection_modifyitems chose
        return Scheduling(config, log)


def pytest_configure(config: pytest.Config) -> None:
    if config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(_WorkUnits(), "orchestra-work-units")


# --cpu-durations=N (tools/test.sh passes 30): the N test phases that took the most CPU, and the CPU of
# all of them.  A phase's CPU is user + system time of the pytest process and of the processes it
# waited for during the phase (run.py and its tasks, lm_eval): on a machine with few cores the
# suite is bound by CPU, and --durations' wall times do not say which tests spend it.  Processes
# nobody waits for (daemons, the Slurm and Ray clusters) are not counted.
_CPU_MARK = pytest.StashKey[float]()


def _cpu_s() -> float:
    """CPU seconds of this process and of the children it has waited for."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return (own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime
            + cli_fork.FORKED_CPU_S[0])  # CLI processes forked for this process (tests/cli_fork.py)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--cpu-durations", type=int, default=0, metavar="N",
                     help="show the N test phases that took the most CPU (this process and the processes it "
                          "waited for), and the CPU of all phases")
    parser.addoption("--record-units", metavar="PATH", default=None,
                     help="write the wall seconds each unit of work took (a module or a group; what "
                          "tests/unit_seconds.json holds, which orders the units) to PATH as JSON")


_unit_totals: dict[str, float] | None = None  # unit -> wall seconds, while recording


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Add a phase's wall time to its unit's, in the process that writes ``--record-units``."""
    if _unit_totals is not None:
        unit = work_unit(report.nodeid)
        _unit_totals[unit] = _unit_totals.get(unit, 0.0) + report.duration


@pytest.hookimpl(trylast=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    global _unit_totals
    if session.config.getoption("record_units") and not hasattr(session.config, "workerinput"):
        _unit_totals = {}  # the controller (or a run without xdist) gets every report


def pytest_sessionfinish(session: pytest.Session) -> None:
    cli_fork.stop_shared()  # this process's CLI fork server, if a test started it
    _write_recorded_units(session)


def _write_recorded_units(session: pytest.Session) -> None:
    """``--record-units``: each unit's seconds, longest first, written whole (never half a file)."""
    global _unit_totals
    totals, _unit_totals = _unit_totals, None
    path = session.config.getoption("record_units")
    if totals is None or not path:
        return
    ordered = dict(sorted(((unit, round(s, 2)) for unit, s in totals.items()), key=lambda kv: (-kv[1], kv[0])))
    partial = f"{path}.{os.getpid()}.part"
    with open(partial, "w", encoding="utf-8") as f:
        json.dump(ordered, f, indent=1)
        f.write("\n")
    os.replace(partial, path)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[Any]:
    item.stash[_CPU_MARK] = _cpu_s()
    return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[Any]:
    report = yield
    now = _cpu_s()
    report.cpu_s = now - item.stash.get(_CPU_MARK, now)  # an extra field of the report: xdist sends it over
    item.stash[_CPU_MARK] = now
    return report


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    count = config.getoption("cpu_durations")
    if not count:
        return
    phases = [r for reports in terminalreporter.stats.values() for r in reports
              if isinstance(getattr(r, "cpu_s", None), float) and hasattr(r, "when")]
    terminalreporter.write_sep("=", f"most CPU {count}")
    for report in sorted(phases, key=lambda r: r.cpu_s, reverse=True)[:count]:
        terminalreporter.write_line(f"{report.cpu_s:.2f}s cpu {report.when:<8} {report.nodeid}")
    terminalreporter.write_line(f"{sum(r.cpu_s for r in phases):.0f} s of CPU in {len(phases)} test phases")


def _server_module() -> Any:
    spec = importlib.util.spec_from_file_location("orchestra_test_server_loader", _LOADER)
    assert spec is not None and spec.loader is not None
    loader = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loader)
    return loader.load_server_module()


@pytest.fixture
def server() -> Iterator[Any]:
    """A real OpenAI-compatible server on 127.0.0.1 (its own thread and event loop)."""
    with _server_module().ServerThread() as srv:
        yield srv


@pytest.fixture(autouse=True)
def _lock_dir(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Host-wide connection slots of each test in its own folder: tests never share them."""
    monkeypatch.setenv("ORCHESTRA_LOCK_DIR", str(tmp_path / "locks"))


def _loader() -> Any:
    spec = importlib.util.spec_from_file_location("orchestra_test_server_loader", _LOADER)
    assert spec is not None and spec.loader is not None
    loader = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loader)
    return loader


@pytest.fixture
def batch_server() -> Iterator[Any]:
    """A double of OpenAI's Files + Batches API on 127.0.0.1 (tests/servers/openai_batch_server.py)."""
    with _loader().load_batch_server_module().BatchServerThread() as srv:
        yield srv


@pytest.fixture
def anthropic_server() -> Iterator[Any]:
    """A double of Anthropic's Messages + Message Batches API on 127.0.0.1 (tests/servers/anthropic_server.py)."""
    with _loader().load_anthropic_server_module().AnthropicServerThread() as srv:
        yield srv


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """A headless Chromium (``tests/report/chromium.py``) for the tests that open a page in it;
    a missing one fails the test with the command that installs it."""
    from tests.report.chromium import Chromium, ChromiumMissing

    try:
        chrome = Chromium()
    except ChromiumMissing as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        yield chrome
    finally:
        chrome.close()


@pytest.fixture(scope="session")
def cli() -> Any:
    """``cli.run([sys.executable, "run.py", ...], cwd=..., env=..., timeout=...)``: the CLI to its
    end as ``subprocess.run`` runs it, in a process forked from a server that has imported the
    third-party modules every CLI process imports (``tests/cli_fork.py``): one per xdist worker,
    the one ``tests.helpers.run_cli`` uses, stopped at the session's end."""
    return cli_fork.shared()


@pytest.fixture(scope="session")
def lmeval_stock_index(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder where lm-eval's reference runs (``tests/lmeval_reference.lm_eval_runs``) keep
    lm-eval's index of its stock tasks for the session: built by the first, read by the others."""
    base = tmp_path_factory.getbasetemp()
    return (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "lmeval_stock_index"


@pytest.fixture(scope="session")
def lmeval_index(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """lm-eval's stock task index, built once per session for all xdist workers;
    ``lmeval_index.seed(cache)`` makes a fresh ``ORCHESTRA_CACHE_DIR`` holding a copy of it
    (``tests/lmeval_seed.py``), for tests that run lm-eval tasks but do not test the index."""
    from tests.lmeval_seed import LmEvalIndex

    base = tmp_path_factory.getbasetemp()
    return LmEvalIndex(base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base)  # xdist: shared root
