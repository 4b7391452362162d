"""Units of GPU sampling: the ``nvidia-smi`` line parser against hostile lines, the period
check, which GPUs are kept, and reading ``gpu.jsonl`` back for the report (hostile records,
downsampling, the busy mean over the infer stage)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestra.paths import RunPaths
from orchestra.runners.local import gpumon
from orchestra.runners.local.gpumon import GpuSample, check_period, parse_line, watched
from orchestra.summary.gpu import GpuSeries, busy_pct, downsample, read_gpu_series

REAL = b"0, GPU-af50d7fa-987f-78de-7431-576a712a7454, 3, 1011, 143771\n"  # an H200's nvidia-smi, piped


def test_a_real_nvidia_smi_line_parses() -> None:
    assert parse_line(REAL.decode()) == GpuSample(0, "GPU-af50d7fa-987f-78de-7431-576a712a7454", 3, 1011, 143771)
    assert parse_line("7, MIG-0a1b2c3d-0000-1111-2222-333344445555, 100, 0, 40326") == GpuSample(
        7, "MIG-0a1b2c3d-0000-1111-2222-333344445555", 100, 0, 40326)


@pytest.mark.parametrize("line", [
    "", "\n", "No devices were found", "index, uuid, utilization.gpu [%], memory.used [MiB], memory.total [MiB]",
    "0, GPU-a, [N/A], 1, 2", "0, GPU-a, [Not Supported], 1, 2", "0, GPU-a, nan, 1, 2", "0, GPU-a, inf, 1, 2",
    "0, GPU-a, 1e999, 1, 2", "0, GPU-a, 1_0, 1, 2", "0, GPU-a, \u0661\u0662, 1, 2", "\u0661, GPU-a, 5, 1, 2",
    "-1, GPU-a, 5, 1, 2", "12345, GPU-a, 5, 1, 2", "x, GPU-a, 5, 1, 2", "0, GPU-a, 5, 1", "0, GPU-a, 5, 1, 2, 3",
    "0 GPU-a 5 1 2", "\x00\x1b[2J, GPU-a, 5, 1, 2", "0, GPU-a, 99999999999999999999, 1, 2",
])
def test_a_line_that_is_not_a_sample_is_skipped(line: str) -> None:
    assert parse_line(line) is None


def test_values_are_clamped_and_a_strange_uuid_or_memory_is_dropped() -> None:
    assert parse_line("1, GPU-x, 250, 999999, 143771") == GpuSample(1, "GPU-x", 100, 143771, 143771)
    assert parse_line("1, GPU-x, -20, -5, 99999999999") == GpuSample(1, "GPU-x", 0, 0, 1 << 24)
    assert parse_line("1, <script>, 37.6, [N/A], [N/A]") == GpuSample(1, "", 38, None, None)
    assert parse_line("2, GPU-y, 5, 10, [N/A]") == GpuSample(2, "GPU-y", 5, 10, None)
    assert GpuSample(1, "", 38, None, None).record(1.0) == {"t": 1.0, "gpu": 1, "util": 38}


@pytest.mark.parametrize("value", [-1, 0.01, 1e9, float("nan"), float("inf"), True, "1", None])
def test_a_bad_period_says_what_is_valid(value: object) -> None:
    with pytest.raises(ValueError, match=r"gpu_sample_s must be 0 \(off\) or a number of seconds from 0.05"):
        check_period(value)


def test_good_periods() -> None:
    assert check_period(0) == 0.0 and check_period(1) == 1.0 and check_period(0.05) == 0.05


def test_only_the_runners_gpus_are_kept_unless_it_names_them_otherwise() -> None:
    assert watched(["0", "2"]) == {"0", "2"}
    assert watched(["GPU-abc", "1"]) == {"GPU-abc", "1"}
    assert watched(["MIG-1/2/3"]) is None  # not a name the tool's columns give: keep every GPU


def test_nothing_starts_without_nvidia_smi_or_gpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    paths = RunPaths(str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert gpumon.acquire(paths, ["0"], 1.0) is None
    monkeypatch.undo()
    assert gpumon.acquire(paths, [], 1.0) is None
    assert gpumon.acquire(paths, ["0"], 0.0) is None
    assert not (tmp_path / "gpu.jsonl").exists()


def test_gpu_jsonl_is_read_as_untrusted(tmp_path: Path) -> None:
    good = [{"t": 100.0 + i, "gpu": 0, "util": 10 * i} for i in range(5)]
    hostile = ['{"t": 1, "gpu": "0", "util": 5}', '{"t": 1, "gpu": true, "util": 5}', '{"t": NaN, "gpu": 0, "util": 5}',
               '{"t": 1, "gpu": 0, "util": "high"}', '[1, 2]', '{"t": 1, "gpu": -1, "util": 5}', "torn {",
               '{"t": 50, "gpu": 1, "util": 1e308, "mem_mib": -7}']
    lines = [json.dumps(r) for r in good[3:]] + hostile + [json.dumps(r) for r in good[:3]]  # out of order
    (tmp_path / "gpu.jsonl").write_text("\n".join(lines) + "\n")
    (s0, s1) = read_gpu_series(RunPaths(str(tmp_path)))
    assert s0.gpu == 0 and s0.t == [100.0, 101.0, 102.0, 103.0, 104.0] and s0.util == [0, 10, 20, 30, 40]
    assert s1.gpu == 1 and s1.util == [100.0] and s1.mem_mib == [0.0]
    assert busy_pct(s0, 101.0, 103.0) == 20.0 and busy_pct(s0, 0, 1) is None
    assert read_gpu_series(RunPaths(str(tmp_path / "missing"))) == []
    with open(tmp_path / "gpu.jsonl", "a") as f:  # a file that grew is read again, not served from the cache
        f.write(json.dumps({"t": 200.0, "gpu": 0, "util": 90}) + "\n")
    assert read_gpu_series(RunPaths(str(tmp_path)))[0].util[-1] == 90


def test_downsampling_keeps_the_mean_and_the_peak_memory() -> None:
    n = 10_001
    s = GpuSeries(3, [float(i) for i in range(n)], [100.0 if i % 2 else 0.0 for i in range(n)],
                  [float(i) for i in range(n)])
    d = downsample(s, 2000)
    assert len(d.t) == len(d.util) == len(d.mem_mib) == 2000
    assert d.t == sorted(d.t) and d.t[0] >= 0 and d.t[-1] <= n - 1
    assert abs(sum(d.util) / len(d.util) - 50.0) < 1.0
    assert d.mem_mib[-1] == n - 1
    assert downsample(GpuSeries(0, [1.0], [5.0], [None])).util == [5.0]
