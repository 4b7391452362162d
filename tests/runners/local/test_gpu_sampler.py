"""The GPU sampler's lifecycle through the real CLI, with a DOUBLE of the ``nvidia-smi`` CLI.

This machine has no GPU, so a small bash script named ``nvidia-smi`` is put first on PATH: it
checks that it was called with the query, format and ``-lms`` flags the sampler uses, records
its pid, and prints lines in the real ``--format=csv,noheader,nounits`` shape (plus hostile
ones) until it is killed.  The runner is given GPU ids ``0,1`` with ``gpus=[...]``, as on a GPU
box, and the model asks for one GPU per task.  What the real tool prints is checked on a GPU
machine separately; what is checked here is the orchestrator's side: one long-lived child per
run, gone after the run and after Ctrl-C, its lines in ``gpu.jsonl`` and in the report.
"""

from __future__ import annotations

import json
import os
import re
import signal
import stat
import statistics
import time
from pathlib import Path

import pytest

from tests.helpers import alive, run_cli, run_dirs, start_cli
from tests.report.chromium import Chromium, ChromiumMissing

NVIDIA_SMI_DOUBLE = r"""#!/bin/bash
# A stand-in for the nvidia-smi CLI (a test double), not the real tool.
echo "$$ $*" >> "$SMI_DOUBLE_LOG"
case " $* " in
  *" --query-gpu=index,uuid,utilization.gpu,memory.used,memory.total --format=csv,noheader,nounits -lms "*) ;;
  *) echo "nvidia-smi double: unexpected arguments: $*" >&2; exit 3 ;;
esac
head -c 5000 /dev/zero | tr '\0' x; echo            # a line far too long: dropped
i=0
while true; do
  echo "0, GPU-11111111-2222-3333-4444-555555555555, $((i % 101)), 1234, 143771"
  echo "1, GPU-66666666-7777-8888-9999-000000000000, 250, 999999, 143771"   # clamped
  echo "2, GPU-aaaaaaaa-0000-0000-0000-000000000000, 50, 1, 1"              # not handed out
  echo "0, GPU-11111111-2222-3333-4444-555555555555, [N/A], 1, 1"           # no utilisation
  echo "garbage, <script>alert(1)</script>"
  i=$((i + 7))
  sleep 0.05
done
"""


def _double(tmp_path: Path) -> dict[str, str]:
    """The environment of a CLI that finds the double first on PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text(NVIDIA_SMI_DOUBLE)
    smi.chmod(smi.stat().st_mode | stat.S_IXUSR)
    return {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
            "SMI_DOUBLE_LOG": str(tmp_path / "smi-calls.log")}


def _config(tmp_path: Path, delay_s: float, runner: str = "", num_gpus: int = 1, rows: int = 12) -> Path:
    data = tmp_path / "arith.jsonl"
    data.write_text("".join(json.dumps({"question": f"{i} + {i}?", "answer": str(2 * i)}) + "\n"
                            for i in range(rows)))
    cfg = tmp_path / "cfg.py"
    cfg.write_text(f"""
from orchestra.datasets import JsonlDataset
from orchestra.models import DeterministicModel
from orchestra.partitioners import SizePartitioner
from orchestra.runners import LocalRunner
from orchestra.tasks import InferTask

models = [dict(type=DeterministicModel, abbr='det', batch_size=2, delay_s={delay_s},
               run_cfg=dict(num_gpus={num_gpus}))]
datasets = [dict(type=JsonlDataset, abbr='arith', path={str(data)!r},
                 reader_cfg=dict(input_columns=['question'], output_column='answer'),
                 infer_cfg=dict(prompt_template='Q: {{question}}', inferencer=dict(type='gen', max_out_len=8)),
                 eval_cfg=dict(evaluator='numeric_match'))]
infer = dict(partitioner=dict(type=SizePartitioner, max_task_size=4, gen_task_coef=1),
             runner=dict(type=LocalRunner, gpus=['0', '1'], reuse_workers=True{runner}, task=dict(type=InferTask)))
work_dir = {str(tmp_path / 'out')!r}
""")
    return cfg


def _double_pids(tmp_path: Path) -> list[int]:
    log = tmp_path / "smi-calls.log"
    """Pids of the double's sampling calls (the eval runner's GPU detection calls ``-L`` too)."""
    lines = log.read_text().splitlines() if log.exists() else []
    return [int(line.split()[0]) for line in lines if "--query-gpu" in line]


def _gone_soon(pid: int, within_s: float = 5.0) -> bool:
    deadline = time.monotonic() + within_s
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not alive(pid)


@pytest.fixture(scope="module")
def sampled(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A finished run sampled by the double: (its test folder, its run folder)."""
    tmp_path = tmp_path_factory.mktemp("sampled")
    res = run_cli(_config(tmp_path, delay_s=0.4, runner=", gpu_sample_s=0.1"), env=_double(tmp_path))
    assert res.returncode == 0, res.stderr
    (run,) = run_dirs(tmp_path / "out")
    return tmp_path, run


