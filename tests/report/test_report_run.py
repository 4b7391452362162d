"""What the CLI says and writes around the report: the final line, failure reasons from the
logs, readable names and placement in events, progress lines without a terminal, viz."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

from conftest import REPO, RunResult, events, orchestra, write_run_config


def test_last_line_names_the_report_and_failures_carry_the_exception_line(failed_run: RunResult) -> None:
    res = failed_run.proc
    assert res.returncode == 1, res.stderr
    last = res.stderr.strip().splitlines()[-1]
    assert last == f"report: {failed_run.report}"
    assert failed_run.report.exists() and (failed_run.run / "summary" / "trace.json").exists()
    exc = "RuntimeError: model det_broken: configured to fail (fail_always=True)"
    assert f"FAILED: infer task infer_det_broken_arith (exit code 1; {exc}); log: " in res.stderr
    md = (failed_run.run / "summary" / "summary.md").read_text()
    assert f"det_broken / pick: infer task infer_det_broken_pick failed (exit code 1; {exc})" in md


def test_events_carry_readable_names_and_where_each_attempt_ran(failed_run: RunResult) -> None:
    evs = events(failed_run.run)
    started = [e for e in evs if e["event"] == "started"]
    assert {e["name"] for e in started} >= {"infer/det/arith", "infer/det_flaky/pick", "eval/det/arith"}
    for e in started:
        assert e["slot"] in (0, 1) and e["runner"] == "LocalRunner"
        assert e["where"]["host"] and e["where"]["pid"] > 0
    retries = [e for e in evs if e["event"] == "retry"]
    assert len(retries) == 4 and all(e["exit_code"] == 1 and e["duration_s"] > 0 for e in retries)
    done = [e for e in evs if e["event"] == "done"]
    assert all(e["exit_code"] == 0 and "slot" in e for e in done)
    log = (failed_run.run / "logs" / "infer" / "infer_det_flaky_arith.log").read_text()
    assert "attempt 2 of infer_det_flaky_arith (infer/det_flaky/arith)" in log
    progress = [e for e in evs if e["event"] == "progress"]
    assert progress and all("attempt" in e and "samples_resumed" in e for e in progress)


def test_progress_without_a_terminal_prints_lines_that_end_at_the_final_counts(failed_run: RunResult) -> None:
    lines = [ln for ln in failed_run.proc.stderr.splitlines() if ln.startswith("[infer] ")]
    assert len(lines) >= 2, failed_run.proc.stderr  # the header, then lines every 0.2 s and a last one
    final = lines[-1]
    # 3 models x (40 + 20) samples planned; det_broken's 60 never ran
    assert final.startswith("[infer] 120/180 samples (67%)"), final
    assert "tasks 4/6 done, 2 failed" in final and "running" not in final
    assert "429" not in failed_run.proc.stderr and "requests:" not in failed_run.proc.stderr  # local models only
    eval_final = [ln for ln in failed_run.proc.stderr.splitlines() if ln.startswith("[eval] ")][-1]
    assert "tasks 4/6 done" in eval_final and "2 skipped" in eval_final


def test_progress_on_a_terminal_is_one_bar_per_stage_ending_at_the_final_counts(tmp_path: Path) -> None:
    cfg = write_run_config(tmp_path)
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 200, 0, 0))  # a terminal 200 columns wide
    env = {**os.environ, "ORCHESTRA_LOCK_DIR": str(tmp_path / "locks")}
    proc = subprocess.Popen([sys.executable, "run.py", str(cfg)], cwd=REPO, stdin=slave, stdout=slave, stderr=slave,
                            env=env, close_fds=True)
    os.close(slave)
    out = b""
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        out += chunk
    proc.wait(timeout=30)
    os.close(master)
    text = out.decode("utf-8", "replace")
    assert proc.returncode == 1, text
    infer = [seg for seg in re.split(r"[\r\n]", text) if seg.lstrip().startswith("[infer]") and "samples" in seg]
    assert infer and "|" in infer[-1], text  # a tqdm bar, not lines
    assert "120/180 samples" in infer[-1] and "tasks 4/6 done, 2 failed" in infer[-1], infer[-1]
    assert "429" not in text


def test_viz_rewrites_report_and_writes_the_trace_where_asked(failed_run: RunResult, tmp_path: Path) -> None:
    before = failed_run.report.stat().st_mtime_ns
    time.sleep(0.01)
    trace = tmp_path / "out.json"
    res = orchestra(failed_run.cfg, "--mode", "viz", "-r", "--trace", trace)
    assert res.returncode == 1, res.stderr  # results are still missing
    assert res.stderr.strip().splitlines()[-1] == f"report: {failed_run.report} (trace: {trace})"
    assert failed_run.report.stat().st_mtime_ns > before
    spans = [e for e in json.loads(trace.read_text())["traceEvents"] if e["ph"] == "X"]
    assert len(spans) == len([e for e in events(failed_run.run) if e["event"] == "started"])
    # the prices of the run (saved beside its summary) are still used
    assert "USD" in failed_run.report.read_text()


def test_bad_price_table_is_a_one_line_config_error(tmp_path: Path) -> None:
    cfg = write_run_config(tmp_path, extra="prices = {'nobody': dict(input_per_1m_tokens=1.0)}")
    res = orchestra(cfg)
    assert res.returncode == 2
    assert res.stderr.strip().count("\n") == 0
    assert "prices: no model has abbr 'nobody'; models: det, det_flaky, det_broken" in res.stderr
