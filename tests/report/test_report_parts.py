"""The report's parts on their own: failure lines from logs, prices, the progress display's
counters, JSON that cannot close a script element, sample packs that fit their budget."""

from __future__ import annotations

import base64
import io
import json
import time
import zlib
from pathlib import Path

import pytest
from conftest import RunResult

from orchestra.errors import ConfigError
from orchestra.events import EventLog
from orchestra.paths import RunPaths
from orchestra.summary.costs import check_prices, cost_of
from orchestra.summary.logs import explain, read_sections
from orchestra.summary.progress import StageProgress
from orchestra.summary.report import script_json
from orchestra.summary.runlog import ModelUsage, read_run
from orchestra.summary.samples import build_samples
from orchestra.tasks.spec import TaskSpec, Unit

TRACEBACK = """[t] model m ready
Traceback (most recent call last):
  File "x.py", line 3, in <module>
    load()
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB
[t] FAILED with an unexpected error (traceback above)
"""


def test_explain_prefers_the_tasks_own_message_then_the_exception_line() -> None:
    assert explain("[t] 3/10 samples\n[t] FAILED: arith_0: 3/10 samples failed (first: sample 2: boom)\n") == \
        "arith_0: 3/10 samples failed (first: sample 2: boom)"
    assert explain(TRACEBACK) == "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
    assert explain("loading\nKilled\n") == "Killed"
    assert explain("") == ""


def test_log_sections_follow_attempt_headers_and_a_long_traceback_keeps_its_first_line(tmp_path: Path) -> None:
    frames = "".join(f'  File "f{i}.py", line {i}\n    call()\n' for i in range(30))
    log = tmp_path / "t.log"
    log.write_text("===== orchestra: attempt 1 of t (infer/m/a) at now\n===== command: x\nok\n"
                   "===== orchestra: attempt 2 of t (infer/m/a) at later\n===== slurm: job 42 on node7, "
                   "CUDA_VISIBLE_DEVICES=0,1, started 1.0\nTraceback (most recent call last):\n" + frames +
                   "ValueError: bad\n===== orchestra: attempt 2 failed: exit code 1\n")
    first, second = read_sections(str(log))
    assert (first.attempt, second.attempt) == (1, 2) and first.tail() == "ok"
    assert second.slurm == {"job_id": "42", "node": "node7", "gpus": "0,1"}
    tail = second.tail(12).splitlines()
    assert tail[0] == "Traceback (most recent call last):" and "lines …" in tail[1] and tail[-1] == "ValueError: bad"
    assert second.explanation() == "ValueError: bad"


def test_prices_are_checked_against_the_models_and_turn_usage_into_money() -> None:
    prices = check_prices({"api": {"input_per_1m_tokens": 2.0, "output_per_1m_tokens": 8.0}}, ["api", "local"], "c")
    usage = ModelUsage("api", api=True, requests=10, prompt_tokens=500_000, completion_tokens=100_000)
    assert cost_of(usage, prices["api"]) == {"amount": 1.0 + 0.8, "currency": "USD", "partial": False}
    local = ModelUsage("local", gpu_s=7200)
    assert cost_of(local, {"per_gpu_hour": 2.5, "currency": "EUR"}) == {"amount": 5.0, "currency": "EUR",
                                                                        "partial": False}
    assert cost_of(local, {"input_per_1m_tokens": 1.0})["partial"]  # a token price, but no token counts
    assert cost_of(local, None) is None
    for bad, message in (({"x": {}}, "no model has abbr 'x'"), ({"api": {"per_token": 1}}, "unknown key 'per_token'"),
                         ({"api": {"per_request": -1}}, "expected a number >= 0"), ([1], "prices must be a dict")):
        with pytest.raises(ConfigError, match=message):
            check_prices(bad, ["api", "local"], "c")


def test_script_json_cannot_close_the_script_element() -> None:
    text = script_json({"tail": "</script><script>alert(1)</script>", "x": float("nan")})
    assert "</" not in text and "<script" not in text
    assert json.loads(text) == {"tail": "</script><script>alert(1)</script>", "x": None}


def _task(task_id: str, model: str, rows: int, gpus: int = 0) -> TaskSpec:
    unit = Unit(dataset={}, dataset_abbr="a", start=0, end=rows, shard=None, num_shards=1, output=f"/x/{task_id}",
                hash="h", cost=rows)
    return TaskSpec(stage="infer", task_id=task_id, run_dir="/x", model={}, model_abbr=model, units=(unit,),
                    num_gpus=gpus)


