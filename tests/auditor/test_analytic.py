import math

import dp_accounting
import pytest

from flaudit.auditor.estimators import (
    analytic_epsilon,
    gaussian_epsilon_for_sigma,
    gaussian_sigma_for_epsilon,
)
from flaudit.auditor.results import Estimator


def test_zero_noise_is_infinite():
    results = analytic_epsilon(0.0, 0.1, 10, 1e-6, participations=2)
    assert [r.epsilon for r in results] == [math.inf] * 3


def test_full_participation_single_round_is_the_gaussian_mechanism():
    z = 1.3
    exact = dp_accounting.get_epsilon_gaussian(z, 1e-5)
    rdp, pld, known = analytic_epsilon(z, 1.0, 1, 1e-5, participations=1)
    assert (rdp.details["accountant"], pld.details["accountant"]) == ("rdp", "pld")
    assert known.threat_model == "known_rounds"
    assert pld.epsilon == pytest.approx(exact, abs=0.02)
    assert known.epsilon == pytest.approx(exact, abs=0.02)
    assert rdp.epsilon >= exact - 1e-6  # RDP conversion is an upper bound


def test_subsampling_helps_and_rounds_cost():
    base = analytic_epsilon(1.0, 0.05, 20, 1e-6, accountants=("pld",))[0].epsilon
    more_rounds = analytic_epsilon(1.0, 0.05, 80, 1e-6, accountants=("pld",))[0].epsilon
    full = analytic_epsilon(1.0, 1.0, 20, 1e-6, accountants=("pld",))[0].epsilon
    assert base < more_rounds < full
    for r in analytic_epsilon(1.0, 0.05, 20, 1e-6):
        assert r.estimator is Estimator.analytic and r.delta == 1e-6 and "dp-accounting" in r.method


def test_known_rounds_composes_participations():
    one = analytic_epsilon(2.0, 0.1, 10, 1e-6, participations=1, accountants=())[0].epsilon
    four = analytic_epsilon(2.0, 0.1, 10, 1e-6, participations=4, accountants=())[0].epsilon
    # four compositions of sigma equal one Gaussian mechanism with sigma / 2
    assert four == pytest.approx(dp_accounting.get_epsilon_gaussian(1.0, 1e-6), abs=0.03)
    assert four > one


def test_calibration_round_trip():
    for eps in (1.0, 3.0, 10.0):
        assert gaussian_epsilon_for_sigma(
            gaussian_sigma_for_epsilon(eps, 1e-6), 1e-6
        ) == pytest.approx(eps, abs=1e-3)
    assert gaussian_sigma_for_epsilon(1.0, 1e-6) == pytest.approx(4.22, abs=0.01)
    assert gaussian_sigma_for_epsilon(3.0, 1e-6) == pytest.approx(1.54, abs=0.01)
    assert gaussian_sigma_for_epsilon(10.0, 1e-6) == pytest.approx(0.541, abs=0.001)


@pytest.mark.parametrize(
    "kwargs,name",
    [
        (
            dict(noise_multiplier=-1, sampling_probability=0.1, num_rounds=1, delta=1e-6),
            "noise_multiplier",
        ),
        (
            dict(noise_multiplier=1, sampling_probability=0.0, num_rounds=1, delta=1e-6),
            "sampling_probability",
        ),
        (
            dict(noise_multiplier=1, sampling_probability=0.1, num_rounds=0, delta=1e-6),
            "num_rounds",
        ),
        (dict(noise_multiplier=1, sampling_probability=0.1, num_rounds=1, delta=2.0), "delta"),
        (
            dict(noise_multiplier=math.nan, sampling_probability=0.1, num_rounds=1, delta=1e-6),
            "noise_multiplier",
        ),
    ],
)
def test_bad_input(kwargs, name):
    with pytest.raises(ValueError, match=name):
        analytic_epsilon(**kwargs)


def test_adaptive_clipping_count_query_is_accounted():
    """With adaptive clipping the noised clipped count is a second Gaussian query: the analytic
    epsilon of the audit uses z_total = (z^-2 + sigma_b^-2)^-1/2 and so exceeds the fixed-clip one."""
    from flaudit.auditor.estimators import audit_analytic_epsilon
    from flaudit.auditor.spec import AdaptiveClipping, AuditSpec

    fixed = AuditSpec(noise_multiplier=1.0, clients_per_round=40, num_rounds=10)
    adaptive = fixed.model_copy(
        update={"clip_norm": None, "adaptive_clipping": AdaptiveClipping(clipped_count_stddev=2.0)}
    )
    assert fixed.accounted_noise_multiplier == 1.0
    assert adaptive.accounted_noise_multiplier == pytest.approx((1 + 0.25) ** -0.5)
    # default sigma_b = clients_per_round / 20 = 2: the same
    default = fixed.model_copy(update={"clip_norm": None, "adaptive_clipping": AdaptiveClipping()})
    assert default.accounted_noise_multiplier == pytest.approx(adaptive.accounted_noise_multiplier)
    eps_fixed = {
        (r.threat_model, r.details.get("accountant")): r.epsilon
        for r in audit_analytic_epsilon(fixed)
    }
    eps_adapt = {
        (r.threat_model, r.details.get("accountant")): r.epsilon
        for r in audit_analytic_epsilon(adaptive)
    }
    assert eps_fixed.keys() == eps_adapt.keys() and len(eps_fixed) == 3
    for key in eps_fixed:
        assert eps_adapt[key] > eps_fixed[key]
    # the same as calling the accountant with the combined multiplier directly
    direct = analytic_epsilon(
        adaptive.accounted_noise_multiplier,
        adaptive.sampling_probability,
        10,
        adaptive.delta,
        participations=1,
    )
    assert sorted(r.epsilon for r in direct) == sorted(eps_adapt.values())


def test_an_unnoised_clipped_count_is_refused():
    from pydantic import ValidationError

    from flaudit.auditor.spec import AdaptiveClipping

    with pytest.raises(ValidationError, match="clipped_count_stddev"):
        AdaptiveClipping(clipped_count_stddev=0.0)
