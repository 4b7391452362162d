"""Uncertainty of eval scores: standard errors, 95% intervals, paired differences, power.

Every number orchestra shows about a model comes from here.  Pure Python (``math``,
``random``): the orchestrator imports it, and it must start fast.  The formulas follow
E. Miller, "Adding Error Bars to Evals" (arXiv 2411.00640); docs/statistics.md explains
them for users, and tests/stats/test_stats_oracles.py checks each against scipy/statsmodels.

Conventions:

- A score that is NaN (or None) is dropped and the drop is stated in ``note``.
- A standard error that cannot be stated (fewer than 2 samples, one cluster, no spread
  at all) is ``None``, never a made-up number; ``note`` says why and ``method`` is ``'none'``.
- 95% intervals are ``value ± t(0.975, df) * stderr`` with Student's t: ``df = n - 1``
  (clusters: ``C - 1``).  For large n this is the familiar ``± 1.96 stderr``; for small n it
  is wider, and it equals what scipy's ``ttest_rel(...).confidence_interval()`` and
  statsmodels' ``OLS(...).fit(cov_type='cluster', use_t=True).conf_int()`` give.  Intervals
  are not clipped to the range of the scores.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from orchestra.tdist import betainc, t_quantile_975, t_two_sided_p

__all__ = ["Estimate", "Paired", "Z_MDE", "betainc", "bootstrap_estimate", "clustered_stderr", "format_pm", "holm",
           "mcnemar_exact", "mde_paired", "mde_single", "mean_estimate", "paired", "paired_bootstrap",
           "paired_t_pvalue", "t_quantile_975", "t_two_sided_p"]  # with Student's t from orchestra/tdist.py

T = TypeVar("T")

#: z(0.975) + z(0.80): the factor of a minimum detectable effect (two-sided alpha 0.05,
#: power 0.8), about 2.80
Z_MDE = 1.959963984540054 + 0.8416212335729143


def _finite(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else float(x)


@dataclass(frozen=True)
class Estimate:
    """One number with its uncertainty: a metric's value, standard error and 95% interval."""

    value: float  # the metric (the mean, or the statistic for a bootstrap); NaN: no samples
    stderr: float | None  # None when it cannot be stated; then ``note`` says why
    ci: tuple[float, float] | None  # 95% interval
    n: int  # samples (items) used, after NaN scores were dropped
    method: str  # 'clt' | 'clustered' | 'bootstrap' | 'lm-eval' | 'none'
    clusters: int | None = None
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (``value``, ``stderr``, ``ci``, ``n``, ``method``, and
        ``clusters`` / ``note`` when set); NaN becomes null."""
        out: dict[str, Any] = {
            "value": _finite(self.value),
            "stderr": self.stderr,
            "ci": list(self.ci) if self.ci is not None else None,
            "n": self.n,
            "method": self.method,
        }
        if self.clusters is not None:
            out["clusters"] = self.clusters
        if self.note:
            out["note"] = self.note
        return out

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Estimate:
        """The inverse of ``to_json`` (a null value reads back as NaN)."""
        ci = d.get("ci")
        value = d.get("value")
        return cls(value=math.nan if value is None else float(value), stderr=d.get("stderr"),
                   ci=(float(ci[0]), float(ci[1])) if ci else None, n=int(d.get("n", 0)),
                   method=str(d.get("method", "none")), clusters=d.get("clusters"), note=str(d.get("note", "")))


@dataclass(frozen=True)
class Paired:
    """Model A minus model B on the same items: the difference, its paired uncertainty, a test."""

    diff: float
    stderr: float | None
    ci: tuple[float, float] | None
    p_value: float | None
    test: str  # 'mcnemar-exact' | 'paired-t' | 'clustered-t' | 'paired-bootstrap' | 'none'
    n: int
    a_only: int | None  # 0/1 scores: items A got right and B wrong
    b_only: int | None  # 0/1 scores: items B got right and A wrong
    mde: float | None  # smallest difference detectable at 80% power, alpha 0.05 (see mde_paired)
    note: str = ""
    p_holm: float | None = None  # p_value after Holm's correction across the pairs tested together

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict of every field; NaN becomes null."""
        return {
            "diff": _finite(self.diff), "stderr": self.stderr,
            "ci": list(self.ci) if self.ci is not None else None,
            "p_value": self.p_value, "p_holm": self.p_holm, "test": self.test, "n": self.n,
            "a_only": self.a_only, "b_only": self.b_only, "mde": self.mde, "note": self.note,
        }


