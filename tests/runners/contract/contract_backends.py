"""Every backend the conformance suite runs, as one harness each: how to build its runner, what of
a run it may still have running, and how to inflict the loss of a job's infrastructure on it.

The tasks are shell scripts (a runner ``template`` that ignores the task's own command), chosen by
the task id: ``ok*`` exits 0, ``exit3*`` exits 3, ``hang*`` sleeps, ``gate*`` waits for the file
``gate`` in the marker folder, ``flaky*`` hangs in its first attempt and exits 0 in later ones.  Every run of a
task appends its pid to ``<markers>/<task id>``, so the suite can tell what ran, how often, and
whether anything of it still runs, on any backend whose jobs run on this machine (all of them here:
the Slurm cluster, the DLC double's "containers" and the example are local processes).
"""

from __future__ import annotations

import importlib.util
import shlex
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from helpers import alive

RUNNERS = Path(__file__).resolve().parents[1]
REPO = RUNNERS.parents[1]


def load(name: str, path: Path) -> ModuleType:
    """A helper module of another suite, by path (each suite's helpers assume their own folder)."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # a dataclass of the module looks itself up there
    spec.loader.exec_module(module)
    return module


slurm_conftest = load("contract_slurm_conftest", RUNNERS / "slurm" / "conftest.py")
dlc_helpers = load("contract_dlc_helpers", RUNNERS / "dlc" / "dlc_helpers.py")


def script(markers: Path) -> str:
    """The task every backend runs (``$1``: the task id)."""
    m = shlex.quote(str(markers))
    return (f'echo $$ >> {m}/"$1"\n'
            'case "$1" in\n'
            '  exit3*) exit 3 ;;\n'
            '  hang*) exec sleep 300 ;;\n'
            f'  gate*) while [ ! -e {m}/gate ]; do sleep 0.1; done; exit 0 ;;\n'
            '  flaky*) [ "$ORCHESTRA_ATTEMPT" != 1 ] && exit 0; exec sleep 300 ;;\n'
            'esac\n')


def pids(markers: Path, task_id: str) -> list[int]:
    """The pids of every run of ``task_id`` so far, oldest first."""
    path = markers / task_id
    return [int(line) for line in path.read_text().split()] if path.exists() else []


def running(markers: Path) -> list[int]:
    """The pids of task runs that still run."""
    return [pid for p in markers.iterdir() if p.name != "gate" for pid in pids(markers, p.name) if alive(pid)]


@dataclass
class Backend:
    """One backend under the suite.

    Attributes:
        name: the parameter's id.
        type: the runner class's dotted path (the orchestrator process of the SIGKILL scenario
            builds it from there).
        options: the runner's own keyword arguments.
        leftovers: what the backend's platform still runs of this test (Slurm jobs, DLC jobs),
            beside the task processes the markers name.
        infra_options, infra_before, infra_after: the infrastructure-loss scenario's runner
            options, what is done before its launch, and what is done during it (with the marker
            folder and the run's event log) to the ``flaky`` task's first attempt.
        infra_inflicted: False where the platform's own losses cannot be inflicted on the test
            cluster (srun: a preemption, a node failure); the scenario then kills the job's process
            from outside, which the backend must report as its task's failure, named.
        teardown: what to undo after the test.
        template: the task is the shell script, as the runner's template; False: the runner
            has no template (warm workers), the task's ``model`` does what the script does.
        model: the model config of a task (its id, the marker folder).
        killed_options: options of the runner of the orchestrator process that the SIGKILL
            scenario kills (and of the one after it).
        platform: the backend's platform holds jobs (``leftovers`` shows them while they run).
        adopts: a later orchestrator adopts the jobs a killed one left (False: it stops them, or
            they died with their orchestrator, and it starts them again).
    """

    name: str
    type: str
    options: dict[str, Any]
    leftovers: Callable[[], list[str]] = lambda: []
    infra_options: dict[str, Any] = field(default_factory=dict)
    infra_before: Callable[[], None] | None = None
    infra_after: Callable[[Path, Path], None] | None = None
    infra_inflicted: bool = True
    teardown: list[Callable[[], None]] = field(default_factory=list)
    template: bool = True
    adopts: bool = False
    platform: bool = False
    killed_options: dict[str, Any] = field(default_factory=dict)
    model: Callable[[Path, str], dict[str, Any]] = lambda markers, task_id: {"abbr": "m"}

    def runner(self, markers: Path, **loop: Any) -> Any:
        cls = load_class(self.type)
        return cls(**self.kwargs(markers, **loop))

    def kwargs(self, markers: Path, **loop: Any) -> dict[str, Any]:
        if not self.template:
            return {**self.options, **loop}
        template = ["bash", "-c", script(markers), "task", "{task_id}", "{task_cmd}"]
        return {**self.options, "template": template, **loop}


def load_class(dotted: str) -> Any:
    from orchestra.registry import import_dotted

    return import_dotted(dotted)


def kill_first_run(markers: Path, events: Path) -> None:
    """A job's process killed from outside (the OOM killer, a machine going away)."""
    import os
    import signal

    from helpers import wait_for

    (pid,) = wait_for(lambda: pids(markers, "flaky0"), 60, "the flaky task's first run")
    os.kill(pid, signal.SIGKILL)


def scontrol(*args: str) -> None:
    subprocess.run(["scontrol", *args], check=True, capture_output=True, text=True, timeout=30)


def slurm_backend(name: str, launcher: str, cluster: Any, tmp_path: Path) -> Backend:
    """SlurmRunner on the real local cluster.  Infrastructure loss: the cluster refuses the job
    (a partition of this test alone, drained) until the attempt ends as the platform's failure,
    then takes it (the partition set up again)."""
    options = {"launcher": launcher, "partition": cluster.default_partition,
               "poll_interval_s": 0.2, "infra_retry": 3, "retry_backoff_s": 0.5}
    from orchestra.runners.core.naming import run_tag

    prefix = f"orc-{run_tag(str(tmp_path / 'run'))}-"  # the suite's run folder: every job's name starts so

    def leftovers() -> list[str]:
        out = subprocess.run(["squeue", "-h", "-o", "%i|%j"], capture_output=True, text=True, timeout=30).stdout
        return [line for line in out.splitlines() if line.partition("|")[2].startswith(prefix)]

    backend = Backend(name, "orchestra.runners.slurm.runner.SlurmRunner", options, leftovers,
                      adopts=launcher == "sbatch", platform=True)
    if launcher == "sbatch":
        partition = f"orc_contract_{uuid.uuid4().hex[:8]}"
        backend.infra_options = {"partition": partition, "submit_wait_s": 1}

        def drain() -> None:
            scontrol("create", f"PartitionName={partition}", "Nodes=localhost", "State=DRAIN", "MaxTime=10")
            backend.teardown.append(drop)

        def take_it_again(markers: Path, events: Path) -> None:
            from helpers import wait_for

            from orchestra.events import read_events

            wait_for(lambda: [e for e in read_events(str(events)) if e["event"] == "retry" and e.get("infra")], 60,
                     "the refusal's infrastructure exit")
            scontrol("update", f"PartitionName={partition}", "State=UP")

        def drop() -> None:
            subprocess.run(["scancel", f"--partition={partition}"], capture_output=True, timeout=30, check=False)
            scontrol("delete", f"PartitionName={partition}")

        backend.infra_before, backend.infra_after = drain, take_it_again
    else:
        backend.infra_after, backend.infra_inflicted = kill_first_run, False
    return backend


def dlc_backend(double: Any, tmp_path: Path) -> Backend:
    """DLCRunner against the DLC double.  Infrastructure loss: the flaky task's first job is
    preempted by the platform (``PodPreempted``)."""
    import json

    aliyun = tmp_path / "aliyun.json"
    aliyun.write_text(json.dumps(dlc_helpers.aliyun_cfg(tmp_path)))
    options = {"aliyun_cfg": str(aliyun), "max_num_workers": 8, "infra_retry": 3, **dlc_helpers.FAST}

    def preempt_first() -> None:
        double.faults(rules=[{"match": "flaky0", "times": 1, "preempt_after_s": 1.0, "reason_code": "PodPreempted"}])

    return Backend("dlc", "orchestra.runners.dlc.runner.DLCRunner", options, double.alive, infra_before=preempt_first,
                   adopts=True, platform=True)


def local_backends() -> Iterator[Backend]:
    yield Backend("local", "orchestra.runners.local.runner.LocalRunner",
                  {"gpus": [], "kill_grace_s": 1.0}, infra_after=kill_first_run)
    yield Backend("example", "examples.subprocess_runner.SubprocessRunner",
                  {"kill_grace_s": 1.0, "poll_interval_s": 0.05}, infra_after=kill_first_run)


def ray_backend(cluster: Any) -> Backend:
    """RayRunner on a real local Ray cluster: this process a driver of its own (the GCS address);
    the orchestrator that the SIGKILL scenario kills through Ray Client (``ray://``: its actors
    outlive it for the client's reconnect grace, as on a cluster one reaches from outside).
    Infrastructure loss: the flaky task's model SIGKILLs its actor in the first attempt
    (``contract_model.ScriptModel``)."""

    def model(markers: Path, task_id: str) -> dict[str, Any]:
        return {"type": "tests.runners.contract.contract_model.ScriptModel", "abbr": "m", "script": task_id,
                "markers": str(markers)}

    return Backend("ray", "orchestra.runners.ray.runner.RayRunner",
                   {"address": cluster.address, "retry_backoff_s": 0.1, "max_num_workers": 3},
                   lambda: [a.get("actor_id", str(a)) for a in cluster.live_actors()], template=False, model=model,
                   platform=True, killed_options={"address": cluster.client_address})
