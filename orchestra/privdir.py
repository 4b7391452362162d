"""Private folders in shared places (the temporary folder), and files opened safely in them.

orchestra keeps host-wide state under the temporary folder, which every local user can
write: the connection and sandbox slots (``<tmp>/orchestra-<uid>/slots``), the sandbox
folders (``<tmp>/orchestra-sandbox-<uid>``), torch.compile's cache of a local model
(``<tmp>/orchestra-inductor-<uid>``) and, when the weights cache cannot be written,
converted weights (``<tmp>/orchestra-weights-<uid>``).  Another user could create those
names first (or plant a symbolic link in them) and make orchestra delete, create or load
files where that user chose.  So each such folder is used only when it is a real folder
(not a symbolic link), owned by this process's effective user and not writable by group or
others; a folder orchestra creates is made that way (mode 0700 unless told otherwise).
Anything else is refused with one line naming the folder and the fix
(:class:`UnsafeFolderError`, a :class:`~orchestra.errors.UserError`: exit 2 at the CLI).

A folder given by the user (``ORCHESTRA_LOCK_DIR``, ``ORCHESTRA_SANDBOX_DIR``) is checked the
same way, itself and everything orchestra makes below it; the folders above it are the
user's choice and are not checked.  Files in these folders are opened with
:func:`open_private_file` (``O_NOFOLLOW``, ``O_CLOEXEC``; a file that is not a regular file of
ours is refused), so nothing is ever followed through a symbolic link.
"""

from __future__ import annotations

import os
import stat
import tempfile

from orchestra.errors import UserError

#: The folders orchestra keeps in the temporary folder: kind -> (name pattern, override variable).
TEMP_FOLDERS = {
    "slots": ("orchestra-{uid}", "ORCHESTRA_LOCK_DIR"),
    "sandbox": ("orchestra-sandbox-{euid}", "ORCHESTRA_SANDBOX_DIR"),
    "weights": ("orchestra-weights-{uid}", ""),
    "serve": ("orchestra-serve-{uid}", ""),  # managed servers' key files (0600)
    "inductor": ("orchestra-inductor-{uid}", ""),  # torch.compile's kernels (models.hf_load)
}


class UnsafeFolderError(UserError):
    """A shared folder orchestra would use is not private to this user (one line: which, why, fix)."""


def temp_folder(kind: str) -> str:
    """``<tmp>/<name>`` of a kind in :data:`TEMP_FOLDERS` (not created, not checked)."""
    pattern, _ = TEMP_FOLDERS[kind]
    return os.path.join(tempfile.gettempdir(), pattern.format(uid=os.getuid(), euid=os.geteuid()))


def folder_problem(path: str, follow_links: bool = False) -> str | None:
    """Why ``path`` (which exists) must not be trusted, or None if it is a private folder
    (``follow_links``: judge the folder a symbolic link at ``path`` leads to, not the link)."""
    st = os.stat(path) if follow_links else os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        return "is a symbolic link"
    if not stat.S_ISDIR(st.st_mode):
        return "is not a folder"
    if st.st_uid != os.geteuid():
        return f"is owned by uid {st.st_uid}, not by this user (uid {os.geteuid()})"
    if st.st_mode & 0o022:
        who = {0o022: "group and others", 0o020: "group", 0o002: "others"}[st.st_mode & 0o022]
        return f"is writable by {who} (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def _refuse(path: str, problem: str, env: str) -> UnsafeFolderError:
    other = env or "TMPDIR"
    fix = f"remove it, or set {other} to a folder of your own"
    if problem.startswith("is writable by"):  # a folder of ours, opened up: closing it is enough
        fix = f"chmod go-w {path}, or set {other} to a folder of your own"
    return UnsafeFolderError(f"{path} {problem}: another user could control what orchestra does there; {fix}")


def _ensure(path: str, mode: int, env: str) -> None:
    try:
        os.mkdir(path, mode)
    except FileExistsError:
        pass
    else:
        os.chmod(path, mode)  # exactly this mode, whatever the umask (mkdir never follows a link)
    problem = folder_problem(path)
    if problem is not None:
        raise _refuse(path, problem, env)


