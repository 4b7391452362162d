"""The command one replica of each engine runs, and how it gets its port, key and GPUs.

Every replica listens on 127.0.0.1 only and demands the run's key, which it gets from a private
file (``ORCHESTRA_SERVER_KEY_FILE``) or an environment variable, never from argv (``ps`` shows
argv to every local user):

* vLLM: ``vllm serve MODEL --uds SOCKET --served-model-name --tensor-parallel-size``; the key in
  ``VLLM_API_KEY`` (vLLM reads it like ``--api-key``).  vLLM checks its key only on ``/v1``
  routes, so it listens on a Unix socket in a 0700 folder of this user, not on a port: another
  local user cannot connect at all.
* SGLang: ``python -m sglang.launch_server --model-path --host --port --served-model-name
  --tp-size``; SGLang takes its key only as ``--api-key``, so :mod:`orchestra.serving.launch_with_key`
  adds it to ``sys.argv`` inside the process (the kernel's copy of argv never holds it).
* llama.cpp: :mod:`orchestra.serving.xllama` (llama.cpp's server from the ``xllamacpp`` wheel),
  which reads the key file itself.
* ``command``: the user's argv template, filled per argument; the key in the file ``{key_file}``
  and in ``ORCHESTRA_SERVER_KEY``; it listens on ``{port}`` or on the Unix socket ``{socket}``.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from orchestra.serving.spec import ServerSpec

HOST = "127.0.0.1"
#: the variable that names the key file, for replicas and for the tasks that call them
KEY_FILE_ENV = "ORCHESTRA_SERVER_KEY_FILE"
#: the variable that tells a task where ``<dir>/<model>/replicas.json`` is
SERVERS_DIR_ENV = "ORCHESTRA_SERVERS_DIR"
#: set to ``1`` for tasks whose replicas are placed on a cluster (a node's address is then taken)
REMOTE_ENV = "ORCHESTRA_SERVERS_REMOTE"


@dataclass(frozen=True)
class Launch:
    """One replica's argv, its environment additions and the variables that carry the key."""

    argv: tuple[str, ...]
    env: dict[str, str]
    key_env: tuple[str, ...] = ()  # variables the replica's launcher fills with the key itself


def launch(spec: ServerSpec, served_name: str, port: int, key_file: str, gpus: list[str],
           socket_path: str = "", host: str = HOST) -> Launch:
    """The command of one replica of ``spec`` on ``host:port`` (or, given ``socket_path``, on
    that Unix socket: vLLM's ``--uds``) with the GPUs ``gpus``."""
    env = {**dict(spec.env), KEY_FILE_ENV: key_file, "CUDA_VISIBLE_DEVICES": ",".join(gpus)}
    python = spec.python or sys.executable
    if spec.engine == "vllm":
        where = ["--uds", socket_path] if socket_path else ["--host", host, "--port", str(port)]
        argv = [spec.executable, "serve", spec.model, *where,
                "--served-model-name", served_name, "--tensor-parallel-size", str(spec.tensor_parallel_size),
                *spec.args]
        return Launch(tuple(argv), env, ("VLLM_API_KEY",))
    if spec.engine == "sglang":
        argv = [python, "-m", "orchestra.serving.launch_with_key", "--api-key", "sglang.launch_server",
                "--model-path", spec.model, "--host", host, "--port", str(port), "--served-model-name", served_name,
                "--tp-size", str(spec.tensor_parallel_size), *spec.args]
        return Launch(tuple(argv), env)
    if spec.engine == "llama.cpp":
        argv = [python, "-m", "orchestra.serving.xllama", "--model", spec.model, "--host", host, "--port", str(port),
                "--alias", served_name, "--threads", str(spec.threads), "--parallel", str(spec.parallel),
                "--ctx", str(spec.ctx_size), *(a for arg in spec.args for a in ("--set", arg))]
        return Launch(tuple(argv), env)
    fields = {"port": str(port), "socket": socket_path, "host": host, "model": spec.model, "name": served_name,
              "key_file": key_file, "gpus": ",".join(gpus), "threads": str(spec.threads)}
    argv = [arg.format(**fields) for arg in spec.command] + list(spec.args)
    return Launch(tuple(argv), env, ("ORCHESTRA_SERVER_KEY",))
