"""flaudit.server.deployment without a SuperLink: run config, Flower CLI config, status parsing,
the wait/cancel/timeout loop against a fake Control API, and that secrets never leak into errors.
The real thing (SuperLink + SuperNodes + service) is tests/deployment/test_topology.py."""

from __future__ import annotations

import json
import signal
import threading
import tomllib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flaudit.auditor.canaries import seen_mask
from flaudit.auditor.spec import AuditSpec
from flaudit.server import deployment as dep
from flaudit.server.deployment import (
    DeploymentError,
    DeploymentResult,
    RunState,
    build_run_config,
    flower_config_toml,
    parse_run_status,
    run_deployment_audit,
)
from tests.processes import free_port

SEED = 2**127 + 123456789  # wider than any TOML integer
TOKEN = "run-token-" + "q" * 30


def _spec(**kw) -> AuditSpec:
    base = dict(
        engine="deployment", superlink_address="127.0.0.1:9", num_rounds=3, timeout_seconds=60
    )
    base.update(kw)
    return AuditSpec(**base)


# -- small pure pieces ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "state"),
    [
        ("pending", RunState.pending),
        ("starting", RunState.starting),
        ("running", RunState.running),
        ("finished:completed", RunState.completed),
        ("finished:failed", RunState.failed),
        ("finished:stopped", RunState.stopped),
        (" Finished:Completed ", RunState.completed),
    ],
)
def test_parse_run_status(text, state):
    assert parse_run_status(text) is state
    assert state.finished == text.strip().lower().startswith("finished")


@pytest.mark.parametrize("text", ["", "completed", "finished", "finished:running", "exploded"])
def test_parse_run_status_rejects_unknown(text):
    with pytest.raises(ValueError, match="status"):
        parse_run_status(text)


def test_run_config_carries_the_audit_and_round_trips_through_toml():
    spec = _spec(name='quote " and \\ backslash', num_canaries=40)
    config = build_run_config(
        spec, audit_id="a1", canary_seed=SEED, ingest_url="http://flaudit:8000/", run_token=TOKEN
    )
    assert set(config) == {
        dep.RUN_CONFIG_AUDIT_ID,
        dep.RUN_CONFIG_INGEST_URL,
        dep.RUN_CONFIG_RUN_TOKEN,
        dep.RUN_CONFIG_NUM_SEEN_CANARIES,
        dep.RUN_CONFIG_SPEC,
    }
    parsed = tomllib.loads(dep._run_config_toml(config))
    assert parsed == config
    assert int(parsed["flaudit-num-seen-canaries"]) == int(seen_mask(SEED, 40).sum())
    assert parsed["flaudit-ingest-url"] == "http://flaudit:8000"
    assert AuditSpec.model_validate_json(parsed["flaudit-spec"]) == spec


def test_run_config_keys_are_declared_in_the_flower_app():
    """`flwr run` rejects run-config keys the app's pyproject does not declare."""
    pyproject = tomllib.loads((dep.default_app_dir() / "pyproject.toml").read_text())
    declared = pyproject["tool"]["flwr"]["app"]["config"]
    for key in (
        dep.RUN_CONFIG_AUDIT_ID,
        dep.RUN_CONFIG_INGEST_URL,
        dep.RUN_CONFIG_RUN_TOKEN,
        dep.RUN_CONFIG_NUM_SEEN_CANARIES,
        dep.RUN_CONFIG_SPEC,
    ):
        assert key in declared, key
    assert "canary-seed" not in declared


@pytest.mark.parametrize("seed", [SEED, 2**64 + 7, 0xC0FFEE, 12345])
def test_the_run_config_holds_no_seed(seed):
    """Issue #29: whoever reads the SuperLink's run state must not learn the seed -- no key for it
    and no value that holds it, in decimal or hex, in the config or in the TOML file written."""
    config = build_run_config(
        _spec(num_canaries=30),
        audit_id="a1",
        canary_seed=seed,
        ingest_url="http://svc:8000",
        run_token=TOKEN,
    )
    assert not any("seed" in key for key in config)
    forms = {str(seed), hex(seed), format(seed, "x"), format(seed, "X"), f"{seed:#X}"}
    text = dep._run_config_toml(config)
    for form in forms:
        assert form not in text, form
        assert all(form not in value for value in config.values())
    spec = AuditSpec.model_validate_json(config[dep.RUN_CONFIG_SPEC])
    assert spec == _spec(num_canaries=30)  # the spec carries no seed either
    assert config[dep.RUN_CONFIG_NUM_SEEN_CANARIES] == str(int(seen_mask(seed, 30).sum()))


