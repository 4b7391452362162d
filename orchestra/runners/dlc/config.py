"""``aliyun_cfg``: what every DLC job of a ``DLCRunner`` asks for, and the shell command it runs.

The keys are OpenCompass's (a user's ``~/.aliyun.cfg`` works unchanged); each is checked here and a
wrong one is a one-line error listing the valid ones.  The container does not inherit the
orchestrator's environment or working directory, so :func:`container_command` sets everything a
task needs in the one shell string DLC runs: the Python environment (bashrc + conda, or
``python_env_path``), offline flags, caches, proxy, ``extra_envs``, the task's own variables,
``PYTHONPATH`` and the working directory.  Every value is quoted (``shlex.quote``); in
``extra_envs`` values, ``$NAME`` and ``${NAME}`` still refer to the container's variables.
That string is in the ``dlc submit`` argv, the task logs and the run's config.py, so a secret
never goes there: ``extra_envs`` refuses secret-looking names (``orchestra.secretnames``), and
``DLCRunner(forward_env=[...])`` passes variables by name through a private file
(``orchestra.envfile``) that the command sources.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import Any, Literal

from orchestra import envfile
from orchestra.errors import check_known_keys
from orchestra.keyvalues import read_key_values
from orchestra.runners.core import shell
from orchestra.secretnames import secret_assignment

REQUIRED = ("workspace_id", "resource_id", "worker_image")
HF_OFFLINE_VARS = ("HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_EVALUATE_OFFLINE", "HF_HUB_OFFLINE")
FOOTER = "===== orchestra: task exited with code "
#: what a key of each type accepts (None too, the key's default, except where it is an integer) and how an
#: error says so; ``dlc_job_cmd``, ``data_sources`` and ``extra_envs`` are checked on their own, ``umask``'s digits too
ACCEPTS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "str": (lambda x: x is None or isinstance(x, str) and bool(x.strip()), "a non-empty string"),
    "int": (lambda x: isinstance(x, int) and not isinstance(x, bool) and x >= 1, "an integer >= 1"),
    "bool": (lambda x: x is None or isinstance(x, bool), "True or False"),
    "float": (lambda x: x is None or isinstance(x, (int, float)) and not isinstance(x, bool) and x > 0,
              "seconds > 0"),
}
#: the container's variables that an ``aliyun_cfg`` key sets to its value
EXPORTED = {
    "huggingface_cache": ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"),
    "torch_cache": ("TORCH_HOME",),
    "http_proxy": ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY"),
    "hf_endpoint": ("HF_ENDPOINT",),
}


@dataclass(frozen=True)
class AliyunConfig:
    """One runner's ``aliyun_cfg`` (see docs/dlc.md for each key)."""

    workspace_id: str
    resource_id: str
    worker_image: str
    dlc_config_path: str | None = None
    data_sources: tuple[str, ...] = ()
    priority: int = 1
    worker_cpu: int = 12  # at least; a GPU task gets 8 per GPU if that is more
    worker_memory: int = 192  # GiB at least; a GPU task gets 128 per GPU if that is more
    preemptible: bool | None = None  # --enable_priority_preemption (None: the service's default)
    dlc_job_cmd: Literal["submit", "create"] = "submit"  # 'create': older clients' dlc create job
    bashrc_path: str | None = None
    conda_env_name: str | None = None
    python_env_path: str | None = None
    hf_offline: bool = True
    huggingface_cache: str | None = None
    torch_cache: str | None = None
    hf_endpoint: str | None = None
    http_proxy: str | None = None
    extra_envs: tuple[str, ...] = ()
    pre_cmd: str | None = None
    umask: str = "0000"
    dlc_sleep_time: float | None = None  # OpenCompass's poll interval: poll_interval_s unless that is set

    @classmethod
    def create(cls, raw: Any) -> AliyunConfig:
        """Check ``raw`` (a dict); ``ValueError`` (one line) names the first problem."""
        if not isinstance(raw, dict):
            raise ValueError(f"aliyun_cfg must be a dict (or the path of an aliyun config file), got {raw!r}")
        valid = [f.name for f in fields(cls)]
        check_known_keys(raw, valid, "aliyun_cfg", error=ValueError)
        missing = [k for k in REQUIRED if raw.get(k) in (None, "")]
        if missing:
            raise ValueError(f"aliyun_cfg: missing required key {missing[0]!r} (required: {', '.join(REQUIRED)})")
        v = dict(raw)
        for key in ("workspace_id", "resource_id"):  # ids may be given as numbers
            if isinstance(v[key], int) and not isinstance(v[key], bool):
                v[key] = str(v[key])
        v["umask"] = str(v.get("umask", "0000"))  # '0022', or 22 (the shell reads it as octal)
        for f in fields(cls):
            accepts, expected = ACCEPTS.get(str(f.type).removesuffix(" | None"), (None, ""))
            if f.name in v and accepts is not None and not accepts(v[f.name]):
                raise ValueError(f"aliyun_cfg.{f.name}: expected {expected}, got {v[f.name]!r}")
        if v.get("dlc_job_cmd", "submit") not in ("submit", "create"):
            raise ValueError(f"aliyun_cfg.dlc_job_cmd: expected 'submit' (dlc submit pytorchjob) or 'create' "
                             f"(older clients: dlc create job --kind PyTorchJob), got {v['dlc_job_cmd']!r}")
        if bool(v.get("bashrc_path")) != bool(v.get("conda_env_name")):
            raise ValueError("aliyun_cfg: bashrc_path and conda_env_name go together (the bashrc sets up conda, "
                             "then the env is activated); or give python_env_path")
        sources = v.get("data_sources") or ()
        if isinstance(sources, str):
            sources = [s.strip() for s in sources.split(",") if s.strip()]
        if not isinstance(sources, (list, tuple)) or not all(isinstance(s, str) and s and "," not in s
                                                             for s in sources):
            raise ValueError(f"aliyun_cfg.data_sources: expected a list of data source ids, got {sources!r}")
        v["data_sources"] = tuple(sources)
        envs = v.get("extra_envs") or ()
        if isinstance(envs, str) or not isinstance(envs, (list, tuple)):
            raise ValueError(f"aliyun_cfg.extra_envs: expected a list of 'NAME=value' strings, got {envs!r}")
        for item in envs:
            name, eq, _ = item.partition("=") if isinstance(item, str) else ("", "", "")
            if not eq or not shell.ENV_NAME.fullmatch(name):
                raise ValueError(f"aliyun_cfg.extra_envs: {item!r} is not 'NAME=value' (NAME a shell variable name)")
            if secret_assignment(name, item.partition("=")[2]):  # the value is never repeated in the message
                raise ValueError(f"aliyun_cfg.extra_envs: {name} looks like a secret, and extra_envs values end up "
                                 "in the dlc submit argv, config.py and every task log; pass it by name: set "
                                 f"{name} in the orchestrator's environment and give DLCRunner(forward_env="
                                 f"[{name!r}]) (docs/dlc.md)")
        v["extra_envs"] = tuple(envs)
        if not re.fullmatch(r"0?[0-7]{3}", v["umask"].zfill(4)):
            raise ValueError(f"aliyun_cfg.umask: expected an octal mask such as '0022', got {v['umask']!r}")
        return cls(**v)

    def worker_resources(self, num_gpus: int) -> tuple[int, int, int]:
        """``(gpus, cpus, memory GiB)`` of a task's worker: OpenCompass's scaling (8 cores and
        128 GiB per GPU, at least ``worker_cpu`` and ``worker_memory``)."""
        return num_gpus, max(num_gpus * 8, self.worker_cpu), max(num_gpus * 128, self.worker_memory)

    def python(self) -> str:
        """The interpreter that runs tasks in the container."""
        return os.path.join(self.python_env_path, "bin", "python") if self.python_env_path else "python"


