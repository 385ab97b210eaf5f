"""``run_simulation_audit`` keeps Flower's ``run_simulation`` (its only in-process simulation entry,
docs/flower.md) and drops that one deprecation record; every other ``flwr`` record still prints."""

from __future__ import annotations

import inspect
import io
import logging

from flwr.simulation import run_simulation
from flwr.supercore.logger import warn_deprecated_feature

from flaudit.server.simulation import _DropRunSimulationDeprecation


def test_only_the_run_simulation_deprecation_is_dropped():
    # the filter matches the text Flower logs (if Flower rewords it, this fails first)
    assert "The `run_simulation` function is deprecated" in inspect.getsource(run_simulation)
    flwr = logging.getLogger("flwr")
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    drop = _DropRunSimulationDeprecation()
    flwr.addHandler(handler)
    flwr.addFilter(drop)
    try:
        warn_deprecated_feature("The `run_simulation` function is deprecated and will be removed")
        warn_deprecated_feature("Passing `enable_tf_gpu_growth=True` is deprecated.")
        flwr.warning("some other Flower warning about run_simulation")
    finally:
        flwr.removeFilter(drop)
        flwr.removeHandler(handler)
    text = stream.getvalue()
    assert "`run_simulation` function is deprecated" not in text
    assert "DEPRECATED FEATURE: Passing `enable_tf_gpu_growth=True` is deprecated." in text
    assert "some other Flower warning about run_simulation" in text
