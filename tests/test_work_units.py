"""How the suite's units of work are ordered and recorded (tests/conftest.py): the longest first,
by the seconds a whole run recorded; ``--record-units`` writes those seconds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MODULES = ["tests/test_ranges.py", "tests/test_keyvalues.py", "tests/test_registry.py"]


def _pytest(tmp_path: Path, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """A pytest of its own, whose temporary folders are under ``tmp_path``: by default (or with the
    caller's ``PYTEST_ADDOPTS=--basetemp=...``) it would share, and prune, the outer session's."""
    env = {k: v for k, v in env.items() if k != "PYTEST_ADDOPTS"}
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider",
                           f"--basetemp={tmp_path / 'basetemp'}", *args], cwd=REPO,
                          capture_output=True, text=True, env=env, timeout=120)


def _collected_modules(stdout: str) -> list[str]:
    order: list[str] = []
    for line in stdout.splitlines():
        module = line.split("::", 1)[0]
        if "::" in line and module not in order:
            order.append(module)
    return order


def test_units_are_collected_longest_first_by_the_recorded_seconds(tmp_path: Path) -> None:
    env = {**os.environ, "ORCHESTRA_TEST_UNIT_SECONDS": str(tmp_path / "units.json")}
    for seconds in ([1.0, 2.0, 3.0], [3.0, 1.0, 2.0]):
        (tmp_path / "units.json").write_text(json.dumps(dict(zip(MODULES, seconds))))
        proc = _pytest(tmp_path, "--collect-only", "-q", *MODULES, env=env)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        expected = [m for _, m in sorted(zip(seconds, MODULES), reverse=True)]
        assert _collected_modules(proc.stdout) == expected


def test_a_module_the_record_lacks_goes_after_the_recorded_ones_unless_slow(tmp_path: Path) -> None:
    (tmp_path / "units.json").write_text(json.dumps({MODULES[2]: 5.0}))
    env = {**os.environ, "ORCHESTRA_TEST_UNIT_SECONDS": str(tmp_path / "units.json")}
    proc = _pytest(tmp_path, "--collect-only", "-q", *MODULES, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert _collected_modules(proc.stdout) == [MODULES[2], MODULES[0], MODULES[1]]


def test_record_units_writes_each_unit_and_its_seconds(tmp_path: Path) -> None:
    out = tmp_path / "recorded.json"
    proc = _pytest(tmp_path, "-q", "-n", "2", f"--record-units={out}", *MODULES[:2], env=dict(os.environ))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    recorded = json.loads(out.read_text())
    assert sorted(recorded) == sorted(MODULES[:2])
    assert all(isinstance(s, float) and s > 0 for s in recorded.values()), recorded
    assert list(recorded.values()) == sorted(recorded.values(), reverse=True)
    assert not list(tmp_path.glob("*.part"))


def test_what_a_unit_started_ends_after_its_last_test_here_not_at_the_sessions_end() -> None:
    from types import SimpleNamespace

    from tests.conftest import pytest_runtest_teardown
    from tests.unit_end import at_unit_end

    stopped: list[str] = []
    at_unit_end("ray", lambda: stopped.append("cluster"))
    at_unit_end("ray", lambda: stopped.append("node"))
    ray = [SimpleNamespace(nodeid=f"tests/runners/ray/test_a.py::test_{i}") for i in range(2)]
    replicas = SimpleNamespace(nodeid="tests/serving/test_ray_replicas.py::test_r")  # the same group
    other = SimpleNamespace(nodeid="tests/test_ranges.py::test_x")

    def teardown(item: object, nextitem: object) -> None:
        hook = pytest_runtest_teardown(item, nextitem)  # type: ignore[arg-type]
        next(hook)
        try:
            hook.send(None)
        except StopIteration:
            pass

    teardown(ray[0], ray[1])
    teardown(ray[1], replicas)
    assert stopped == []
    teardown(replicas, other)
    assert stopped == ["node", "cluster"]  # the last registered first
    teardown(other, None)
    assert stopped == ["node", "cluster"]  # once
