"""The spec's one rule: every float finite, every integer bounded, strings clean, task names and
options checked, errors naming the field, for fields added later too."""

from __future__ import annotations

import inspect
import json
import math
import typing

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import Field, ValidationError

from flaudit.auditor.spec import (
    _BUILTIN_TASK_OPTIONS,
    BUILTIN_TASK_NAMES,
    MAX_INTEGER,
    MAX_MODEL_DIM,
    AuditSpec,
    _check_builtin_options,
    builtin_model_dim,
)

BASE = {"num_clients": 50, "clients_per_round": 5, "num_canaries": 20}


def _error_locs(patch: dict, *, raw: str | None = None) -> list[str]:
    with pytest.raises(ValidationError) as info:
        if raw is not None:
            AuditSpec.model_validate_json(raw)
        else:
            AuditSpec.model_validate({**BASE, **patch})
    return [".".join(str(p) for p in err["loc"]) + ": " + err["msg"] for err in info.value.errors()]


@pytest.mark.parametrize(
    "patch, field",
    [
        ({"noise_multiplier": math.inf}, "noise_multiplier"),
        ({"noise_multiplier": math.nan}, "noise_multiplier"),
        ({"clip_norm": -math.inf}, "clip_norm"),
        ({"server_learning_rate": math.inf}, "server_learning_rate"),
        (
            {"clip_norm": None, "adaptive_clipping": {"initial_clip_norm": math.inf}},
            "adaptive_clipping.initial_clip_norm",
        ),
        ({"task_options": {"alpha": math.nan}}, "task_options"),
        ({"name": "\ud800"}, "name"),
        ({"name": "a\x00b"}, "name"),
        ({"task_options": {"dim": 10**12}}, "task_options"),
        ({"task_options": {"colour": "\ud800"}}, "task_options"),
        ({"task_options": {"dim": 400, "nope": 1}}, "task_options"),
        ({"task_options": {f"k{i}": i for i in range(40)}, "task": "pkg.mod:make"}, "task_options"),
        ({"task_options": {"x": "y" * 10_000}, "task": "pkg.mod:make"}, "task_options"),
        ({"task_options": {"big": 2**60}, "task": "pkg.mod:make"}, "task_options"),
        ({"task_options": {"digits": True}}, "task_options"),
        ({"batch_size": 10**18}, "batch_size"),
        ({"max_participations": 10**30}, "max_participations"),
        ({"data_seed": 2**200}, "data_seed"),
        ({"superlink_address": "not-an-address"}, "superlink_address"),
        ({"superlink_address": "host:70000"}, "superlink_address"),
        ({"task": "antigravity"}, "task"),
        ({"task": " synthetic"}, "task"),
        ({"task": "SYNTHETIC"}, "task"),
        ({"task": "os.path:"}, "task"),
        ({"task": "a b:c"}, "task"),
    ],
)
def test_every_probe_is_refused_naming_the_field(patch, field):
    errors = _error_locs(patch)
    assert any(e.startswith(field) for e in errors), errors


@pytest.mark.parametrize("token", ["NaN", "Infinity", "-Infinity"])
def test_non_standard_json_numbers_are_refused_at_parse_time(token):
    errors = _error_locs({}, raw=f'{{"noise_multiplier": {token}}}')
    assert any(e.startswith("noise_multiplier") for e in errors), errors


@pytest.mark.parametrize(
    "patch",
    [
        {},
        {"superlink_address": "superlink:9093", "engine": "deployment"},
        {"superlink_address": "[::1]:9093", "engine": "deployment"},
        {"superlink_address": "10.0.0.7:1", "engine": "deployment"},
        {"task": "digits", "task_options": {"alpha": 0.1, "hidden": 32}},
        {"task": "my_pkg.tasks:make_task", "task_options": {"anything": "goes", "n": 3}},
        {"task_options": {"dim": 1_000_000, "alpha": 2}},
        {"data_seed": MAX_INTEGER, "name": "ünïcode ✓"},
    ],
)
def test_valid_specs_pass(patch):
    AuditSpec.model_validate({**BASE, **patch})


def test_builtin_task_names_match_the_clients_package():
    tasks = pytest.importorskip("flaudit.clients.tasks")
    assert set(BUILTIN_TASK_NAMES) == set(tasks.BUILTIN_TASKS)


#: Keyword arguments ``load_task`` passes to every task factory itself (not ``task_options``).
_LOAD_TASK_ARGUMENTS = {"num_partitions", "seed"}