@settings(max_examples=60, deadline=None)
@given(
    st.dictionaries(
        st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=20),
        st.text(st.characters(blacklist_categories=("Cs",)), max_size=50),
        max_size=5,
    )
)
def test_run_config_toml_round_trips_any_strings(config):
    assert tomllib.loads(dep._run_config_toml(config)) == config


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        (dict(audit_id=" "), "audit_id"),
        (dict(canary_seed=-1), "canary_seed"),
        (dict(canary_seed=True), "canary_seed"),
        (dict(canary_seed="12"), "canary_seed"),
        (dict(ingest_url="flaudit:8000"), "ingest_url"),
        (dict(run_token=""), "run_token"),
    ],
)
def test_run_config_rejects_bad_arguments(kwargs, name):
    args = dict(audit_id="a", canary_seed=1, ingest_url="http://x", run_token="t") | kwargs
    with pytest.raises(ValueError, match=name):
        build_run_config(_spec(), **args)


def test_flower_config_plain_and_tls(tmp_path):
    plain = tomllib.loads(flower_config_toml(address="superlink:9093"))
    name = plain["superlink"]["default"]
    assert plain["superlink"][name] == {"address": "superlink:9093", "insecure": True}
    ca = tmp_path / "ca.pem"
    ca.write_text("x")
    tls = tomllib.loads(flower_config_toml(address="[::1]:9093", root_certificates=str(ca)))
    conn = tls["superlink"][tls["superlink"]["default"]]
    assert conn["root-certificates"] == str(ca.resolve()) and "insecure" not in conn
    for bad in ("superlink", "superlink:", ":9093", "superlink:http"):
        with pytest.raises(ValueError, match="address"):
            flower_config_toml(address=bad)


# -- the wait / cancel / timeout loop against a fake Control API -------------------------------


class FakeControl:
    def __init__(self, states, *, stop_to=RunState.stopped):
        self.states = list(states)
        self.stop_to = stop_to
        self.stopped = []
        self.polls = 0
        self.closed = False

    def __call__(self, address, *, root_certificates=None):  # the factory
        self.address = address
        return self

    def status(self, run_id):
        self.polls += 1
        if self.stopped:
            return self.stop_to, "stopped by request"
        state = self.states.pop(0) if len(self.states) > 1 else self.states[0]
        return state, ("ServerApp failed with exception: boom" if state == RunState.failed else "")

    def stop(self, run_id):
        self.stopped.append(run_id)
        return True

    def close(self):
        self.closed = True


@pytest.fixture
def fake_start(monkeypatch):
    calls = []

    def start(**kwargs):
        calls.append(kwargs)
        return 4242

    monkeypatch.setattr(dep, "start_flower_run", start)
    return calls


def _run(control, **kw):
    args = dict(
        audit_id="a1",
        canary_seed=SEED,
        ingest_url="http://svc:8000",
        run_token=TOKEN,
        poll_interval=0.01,
        stop_grace=1.0,
        control_factory=control,
    )
    args |= kw
    return run_deployment_audit(_spec(), **args)


def test_waits_until_the_run_completes(fake_start):
    control = FakeControl(
        [RunState.pending, RunState.running, RunState.running, RunState.completed]
    )
    started = []
    result = _run(control, on_started=started.append)
    assert result.state is RunState.completed and result.succeeded and result.run_id == 4242
    assert started == [4242] and control.polls == 4 and control.closed and not control.stopped
    assert control.address == "127.0.0.1:9"
    run_config = fake_start[0]["run_config"]
    assert "canary-seed" not in run_config and str(SEED) not in json.dumps(run_config)
    assert run_config["flaudit-num-seen-canaries"] == str(int(seen_mask(SEED, 100).sum()))


def test_a_failed_run_is_a_result_with_the_reason(fake_start):
    result = _run(FakeControl([RunState.running, RunState.failed]))
    assert result.state is RunState.failed and not result.succeeded
    assert "boom" in result.details


def test_cancel_stops_the_run(fake_start):
    control = FakeControl([RunState.running])
    event = threading.Event()
    threading.Timer(0.1, event.set).start()
    result = _run(control, cancel_event=event)
    assert control.stopped == [4242]
    assert result.cancelled and not result.timed_out and result.state is RunState.stopped
    assert not result.succeeded


def test_timeout_stops_the_run(fake_start):
    control = FakeControl([RunState.running])
    result = _run(control, timeout=0.2)
    assert control.stopped == [4242] and result.timed_out and not result.succeeded
    assert 0.2 <= result.elapsed_seconds < 5


def test_stop_that_never_lands_still_ends(fake_start):
    control = FakeControl([RunState.running], stop_to=RunState.running)
    result = _run(control, timeout=0.05, stop_grace=0.2)
    assert result.timed_out and result.state is RunState.stopped
    assert "still reports running" in result.details


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        (dict(engine="simulation", superlink_address=None), "engine"),
        (dict(), "poll_interval"),
        (dict(), "timeout"),
    ],
)
def test_run_deployment_audit_rejects_bad_arguments(fake_start, kwargs, name):
    extra = {"poll_interval": 0} if name == "poll_interval" else {}
    extra |= {"timeout": -1} if name == "timeout" else {}
    spec = AuditSpec(**(dict(engine="deployment", superlink_address="h:1") | kwargs))
    with pytest.raises(ValueError, match=name):
        run_deployment_audit(
            spec,
            audit_id="a",
            canary_seed=1,
            ingest_url="http://x",
            run_token="t",
            control_factory=FakeControl([RunState.completed]),
            **extra,
        )
    assert fake_start == []


