"""Deliberate DP bugs: the names shared by the simulator and the real Flower path.

:class:`DPBug` names the implementation errors :mod:`flaudit.server.simulated_audit` can inject.
:class:`InjectedBug` is one of them with its size, as ``flaudit run --inject-bug`` and the
service's spec field ``inject_bug`` accept it for a real DP-FedAvg run (``flaudit.server.dpfedavg`` and
``flaudit.auditor.schedules`` apply it). The claim of an audit never knows about the bug: the analytic
epsilon and the claims are computed from the honest spec, so an audit that works raises its
alarm.
"""

from __future__ import annotations

import math
from enum import Enum

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

__all__ = ["DPBug", "InjectedBug", "REAL_PATH_BUGS"]


class DPBug(str, Enum):
    """Implementation errors the simulation can inject (``bug_factor`` sets their size)."""

    none = "none"  # the correct DP-FedAvg
    no_noise = "no_noise"  # the Gaussian noise is never added
    noise_scale = "noise_scale"  # the noise std is multiplied by a factor (0.5: half the noise)
    noise_divided_twice = "noise_divided_twice"  # (sum + noise / m) / m: noise scaled by 1/m twice
    no_clipping = "no_clipping"  # updates (real and canary) are not clipped; canaries send
    #                                bug_factor * S (the paper's Proj design sends exactly S)
    cohort_larger = "cohort_larger"  # bug_factor * m clients join each round; noise and the
    #                                  accountant still assume the expected cohort m (q = m / N)
    batch_then_shuffle = "batch_then_shuffle"  # fixed cohorts, shuffled order (Annamalai et al.)
    extra_participation = "extra_participation"  # clients (and canaries) join bug_factor times
    #                                              more rounds than the accountant assumes


#: Bugs the real path (``flaudit.server.app.run_audit``) can inject, with the default size of each
#: (None: the bug has no size).
REAL_PATH_BUGS: dict[DPBug, float | None] = {
    DPBug.no_noise: None,
    DPBug.noise_scale: 0.5,
    DPBug.noise_divided_twice: None,
    DPBug.no_clipping: 4.0,
    DPBug.extra_participation: 4.0,
}


class InjectedBug(BaseModel):
    """A deliberate DP bug in a real run (testing only; the claim does not know about it).

    ``factor`` means, per kind: ``noise_scale`` the multiplier of the noise std (``0 < factor``,
    ``!= 1``; default 0.5); ``no_clipping`` the norm of a canary update in clip norms (real
    updates are not clipped; default 4); ``extra_participation`` how many times more rounds each
    canary joins than ``canary_repeats`` (an integer >= 2; default 4). ``no_noise`` and
    ``noise_divided_twice`` take no factor.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: DPBug = Field(
        description="Which bug: " + ", ".join(b.value for b in REAL_PATH_BUGS) + "."
    )
    factor: float | None = Field(
        None, allow_inf_nan=False, description="Size of the bug (see the kind); null: its default."
    )

    @model_validator(mode="after")
    def _check(self) -> InjectedBug:
        if self.kind not in REAL_PATH_BUGS:
            raise ValueError(
                f"kind: {self.kind.value!r} cannot be injected into a real run; choose one of "
                + ", ".join(b.value for b in REAL_PATH_BUGS)
            )
        default = REAL_PATH_BUGS[self.kind]
        if default is None:
            if self.factor is not None:
                raise ValueError(f"factor: {self.kind.value} takes no factor")
            return self
        if self.factor is None:
            object.__setattr__(self, "factor", default)
        factor = float(self.factor)
        if self.kind is DPBug.noise_scale and not (factor > 0 and factor != 1):
            raise ValueError(f"factor: noise_scale needs a factor > 0 and != 1, got {factor}")
        if self.kind is DPBug.no_clipping and not factor > 1:
            raise ValueError(f"factor: no_clipping needs a factor > 1, got {factor}")
        if self.kind is DPBug.extra_participation and not (
            factor >= 2 and factor == math.floor(factor)
        ):
            raise ValueError(
                f"factor: extra_participation needs an integer factor >= 2, got {factor}"
            )
        return self

    @classmethod
    def parse(cls, text: str) -> InjectedBug:
        """``"noise_scale=0.5"``, ``"no_noise"``, ``"extra_participation=4"`` -> InjectedBug.

        Raises
        ------
        ValueError
            Naming what is wrong (pydantic's ``ValidationError`` is a ``ValueError``).
        """
        kind, _, factor = str(text).strip().partition("=")
        kind = kind.strip()
        choices = ", ".join(
            b.value if default is None else f"{b.value}[=FACTOR]"
            for b, default in REAL_PATH_BUGS.items()
        )
        if kind not in {b.value for b in REAL_PATH_BUGS}:
            raise ValueError(f"unknown bug {kind!r}; choose one of {choices}")
        try:
            value = float(factor) if factor else None
        except ValueError:
            raise ValueError(f"inject_bug: factor {factor!r} is not a number") from None
        try:
            return cls(kind=kind, factor=value)
        except ValidationError as exc:  # one line per problem, without pydantic's links
            raise ValueError(
                "; ".join(str(e.get("msg", "")).removeprefix("Value error, ") for e in exc.errors())
            ) from None

    @property
    def label(self) -> str:
        """``"noise_scale=0.5"`` style text for banners and logs."""
        return self.kind.value if self.factor is None else f"{self.kind.value}={self.factor:g}"
