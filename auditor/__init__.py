"""flaudit's auditor: canaries, cosine statistics and epsilon estimators (pure math), plus the
audit service in :mod:`auditor.service`."""

from auditor.canaries import canary_vector, canary_vectors, new_master_seed, seen_mask
from auditor.results import Correction, Diagnostic, EpsilonResult, Estimator, VarianceTreatment
from auditor.statistics import CosineTracker

__all__ = [
    "canary_vector",
    "canary_vectors",
    "new_master_seed",
    "seen_mask",
    "CosineTracker",
    "Correction",
    "Diagnostic",
    "EpsilonResult",
    "Estimator",
    "VarianceTreatment",
]
