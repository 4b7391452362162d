"""Save a run's resolved config in its run folder, with secret-looking values redacted."""

from __future__ import annotations

import pprint
from typing import Any

from orchestra.config.load import to_plain
from orchestra.config.secrets import ENV_DICT_KEYS
from orchestra.secretnames import secret_assignment, secret_key


def redact(obj: Any, env: bool = False) -> Any:
    """A copy with secret-looking values replaced (defence in depth for dumps and logs); ``env``:
    ``obj`` is a dict of environment variables (``ENV_DICT_KEYS``), whose names say more."""
    if isinstance(obj, dict):
        return {k: ("<redacted>" if secret_key(k) or (env and isinstance(v, str) and secret_assignment(str(k), v))
                    else redact(v, k in ENV_DICT_KEYS)) for k, v in obj.items()}
    if isinstance(obj, list):
        return [redact(v) for v in obj]
    return obj


def dump_config(resolved: dict[str, Any], path: str) -> None:
    """Save the resolved config as a readable Python file in the run folder."""
    from orchestra.fileio import atomic_write_text

    parts = ["# Resolved config of this run, written by orchestra. Secrets are never written.\n"]
    for key, value in redact(to_plain(resolved)).items():
        parts.append(f"{key} = {pprint.pformat(value, width=100, sort_dicts=False)}\n")
    atomic_write_text(path, "\n".join(parts))
