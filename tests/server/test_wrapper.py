"""CanaryAuditStrategy around Flower's own DP wrappers + FedAvg (no Ray): canaries are averaged
like clipped clients, carry the real replies' metric keys, every round is reported, the claim is
read from the strategy, and strategies it cannot audit are refused with what to change."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp.strategy import (
    DifferentialPrivacyClientSideFixedClipping,
    DifferentialPrivacyServerSideAdaptiveClipping,
    DifferentialPrivacyServerSideFixedClipping,
    FedAvg,
)

from flaudit.auditor.canaries import canary_vector, resolve_canary_family, seen_mask
from flaudit.auditor.spec import AuditClaim, AuditSpec
from flaudit.server.reporting import LocalRoundReporter
from flaudit.server.wrapper import CanaryAuditStrategy, LocalCanaries, read_claim
from tests.flower_rounds import dp_fedavg

SEED = 77777
K = 10
S = 0.5


pytestmark = pytest.mark.usefixtures("flower_task_identity")  # tests/conftest.py


class Grid3:
    def get_node_ids(self):
        return [1, 2, 3]


class ClaimRecorder(LocalRoundReporter):
    claims: list

    def declare_claim(self, claim):
        self.claims = [*getattr(self, "claims", []), claim]

    def final_alarm(self, name: str, seed: int, num_canaries: int, num_rounds: int | None = None):
        """The service's own alarm decision (its final look) on the statistics recorded here,
        for the first claim declared (``num_rounds``: the claim's by default)."""
        from flaudit.auditor.claims import AuditLook
        from flaudit.auditor.claims.curves import audit_claims
        from flaudit.service.live import decide, num_looks, summary_parts

        spec = AuditClaim(**self.claims[0]).apply(
            AuditSpec(
                name=name,
                engine="external",
                num_canaries=num_canaries,
                canary_repeats=1,
                max_canary_fraction=1.0,
                delta=1e-5,
            )
        )
        tracker = self.tracker
        tests = summary_parts(
            AuditLook(
                seen=seen_mask(seed, num_canaries),
                dim=tracker.dim,
                delta=spec.delta,
                max_cosines=tracker.max_cosines,
                final_cosines=tracker.final_cosines,
                threat_models=["final_model", "all_iterates"],
                known_rounds_scores=self.known_rounds.scores,
                known_rounds_rounds=self.known_rounds.rounds,
                scale_dof=tracker.scale_dof,
                claims=audit_claims(spec),
                num_rounds=num_rounds or spec.num_rounds,
            ),
            final=True,
        )[3]
        return decide(spec, tests, look=num_looks(spec))


def _dp(noise=0.0, fedavg=None):
    return DifferentialPrivacyServerSideFixedClipping(
        fedavg or FedAvg(min_train_nodes=3, min_available_nodes=3, fraction_evaluate=0.0),
        noise_multiplier=noise,
        clipping_norm=S,
        num_sampled_clients=3,
    )


def _rdp_accountant(population_size: int):
    """Flower's RDP accountant at delta 1e-5, add-or-remove-one, no sampling amplification."""
    from flwr.supercore.privacy_accounting import (
        NeighboringRelation,
        PrivacyConfig,
        SamplingMethod,
    )
    from flwr.supercore.privacy_accounting.rdp_accountant import RdpAccountant

    return RdpAccountant(
        PrivacyConfig(
            target_delta=1e-5,
            population_size=population_size,
            neighboring_relation=NeighboringRelation.ADD_OR_REMOVE_ONE,
            sampling_method=SamplingMethod.NO_AMPLIFICATION,
        )
    )


def _wrapped(reporter, *, rounds=4, repeats=2, inner=None):
    canaries = LocalCanaries(
        SEED, num_canaries=K, num_rounds=rounds, canary_repeats=repeats, clients_per_round=3
    )
    return CanaryAuditStrategy(
        inner or _dp(), reporter=reporter, canaries=canaries, num_rounds=rounds
    ), canaries


def _replies(messages, current, updates, metrics):
    out = []
    for msg, u, m in zip(messages, updates, metrics):
        vec = current + u
        parts = [vec[:600].reshape(20, 30), vec[600:]]
        content = RecordDict({"arrays": ArrayRecord(parts), "metrics": MetricRecord(m)})
        out.append(Message(content=content, reply_to=msg))
    return out


class CountingFedAvg(FedAvg):
    """Flower's FedAvg that records how many replies each round aggregates."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.aggregated: list[int] = []
        self.weights: list[list[float]] = []

    def aggregate_train(self, server_round, replies):
        replies = list(replies)
        self.aggregated.append(len(replies))
        self.weights.append(
            [float(next(iter(r.content.metric_records.values()))["num-examples"]) for r in replies]
        )
        return super().aggregate_train(server_round, replies)


def test_canaries_take_cohort_slots_and_rounds_are_reported():
    """Issue #22 item 1: a canary replaces a sampled node, so Flower's FedAvg averages exactly
    num_sampled_clients replies and each canary enters with S / n, as the noise assumes."""
    shapes = [(20, 30), (30,)]
    rng = np.random.default_rng(0)
    model = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    dim = sum(int(np.prod(s)) for s in shapes)
    reporter = ClaimRecorder.for_audit(canary_seed=SEED, num_canaries=K)
    fedavg = CountingFedAvg(min_train_nodes=3, min_available_nodes=3, fraction_evaluate=0.0)
    strategy, canaries = _wrapped(reporter, inner=_dp(fedavg=fedavg))
    assert str(SEED) not in repr(strategy) and str(SEED) not in repr(canaries)
    arrays = ArrayRecord(model)
    seen = np.flatnonzero(seen_mask(SEED, K))
    total_inserted = 0
    for t in range(1, 5):
        c = len(canaries.by_round[t])
        messages = list(strategy.configure_train(t, arrays, ConfigRecord({}), Grid3()))
        assert len(messages) == 3 - c and strategy.displaced[t] == c  # c nodes not sent to
        current = np.concatenate([a.ravel() for a in arrays.to_numpy_ndarrays()])
        updates = []
        for _ in messages:  # below the clip norm: they pass unchanged (and are non-zero)
            u = rng.standard_normal(dim).astype(np.float32)
            updates.append(u * (0.1 * S / np.linalg.norm(u)))
        # the quickstart's metrics: an extra key beside the weight (Flower's FedAvg requires
        # every reply to carry the same keys)
        replies = _replies(
            messages,
            current,
            updates,
            [{"num-examples": 10, "train_loss": 1.0 + i} for i in range(3)],
        )
        new_arrays, metrics = strategy.aggregate_train(t, replies)
        strategy.flush()  # the round is reported on the audit thread
        assert fedavg.aggregated[-1] == 3  # exactly num_sampled_clients replies
        real_mean = np.mean([1.0 + i for i in range(3 - c)]) if c < 3 else None
        if real_mean is not None:
            assert metrics["train_loss"] == pytest.approx(real_mean)  # the real clients' mean
        new = np.concatenate([a.ravel() for a in new_arrays.to_numpy_ndarrays()])
        meta = reporter.rounds[-1][1]
        assert meta.num_canaries_inserted == c and meta.cohort_size == 3
        assert meta.clipped_fraction == 0.0 and meta.num_failures == 0
        assert meta.weight_factor == pytest.approx(1.0)
        assert sorted(meta.participants) == sorted(canaries.participants(t).tolist())
        family = resolve_canary_family(None, num_canaries=K, dim=dim)
        expected_canaries = sum(
            (
                S * canary_vector(SEED, j, dim, family=family).astype(np.float64)
                for j in canaries.by_round[t]
            ),
            np.zeros(dim),
        )
        canary_part = (new.astype(np.float64) - current) * 3 - np.sum(updates, axis=0)
        assert np.allclose(canary_part, expected_canaries, atol=2e-5)
        assert set(canaries.by_round[t].tolist()) <= set(seen.tolist())
        total_inserted += c
        arrays = new_arrays
    assert total_inserted == 2 * seen.size
    assert reporter.claims[0]["clip_norm"] == S and reporter.claims[0]["num_rounds"] == 4
    assert reporter.final_model is not None  # reported after round 4 (no start(): at once)
    final = reporter.tracker.final_cosines
    mask = seen_mask(SEED, K)
    assert final[mask].min() > np.abs(final[~mask]).max()


def test_local_canaries_follow_the_built_in_schedule():
    """The wrapper's canaries of round t are the built-in ServerApp's (same schedule rule)."""
    from flaudit.auditor.schedules import participation_schedule

    canaries = LocalCanaries(SEED, num_canaries=40, num_rounds=6, canary_repeats=2, data_seed=3)
    seen = np.flatnonzero(seen_mask(SEED, 40))
    schedule = participation_schedule(
        num_clients=50,
        num_seen_canaries=seen.size,
        num_rounds=6,
        participation="uniform",
        clients_per_round=10,
        canary_repeats=2,
        seed=3,
    )
    for t in range(1, 7):
        assert canaries.by_round[t].tolist() == sorted(seen[schedule.canaries(t)].tolist())


def test_weighted_fedavg_is_audited_with_canaries_at_the_largest_weight():
    """Issue #22 item 3: unequal num-examples are audited, not refused; each canary weighs what
    the heaviest client seen so far weighs (the worst case for the claim), and the round records
    how far the weighting lifts that client above the C/n the noise is calibrated for."""
    reporter = ClaimRecorder.for_audit(canary_seed=SEED, num_canaries=K)
    fedavg = CountingFedAvg(min_train_nodes=3, min_available_nodes=3, fraction_evaluate=0.0)
    strategy, canaries = _wrapped(reporter, rounds=4, repeats=2, inner=_dp(fedavg=fedavg))
    t = next(t for t in range(1, 5) if 0 < len(canaries.by_round[t]) < 3)
    c = len(canaries.by_round[t])
    model = np.zeros(630, np.float32)
    arrays = ArrayRecord([model[:600].reshape(20, 30), model[600:]])
    for r in range(1, t):  # earlier rounds with equal weights
        messages = list(strategy.configure_train(r, arrays, ConfigRecord({}), Grid3()))
        replies = _replies(
            messages,
            model,
            [np.full(630, 1e-4, np.float32)] * 3,
            [{"num-examples": 7} for _ in range(3)],
        )
        arrays, _ = strategy.aggregate_train(r, replies)
        strategy.flush()
        assert strategy.weight_factors[r] == pytest.approx(1.0)  # equal weights: as before
        model = np.concatenate([a.ravel() for a in arrays.to_numpy_ndarrays()])
    messages = list(strategy.configure_train(t, arrays, ConfigRecord({}), Grid3()))
    weights = [10, 30, 20][: len(messages)]
    replies = _replies(
        messages,
        model,
        [np.full(630, 1e-4, np.float32)] * len(messages),
        [{"num-examples": w} for w in weights],
    )
    strategy.aggregate_train(t, replies)
    strategy.flush()
    assert fedavg.weights[-1] == [float(w) for w in weights] + [float(max(weights))] * c
    expected = max(weights) * 3 / (sum(weights) + c * max(weights))
    assert strategy.weight_factors[t] == pytest.approx(expected) and expected > 1
    assert reporter.rounds[-1][1].weight_factor == pytest.approx(expected)


def test_the_claim_is_read_from_flowers_dp_wrappers_and_completes_the_spec():
    fixed = read_claim(_dp(noise=1.3), num_rounds=5, num_nodes=4)
    assert fixed["noise_multiplier"] == 1.3 and fixed["clip_norm"] == S
    assert fixed["clients_per_round"] == 3 and fixed["num_clients"] == 4
    client = DifferentialPrivacyClientSideFixedClipping(
        FedAvg(), noise_multiplier=0.7, clipping_norm=2.0, num_sampled_clients=2
    )
    assert read_claim(client, num_rounds=2, num_nodes=2)["clip_norm"] == 2.0
    adaptive = DifferentialPrivacyServerSideAdaptiveClipping(
        FedAvg(), noise_multiplier=1.0, num_sampled_clients=2, clipped_count_stddev=1.0
    )
    claim = read_claim(adaptive, num_rounds=3, num_nodes=2)
    assert "clip_norm" not in claim
    assert claim["adaptive_clipping"]["initial_clip_norm"] == adaptive.clipping_norm
    spec = AuditClaim.model_validate(claim).apply(
        AuditSpec(num_canaries=4, clip_norm=1.0, max_canary_fraction=1.0)
    )
    assert spec.clip_norm is None and spec.num_rounds == 3
    assert spec.accounted_noise_multiplier < adaptive.noise_multiplier  # the count costs too
    plain = read_claim(FedAvg(fraction_train=0.5, min_train_nodes=1), num_rounds=2, num_nodes=10)
    assert plain["noise_multiplier"] == 0.0 and plain["clients_per_round"] == 5


def test_strategies_it_cannot_audit_are_refused_with_what_to_change():
    from flwr.server.strategy import DifferentialPrivacyClientSideFixedClipping as Legacy
    from flwr.server.strategy import FedAvg as LegacyFedAvg

    reporter = LocalRoundReporter.for_audit(canary_seed=SEED, num_canaries=K)
    legacy = Legacy(LegacyFedAvg(), noise_multiplier=1.0, clipping_norm=1.0, num_sampled_clients=2)
    with pytest.raises(ValueError, match="flwr.serverapp.strategy.DifferentialPrivacyClientSide"):
        CanaryAuditStrategy(legacy, reporter=reporter)
    with pytest.raises(ValueError, match="clip_norm"):
        CanaryAuditStrategy(FedAvg(), reporter=reporter)
    with pytest.raises(ValueError, match="clip_norm"):
        CanaryAuditStrategy(_dp(), reporter=reporter, clip_norm=0)
    accounted = DifferentialPrivacyServerSideFixedClipping(
        FedAvg(),
        noise_multiplier=1.0,
        clipping_norm=1.0,
        num_sampled_clients=2,
        accountant=_rdp_accountant(population_size=2),
    )
    CanaryAuditStrategy(accounted, reporter=reporter)  # accountant= is audited (next test)


def test_an_accounted_strategy_is_audited_and_its_accountant_sees_num_sampled_clients():
    """Issue #22 item 4: Flower's accountant checks every round's sample against
    num_sampled_clients and requires equal weights; canaries in cohort slots satisfy both, and
    the accountant's epsilon is there to show beside dp-accounting's."""
    from flaudit.server.wrapper import accountant_spent

    accountant = _rdp_accountant(population_size=3)
    inner = dp_fedavg(2.0, S, accountant=accountant)
    reporter = ClaimRecorder.for_audit(canary_seed=SEED, num_canaries=K)
    strategy, canaries = _wrapped(reporter, rounds=2, repeats=1, inner=inner)
    model = np.zeros(630, np.float32)
    arrays = ArrayRecord([model[:600].reshape(20, 30), model[600:]])
    for t in (1, 2):
        messages = list(strategy.configure_train(t, arrays, ConfigRecord({}), Grid3()))
        replies = _replies(
            messages,
            model,
            [np.full(630, 1e-4, np.float32)] * len(messages),
            [{"num-examples": 4} for _ in messages],
        )
        arrays, _ = strategy.aggregate_train(t, replies)
        model = np.concatenate([a.ravel() for a in arrays.to_numpy_ndarrays()])
    strategy.flush()
    spent = accountant_spent(strategy)
    assert spent is not None and spent.num_releases == 2 and 0 < spent.epsilon < np.inf
    assert sum(len(canaries.by_round[t]) for t in (1, 2)) > 0  # canaries were in the cohorts


def test_client_side_adaptive_clipping_aggregates_canaries_with_the_norm_bit():
    """Flower's client-side adaptive wrapper requires KEY_NORM_BIT in every reply; a canary has
    norm S(t) exactly, so its bit says "not clipped"."""
    from flwr.serverapp.strategy import DifferentialPrivacyClientSideAdaptiveClipping
    from flwr.supercore.differential_privacy import KEY_NORM_BIT

    seen_bits = []

    class Spy(FedAvg):
        def aggregate_train(self, server_round, replies):
            replies = list(replies)
            seen_bits.extend(
                next(iter(r.content.metric_records.values()))[KEY_NORM_BIT] for r in replies
            )
            return super().aggregate_train(server_round, replies)

    inner = DifferentialPrivacyClientSideAdaptiveClipping(
        Spy(min_train_nodes=3, min_available_nodes=3, fraction_evaluate=0.0),
        noise_multiplier=0.0,
        num_sampled_clients=3,
        initial_clipping_norm=S,
    )
    reporter = LocalRoundReporter.for_audit(canary_seed=SEED, num_canaries=K)
    strategy, canaries = _wrapped(reporter, rounds=2, repeats=1, inner=inner)
    assert "adaptive_clipping" in read_claim(inner, num_rounds=2, num_nodes=3)
    model = np.random.default_rng(2).standard_normal(630).astype(np.float32)
    arrays = ArrayRecord([model[:600].reshape(20, 30), model[600:]])
    messages = list(strategy.configure_train(1, arrays, ConfigRecord({}), Grid3()))
    updates = [np.full(630, 0.001 * (i + 1), np.float32) for i in range(3)]
    replies = _replies(
        messages, model, updates, [{"num-examples": 5, KEY_NORM_BIT: 1} for _ in range(3)]
    )
    new_arrays, _ = strategy.aggregate_train(1, replies)
    strategy.flush()
    c = len(canaries.by_round[1])
    assert new_arrays is not None and reporter.rounds[-1][1].num_canaries_inserted == c
    assert seen_bits == [1] * (3 - c) + [0] * c


def test_canaries_are_fetched_and_rounds_reported_while_the_clients_train():
    """configure_train needs round t's canaries (how many nodes they displace) and starts
    fetching round t+1's on its canary thread; aggregate_train hands the round to the audit
    thread and returns; a report's error surfaces at the next round (nothing lost)."""
    import threading

    fetched, release = [], threading.Event()

    class SlowService(ClaimRecorder):
        def report_round(self, server_round, update, metadata):
            if server_round == 2:
                raise RuntimeError("service refused round 2")
            release.wait(timeout=30)  # held until the test has seen aggregate_train return
            super().report_round(server_round, update, metadata)

    class CountingCanaries(LocalCanaries):
        def round_canaries(self, server_round, dim):
            fetched.append((server_round, threading.current_thread().name))
            return super().round_canaries(server_round, dim)

    reporter = SlowService.for_audit(canary_seed=SEED, num_canaries=K)
    inner = _dp()
    canaries = CountingCanaries(
        SEED, num_canaries=K, num_rounds=4, canary_repeats=2, clients_per_round=3
    )
    strategy = CanaryAuditStrategy(inner, reporter=reporter, canaries=canaries, num_rounds=4)
    model = np.zeros(630, np.float32)
    arrays = ArrayRecord([model[:600].reshape(20, 30), model[600:]])
    for t in (1, 2):
        messages = list(strategy.configure_train(t, arrays, ConfigRecord({}), Grid3()))
        if t == 1:  # round 1's canaries: fetched before its messages go out
            assert fetched[0][0] == 1
        replies = _replies(
            messages,
            model,
            [np.full(630, 1e-3, np.float32)] * 3,
            [{"num-examples": 5} for _ in range(3)],
        )
        strategy._prefetched[t + 1].result()  # round t+1's canaries, fetched while t trains
        assert fetched[-1][0] == t + 1 and fetched[-1][1].startswith("flaudit-canaries")
        arrays, _ = strategy.aggregate_train(t, replies)
        if t == 1:
            assert reporter.rounds == []  # still being reported: aggregate_train did not wait
            release.set()
    with pytest.raises(RuntimeError, match="refused round 2"):
        strategy.flush()
    assert [t for t, _ in reporter.rounds] == [1]


def test_the_run_token_never_comes_from_the_run_config(tmp_path, monkeypatch):
    """Issue #22 item 4: apps write their run config to disk (advanced-pytorch's
    run_config.json), so a token there is refused without echoing it; a token file is read."""
    for key in ("FLAUDIT_AUDIT_ID", "FLAUDIT_URL", "FLAUDIT_RUN_TOKEN", "FLAUDIT_RUN_TOKEN_FILE"):
        monkeypatch.delenv(key, raising=False)
    where = {"flaudit-audit-id": "a1", "flaudit-ingest-url": "http://127.0.0.1:9"}
    with pytest.raises(ValueError, match="must not be in the run config") as refused:
        CanaryAuditStrategy.from_env(_dp(), run_config={**where, "flaudit-run-token": "tok-123"})
    assert "tok-123" not in str(refused.value)
    with pytest.raises(ValueError, match="FLAUDIT_RUN_TOKEN_FILE"):
        CanaryAuditStrategy.from_env(_dp(), run_config=where)
    path = tmp_path / "token"
    path.write_text("tok-123\n")
    strategy = CanaryAuditStrategy.from_env(
        _dp(), run_config={**where, "flaudit-run-token-file": str(path)}
    )
    assert strategy.reporter._headers["Authorization"] == "Bearer tok-123"
    assert "tok-123" not in repr(strategy) and "tok-123" not in repr(strategy.reporter)
    monkeypatch.setenv("FLAUDIT_RUN_TOKEN", "tok-env")  # the environment wins
    strategy = CanaryAuditStrategy.from_env(_dp(), run_config=where)
    assert strategy.reporter._headers["Authorization"] == "Bearer tok-env"


class LoopGrid:
    """An in-process grid for Flower's own ``start()`` loop: each node returns its model plus a
    small update, with ``weights[node]`` as num-examples."""

    def __init__(self, nodes=(1, 2, 3), weights=None, seed=0):
        self.nodes, self.weights = list(nodes), dict(weights or {})
        self.rng = np.random.default_rng(seed)
        self.sent: list[int] = []

    def get_node_ids(self):
        return self.nodes

    def send_and_receive(self, messages, timeout=None):
        out = []
        messages = list(messages)
        self.sent.append(len(messages))
        for msg in messages:
            if msg.metadata.message_type != "train":
                continue
            record = msg.content["arrays"]
            parts = [
                a + 0.01 * self.rng.standard_normal(a.shape).astype(np.float32)
                for a in record.to_numpy_ndarrays()
            ]
            weight = self.weights.get(msg.metadata.dst_node_id, 5)
            out.append(
                Message(
                    content=RecordDict(
                        {
                            "arrays": ArrayRecord(parts),
                            "metrics": MetricRecord({"num-examples": weight}),
                        }
                    ),
                    reply_to=msg,
                )
            )
        return out


def test_an_overridden_start_keeps_running_with_canaries_in_its_rounds(tmp_path):
    """Issue #22 item 4: an app's own start() (advanced-pytorch writes results.json there)
    still runs when wrapped, and its rounds carry the canaries."""
    calls = []

    class CustomFedAvg(FedAvg):
        def start(self, grid, initial_arrays, num_rounds=3, **kwargs):
            arrays = initial_arrays
            for t in range(1, num_rounds + 1):
                replies = grid.send_and_receive(
                    self.configure_train(t, arrays, ConfigRecord({}), grid), timeout=None
                )
                arrays, _ = self.aggregate_train(t, replies)
                calls.append(t)
            (tmp_path / "results.json").write_text(f'{{"rounds": {num_rounds}}}')
            return arrays

    reporter = ClaimRecorder.for_audit(canary_seed=SEED, num_canaries=K)
    inner = CustomFedAvg(min_train_nodes=3, min_available_nodes=3, fraction_evaluate=0.0)
    canaries = LocalCanaries(SEED, num_canaries=K, num_rounds=3, clients_per_round=3)
    strategy = CanaryAuditStrategy(inner, reporter=reporter, canaries=canaries, clip_norm=S)
    model = np.zeros(630, np.float32)
    final = strategy.start(LoopGrid(), ArrayRecord([model]), num_rounds=3)
    assert calls == [1, 2, 3] and (tmp_path / "results.json").exists()  # its own loop ran
    assert [m.num_canaries_inserted for _, m in reporter.rounds] == [
        len(canaries.by_round[t]) for t in (1, 2, 3)
    ]
    assert isinstance(final, ArrayRecord) and reporter.final_model is not None
    assert "configure_train" not in vars(inner)  # nothing left patched on the app's strategy
    assert strategy.min_train_nodes == 3  # its attributes read through the wrapper
