"""GPU utilisation while a stage runs on this machine: ``nvidia-smi`` sampled into ``gpu.jsonl``.

One long-lived ``nvidia-smi --query-gpu=... -lms <period>`` child per run folder, started by
the first local launch that hands out GPUs and stopped (its process group, as every child of
the runner) when the last such launch ends, on Ctrl-C or on an error; it dies with the
orchestrator even by SIGKILL.  A reader thread turns its CSV lines into one JSON line per GPU
and sample; a line it cannot read is skipped.  No NVML or ML import: the orchestrator only
runs the command-line tool, and where there is none nothing is started and nothing written.
The tool writes each sample's lines at once even into a pipe (seen on an H200, driver's
nvidia-smi, ``-lms 200``), so a record's time is when its line was read.

A record: ``{"t": unix time, "gpu": index, "util": 0..100, "mem_mib": used}`` (memory only
where the tool gave it); a sampler's first record of a GPU also holds its ``"uuid"`` and
``"mem_total_mib"`` (once: a long run's file stays small, ~55 bytes a sample).
"""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from orchestra.fileio import append_line
from orchestra.paths import RunPaths
from orchestra.runners.core.proc import start_group, stop_groups

QUERY = "index,uuid,utilization.gpu,memory.used,memory.total"
#: the smallest and largest sampling period accepted (``gpu_sample_s``; 0 turns sampling off)
MIN_PERIOD_S, MAX_PERIOD_S = 0.05, 3600.0
_MAX_LINE = 1024  # bytes; a longer "line" is not nvidia-smi's and is dropped
_MAX_MIB = 1 << 24  # 16 TiB: more memory than this on one GPU is a garbled value
_UUID = re.compile(r"(GPU|MIG)-[A-Za-z0-9-]{1,80}")
_INDEX = re.compile(r"[0-9]{1,4}")
_NUMBER = re.compile(r"-?[0-9]{1,12}(\.[0-9]{1,6})?")  # ASCII only: no "1_000", "١", "nan", "1e999"


def check_period(value: Any) -> float:
    """``gpu_sample_s`` as a float, or ValueError saying what is valid."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or not (
            value == 0 or MIN_PERIOD_S <= value <= MAX_PERIOD_S):
        raise ValueError(f"gpu_sample_s must be 0 (off) or a number of seconds from {MIN_PERIOD_S} "
                         f"to {MAX_PERIOD_S:g}, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class GpuSample:
    """One GPU's line of one ``nvidia-smi`` sample."""

    index: int
    uuid: str
    util: int
    mem_mib: int | None
    mem_total_mib: int | None

    def record(self, t: float, first: bool = True) -> dict[str, Any]:
        """The JSON record; ``first`` (a sampler's first of this GPU) adds what does not change."""
        rec: dict[str, Any] = {"t": round(t, 3), "gpu": self.index, "util": self.util}
        if first and self.uuid:
            rec["uuid"] = self.uuid
        if self.mem_mib is not None:
            rec["mem_mib"] = self.mem_mib
        if first and self.mem_total_mib is not None:
            rec["mem_total_mib"] = self.mem_total_mib
        return rec


def _number(text: str) -> float | None:
    """A plain decimal number, or None ("[N/A]", "[Not Supported]", garbage)."""
    return float(text) if _NUMBER.fullmatch(text) else None


def parse_line(line: str) -> GpuSample | None:
    """A sample from one line of ``--format=csv,noheader,nounits`` output
    (``0, GPU-4b2c..., 37, 1234, 143771``), or None for anything else.

    Utilisation is clamped to 0..100 and memory to 0..16 TiB; a line without an index or a
    utilisation number is skipped, a memory field the GPU does not report is left out.
    """
    fields = [f.strip() for f in line.strip().split(",")]
    if len(fields) != 5 or not _INDEX.fullmatch(fields[0]):
        return None
    uuid = fields[1] if _UUID.fullmatch(fields[1]) else ""
    util = _number(fields[2])
    if util is None:
        return None
    mem = [_number(f) for f in fields[3:]]
    used, total = (None if m is None else int(min(max(m, 0.0), _MAX_MIB)) for m in mem)
    if used is not None and total is not None and used > total:
        used = total
    return GpuSample(int(fields[0]), uuid, int(round(min(max(util, 0.0), 100.0))), used, total)


