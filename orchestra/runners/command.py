"""Commands as argv lists, and templates filled one argument at a time.

A template such as ``'srun -p {partition} --gres=gpu:{num_gpus} {task_cmd}'`` is split with
``shlex`` first and then filled per argument: an argument that is exactly ``{task_cmd}``
becomes the task's whole argv; a field inside a larger argument is replaced in place, so a
value with spaces, quotes or ``;`` stays one argument and can never start a new command.
"""

from __future__ import annotations

import shlex
import string
from dataclasses import dataclass, field
from typing import Any

from orchestra.errors import ConfigError


@dataclass(frozen=True)
class Command:
    """What to execute: an argv list plus environment additions."""

    argv: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)

    def display(self) -> str:
        """A shell-pasteable form, for logs and ``--dry-run`` (quoted only here, at the edge)."""
        prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(self.env.items()))
        return (prefix + " " if prefix else "") + shlex.join(self.argv)


def template_fields(template: str | list[str]) -> set[str]:
    args = shlex.split(template) if isinstance(template, str) else list(template)
    names = set()
    for arg in args:
        for _, name, _, _ in string.Formatter().parse(arg):
            if name is not None:
                names.add(name)
    return names


def fill_template(template: str | list[str], task_cmd: list[str], fields: dict[str, Any]) -> list[str]:
    """Fill ``template`` per argument; ``{task_cmd}`` as a whole argument expands to the argv."""
    args = shlex.split(template) if isinstance(template, str) else list(template)
    if "task_cmd" not in template_fields(args):
        raise ConfigError(f"template {template!r} must contain {{task_cmd}}")
    out: list[str] = []
    for arg in args:
        if arg == "{task_cmd}":
            out.extend(task_cmd)
            continue
        values = {**{k: str(v) for k, v in fields.items()}, "task_cmd": shlex.join(task_cmd)}
        try:
            out.append(arg.format(**values))
        except KeyError as exc:
            raise ConfigError(
                f"template {template!r}: unknown field {{{exc.args[0]}}}; valid: {', '.join(sorted(values))}"
            ) from None
    return out