def test_progress_counts_samples_shows_api_counters_for_api_models_and_busy_gpus(tmp_path: Path) -> None:
    events = EventLog(str(tmp_path / "events.jsonl"))
    tasks = [_task("t1", "gpt", 100), _task("t2", "local", 50, gpus=1)]
    out = io.StringIO()
    bar = StageProgress("infer", tasks, events.path, api_models={"gpt"}, gpu_slots=2, stream=out, interval_s=0)
    events.emit("started", task_id="t2", attempt=1, resources={"gpu_ids": ["1"]})
    events.emit("progress", task_id="t1", model="gpt", attempt=1, samples_done=40, samples_failed=1, in_flight=7,
                rate_limited=3, retries=5, samples_resumed=10)
    events.emit("progress", task_id="t2", model="local", attempt=1, samples_done=20, rate_limited=99, retries=99)
    bar({"pending": 0, "running": 2})
    line = out.getvalue().splitlines()[-1]
    assert line.startswith("[infer] 60/150 samples (40%), 1 failed, "), line
    assert "10 from checkpoints" in line and "tasks 0/2 done, 2 running" in line
    assert "requests: 7 in flight, 3 answered 429, 5 retries" in line  # the local model's counters are not shown
    assert "GPUs 1/2 busy" in line
    events.emit("retry", task_id="t1", attempt=1)
    events.emit("progress", task_id="t1", model="gpt", attempt=2, samples_done=100, rate_limited=1, retries=0)
    events.emit("done", task_id="t1", attempt=2)
    events.emit("failed", task_id="t2", attempt=1)
    bar.close({"pending": 0, "running": 0, "done": 1, "failed": 1})
    final = out.getvalue().splitlines()[-1]
    assert final.startswith("[infer] 120/150 samples (80%)"), final  # t1 whole, t2 as far as it came
    assert "tasks 1/2 done, 1 failed" in final and "running" not in final and "ETA" not in final
    assert "requests: 4 answered 429, 5 retries" in final  # both attempts of t1 count
    assert "GPUs" not in final


def test_a_done_task_with_tolerated_failures_shows_them_on_the_bar_and_the_line(tmp_path: Path) -> None:
    """A task that ended done after samples failed within ``error_tolerance``: the terminal bar
    and the line both say how many failed (they used to show 4/4 samples and nothing else)."""

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    events = EventLog(str(tmp_path / "events.jsonl"))
    tasks = [_task("t1", "gpt", 4)]
    bar_out, line_out = Terminal(), io.StringIO()
    bar = StageProgress("infer", tasks, events.path, stream=bar_out)
    line = StageProgress("infer", tasks, events.path, stream=line_out, interval_s=0)
    events.emit("progress", task_id="t1", model="gpt", attempt=1, samples_done=3, samples_failed=1)
    events.emit("done", task_id="t1", attempt=1)
    for shown in (bar, line):
        shown.close({"pending": 0, "running": 0, "done": 1})
    assert "4/4 samples, 1 failed" in bar_out.getvalue(), bar_out.getvalue()
    assert line_out.getvalue().startswith("[infer] 4/4 samples (100%), 1 failed, "), line_out.getvalue()


def test_sample_packs_fit_their_budget_by_shortening_texts(failed_run: RunResult) -> None:
    from orchestra.config import load_config, validate
    from orchestra.datasets.info import dataset_infos
    from orchestra.planner import make_plan

    cfg = validate(load_config(str(failed_run.run / "config.py")), str(failed_run.run / "config.py"))
    paths = RunPaths(str(failed_run.run))
    plan = make_plan(cfg, dataset_infos(cfg.datasets, str(failed_run.run), write_cache=False), paths)
    headline = {"arith": "numeric_match", "pick": "accuracy"}
    full = build_samples(paths, plan.all_units["eval"], headline)
    assert not full.shortened and len(full.pairs) == 4  # det and det_flaky on two datasets; det_broken has none
    small = build_samples(paths, plan.all_units["eval"], headline, budget_bytes=1, prompt_chars=400)
    assert small.shortened or small.limits["prompt"] < 400
    pack = next(p for p in full.packs if p.key == full.pairs["det\u0000arith"]["key"])
    cols = json.loads(zlib.decompress(base64.b64decode(pack.data), -15))
    assert len(cols["id"]) == 40 and cols["score"].count(False) == 8
    assert read_run(paths).usage["det_broken"].samples_done == 0