def watched(gpu_ids: Sequence[str]) -> set[str] | None:
    """The GPUs to record, as ids ``nvidia-smi`` reports (index or UUID); None: every GPU
    (an id such as a MIG instance that the tool's index and UUID columns do not name)."""
    ids = {g.strip() for g in gpu_ids}
    if all(g.isdigit() or g.startswith("GPU-") for g in ids):
        return ids
    return None


class GpuSampler:
    """The ``nvidia-smi`` child of one run folder and the thread that records its lines."""

    def __init__(self, exe: str, paths: RunPaths, gpu_ids: Sequence[str], period_s: float) -> None:
        self.out_path = paths.gpu_samples
        self.wanted = watched(gpu_ids)
        self._named: set[int] = set()  # GPUs whose first record (uuid, total memory) is written
        period_ms = str(max(1, round(period_s * 1000)))
        argv = [exe, f"--query-gpu={QUERY}", "--format=csv,noheader,nounits", "-lms", period_ms]
        self.proc = start_group(argv, {}, paths.gpu_sampler_log, stdout=subprocess.PIPE)
        self._reader = threading.Thread(target=self._read, name="gpu-sampler", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        out = self.proc.stdout
        assert out is not None
        skipping = False  # inside an over-long line: drop up to its newline
        try:
            while True:
                raw = out.readline(_MAX_LINE)
                if not raw:
                    return
                whole = raw.endswith(b"\n")
                if not skipping and whole:
                    self._record(raw.decode("utf-8", "replace"))
                skipping = not whole
        except (OSError, ValueError):  # the pipe closed under us at stop
            return

    def _record(self, line: str) -> None:
        sample = parse_line(line)
        if sample is None:
            return
        if self.wanted is not None and str(sample.index) not in self.wanted and sample.uuid not in self.wanted:
            return
        try:
            rec = sample.record(time.time(), first=sample.index not in self._named)
            append_line(self.out_path, json.dumps(rec, separators=(",", ":")).encode() + b"\n")
            self._named.add(sample.index)
        except OSError:
            pass  # a full disk loses samples, never the run

    def stop(self, grace_s: float = 2.0) -> None:
        """Stop the child's process group and let the reader finish the lines already sent."""
        stop_groups([self.proc], grace_s)
        self._reader.join(timeout=5)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


_lock = threading.Lock()
_shared: dict[str, tuple[GpuSampler, int]] = {}  # gpu.jsonl path -> its sampler, launches using it


def acquire(paths: RunPaths, gpu_ids: Sequence[str], period_s: float) -> str | None:
    """Start (or share) the sampler of ``paths``' run for a launch that hands out ``gpu_ids``;
    the key to :func:`release`, or None when nothing was started (off, no GPU, no nvidia-smi)."""
    if period_s <= 0 or not gpu_ids:
        return None
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    key = paths.gpu_samples
    with _lock:
        if key in _shared:
            sampler, users = _shared[key]
            _shared[key] = (sampler, users + 1)
            return key
        try:
            _shared[key] = (GpuSampler(exe, paths, gpu_ids, period_s), 1)
        except OSError:
            return None  # the tool is there but will not start: the run goes on unsampled
        return key


def release(key: str | None) -> None:
    """End one launch's use of a sampler; the last one stops it."""
    if key is None:
        return
    with _lock:
        entry = _shared.get(key)
        if entry is None:
            return
        sampler, users = entry
        if users > 1:
            _shared[key] = (sampler, users - 1)
            return
        del _shared[key]
    sampler.stop()