def _factory_options(factory) -> dict[str, inspect.Parameter]:
    """The ``task_options`` a built-in task factory accepts: its keyword parameters."""
    parameters = inspect.signature(factory).parameters.values()
    assert not any(p.kind is p.VAR_KEYWORD for p in parameters), (
        f"{factory.__name__} takes **kwargs: its options cannot be checked against the spec"
    )
    accepted = {
        p.name: p for p in parameters if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)
    }
    assert _LOAD_TASK_ARGUMENTS <= set(accepted), (
        f"{factory.__name__} must take {_LOAD_TASK_ARGUMENTS}"
    )
    return {name: p for name, p in accepted.items() if name not in _LOAD_TASK_ARGUMENTS}


@pytest.mark.parametrize("task", sorted(BUILTIN_TASK_NAMES))
def test_the_spec_lists_exactly_the_options_each_builtin_task_accepts(task):
    """``_BUILTIN_TASK_OPTIONS`` against the factory's own signature: an option added to a task
    but not to the spec (it would be refused at submission) or listed but not accepted (the
    worker would fail with a TypeError) names itself here; its kind and default fit too."""
    tasks = pytest.importorskip("flaudit.clients.tasks")
    factory = tasks.BUILTIN_TASKS[task]
    accepted = _factory_options(factory)
    listed = _BUILTIN_TASK_OPTIONS[task]
    assert not set(accepted) - set(listed), (
        f"task {task!r} accepts option(s) {sorted(set(accepted) - set(listed))} that "
        f"auditor/spec.py _BUILTIN_TASK_OPTIONS[{task!r}] does not list"
    )
    assert not set(listed) - set(accepted), (
        f"auditor/spec.py _BUILTIN_TASK_OPTIONS[{task!r}] lists option(s) "
        f"{sorted(set(listed) - set(accepted))} that {factory.__name__} does not accept"
    )
    hints = typing.get_type_hints(factory)
    for name, (kind, _, _) in listed.items():
        annotated = typing.get_args(hints[name]) or (hints[name],)
        assert kind in annotated, (
            f"task_options.{name}: spec says {kind.__name__}, task says {hints[name]}"
        )
        default = accepted[name].default
        if default is not None and default is not inspect.Parameter.empty:
            _check_builtin_options(task, {name: default})  # the task's default is a valid option


def test_the_builtin_option_table_covers_every_builtin_task():
    assert set(_BUILTIN_TASK_OPTIONS) == set(BUILTIN_TASK_NAMES)


@pytest.mark.parametrize(
    "task, options",
    [
        ("synthetic", {}),
        ("synthetic", {"dim": 5000}),
        ("synthetic", {"hidden": 7, "features": 5, "classes": 3}),
        ("digits", {}),
        ("digits", {"hidden": 16}),
    ],
)
def test_builtin_model_dim_is_the_dimension_the_task_builds(task, options):
    tasks = pytest.importorskip("flaudit.clients.tasks")
    built = tasks.load_task(task, num_partitions=2, options=options)
    assert builtin_model_dim(task, options) == built.dim()


def test_a_model_larger_than_the_service_runs_is_refused():
    errors = _error_locs({"task_options": {"hidden": MAX_MODEL_DIM // 8}})
    assert any(e.startswith("task_options") and "parameters" in e for e in errors), errors


def test_the_rule_covers_fields_added_later():
    class Extended(AuditSpec):
        canary_family: str = "gaussian"
        extra_scale: float = Field(1.0)
        counts: list[int] = Field(default_factory=list)

    for patch, field in [
        ({"canary_family": "a\x00"}, "canary_family"),
        ({"extra_scale": math.inf}, "extra_scale"),
        ({"counts": [1, 2**60]}, "counts"),
    ]:
        with pytest.raises(ValidationError) as info:
            Extended.model_validate({**BASE, **patch})
        assert info.value.errors()[0]["loc"][0] == field


_json_values = st.recursive(
    st.none() | st.booleans() | st.floats() | st.integers() | st.text(),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)


@given(field=st.sampled_from(sorted(AuditSpec.model_fields)), value=_json_values)
def test_any_accepted_spec_serializes_to_strict_json(field, value):
    """Whatever is accepted can be stored and served: strict JSON, UTF-8, no NUL."""
    try:
        spec = AuditSpec.model_validate({**BASE, field: value})
    except ValidationError:
        return
    text = json.dumps(spec.model_dump(mode="json"), allow_nan=False, ensure_ascii=False)
    text.encode("utf-8")
    assert "\x00" not in text
