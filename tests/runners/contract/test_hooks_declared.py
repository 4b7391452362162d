"""The runner contract is declared, not probed: every hook callers use has a declaration with a
default on ``RunnerHooks`` / ``Session`` / ``Resources``, and no module looks one up by name."""

from __future__ import annotations

import re

from helpers import REPO

from orchestra.runners import DLCRunner, LocalRunner, RayRunner, SlurmRunner
from orchestra.runners.core.contract import NoResources, Resources
from orchestra.runners.core.hooks import RunnerHooks

#: the hooks the stages, the API, serving and the loop call that used to be looked up with getattr
HOOKS = ("gpus", "preflight", "serve_placement", "serves_locally", "serves_nowhere", "ended",
         "outlives_orchestrator", "reports_infra_loss", "carries_exit_codes")


def test_no_module_looks_a_hook_up_by_name() -> None:
    probe = re.compile(r"\b(?:getattr|hasattr)\([^)]*[\"'](" + "|".join(HOOKS) + r")[\"']")
    found = [f"{path.relative_to(REPO)}:{n}: {line.strip()}"
             for path in (REPO / "orchestra").rglob("*.py")
             for n, line in enumerate(path.read_text().splitlines(), 1) if probe.search(line)]
    assert found == []


def test_each_hook_has_its_default() -> None:
    class Bare(RunnerHooks):
        def open(self, ctx, tasks):  # type: ignore[no-untyped-def]  # the one hook a backend must write
            raise NotImplementedError

    bare = Bare()
    assert (bare.gpus, bare.preflight(), bare.serve_placement(), bare.serves_locally, bare.serves_nowhere) == \
        (None, None, None, False, "")
    assert (bare.outlives_orchestrator, bare.reports_infra_loss, bare.carries_exit_codes) == (False, False, True)
    assert bare.settle_left(None, "infer") is None  # type: ignore[arg-type]
    assert (Resources().unfit(None), Resources().acquire(None), Resources().ended("t")) == (None, {}, None)  # type: ignore[arg-type]
    assert NoResources("why").unfit(None) == "why"  # type: ignore[arg-type]


def test_every_backend_declares_its_capabilities() -> None:
    declared = {cls.__name__: (cls.outlives_orchestrator, cls.reports_infra_loss, cls.carries_exit_codes)
                for cls in (LocalRunner, SlurmRunner, DLCRunner, RayRunner)}
    assert declared == {"LocalRunner": (False, False, True), "SlurmRunner": (False, True, True),
                        "DLCRunner": (True, True, True), "RayRunner": (True, True, False)}
    assert SlurmRunner(launcher="sbatch").outlives_orchestrator and not SlurmRunner().outlives_orchestrator
    assert not LocalRunner(gpus=[], reuse_workers=True).carries_exit_codes
