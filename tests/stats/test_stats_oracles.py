"""orchestra.stats against independent implementations (scipy, statsmodels) and by simulation.

Each formula is compared with an oracle on seeded random data; the 95% intervals are checked
for coverage over thousands of simulated datasets with a known mean; degenerate inputs give
a stated answer (``note``), never a traceback or an interval made up from nothing.
"""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
import statsmodels.api as sm
from scipy import special
from scipy import stats as sps
from statsmodels.stats.contingency_tables import mcnemar as sm_mcnemar
from statsmodels.stats.multitest import multipletests

from orchestra import stats

SEEDS = range(12)


def _binary(rng: random.Random, n: int, p: float) -> list[float]:
    return [1.0 if rng.random() < p else 0.0 for _ in range(n)]


@pytest.mark.parametrize("seed", SEEDS)
def test_stderr_matches_scipy_sem(seed: int) -> None:
    rng = random.Random(seed)
    n = rng.randrange(2, 400)
    xs = _binary(rng, n, rng.random()) if seed % 2 else [rng.gauss(0.3, 2.0) for _ in range(n)]
    if min(xs) == max(xs):
        xs[0] = 1.0 - xs[0]
    e = stats.mean_estimate(xs)
    assert e.method == "clt" and e.n == n
    assert e.value == pytest.approx(float(np.mean(xs)), rel=1e-12, abs=1e-12)
    assert e.stderr == pytest.approx(float(sps.sem(xs)), rel=1e-10)
    lo, hi = sps.t.interval(0.95, n - 1, loc=np.mean(xs), scale=sps.sem(xs))
    assert e.ci == pytest.approx((lo, hi), rel=1e-8, abs=1e-10)


def test_binary_stderr_is_sqrt_p_1_minus_p_over_n_minus_1() -> None:
    xs = [1.0] * 100 + [0.0] * 100
    e = stats.mean_estimate(xs)
    assert e.stderr == pytest.approx(math.sqrt(0.25 / 199), rel=1e-12)
    assert stats.format_pm(e) == "0.500 ± 0.035"


@pytest.mark.parametrize("seed", SEEDS)
def test_clustered_stderr_matches_statsmodels_ols_cluster(seed: int) -> None:
    """statsmodels' CR1 factor C/(C-1) * (n-1)/(n-k) is matched exactly (k = 1), and its
    use_t interval (t on C-1 degrees of freedom) too."""
    rng = random.Random(seed)
    n_clusters = rng.randrange(2, 30)
    xs: list[float] = []
    groups: list[int] = []
    for c in range(n_clusters):
        p = rng.random()
        for _ in range(rng.randrange(1, 25)):
            xs.append(1.0 if rng.random() < p else 0.0)
            groups.append(c)
    if min(xs) == max(xs):
        xs[0] = 1.0 - xs[0]
    fit = sm.OLS(np.asarray(xs), np.ones((len(xs), 1))).fit(
        cov_type="cluster", cov_kwds={"groups": np.asarray(groups)}, use_t=True)
    e = stats.mean_estimate(xs, clusters=[f"subject-{g}" for g in groups])
    assert e.method == "clustered" and e.clusters == n_clusters
    assert e.value == pytest.approx(float(fit.params[0]), rel=1e-12)
    assert e.stderr == pytest.approx(float(fit.bse[0]), rel=1e-9)
    assert e.ci == pytest.approx(tuple(fit.conf_int(alpha=0.05)[0]), rel=1e-7)


def test_singleton_clusters_equal_the_plain_stderr() -> None:
    rng = random.Random(3)
    xs = [rng.gauss(0, 1) for _ in range(50)]
    assert stats.mean_estimate(xs, clusters=list(range(50))).stderr == pytest.approx(stats.mean_estimate(xs).stderr)


@pytest.mark.parametrize("a_only,b_only", [(0, 0), (0, 1), (1, 0), (3, 3), (7, 2), (2, 19), (40, 61), (0, 25),
                                           (250, 310), (1200, 1290), (5000, 5200)])
def test_mcnemar_exact_matches_binomtest_and_statsmodels(a_only: int, b_only: int) -> None:
    p = stats.mcnemar_exact(a_only, b_only)
    if a_only + b_only:
        assert p == pytest.approx(sps.binomtest(min(a_only, b_only), a_only + b_only, 0.5).pvalue, rel=1e-9)
    else:
        assert p == 1.0
    table = [[10, a_only], [b_only, 10]]
    assert p == pytest.approx(sm_mcnemar(table, exact=True).pvalue, rel=1e-9)


