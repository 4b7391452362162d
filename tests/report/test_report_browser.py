"""The report of a real run, opened in real headless Chromium over the DevTools protocol."""

from __future__ import annotations

import json
from pathlib import Path

from chromium import Chromium
from conftest import RunResult, events, save_artifact, summary_cells


def _open(browser: Chromium, report: Path) -> None:
    browser.console.clear()
    browser.open(str(report))
    browser.wait_for("+document.getElementById('tl').dataset.bars > 0")


def test_report_shows_every_result_one_bar_per_attempt_and_the_failure(failed_run: RunResult, browser: Chromium,
                                                                       tmp_path: Path) -> None:
    assert failed_run.proc.returncode == 1, failed_run.proc.stderr
    _open(browser, failed_run.report)
    table = browser.eval("document.getElementById('results-table').innerText")
    cells = summary_cells(failed_run.run)
    assert {c[0] for c in cells} == {"arith", "pick"} and {c[2] for c in cells} == {"det", "det_flaky", "det_broken"}
    header = browser.eval("[...document.querySelectorAll('#results-table thead th')].map(t => t.innerText)")
    estimates = {(e["dataset"], e["metric"], e["model"]): e
                 for e in json.loads((failed_run.run / "summary" / "summary.json").read_text())["estimates"]}
    for dataset, metric, model, value in cells:
        assert dataset in table and metric in table and model in header
        if value != "-":  # with its standard error where the result states one (docs/statistics.md)
            est = estimates[(dataset, metric, model)]
            shown = (f"{float(value):.3f} ± {est['stderr']:.3f}" if est["stderr"] is not None
                     else f"{float(value):.4f}")
            assert shown in table, (dataset, metric, model, value)
    # the value sits in the right column: its cell's data-v equals summary.csv's number
    shown = browser.eval("""[...document.querySelectorAll('#results-table tbody tr')].map(tr =>
        [...tr.cells].map(td => td.dataset.v !== undefined ? td.dataset.v : td.innerText.trim()))""")
    models = header[2:]
    for dataset, metric, model, value in cells:
        row = next(r for r in shown if r[0] == dataset and r[1] == metric)
        cell = row[2 + models.index(model)]
        assert (cell == "" if value == "-" else abs(float(cell) - float(value)) < 1e-9), (dataset, metric, model)

    started = [e for e in events(failed_run.run) if e["event"] == "started"]
    assert len(started) == 6 + 4 + 4  # 6 infer tasks, 4 of them twice; 4 eval tasks (2 skipped)
    assert browser.eval("+document.getElementById('tl').dataset.bars") == len(started)
    outcomes = browser.eval("orchestraTimeline.bars().map(b => b.outcome)")
    assert len(outcomes) == len(started)
    assert outcomes.count("retried") == 4 and outcomes.count("failed") == 2 and outcomes.count("done") == 8
    # every bar is painted: the canvas pixel at its centre has its outcome's colour
    painted = browser.eval("""(() => { const c = document.getElementById('tl'), w = document.getElementById('tl-wrap');
        const ctx = c.getContext('2d'), r = window.devicePixelRatio || 1;
        return orchestraTimeline.bars().map(b => [b.outcome, [...ctx.getImageData(Math.round((b.x + b.w / 2 -
            w.scrollLeft) * r), Math.round((b.y + b.h / 2 - w.scrollTop) * r), 1, 1).data]]); })()""")
    css = {"done": (0x2F, 0x9E, 0x44), "retried": (0xF0, 0x8C, 0x00), "failed": (0xE0, 0x31, 0x31)}
    assert all(tuple(rgba[:3]) == css[outcome] for outcome, rgba in painted), painted

    failures = browser.eval("document.getElementById('failures').innerText")
    assert "infer/det_broken/arith" in failures and "infer/det_broken/pick" in failures
    assert "RuntimeError: model det_broken: configured to fail (fail_always=True)" in failures
    assert "logs/infer/infer_det_broken_arith.log" in failures
    # failures come first on the page, before the results
    assert browser.eval("document.getElementById('failures').getBoundingClientRect().top < "
                        "document.getElementById('results').getBoundingClientRect().top")
    costs = browser.eval("document.getElementById('costs').innerText")
    assert "det_flaky" in costs and "USD" in costs and "not counted" in costs

    shot = tmp_path / "report.png"
    browser.screenshot(str(shot))
    assert shot.stat().st_size > 10_000 and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    save_artifact(shot)
    assert browser.console == [], browser.console