# --- single estimates --------------------------------------------------------------------


def _present(x: float | None) -> bool:
    return x is not None and not math.isnan(float(x))


def _join(*notes: str) -> str:
    return "; ".join(n for n in notes if n)


def _mean(xs: Sequence[float]) -> float:
    return math.fsum(xs) / len(xs)


def _sd(xs: Sequence[float]) -> float:
    """Sample standard deviation (ddof 1)."""
    m = _mean(xs)
    return math.sqrt(math.fsum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def clustered_stderr(scores: Sequence[float], clusters: Sequence[Hashable]) -> tuple[float, int]:
    """The cluster-robust standard error of a mean and the number of clusters C.

    ``se = sqrt(C/(C-1) * sum_c (sum_{i in c} (x_i - mean))²) / n``: the CR1 variance of an
    intercept-only regression, with statsmodels' small-sample factor ``C/(C-1) * (n-1)/(n-k)``
    (k = 1, so ``(n-1)/(n-k) = 1``).  With every item its own cluster this is ``s / sqrt(n)``.
    Needs C >= 2 (raises ``ValueError`` otherwise).
    """
    m = _mean(scores)
    sums: dict[Hashable, float] = {}
    for x, c in zip(scores, clusters, strict=True):
        sums[c] = sums.get(c, 0.0) + (x - m)
    k = len(sums)
    if k < 2:
        raise ValueError(f"a clustered standard error needs at least 2 clusters, got {k}")
    return math.sqrt(k / (k - 1) * math.fsum(s * s for s in sums.values())) / len(scores), k


def mean_estimate(scores: Sequence[float], clusters: Sequence[Hashable] | None = None) -> Estimate:
    """The mean of per-sample scores with its standard error and 95% interval.

    Plain (``method='clt'``): ``se = s / sqrt(n)``, ``s`` the sample standard deviation (for
    0/1 scores ``sqrt(p(1-p)/(n-1))``); interval ``mean ± t(0.975, n-1) se``.  With
    ``clusters`` (one label per score; ``method='clustered'``): ``clustered_stderr`` and
    ``mean ± t(0.975, C-1) se``.  Stated answers instead of numbers: no scores (value NaN),
    n = 1, every score equal (no spread: a standard error of 0 would claim certainty), one
    cluster.  NaN scores are dropped, with their count in ``note``.
    """
    if clusters is not None and len(clusters) != len(scores):
        raise ValueError(f"{len(scores)} scores but {len(clusters)} cluster labels")
    keep = [i for i, x in enumerate(scores) if _present(x)]
    xs = [float(scores[i]) for i in keep]
    cl = None if clusters is None else [clusters[i] for i in keep]
    dropped = len(scores) - len(keep)
    dropped_note = f"NaN scores dropped: {dropped}" if dropped else ""
    n = len(xs)
    if n == 0:
        return Estimate(math.nan, None, None, 0, "none", note=_join("no scores", dropped_note))
    value = _mean(xs)
    if n == 1:
        return Estimate(value, None, None, 1, "none", note=_join("n = 1: no standard error", dropped_note))
    if min(xs) == max(xs):
        return Estimate(value, None, None, n, "none",
                        note=_join(f"all {n} scores equal: no spread to estimate a standard error from", dropped_note))
    if cl is None:
        se = _sd(xs) / math.sqrt(n)
        half = t_quantile_975(n - 1) * se
        return Estimate(value, se, (value - half, value + half), n, "clt", note=dropped_note)
    groups = len(set(cl))
    if groups < 2:
        return Estimate(value, None, None, n, "none", clusters=groups,
                        note=_join("one cluster: a clustered standard error needs at least 2", dropped_note))
    se, groups = clustered_stderr(xs, cl)
    half = t_quantile_975(groups - 1) * se
    return Estimate(value, se, (value - half, value + half), n, "clustered", clusters=groups, note=dropped_note)


def bootstrap_estimate(items: Sequence[T], statistic: Callable[[Sequence[T]], float], *,
                       seed: int = 0, reps: int = 1000) -> Estimate:
    """A statistic that is not a per-sample mean (corpus F1, BLEU, perplexity over tokens).

    ``value = statistic(items)``; ``reps`` resamples of the items with replacement
    (``random.Random(seed)``, so the same items give the same interval); ``stderr`` is the
    standard deviation of the resampled statistics, ``ci`` their 2.5% and 97.5% percentiles
    (``method='bootstrap'``).  A resample whose statistic is not finite, or raises
    ``ZeroDivisionError`` / ``ValueError``, is skipped and counted in ``note``.
    """
    n = len(items)
    value = float(statistic(items)) if n else math.nan
    if n < 2 or not math.isfinite(value):
        why = "no items" if n == 0 else "n = 1: no standard error" if n == 1 else "the statistic is not finite"
        return Estimate(value, None, None, n, "none", note=why)
    stats = _resampled(n, seed, reps, lambda idx: float(statistic([items[i] for i in idx])))
    skipped = reps - len(stats)
    skip_note = f"{skipped} of {reps} resamples had no finite value" if skipped else ""
    if len(stats) < 2 or min(stats) == max(stats):
        return Estimate(value, None, None, n, "none",
                        note=_join("every resample gives the same value: no spread", skip_note))
    stats.sort()
    lo, hi = _percentile(stats, 0.025), _percentile(stats, 0.975)
    return Estimate(value, _sd(stats), (lo, hi), n, "bootstrap", note=skip_note)


def _resampled(n: int, seed: int, reps: int, value: Callable[[list[int]], float]) -> list[float]:
    """``value`` of ``reps`` seeded resamples of the indices ``0..n-1`` (drawn with replacement),
    the finite ones only: a resample whose value cannot be computed is left out."""
    rng = random.Random(seed)
    out: list[float] = []
    for _ in range(reps):
        idx = [rng.randrange(n) for _ in range(n)]
        try:
            v = value(idx)
        except (ZeroDivisionError, ValueError):
            continue
        if math.isfinite(v):
            out.append(v)
    return out


def _percentile(sorted_xs: Sequence[float], q: float) -> float:
    """Linear interpolation between order statistics (numpy's default)."""
    pos = q * (len(sorted_xs) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_xs) - 1)
    return sorted_xs[lo] + (sorted_xs[hi] - sorted_xs[lo]) * (pos - lo)

