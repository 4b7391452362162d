"""The client side of managed replicas: which replica the next request goes to.

A task reads its model's live replicas from ``replicas.json`` (the pool rewrites it whenever the
set changes) and sends each request to the replica with the fewest requests of this process in
flight.  A replica on a Unix socket (vLLM's) is listed with its ``socket`` path; requests to it
go over that socket.  The file is in the run folder, so what it lists is checked before the key
is sent there: a loopback port (``http://127.0.0.1:PORT/v1``, nothing else in the address) on
which only this user listens, or a socket of this user in a ``sockets-*`` folder of the run's
private serving folder (where the key file is); where the launch placed replicas on a cluster
(Slurm, Ray), also a node's literal IPv4 address and port, which cannot be checked from here.  A
replica that refuses a connection is set aside until the file changes or a few seconds pass; the
request is retried on another one (a dead replica's requests go to the others).
"""

from __future__ import annotations

import ipaddress
import json
import os
import stat
import time
import urllib.parse
from dataclasses import dataclass

from orchestra.privdir import UnsafeFolderError, folder_problem, open_private_file
from orchestra.serving.presets import HOST

RELOAD_S = 0.5  #: how often the file is looked at (its mtime) while replicas are set aside
SET_ASIDE_S = 5.0  #: how long a replica that refused a connection is skipped


@dataclass
class Target:
    """One replica as a client sees it."""

    url: str
    socket: str = ""  # the Unix socket the replica listens on ("": it listens on ``url``'s port)
    in_flight: int = 0
    down_until: float = 0.0


def own_listeners(port: int) -> bool:
    """Whether something listens on 127.0.0.1:``port`` (or on every address) and each such socket
    is this user's (/proc/net/tcp and tcp6: a listener of another user must never get the key)."""
    wanted = {f"0100007F:{port:04X}", f"00000000:{port:04X}", f"{'0' * 32}:{port:04X}",
              f"0000000000000000FFFF00000100007F:{port:04X}"}
    uids: list[int] = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table, encoding="ascii") as fh:
                next(fh)
                for line in fh:
                    parts = line.split()
                    if len(parts) > 7 and parts[1] in wanted and parts[3] == "0A":
                        uids.append(int(parts[7]))
        except (OSError, ValueError, StopIteration):
            continue
    return bool(uids) and all(uid == os.geteuid() for uid in uids)


def own_socket(path: str, socket_root: str) -> bool:
    """Whether ``path`` is a Unix socket of this user in a private ``sockets-*`` folder directly
    in ``socket_root`` (the run's private serving folder; "": none is trusted)."""
    folder = os.path.dirname(path)
    if not socket_root or not os.path.isabs(path) or os.path.normpath(path) != path or \
            os.path.dirname(folder) != socket_root or not os.path.basename(folder).startswith("sockets-"):
        return False
    try:
        st = os.lstat(path)  # a symbolic link is not a socket: never followed
        private = folder_problem(socket_root) is None and folder_problem(folder) is None
    except OSError:
        return False
    return private and stat.S_ISSOCK(st.st_mode) and st.st_uid == os.geteuid()


def remote_address(netloc: str, port: int | None) -> bool:
    """Whether ``netloc`` is exactly ``A.B.C.D:PORT`` with a literal IPv4 address that is not a
    loopback one (a cluster node's own address; no name, no user part)."""
    host = netloc.rsplit(":", 1)[0]
    try:
        addr = ipaddress.IPv4Address(host)
    except ValueError:
        return False
    return port is not None and netloc == f"{addr}:{port}" and not addr.is_loopback and not addr.is_unspecified


def trusted(url: str, sock: str, socket_root: str, remote_ok: bool = False) -> bool:
    """Whether a replica listed as ``url`` (and ``sock``) may be sent the run's key.  A cluster
    node's address (``remote_ok``: the launch placed its replicas on Slurm or Ray) cannot be
    checked from here: it is trusted as listed, exactly an IPv4 address and a port."""
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError:
        return False
    if parts.scheme != "http" or not parts.path.startswith("/"):
        return False
    if sock:
        return parts.netloc == "localhost" and own_socket(sock, socket_root)
    if remote_ok and parts.path == "/v1" and remote_address(parts.netloc, port):
        return True
    return port is not None and parts.netloc == f"{HOST}:{port}" and own_listeners(port)


class ReplicaSet:
    """The replicas of one served model, for one task process (not thread-safe: one event loop).

    Args:
        path: the model's ``replicas.json``.
        socket_root: the run's private serving folder (the key file's), where replicas' sockets are.
        remote_ok: replicas may be on other machines (placed on a cluster): a node's address is
            accepted as listed (a loopback one is still checked).
    """

    def __init__(self, path: str, socket_root: str = "", remote_ok: bool = False) -> None:
        self.path = path
        self.socket_root = socket_root
        self.remote_ok = remote_ok
        self.targets: dict[str, Target] = {}
        self._mtime = -1.0
        self._looked = 0.0

    def _reload(self, now: float) -> None:
        if now - self._looked < RELOAD_S and self.targets:
            return
        self._looked = now
        try:
            mtime = os.stat(self.path).st_mtime
            if mtime == self._mtime:
                return
            # only the pool's own file (a regular file of this user, never through a link): a node's
            # address listed in it is trusted as listed
            with os.fdopen(open_private_file(self.path, os.O_RDONLY), encoding="utf-8") as fh:
                data = json.load(fh)
            found = [(str(r["url"]), str(r.get("socket") or "")) for r in data["replicas"]]
        except (OSError, ValueError, KeyError, TypeError, UnsafeFolderError):
            return
        # the rest never get the key
        found = [(u, s) for u, s in found if trusted(u, s, self.socket_root, self.remote_ok)]
        self._mtime = mtime
        self.targets = {s or u: self.targets.get(s or u) or Target(u, s) for u, s in found}
        for target in self.targets.values():
            target.down_until = 0.0  # the set changed: give every listed replica another chance

    def pick(self) -> Target | None:
        """The live replica with the fewest requests in flight (None: none is listed)."""
        now = time.monotonic()
        self._reload(now)
        up = [t for t in self.targets.values() if t.down_until <= now]
        if not up:
            up = list(self.targets.values())
        if not up:
            return None
        best = min(up, key=lambda t: t.in_flight)
        best.in_flight += 1
        return best

    def done(self, target: Target, refused: bool = False) -> None:
        """A request to ``target`` is over; ``refused``: it could not connect (set it aside)."""
        target.in_flight = max(0, target.in_flight - 1)
        if refused:
            target.down_until = time.monotonic() + SET_ASIDE_S
