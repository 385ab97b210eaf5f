"""Shared test configuration: Flower runs offline and quietly, in a temporary FLWR_HOME."""

from __future__ import annotations

import os
import tempfile

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
os.environ.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")
os.environ.setdefault("FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION", "1")
os.environ.setdefault("FLWR_HOME", tempfile.mkdtemp(prefix="flaudit-flwr-home-"))
os.environ.setdefault("RAY_DEDUP_LOGS", "0")
