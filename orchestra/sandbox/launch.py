"""Inside fresh namespaces, as root: make the filesystem read-only, drop to the sandbox user, run.

The ``unshare`` isolation method starts ``unshare --net --pid --mount --ipc --uts --fork
--mount-proc -- python -I -S launch.py SPEC``; this script is then process 1 of a new PID
namespace, in a private mount namespace, still root.  It

1. remounts every mount read-only (keeping each mount's nosuid/nodev/noexec flags),
2. mounts a size-limited tmpfs, owned by the sandbox user, on ``/tmp`` (its work folder)
   and copies the program's files into it,
3. forks the program: resource limits, no supplementary groups, the sandbox user's gid and
   uid, ``no_new_privs``, one byte on its standard input (the start socket: the program is
   being started, see :mod:`orchestra.sandbox.isolation`), then ``execve`` with exactly the
   given environment,
4. reaps every process until the program exits and exits with its status (``128 + signal``
   when it was killed).  When process 1 exits, the kernel kills the rest of the namespace.

It is run as a script by path and imports only the standard library.  When the sandbox could
not be set up it exits 125 with one line on stderr, tagged with the spec's ``nonce`` (which
the program cannot read), and the start byte was never written: that, not the line, is how
the caller knows the program never ran.
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import sys
from typing import Any

MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_NOATIME = 1024
MS_NODIRATIME = 2048
MS_BIND = 4096
MS_RELATIME = 1 << 21
MS_STRICTATIME = 1 << 24
PR_SET_NO_NEW_PRIVS = 38
SETUP_FAILED = 125

_FLAGS = {
    "nosuid": MS_NOSUID,
    "nodev": MS_NODEV,
    "noexec": MS_NOEXEC,
    "noatime": MS_NOATIME,
    "nodiratime": MS_NODIRATIME,
    "relatime": MS_RELATIME,
    "strictatime": MS_STRICTATIME,
}
_LIBC = ctypes.CDLL(None, use_errno=True)
_NONCE = [""]


def fail(message: str) -> None:
    sys.stderr.write(f"sandbox setup failed [{_NONCE[0]}]: {message}\n")
    sys.stderr.flush()
    os._exit(SETUP_FAILED)


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None) -> None:
    enc = [None if v is None else v.encode() for v in (source, target, fstype, data)]
    if _LIBC.mount(enc[0], enc[1], enc[2], ctypes.c_ulong(flags), enc[3]) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {target}: {os.strerror(err)}")


def unescape(path: str) -> str:
    # mountinfo writes space, tab, newline and backslash as octal escapes
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        path = path.replace(code, char)
    return path


def read_only_everywhere() -> None:
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        lines = f.read().splitlines()
    for line in lines:
        fields = line.split()
        target, options = unescape(fields[4]), fields[5].split(",")
        if "ro" in options:
            continue
        flags = MS_BIND | MS_REMOUNT | MS_RDONLY
        for opt in options:
            flags |= _FLAGS.get(opt, 0)
        try:
            mount(None, target, None, flags, None)
        except OSError as exc:
            # Mounts under the old /proc are hidden by the fresh /proc and cannot be
            # reached by path; everything else must become read-only or we refuse to run.
            if (target == "/proc" or target.startswith("/proc/")) and exc.errno in (2, 22):
                continue
            raise


def run_child(spec: dict[str, Any]) -> None:
    os.chdir(spec["work"])
    for name, (soft, hard) in spec["rlimits"].items():
        resource.setrlimit(getattr(resource, "RLIMIT_" + name), (soft, hard))
    os.setgroups([])
    os.setresgid(spec["gid"], spec["gid"], spec["gid"])
    os.setresuid(spec["uid"], spec["uid"], spec["uid"])
    if _LIBC.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
    argv = spec["argv"]
    if not os.access(argv[0], os.X_OK):
        raise OSError(f"cannot execute {argv[0]}")
    os.write(0, b"s")  # from here on, whatever happens is the program's doing
    os.execve(argv[0], argv, spec["env"])


def main() -> None:
    with open(sys.argv[1], encoding="utf-8") as f:
        spec = json.load(f)
    _NONCE[0] = spec["nonce"]
    try:
        read_only_everywhere()
        files = {}
        for name in os.listdir(spec["src"]):
            with open(os.path.join(spec["src"], name), "rb") as f:
                files[name] = f.read()
        # The work folder is a fresh tmpfs on /tmp (world-traversable, hiding the host's
        # /tmp); the source folder may lie under it, so the files were read first.
        work = spec["work"]
        opts = f"size={spec['disk_bytes']},mode=0700,uid={spec['uid']},gid={spec['gid']}"
        mount("tmpfs", work, "tmpfs", MS_NOSUID | MS_NODEV, opts)
        for name, data in files.items():
            with open(os.path.join(work, name), "wb") as f:
                f.write(data)
            os.chmod(os.path.join(work, name), 0o444)
    except OSError as exc:
        fail(str(exc))
    pid = os.fork()
    if pid == 0:
        try:
            run_child(spec)
        except BaseException as exc:  # noqa: BLE001 - any failure before exec is a setup failure
            fail(f"{type(exc).__name__}: {exc}")
        os._exit(SETUP_FAILED)
    while True:
        try:
            done, status = os.wait()
        except ChildProcessError:
            os._exit(SETUP_FAILED)
        if done == pid:
            if os.WIFSIGNALED(status):
                os._exit(128 + os.WTERMSIG(status))
            os._exit(os.WEXITSTATUS(status))


if __name__ == "__main__":
    main()
