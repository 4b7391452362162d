"""A comparison as one self-contained HTML page: the tests' table, a forest plot of the
differences with their 95% intervals (inline SVG), and the flips.  No script, no network:
every byte is in the file.  Names, prompts and answers come from outside and are escaped.
"""

from __future__ import annotations

import html
import math
from typing import Any

from orchestra import stats
from orchestra.comparison.align import Comparison, Test
from orchestra.comparison.text import escaped, fmt, fmt_diff, fmt_p, run_label
from orchestra.fileio import atomic_write_text

_ROW_H, _LABEL_W, _PLOT_W, _PAD = 26, 360, 480, 40
_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#222}
table{border-collapse:collapse;margin:12px 0}td,th{border-bottom:1px solid #ddd;padding:4px 8px;text-align:left;
vertical-align:top}th{background:#f4f4f4}td.num{text-align:right;font-variant-numeric:tabular-nums}
pre{white-space:pre-wrap;word-break:break-word;margin:0;max-width:40em;font:12px/1.3 ui-monospace,monospace}
.note{color:#555;max-width:60em}svg text{font:12px system-ui,sans-serif}
"""


def _e(value: Any) -> str:
    return html.escape(escaped(value), quote=True)


def _x(value: float, lo: float, hi: float) -> float:
    return _LABEL_W + _PAD + (value - lo) / (hi - lo) * _PLOT_W


def forest_svg(tests: list[Test], many: bool) -> str:
    """The forest plot: one row per test, its difference as a dot and its 95% interval as a line,
    a vertical line at 0.  Each row's ``data-diff``/``data-lo``/``data-hi`` carry the numbers."""
    ends = [0.0]
    for t in tests:
        p = t.paired
        ends += [v for v in ((p.ci[0], p.ci[1]) if p.ci else (p.diff,)) if math.isfinite(v)]
    lo, hi = min(ends), max(ends)
    if hi - lo < 1e-9:
        lo, hi = lo - 0.05, hi + 0.05
    margin = (hi - lo) * 0.05
    lo, hi = lo - margin, hi + margin
    height = _ROW_H * (len(tests) + 2)
    width = _LABEL_W + _PLOT_W + 2 * _PAD
    out = [f'<svg id="forest" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" role="img" aria-label="differences with 95% intervals">']
    zero = _x(0.0, lo, hi)
    out.append(f'<line id="zero" x1="{zero:.2f}" x2="{zero:.2f}" y1="{_ROW_H / 2}" y2="{height - _ROW_H}" '
               'stroke="#888" stroke-dasharray="4 3"/>')
    for i, t in enumerate(tests):
        p = t.paired
        y = _ROW_H * (i + 1)
        label = f"{run_label(t.run) + ' ' if many else ''}{t.dataset} / {t.model} / {t.metric}"
        sig = p.p_holm is not None and p.p_holm < 0.05
        colour = "#c0392b" if sig and p.diff < 0 else "#2f9e44" if sig else "#1c5fa8"
        ci = p.ci or (p.diff, p.diff)
        attrs = (f'data-diff="{p.diff!r}" data-lo="{ci[0]!r}" data-hi="{ci[1]!r}" '
                 f'data-label="{_e(label)}"') if math.isfinite(p.diff) else f'data-label="{_e(label)}"'
        out.append(f'<g class="row" {attrs}><title>{_e(label)}: {html.escape(fmt_diff(t))}, p (Holm) '
                   f'{fmt_p(p.p_holm)}</title>')
        out.append(f'<text x="{_LABEL_W}" y="{y + 4}" text-anchor="end">{_e(label)[:80]}</text>')
        if math.isfinite(p.diff):
            out.append(f'<line class="ci" x1="{_x(ci[0], lo, hi):.2f}" x2="{_x(ci[1], lo, hi):.2f}" y1="{y}" '
                       f'y2="{y}" stroke="{colour}" stroke-width="2"/>')
            out.append(f'<circle class="diff" cx="{_x(p.diff, lo, hi):.2f}" cy="{y}" r="4" fill="{colour}"/>')
        out.append("</g>")
    axis_y = height - _ROW_H / 2
    ticks: list[float] = []
    for v in (0.0, lo + margin, hi - margin):  # 0 always; the ends where they are not on top of it
        if all(abs(_x(v, lo, hi) - _x(w, lo, hi)) > 50 for w in ticks):
            ticks.append(v)
    for v in ticks:
        out.append(f'<text class="tick" x="{_x(v, lo, hi):.2f}" y="{axis_y}" text-anchor="middle">{v:+.3f}</text>')
    out.append("</svg>")
    return "\n".join(out)


def page(cmp: Comparison) -> str:
    """The comparison page's HTML."""
    many = len(cmp.runs) > 2
    runs = "".join(f"<li><b>{run_label(i)}</b>{' (baseline)' if i == 0 else ''}: <code>{_e(r)}</code></li>"
                   for i, r in enumerate(cmp.runs))
    head = ["run"] if many else []
    cols = [*head, "dataset", "model", "metric", "n", "A", "B", "diff [95% CI]", "p", "p (Holm)", "fixed/broken",
            "mde"]
    rows = []
    for t in cmp.tests:
        p = t.paired
        flips = "-" if p.a_only is None or p.b_only is None else f"+{p.a_only}/-{p.b_only}"
        cells = [*([run_label(t.run)] if many else []), t.dataset, t.model, t.metric]
        nums = [str(p.n), stats.format_pm(t.a), stats.format_pm(t.b), fmt_diff(t), fmt_p(p.p_value),
                fmt_p(p.p_holm), flips, fmt(p.mde)]
        rows.append("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in cells)
                    + "".join(f'<td class="num">{html.escape(c)}</td>' for c in nums) + "</tr>")
    notes = [f"{_e(d)} / {_e(m)}{' / ' + _e(k) if k else ''}{' (' + run_label(r) + ')' if many else ''}: {_e(w)}"
             for r, d, m, k, w in cmp.not_compared]
    left = []
    for (run, dataset, model), c in sorted(cmp.left_out.items()):
        if c["changed_prompt"] or c["only_a"] or c["only_b"]:
            left.append(f"{_e(dataset)} / {_e(model)}: {c['changed_prompt']} with a changed prompt"
                        f"{' left out (--allow-changed)' if c['changed_prompt'] else ''}, {c['only_a']} only in A, "
                        f"{c['only_b']} only in {run_label(run)}")
    flips_rows = []
    for f in cmp.flips:
        score = "; ".join(f"{escaped(m)} {f.scores_a.get(m, math.nan):g} → {f.scores_b.get(m, math.nan):g}"
                          for m in sorted(f.scores_a.keys() & f.scores_b.keys()) if f.scores_a[m] != f.scores_b[m])
        flips_rows.append(
            f"<tr><td>{_e(f.dataset)}</td><td>{_e(f.model)}</td><td>{run_label(f.run)}</td><td><code>{_e(f.key)}"
            f"</code><br>id {f.id_a}</td><td><pre class=\"prompt\">{html.escape(escaped(f.prompt, 400))}</pre></td>"
            f"<td><pre class=\"answer-a\">{_e(f.answer_a)}</pre></td><td><pre class=\"answer-b\">{_e(f.answer_b)}"
            f"</pre></td><td>{html.escape(score)}</td></tr>")
    tested = sum(1 for t in cmp.tests if t.paired.p_value is not None)
    changed = "; --allow-changed: samples whose prompt changed are left out" if cmp.allow_changed else ""
    parts = [
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">",
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'\">",
        f"<title>orchestra compare</title><style>{_CSS}</style></head><body>",
        "<h1>orchestra compare</h1>", f"<ul id=\"runs\">{runs}</ul>",
        f"<p class=\"note\">diff: the later run minus A over the samples both scored, aligned by sample key; "
        f"95% interval; p: McNemar's exact test for 0/1 scores, a paired t-test otherwise; p (Holm): Holm's "
        f"correction over the {tested} test(s) shown{changed}. "
        "mde: the smallest difference these samples detect at 80% power and 5% significance.</p>",
        "<h2>Differences</h2>", forest_svg(cmp.tests, many),
        "<table id=\"tests\"><thead><tr>" + "".join(f"<th>{html.escape(c)}</th>" for c in cols)
        + "</tr></thead><tbody>" + "".join(rows) + "</tbody></table>",
    ]
    if left or notes:
        parts.append("<h2>Left out</h2><ul id=\"left-out\">" + "".join(f"<li>{x}</li>" for x in left + notes)
                     + "</ul>")
    parts.append("<h2>Flips</h2>")
    if flips_rows:
        parts.append("<table id=\"flips\"><thead><tr><th>dataset</th><th>model</th><th>run</th><th>sample</th>"
                     "<th>prompt</th><th>A's answer</th><th>later answer</th><th>score</th></tr></thead><tbody>"
                     + "".join(flips_rows) + "</tbody></table>")
    else:
        parts.append("<p id=\"flips\">No changed sample listed (--flips N lists N per dataset and model).</p>")
    parts.append("</body></html>")
    return "\n".join(parts)


def write_page(cmp: Comparison, path: str) -> None:
    """Write the page atomically to ``path``."""
    atomic_write_text(path, page(cmp))