def test_hovering_a_failed_bar_shows_attempt_exit_code_host_and_log_tail(failed_run: RunResult,
                                                                        browser: Chromium) -> None:
    _open(browser, failed_run.report)
    box = browser.eval("orchestraTimeline.show(orchestraTimeline.bars().find(b => b.outcome === 'failed').i)")
    browser.hover(*box)
    # the card shows the bar at once, and the names and log tail once the details are inflated
    tip = browser.wait_for("!document.getElementById('tip').hidden && document.getElementById('tip').innerText")
    assert "attempt: 2" in tip and "outcome: failed" in tip
    tip = browser.wait_for("!document.getElementById('tip').innerText.includes('loading') && "
                           "document.getElementById('tip').innerText")
    assert "infer/det_broken/" in tip and "attempt: 2" in tip and "exit code: 1" in tip
    assert "host:" in tip and "duration:" in tip and "pid:" in tip
    assert "RuntimeError: model det_broken: configured to fail" in tip  # the reason and the log tail
    assert "Traceback" in tip
    assert browser.console == [], browser.console


def test_drilldown_loads_samples_lazily_searches_and_shows_model_text_as_text(failed_run: RunResult,
                                                                            browser: Chromium) -> None:
    _open(browser, failed_run.report)
    assert browser.eval("document.getElementById('drill').hidden")
    browser.eval("""[...document.querySelectorAll('#results-table td[data-pair]')].find(td =>
        td.parentElement.cells[0].innerText === 'arith' && td.cellIndex === 2).click()""")
    browser.wait_for("document.querySelectorAll('#drill-body tr').length === 40")
    title = browser.eval("document.getElementById('drill-title').innerText")
    assert "det on arith" in title and "32/40 right" in title
    body = browser.eval("document.getElementById('drill-body').innerText")
    assert "<b>bold</b>" in body  # the prompt's HTML is shown as text ...
    assert browser.eval("document.querySelectorAll('#drill-body b').length") == 0  # ... never rendered
    browser.eval("document.getElementById('drill-filter').value = 'wrong';"
                 "document.getElementById('drill-filter').dispatchEvent(new Event('change'))")
    browser.wait_for("document.querySelectorAll('#drill-body tr').length === 8")
    browser.eval("document.getElementById('drill-filter').value = 'all';"
                 "const s = document.getElementById('drill-search'); s.value = 'what is 7 +';"
                 "s.dispatchEvent(new Event('input'))")
    browser.wait_for("document.querySelectorAll('#drill-body tr').length === 1")
    assert "What is 7 + 14?" in browser.eval("document.getElementById('drill-body').innerText")
    assert browser.console == [], browser.console


def test_results_table_sorts_by_a_model_column(failed_run: RunResult, browser: Chromium) -> None:
    _open(browser, failed_run.report)
    browser.eval("document.querySelector('#results-table th[data-col=\"2\"]').click()")
    values = browser.eval("[...document.querySelectorAll('#results-table tbody tr')].map(tr => tr.cells[2].dataset.v)")
    numbers = [float(v) for v in values if v]
    assert numbers == sorted(numbers, reverse=True) and numbers[-1] == 0.8
    assert browser.console == [], browser.console


def test_trace_holds_one_event_per_attempt_with_readable_names(failed_run: RunResult) -> None:
    trace = json.loads((failed_run.run / "summary" / "trace.json").read_text())
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert len(spans) == len([e for e in events(failed_run.run) if e["event"] == "started"])
    names = {e["name"] for e in spans}
    assert "infer/det_broken/arith" in names and "eval/det/pick" in names
    failed = [e for e in spans if e["args"]["outcome"] == "failed"]
    assert len(failed) == 2 and all(e["args"]["exit_code"] == 1 for e in failed)
    assert all("RuntimeError" in e["args"]["explanation"] for e in failed)
    threads = {e["args"]["name"] for e in trace["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"}
    assert threads == {"worker 0", "worker 1"}
    assert any(e["ph"] == "C" and e["name"] == "infer samples done" for e in trace["traceEvents"])