def code_root() -> str | None:
    """The folder holding this ``orchestra`` package, for the container's ``PYTHONPATH`` (None when
    it is installed in a site-packages folder: the container's Python must then have it too)."""
    root = os.path.abspath(__file__)
    for _ in __name__.split("."):  # orchestra/runners/dlc/config.py: four levels up, wherever this module moves
        root = os.path.dirname(root)
    return None if os.path.basename(root) in ("site-packages", "dist-packages") else root


def container_command(cfg: AliyunConfig, argv: Sequence[str], env: dict[str, str], cwd: str, exit_file: str,
                      name: str, env_file: str | None = None) -> str:
    """The shell command a DLC job runs: set up, run ``argv``, record its exit code, exit with it.

    ``env_file`` (on the shared file system) holds the variables of ``forward_env``: the command
    sources it by path, so their values are never in the command itself.

    The task's exit code is printed as the log's last line (``FOOTER``) and written to
    ``exit_file`` (on the shared file system), so the runner can tell a task that failed from a
    job the platform ended before the task did.
    """
    q = shlex.quote
    lines = []
    if cfg.pre_cmd:
        lines.append(cfg.pre_cmd.strip().rstrip(";"))  # the user's own shell, as in OpenCompass
    if cfg.bashrc_path:
        lines.append(f". {q(cfg.bashrc_path)}; conda activate {q(cfg.conda_env_name or '')}")
    if cfg.python_env_path:
        lines.append(f'export PATH={q(os.path.join(cfg.python_env_path, "bin"))}:"$PATH"')
    exports = [(k, "1") for k in HF_OFFLINE_VARS] if cfg.hf_offline else []
    for key, names in EXPORTED.items():
        if value := getattr(cfg, key):
            exports += [(name, value) for name in names]
    lines += [f"export {k}={q(v)}" for k, v in exports]
    lines += shell.exports(env)
    for item in cfg.extra_envs:
        key, _, value = item.partition("=")
        lines.append(f"export {key}={shell.shell_value(value)}")
    if env_file:
        lines += envfile.source_lines(env_file, "forward_env; the orchestrator deletes it when it stops")
    root = code_root()
    path = ":".join(q(p) for p in dict.fromkeys(p for p in (root, cwd) if p))
    lines.append(f'export PYTHONPATH={path}"${{PYTHONPATH:+:$PYTHONPATH}}"')
    lines.append(f"cd {q(cwd)} || exit 98")
    lines.append(f"umask {cfg.umask}")
    lines += shell.task_lines(shlex.join(argv), shell.header("dlc", q(name), '"$(hostname)"', '"$(date -u +%FT%TZ)"'),
                              shell.printf(f"{FOOTER}%s", shell.RC), exit_file=exit_file)
    # One line (task logs and --dry-run show it as one); a pre_cmd ending in '&' needs no ';'.
    return "".join(line + ("" if i == len(lines) - 1 else " " if line.rstrip().endswith("&") else "; ")
                   for i, line in enumerate(lines))