# --- paired differences and tests --------------------------------------------------------


def mcnemar_exact(a_only: int, b_only: int) -> float:
    """McNemar's exact test: ``p = min(1, 2 * BinomCDF(min(b, c); b + c, 1/2))``, 1 when
    ``b + c = 0`` (``b``/``c``: the discordant counts).  Summed in log space, so that
    thousands of discordant pairs cost microseconds."""
    n, k = a_only + b_only, min(a_only, b_only)
    if n == 0:
        return 1.0
    log_n = math.lgamma(n + 1) - n * math.log(2)
    log_terms = [log_n - math.lgamma(i + 1) - math.lgamma(n - i + 1) for i in range(k + 1)]
    top = max(log_terms)
    cdf = math.exp(top) * math.fsum(math.exp(t - top) for t in log_terms)
    return min(1.0, 2.0 * cdf)


def paired_t_pvalue(diffs: Sequence[float]) -> float:
    """The two-sided p-value of the paired t-test on differences ``d``: ``t = mean(d) /
    (sd(d)/sqrt(n))`` against Student's t with n-1 degrees of freedom.  With no spread the
    answer is 1.0 when every difference is 0 and 0.0 otherwise.  Needs n >= 2."""
    n = len(diffs)
    if n < 2:
        raise ValueError(f"a paired t-test needs at least 2 pairs, got {n}")
    m, sd = _mean(diffs), _sd(diffs)
    if sd == 0.0:
        return 1.0 if m == 0.0 else 0.0
    return t_two_sided_p(m / (sd / math.sqrt(n)), n - 1)


