"""The client side of managed replicas: which replica the next request goes to.

A task reads its model's live replicas from ``replicas.json`` (plain ``http://`` addresses: 127.0.0.1, or a
cluster node's own address where replicas are placed on Slurm or Ray; the pool rewrites it whenever the
set changes) and sends each request to the replica with the fewest requests of this process in
flight.  A replica on a Unix socket (vLLM's) is listed with its ``socket`` path; requests to it
go over that socket.  A replica that refuses a connection is set aside until the file changes or
a few seconds pass; the request is retried on another one (a dead replica's requests go to the
others).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass

RELOAD_S = 0.5  #: how often the file is looked at (its mtime) while replicas are set aside
SET_ASIDE_S = 5.0  #: how long a replica that refused a connection is skipped


@dataclass
class Target:
    """One replica as a client sees it."""

    url: str
    socket: str = ""  # the Unix socket the replica listens on ("": it listens on ``url``'s port)
    in_flight: int = 0
    down_until: float = 0.0


class ReplicaSet:
    """The replicas of one served model, for one task process (not thread-safe: one event loop)."""

    def __init__(self, path: str) -> None:
        self.path = path
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
            with open(self.path, encoding="utf-8") as fh:
                data = json.load(fh)
            found = [(str(r["url"]), str(r.get("socket") or "")) for r in data["replicas"]]
        except (OSError, ValueError, KeyError, TypeError):
            return
        # only plain http:// addresses (127.0.0.1, or a cluster node's own address), or sockets
        # given by absolute path, are ever sent the key
        found = [(u, s) for u, s in found
                 if (os.path.isabs(s) and u.startswith("http://localhost/")) or (not s and u.startswith("http://"))]
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
