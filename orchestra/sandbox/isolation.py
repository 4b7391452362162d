"""Isolation methods: how a sandboxed program is wrapped before it is started.

Each method turns a :class:`SandboxProgram` (the program, its files, its limits, its user) into the
argv that :func:`orchestra.sandbox.process.run_process` starts.  Common to all of them: the
program gets exactly the environment it is given, its own session, resource limits
(``RLIMIT_AS``, ``CPU``, ``FSIZE``, ``NOFILE``, ``NPROC``, no core files) and, when orchestra
runs as root, its own unprivileged user id (one per host-wide slot, so the process-count
limit of one program never counts another's processes, and it cannot signal, trace or read
the environment of any other process); ``setpriv --pdeathsig`` makes the wrapper die with
the task that started it, even by SIGKILL.

Whether the program itself was started is known for sure: its standard input is a socket
whose other end the caller holds, and the last step of every wrapper, as the sandbox user
and right before it executes the program, writes one byte into it (``/bin/sh`` for
``bwrap`` and ``none``, the launcher for ``unshare``).  A failure without that byte is the
wrapper's own (:meth:`Isolation.setup_error`); after it, every outcome is the program's,
whatever it prints.

* ``bwrap`` (bubblewrap): new PID, network, IPC, UTS, cgroup and mount namespaces; the
  program sees only ``/usr``, ``/etc`` and the library folders, read-only, a fresh ``/proc``
  and ``/dev``, and a size-limited tmpfs as its work folder; ``no_new_privs``.
* ``unshare`` (util-linux, root only): new PID, network, IPC, UTS and mount namespaces; every
  mount of the host is remounted read-only in its mount namespace (the host's files are
  visible where their permissions allow), a fresh ``/proc``, and a size-limited tmpfs on
  ``/tmp`` as its work folder.
* ``none``: no namespaces.  The network is reachable and the host's filesystem is visible
  (writable where it is world-writable); only the limits and the user id apply.  Refused
  unless the user opts in.
"""

from __future__ import annotations

import abc
import json
import os
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from typing import Any, ClassVar

from orchestra.sandbox.limits import SandboxLimits