@pytest.mark.parametrize("seed", SEEDS)
def test_paired_t_matches_scipy_ttest_rel(seed: int) -> None:
    rng = random.Random(seed)
    n = rng.randrange(2, 300)
    a = [rng.random() for _ in range(n)]
    b = [x + rng.gauss(0.02 * (seed % 3), 0.2) for x in a]
    res = sps.ttest_rel(a, b)
    assert stats.paired_t_pvalue([x - y for x, y in zip(a, b)]) == pytest.approx(res.pvalue, rel=1e-8, abs=1e-300)
    pr = stats.paired(a, b)
    assert pr.test == "paired-t" and pr.a_only is None
    assert pr.p_value == pytest.approx(res.pvalue, rel=1e-8, abs=1e-300)
    assert pr.diff == pytest.approx(float(np.mean(np.subtract(a, b))), abs=1e-12)
    assert pr.stderr == pytest.approx(float(sps.sem(np.subtract(a, b))), rel=1e-10)
    assert pr.ci == pytest.approx(tuple(res.confidence_interval(0.95)), rel=1e-7, abs=1e-12)


def test_paired_binary_uses_mcnemar_and_counts_discordance() -> None:
    a = [1, 1, 1, 0, 0, 1, 0, 1, 1, 1] * 10
    b = [1, 0, 0, 0, 1, 1, 0, 0, 1, 0] * 10
    pr = stats.paired(a, b)
    assert (pr.test, pr.a_only, pr.b_only, pr.n) == ("mcnemar-exact", 40, 10, 100)
    assert pr.diff == pytest.approx(0.3)
    assert pr.p_value == pytest.approx(sps.binomtest(10, 50, 0.5).pvalue, rel=1e-9)
    assert pr.stderr == pytest.approx(float(sps.sem(np.subtract(a, b))), rel=1e-10)
    assert pr.mde == pytest.approx(stats.mde_paired(0.5, 100))


