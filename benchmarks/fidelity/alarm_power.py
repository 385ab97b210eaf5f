"""The DP alarm's power and validity on exact Gaussian canary scores (issue #19 "Done when").

Vectorised simulation of what the service sees in a DP-FedAvg audit with claim ``z`` (noise
multiplier), canary repeats ``r = 1``, ``T`` rounds, ``k`` canaries: each canary is seen by a fair
coin and has one round drawn uniformly from ``1..T`` (seen: inserted there; unseen: the round the
schedule drew for it). With the noise ``s`` times the claimed noise, a seen canary's known-rounds
normal score is ``N(1 / (z s), 1)`` and its final-model normal score ``N(1 / (z s sqrt(T)), 1)``
(the noise of all ``T`` rounds accumulates in the final model; no momentum, clients' projections
negligible); unseen scores are exactly ``N(0, 1)`` (the exact null). This is the distribution the
statistics have in DP-FedAvg with orthogonal canaries and Gaussian noise when the noise scale is
measured on far more coordinates than there are canaries (``d - k`` large: the scores are then
independent and the claim tests take them with a known scale, ``RoundSums.from_scores``); the
end-to-end cells of docs/fidelity.md run the real simulator, shared scale included.

Per run and look ``t = 1 .. T + 1`` (``T + 1`` is the final look):
* **new alarm** (auditor/claims): the shipped decision, ``decide_alarm``, on the claim tests of
  each look: the known-rounds normal-score test on the seen canaries scored so far; at the final
  look also the final-model normal-score test and the one-run f-DP test (assumption-free tier);
  ``decide_alarm`` holds each to its ``look_level``;
* **old alarm** (main before #19, emulated on the same scores): ``claim_test`` with the null from
  the unseen canaries and Bonferroni over 20 thresholds on the known-rounds scores at
  ``0.025 / T`` per round look, and at the final look the known-rounds and the final-model
  (exact null, Bonferroni 20) claim tests at ``0.025 / 2`` each;
* **NP limit**: the most powerful level-0.05 test of the claim from the seen scores alone at the
  end (the seen-score mean), closed form ``E Phi((1/s - 1) sqrt(k_seen) / z - z_0.95)``.

Rerun (first pass, about 3 minutes on one core)::

    PYTHONPATH=. python -m benchmarks.fidelity.alarm_power --runs 400
    PYTHONPATH=. python -m benchmarks.fidelity.alarm_power --validity --runs 1400
    PYTHONPATH=. python -m benchmarks.fidelity.alarm_power --coverage --runs 1400
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np
from scipy import special, stats

from flaudit.auditor.claims.alarm import decide_alarm
from flaudit.auditor.claims.curve_tests import ClaimTestResult, claim_test
from flaudit.auditor.claims.curves import GaussianDPClaim
from flaudit.auditor.claims.fdp import fdp_claim_test
from flaudit.auditor.claims.normal_scores import RoundSums, normal_score_test
from flaudit.auditor.claims.tiers import AlarmTest
from flaudit.auditor.estimators.lower_bound import Bonferroni
from flaudit.auditor.results import Correction

from ._common import binomial_limit, clopper_pearson

__all__ = [
    "simulate_scores",
    "normal_score_claim_test",
    "new_alarm_first_look",
    "old_alarm_first_look",
    "np_limit_power",
]

_DIM = 10_000  # model dimension for the old final-model test's cosines (exact null)


def simulate_scores(
    rng, *, k: int, num_rounds: int, noise_scale: float, z: float = 1.0, seen_law=None
) -> dict:
    """One run's scores. ``seen_law(rng, n, mu)`` draws seen known-rounds normal scores that a
    ``mu``-GDP mechanism could produce (default ``N(mu, 1)``)."""
    seen = rng.random(k) < 0.5
    rounds = rng.integers(1, num_rounds + 1, k)
    mu_round = 1.0 / (z * noise_scale)
    known = rng.normal(0.0, 1.0, k)
    n_seen = int(seen.sum())
    if seen_law is None:
        known[seen] += mu_round
    else:
        known[seen] = seen_law(rng, n_seen, mu_round)
    final = rng.normal(0.0, 1.0, k)
    final[seen] += mu_round / math.sqrt(num_rounds)
    return {"seen": seen, "rounds": rounds, "known": known, "final": final}


def normal_score_claim_test(
    scores: np.ndarray, claim: GaussianDPClaim, threat_model: str, test: AlarmTest
) -> ClaimTestResult:
    """The normal-score claim test on independent scores, in the form the service hands to the
    alarm (``summarize``'s ``claim_tests``: ``details["test"]`` names the alarm test). The
    per-release sums are left out of ``details`` (they only serve ``refuted_by["mu_lo"]``, which
    the first-look count does not read; leaving them out halves the cost of a run)."""
    result = normal_score_test(RoundSums.from_scores(scores), claim_mu=claim.mu)
    return ClaimTestResult(
        result.p_value,
        claim,
        threat_model,
        Correction.not_applicable,
        "normal-score test",
        {"test": test.value},
    )


def new_alarm_first_look(
    run: dict, *, num_rounds: int, z: float = 1.0, alpha: float = 0.05, with_fdp: bool = True
) -> int | None:
    """First look at which the shipped alarm (:func:`decide_alarm`) fires (None: never)."""
    claim = GaussianDPClaim(1.0 / z, threat_model="known_rounds")
    looks = num_rounds + 1
    seen, rounds, known = run["seen"], run["rounds"], run["known"]
    for t in range(1, looks + 1):
        scored = rounds <= min(t, num_rounds)
        tests = [
            normal_score_claim_test(
                known[seen & scored], claim, "known_rounds", AlarmTest.known_rounds_normal_scores
            )
        ]
        if t == looks:  # the other tests spend their level at the final look only
            tests.append(
                normal_score_claim_test(
                    run["final"][seen], claim, "final_model", AlarmTest.final_model_normal_scores
                )
            )
            if with_fdp:
                tests.append(fdp_claim_test(known, seen, claim=claim))
        if decide_alarm(tests, look=t, num_looks=looks, alpha=alpha).status == "error":
            return t
    return None


def _to_cosines(z_scores: np.ndarray, dim: int = _DIM) -> np.ndarray:
    a = (dim - 1) / 2.0
    return 2.0 * special.betaincinv(a, a, special.ndtr(z_scores)) - 1.0


def old_alarm_first_look(run: dict, *, num_rounds: int, z: float = 1.0) -> int | None:
    """First look at which main's alarm before #19 (emulated) fires."""
    claim = GaussianDPClaim(1.0 / z)
    looks = num_rounds + 1
    seen, rounds, known = run["seen"], run["rounds"], run["known"]
    for t in range(1, num_rounds + 1):
        scored = rounds <= t
        s, u = known[seen & scored], known[~seen & scored]
        if s.size < 2 or u.size < 2:
            continue
        p = claim_test(s, u, claim=claim, correction=Bonferroni()).p_value
        if p <= 0.025 / num_rounds:
            return t
    s, u = known[seen], known[~seen]
    p_known = claim_test(s, u, claim=claim, correction=Bonferroni()).p_value
    p_final = claim_test(
        _to_cosines(run["final"][seen]), claim=claim, d=_DIM, correction=Bonferroni()
    ).p_value
    if min(p_known, p_final) <= 0.025 / 2:
        return looks
    return None


def np_limit_power(k: int, noise_scale: float, *, z: float = 1.0, alpha: float = 0.05) -> float:
    """Power of the level-``alpha`` seen-mean test at the end, averaged over the seen count."""
    n = np.arange(1, k + 1)
    w = stats.binom.pmf(n, k, 0.5)
    shift = (1.0 / noise_scale - 1.0) / z * np.sqrt(n)
    return float(np.sum(w * special.ndtr(shift - special.ndtri(1 - alpha))))


def power_table(ks, scales, *, runs: int, num_rounds: int = 10, seed: int = 0) -> list[dict]:
    rows = []
    for k in ks:
        for s in scales:
            rng = np.random.default_rng([seed, k, int(round(s * 1000))])
            new_hits = old_hits = 0
            first = []
            for _ in range(runs):
                run = simulate_scores(rng, k=k, num_rounds=num_rounds, noise_scale=s)
                look = new_alarm_first_look(run, num_rounds=num_rounds)
                new_hits += look is not None
                first.append(look if look is not None else num_rounds + 2)
                old_hits += old_alarm_first_look(run, num_rounds=num_rounds) is not None
            rows.append(
                {
                    "k": k,
                    "s": s,
                    "runs": runs,
                    "new": new_hits,
                    "old": old_hits,
                    "np": np_limit_power(k, s),
                    "median_look": float(np.median(first)),
                }
            )
    return rows


_SEEN_LAWS = {
    # each draws seen normal scores of a mechanism meeting mu-GDP towards the canary
    "gaussian_on_claim": lambda rng, n, mu: rng.normal(mu, 1.0, n),
    "mixture_half_absent": lambda rng, n, mu: rng.normal(0.0, 1.0, n) + mu * (rng.random(n) < 0.5),
    "ties_clipped_at_mu": lambda rng, n, mu: np.minimum(rng.normal(mu, 1.0, n), mu),
}


def _shift_family_law(dist, theta: float):
    """Seen normal scores of the shift family ``X + theta`` vs null ``X ~ dist``: ``Z = Phi^-1(F(X +
    theta))``; and the smallest ``mu`` it is ``mu``-GDP for (max over thresholds of
    ``Phi^-1(1 - FPR) - Phi^-1(FNR)``, numerically)."""
    x = np.linspace(-60, 60, 240_001)
    fpr_log = dist.logsf(x)
    fnr_log = dist.logcdf(x - theta)
    mu = float(np.max(-special.ndtri_exp(fpr_log) - special.ndtri_exp(fnr_log)))

    def law(rng, n, _mu_ignored):
        return -special.ndtri_exp(dist.logsf(dist.rvs(size=n, random_state=rng) + theta))

    return law, mu


def validity_table(
    *, runs: int, k: int = 1000, num_rounds: int = 10, seed: int = 1, on_row=None
) -> list[dict]:
    rows = []
    laws = dict(_SEEN_LAWS)
    for name, dist, theta in (
        ("laplace_on_claim", stats.laplace(), 1.0),
        ("student_t3_on_claim", stats.t(3), 1.0),
    ):
        law, mu = _shift_family_law(dist, theta)
        laws[name] = (law, mu)
    for name, law in laws.items():
        if isinstance(law, tuple):
            law, mu_claim = law
        else:
            mu_claim = 1.0
        z = 1.0 / mu_claim
        rng = np.random.default_rng([seed, hash(name) % 2**31])
        hits = 0
        for _ in range(runs):
            run = simulate_scores(
                rng, k=k, num_rounds=num_rounds, noise_scale=1.0, z=z, seen_law=law
            )
            # the final model of such a mechanism: seen scores no better than N(mu / sqrt(T), 1)
            hits += new_alarm_first_look(run, num_rounds=num_rounds, z=z) is not None
        rows.append({"law": name, "claim_mu": mu_claim, "runs": runs, "false_alarms": hits})
        if on_row is not None:
            on_row(rows[-1])
    return rows


def coverage_table(
    *,
    runs: int,
    ks=(50, 100, 200, 500, 1000),
    mus=(0.0, 0.5, 1.0, 2.0, 4.0, 6.0),
    confidence: float = 0.95,
    seed: int = 2,
) -> list[dict]:
    """How often ``mu_lo`` (normal-score test inverted at ``1 - confidence``) exceeds the true
    ``mu`` (target <= 5%), and its mean; half of ``k`` seen on average (fair coins)."""
    rows = []
    laws = [("gaussian", mu, None) for mu in mus]
    for name, dist in (("laplace", stats.laplace()), ("student_t3", stats.t(3))):
        law, mu = _shift_family_law(dist, 1.0)
        laws.append((name, mu, law))
    for k in ks:
        for name, mu, law in laws:
            if law is not None and k != 1000:
                continue
            rng = np.random.default_rng([seed, k, int(round(mu * 1000)), len(name)])
            over, total = 0, 0.0
            for _ in range(runs):
                n = int((rng.random(k) < 0.5).sum())
                scores = rng.normal(mu, 1.0, n) if law is None else law(rng, n, mu)
                lo = normal_score_test(RoundSums.from_scores(scores), claim_mu=mu).mu_lo(
                    1.0 - confidence
                )
                over += lo > mu
                total += lo
            rows.append(
                {
                    "k": k,
                    "law": name,
                    "mu": mu,
                    "runs": runs,
                    "over": over,
                    "mean_mu_lo": total / runs,
                }
            )
    return rows


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=400)
    parser.add_argument("--validity", action="store_true")
    parser.add_argument("--coverage", action="store_true")
    parser.add_argument("--k", type=int, default=1000, help="canaries (--validity)")
    parser.add_argument("--ks", default="1000,200")
    parser.add_argument("--scales", default="0.5,0.6,0.7,0.75,0.8,0.85,0.9,1.0")
    args = parser.parse_args(argv)
    start = time.time()
    # the validity verdict: a limit from the binomial that a correct 5% procedure exceeds with
    # probability <= 1e-3 (its power against a true 8% is printed beside it)
    check = binomial_limit(args.runs, 0.05, false_fail=1e-3, against=0.08)
    if args.coverage:
        print(f"# mu_lo (95%) of the normal-score test, {args.runs} runs per cell; check: {check}")
        print(
            "| k | seen scores | true mu | mu_lo > true mu | 95% CI | mean mu_lo | within limit |"
        )
        print("|---|---|---|---|---|---|---|")
        for row in coverage_table(runs=args.runs):
            lo, hi = clopper_pearson(row["over"], row["runs"])
            print(
                f"| {row['k']} | {row['law']} | {row['mu']:.3g} | {row['over'] / row['runs']:.1%} "
                f"| {lo:.1%}-{hi:.1%} | {row['mean_mu_lo']:.3f} | "
                f"{'yes' if check.passes(row['over']) else 'NO'} |"
            )
    elif args.validity:
        print(
            f"# false alarms over all 11 looks and all tests, k = {args.k}, T = 10, {args.runs} runs; "
            f"check: {check}"
        )
        print(
            "| seen scores (mechanism meets its claim) | claim mu | false alarms | 95% CI | within limit |"
        )
        print("|---|---|---|---|---|")

        def show(row):
            lo, hi = clopper_pearson(row["false_alarms"], row["runs"])
            print(
                f"| {row['law']} | {row['claim_mu']:.3f} | {row['false_alarms'] / row['runs']:.1%} "
                f"| {lo:.1%}-{hi:.1%} | {'yes' if check.passes(row['false_alarms']) else 'NO'} |",
                flush=True,
            )

        validity_table(runs=args.runs, k=args.k, on_row=show)
    else:
        print(
            f"# claim z = 1, r = 1, T = 10, {args.runs} runs per cell (same runs for both alarms)"
        )
        print(
            "| k | noise x s | new alarm | old alarm | NP limit (seen mean, end) | new: median first look |"
        )
        print("|---|---|---|---|---|---|")
        for k in [int(x) for x in args.ks.split(",")]:
            for scale in [float(x) for x in args.scales.split(",")]:
                (row,) = power_table([k], [scale], runs=args.runs)
                look = row["median_look"]
                print(
                    f"| {row['k']} | {row['s']:g} | {row['new'] / row['runs']:.1%} | "
                    f"{row['old'] / row['runs']:.1%} | {row['np']:.1%} | "
                    f"{'never' if look > 11 else f'{look:g}'} |",
                    flush=True,
                )
    print(f"# {time.time() - start:.0f} s")


if __name__ == "__main__":
    main()