def test_a_stage_that_waits_prints_a_line_only_when_something_moved(tmp_path: Path) -> None:
    events = EventLog(str(tmp_path / "events.jsonl"))
    out = io.StringIO()
    bar = StageProgress("eval", [_task("t1", "m", 10)], events.path, stream=out, interval_s=0.5)
    waiting = {"pending": 1, "running": 0}
    for _ in range(3):  # rounds of a stage waiting for its predictions: nothing changes
        bar(waiting)
        time.sleep(1.05)  # an unchanged stage is redrawn at most every second
    bar(waiting)
    assert len(out.getvalue().splitlines()) == 1, out.getvalue()
    events.emit("progress", task_id="t1", model="m", attempt=1, samples_done=4)
    bar({"pending": 0, "running": 1})
    time.sleep(1.05)
    bar({"pending": 0, "running": 1})
    assert out.getvalue().splitlines()[-1].startswith("[eval] 4/10 samples"), out.getvalue()


def test_the_timeline_draws_from_numbers_and_keeps_names_and_log_tails_in_the_deflated_details(
        failed_run: RunResult) -> None:
    html = failed_run.report.read_text()

    def element(element_id: str, kind: str) -> str:
        start = html.index(f'<script type="application/{kind}" id="{element_id}">')
        start = html.index(">", start) + 1
        return html[start:html.index("</script>", start)]

    timeline = json.loads(element("timeline-data", "json"))
    details = json.loads(zlib.decompress(base64.b64decode(element("timeline-details", "octet-stream")), -15))
    started = [e for e in map(json.loads, (failed_run.run / "events.jsonl").read_text().splitlines())
               if e["event"] == "started"]
    assert len(timeline["attempts"]) == len(details["tails"]) == len(started) == 14
    assert len(timeline["tasks"]) == len(details["tasks"]) == 10  # 6 infer + 4 eval tasks ran
    # drawing needs no text of a task: only numbers and indexes into the short name lists
    assert all(isinstance(v, int) for task in timeline["tasks"] for v in task)
    assert sorted(timeline["models"]) == ["det", "det_broken", "det_flaky"] and set(timeline["stages"]) == {
        "infer", "eval"}
    assert "Traceback" not in element("timeline-data", "json") and "infer_det_broken_arith" not in element(
        "timeline-data", "json")
    # ... and the hover's text is all in the details, attempt by attempt
    broken = next(i for i, t in enumerate(details["tasks"]) if t[1] == "infer_det_broken_arith")
    assert details["tasks"][broken][2] == "../logs/infer/infer_det_broken_arith.log"
    tails = [details["tails"][n] for n, a in enumerate(timeline["attempts"]) if a[0] == broken]
    assert len(tails) == 2 and all("configured to fail" in t[2] and "Traceback" in t[2] for t in tails)
    assert all(timeline["outcomes"][a[4]] in ("retried", "failed") for a in timeline["attempts"] if a[0] == broken)


def test_a_huge_log_is_read_from_its_end_and_an_unreadable_one_is_empty(tmp_path: Path) -> None:
    """A task whose output runs to megabytes (a model printing without end): only the log's last
    MiB is read, so the last attempt's section and its failure line are still found; a log that
    cannot be read gives no sections, never an error."""
    from orchestra.summary.logs import MAX_READ_BYTES, failure_excerpt

    log = tmp_path / "task.log"
    noise = ("x" * 99 + "\n") * (3 * MAX_READ_BYTES // 100)
    log.write_text("===== orchestra: attempt 1 of 2\nRuntimeError: first\n" + noise
                   + "===== orchestra: attempt 2 of 2\nloading\nRuntimeError: second attempt failed\n" + noise[:5000])
    assert log.stat().st_size > 3 * MAX_READ_BYTES
    started = time.monotonic()
    sections = read_sections(str(log))
    assert [s.attempt for s in sections] == [2] and time.monotonic() - started < 5
    assert failure_excerpt(str(log)) == "RuntimeError: second attempt failed"
    assert read_sections(str(tmp_path)) == [] and failure_excerpt(str(tmp_path / "none.log")) == ""