def test_sampler_double_writes_gpu_jsonl_is_gone_after_the_run_and_the_report_has_lanes(
        sampled: tuple[Path, Path]) -> None:
    tmp_path, run = sampled
    pids = _double_pids(tmp_path)
    assert len(pids) == 1, "one long-lived sampler per run, not one per task or poll"
    assert not alive(pids[0]), "the nvidia-smi child outlived the run"

    records = [json.loads(line) for line in (run / "gpu.jsonl").read_text().splitlines()]
    assert {r["gpu"] for r in records} == {0, 1}  # GPU 2 is not the runner's; junk lines skipped
    assert all(set(r) <= {"t", "gpu", "uuid", "util", "mem_mib", "mem_total_mib"} for r in records)
    assert [r["uuid"] for r in records if "uuid" in r] == ["GPU-11111111-2222-3333-4444-555555555555",
                                                          "GPU-66666666-7777-8888-9999-000000000000"]
    gpu0 = [r["util"] for r in records if r["gpu"] == 0]
    assert len(gpu0) >= 5 and len(set(gpu0)) > 1 and all(0 <= u <= 100 for u in gpu0)
    assert {r["util"] for r in records if r["gpu"] == 1} == {100}  # 250 clamped
    assert [r["mem_total_mib"] for r in records if "mem_total_mib" in r] == [143771, 143771]
    assert all(r["mem_mib"] <= 143771 for r in records)
    started = json.loads((run / "events.jsonl").read_text().splitlines()[0])["ts"]
    assert all(started - 5 <= r["t"] <= time.time() for r in records)

    html = (run / "summary/report.html").read_text()
    timeline = json.loads(re.search(r'id="timeline-data">(.*?)</script>', html, re.S).group(1))
    lanes = timeline["gpu"]
    assert lanes["gpus"] == [0, 1] and all(len(ts) == len(us) > 0 for ts, us in zip(lanes["t"], lanes["util"]))
    assert re.search(r'id="gpu-busy"><b>GPU 0 \d+%, GPU 1 100%</b>', html)
    assert "alert(1)" not in html
    trace = json.loads((run / "summary/trace.json").read_text())
    assert {e["name"] for e in trace["traceEvents"] if e["ph"] == "C"} >= {"GPU 0 busy %", "GPU 1 busy %"}


def test_the_report_draws_one_filled_lane_per_gpu_in_a_browser(sampled: tuple[Path, Path]) -> None:
    _, run = sampled
    html = (run / "summary/report.html").read_text()
    timeline = json.loads(re.search(r'id="timeline-data">(.*?)</script>', html, re.S).group(1))
    lo = min(a[2] for a in timeline["attempts"])  # the view (one invocation): first start to last end
    hi = max(a[2] + a[3] for a in timeline["attempts"])
    means = [statistics.mean(u for t, u in zip(ts, us) if lo <= t <= hi)
             for ts, us in zip(timeline["gpu"]["t"], timeline["gpu"]["util"])]
    try:
        browser = Chromium()
    except ChromiumMissing as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        browser.open(str(run / "summary/report.html"))
        browser.wait_for("+document.getElementById('tl').dataset.bars > 0")
        lanes = browser.eval("orchestraTimeline.gpuLanes()")
        assert [lane["gpu"] for lane in lanes] == [0, 1]
        assert all(abs(lane["mean"] - m) < 1e-6 for lane, m in zip(lanes, means)), (lanes, means)
        assert lanes[1]["label"] == "GPU 1 busy 100%" and lanes[0]["label"] == f"GPU 0 busy {lanes[0]['mean']:.0f}%"
        # the lanes sit below the task bars, within the plot's width, and inside the canvas in sight
        bars = browser.eval("orchestraTimeline.bars()")
        assert lanes[0]["y"] >= max(b["y"] + b["h"] for b in bars) and lanes[1]["y"] == lanes[0]["y"] + lanes[0]["h"]
        assert all(lane["points"] > 2 and 190 <= lane["x0"] < lane["x1"] <= max(b["x"] + b["w"] for b in bars) + 50
                   for lane in lanes)
        assert browser.eval("document.getElementById('tl').clientHeight") >= lanes[1]["y"] + lanes[1]["h"]
        # what the canvas shows, per lane: one pixel row 3 px above the base across the area, and the
        # label column at mid-height
        rows = browser.eval("""(() => { const c = document.getElementById('tl'), w = document.getElementById('tl-wrap');
            const ctx = c.getContext('2d'), r = window.devicePixelRatio || 1;
            const px = (x, y) => [...ctx.getImageData(Math.round((x - w.scrollLeft) * r),
                                                      Math.round((y - w.scrollTop) * r), 1, 1).data].slice(0, 3);
            return orchestraTimeline.gpuLanes().map(l => {
              const area = [], label = [];
              for (let x = Math.ceil(l.x0) + 2; x < l.x1 - 2; x++) area.push(px(x, l.base - 3));
              for (let x = 6; x < 150; x++) label.push(px(x, l.y + l.h / 2));
              return [area, label, px(l.x0 + (l.x1 - l.x0) / 2, l.y + l.h / 2)]; }); })()""")
        fill, background = [0x7A, 0xC3, 0x88], [0xEB, 0xFB, 0xEE]
        for n, (area, label, _) in enumerate(rows):
            assert len(area) > 20 and sum(p == fill for p in area) > 0.3 * len(area), (n, area)
            assert any(max(p) < 120 for p in label), (n, "no label text drawn")
            assert sum(p == background for p in label) > 0.5 * len(label), (n, "no lane background")
        assert rows[1][2] == fill  # GPU 1 is 100% busy: its area fills the lane's middle
        assert sum(p == fill for p in rows[1][0]) > 0.9 * len(rows[1][0])
        assert browser.console == [], browser.console
    finally:
        browser.close()


