"""The ServerApp main loop against an in-process fake Grid (no Ray): canary insertion,
failure accounting, what clients receive, timeouts."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from flwr.app import ArrayRecord, Error, Message, MetricRecord, RecordDict

from flaudit.auditor.canaries import canary_vector, resolve_canary_family, seen_mask
from flaudit.auditor.schedules import participation_schedule
from flaudit.auditor.spec import AuditSpec
from flaudit.auditor.statistics import CosineTracker
from flaudit.clients.tasks import load_task
from flaudit.server.app import AuditRuntime, check_dimension, run_audit
from flaudit.server.reporting import LocalRoundReporter

SEED = 0xC0FFEE


class RecordingReporter(LocalRoundReporter):
    def report_round(self, server_round, delta, metadata):
        super().report_round(server_round, delta, metadata)
        self.deltas = getattr(self, "deltas", []) + [np.array(delta)]


pytestmark = pytest.mark.usefixtures("flower_task_identity")  # tests/conftest.py


class FakeGrid:
    """Nodes 101.. ; ``behaviour(node, msg)`` returns a delta, raises (-> error reply) or None (-> lost)."""

    def __init__(self, nodes, behaviour):
        self.nodes, self.behaviour, self.sent = nodes, behaviour, []

    def get_node_ids(self):
        return list(self.nodes)

    def send_and_receive(self, messages, *, timeout=None):
        replies = []
        for msg in messages:
            self.sent.append(msg)
            try:
                delta = self.behaviour(msg.metadata.dst_node_id, msg)
            except RuntimeError as error:
                replies.append(Message(Error(code=1, reason=str(error)), reply_to=msg))
                continue
            if delta is None:
                continue
            content = RecordDict(
                {"arrays": ArrayRecord([delta]), "metrics": MetricRecord({"train-loss": 1.0})}
            )
            replies.append(Message(content=content, reply_to=msg))
        return replies


def _spec(**overrides):
    options = dict(
        task="synthetic",
        task_options={"dim": 2000, "test_size": 50},
        num_rounds=4,
        num_clients=6,
        clients_per_round=4,
        participation="uniform",
        num_canaries=6,
        noise_multiplier=0.0,
        clip_norm=0.5,
        server_learning_rate=1.0,
        canary_repeats=2,
    )
    options.update(overrides)
    return AuditSpec(**options)


def _run(spec, behaviour, nodes=(101, 102, 103), **runtime_kwargs):
    dim = load_task(spec.task, num_partitions=spec.num_clients, options=spec.task_options).dim()
    reporter = RecordingReporter(
        CosineTracker(SEED, spec.num_canaries, dim, family=spec.canary_family)
    )
    grid = FakeGrid(nodes, behaviour)
    if "canaries" not in runtime_kwargs:
        runtime_kwargs["canary_seed"] = SEED
    runtime = AuditRuntime(spec=spec, reporter=reporter, noise_seed=1, **runtime_kwargs)
    result = run_audit(grid, runtime)
    return result, reporter, grid


def _schedule(spec, seen):
    """The participation schedule the runs here use (6 clients, 4 rounds of 4, uniform, each
    seen canary in 2 rounds)."""
    return participation_schedule(
        num_clients=6,
        num_seen_canaries=seen.size,
        num_rounds=4,
        participation="uniform",
        clients_per_round=4,
        sampling_probability=spec.sampling_probability,
        canary_repeats=2,
        seed=0,
    )


@pytest.mark.parametrize("canary_family", [None, "gaussian"])
def test_zero_noise_silent_clients_model_moves_by_exactly_the_scheduled_canaries(canary_family):
    spec = _spec(canary_family=canary_family)

    def zero(node, msg):
        return np.zeros_like(msg.content["arrays"].to_numpy_ndarrays()[0])

    result, reporter, grid = _run(spec, zero)
    dim = result["dim"]
    family = resolve_canary_family(canary_family, num_canaries=spec.num_canaries, dim=dim)
    assert result["canary_family"] == family.value == (canary_family or "orthogonal")
    assert reporter.tracker.family is family
    seen = np.flatnonzero(seen_mask(SEED, spec.num_canaries))
    schedule = _schedule(spec, seen)
    theta = reporter.initial_model.astype(np.float64)
    for t, (round_number, meta) in enumerate(reporter.rounds, start=1):
        assert round_number == t
        expected = (
            sum(
                (
                    0.5 * canary_vector(SEED, int(seen[p]), dim, family=family).astype(np.float64)
                    for p in schedule.canaries(t)
                ),
                np.zeros(dim),
            )
            / 4
        )
        theta += expected
        assert meta.num_canaries_inserted == schedule.canaries(t).size
        assert meta.cohort_size == schedule.real_clients(t).size + schedule.canaries(t).size
    assert np.allclose(reporter.final_model, theta, atol=1e-5)
    # each seen canary was inserted exactly canary_repeats times in total
    assert sum(m.num_canaries_inserted for _, m in reporter.rounds) == 2 * seen.size
    assert 0.0 <= result["metrics"]["accuracy"] <= 1.0


def test_clients_receive_the_current_global_model_and_no_canary_information():
    spec = _spec(noise_multiplier=0.5)
    models_seen = []

    def record(node, msg):
        models_seen.append(
            (int(msg.metadata.group_id), msg.content["arrays"].to_numpy_ndarrays()[0].copy())
        )
        assert not any("canary" in key or "seen" in key for key in msg.content["config"].keys())
        return np.full_like(models_seen[-1][1], 1e-3)

    _, reporter, _ = _run(spec, record)
    theta = reporter.initial_model.copy()
    for t, delta in enumerate(reporter.deltas, start=1):
        received = [model for rnd, model in models_seen if rnd == t]
        assert received and all(np.array_equal(model, theta) for model in received)
        theta = theta + delta
    assert np.allclose(theta, reporter.final_model, atol=1e-6)


def test_failed_and_lost_clients_are_dropped_and_counted():
    spec = _spec(num_rounds=3)

    def flaky(node, msg):
        if node == 101:
            raise RuntimeError("client crashed")
        if node == 102:
            return None  # timed out: no reply
        return np.zeros_like(msg.content["arrays"].to_numpy_ndarrays()[0])

    result, reporter, grid = _run(spec, flaky)
    sent_per_round = {}
    failed_per_round = {}
    for msg in grid.sent:
        t = int(msg.metadata.group_id)
        sent_per_round[t] = sent_per_round.get(t, 0) + 1
        failed_per_round[t] = failed_per_round.get(t, 0) + (msg.metadata.dst_node_id in (101, 102))
    for t, meta in reporter.rounds:
        assert meta.num_failures == failed_per_round.get(t, 0)
        assert (
            meta.cohort_size
            == sent_per_round.get(t, 0) - meta.num_failures + meta.num_canaries_inserted
        )
    assert result["num_failures"] == sum(failed_per_round.values()) > 0
    assert reporter.final_model is not None  # the audit went on


def test_partitions_map_to_sorted_node_ids_stably():
    spec = _spec(num_rounds=4, canary_repeats=1)
    routes = []

    def record(node, msg):
        routes.append((int(msg.content["config"]["partition-id"]), node))
        return np.zeros_like(msg.content["arrays"].to_numpy_ndarrays()[0])

    _run(spec, record, nodes=(907, 13, 450))
    nodes = sorted((907, 13, 450))
    assert routes and all(node == nodes[p % 3] for p, node in routes)


def test_deadline_in_the_past_raises_timeout_error():
    spec = _spec()
    with pytest.raises(TimeoutError):
        _run(spec, lambda n, m: None, deadline=time.monotonic() - 1)


def test_dimension_checks_name_the_field():
    with pytest.raises(ValueError, match="task_options"):
        check_dimension(50, 10)
    with pytest.raises(ValueError, match="num_canaries"):
        check_dimension(500, 600)


def test_adaptive_clipping_moves_the_clip_norm_by_the_quantile_rule():
    from flaudit.auditor.spec import AdaptiveClipping

    spec = _spec(
        clip_norm=None,
        num_rounds=4,
        canary_repeats=1,
        adaptive_clipping=AdaptiveClipping(
            initial_clip_norm=0.1, target_quantile=0.5, learning_rate=0.2, clipped_count_stddev=1e-9
        ),
    )  # ~noiseless
    rng = np.random.default_rng(5)

    def big(node, msg):  # every update has norm 2 > S: all clipped
        u = rng.standard_normal(msg.content["arrays"].to_numpy_ndarrays()[0].size).astype(
            np.float32
        )
        return u * (2.0 / np.linalg.norm(u))

    _, reporter, _ = _run(spec, big)
    norms = [meta.clip_norm for _, meta in reporter.rounds]
    assert norms[0] == pytest.approx(0.1)
    for before, after in zip(norms, norms[1:]):
        assert after == pytest.approx(before * np.exp(0.2 * 0.5))  # unclipped fraction 0
    assert all(
        meta.clipped_fraction == 1.0
        for _, meta in reporter.rounds
        if meta.cohort_size > meta.num_canaries_inserted
    )


def _deployment_config(spec, **overrides):
    return {
        "flaudit-spec": spec.model_dump_json(),
        "flaudit-audit-id": "a1",
        "flaudit-ingest-url": "http://svc:8000",
        "flaudit-run-token": "tok",
        "flaudit-num-seen-canaries": "3",
        **overrides,
    }


def test_the_deployment_runtime_holds_no_seed_and_fetches_the_canaries():
    from flaudit.server.app import runtime_from_run_config
    from flaudit.server.canary_sums import ServiceCanarySums
    from flaudit.server.local import LocalCanaries

    spec = _spec()
    runtime = runtime_from_run_config(_deployment_config(spec))
    try:
        assert runtime.canary_seed is None and isinstance(runtime.canaries, ServiceCanarySums)
        assert runtime.canaries.reporter is runtime.reporter  # one service client
        assert runtime.canaries.num_seen == 3 and runtime.canaries.participants(1) is None
    finally:
        runtime.reporter.close()
    # the stand-alone `flwr run` demo (no service) makes its canaries from a seed of its own
    demo = runtime_from_run_config({"num-server-rounds": 2})
    assert demo.canary_seed is not None and isinstance(demo.canaries, LocalCanaries)
    assert str(demo.canary_seed) not in repr(demo)


@pytest.mark.parametrize("value", ["", "-1", "7", "x12", "2.5"])
def test_a_bad_count_of_seen_canaries_is_refused_naming_the_key(value):
    from flaudit.server.app import runtime_from_run_config

    with pytest.raises(ValueError, match="flaudit-num-seen-canaries"):  # num_canaries = 6
        runtime_from_run_config(_deployment_config(_spec(), **{"flaudit-num-seen-canaries": value}))


def test_the_runtime_takes_exactly_one_source_of_canaries():
    from flaudit.server.local import LocalCanaries

    spec, reporter = _spec(), LocalRoundReporter.for_audit(canary_seed=SEED, num_canaries=6)
    with pytest.raises(ValueError, match="canary_seed and canaries"):
        AuditRuntime(spec=spec, reporter=reporter)
    with pytest.raises(ValueError, match="canary_seed and canaries"):
        AuditRuntime(
            spec=spec,
            reporter=reporter,
            canary_seed=SEED,
            canaries=LocalCanaries.for_audit(SEED, spec),
        )


class _Service:
    """What ServiceCanarySums asks the HttpRoundReporter for: the service's float32 sums
    (computed as the service does, flaudit.service.external), and on which thread."""

    def __init__(self, spec):
        self.spec, self.threads = spec, []

    def round_canary_sum(self, t):
        from flaudit.service.external import round_canary_sum

        self.threads.append(threading.current_thread().name)
        return round_canary_sum(SEED, self.spec, t, self.dim)


@pytest.mark.parametrize("bug", [None, {"kind": "extra_participation", "factor": 2}])
def test_canaries_from_the_service_train_the_model_the_seed_trains(bug):
    """A deployment ServerApp (no seed; sums from the service) inserts what the simulation's
    in-process canaries insert: same counts, same model up to float32 rounding of the sums;
    it reports no participants (the service derives them)."""
    from flaudit.server.canary_sums import ServiceCanarySums
    from flaudit.server.local import LocalCanaries

    spec = _spec(noise_multiplier=0.5, canary_repeats=1, inject_bug=bug)

    def zero(node, msg):
        return np.full_like(msg.content["arrays"].to_numpy_ndarrays()[0], 1e-3)

    local_result, local, _ = _run(spec, zero)
    service = _Service(spec.model_copy(update={"engine": "deployment", "superlink_address": "h:1"}))
    service.dim = local_result["dim"]
    num_seen = LocalCanaries.for_audit(SEED, spec).num_seen
    served_result, served, _ = _run(
        spec, zero, canaries=ServiceCanarySums(service, num_seen=num_seen)
    )
    assert [m.num_canaries_inserted for _, m in served.rounds] == [
        m.num_canaries_inserted for _, m in local.rounds
    ]
    assert (
        sum(m.num_canaries_inserted for _, m in served.rounds)
        == spec.canary_repeats * (2 if bug else 1) * num_seen
    )
    assert all(m.participants is None for _, m in served.rounds)
    assert all(m.participants is not None for _, m in local.rounds)
    np.testing.assert_allclose(served.final_model, local.final_model, atol=1e-6)
    assert served_result["num_seen_canaries_inserted"] == local_result["num_seen_canaries_inserted"]
    # fetched on the audit's background thread (the wrapper's), while the clients train
    assert len(service.threads) == spec.num_rounds
    assert all(name.startswith("flaudit-canaries") for name in service.threads)


def test_rounds_report_the_released_aggregate_and_participants_with_momentum():
    # with server momentum the model delta mixes rounds; the reported vector is the released
    # (rho + noise) / m of the round itself
    spec = _spec(noise_multiplier=0.5, server_momentum=0.9)

    def small(node, msg):
        return np.full_like(msg.content["arrays"].to_numpy_ndarrays()[0], 1e-3)

    _, reporter, _ = _run(spec, small)
    velocity = np.zeros_like(reporter.initial_model, dtype=np.float64)
    theta = reporter.initial_model.astype(np.float64)
    for update in reporter.deltas:
        velocity = 0.9 * velocity + update
        theta += velocity
    assert np.allclose(theta, reporter.final_model, atol=1e-5)
    assert not np.allclose(reporter.final_model - reporter.initial_model, sum(reporter.deltas))

    mask = seen_mask(SEED, spec.num_canaries)
    seen = np.flatnonzero(mask)
    schedule = _schedule(spec, seen)
    counts = np.zeros(spec.num_canaries, dtype=int)
    for t, (_, meta) in enumerate(reporter.rounds, start=1):
        part = np.array(meta.participants, dtype=int)
        assert np.array_equal(part, np.unique(part))
        # the seen participants are exactly the canaries inserted this round
        assert sorted(part[mask[part]]) == sorted(seen[schedule.canaries(t)])
        counts[part] += 1
    assert np.all(counts == spec.canary_repeats)  # seen and unseen alike


def test_extra_participation_bug_inserts_canaries_more_often_than_claimed():
    spec = _spec(
        num_rounds=4, canary_repeats=1, inject_bug={"kind": "extra_participation", "factor": 4}
    )

    def zero(node, msg):
        return np.zeros_like(msg.content["arrays"].to_numpy_ndarrays()[0])

    result, reporter, _ = _run(spec, zero)
    seen = int(seen_mask(SEED, spec.num_canaries).sum())
    assert sum(m.num_canaries_inserted for _, m in reporter.rounds) == 4 * seen
    assert result["inject_bug"] == "extra_participation=4"


class _FailingReporter(RecordingReporter):
    def report_round(self, server_round, delta, metadata):
        if server_round == 2:
            raise RuntimeError("the service refused round 2")
        super().report_round(server_round, delta, metadata)


def test_a_report_error_on_the_audit_thread_stops_the_run():
    """Reports run on the audit thread; an error there still fails the run (no round lost)."""
    spec = _spec()
    dim = load_task(spec.task, num_partitions=spec.num_clients, options=spec.task_options).dim()
    reporter = _FailingReporter(CosineTracker(SEED, spec.num_canaries, dim))

    def zero(node, msg):
        return np.zeros_like(msg.content["arrays"].to_numpy_ndarrays()[0])

    grid = FakeGrid((101, 102), zero)
    runtime = AuditRuntime(spec=spec, canary_seed=SEED, reporter=reporter, noise_seed=1)
    with pytest.raises(RuntimeError, match="refused round 2"):
        run_audit(grid, runtime)
    assert [t for t, _ in reporter.rounds] == [1]
    assert reporter.final_model is None  # never reported past a failed round
    # round 3 trained while round 2 was being reported; round 4 never started
    assert {msg.metadata.group_id for msg in grid.sent} == {"1", "2", "3"}


def test_the_audit_work_runs_while_the_clients_train():
    """Round t-1's report overlaps round t's training; reports stay in order, before the final."""
    import threading

    spec = _spec(num_rounds=3)
    events, second_round_training, overlapped = [], threading.Event(), []

    class WaitingReporter(RecordingReporter):
        def report_round(self, server_round, delta, metadata):
            events.append(("report start", server_round))
            if server_round == 1:  # a serial loop could not train round 2 until this returns
                overlapped.append(second_round_training.wait(timeout=30))
            super().report_round(server_round, delta, metadata)
            events.append(("report end", server_round))

        def report_final(self, final_model, metrics):
            events.append(("final", None))
            super().report_final(final_model, metrics)

    def training(node, msg):
        if msg.metadata.group_id == "2":
            second_round_training.set()
        return np.zeros_like(msg.content["arrays"].to_numpy_ndarrays()[0])

    dim = load_task(spec.task, num_partitions=spec.num_clients, options=spec.task_options).dim()
    reporter = WaitingReporter(CosineTracker(SEED, spec.num_canaries, dim))
    result = run_audit(
        FakeGrid((101, 102), training),
        AuditRuntime(spec=spec, canary_seed=SEED, reporter=reporter, noise_seed=1),
    )
    assert overlapped == [True]
    assert [t for t, _ in reporter.rounds] == [1, 2, 3]
    starts = [t for kind, t in events if kind == "report start"]
    assert starts == [1, 2, 3] and events[-1] == ("final", None)
    waits = [r["audit_wait_seconds"] for r in result["rounds"]]
    assert len(waits) == 3 and all(w >= 0 for w in waits)


class PushPullGrid:
    """Flower's Grid push/pull surface: each reply becomes available ``delays[i]`` seconds after
    the push; ``send_and_receive`` (Flower's 3 s pull loop) must not be used."""

    def __init__(self, delays):
        self.delays, self.pulls = delays, 0

    def push_messages(self, messages):
        self.pushed_at = time.monotonic()
        self.messages = list(messages)
        return [f"m{i}" for i in range(len(self.messages))]

    def pull_messages(self, message_ids):
        self.pulls += 1
        now = time.monotonic() - self.pushed_at
        out = []
        for i, msg in enumerate(self.messages):
            if f"m{i}" in message_ids and self.delays[i] <= now:
                reply = Message(RecordDict(), reply_to=msg)
                reply.metadata.__dict__["_reply_to_message_id"] = f"m{i}"
                out.append(reply)
        return out

    def send_and_receive(self, messages, *, timeout=None):
        raise AssertionError("Flower's send_and_receive sleeps 3 s between pulls")


def _train_messages(n):
    from flwr.app import MessageType

    return [
        Message(RecordDict(), message_type=MessageType.TRAIN, dst_node_id=1, group_id="1")
        for _ in range(n)
    ]


def test_replies_are_pulled_soon_after_they_arrive_and_the_timeout_holds():
    from flaudit.server.app import REPLY_POLL_SECONDS, send_and_receive

    grid = PushPullGrid([0.0, 0.5])
    started = time.monotonic()
    replies = send_and_receive(grid, _train_messages(2), timeout=10)
    took = time.monotonic() - started
    assert len(replies) == 2 and grid.pulls >= 2
    assert took < 0.5 + 5 * REPLY_POLL_SECONDS  # not Flower's 3 s step
    # a reply that never comes: the others are returned once the timeout has passed
    grid = PushPullGrid([0.0, 1e9])
    started = time.monotonic()
    replies = send_and_receive(grid, _train_messages(2), timeout=0.6)
    assert len(replies) == 1 and 0.6 <= time.monotonic() - started < 3.0
