"""Small helpers shared by the fidelity benchmarks and tests (binomial intervals, Monte-Carlo
limits from the binomial, the looks of a simulated run, JSON output)."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from scipy import stats

from flaudit.auditor.claims import AuditLook, AuditSummary, summarize


def clopper_pearson(successes: int, trials: int, confidence: float = 0.95) -> tuple[float, float]:
    """Two-sided Clopper-Pearson interval for a binomial rate."""
    a = 1 - confidence
    lo = 0.0 if successes == 0 else float(stats.beta.ppf(a / 2, successes, trials - successes + 1))
    hi = (
        1.0
        if successes == trials
        else float(stats.beta.ppf(1 - a / 2, successes + 1, trials - successes))
    )
    return lo, hi


@dataclass(frozen=True)
class BinomialLimit:
    """A Monte-Carlo validity check designed from the binomial: ``runs`` seeded runs of a
    procedure claimed to fail (false alarm, bound above the truth) at rate ``nominal``; the check
    passes while the count is at most ``limit``.

    ``false_fail`` is ``P[Bin(runs, nominal) > limit]`` (how often a correct procedure at exactly
    the nominal rate fails the check) and ``power`` is ``P[Bin(runs, against) > limit]`` (how
    often a procedure whose true rate is ``against`` fails it).
    """

    runs: int
    nominal: float
    limit: int
    false_fail: float
    against: float
    power: float

    def passes(self, count: int) -> bool:
        return int(count) <= self.limit

    def __str__(self) -> str:
        return (
            f"<= {self.limit} of {self.runs} (P[fail | {self.nominal:.0%}] = {self.false_fail:.1e}, "
            f"P[fail | {self.against:.0%}] = {self.power:.3f})"
        )


def binomial_limit(
    runs: int, nominal: float = 0.05, *, false_fail: float = 1e-3, against: float | None = None
) -> BinomialLimit:
    """The smallest limit ``L`` with ``P[Bin(runs, nominal) > L] <= false_fail``, and the power of
    "count <= L" against a true rate ``against`` (default ``1.6 x nominal``: 8% for 5%)."""
    if runs < 1 or not 0 < nominal < 1 or not 0 < false_fail < 1:
        raise ValueError(
            f"need runs >= 1 and nominal, false_fail in (0, 1); got {runs}, {nominal}, {false_fail}"
        )
    against = 1.6 * nominal if against is None else against
    limit = int(stats.binom.isf(false_fail, runs, nominal))
    return BinomialLimit(
        runs,
        nominal,
        limit,
        float(stats.binom.sf(limit, runs, nominal)),
        against,
        float(stats.binom.sf(limit, runs, against)),
    )


def runs_needed(
    nominal: float = 0.05,
    *,
    false_fail: float = 1e-3,
    against: float | None = None,
    power: float = 0.9,
) -> int:
    """Fewest runs whose :func:`binomial_limit` fails a true rate ``against`` with ``power``."""
    runs = 10
    while binomial_limit(runs, nominal, false_fail=false_fail, against=against).power < power:
        runs = int(runs * 1.05) + 1
    lo = max(1, int(runs / 1.05) - 1)
    for n in range(lo, runs + 1):  # the power is not monotone in n (discreteness): first one
        if binomial_limit(n, nominal, false_fail=false_fail, against=against).power >= power:
            return n
    return runs


def rate_consistent_with(
    successes: int,
    trials: int,
    limit: float,
    *,
    false_fail: float = 1e-3,
    against: float | None = None,
    min_power: float = 0.9,
) -> bool:
    """True while ``successes`` of ``trials`` is at most :func:`binomial_limit` (a correct
    procedure at rate ``limit`` fails this with probability <= ``false_fail``).

    Raises ``ValueError`` when ``trials`` are too few for the check to fail a procedure whose
    true rate is ``against`` (default ``1.6 x limit``) with probability ``min_power``: a check
    that passes a 7% procedure half of the time at 300 runs says nothing.
    """
    check = binomial_limit(trials, limit, false_fail=false_fail, against=against)
    if check.power < min_power:
        need = runs_needed(limit, false_fail=false_fail, against=check.against, power=min_power)
        raise ValueError(
            f"{trials} runs cannot tell a {limit:.0%} rate from {check.against:.0%} "
            f"(power {check.power:.2f} < {min_power}); use at least {need} runs"
        )
    return check.passes(successes)


def end_statistics(result) -> dict:
    """A simulated run's statistics at the end (a
    :class:`~flaudit.server.simulated_audit.FedAvgAuditResult`), as :class:`AuditLook` fields: the
    max-over-rounds and final-model cosines, the known-rounds scores and their per-round sums."""
    return dict(
        max_cosines=result.max_cosines,
        final_cosines=result.final_cosines,
        known_rounds_scores=result.known_rounds_scores,
        known_rounds_rounds=result.known_rounds_rounds,
    )


def look_summaries(
    result,
    delta: float,
    num_rounds: int,
    at_round: Callable[[int], dict],
    at_end: dict,
    **every_look,
) -> Iterator[tuple[int, AuditSummary]]:
    """``(look, summary)`` at each of a simulated run's ``T + 1`` looks, as the service makes
    them: after round ``t = 1..T`` on the fields ``at_round(t)``, then (look ``T + 1``) at the end
    on ``at_end``; ``every_look`` fields go to every look. Lazy: a caller that stops at the first
    alarm summarizes no further."""
    for t in range(1, num_rounds + 1):
        look = AuditLook(seen=result.seen, dim=result.dim, delta=delta, **at_round(t), **every_look)
        yield t, summarize(look)
    end = AuditLook(seen=result.seen, dim=result.dim, delta=delta, **at_end, **every_look)
    yield num_rounds + 1, summarize(end)


def fmt(x: float, digits: int = 2) -> str:
    if isinstance(x, float) and math.isinf(x):
        return "inf"
    return f"{x:.{digits}f}"


def dump(obj) -> str:
    def default(o):
        if isinstance(o, float) and math.isinf(o):
            return "inf"
        return str(o)

    return json.dumps(obj, default=default)
