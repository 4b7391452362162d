"""The shell around one task inside a job, written once for every backend that needs one.

A job on a cluster or a cloud service runs a few lines of POSIX shell around the task's argv:
a header that says which job and node the attempt got (the report reads it), the task, then a
footer with the task's exit code (and, where asked, the code in a file), and an exit with that
code.  Slurm's srun wrapper uses the header, its sbatch script and DLC's container command the
whole of it.  Every value is quoted here, at the edge; shell expressions (``"$orc_job"``,
``"$(hostname)"``) are passed as such by the caller.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping, Sequence

from orchestra.secretnames import ENV_NAME, VARIABLE_REFERENCE

__all__ = ["ENV_NAME", "NOW", "RC", "exports", "header", "printf", "shell_value", "task_lines"]
#: the shell variable that holds the task's exit code after it ran (a footer's argument)
RC = '"$orc_rc"'
#: a shell expression of now, in seconds since the epoch (``?`` where the shell cannot tell)
NOW = '"${EPOCHREALTIME-?}"'


def printf(fmt: str, *args: str) -> str:
    """A ``printf`` of ``fmt`` (a literal, ``%s`` for each of ``args``) and a newline; ``args`` are
    shell words (quoted values or expressions)."""
    return " ".join(["printf", shlex.quote(fmt + "\\n"), *args])


def header(backend: str, job: str, node: str, started: str = NOW, fields: Sequence[tuple[str, str]] = ()) -> str:
    """The printf of an attempt's first log line: ``===== <backend>: job J on N, K=V, started T``.

    ``job``, ``node``, ``started`` and each field's value are shell words."""
    labels = "".join(f", {name}=%s" for name, _ in fields)
    return printf(f"===== {backend}: job %s on %s{labels}, started %s", job, node, *(v for _, v in fields), started)


def exports(env: Mapping[str, str]) -> list[str]:
    """``export NAME=value`` of each variable, names checked (a value is quoted, never parsed)."""
    bad = [name for name in env if not ENV_NAME.fullmatch(name)]
    if bad:
        raise ValueError(f"task environment variable names must be identifiers, got {bad}")
    return [f"export {k}={shlex.quote(v)}" for k, v in sorted(env.items())]


def shell_value(text: str) -> str:
    """``text`` as one shell word: quoted, except ``$NAME``/``${NAME}``, which still expand (a
    user's value that refers to a variable of the job's own environment)."""
    parts, pos = [], 0
    for m in VARIABLE_REFERENCE.finditer(text):
        if m.start() > pos:
            parts.append(shlex.quote(text[pos : m.start()]))
        parts.append('"${' + m.group(0).strip("${}") + '}"')
        pos = m.end()
    if pos < len(text) or not parts:
        parts.append(shlex.quote(text[pos:]))
    return "".join(parts)


def task_lines(run: str, head: str, footer: str, *, log: str | None = None, exit_file: str | None = None) -> list[str]:
    """Lines that run a task between its header and footer and exit with its code.

    Args:
        run: the task as shell words (``shlex.join(argv)``, or ``'"$@"'``).
        head: the header's printf (``header``).
        footer: a printf that may use the exit code as ``RC``.
        log: a shell word naming the file header, output and footer are appended to (None: stdout).
        exit_file: a path the code is also written to, atomically (a job's end read from a shared
            file system, where the log may not show it).
    """
    to_log = f' >>{log}' if log else ""
    lines = [head + to_log, run + (f"{to_log} 2>&1 </dev/null" if log else ""), "orc_rc=$?", footer + to_log]
    if exit_file:
        q, tmp = shlex.quote, exit_file + ".tmp"
        lines.append(f'mkdir -p {q(os.path.dirname(exit_file))} && printf "%s\\n" {RC} > {q(tmp)} '
                     f"&& mv -f {q(tmp)} {q(exit_file)}")
    lines.append(f"exit {RC}")
    return lines


def read_exit_file(path: str) -> int | None:
    """The exit code :func:`task_lines` wrote to ``exit_file``; None when the task never got that far."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read().strip()
    except OSError:
        return None
    return int(text) if text.lstrip("-").isdigit() else None
