"""Test-only: plants a DP bug in Opacus's ``DPOptimizer`` in every process started with this
folder on ``PYTHONPATH`` (the SuperNodes of ``tests/integration/test_record_opacus_app.py``), so
Flower's ``examples/opacus`` is audited with a bug without a line of the app changed.

The bug is read from the file named by ``FLAUDIT_TEST_OPACUS_BUG_FILE`` each time Opacus builds a
``DPOptimizer`` (the app builds one every round), so one federation serves several runs:

* ``noise_scale=F``: ``add_noise`` adds ``F`` times the noise (the optimizer still reports, and
  Opacus's accountant still accounts, the claimed ``noise_multiplier``);
* ``no_clipping``: ``clip_and_accumulate`` clips nothing (the noise still uses ``max_grad_norm``);
* anything else (or no file): Opacus as it is.

Nothing is imported at start-up: the patch is applied when ``opacus.optimizers.optimizer`` is
first imported. Nothing outside the test suite reads the variable.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import math
import os
import sys

BUG_FILE_VARIABLE = "FLAUDIT_TEST_OPACUS_BUG_FILE"
TARGET = "opacus.optimizers.optimizer"


def read_bug() -> str:
    try:
        with open(os.environ[BUG_FILE_VARIABLE], encoding="utf-8") as handle:
            return handle.read().strip()
    except (KeyError, OSError):
        return ""


def plant(module) -> None:
    optimizer_class = module.DPOptimizer
    init, add_noise, clip = (
        optimizer_class.__init__,
        optimizer_class.add_noise,
        optimizer_class.clip_and_accumulate,
    )

    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.planted_bug = read_bug()

    def planted_add_noise(self):
        bug = getattr(self, "planted_bug", "")
        if not bug.startswith("noise_scale="):
            return add_noise(self)
        claimed = self.noise_multiplier
        self.noise_multiplier = claimed * float(bug.split("=", 1)[1])
        try:
            return add_noise(self)
        finally:
            self.noise_multiplier = claimed

    def planted_clip_and_accumulate(self):
        if getattr(self, "planted_bug", "") != "no_clipping":
            return clip(self)
        claimed = self.max_grad_norm
        self.max_grad_norm = math.inf  # clip factor min(inf / norm, 1) = 1
        try:
            return clip(self)
        finally:
            self.max_grad_norm = claimed

    optimizer_class.__init__ = __init__
    optimizer_class.add_noise = planted_add_noise
    optimizer_class.clip_and_accumulate = planted_clip_and_accumulate


class _PlantingLoader(importlib.abc.Loader):
    def __init__(self, loader) -> None:
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module) -> None:
        self.loader.exec_module(module)
        plant(module)


class _PlantingFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != TARGET:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _PlantingLoader(spec.loader)
        return spec


if os.environ.get(BUG_FILE_VARIABLE):
    sys.meta_path.insert(0, _PlantingFinder())
