"""Environment variables handed to a remote job by name, through a private file, never by value.

A job on a cluster or a cloud service may not inherit the orchestrator's environment, and its
command line is visible (``/proc``, the task logs, ``--dry-run``).  So a backend that forwards
variables (``DLCRunner(forward_env=[...])``) writes their values to a file on the storage the
job mounts, in a private folder (0700; the file 0600 from its first byte, replaced atomically),
and the job's command sources that file by path.  The backend deletes the file once every job
that needs it is over; a run killed with SIGKILL leaves it, still 0600, until the next launch
rewrites and deletes it.  The job must run as root or as the orchestrator's user to read it.

The folder must be a real folder of ours (a symbolic link planted there is refused, never followed
or chmod-ed), and the folder that holds it is made not writable by group and others: else a user
who may write there could rename the private folder away after it was checked and put one of
their own in its place, whose file the job would source.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import stat
from collections.abc import Mapping, Sequence

from orchestra.privdir import UnsafeFolderError, folder_problem
from orchestra.secretnames import ENV_NAME


def write_env_file(path: str, names: Sequence[str], environ: Mapping[str, str] | None = None) -> None:
    """Write ``export NAME=value`` for each name set in ``environ`` (default: ours) to ``path``:
    its folder 0700, the file 0600 from its first byte, replaced atomically."""
    environ = os.environ if environ is None else environ
    bad = [n for n in names if not ENV_NAME.fullmatch(n)]
    if bad:  # a name is written unquoted: 'A;cmd' would run cmd wherever the file is sourced
        raise ValueError(f"forwarded variable names must be identifiers, got {bad}")
    folder = os.path.dirname(os.path.abspath(path))
    _closed_parent(os.path.dirname(folder))
    with contextlib.suppress(FileExistsError):
        os.mkdir(folder, 0o700)
    problem = folder_problem(folder)  # never follows a link
    if problem is not None:
        raise UnsafeFolderError(f"{folder} {problem}: the variables of forward_env are not written there; remove it")
    os.chmod(folder, 0o700)  # nor read: it may exist from an earlier launch with other bits
    text = "".join(f"export {n}={shlex.quote(environ[n])}\n" for n in names if n in environ)
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        os.fchmod(fd, 0o600)  # an earlier leftover may have other bits
        with os.fdopen(fd, "wb") as f:  # a value's bytes as they were (os.environ: surrogate escapes)
            f.write(text.encode("utf-8", "surrogateescape"))
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        os.unlink(tmp)
        raise
    os.replace(tmp, path)


def _closed_parent(parent: str) -> None:
    """Make ``parent`` (made if missing) a folder only its owner, this user or root, may change
    entries of: group and other write are taken off (it is a folder of the run, made with the umask)."""
    os.makedirs(parent, exist_ok=True)
    st = os.lstat(parent)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode) or st.st_uid not in (0, os.geteuid()):
        raise UnsafeFolderError(f"{parent} is not a real folder of this user (uid {os.geteuid()}); another user "
                                "could swap the private folder of forwarded variables in it: remove it")
    if st.st_mode & 0o022:
        os.chmod(parent, stat.S_IMODE(st.st_mode) & ~0o022)


def remove_env_file(path: str) -> None:
    """Delete the file of forwarded variables, if it is there."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def source_lines(path: str, what: str) -> list[str]:
    """The job's shell lines that source the file, or exit 97 naming it when it cannot be read
    (``what`` says where it comes from and who deletes it)."""
    q = shlex.quote
    why = f"orchestra: cannot read {path} ({what})"
    return [f"{{ [ -r {q(path)} ] || {{ echo {q(why)} >&2; exit 97; }}; }}", f". {q(path)}"]