def submit_argv(dlc_bin: str, cfg: AliyunConfig, name: str, command: str, num_gpus: int) -> list[str]:
    """The ``dlc submit pytorchjob`` (or ``dlc create job --kind PyTorchJob``) argv of one job."""
    gpus, cpus, memory = cfg.worker_resources(num_gpus)
    if cfg.dlc_job_cmd == "create":
        argv = [dlc_bin, "create", "job", "--kind", "PyTorchJob"]
        workers = ["--worker_count", "1"]
    else:
        argv = [dlc_bin, "submit", "pytorchjob"]
        workers = ["--workers", "1"]
    argv += ["--command", command, "--name", name]
    if cfg.dlc_config_path:
        argv += ["--config", os.path.expanduser(cfg.dlc_config_path)]
    argv += ["--workspace_id", cfg.workspace_id, f"--resource_id={cfg.resource_id}", "--priority", str(cfg.priority),
             *workers, "--worker_cpu", str(cpus), "--worker_gpu", str(gpus), "--worker_memory", f"{memory}Gi",
             "--worker_image", cfg.worker_image]
    if cfg.data_sources:
        argv.append(f"--data_sources={','.join(cfg.data_sources)}")
    if cfg.preemptible is not None:
        argv.append(f"--enable_priority_preemption={'true' if cfg.preemptible else 'false'}")
    return argv


def load_aliyun_file(path: str) -> dict[str, Any]:
    """Read an aliyun config file (``~/.aliyun.cfg`` as OpenCompass's ``--aliyun-cfg`` takes it):
    JSON, YAML, or Python-style ``key = value`` lines of literals (never executed).

    Raises ``ValueError`` (one line, naming the file and line) on anything else.
    """
    return read_key_values(path, "aliyun config")
