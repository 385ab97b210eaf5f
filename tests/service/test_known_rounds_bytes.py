"""The known-rounds state as the database keeps it (service/tables.py): a state with round
signal factors (issue #38) round-trips; one without them is written byte for byte as before and
an older layout (no per-round sums, or sums and counts only) still loads, at the claim."""

from __future__ import annotations

import numpy as np

from flaudit.auditor.claims.known_rounds import KnownRoundsState
from flaudit.service.tables import known_rounds_from_bytes, known_rounds_to_bytes

K = 6


def _state(rounds: int, factors=()) -> KnownRoundsState:
    rng = np.random.default_rng(rounds)
    return KnownRoundsState(
        sums=rng.standard_normal(K),
        counts=np.arange(K, dtype=np.int64),
        num_rounds=rounds,
        round_sums=rng.standard_normal(rounds),
        round_counts=np.ones(rounds, dtype=np.int64),  # a count of 1 ends the older layout
        round_factors=np.asarray(factors, dtype=np.float64),
    )


def _same(a: KnownRoundsState, b: KnownRoundsState) -> None:
    for name in ("sums", "counts", "round_sums", "round_counts", "round_factors"):
        assert np.array_equal(getattr(a, name), getattr(b, name)), name
    assert a.num_rounds == b.num_rounds


def test_round_factors_round_trip():
    for rounds in (1, 2, 3, 7):
        state = _state(rounds, factors=np.linspace(1.0, 2.5, rounds))
        _same(known_rounds_from_bytes(known_rounds_to_bytes(state), rounds, K), state)


def test_a_state_without_factors_is_written_as_before_and_loads_without_them():
    for rounds in (0, 1, 2, 3, 5):
        state = _state(rounds)
        data = known_rounds_to_bytes(state)
        assert len(data) == 16 * K + 16 * rounds  # the layout before round factors
        _same(known_rounds_from_bytes(data, rounds, K), state)
    # the layout before per-round sums: sums and counts only
    head = known_rounds_to_bytes(_state(0))
    loaded = known_rounds_from_bytes(head, 4, K)
    assert loaded.round_sums.size == 0 and loaded.round_factors.size == 0