LAUNCHER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "launch.py")
#: Where the program's files and work folder appear inside a bwrap sandbox.
BWRAP_WORK = "/sandbox"
#: The work folder of an ``unshare`` sandbox: a fresh tmpfs mounted on /tmp.
UNSHARE_WORK = "/tmp"
#: Folders a bwrap sandbox sees (read-only) when they exist; symlinks are recreated.
SYSTEM_PATHS = ("/usr", "/etc", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")


@dataclass(frozen=True)
class SandboxProgram:
    """One program to run in a prepared slot folder.

    ``slot_dir`` holds ``src/`` (the program's files, written by the caller) and ``work/``
    (the host folder behind its work folder).  ``uid`` is the sandbox user (None: run as
    ourselves, when orchestra is not root).  ``argv`` runs in the work folder; ``argv[0]``
    is an absolute path.
    """

    slot_dir: str
    uid: int | None
    argv: tuple[str, ...]
    env: dict[str, str]
    limits: SandboxLimits
    files: tuple[str, ...]
    nproc: int
    extra_paths: tuple[str, ...] = ()
    nonce: str = ""  # tags the wrapper's own setup errors (the program cannot read it)

    @property
    def src(self) -> str:
        return os.path.join(self.slot_dir, "src")

    @property
    def work(self) -> str:
        return os.path.join(self.slot_dir, "work")


@dataclass(frozen=True)
class SandboxLaunch:
    """What to start: argv, its whole environment, its working folder."""

    argv: list[str]
    env: dict[str, str]
    cwd: str | None = None


def _tool(name: str) -> str | None:
    """The absolute path of a program on ``PATH`` (the sandbox's own tools are found there)."""
    return shutil.which(name, path=os.environ.get("PATH", os.defpath))


def prlimit_args(limits: SandboxLimits, nproc: int) -> list[str]:
    """``prlimit`` options for ``limits`` and a process-count limit of ``nproc``."""
    args = [f"--{name.lower()}={soft}:{hard}" for name, (soft, hard) in limits.rlimits().items()]
    return [*args, f"--nproc={nproc}:{nproc}"]


def drop_user_args(uid: int) -> list[str]:
    """``setpriv`` options that become ``uid`` (its own group too) with no way back."""
    return [f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--inh-caps=-all", "--no-new-privs"]


class Isolation(abc.ABC):
    """One way of wrapping a program."""

    name: ClassVar[str]
    isolates_network: ClassVar[bool]
    needs_root: ClassVar[bool] = False
    tools: ClassVar[tuple[str, ...]] = ("setpriv", "prlimit")

    def missing(self) -> str | None:
        """Why this method cannot work here (a missing tool, not root), or None."""
        if self.needs_root and os.geteuid() != 0:
            return f"isolation {self.name!r} needs root (orchestra runs as uid {os.geteuid()})"
        for tool in self.tools:
            if _tool(tool) is None:
                return f"isolation {self.name!r} needs the {tool!r} program, which is not on PATH"
        return None

    def work_dir(self, slot_dir: str) -> str:
        """The program's work folder as the program sees it."""
        return os.path.join(slot_dir, "work")

    @abc.abstractmethod
    def command(self, job: SandboxProgram) -> SandboxLaunch:
        """The command that runs ``job`` under this isolation."""

    @abc.abstractmethod
    def describe(self, limits: SandboxLimits) -> str:
        """One line for the run log: what is isolated and what is not."""

    def after_exit(self, job: SandboxProgram) -> None:
        """Called when the program has ended, before its output is drained."""

    def setup_error(self, job: SandboxProgram, started: bool, returncode: int, stderr: bytes) -> str | None:
        """The wrapper's own error when the program was never started (``started``: the
        start byte arrived), else None: what a started program prints is never taken for
        the wrapper's."""
        if started:
            return None
        lines = [ln.strip() for ln in stderr.decode("utf-8", "replace").splitlines() if ln.strip()]
        tagged = [ln for ln in lines if job.nonce and ln.startswith(f"sandbox setup failed [{job.nonce}]")]
        reason = (tagged or lines or [f"the wrapper exited with status {returncode} and printed nothing"])[0]
        return reason[:500]


#: The wrapper's last step, as the sandbox user: check the program can be run, say so on the
#: start socket (standard input), run it.  ``$0`` is ``sh``, the program's argv follows.
START_SCRIPT = ('[ -x "$1" ] || { echo "sandbox: cannot execute $1" >&2; exit 127; }; '
                'printf s >&0 || exit 125; exec "$@"')


def start_then(argv: tuple[str, ...]) -> list[str]:
    """``argv`` behind the shell step that signals the start (:data:`START_SCRIPT`)."""
    return ["/bin/sh", "-c", START_SCRIPT, "sh", *argv]


def _setpriv() -> str:
    return _tool("setpriv") or "setpriv"


class BwrapIsolation(Isolation):
    """bubblewrap: namespaces, a read-only minimal root, a private tmpfs work folder."""

    name = "bwrap"
    isolates_network = True
    tools = ("bwrap", "setpriv", "prlimit")

    def work_dir(self, slot_dir: str) -> str:
        return BWRAP_WORK

    def command(self, job: SandboxProgram) -> SandboxLaunch:
        bwrap = _tool("bwrap") or "bwrap"
        args = [bwrap, "--die-with-parent", "--new-session", "--unshare-ipc", "--unshare-pid",
                "--unshare-net", "--unshare-uts", "--unshare-cgroup-try"]
        if job.uid is None:
            args.append("--unshare-user")
        for path in (*SYSTEM_PATHS, *job.extra_paths):
            if os.path.islink(path) and path in SYSTEM_PATHS:
                args += ["--symlink", os.readlink(path), path]
            elif os.path.isdir(path):
                args += ["--ro-bind", path, path]
        disk = job.limits.disk_mb * 1024 * 1024
        args += ["--proc", "/proc", "--dev", "/dev", "--perms", "1777", "--size", str(disk), "--tmpfs", BWRAP_WORK]
        for name in job.files:
            args += ["--ro-bind", os.path.join(job.src, name), f"{BWRAP_WORK}/{name}"]
        args += ["--chdir", BWRAP_WORK, "--clearenv"]
        for key, value in job.env.items():
            args += ["--setenv", key, value]
        limits = [_tool("prlimit") or "prlimit", *prlimit_args(job.limits, job.nproc), "--"]
        if job.uid is None:
            # Rootless: bubblewrap maps our own user into a user namespace; the limits
            # apply from the outside in.
            argv = [_setpriv(), "--pdeathsig", "KILL", "--", *limits, *args, "--", *start_then(job.argv)]
        else:
            # As root: bubblewrap builds the namespaces without a user namespace, and the
            # program drops to the slot's own uid inside, so RLIMIT_NPROC holds.
            argv = [_setpriv(), "--pdeathsig", "KILL", "--", *args, "--", _setpriv(), *drop_user_args(job.uid),
                    "--", *limits, *start_then(job.argv)]
        return SandboxLaunch(argv, {"PATH": "/usr/bin:/bin"})

    def describe(self, limits: SandboxLimits) -> str:
        return (f"bwrap (bubblewrap): own PID/network/IPC/UTS/cgroup/mount namespaces, loopback only and down; "
                f"sees /usr, /etc and the library folders read-only; private {limits.disk_mb} MB tmpfs work "
                "folder; no_new_privs")


def _launcher_python() -> str:
    """The interpreter of the launcher: the system one when there is one (it starts in half
    the time of a typical virtualenv's), else ours."""
    return "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else sys.executable


class UnshareIsolation(Isolation):
    """util-linux ``unshare`` and a small launcher: namespaces, every mount read-only."""

    name = "unshare"
    isolates_network = True
    needs_root = True
    tools = ("unshare", "setpriv")

    def work_dir(self, slot_dir: str) -> str:
        return UNSHARE_WORK

    def command(self, job: SandboxProgram) -> SandboxLaunch:
        assert job.uid is not None  # needs_root
        rlimits = {**job.limits.rlimits(), "NPROC": (job.nproc, job.nproc)}
        spec: dict[str, Any] = {"uid": job.uid, "gid": job.uid, "work": UNSHARE_WORK, "src": job.src,
                                "disk_bytes": job.limits.disk_mb * 1024 * 1024, "rlimits": rlimits,
                                "argv": list(job.argv), "env": job.env, "nonce": job.nonce}
        spec_path = os.path.join(job.slot_dir, "spec.json")
        fd = os.open(spec_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(spec, f)
        argv = [_setpriv(), "--pdeathsig", "KILL", "--", _tool("unshare") or "unshare", "--net", "--pid", "--mount",
                "--ipc", "--uts", "--fork", "--kill-child=SIGKILL", "--mount-proc", "--propagation", "private", "--",
                _launcher_python(), "-I", "-S", LAUNCHER, spec_path]
        return SandboxLaunch(argv, {"PATH": "/usr/bin:/bin"})

    def describe(self, limits: SandboxLimits) -> str:
        return (f"unshare: own PID/network/IPC/UTS/mount namespaces, loopback only and down; every host mount "
                f"read-only (host files visible where permissions allow); private {limits.disk_mb} MB tmpfs on /tmp as "
                "work folder; no_new_privs")


class NoIsolation(Isolation):
    """Limits and a user id only: no namespaces (opt-in)."""

    name = "none"
    isolates_network = False

    def command(self, job: SandboxProgram) -> SandboxLaunch:
        drop = drop_user_args(job.uid) if job.uid is not None else ["--no-new-privs"]
        argv = [_setpriv(), "--pdeathsig", "KILL", *drop, "--", _tool("prlimit") or "prlimit",
                *prlimit_args(job.limits, job.nproc), "--", *start_then(job.argv)]
        return SandboxLaunch(argv, dict(job.env), cwd=job.work)

    def after_exit(self, job: SandboxProgram) -> None:
        if job.uid is not None:
            kill_user(job.uid)

    def describe(self, limits: SandboxLimits) -> str:
        return ("none: NO network isolation, the host filesystem is visible (and writable where world-writable); "
                "resource limits, own session and user id only")


def user_processes(uid: int) -> list[int]:
    """Live processes whose real user is ``uid`` (read from ``/proc/<pid>/status``: the owner
    of ``/proc/<pid>`` is root for a process that changed its user)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status", "rb") as f:
                status = f.read()
        except OSError:
            continue
        uid_at = status.find(b"\nUid:")
        if uid_at < 0 or b"(zombie)" in status[:200]:
            continue
        if int(status[uid_at + 5:].split(None, 1)[0]) == uid:
            found.append(int(entry))
    return found


def kill_as_user(uid: int) -> None:
    """``kill(-1, SIGKILL)`` executed as ``uid`` itself: the kernel signals every process of
    that user in one step (under its task-list lock, so none can fork past it).  That user
    must belong to one sandbox slot alone (the slot uids do): its every process dies."""
    argv = [_setpriv(), f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--inh-caps=-all", "--",
            "/bin/sh", "-c", "kill -KILL -1"]
    try:
        subprocess.run(argv, env={"PATH": "/usr/bin:/bin"}, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, timeout=30, check=False)
    except (OSError, subprocess.SubprocessError):
        pass  # the sweep in kill_user still runs


def kill_user(uid: int, passes: int = 50) -> None:
    """SIGKILL every process of ``uid``: at once from inside the user (:func:`kill_as_user`),
    then, to be sure, by pid from ``/proc`` until none is left."""
    for attempt in range(passes):
        if attempt % 10 == 0:
            kill_as_user(uid)
        victims = user_processes(uid)  # also those SIGKILLed an instant ago and not yet gone
        if not victims:
            return
        for pid in victims:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


ISOLATIONS: dict[str, Isolation] = {m.name: m for m in (BwrapIsolation(), UnshareIsolation(), NoIsolation())}
