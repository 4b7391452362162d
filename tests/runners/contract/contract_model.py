"""The conformance suite's task for a backend that runs tasks in warm workers (RayRunner's actors),
where a runner template cannot stand in for the task: a model whose ``load`` does what the task
id says, as ``contract_backends.script`` does in a shell (imported by its dotted path,
``tests.runners.contract.contract_model.ScriptModel``, from the repository on ``PYTHONPATH``)."""

from __future__ import annotations

import os
import signal
import time

from orchestra.models.fake import DeterministicModel


class ScriptModel(DeterministicModel):
    """The deterministic model; ``load`` records this process's pid in ``markers/<script>``, then:
    ``exit3*`` fails, ``hang*`` sleeps, ``gate*`` waits for ``markers/gate``, ``flaky*`` SIGKILLs its
    own worker in the first attempt (a worker lost under its task)."""

    def __init__(self, abbr: str, script: str = "", markers: str = "", **kwargs: object) -> None:
        super().__init__(abbr, **kwargs)  # type: ignore[arg-type]
        self.script, self.markers = script, markers

    def load(self) -> None:
        with open(os.path.join(self.markers, self.script), "a") as f:
            f.write(f"{os.getpid()}\n")
        if self.script.startswith("exit3"):
            raise RuntimeError("the task failed (exit3)")
        if self.script.startswith("hang"):
            time.sleep(300)
        while self.script.startswith("gate") and not os.path.exists(os.path.join(self.markers, "gate")):
            time.sleep(0.1)
        if self.script.startswith("flaky") and os.environ.get("ORCHESTRA_ATTEMPT") == "1":
            os.kill(os.getpid(), signal.SIGKILL)
