"""``orchestra compare --html``: the comparison page of two real runs, opened in real headless
Chromium (tests/report/chromium.py): the forest plot draws each difference and interval where
the JSON puts it, the flips table lists the changed samples, hostile answers stay text, and the
page loads nothing from anywhere."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from planted import HOSTILE, Runs

from tests.report.chromium import Chromium


def test_page_draws_the_forest_plot_and_lists_the_flips(runs: Runs, browser: Chromium, tmp_path: Path) -> None:
    page = tmp_path / "cmp page.html"
    proc = runs.compare(runs.a, runs.b, "--flips", "100", "--json", "--html", page)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert f"comparison page: {page}" in proc.stderr
    text = page.read_text()
    assert "<script" not in text.lower() and "http://" not in text.replace('xmlns="http://www.w3.org/2000/svg"', "")

    browser.console.clear()
    browser.open(str(page))
    rows = browser.eval("""[...document.querySelectorAll('#forest g.row')].map(g => {
        const c = g.querySelector('circle.diff'), l = g.querySelector('line.ci');
        return {label: g.dataset.label, diff: +g.dataset.diff, lo: +g.dataset.lo, hi: +g.dataset.hi,
                cx: +c.getAttribute('cx'), x1: +l.getAttribute('x1'), x2: +l.getAttribute('x2'),
                shown: c.getBoundingClientRect().width > 0};
    })""")
    assert [r["label"] for r in rows] == [f"{t['dataset']} / planted / {t['metric']}" for t in doc["tests"]]
    for r, t in zip(rows, doc["tests"]):
        assert r["diff"] == pytest.approx(t["diff"]) and [r["lo"], r["hi"]] == pytest.approx(t["ci"])
        assert r["x1"] < r["cx"] < r["x2"] and r["shown"]
    # one scale for every row: x is linear in the value, and 0 sits on the dashed line
    (a, b) = rows
    scale = (b["cx"] - a["cx"]) / (b["diff"] - a["diff"])
    for r in rows:
        assert r["x1"] == pytest.approx(a["cx"] + (r["lo"] - a["diff"]) * scale, abs=0.02)
    zero = browser.eval("+document.getElementById('zero').getAttribute('x1')")
    assert zero == pytest.approx(a["cx"] - a["diff"] * scale, abs=0.02)
    assert all(r["cx"] < zero for r in rows)  # both differences are below 0

    cells = browser.eval("""[...document.querySelectorAll('#tests tbody tr')].map(tr =>
        [...tr.cells].map(td => td.innerText.trim()))""")
    assert [c[:3] for c in cells] == [[t["dataset"], "planted", t["metric"]] for t in doc["tests"]]
    assert [c[6] for c in cells] == [f"{t['diff']:+.3f} [{t['ci'][0]:+.3f}, {t['ci'][1]:+.3f}]" for t in doc["tests"]]

    flips = browser.eval("document.querySelectorAll('#flips tbody tr').length")
    assert flips == len(doc["flips"]) == 51 + 61  # sums: 20 fixed + 31 broken; near: every changed score
    # the hostile answer is text on the page: no element made from it, no script run, the title unchanged
    assert browser.eval("document.images.length") == 0
    assert browser.eval("document.title") == "orchestra compare"
    answers = browser.eval("[...document.querySelectorAll('#flips pre.answer-b')].map(p => p.innerText)")
    assert "\\x1b[H\\x1b[J\\x07" + HOSTILE[len("\x1b[H\x1b[J\x07"):] in answers
    assert browser.eval("performance.getEntriesByType('resource').length") == 0
    assert not browser.console, browser.console