def paired(a: Sequence[float], b: Sequence[float], clusters: Sequence[Hashable] | None = None) -> Paired:
    """A minus B on the same items (``a[i]`` and ``b[i]`` score one item).

    ``d_i = a_i - b_i``; ``diff = mean(d)``; ``stderr = sd(d)/sqrt(n)`` (or the clustered
    standard error of ``d``); 95% interval ``diff ± t(0.975, df) stderr``.  The test:
    McNemar's exact test when every score is 0 or 1 (``a_only``/``b_only``: the discordant
    counts), else the paired t-test; with clusters, ``t = diff/se_cl`` on C-1 degrees of
    freedom (``'clustered-t'``; the discordant counts are still given for 0/1 scores).
    ``mde``: ``mde_paired`` of the observed discordance for 0/1 scores, else ``2.80 * stderr``.
    A pair with a NaN on either side is dropped (counted in ``note``).
    """
    if len(a) != len(b) or (clusters is not None and len(clusters) != len(a)):
        raise ValueError(f"paired scores must have one length: {len(a)}, {len(b)}"
                         + (f", {len(clusters)} clusters" if clusters is not None else ""))
    keep = [i for i in range(len(a)) if _present(a[i]) and _present(b[i])]
    xa, xb = [float(a[i]) for i in keep], [float(b[i]) for i in keep]
    cl = None if clusters is None else [clusters[i] for i in keep]
    dropped = len(a) - len(keep)
    dropped_note = f"pairs with a NaN score dropped: {dropped}" if dropped else ""
    n = len(keep)
    if n == 0:
        return Paired(math.nan, None, None, None, "none", 0, None, None, None, _join("no pairs", dropped_note))
    d = [x - y for x, y in zip(xa, xb, strict=True)]
    diff = _mean(d)
    binary = all(x in (0.0, 1.0) for x in xa + xb)
    a_only = sum(1 for x, y in zip(xa, xb, strict=True) if x > y) if binary else None
    b_only = sum(1 for x, y in zip(xa, xb, strict=True) if x < y) if binary else None
    if n == 1:
        return Paired(diff, None, None, None, "none", 1, a_only, b_only, None,
                      _join("n = 1: no standard error, no test", dropped_note))
    mde = mde_paired((a_only + b_only) / n, n) if a_only is not None and b_only is not None else None
    if min(d) == max(d):
        p = mcnemar_exact(a_only, b_only) if a_only is not None and b_only is not None else (1.0 if diff == 0 else None)
        test = "mcnemar-exact" if binary else ("paired-t" if p is not None else "none")
        why = ("the two score every item the same" if diff == 0
               else "every item differs by the same amount: no spread")
        return Paired(diff, 0.0, None, p, test, n, a_only, b_only, mde, _join(why, dropped_note))
    if cl is not None:
        groups = len(set(cl))
        if groups < 2:
            return Paired(diff, None, None, None, "none", n, a_only, b_only, None,
                          _join("one cluster: a clustered standard error needs at least 2", dropped_note))
        se, groups = clustered_stderr(d, cl)
        half = t_quantile_975(groups - 1) * se
        p = t_two_sided_p(diff / se, groups - 1) if se > 0 else (1.0 if diff == 0 else 0.0)
        return Paired(diff, se, (diff - half, diff + half), p, "clustered-t", n, a_only, b_only,
                      mde if mde is not None else Z_MDE * se, dropped_note)
    se = _sd(d) / math.sqrt(n)
    half = t_quantile_975(n - 1) * se
    if a_only is not None and b_only is not None:
        return Paired(diff, se, (diff - half, diff + half), mcnemar_exact(a_only, b_only), "mcnemar-exact",
                      n, a_only, b_only, mde, dropped_note)
    return Paired(diff, se, (diff - half, diff + half), paired_t_pvalue(d), "paired-t", n, None, None,
                  Z_MDE * se, dropped_note)


