"""What a managed server is: the ``server=dict(...)`` of an ``OpenAIAPI`` model, checked once.

A spec is frozen data built from the config (cheap: no process, no network), so a bad value is
a config error (one line, exit 2) before anything starts.  :mod:`orchestra.serving.presets` turns
a spec into the argv of one replica.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

from orchestra.errors import ConfigError, check_known_keys

#: the engines a spec may name (``command``: any OpenAI-compatible server, as an argv template)
ENGINES = ("vllm", "sglang", "llama.cpp", "command")
#: engines whose server returns the prompt's log-probs (``echo`` + ``logprobs`` on /v1/completions)
LOGLIK_ENGINES = frozenset({"vllm", "sglang", "command"})
#: fields an argv template of the ``command`` engine may use
TEMPLATE_FIELDS = ("port", "socket", "host", "model", "name", "key_file", "gpus", "threads")
KEYS = ("engine", "model", "replicas", "tensor_parallel_size", "gpus", "threads", "parallel", "ctx_size", "args",
        "command", "ready_path", "startup_timeout_s", "max_restarts", "env", "python", "executable")
#: per engine, the keys that only it accepts
ONLY = {"tensor_parallel_size": ("vllm", "sglang"), "gpus": ("command",), "threads": ("llama.cpp", "command"),
        "parallel": ("llama.cpp",), "ctx_size": ("llama.cpp",), "command": ("command",),
        "python": ("llama.cpp", "sglang"), "executable": ("vllm",)}
#: the most replicas one model may have (each is a process, a port and a thread's worth of checks)
MAX_REPLICAS = 64
#: ``CommonParams`` fields the llama.cpp launcher sets itself (where a replica listens, its key, its
#: weights, name, slots, context and threads): ``args`` never overrides them
LLAMA_RESERVED = ("model", "model_alias", "hostnames", "port", "api_keys", "n_parallel", "n_ctx", "cpuparams",
                  "cpuparams_batch")
DEFAULT_STARTUP_S = {"vllm": 900.0, "sglang": 900.0, "llama.cpp": 120.0, "command": 600.0}


@dataclass(frozen=True)
class ServerSpec:
    """One model's managed server: which engine, what it serves, how many replicas of it.

    Args:
        engine: one of :data:`ENGINES`.
        model: the weights: a folder or hub id (vLLM, SGLang), a GGUF file (llama.cpp), or what
            the ``command`` template's ``{model}`` stands for.
        replicas: servers started for this model (requests spread over them).
        tensor_parallel_size: GPUs one replica of vLLM / SGLang needs.
        gpus: GPUs one replica of a ``command`` server needs (``{gpus}``, and CUDA_VISIBLE_DEVICES).
        threads: CPU threads of one llama.cpp replica (``{threads}`` of a ``command``).
        parallel: requests one llama.cpp replica decodes at once (its slots).
        ctx_size: llama.cpp's context, shared by its slots.
        args: extra engine flags, passed through as they are (llama.cpp: ``name=value`` settings
            of xllamacpp's ``CommonParams``).
        command: the ``command`` engine's argv template (a list, or a string split with shlex).
        ready_path: the path that answers 200 once a replica serves (default ``/health``).
        startup_timeout_s: how long a replica may take to answer ``ready_path``.
        max_restarts: restarts of dead replicas per stage (infrastructure, never a task's ``retry``).
        env: extra environment of every replica (never a secret: the key is orchestra's).
        python: the interpreter that runs the llama.cpp launcher or SGLang (default: this one).
        executable: vLLM's command (default ``vllm``).
    """

    engine: str
    model: str
    replicas: int = 1
    tensor_parallel_size: int = 1
    gpus: int = 0
    threads: int = 1
    parallel: int = 4
    ctx_size: int = 8192
    args: tuple[str, ...] = ()
    command: tuple[str, ...] = ()
    ready_path: str = "/health"
    startup_timeout_s: float = 0.0  # 0: the engine's default
    max_restarts: int = 3
    env: tuple[tuple[str, str], ...] = ()
    python: str = ""
    executable: str = "vllm"

    @property
    def gpus_per_replica(self) -> int:
        """GPUs one replica takes from the runner's hand-out (llama.cpp runs on CPU threads)."""
        if self.engine == "command":
            return self.gpus
        return self.tensor_parallel_size if self.engine in ("vllm", "sglang") else 0

    @property
    def on_socket(self) -> bool:
        """Whether a replica listens on a Unix socket in a private folder rather than a loopback
        port: vLLM (its key guards only ``/v1`` routes, a socket in a 0700 folder guards them all)
        and a ``command`` template that uses ``{socket}``."""
        return self.engine == "vllm" or (self.engine == "command" and any("{socket}" in a for a in self.command))

    @property
    def startup_s(self) -> float:
        return self.startup_timeout_s or DEFAULT_STARTUP_S[self.engine]

    @property
    def supports_loglik(self) -> bool:
        return self.engine in LOGLIK_ENGINES


def _int(cfg: dict[str, Any], key: str, default: int, low: int, high: int | None = None) -> int:
    value = cfg.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < low or (high is not None and value > high):
        valid = f">= {low}" if high is None else f"from {low} to {high}"
        raise ConfigError(f"server.{key} must be an integer {valid}, got {value!r}")
    return value


def _looks_like_path(model: str) -> bool:
    """A hub id (``org/name``) is not checked on disk; a path-like name is."""
    return model.startswith(("/", "./", "../", "~")) or os.path.exists(model)


def parse_server(cfg: Any) -> ServerSpec:
    """Check ``server=dict(...)`` and return its spec; ``ConfigError`` (one line) if it is wrong."""
    import shlex

    if not isinstance(cfg, dict):
        raise ConfigError(f"server must be a dict with engine=..., model=..., got {cfg!r}")
    check_known_keys(sorted(cfg), KEYS, "server")
    engine = cfg.get("engine")
    if engine not in ENGINES:
        raise ConfigError(f"server.engine must be one of {', '.join(ENGINES)}, got {engine!r}")
    for key, engines in ONLY.items():
        if key in cfg and engine not in engines:
            raise ConfigError(f"server.{key} does not apply to engine {engine!r} (only to {', '.join(engines)})")
    model = cfg.get("model")
    if not isinstance(model, str) or not model:
        raise ConfigError(f"server.model must name the weights (a file, a folder or a hub id), got {model!r}")
    model = os.path.expanduser(model)
    if engine == "llama.cpp" and not os.path.isfile(model):
        raise ConfigError(f"server.model: llama.cpp needs a GGUF file, and {model!r} is not a file")
    if engine in ("vllm", "sglang") and _looks_like_path(model) and not os.path.exists(model):
        raise ConfigError(f"server.model: {model!r} does not exist (give a folder, a file or a hub id org/name)")
    args = cfg.get("args", ())
    if isinstance(args, str):
        args = shlex.split(args)
    if not isinstance(args, (list, tuple)) or not all(isinstance(a, str) for a in args):
        raise ConfigError(f"server.args must be a list of strings, got {args!r}")
    for arg in args if engine == "llama.cpp" else ():
        name, sep, _ = arg.partition("=")
        if not sep or not name.isidentifier() or name in LLAMA_RESERVED:
            why = f"orchestra sets {name} itself" if name in LLAMA_RESERVED else "expected name=value"
            raise ConfigError(f"server.args: {arg!r}: {why} (llama.cpp's args are name=value settings of "
                              f"xllamacpp's CommonParams, except {', '.join(LLAMA_RESERVED)})")
    command: Any = cfg.get("command", ())
    if engine == "command":
        command = shlex.split(command) if isinstance(command, str) else command
        if not isinstance(command, (list, tuple)) or not command or not all(isinstance(a, str) for a in command):
            raise ConfigError("server.command must be a non-empty argv template (a list of strings), "
                              f"got {cfg.get('command')!r}")
        _check_template(command)
    ready_path = cfg.get("ready_path", "/health")
    if not isinstance(ready_path, str) or not ready_path.startswith("/"):
        raise ConfigError(f"server.ready_path must be a path starting with '/', got {ready_path!r}")
    env = cfg.get("env", {})
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise ConfigError(f"server.env must be a dict of strings, got {env!r}")
    timeout = cfg.get("startup_timeout_s", 0.0)
    if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or not math.isfinite(timeout) or timeout < 0:
        raise ConfigError("server.startup_timeout_s must be a number of seconds, finite, >= 0 (0: the engine's "
                          f"default), got {timeout!r}")
    for key in ("python", "executable"):
        if key in cfg and (not isinstance(cfg[key], str) or not cfg[key]):
            raise ConfigError(f"server.{key} must be a command name or path, got {cfg[key]!r}")
    return ServerSpec(
        engine=engine, model=model, replicas=_int(cfg, "replicas", 1, 1, MAX_REPLICAS),
        tensor_parallel_size=_int(cfg, "tensor_parallel_size", 1, 1), gpus=_int(cfg, "gpus", 0, 0),
        threads=_int(cfg, "threads", 1, 1),
        parallel=_int(cfg, "parallel", 4, 1), ctx_size=_int(cfg, "ctx_size", 8192, 256), args=tuple(args),
        command=tuple(command), ready_path=ready_path, startup_timeout_s=float(timeout),
        max_restarts=_int(cfg, "max_restarts", 3, 0), env=tuple(sorted(env.items())),
        python=cfg.get("python", ""), executable=cfg.get("executable", "vllm"))


def _check_template(command: Any) -> None:
    import string

    for arg in command:
        try:
            names = [f for _, f, _, _ in string.Formatter().parse(arg) if f is not None]
        except ValueError as exc:
            raise ConfigError(f"server.command: argument {arg!r}: {exc}") from None
        for name in names:
            if name not in TEMPLATE_FIELDS:
                raise ConfigError(f"server.command: unknown field {{{name}}} in {arg!r}; "
                                  f"valid fields: {', '.join('{' + f + '}' for f in TEMPLATE_FIELDS)}")
    if not any("{port}" in a or "{socket}" in a for a in command):
        raise ConfigError("server.command must listen where orchestra says: on {port} (a free loopback port) or "
                          "on {socket} (a Unix socket in a private folder)")


def check_server_gpus(models: list[dict[str, Any]], gpus: list[str] | None, source: str) -> None:
    """Refuse a model's server that needs more GPUs than the infer runner hands out (None: the
    runner's cluster places them, nothing to count here)."""
    if gpus is None:
        return
    for i, model in enumerate(models):
        if model.get("server"):
            check_gpus(parse_server(model["server"]), len(gpus), f"{source}: models[{i}]")


def served_judge(dataset: dict[str, Any]) -> dict[str, Any] | None:
    """The judge model config of a dataset's evaluator (``eval_cfg.evaluator.judge``) if it has
    ``server=``; None otherwise (an evaluator given by name has no judge)."""
    evaluator = (dataset.get("eval_cfg") or {}).get("evaluator")
    judge = evaluator.get("judge") if isinstance(evaluator, dict) else None
    return judge if isinstance(judge, dict) and judge.get("server") else None


def check_judge_gpus(datasets: list[dict[str, Any]], gpus: list[str] | None, source: str) -> None:
    """Refuse a judge's server (``eval_cfg.evaluator.judge.server``) that needs more GPUs than the
    eval runner hands out (None: nothing to count here)."""
    if gpus is None:
        return
    for j, ds in enumerate(datasets):
        judge = served_judge(ds)
        if judge is not None:
            check_gpus(parse_server(judge["server"]), len(gpus), f"{source}: datasets[{j}].eval_cfg.evaluator.judge")


def check_gpus(spec: ServerSpec, available: int, where: str) -> None:
    """Refuse a server that needs more GPUs than the runner hands out (one line)."""
    need = spec.gpus_per_replica
    if need and need * spec.replicas > available:
        raise ConfigError(f"{where}: server needs {spec.replicas} replica(s) x {need} GPU(s) = "
                          f"{spec.replicas * need} GPU(s), but this machine's runner has {available}")
