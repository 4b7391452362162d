"""The DLC double's state as tests see it, and configs that run through ``DLCRunner``."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from helpers import events, jsonl, predictions, run_dirs, summary_rows  # noqa: F401 - the suite's names
from helpers import run_cli as _run_cli
from helpers import start_cli as _start_cli

REPO = Path(__file__).resolve().parents[3]
BIN = Path(__file__).resolve().parent / "bin"
DLC = BIN / "dlc"
TERMINAL = {"Succeeded", "Failed", "Stopped", "SucceededReserving", "FailedReserving"}
#: the venv (or interpreter prefix) that the double's "containers" use through python_env_path
PYTHON_ENV = str(Path(sys.executable).parent.parent)
FAST = dict(poll_interval_s=0.1, max_poll_interval_s=0.5, log_settle_s=0.5, retry_backoff_s=0.1, max_calls_per_s=200)


class Double:
    """The double's cloud: a folder of jobs, the calls made, and the faults to inject."""

    def __init__(self, state: Path) -> None:
        self.state = state
        (state / "jobs").mkdir(parents=True, exist_ok=True)

    def faults(self, **faults: Any) -> None:
        (self.state / "faults.json").write_text(json.dumps(faults))

    def calls(self, verb: str | None = None) -> list[dict[str, Any]]:
        path = self.state / "calls.jsonl"
        if not path.exists():
            return []
        out = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        return [c for c in out if verb is None or c["verb"].startswith(verb)]

    def counter(self, key: str) -> int:
        """The double's count of ``key`` (``get``: its ``dlc get`` calls), read under the lock the
        double writes it with (a read between its truncate and its write would see nothing)."""
        path = self.state / "counters" / key
        if not path.exists():
            return 0
        with open(path, encoding="utf-8") as f:
            fcntl.flock(f, fcntl.LOCK_SH)
            return int(f.read().strip() or 0)

    def job_ids(self) -> list[str]:
        return sorted(p.name for p in (self.state / "jobs").iterdir() if (p / "status.json").exists())

    def status(self, job_id: str) -> dict[str, Any]:
        return json.loads((self.state / "jobs" / job_id / "status.json").read_text())

    def spec(self, job_id: str) -> dict[str, Any]:
        return json.loads((self.state / "jobs" / job_id / "spec.json").read_text())

    def jobs(self) -> dict[str, dict[str, Any]]:
        """``{job id: status document}`` of every job ever submitted."""
        return {j: self.status(j) for j in self.job_ids()}

    def alive(self) -> list[str]:
        return [j for j, doc in self.jobs().items() if doc["Status"] not in TERMINAL]

    def names(self) -> dict[str, str]:
        return {j: self.spec(j)["flags"]["name"] for j in self.job_ids()}

    def wait_for(self, predicate: Any, timeout_s: float, what: str) -> Any:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            value = predicate()
            if value:
                return value
            time.sleep(0.05)
        raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")

    def kill_all(self) -> None:
        """End every driver and job process of this cloud that still runs (test clean-up only).

        The files hold the numbers of processes that may have ended long ago, and the kernel hands
        a number out again (pid_max is 32768 on these machines, and a whole run of the suite starts
        more processes than that): a number is signalled only while it still names the process the
        file was written for (:func:`_still_recorded`), never another test's process."""
        for folder in (self.state / "jobs").iterdir():
            for name in ("task.pgid", "driver.pid"):
                path = folder / name
                try:
                    number = int(path.read_text())
                    if _still_recorded(number, path):
                        os.killpg(number, signal.SIGKILL) if name == "task.pgid" else os.kill(number, signal.SIGKILL)
                except (FileNotFoundError, ProcessLookupError, ValueError, PermissionError):
                    pass


def _still_recorded(number: int, path: Path) -> bool:
    """Whether the process ``number`` (a pid, or a process group's number: its leader's pid) is
    the one ``path`` was written for: it started before the file was written.  A process that
    got the number later started after it.  With no such process, a group may still live on in
    its leader's children: the kernel gives no process a number some group still has, so those
    are the recorded group's."""
    from orchestra.serving.replica import start_time

    ticks = start_time(number)
    if ticks is None:
        return True
    with open("/proc/stat", encoding="ascii") as f:
        boot = next(int(line.split()[1]) for line in f if line.startswith("btime "))
    started = boot + ticks / os.sysconf("SC_CLK_TCK")  # to within a second: btime is whole seconds
    return started <= path.stat().st_mtime + 2.0


