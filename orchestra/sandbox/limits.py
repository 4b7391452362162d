"""The limits every sandboxed program runs under, in one validated value."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class SandboxLimits:
    """What one sandboxed program may use.

    Args:
        timeout_s: wall-clock time from start to exit; the whole sandbox is killed after it.
        cpu_s: CPU seconds of each of its processes (``RLIMIT_CPU``; default ``timeout_s``).
        mem_mb: address space of each of its processes (``RLIMIT_AS``).
        max_processes: processes and threads its user may have at once (``RLIMIT_NPROC``).
        max_output_bytes: bytes of stdout and of stderr kept; a program that writes more is
            killed and scored as failed.
        disk_mb: size of its private temp dir (a tmpfs under namespace isolation) and the
            largest file it may write (``RLIMIT_FSIZE``).
        max_open_files: open file descriptors per process (``RLIMIT_NOFILE``).
    """

    timeout_s: float = 10.0
    cpu_s: float | None = None
    mem_mb: int = 1024
    max_processes: int = 32
    max_output_bytes: int = 64 * 1024
    disk_mb: int = 64
    max_open_files: int = 256

    def __post_init__(self) -> None:
        for name in ("timeout_s", "cpu_s"):
            value = getattr(self, name)
            if value is None and name == "cpu_s":
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
                raise ValueError(f"{name} must be a number > 0 and finite, got {value!r}")
        for name in ("mem_mb", "max_processes", "max_output_bytes", "disk_mb", "max_open_files"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if self.mem_mb < 64:
            raise ValueError(f"mem_mb must be >= 64 (an interpreter needs that much), got {self.mem_mb}")
        if self.max_open_files < 16:
            raise ValueError(f"max_open_files must be >= 16, got {self.max_open_files}")

    @property
    def cpu_seconds(self) -> int:
        """Whole CPU seconds for ``RLIMIT_CPU`` (rounded up; at least 1)."""
        value = self.cpu_s if self.cpu_s is not None else self.timeout_s
        return max(1, int(-(-value // 1)))

    def rlimits(self) -> dict[str, tuple[int, int]]:
        """``RLIMIT_*`` name -> (soft, hard); ``NPROC`` is added by the isolation method."""
        cpu = self.cpu_seconds
        mem = self.mem_mb * 1024 * 1024
        disk = self.disk_mb * 1024 * 1024
        return {
            "AS": (mem, mem),
            # SIGXCPU at the soft limit, SIGKILL one second later.
            "CPU": (cpu, cpu + 1),
            "FSIZE": (disk, disk),
            "NOFILE": (self.max_open_files, self.max_open_files),
            "CORE": (0, 0),
        }

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "cpu_s": self.cpu_seconds}
