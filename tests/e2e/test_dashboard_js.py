"""The dashboard's own small math (null densities, erfc, axis ticks, histogram normalisation,
labels) checked in the browser against scipy and by invariants. Served by a plain static file
server (``static_url``): no audit service needed."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import special, stats

pytestmark = [pytest.mark.slow, pytest.mark.browser]


@pytest.fixture(scope="module")
def js(browser, static_url):
    """Evaluate ``body`` (an async function body with the page's modules in scope)."""
    context = browser.new_context()
    page = context.new_page()
    errors = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(static_url + "index.html#/")

    def run(body: str, arg=None):
        script = (
            "async (arg) => { const stats = await import('./stats.js');"
            " const charts = await import('./charts.js'); const format = await import('./format.js');"
            f" {body} }}"
        )
        return page.evaluate(script, arg)

    yield run
    assert errors == []
    context.close()


def test_erfc_matches_scipy(js):
    xs = np.linspace(-6, 6, 241).tolist()
    got = np.array(js("return arg.map(stats.erfc);", xs))
    want = special.erfc(xs)
    np.testing.assert_allclose(got, want, rtol=2e-7, atol=1e-300)


@pytest.mark.parametrize("d", [3, 10, 100, 999])
def test_exact_cosine_density_matches_the_beta_law(js, d):
    # cos(c, v) for c uniform on the sphere: (1 + tau) / 2 ~ Beta((d-1)/2, (d-1)/2).
    a = (d - 1) / 2
    sd = 1 / np.sqrt(d)
    taus = np.linspace(-min(0.99, 6 * sd), min(0.99, 6 * sd), 101)
    got = np.array(js("return arg.taus.map((t) => stats.sphereCosineDensity(t, arg.d));", {"taus": taus.tolist(), "d": d}))
    want = stats.beta.pdf((taus + 1) / 2, a, a) / 2
    np.testing.assert_allclose(got, want, rtol=1e-6)


@pytest.mark.parametrize("d,T", [(100, 1), (10_000, 5), (9986, 50)])
def test_max_of_T_null_density_is_the_derivative_of_phi_to_the_T(js, d, T):
    xs = np.linspace(-4, 6, 201) / np.sqrt(d)
    got = np.exp(js("return arg.xs.map((x) => stats.logMaxNullDensity(x, arg.d, arg.T));", {"xs": xs.tolist(), "d": d, "T": T}))
    z = xs * np.sqrt(d)
    want = T * stats.norm.cdf(z) ** (T - 1) * stats.norm.pdf(z) * np.sqrt(d)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-9 * want.max())
    # and it is a density: integrates to ~1 over the range that holds its mass
    assert abs(np.trapezoid(got, xs) - 1) < 2e-3


def test_nice_ticks_cover_the_range_with_round_steps(js):
    rng = np.random.default_rng(0)
    cases = []
    for _ in range(300):
        lo = float(rng.normal(0, 10 ** rng.uniform(-3, 2)))
        hi = lo + float(10 ** rng.uniform(-4, 3))
        cases.append([lo, hi, int(rng.integers(2, 9))])
    results = js("return arg.map(([lo, hi, n]) => charts.niceTicks(lo, hi, n));", cases)
    for (lo, hi, n), ticks in zip(cases, results):
        assert len(ticks) >= 1
        span = hi - lo
        assert all(lo - 1e-9 * span <= t <= hi + 1e-9 * span for t in ticks), (lo, hi, ticks)
        if len(ticks) >= 2:
            steps = np.diff(ticks)
            np.testing.assert_allclose(steps, steps[0], rtol=1e-6)
            mantissa = steps[0] / 10 ** np.floor(np.log10(steps[0]))
            assert min(abs(mantissa - m) for m in (1, 2, 5, 10)) < 1e-6, steps[0]
            assert len(ticks) <= 2 * n + 2


def test_histogram_densities_integrate_to_one(js):
    rng = np.random.default_rng(1)
    edges = np.sort(rng.uniform(-0.05, 0.05, 12)).tolist()
    counts = rng.integers(0, 30, len(edges) - 1).tolist()
    dens = np.array(js("return charts.toDensity(arg.counts, arg.edges);", {"counts": counts, "edges": edges}))
    assert abs(float(np.sum(dens * np.diff(edges))) - 1) < 1e-12
    assert js("return charts.toDensity([0, 0], [0, 1, 2]);") == [0, 0]


def test_labels_and_the_bound_versus_analytic_check(js):
    out = js(
        """
        const lo = {estimator: "lower_bound", threat_model: "final_model", epsilon: 3.2, variance: "n/a", correction: "bonferroni", confidence: 0.95, details: {}};
        const rdp = {estimator: "analytic", threat_model: "poisson_subsampled", epsilon: 2.5, variance: "n/a", correction: "n/a", details: {accountant: "rdp"}};
        const pld = {...rdp, epsilon: 4.0, details: {accountant: "pld"}};
        const known = {...pld, threat_model: "known_rounds", epsilon: 3.0};
        const loUncorrected = {...lo, epsilon: 9.0, correction: "none"};
        const inf = {estimator: "two_gaussian", threat_model: "final_model", epsilon: "inf", variance: "null", correction: "n/a", details: {}};
        return {
          violations: format.boundViolations([lo, loUncorrected, rdp, pld, known, inf]).map((v) => [v.bound.epsilon, v.analytic.threat_model]),
          keysDiffer: format.seriesKey(rdp) !== format.seriesKey(pld),
          infText: format.fmtEps(inf.epsilon),
          infValue: format.epsValue("inf") === Infinity,
          label: format.estimateLabel(inf),
          defaults: [...format.defaultSeries([lo, {...lo, correction: "none"}, inf, {...inf, variance: "fitted"}])],
        };
        """
    )
    # only the valid bound (3.2 > 3.0 known rounds); not the uncorrected 9.0, not the Poisson claims
    assert out["violations"] == [[3.2, "known_rounds"]]
    assert out["keysDiffer"] and out["infValue"]
    assert out["infText"] == "∞"
    assert "σ² = 1/d" in out["label"] and "final model" in out["label"]
    assert sorted(out["defaults"]) == sorted(
        ["lower_bound|final_model|n/a|bonferroni", "two_gaussian|final_model|null|n/a"]
    )
