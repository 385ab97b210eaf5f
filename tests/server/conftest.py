"""Fixtures for the ServerApp tests."""

from __future__ import annotations

import pytest


@pytest.fixture
def flower_task_identity():
    """Flower's task identity set to task 1, run 1, node 0 (what a ServerApp sees inside a run),
    restored afterwards; Messages can then be built outside a real Flower run."""
    from flwr.supercore.task_identity import TaskIdentity

    old = (TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id)
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, 0
    yield
    TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id = old
