"""The report draws every interval: a real run with planted differences, opened in headless Chromium.

The run is the planted one of tests/stats/test_errorbars_run.py (two deterministic models,
a known 2x2 table of right and wrong answers).  The page must draw each score's 95% interval
where the result states it (under the score, and in the per-dataset charts) and the paired
differences against the baseline as a forest plot whose dots and whiskers sit where
``summary/comparison.json`` puts them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from chromium import Chromium
from conftest import save_artifact

from tests.helpers import run_cli
from tests.stats.test_errorbars_run import write_planted


@pytest.fixture(scope="module")
def planted_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("planted_report")
    cfg, env = write_planted(folder)
    res = run_cli(cfg, env={**env, "ORCHESTRA_LOCK_DIR": str(folder / "locks")})
    assert res.returncode == 0, res.stdout + res.stderr
    (run,) = [p for p in (folder / "out").iterdir() if p.is_dir()]
    return run


def _estimates(run: Path) -> dict[tuple[str, str, str], dict[str, Any]]:
    summary = json.loads((run / "summary" / "summary.json").read_text())
    return {(e["dataset"], e["metric"], e["model"]): e for e in summary["estimates"]}


def test_each_score_draws_its_interval_where_the_result_states_it(planted_run: Path, browser: Chromium,
                                                                  tmp_path: Path) -> None:
    browser.console.clear()
    browser.open(str(planted_run / "summary" / "report.html"))
    cells = browser.eval("""[...document.querySelectorAll('#results-table tbody tr')].flatMap(tr => {
        const [d, m] = [tr.cells[0].innerText, tr.cells[1].innerText];
        return [...tr.querySelectorAll('td.score')].map((td, i) => {
            const ci = td.querySelector('.ci'), r = td.getBoundingClientRect();
            return {d, m, i, text: td.innerText.trim(), v: td.dataset.v, ci: td.dataset.ci || null,
                    title: td.title, left: ci ? (ci.getBoundingClientRect().left - r.left) / r.width : null,
                    right: ci ? (ci.getBoundingClientRect().right - r.left) / r.width : null};
        });
    })""")
    models = browser.eval("[...document.querySelectorAll('#results-table thead th')].slice(2).map(t => t.innerText)")
    assert models == ["full", "short"]
    estimates = _estimates(planted_run)
    drawn = 0
    for c in cells:
        est = estimates[(c["d"], c["m"], models[c["i"]])]
        assert c["text"] == f"{est['value']:.3f} ± {est['stderr']:.3f}", c
        lo, hi = est["ci"]
        assert [float(x) for x in c["ci"].split(",")] == pytest.approx([lo, hi], rel=1e-9)
        assert "95% interval" in c["title"] and f"n = {est['n']}" in c["title"]
        # the line under the score spans the interval on the bar's scale (scores here lie in 0..1)
        assert c["left"] == pytest.approx(max(lo, 0.0), abs=0.02)
        assert c["right"] == pytest.approx(min(hi, 1.0), abs=0.02)
        drawn += 1
    assert drawn == len(estimates) == 8
    assert "clustered" in browser.eval("document.getElementById('legend').innerText")
    # the per-dataset charts draw the headline metric's interval of each model
    whiskers = browser.eval("document.querySelectorAll('.chart line.whisker').length")
    assert whiskers == 3 * 2  # three datasets, two models
    shot = tmp_path / "report_intervals.png"
    browser.screenshot(str(shot))
    save_artifact(shot)
    assert browser.console == [], browser.console


def test_the_comparison_is_a_forest_plot_of_the_paired_differences(planted_run: Path, browser: Chromium) -> None:
    browser.console.clear()
    browser.open(str(planted_run / "summary" / "report.html"))
    comp = json.loads((planted_run / "summary" / "comparison.json").read_text())
    rows = browser.eval("""[...document.querySelectorAll('#comparison-table tbody tr')].map(tr => ({
        cells: [...tr.cells].slice(0, 8).map(td => td.innerText.trim()),
        significant: tr.classList.contains('significant'),
        dot: tr.querySelector('circle.dot') ? +tr.querySelector('circle.dot').getAttribute('cx') : null,
        x1: +tr.querySelector('line.whisker').getAttribute('x1'),
        x2: +tr.querySelector('line.whisker').getAttribute('x2'),
        zero: +tr.querySelector('line.zero').getAttribute('x1')}))""")
    assert len(rows) == len(comp["pairs"]) == 3
    text = browser.eval("document.getElementById('comparison').innerText")
    assert "baseline short" in text and "Holm" in text
    reach = max(abs(v) for p in comp["pairs"] for v in p["ci"]) * 1.1
    for row, p in zip(rows, comp["pairs"]):
        assert row["cells"][:3] == [p["dataset"], p["metric"], p["model"]]
        assert row["cells"][3].startswith(f"{p['diff']:+.3f} ± ")
        assert row["zero"] == 100
        assert row["dot"] == pytest.approx(200 * (0.5 + 0.5 * p["diff"] / reach), abs=0.06)
        assert row["x1"] == pytest.approx(200 * (0.5 + 0.5 * p["ci"][0] / reach), abs=0.06)
        assert row["x2"] == pytest.approx(200 * (0.5 + 0.5 * p["ci"][1] / reach), abs=0.06)
        assert row["significant"] == (p["p_holm"] < 0.05)
        # an interval that excludes 0 lies on one side of the zero line, one that includes it crosses it
        assert (row["x1"] > 100) == (p["ci"][0] > 0) and row["dot"] > 100
    # the clustered difference (plant_cl) is wider than the plain one on the same samples
    assert rows[1]["x2"] - rows[1]["x1"] > rows[0]["x2"] - rows[0]["x1"]
    assert browser.console == [], browser.console
