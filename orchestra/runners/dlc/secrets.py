"""``DLCRunner(forward_env=[...])``: variables passed to DLC containers by name, never by value.

A DLC container does not inherit the orchestrator's environment, and everything in the job's
command is visible (the ``dlc submit`` argv in ``/proc``, the task logs, ``--dry-run``).  So the
values of ``forward_env`` go into one file per stage in the run folder's private area
(``<run>/dlc/private/``, mode 0700; the file 0600, written atomically), on the storage the
containers mount; the job's command sources it by path (``dlc_config.container_command``).
The runner deletes the file when its launch ends (``DLCRunner.close``); a run killed with SIGKILL
leaves it, still 0600, until the next launch of that run folder rewrites and deletes it.
The container must run as root or as the orchestrator's user to read it.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping, Sequence


def env_file_path(dlc_dir: str, stage: str) -> str:
    """Where the forwarded variables of one stage's jobs are (``<run>/dlc/private/<stage>.env``)."""
    return os.path.join(dlc_dir, "private", f"{stage}.env")


def write_env_file(path: str, names: Sequence[str], environ: Mapping[str, str] | None = None) -> None:
    """Write ``export NAME=value`` for each name set in ``environ`` (default: ours) to ``path``:
    its folder 0700, the file 0600 from its first byte, replaced atomically."""
    environ = os.environ if environ is None else environ
    folder = os.path.dirname(path)
    os.makedirs(folder, mode=0o700, exist_ok=True)
    os.chmod(folder, 0o700)  # it may exist from an earlier launch with other bits
    text = "".join(f"export {n}={shlex.quote(environ[n])}\n" for n in names if n in environ)
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        os.fchmod(fd, 0o600)  # an earlier leftover may have other bits
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        os.unlink(tmp)
        raise
    os.replace(tmp, path)


def remove_env_file(path: str) -> None:
    """Delete the file of forwarded variables, if it is there."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