def test_paired_clustered_matches_statsmodels_on_the_differences() -> None:
    rng = random.Random(5)
    groups = [i // 8 for i in range(160)]
    a = [float(rng.random() < 0.6) for _ in groups]
    b = [float(rng.random() < 0.5) for _ in groups]
    d = np.subtract(a, b)
    fit = sm.OLS(d, np.ones((len(d), 1))).fit(cov_type="cluster", cov_kwds={"groups": np.asarray(groups)}, use_t=True)
    pr = stats.paired(a, b, clusters=groups)
    assert pr.test == "clustered-t"
    assert pr.stderr == pytest.approx(float(fit.bse[0]), rel=1e-9)
    assert pr.p_value == pytest.approx(float(fit.pvalues[0]), rel=1e-7)
    assert pr.ci == pytest.approx(tuple(fit.conf_int()[0]), rel=1e-7)


def test_holm_matches_statsmodels() -> None:
    rng = random.Random(11)
    for m in (1, 2, 5, 17):
        ps = [rng.random() ** 3 for _ in range(m)]
        expected = multipletests(ps, method="holm")[1]
        assert stats.holm(ps) == pytest.approx(list(expected), rel=1e-12)
    assert stats.holm([0.01, None, 0.04]) == pytest.approx([0.02, None, 0.04])
    assert stats.holm([]) == []


def test_bootstrap_is_seeded_and_near_scipy() -> None:
    rng = random.Random(2)
    xs = [rng.expovariate(1.0) for _ in range(300)]
    median = lambda s: float(np.median(s))  # noqa: E731
    e1 = stats.bootstrap_estimate(xs, median, seed=7, reps=2000)
    assert e1 == stats.bootstrap_estimate(xs, median, seed=7, reps=2000)
    assert e1.method == "bootstrap" and e1.value == pytest.approx(median(xs)) and e1.ci is not None
    ref = sps.bootstrap((np.asarray(xs),), np.median, n_resamples=4000, method="percentile",
                        random_state=np.random.default_rng(0))
    assert e1.stderr == pytest.approx(ref.standard_error, rel=0.15)
    assert e1.ci[0] == pytest.approx(ref.confidence_interval.low, rel=0.1)
    assert e1.ci[1] == pytest.approx(ref.confidence_interval.high, rel=0.1)
    # the mean's bootstrap stderr approaches s/sqrt(n)
    eb = stats.bootstrap_estimate(xs, lambda s: sum(s) / len(s), seed=1, reps=2000)
    assert eb.stderr == pytest.approx(float(sps.sem(xs)), rel=0.1)


def test_paired_bootstrap_of_a_ratio_metric_is_near_scipys_paired_bootstrap() -> None:
    """A corpus-level ratio (sum of hits / sum of lengths) of two systems on the same items."""
    rng = random.Random(4)
    n = 200
    lengths = [rng.randrange(1, 10) for _ in range(n)]
    a = [(min(ln, int(ln * rng.uniform(0.5, 1.0) + 0.5)), ln) for ln in lengths]
    b = [(max(0, h - (rng.random() < 0.3)), ln) for h, ln in a]

    def ratio(items: list[tuple[int, int]]) -> float:
        return sum(h for h, _ in items) / sum(ln for _, ln in items)

    pr = stats.paired_bootstrap(a, b, ratio, seed=3, reps=2000)
    assert pr == stats.paired_bootstrap(a, b, ratio, seed=3, reps=2000)
    assert pr.test == "paired-bootstrap" and pr.diff == pytest.approx(ratio(a) - ratio(b))
    ha, hb, ln = (np.asarray(x, dtype=float) for x in ([h for h, _ in a], [h for h, _ in b], lengths))
    ref = sps.bootstrap((ha, hb, ln), lambda x, y, z: x.sum() / z.sum() - y.sum() / z.sum(), paired=True,
                        vectorized=False, n_resamples=3000, method="percentile", random_state=np.random.default_rng(0))
    assert pr.stderr == pytest.approx(ref.standard_error, rel=0.15)
    assert pr.ci is not None and pr.ci[0] > 0 and pr.p_value is not None and pr.p_value < 0.01
    same = stats.paired_bootstrap(a, a, ratio)
    assert (same.diff, same.stderr, same.ci, same.p_value) == (0.0, 0.0, None, 1.0) and "same value" in same.note
    shifted = stats.paired_bootstrap([(2, 2)] * 5, [(1, 2)] * 5, ratio)
    assert shifted.stderr is None and shifted.p_value is None and "same difference" in shifted.note
    assert stats.paired_bootstrap([], [], ratio).note == "no pairs"
    with pytest.raises(ValueError, match="one length"):
        stats.paired_bootstrap(a, b[:3], ratio)


def test_mde_formulas() -> None:
    assert stats.mde_single(0.5, 100) == pytest.approx(2.8016 * 0.05, rel=1e-4)
    assert stats.mde_paired(0.2, 400) == pytest.approx(2.8016 * math.sqrt(0.2 / 400), rel=1e-4)
    z = sps.norm.ppf(0.975) + sps.norm.ppf(0.8)
    assert stats.Z_MDE == pytest.approx(z, rel=1e-12)


def test_t_quantile_and_betainc_match_scipy() -> None:
    for df in (1, 2, 3, 7, 30, 199, 5000):
        assert stats.t_quantile_975(df) == pytest.approx(sps.t.ppf(0.975, df), rel=1e-9)
    for a, b, x in [(0.5, 0.5, 0.3), (2.0, 0.5, 0.99), (150.0, 0.5, 0.97), (3.0, 7.0, 0.01)]:
        assert stats.betainc(a, b, x) == pytest.approx(float(special.betainc(a, b, x)), rel=1e-9)


# --- coverage of the 95% intervals by simulation ---------------------------------------------


def test_plain_interval_covers_95_percent_of_binomial_datasets() -> None:
    rng = random.Random(1234)
    p, n, runs = 0.3, 120, 3000
    covered = 0
    for _ in range(runs):
        ci = stats.mean_estimate(_binary(rng, n, p)).ci
        assert ci is not None
        covered += ci[0] <= p <= ci[1]
    assert 0.93 <= covered / runs <= 0.97, covered / runs


def test_clustered_interval_covers_95_percent_and_the_plain_one_does_not() -> None:
    """40 clusters of 10 items, a random effect per cluster (its accuracy uniform in
    0.2..0.8, mean 0.5): the clustered interval covers about 95%, the plain one far less."""
    rng = random.Random(99)
    runs, clusters, size = 2000, 40, 10
    labels = [c for c in range(clusters) for _ in range(size)]
    covered_cl = covered_plain = 0
    for _ in range(runs):
        xs = []
        for _c in range(clusters):
            pc = rng.uniform(0.2, 0.8)
            xs.extend(1.0 if rng.random() < pc else 0.0 for _ in range(size))
        ci_cl = stats.mean_estimate(xs, clusters=labels).ci
        ci = stats.mean_estimate(xs).ci
        assert ci_cl is not None and ci is not None
        covered_cl += ci_cl[0] <= 0.5 <= ci_cl[1]
        covered_plain += ci[0] <= 0.5 <= ci[1]
    assert 0.93 <= covered_cl / runs <= 0.97, covered_cl / runs
    assert covered_plain / runs < 0.90, covered_plain / runs


def test_paired_interval_covers_95_percent() -> None:
    """Two correlated models (B agrees with A on 80% of items, else coin flips): the paired
    interval of the difference covers the true difference about 95% of the time."""
    rng = random.Random(7)
    runs, n = 2000, 150
    pa, agree = 0.7, 0.8
    true_diff = pa - (agree * pa + (1 - agree) * 0.5)
    covered = 0
    for _ in range(runs):
        a = _binary(rng, n, pa)
        b = [x if rng.random() < agree else float(rng.random() < 0.5) for x in a]
        ci = stats.paired(a, b).ci
        assert ci is not None
        covered += ci[0] <= true_diff <= ci[1]
    assert 0.93 <= covered / runs <= 0.97, covered / runs


# --- degenerate inputs: a stated answer ----------------------------------------------------


def test_degenerate_means_state_why_there_is_no_interval() -> None:
    one = stats.mean_estimate([1.0])
    assert (one.value, one.stderr, one.ci, one.n, one.method) == (1.0, None, None, 1, "none") and "n = 1" in one.note
    empty = stats.mean_estimate([])
    assert math.isnan(empty.value) and empty.stderr is None and empty.note == "no scores"
    assert empty.to_json()["value"] is None and stats.format_pm(empty) == "n/a"
    equal = stats.mean_estimate([1.0] * 50)
    assert equal.value == 1.0 and equal.stderr is None and equal.ci is None and "all 50 scores equal" in equal.note
    assert stats.format_pm(equal) == "1.000"
    single_cluster = stats.mean_estimate([0.0, 1.0, 1.0], clusters=["x", "x", "x"])
    assert single_cluster.stderr is None and single_cluster.clusters == 1 and "one cluster" in single_cluster.note
    nan = stats.mean_estimate([1.0, math.nan, 0.0, None, 1.0])  # type: ignore[list-item]
    assert nan.n == 3 and nan.value == pytest.approx(2 / 3) and "NaN scores dropped: 2" in nan.note
    assert nan.stderr == pytest.approx(float(sps.sem([1.0, 0.0, 1.0])))
    all_nan = stats.mean_estimate([math.nan, math.nan])
    assert all_nan.n == 0 and all_nan.stderr is None and "NaN scores dropped: 2" in all_nan.note
    assert stats.Estimate.from_json(nan.to_json()) == nan


def test_degenerate_pairs_state_why() -> None:
    same = stats.paired([1, 0, 1], [1, 0, 1])
    assert (same.diff, same.stderr, same.ci, same.p_value, same.a_only, same.b_only) == (0.0, 0.0, None, 1.0, 0, 0)
    assert "same" in same.note
    one = stats.paired([1.0], [0.0])
    assert one.stderr is None and one.p_value is None and one.test == "none" and "n = 1" in one.note
    empty = stats.paired([], [])
    assert empty.n == 0 and empty.to_json()["diff"] is None
    shifted = stats.paired([0.5, 0.7, 0.9], [0.4, 0.6, 0.8])
    assert shifted.diff == pytest.approx(0.1) and shifted.p_value is None and "same amount" in shifted.note
    nan = stats.paired([1, math.nan, 0, 1], [0, 1, math.nan, 1])
    assert nan.n == 2 and "dropped: 2" in nan.note
    one_cluster = stats.paired([1, 0, 1, 1], [0, 0, 1, 0], clusters=["s"] * 4)
    assert one_cluster.stderr is None and "one cluster" in one_cluster.note
    with pytest.raises(ValueError, match="one length"):
        stats.paired([1, 0], [1])
    with pytest.raises(ValueError, match="at least 2"):
        stats.paired_t_pvalue([0.3])


def test_degenerate_bootstrap() -> None:
    assert stats.bootstrap_estimate([], lambda s: 0.0).note == "no items"
    one = stats.bootstrap_estimate([3.0], lambda s: s[0])
    assert one.stderr is None and "n = 1" in one.note
    same = stats.bootstrap_estimate([2.0] * 10, lambda s: sum(s) / len(s))
    assert same.stderr is None and same.ci is None and "same value" in same.note
    # a statistic undefined on some resamples: those are skipped and counted
    ratio = stats.bootstrap_estimate([(1, 1), (0, 0), (0, 0)], lambda s: sum(x for x, _ in s) / sum(y for _, y in s),
                                     seed=3, reps=200)
    assert "resamples had no finite value" in ratio.note