def private_dir(root: str, *parts: str, mode: int = 0o700, env: str = "") -> str:
    """Make sure ``root`` and ``root/parts[0]/...`` are private folders and return the last.

    Missing ones are created with ``mode`` (0700; 0711 for folders other users must traverse);
    existing ones must pass :func:`folder_problem`, else :class:`UnsafeFolderError` names the
    folder and the fix (``env``: the variable that chooses another folder).  Missing folders
    above ``root`` are created 0700; existing ones are not checked (``root``'s parent is the
    temporary folder, or a folder the user chose).
    """
    path = os.path.abspath(root)
    parent = os.path.dirname(path)
    if not os.path.exists(parent):  # a file there: the mkdir below names it ("Not a directory")
        os.makedirs(parent, mode=0o700, exist_ok=True)
    _ensure(path, mode, env)
    for part in parts:
        path = os.path.join(path, part)
        _ensure(path, mode, env)
    return path


#: cache roots found private in this process (each is looked at once, not per cache read)
_PRIVATE_CACHES: set[str] = set()


def cache_folder() -> str:
    """The per-user cache (``ORCHESTRA_CACHE_DIR``, else ``~/.cache/orchestra``; not created).

    Its files decide what is reused: the digests that say a data file is unchanged, the
    datasets' sizes, lm-eval's task index and inputs, converted model weights.  A cache folder
    another user could write (``ORCHESTRA_CACHE_DIR`` set to a shared path) would let them
    plant any of those and change the numbers, so an existing one must be a private folder of
    this user (:func:`folder_problem`), else :class:`UnsafeFolderError`; make it with
    :func:`private_cache_dir`."""
    root = os.path.abspath(os.environ.get("ORCHESTRA_CACHE_DIR")
                           or os.path.join(os.path.expanduser("~"), ".cache", "orchestra"))
    if root not in _PRIVATE_CACHES and os.path.lexists(root):
        problem = folder_problem(root)
        if problem is not None:
            raise _refuse(root, problem, "ORCHESTRA_CACHE_DIR")
        _PRIVATE_CACHES.add(root)
    return root


def private_cache_dir(*parts: str) -> str:
    """:func:`cache_folder`, or a folder below it, created 0700 where missing (whatever the umask)."""
    return private_dir(cache_folder(), *parts, env="ORCHESTRA_CACHE_DIR")


def check_temp_folders() -> None:
    """Refuse (:class:`UnsafeFolderError`) if a folder of :data:`TEMP_FOLDERS` that tasks would
    use exists and is not private; creates nothing (``--dry-run`` runs it too).  The CLI calls
    it before a run, so a planted folder is one line and exit 2, not a failed task.  The
    per-user cache folder is checked the same way (:func:`cache_folder`)."""
    cache_folder()
    for kind, (_, env) in TEMP_FOLDERS.items():
        root = os.environ.get(env) if env else None
        candidates = [root] if root else [temp_folder(kind)]
        if kind == "slots" and not root:
            candidates.append(os.path.join(candidates[0], "slots"))
        for path in candidates:
            if os.path.lexists(path):
                problem = folder_problem(path)
                if problem is not None:
                    raise _refuse(path, problem, env)


def open_private_file(path: str, flags: int, mode: int = 0o600) -> int:
    """``os.open`` that never follows a symbolic link (``O_NOFOLLOW``, ``O_CLOEXEC``) and
    refuses what is not a regular file owned by this user (:class:`UnsafeFolderError`)."""
    fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            raise UnsafeFolderError(f"{path} is not a regular file of this user (uid {os.geteuid()}); remove it")
    except BaseException:
        os.close(fd)
        raise
    return fd


def is_own_regular_file(fd: int) -> bool:
    """Whether the open file ``fd`` is a regular file owned by this user."""
    st = os.fstat(fd)
    return stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid()