def aliyun_cfg(folder: Path, **extra: Any) -> dict[str, Any]:
    """An aliyun_cfg for the double: a dlc config file that exists, the venv as python_env_path."""
    config = folder / "dlc config.ini"  # a space: the path must survive as one argument
    config.write_text("[default]\nregion=cn-test\n")
    return {"workspace_id": "ws1", "resource_id": "quota1", "worker_image": "registry/img:1",
            "python_env_path": PYTHON_ENV, "dlc_config_path": str(config), "data_sources": ["d-shared"],
            "extra_envs": ["ORC_TEST_ENV=from aliyun_cfg"], **extra}


def write_aliyun_file(folder: Path, **extra: Any) -> Path:
    """The same as a Python-style aliyun config file, as ``--aliyun-cfg`` takes it."""
    path = folder / "aliyun.cfg"
    path.write_text("".join(f"{k} = {v!r}\n" for k, v in aliyun_cfg(folder, **extra).items()))
    return path


def env_with_double(state: Path) -> dict[str, str]:
    return {**os.environ, "FAKE_DLC_STATE": str(state), "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
















def run_cli(state: Path, *args: str | Path, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return _run_cli(*args, timeout=timeout, env=env_with_double(state))


def start_cli(state: Path, *args: str | Path) -> subprocess.Popen[str]:
    return _start_cli(*args, env=env_with_double(state))


def ledger(run: Path) -> list[dict[str, Any]]:
    return jsonl(run / "dlc" / "jobs.jsonl")


def write_config(folder: Path, runner: str, *, model: str = "", tasks: int = 3, work_dir: Path | None = None,
                 gpus: int = 0) -> Path:
    """A deterministic model on one dataset of ``tasks`` rows, one task per row (``NumWorkerPartitioner``).

    ``runner`` is the runner dict's source without ``task=``.  The aliyun config is
    ``folder / 'aliyun.json'`` (written by the caller or here with defaults).
    """
    data = folder / "rows.jsonl"
    if not data.exists():
        with open(data, "w") as f:
            for i in range(max(tasks, 1)):
                f.write(json.dumps({"question": f"What is {i} + 2?", "answer": str(i + 2)}) + "\n")
    aliyun = folder / "aliyun.json"
    if not aliyun.exists():
        aliyun.write_text(json.dumps(aliyun_cfg(folder)))
    run_cfg = f", run_cfg=dict(num_gpus={gpus})" if gpus else ""
    cfg = folder / "cfg.py"
    cfg.write_text(f"""
from orchestra.datasets import JsonlDataset
from orchestra.models import DeterministicModel
from orchestra.partitioners import NaivePartitioner, NumWorkerPartitioner
from orchestra.runners import DLCRunner, LocalRunner
from orchestra.tasks import EvalTask, InferTask

models = [dict(type=DeterministicModel, abbr='det', batch_size=4{model}{run_cfg})]
datasets = [dict(type=JsonlDataset, abbr='rows', path={str(data)!r},
                 reader_cfg=dict(input_columns=['question'], output_column='answer'),
                 infer_cfg=dict(prompt_template='{{question}}', inferencer=dict(type='gen', max_out_len=8)),
                 eval_cfg=dict(evaluator='numeric_match'))]
infer = dict(partitioner=dict(type=NumWorkerPartitioner, num_worker={tasks}),
             runner=dict({runner}, task=dict(type=InferTask)))
eval = dict(partitioner=dict(type=NaivePartitioner), runner=dict({runner}, task=dict(type=EvalTask)))
work_dir = {str(work_dir or folder / 'out')!r}
""")
    return cfg


def dlc_runner(folder: Path, **options: Any) -> str:
    """The source of a DLCRunner dict for the double: fast timings, ``options`` on top."""
    opts = {"aliyun_cfg": str(folder / "aliyun.json"), "max_num_workers": 8, **FAST, **options}
    return "type=DLCRunner, " + ", ".join(f"{k}={v!r}" for k, v in opts.items())
