"""Runs aligned sample by sample, and the paired statistics of each (dataset, model, metric).

Samples meet by their key (the content of their row), never by their place in a file. A
sample both runs scored but sent a different prompt for is refused (one line saying how
many, in which datasets), or left out and counted with ``allow_changed``.  Each later run is
compared with the first (the baseline): the difference is later minus baseline, tested with
McNemar's exact test for 0/1 scores and a paired t-test otherwise (:func:`orchestra.stats.paired`),
Holm-adjusted across every test of the comparison.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from orchestra import stats
from orchestra.comparison.runs import RunScores, Sample, Scored, load_run, prompts_of
from orchestra.errors import UserError


@dataclass(frozen=True)
class Test:
    """One paired comparison: a metric of a (dataset, model) in the baseline and in a later run."""

    dataset: str
    model: str  # the model's abbr in the baseline
    model_b: str  # and in the later run (the same, unless each run has one model of another name)
    metric: str
    run: int  # which later run (1 = the second run given)
    a: stats.Estimate  # the baseline's mean over the aligned samples
    b: stats.Estimate  # the later run's
    paired: stats.Paired  # later minus baseline; a_only: fixed (right only in the later run)
    note: str = ""  # samples left out of this test (not scored in one run)

    def to_json(self) -> dict[str, Any]:
        p = self.paired
        return {"dataset": self.dataset, "model": self.model, "model_b": self.model_b, "metric": self.metric,
                "run": self.run, "n": p.n, "a": self.a.to_json(), "b": self.b.to_json(), "diff": p.diff,
                "stderr": p.stderr, "ci": list(p.ci) if p.ci else None, "p_value": p.p_value, "p_holm": p.p_holm,
                "test": p.test, "fixed": p.a_only, "broken": p.b_only, "mde": p.mde,
                "note": "; ".join(x for x in (self.note, p.note) if x)}


@dataclass(frozen=True)
class Flip:
    """A sample whose score changed between the baseline and a later run."""

    dataset: str
    model: str
    run: int
    key: str
    id_a: int | None
    id_b: int | None
    prompt: str
    answer_a: Any
    answer_b: Any
    scores_a: dict[str, float]
    scores_b: dict[str, float]

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class Comparison:
    """What ``orchestra compare`` found: every test, what was not compared and why, the flips."""

    runs: list[str]
    tests: list[Test] = field(default_factory=list)
    #: (run, dataset, model, metric, why) of what could not be compared (metric '': none of them)
    not_compared: list[tuple[int, str, str, str, str]] = field(default_factory=list)
    #: (run, dataset, model) -> counts of samples left out: changed prompt, only in A, only in B
    left_out: dict[tuple[int, str, str], dict[str, int]] = field(default_factory=dict)
    flips: list[Flip] = field(default_factory=list)
    allow_changed: bool = False

    def to_json(self) -> dict[str, Any]:
        """The comparison as one JSON document (fields in docs/statistics.md, "Comparing runs")."""
        return {
            "runs": self.runs, "baseline": self.runs[0], "diff": "later run minus baseline (runs[0])",
            "allow_changed": self.allow_changed,
            "holm": {"tests": sum(1 for t in self.tests if t.paired.p_value is not None)},
            "tests": [t.to_json() for t in self.tests],
            "not_compared": [{"run": r, "dataset": d, "model": m, "metric": k or None, "why": w}
                             for r, d, m, k, w in self.not_compared],
            "left_out": [{"run": r, "dataset": d, "model": m, **counts}
                         for (r, d, m), counts in sorted(self.left_out.items())],
            "flips": [f.to_json() for f in self.flips],
        }


def _pairs(a: RunScores, b: RunScores) -> list[tuple[str, str]]:
    """Which model of ``a`` meets which of ``b``: the same abbr, or the only model of each."""
    common = sorted(set(a.models()) & set(b.models()))
    if common:
        return [(m, m) for m in common]
    if len(a.models()) == 1 and len(b.models()) == 1:
        return [(a.models()[0], b.models()[0])]
    raise UserError(f"{b.root}: no model in common with {a.root} (models {', '.join(a.models())} and "
                    f"{', '.join(b.models())}); compare runs of the same models, or of one model each")


def _unusable(base: RunScores, later: RunScores, run: int, dataset: str, model_a: str, model_b: str) -> str:
    """Why ``dataset`` cannot be compared between the baseline (``model_a``) and the later run
    ``run`` (``model_b``): a result only one run has (an eval that failed or never ran), or one
    that is stale (its run planned or predicted it again since it was scored); '' when it can."""
    for side, runs, model in (("the baseline (A)", base, model_a), (f"run {run + 1}", later, model_b)):
        if (dataset, model) in runs.stale:
            return f"{side}: {runs.stale[(dataset, model)]}"
    if (dataset, model_a) not in base.scored:
        return "no result in the baseline (A) (its eval failed or did not run)"
    if (dataset, model_b) not in later.scored:
        return f"no result in run {run + 1} (its eval failed or did not run)"
    return ""


def _changed(a: Scored, b: Scored) -> list[str]:
    return sorted(k for k in a.samples.keys() & b.samples.keys() if a.samples[k].sent_differently(b.samples[k]))


def compare(runs: Sequence[str], *, allow_changed: bool = False, flips: int = 0) -> Comparison:
    """Compare each later run with the first, sample by sample (see the module's docstring).

    ``flips``: how many changed samples to list per (run, dataset, model), with their prompt
    excerpt, both answers and both scores.  Raises ``UserError`` (one line) for bad input.
    """
    if len(runs) < 2:
        raise UserError("compare needs at least two run folders (the baseline first)")
    loaded = [load_run(r) for r in runs]
    out = Comparison([r.root for r in loaded], allow_changed=allow_changed)
    base = loaded[0]
    matched: list[tuple[int, Scored, Scored, list[str]]] = []
    changed_in: dict[str, int] = {}
    for i, later in enumerate(loaded[1:], start=1):
        for model_a, model_b in _pairs(base, later):
            for dataset in sorted({d for d, m in [*base.scored, *base.stale] if m == model_a}
                                  | {d for d, m in [*later.scored, *later.stale] if m == model_b}):
                why = _unusable(base, later, i, dataset, model_a, model_b)
                if why:
                    out.not_compared.append((i, dataset, model_a, "", why))
                    continue
                sa, sb = base.scored[(dataset, model_a)], later.scored[(dataset, model_b)]
                changed = _changed(sa, sb)
                if changed:
                    changed_in[dataset] = changed_in.get(dataset, 0) + len(changed)
                matched.append((i, sa, sb, changed))
    if changed_in and not allow_changed:
        where = ", ".join(f"{d}: {n}" for d, n in sorted(changed_in.items()))
        raise UserError(f"{sum(changed_in.values())} sample(s) were sent a different prompt or other answer choices "
                        f"in a later run than in the baseline ({where}); a comparison of them would mix two "
                        "questions: compare only the unchanged ones with --allow-changed")
    if not matched:
        stale = [f"{d} / {m}: {w}" for _, d, m, _, w in out.not_compared if "stale:" in w]
        if stale:
            raise UserError(f"nothing to compare: {stale[0]}")
        raise UserError(f"the runs have no (dataset, model) in common: {base.root} has "
                        f"{', '.join(sorted({d for d, _ in base.scored}))}")
    for i, sa, sb, changed in matched:
        _compare_pair(out, i, sa, sb, set(changed), flips)
    _holm(out)
    return out


def _compare_pair(out: Comparison, run: int, sa: Scored, sb: Scored, changed: set[str], flips: int) -> None:
    keys = sorted((sa.samples.keys() & sb.samples.keys()) - changed)
    out.left_out[(run, sa.dataset, sa.model)] = {
        "aligned": len(keys), "changed_prompt": len(changed), "only_a": len(sa.samples.keys() - sb.samples.keys()),
        "only_b": len(sb.samples.keys() - sa.samples.keys())}
    for metric in sorted(sa.metrics.keys() | sb.metrics.keys()):
        for side, scored in (("baseline", sa), ("later run", sb)):
            if metric not in scored.metrics:
                raise UserError(f"{sa.dataset} / {sa.model}: metric {metric!r} is missing in the {side} "
                                f"({'run ' + str(run + 1) if side == 'later run' else 'run 1'}); was it scored "
                                "by another evaluator?")
        why = sa.no_scores.get(metric) or sb.no_scores.get(metric)
        if why:
            out.not_compared.append((run, sa.dataset, sa.model, metric, why))
            continue
        if not keys:
            out.not_compared.append((run, sa.dataset, sa.model, metric, "no sample in common"))
            continue
        both = [k for k in keys if metric in sa.samples[k].scores and metric in sb.samples[k].scores]
        if not both:
            out.not_compared.append((run, sa.dataset, sa.model, metric, "no sample scored in both runs"))
            continue
        a = [sa.samples[k].scores[metric] for k in both]
        b = [sb.samples[k].scores[metric] for k in both]
        unscored = len(keys) - len(both)
        note = f"{unscored} sample(s) not scored in one run left out" if unscored else ""
        out.tests.append(Test(sa.dataset, sa.model, sb.model, metric, run, stats.mean_estimate(a),
                              stats.mean_estimate(b), _power_stated(stats.paired(b, a)), note))
    if flips > 0:
        out.flips.extend(_flips(run, sa, sb, keys, flips))


def _power_stated(p: stats.Paired) -> stats.Paired:
    """``p`` without a smallest detectable difference where no sample is discordant: the
    formula from the discordance would say 0, which no n samples can detect."""
    if p.a_only == 0 and p.b_only == 0:
        return dataclasses.replace(p, mde=None)
    return p


def _flips(run: int, sa: Scored, sb: Scored, keys: list[str], limit: int) -> list[Flip]:
    """Up to ``limit`` samples whose score of some compared metric changed (in key order)."""
    changed: list[tuple[Sample, Sample]] = []
    for k in keys:
        x, y = sa.samples[k], sb.samples[k]
        if any(x.scores.get(m) != y.scores.get(m) for m in x.scores.keys() & y.scores.keys()):
            changed.append((x, y))
            if len(changed) == limit:
                break
    if not changed:
        return []
    prompts = prompts_of(sa.root, sa.model, sa.dataset)
    return [Flip(sa.dataset, sa.model, run, x.key, x.id, y.id, prompts.get(x.id, "") if x.id is not None else "",
                 x.prediction, y.prediction, dict(x.scores), dict(y.scores)) for x, y in changed]


def _holm(out: Comparison) -> None:
    """Holm's correction across every test that has a p-value."""
    adjusted = stats.holm([t.paired.p_value for t in out.tests])
    out.tests = [dataclasses.replace(t, paired=dataclasses.replace(t.paired, p_holm=p))
                 for t, p in zip(out.tests, adjusted)]
