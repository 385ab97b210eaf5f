"""The dashboard's own small math (null densities, erfc, histogram normalisation) and its human
names for the API's identifiers, checked in the browser against scipy and by invariants. Served
by a plain static file server (``static_url``): no audit service needed."""

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
    got = np.array(
        js(
            "return arg.taus.map((t) => stats.sphereCosineDensity(t, arg.d));",
            {"taus": taus.tolist(), "d": d},
        )
    )
    want = stats.beta.pdf((taus + 1) / 2, a, a) / 2
    np.testing.assert_allclose(got, want, rtol=1e-6)


@pytest.mark.parametrize("d,T", [(100, 1), (10_000, 5), (9986, 50)])
def test_max_of_T_null_density_is_the_derivative_of_phi_to_the_T(js, d, T):
    xs = np.linspace(-4, 6, 201) / np.sqrt(d)
    got = np.exp(
        js(
            "return arg.xs.map((x) => stats.logMaxNullDensity(x, arg.d, arg.T));",
            {"xs": xs.tolist(), "d": d, "T": T},
        )
    )
    z = xs * np.sqrt(d)
    want = T * stats.norm.cdf(z) ** (T - 1) * stats.norm.pdf(z) * np.sqrt(d)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-9 * want.max())
    # and it is a density: integrates to ~1 over the range that holds its mass
    assert abs(np.trapezoid(got, xs) - 1) < 2e-3


def test_histogram_densities_integrate_to_one(js):
    rng = np.random.default_rng(1)
    edges = np.sort(rng.uniform(-0.05, 0.05, 12)).tolist()
    counts = rng.integers(0, 30, len(edges) - 1).tolist()
    dens = np.array(
        js("return charts.toDensity(arg.counts, arg.edges);", {"counts": counts, "edges": edges})
    )
    assert abs(float(np.sum(dens * np.diff(edges))) - 1) < 1e-12
    assert js("return charts.toDensity([0, 0], [0, 1, 2]);") == [0, 0]


def test_every_identifier_the_service_sends_has_a_human_name(js):
    from flaudit.auditor.results import Correction, Estimator, VarianceTreatment

    estimators = [e.value for e in Estimator]
    out = js(
        """
        const names = arg.estimators.map((id) => [id, format.ESTIMATORS[id]?.name, format.ESTIMATORS[id]?.assumes, format.ESTIMATORS[id]?.explains]);
        const labels = [];
        for (const estimator of arg.estimators)
          for (const threat_model of ["final_model", "all_iterates", "known_rounds", "poisson_subsampled"])
            for (const variance of arg.variances)
              for (const correction of arg.corrections)
                labels.push([format.estimateLabel({estimator, threat_model, variance, correction, details: {accountant: "pld"}}),
                             format.threatLabel(threat_model), format.correctionLabel(correction),
                             format.estimateKind({estimator, correction, confidence: 0.95})]);
        return {
          names, labels,
          diag: ["anderson_darling_seen_final", "anderson_darling_unseen_max", "bootstrap_final_model_epsilon", "unseen_vs_null"].map((name) => format.diagnosticName({name})),
          text: format.humanText("the known_rounds claim (1-Gaussian DP) rejected by the final_model scores; bug noise_scale=0.5; the seen_final cosines"),
          inf: format.fmtEps("inf"),
        };
        """,
        {
            "estimators": estimators,
            "variances": [v.value for v in VarianceTreatment],
            "corrections": [c.value for c in Correction],
        },
    )
    for identifier, name, assumes, explains in out["names"]:
        assert name and assumes and explains, identifier
    everything = [t for row in out["labels"] for t in row] + out["diag"] + [out["text"]]
    for text in everything:
        assert "_" not in text, text
    assert "Gaussian DP with μ = 1" in out["text"] and "-Gaussian DP" not in out["text"]
    assert "noise × 0.5" in out["text"] and "known-rounds" in out["text"]
    assert out["inf"] == "∞"


def test_the_page_and_the_report_speak_one_vocabulary(js):
    """format.js (the page) and service/vocabulary.py (the printable report) read one file: the
    same estimate labels, adversaries and free-text rewording for the same identifiers."""
    from flaudit.service import vocabulary

    estimates = [
        {
            "estimator": e,
            "threat_model": t,
            "variance": v,
            "correction": c,
            "details": {"accountant": "rdp"},
        }
        for e in ("two_gaussian", "lower_bound", "analytic", "normal_scores", "unknown")
        for t in ("final_model", "known_rounds", "nobody")
        for v in ("null", "fitted", "n/a")
        for c in ("bonferroni", "none", "n/a")
    ]
    texts = [
        "bug injected: noise_scale=0.2 (testing only)",
        "no_clipping=4 and extra_participation=3",
        "the seen_final cosines (2-Gaussian DP); mu at final_model",
    ]
    out = js(
        "return {labels: arg.estimates.map(format.estimateLabel),"
        " threats: arg.estimates.map((e) => format.threatLabel(e.threat_model)),"
        " texts: arg.texts.map(format.humanText),"
        " unseen: format.diagnosticName({name: 'unseen_known_rounds_vs_null'})};",
        {"estimates": estimates, "texts": texts},
    )
    assert out["labels"] == [vocabulary.estimate_label(e) for e in estimates]
    assert out["threats"] == [vocabulary.threat_label(e["threat_model"]) for e in estimates]
    assert out["texts"] == [vocabulary.human_text(t) for t in texts]
    assert all("_" not in t for t in out["texts"]), out["texts"]
    assert "Another check" not in out["unseen"] and "_" not in out["unseen"]