# -- secrets stay out of errors ---------------------------------------------------------------


def test_flwr_run_against_no_superlink_fails_without_leaking_secrets():
    config = build_run_config(
        _spec(), audit_id="a1", canary_seed=SEED, ingest_url="http://svc:8000", run_token=TOKEN
    )
    # a free port: nothing listens there
    with pytest.raises(DeploymentError) as info:
        dep.start_flower_run(address=f"127.0.0.1:{free_port()}", run_config=config, timeout=60)
    message = str(info.value)
    assert "flwr run" in message
    assert str(SEED) not in message and TOKEN not in message


def test_redactor_removes_every_secret():
    redact = dep._Redactor([str(SEED), TOKEN, ""])
    text = f"seed={SEED} token={TOKEN} again {SEED}"
    assert redact(text) == "seed=[redacted] token=[redacted] again [redacted]"


def _payload():
    return {
        "audit_id": "a1",
        "spec": _spec().model_dump(mode="json"),
        "seed": str(SEED),
        "token": TOKEN,
        "base_url": "http://svc:8000",
        "timeout": 30.0,
    }


def test_worker_raises_a_redacted_error_for_a_failed_run(monkeypatch):
    def fake_run(spec, **kw):
        return DeploymentResult(
            run_id=7,
            state=RunState.failed,
            details=f"ServerApp failed: bad seed {SEED} with {TOKEN}",
        )

    monkeypatch.setattr(dep, "run_deployment_audit", fake_run)
    previous = signal.getsignal(signal.SIGTERM)
    try:
        with pytest.raises(DeploymentError) as info:
            dep.deployment_worker(_payload())
    finally:
        signal.signal(signal.SIGTERM, previous)
    message = str(info.value)
    assert "run 7" in message and "failed" in message
    assert str(SEED) not in message and TOKEN not in message


def test_worker_turns_sigterm_into_a_stop_request(monkeypatch):
    seen = {}

    def fake_run(spec, *, cancel_event, **kw):
        signal.raise_signal(signal.SIGTERM)  # what the runner sends on cancel
        seen["cancelled"] = cancel_event.wait(2)
        seen["kw"] = kw
        return DeploymentResult(run_id=8, state=RunState.stopped, cancelled=True)

    monkeypatch.setattr(dep, "run_deployment_audit", fake_run)
    previous = signal.getsignal(signal.SIGTERM)
    try:
        with pytest.raises(DeploymentError, match="cancelled"):
            dep.deployment_worker(_payload())
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert seen["cancelled"] is True
    assert seen["kw"]["canary_seed"] == SEED and seen["kw"]["run_token"] == TOKEN


def test_worker_returns_quietly_on_success(monkeypatch):
    monkeypatch.setattr(
        dep,
        "run_deployment_audit",
        lambda spec, **kw: DeploymentResult(run_id=9, state=RunState.completed),
    )
    previous = signal.getsignal(signal.SIGTERM)
    try:
        assert dep.deployment_worker(_payload()) is None
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_result_json_has_no_secret_fields():
    result = DeploymentResult(run_id=1, state=RunState.completed)
    assert "seed" not in json.dumps(result.__dict__, default=str)


class FlakyControl(FakeControl):
    """Unreachable for the first ``failures`` polls (a SuperLink restarting)."""

    def __init__(self, states, failures):
        super().__init__(states)
        self.failures = failures

    def status(self, run_id):
        if self.failures > 0:
            self.failures -= 1
            raise DeploymentError("cannot read the status: ConnectError")
        return super().status(run_id)


def test_a_superlink_restart_is_survived(fake_start):
    control = FlakyControl([RunState.running, RunState.completed], failures=3)
    result = _run(control, unreachable_grace=5.0)
    assert result.succeeded and control.failures == 0


def test_a_superlink_gone_for_good_is_an_error(fake_start):
    control = FlakyControl([RunState.running], failures=10**6)
    with pytest.raises(DeploymentError, match="ConnectError"):
        _run(control, unreachable_grace=0.1)
    assert control.closed


def test_cancel_while_the_superlink_is_unreachable_still_ends(fake_start):
    control = FlakyControl([RunState.running], failures=10**6)
    event = threading.Event()
    event.set()
    result = _run(control, cancel_event=event, stop_grace=0.2, unreachable_grace=30)
    assert result.cancelled and result.state is RunState.stopped
    assert "unreachable" in result.details and control.stopped == [4242]


def test_signal_flag_wakes_a_wait_and_has_no_lock():
    flag = dep._SignalFlag()
    assert not flag.is_set() and flag.wait(0.05) is False
    threading.Timer(0.1, flag.set).start()
    t0 = __import__("time").monotonic()
    assert flag.wait(5) is True
    assert __import__("time").monotonic() - t0 < 1.0
    assert not hasattr(flag, "_cond") and not hasattr(flag, "_lock")
