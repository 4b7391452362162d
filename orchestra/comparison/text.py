"""A comparison as the terminal shows it: the table of tests, the power lines, what was left
out, and the flips.  Names, prompts and answers come from outside: every control character is
shown escaped (``\\x1b``, ``\\n``), never sent to the terminal."""

from __future__ import annotations

import json
import re
import textwrap
from collections.abc import Iterator
from typing import Any

from orchestra import stats
from orchestra.comparison.align import Comparison, Test

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
EXCERPT = 70
WRAP = 110


def escaped(text: Any, width: int | None = None) -> str:
    """``text`` on one line with each control character written as an escape; cut to ``width``."""
    s = text if isinstance(text, str) else json.dumps(text, ensure_ascii=False, default=str)
    s = _CONTROL.sub(lambda m: {"\n": "\\n", "\t": "\\t", "\r": "\\r"}.get(m.group(), f"\\x{ord(m.group()):02x}"
                                                                           if ord(m.group()) < 256 else
                                                                           f"\\u{ord(m.group()):04x}"), s)
    return s if width is None or len(s) <= width else s[: width - 1] + "…"


def run_label(i: int) -> str:
    """The letter of the i-th run given: A (the baseline), B, C, ..."""
    return chr(ord("A") + i) if i < 26 else f"R{i + 1}"


def fmt(x: float | None, digits: int = 3) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def fmt_p(p: float | None) -> str:
    if p is None:
        return "-"
    return "<0.001" if p < 0.001 else f"{p:.3f}"


def fmt_diff(t: Test) -> str:
    p = t.paired
    ci = f" [{p.ci[0]:+.3f}, {p.ci[1]:+.3f}]" if p.ci else ""
    return f"{p.diff:+.3f}{ci}"


def _model(t: Test) -> str:
    return t.model if t.model_b == t.model else f"{t.model} -> {t.model_b}"


def _table(rows: list[list[str]]) -> Iterator[str]:
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    for n, row in enumerate(rows):
        yield "  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip()
        if n == 0:
            yield "  ".join("-" * w for w in widths)


def lines(cmp: Comparison) -> Iterator[str]:
    """The comparison, line by line, for the terminal."""
    many = len(cmp.runs) > 2
    for i, root in enumerate(cmp.runs):
        yield f"{run_label(i)}{' (baseline)' if i == 0 else ''}: {escaped(root)}"
    if cmp.tests:
        later = "B" if not many else "the later run"
        yield ""
        header = [*(["run"] if many else []), "dataset", "model", "metric", "n", "A", "B" if not many else "later",
                  f"diff {later} - A [95% CI]", "p", "p (Holm)", "fixed/broken", "mde"]
        rows = [header]
        for t in cmp.tests:
            p = t.paired
            flips = "-" if p.a_only is None or p.b_only is None else f"+{p.a_only}/-{p.b_only}"
            rows.append([*([run_label(t.run)] if many else []), escaped(t.dataset, 40), escaped(_model(t), 40),
                         escaped(t.metric, 40), str(p.n), stats.format_pm(t.a), stats.format_pm(t.b), fmt_diff(t),
                         fmt_p(p.p_value), fmt_p(p.p_holm), flips, fmt(p.mde)])
        yield from _table(rows)
        tested = sum(1 for t in cmp.tests if t.paired.p_value is not None)
        yield ""
        yield from textwrap.wrap(
            f"diff: {later} minus A over the samples both scored, aligned by sample key; A and B: mean ± standard "
            "error on those samples; p: McNemar's exact test for 0/1 scores, a paired t-test otherwise; "
            f"p (Holm): Holm's correction over the {tested} test(s) shown; fixed/broken: samples right only "
            f"in {later} / only in A (0/1 scores).", WRAP)
        yield from textwrap.wrap(
            "mde: the smallest difference these n samples detect at 80% power and 5% significance, from the "
            "observed discordance; a smaller |diff| cannot be told from noise.", WRAP)
        yield from _power(cmp)
    for (run, dataset, model), counts in sorted(cmp.left_out.items()):
        parts = []
        if counts["changed_prompt"]:
            parts.append(f"{counts['changed_prompt']} sample(s) with a changed prompt left out (--allow-changed)")
        if counts["only_a"]:
            parts.append(f"{counts['only_a']} only in A")
        if counts["only_b"]:
            parts.append(f"{counts['only_b']} only in {run_label(run)}")
        if parts:
            yield f"left out: {escaped(dataset)} / {escaped(model)}: {'; '.join(parts)}"
    for run, dataset, model, metric, why in cmp.not_compared:
        yield f"not compared: {escaped(dataset)} / {escaped(model)}{' / ' + escaped(metric) if metric else ''}" + \
              (f" ({run_label(run)})" if many else "") + f": {escaped(why)}"
    if cmp.flips:
        yield ""
        yield "flips (samples whose score changed; answers and prompts escaped):"
        for f in cmp.flips:
            scores = ", ".join(f"{escaped(m)} {f.scores_a[m]:g} -> {f.scores_b[m]:g}"
                               for m in sorted(f.scores_a.keys() & f.scores_b.keys())
                               if f.scores_a[m] != f.scores_b[m])
            yield (f"  {escaped(f.dataset)} / {escaped(f.model)}{' ' + run_label(f.run) if many else ''}  "
                   f"key {f.key}  id {f.id_a}{'' if f.id_b == f.id_a else '/' + str(f.id_b)}  {scores}")
            yield f"    prompt: {escaped(f.prompt, EXCERPT)}"
            yield f"    A: {escaped(f.answer_a, EXCERPT)}"
            yield f"    {run_label(f.run)}: {escaped(f.answer_b, EXCERPT)}"


def _power(cmp: Comparison) -> Iterator[str]:
    """One power line per (run, dataset): its n and the smallest detectable difference of each metric."""
    seen: dict[tuple[int, str], list[Test]] = {}
    for t in cmp.tests:
        seen.setdefault((t.run, t.dataset), []).append(t)
    for (run, dataset), tests in seen.items():
        parts = [f"{escaped(t.metric)}{'' if len({x.model for x in tests}) == 1 else ' (' + escaped(t.model) + ')'} "
                 + (fmt(t.paired.mde) if t.paired.mde is not None else "- (no sample discordant)") for t in tests]
        if parts:
            ns = sorted({t.paired.n for t in tests})
            yield (f"power: {escaped(dataset)}{' (' + run_label(run) + ')' if len(cmp.runs) > 2 else ''}: "
                   f"n = {'/'.join(map(str, ns))}: smallest detectable difference (80% power, 5% significance): "
                   + ", ".join(parts))
