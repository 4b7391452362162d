"""Commands as argv lists, and templates filled one argument at a time.

A template such as ``'srun -p {partition} --gres=gpu:{num_gpus} {task_cmd}'`` is split with
``shlex`` first and then filled per argument: an argument that is exactly ``{task_cmd}``
becomes the task's whole argv; a field inside a larger argument is replaced in place, so a
value with spaces, quotes or ``;`` stays one argument and can never start a new command.
``{task_cmd}`` inside a larger argument, or quoted in a string template
(``"sbatch --wrap '{task_cmd}'"``, ``"bash -c '{task_cmd}'"``), becomes the argv joined into
one shell-quoted string, which is what a command that takes a shell string needs.
"""

from __future__ import annotations

import os
import re
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


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_QUOTED_TASK_CMD = "task_cmd\x00quoted"  # a field name no user can write


def _split(template: str | list[str]) -> list[str]:
    """The template's arguments; ``{task_cmd}`` quoted in a string template is marked as such."""
    if isinstance(template, str):
        try:
            return shlex.split(_mark_quoted_task_cmd(template))
        except ValueError as exc:  # e.g. "No closing quotation"
            raise ConfigError(f"template {template!r}: {exc}") from None
    if not isinstance(template, (list, tuple)) or not all(isinstance(a, str) for a in template):
        raise ConfigError(f"template {template!r}: expected a string or a list of strings")
    return list(template)


def _mark_quoted_task_cmd(template: str) -> str:
    """Rename ``{task_cmd}`` where it sits inside shell quotes, before shlex drops the quotes."""
    out, quote, i = [], "", 0
    while i < len(template):
        ch = template[i]
        if template.startswith("{task_cmd}", i) and quote:
            out.append("{" + _QUOTED_TASK_CMD + "}")
            i += len("{task_cmd}")
            continue
        if ch == "\\" and quote != "'" and i + 1 < len(template):
            out.append(template[i : i + 2])
            i += 2
            continue
        if ch in "'\"" and quote in ("", ch):
            quote = "" if quote else ch
        out.append(ch)
        i += 1
    return "".join(out)


def _fields_of(args: list[str], template: Any) -> set[str]:
    names = set()
    for arg in args:
        try:
            parsed = list(string.Formatter().parse(arg))
        except ValueError as exc:  # a lone "{" or "}"
            raise ConfigError(f"template {template!r}: {exc} in {arg!r} (write {{{{ and }}}} for braces)") from None
        for _, name, _, _ in parsed:
            if name is None:
                continue
            if not name.isidentifier() and name != _QUOTED_TASK_CMD:
                raise ConfigError(
                    f"template {template!r}: {{{name}}} in {arg!r} is not a field name; "
                    "fields are plain names such as {task_id}"
                )
            names.add(name)
    return names


def template_fields(template: str | list[str]) -> set[str]:
    """The ``{fields}`` a template uses (``task_cmd`` however it is quoted)."""
    names = _fields_of(_split(template), template)
    return {"task_cmd" if n == _QUOTED_TASK_CMD else n for n in names}


def fill_template(template: str | list[str], task_cmd: list[str], fields: dict[str, Any]) -> list[str]:
    """Fill ``template`` per argument; ``{task_cmd}`` as a whole argument expands to the argv."""
    args = _split(template)
    if "task_cmd" not in {"task_cmd" if n == _QUOTED_TASK_CMD else n for n in _fields_of(args, template)}:
        raise ConfigError(f"template {template!r} must contain {{task_cmd}}")
    joined = shlex.join(task_cmd)
    values = {**{k: str(v) for k, v in fields.items()}, "task_cmd": joined, _QUOTED_TASK_CMD: joined}
    valid = ", ".join(sorted(k for k in values if k != _QUOTED_TASK_CMD))
    out: list[str] = []
    for arg in args:
        if arg == "{task_cmd}":
            out.extend(task_cmd)
            continue
        try:
            out.append(arg.format_map(values))
        except KeyError as exc:
            raise ConfigError(f"template {template!r}: unknown field {{{exc.args[0]}}}; valid: {valid}") from None
        except (IndexError, ValueError, AttributeError) as exc:
            raise ConfigError(f"template {template!r}: cannot fill {arg!r}: {exc}; valid fields: {valid}") from None
    return out


def forward_env_names(names: object, what: str = "forward_env", must_be_set: bool = True) -> tuple[str, ...]:
    """A runner's ``forward_env`` (variables that reach its tasks by name, never by value) as a
    tuple; ``ValueError`` (one line, no value shown) if it is not a list of variable names, or
    (``must_be_set``) names one that is not set in this process's environment."""
    if isinstance(names, str) or not isinstance(names, (list, tuple)) or not all(
            isinstance(n, str) and _ENV_NAME.fullmatch(n) for n in names):
        raise ValueError(f"{what} must be a list of environment variable names, got {names!r}")
    unset = [n for n in names if n not in os.environ] if must_be_set else []
    if unset:
        raise ValueError(f"{what}: {', '.join(unset)} not set in the orchestrator's environment (export "
                         f"{'it' if len(unset) == 1 else 'them'} before the run, or leave {what} without "
                         f"{'it' if len(unset) == 1 else 'them'})")
    return tuple(names)