def test_ctrl_c_stops_the_sampler_double_with_the_run(tmp_path: Path) -> None:
    env = _double(tmp_path)
    proc = start_cli(_config(tmp_path, delay_s=3.0, runner=", gpu_sample_s=0.1"), env=env, new_session=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not list((tmp_path / "out").glob("*/gpu.jsonl")):
            time.sleep(0.1)
        assert list((tmp_path / "out").glob("*/gpu.jsonl")), "no samples before the deadline"
        (pid,) = _double_pids(tmp_path)
        assert alive(pid)
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
        assert _gone_soon(pid), "the nvidia-smi child outlived Ctrl-C"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_no_sampler_when_off_or_when_no_task_asks_for_a_gpu(tmp_path: Path) -> None:
    env = _double(tmp_path)
    off = tmp_path / "off"
    off.mkdir()
    assert run_cli(_config(off, delay_s=0.0, runner=", gpu_sample_s=0", rows=4), env=env).returncode == 0
    cpu = tmp_path / "cpu"
    cpu.mkdir()
    assert run_cli(_config(cpu, delay_s=0.0, num_gpus=0, rows=4), env=env).returncode == 0
    assert _double_pids(tmp_path) == []
    for where in (off, cpu):
        (run,) = run_dirs(where / "out")
        assert not (run / "gpu.jsonl").exists() and not (run / "logs/gpu-sampler.log").exists()


def test_bad_gpu_sample_s_is_one_line_exit_2(tmp_path: Path) -> None:
    res = run_cli(_config(tmp_path, delay_s=0.0, runner=", gpu_sample_s=-1"), "--dry-run")
    assert res.returncode == 2
    assert len(res.stderr.strip().splitlines()) == 1
    assert "infer.runner" in res.stderr and "gpu_sample_s must be 0 (off)" in res.stderr and "-1" in res.stderr


def test_the_two_stages_share_one_sampler_the_last_release_stops_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Infer and eval overlap, both handing out GPUs (a judge on a GPU): one nvidia-smi for the
    run's gpu.jsonl, not two writing it at once; it runs until the last launch using it ends."""
    from orchestra.paths import RunPaths
    from orchestra.runners.local import gpumon

    for key, value in _double(tmp_path).items():
        monkeypatch.setenv(key, value)
    paths = RunPaths(str(tmp_path / "run"))
    paths.make_dirs()
    first = gpumon.acquire(paths, ["0", "1"], 0.05)
    second = gpumon.acquire(paths, ["0"], 0.05)
    try:
        assert first is not None and first == second
        deadline = time.monotonic() + 20
        while not (pids := _double_pids(tmp_path)) or not os.path.exists(paths.gpu_samples):
            assert time.monotonic() < deadline, "the double never sampled"
            time.sleep(0.05)
        assert len(pids) == 1
        gpumon.release(first)  # the eval stage ends first: inference still samples
        assert alive(pids[0])
        gpumon.release(second)
        assert _gone_soon(pids[0])
        gpumon.release(second)  # released again (a close after a close): nothing left to stop
    finally:
        gpumon.release(first)
        gpumon.release(second)
