"""flaudit: live empirical privacy auditing of DP-FedAvg on Flower with random canary clients.

Installed, the project is one import package whose parts are layers (docs/architecture.md):
:mod:`flaudit.auditor` (the math: canaries, statistics, estimators, claims), :mod:`flaudit.protocol`
(what the service and the Flower side agree on), :mod:`flaudit.clients` (the ClientApp and
built-in tasks), :mod:`flaudit.server` (the Flower ServerApp and the strategy wrappers),
:mod:`flaudit.service` (the audit service) and :mod:`flaudit.commands` (the ``flaudit`` CLI). In
the repository these are top-level folders side by side; the lines below let a checkout (tests,
``flwr run .`` from the repository, a Flower app bundle built from it) import them under the
same names without installing.
"""

from __future__ import annotations

import os as _os

_ROOT = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
if _os.path.isfile(_os.path.join(_ROOT, "auditor", "__init__.py")) and _ROOT not in __path__:
    __path__.append(_ROOT)  # the repository checkout: flaudit.auditor -> <root>/auditor

__version__ = "0.1.0"