def paired_bootstrap(items_a: Sequence[T], items_b: Sequence[T], statistic: Callable[[Sequence[T]], float], *,
                     seed: int = 0, reps: int = 1000) -> Paired:
    """A minus B for a metric that is not a per-sample mean (a corpus F1): ``items_a[i]`` and
    ``items_b[i]`` are one item's records.  ``diff = statistic(a) - statistic(b)``; ``reps``
    resamples of item indices with replacement (seeded), the same indices for both; ``stderr``
    is the standard deviation of the resampled differences, ``ci`` their 2.5% and 97.5%
    percentiles, and the p-value twice the share of resampled differences on the other side
    of 0 (at most 1): ``test='paired-bootstrap'``.  Resamples without a finite difference are
    skipped and counted in ``note``."""
    if len(items_a) != len(items_b):
        raise ValueError(f"paired items must have one length: {len(items_a)}, {len(items_b)}")
    n = len(items_a)
    diff = float(statistic(items_a)) - float(statistic(items_b)) if n else math.nan
    if n < 2 or not math.isfinite(diff):
        why = "no pairs" if n == 0 else "n = 1: no standard error, no test" if n == 1 else "no finite difference"
        return Paired(diff, None, None, None, "none", n, None, None, None, why)
    diffs = _resampled(n, seed, reps, lambda idx: float(statistic([items_a[i] for i in idx]))
                       - float(statistic([items_b[i] for i in idx])))
    skipped = reps - len(diffs)
    skip_note = f"{skipped} of {reps} resamples had no finite difference" if skipped else ""
    if len(diffs) >= 2 and diff == 0 and min(diffs) == max(diffs) == 0:
        return Paired(diff, 0.0, None, 1.0, "paired-bootstrap", n, None, None, None,
                      _join("the two give the same value on every resample", skip_note))
    if len(diffs) < 2 or min(diffs) == max(diffs):
        return Paired(diff, None, None, None, "none", n, None, None, None,
                      _join("every resample gives the same difference: no spread", skip_note))
    diffs.sort()
    below = sum(1 for d in diffs if d <= 0) / len(diffs)
    above = sum(1 for d in diffs if d >= 0) / len(diffs)
    se = _sd(diffs)
    return Paired(diff, se, (_percentile(diffs, 0.025), _percentile(diffs, 0.975)), min(1.0, 2 * min(below, above)),
                  "paired-bootstrap", n, None, None, Z_MDE * se, skip_note)


def holm(p_values: Sequence[float | None]) -> list[float | None]:
    """Holm's step-down adjusted p-values (the order of the input kept; None stays None and
    does not count as a test).  Sorted ascending, ``p_adj(k) = max_{j<=k} min(1, (m-j+1) p_(j))``
    for m tests; rejecting where ``p_adj <= alpha`` is Holm's procedure at level alpha."""
    idx = sorted((i for i, p in enumerate(p_values) if p is not None), key=lambda i: p_values[i])  # type: ignore[arg-type,return-value]
    m = len(idx)
    out: list[float | None] = [None] * len(p_values)
    running = 0.0
    for k, i in enumerate(idx):
        p = p_values[i]
        assert p is not None
        running = max(running, min(1.0, (m - k) * p))
        out[i] = running
    return out

# --- power and formatting ----------------------------------------------------------------


def mde_single(p: float, n: int) -> float:
    """The smallest difference from a fixed value that n samples detect at 80% power and
    two-sided alpha 0.05, for a score near ``p``: ``2.80 * sqrt(p(1-p)/n)``."""
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}")
    return Z_MDE * math.sqrt(p * (1.0 - p) / n)


def mde_paired(discordance: float, n: int) -> float:
    """The smallest paired difference n items detect at 80% power, alpha 0.05, when a share
    ``q`` of them are discordant (one model right, the other wrong): ``2.80 * sqrt(q/n)``
    (an approximation for small differences)."""
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}")
    return Z_MDE * math.sqrt(discordance / n)


def format_pm(e: Estimate, digits: int = 3) -> str:
    """``'0.500 ± 0.035'`` (value ± standard error), ``'0.500'`` with no standard error,
    ``'n/a'`` with no value."""
    if not math.isfinite(e.value):
        return "n/a"
    if e.stderr is None:
        return f"{e.value:.{digits}f}"
    return f"{e.value:.{digits}f} ± {e.stderr:.{digits}f}"
