"""Anytime-valid sequential test of (epsilon, delta)-DP by betting (González et al. 2025).

Two streams of observations arrive in pairs: ``X_t`` from the mechanism on the dataset *with*
the target (seen canaries) and ``Y_t`` from the neighbouring dataset *without* it (unseen
canaries). If the mechanism is (epsilon, delta)-DP then TV(P, Q) <= (e^eps - 1 + 2 delta) /
(e^eps + 1), and for a kernel with ``0 <= k <= 1`` (Gaussian RBF here) MMD(P, Q) <= sqrt(2) TV,
so

    H0: MMD(P, Q) <= tau(eps, delta) = sqrt(2) (e^eps - 1 + 2 delta) / (e^eps + 1).

The test bets against H0. Before seeing pair t it fixes a witness ``g_t`` in the RKHS with
``||g_t|| <= 1`` (so ``|g_t| <= 1``) and a stake ``lambda_t >= 0``; the wealth is

    K_t = prod_{s <= t} (1 + lambda_s (g_s(X_s) - g_s(Y_s) - tau)).

Under H0, ``E[g(X) - g(Y)] <= MMD <= tau`` for every such ``g``, so ``K_t`` is a nonnegative
supermartingale and by Ville's inequality ``P[exists t: K_t >= 1/alpha] <= alpha``: rejecting
the first time the wealth reaches ``1/alpha`` has type-I error at most ``alpha`` at any
stopping time, however long the stream. This holds for time-varying distributions too, as long
as every pair satisfies H0.

Choices made here (the paper's Algorithm 1 with these concrete subroutines):

* ``lambda_t`` by Online Newton Step on the losses ``-log(1 + lambda z_s)`` with the payoff
  scaled to ``z_s = (g_s(X_s) - g_s(Y_s) - tau) / (2 + tau)`` in ``[-1, 1]`` and the stake kept
  in ``[0, 1/2]``; so every factor is >= 1/2 and the wealth stays positive.
* ``g_t`` by projected online gradient ascent on the linear gains ``g(X_s) - g(Y_s)``
  (gradient ``k(X_s, .) - k(Y_s, .)``), step ``eta_s = 1/sqrt(s)``, projected onto the unit
  ball. ``g_t`` is stored as a kernel expansion over the last ``max_terms`` pairs; when a pair
  falls out of the window its term is removed and the result projected again. Any predictable
  ``g_t`` with ``||g_t|| <= 1`` keeps the test valid, so the window only costs power, never
  validity. The RKHS norm is tracked in O(max_terms) per step and recomputed exactly from the
  Gram matrix every ``max_terms`` steps.
* Bandwidth: given, or the median pairwise distance of the first ``calibration`` pairs, which
  are then *not* used for testing (as in the paper).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..results import Correction, EpsilonResult, Estimator
from ._validation import check_delta, check_finite

__all__ = [
    "SequentialDPTest",
    "mmd_threshold",
    "median_bandwidth",
    "sequential_epsilon_lower_bound",
    "default_epsilon_grid",
]

_ONS_RATE = 2.0 / (2.0 - math.log(3.0))  # Cutkosky & Orabona's ONS constant for stakes in [0, 1/2]
_LAMBDA_MAX = 0.5


def _check_epsilon(epsilon: float, name: str = "epsilon") -> float:
    value = check_finite(epsilon, name)
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {epsilon!r}")
    return value


def _check_int(value, name: str, minimum: int) -> int:
    if (
        isinstance(value, (bool, np.bool_))
        or not isinstance(value, (int, np.integer))
        or value < minimum
    ):
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def mmd_threshold(epsilon: float, delta: float, *, kernel_bound: float = math.sqrt(2.0)) -> float:
    """Largest MMD that (epsilon, delta)-DP allows: ``c (e^eps - 1 + 2 delta) / (e^eps + 1)``.

    Parameters
    ----------
    epsilon : float
        Claimed epsilon, >= 0.
    delta : float
        Claimed delta, in (0, 1).
    kernel_bound : float, optional
        ``c``: sqrt(2) for a kernel with ``0 <= k <= 1`` (MMD <= sqrt(2) TV).

    Returns
    -------
    float
        ``tau(epsilon, delta)``, capped at ``c`` (the MMD never exceeds ``c`` times TV <= 1).

    Raises
    ------
    ValueError
        If ``epsilon`` is negative or not finite, or ``delta`` is outside (0, 1).
    """
    eps = _check_epsilon(epsilon)
    delta = check_delta(delta)
    c = check_finite(kernel_bound, "kernel_bound")
    if c <= 0:
        raise ValueError(f"kernel_bound must be > 0, got {kernel_bound!r}")
    if eps > 700:  # e^eps overflows; TV bound is 1
        return c
    tv = (math.expm1(eps) + 2.0 * delta) / (math.exp(eps) + 1.0)
    return c * min(1.0, tv)


def _as_points(values, name: str) -> np.ndarray:
    """2-d float array (n, dim) from a 1-d stream of scalars or a 2-d stream of vectors."""
    try:
        array = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be an array of numbers") from None
    if array.ndim == 1:
        array = array[:, None]
    if array.ndim != 2:
        raise ValueError(f"{name} must be 1-d (scalars) or 2-d (vectors), got shape {array.shape}")
    if not np.all(np.isfinite(array)):
        raise ValueError(f"{name} contains NaN or Inf")
    return array


def _sq_dists(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Squared Euclidean distances between the rows of ``a`` and ``b`` (no (n, m, dim) temporary)."""
    out = np.sum(a * a, axis=1)[:, None] + np.sum(b * b, axis=1)[None, :] - 2.0 * (a @ b.T)
    return np.maximum(out, 0.0)


def median_bandwidth(xs, ys) -> float:
    """Median heuristic: median Euclidean distance between distinct points of ``xs`` and ``ys``
    pooled (1.0 if all points coincide).

    Raises
    ------
    ValueError
        If ``xs`` or ``ys`` is empty, has NaN/Inf or the wrong shape.
    """
    x = _as_points(xs, "xs")
    y = _as_points(ys, "ys")
    if x.shape[0] == 0 or y.shape[0] == 0:
        raise ValueError("xs and ys must not be empty")
    if x.shape[1] != y.shape[1]:
        raise ValueError(
            f"xs and ys must have the same dimension, got {x.shape[1]} and {y.shape[1]}"
        )
    pooled = np.vstack([x, y])
    dist = np.sqrt(_sq_dists(pooled, pooled))[np.triu_indices(pooled.shape[0], k=1)]
    dist = dist[dist > 0]
    return float(np.median(dist)) if dist.size else 1.0


class SequentialDPTest:
    """Streaming anytime-valid test of H0 "the mechanism is (epsilon, delta)-DP".

    Feed pairs with :meth:`update`; once the wealth reaches ``1/alpha`` the test rejects and
    stays rejected (``stopping_time`` is the number of tested pairs at that moment). Until then
    the type-I error is at most ``alpha`` whenever you stop.

    Parameters
    ----------
    epsilon : float
        Claimed epsilon (>= 0) of the null hypothesis.
    delta : float
        Claimed delta, in (0, 1).
    alpha : float, optional
        Level of the test, in (0, 1). Default 0.05.
    bandwidth : float or None, optional
        Gaussian RBF bandwidth ``h`` in ``k(x, y) = exp(-|x - y|^2 / (2 h^2))``. ``None``: the
        median heuristic on the first ``calibration`` pairs, which are then not tested.
    calibration : int, optional
        Pairs used for the bandwidth when ``bandwidth`` is None (default 20, >= 2).
    max_terms : int, optional
        Pairs kept in the witness's kernel expansion (default 500, >= 1).

    Raises
    ------
    ValueError
        Naming the bad argument.
    """

    def __init__(
        self,
        epsilon: float,
        delta: float,
        *,
        alpha: float = 0.05,
        bandwidth: float | None = None,
        calibration: int = 20,
        max_terms: int = 500,
    ) -> None:
        self.epsilon = _check_epsilon(epsilon)
        self.delta = check_delta(delta)
        self.alpha = check_delta(alpha, "alpha")
        if bandwidth is not None:
            h = check_finite(bandwidth, "bandwidth")
            if h <= 0:
                raise ValueError(f"bandwidth must be > 0, got {bandwidth!r}")
            self._bandwidth: float | None = h
        else:
            self._bandwidth = None
        self.calibration = _check_int(calibration, "calibration", 2)
        self.max_terms = _check_int(max_terms, "max_terms", 1)
        self.tau = mmd_threshold(self.epsilon, self.delta)
        self._scale = 2.0 + self.tau  # sup |payoff|
        self._log_threshold = math.log(1.0 / self.alpha)
        self._dim: int | None = None
        self._calib: list[tuple[np.ndarray, np.ndarray]] = []
        # witness g = sum_i coef_i (k(px_i, .) - k(py_i, .)) over a ring buffer
        self._px = np.empty((0, 0))
        self._py = np.empty((0, 0))
        self._coef = np.zeros(self.max_terms)
        self._count = 0  # terms stored (<= max_terms)
        self._head = 0  # next slot to write
        self._norm_sq = 0.0
        # ONS state
        self._lam = 0.0
        self._ons_a = 1.0
        # outputs
        self._log_wealth = 0.0
        self._min_factor = 1.0
        self._steps = 0
        self._stopping_time: int | None = None

    # -- public state -------------------------------------------------------------------
    @property
    def bandwidth(self) -> float | None:
        """The kernel bandwidth (None until calibrated)."""
        return self._bandwidth

    @property
    def log_wealth(self) -> float:
        """Natural log of the wealth ``K_t``."""
        return self._log_wealth

    @property
    def wealth(self) -> float:
        """The wealth ``K_t`` (1 before any tested pair; ``inf`` on overflow)."""
        return math.exp(self._log_wealth) if self._log_wealth < 709.0 else math.inf

    @property
    def rejected(self) -> bool:
        """True once the wealth has reached ``1/alpha`` (sticky)."""
        return self._stopping_time is not None

    @property
    def stopping_time(self) -> int | None:
        """Number of tested pairs (calibration pairs excluded) when H0 was rejected, else None."""
        return self._stopping_time

    @property
    def num_tested(self) -> int:
        """Pairs that entered the wealth so far (calibration pairs excluded)."""
        return self._steps

    @property
    def stake(self) -> float:
        """The stake ``lambda_t`` for the next pair on the raw payoff scale
        (in ``[0, 1 / (2 (2 + tau))]``)."""
        return self._lam / self._scale

    @property
    def witness_norm(self) -> float:
        """RKHS norm of the current witness as tracked (<= 1)."""
        return math.sqrt(self._norm_sq)

    @property
    def min_factor(self) -> float:
        """Smallest betting factor ``1 + lambda (payoff)`` so far (>= 1/2 by construction)."""
        return self._min_factor

    def __repr__(self) -> str:
        return (
            f"SequentialDPTest(epsilon={self.epsilon}, delta={self.delta}, alpha={self.alpha}, "
            f"tested={self._steps}, log_wealth={self._log_wealth:.3f}, rejected={self.rejected})"
        )

    # -- streaming ----------------------------------------------------------------------
    def update(self, x, y) -> bool:
        """Feed one pair (``x`` seen side, ``y`` unseen side); return :attr:`rejected`.

        ``x`` and ``y`` are scalars or 1-d vectors of one fixed dimension.

        Raises
        ------
        ValueError
            If ``x`` or ``y`` is NaN/Inf or has the wrong shape.
        """
        px = self._point(x, "x")
        py = self._point(y, "y")
        if self._bandwidth is None:
            self._calib.append((px, py))
            if len(self._calib) >= self.calibration:
                xs = np.array([p for p, _ in self._calib])
                ys = np.array([q for _, q in self._calib])
                self._bandwidth = median_bandwidth(xs, ys)
                self._calib = []
            return self.rejected
        self._step(px, py)
        return self.rejected

    def update_many(self, xs, ys) -> bool:
        """Feed pairs in order (stops feeding at the first rejection); return :attr:`rejected`."""
        x = _as_points(xs, "xs")
        y = _as_points(ys, "ys")
        if x.shape[0] != y.shape[0]:
            raise ValueError(
                f"xs and ys must have the same length, got {x.shape[0]} and {y.shape[0]}"
            )
        for i in range(x.shape[0]):
            if self.update(x[i], y[i]):
                break
        return self.rejected

    def witness(self, points) -> np.ndarray:
        """The current witness ``g_t`` at ``points`` (values in [-1, 1])."""
        p = _as_points(points, "points")
        if self._count == 0 or self._bandwidth is None:
            return np.zeros(p.shape[0])
        if self._dim is not None and p.shape[1] != self._dim:
            raise ValueError(f"points have dimension {p.shape[1]}, expected {self._dim}")
        return self._g_many(p)

    # -- internals ----------------------------------------------------------------------
    def _point(self, value, name: str) -> np.ndarray:
        try:
            array = np.asarray(value, dtype=np.float64).reshape(-1)
        except (TypeError, ValueError):
            raise ValueError(f"{name} must be a number or a vector of numbers") from None
        if array.size == 0:
            raise ValueError(f"{name} must not be empty")
        if not np.all(np.isfinite(array)):
            raise ValueError(f"{name} must be finite (no NaN or Inf)")
        if self._dim is None:
            self._dim = array.size
            self._px = np.zeros((self.max_terms, self._dim))
            self._py = np.zeros((self.max_terms, self._dim))
        elif array.size != self._dim:
            raise ValueError(f"{name} has dimension {array.size}, expected {self._dim}")
        return array

    def _exact_norm_sq(self) -> float:
        n = self._count
        pts = np.vstack([self._px[:n], self._py[:n]])
        w = np.concatenate([self._coef[:n], -self._coef[:n]])
        gram = np.exp(-_sq_dists(pts, pts) / (2.0 * self._bandwidth**2))
        return max(0.0, float(w @ gram @ w))

    def _project(self) -> None:
        if self._norm_sq > 1.0:
            shrink = 1.0 / math.sqrt(self._norm_sq)
            self._coef[: self._count] *= shrink
            self._norm_sq = 1.0

    def _g_many(self, zs: np.ndarray) -> np.ndarray:
        """``g`` at the rows of ``zs`` with one kernel evaluation."""
        n = self._count
        if n == 0:
            return np.zeros(zs.shape[0])
        c = self._coef[:n]
        inv = 1.0 / (2.0 * self._bandwidth**2)
        dx = self._px[:n, None, :] - zs[None, :, :]
        dy = self._py[:n, None, :] - zs[None, :, :]
        kx = np.exp(-np.einsum("ijk,ijk->ij", dx, dx) * inv)
        ky = np.exp(-np.einsum("ijk,ijk->ij", dy, dy) * inv)
        return c @ (kx - ky)

    def _step(self, px: np.ndarray, py: np.ndarray) -> None:
        full = self._count == self.max_terms
        h = self._head
        zs = np.stack([px, py, self._px[h], self._py[h]]) if full else np.stack([px, py])
        gz = self._g_many(zs)
        # 1. bet with the predictable g_t and lambda_t
        gx, gy = float(gz[0]), float(gz[1])
        z = (gx - gy - self.tau) / self._scale  # in [-1, 1] since |g| <= 1
        factor = 1.0 + self._lam * z
        self._steps += 1
        self._log_wealth += math.log(factor)
        self._min_factor = min(self._min_factor, factor)
        if self._stopping_time is None and self._log_wealth >= self._log_threshold:
            self._stopping_time = self._steps
        # 2. ONS on the loss -log(1 + lambda z)
        grad = -z / factor
        self._ons_a += grad * grad
        self._lam = min(_LAMBDA_MAX, max(0.0, self._lam - _ONS_RATE * grad / self._ons_a))
        # 3. OGA on the gain g(x) - g(y): g += eta (k(px, .) - k(py, .)), then project
        eta = 1.0 / math.sqrt(self._steps)
        inv = 1.0 / (2.0 * self._bandwidth**2)
        if full:  # drop the oldest term (at the write head): ||g - c v||^2
            old_c = self._coef[h]
            g_old = float(gz[2] - gz[3])
            d_old = self._px[h] - self._py[h]
            v_old = 2.0 - 2.0 * math.exp(-float(d_old @ d_old) * inv)
            self._norm_sq = max(0.0, self._norm_sq - 2.0 * old_c * g_old + old_c**2 * v_old)
            self._coef[h] = 0.0
            # g changed, so the new term's cross product uses g without the old term
            gx -= old_c * (
                math.exp(-float((px - self._px[h]) @ (px - self._px[h])) * inv)
                - math.exp(-float((px - self._py[h]) @ (px - self._py[h])) * inv)
            )
            gy -= old_c * (
                math.exp(-float((py - self._px[h]) @ (py - self._px[h])) * inv)
                - math.exp(-float((py - self._py[h]) @ (py - self._py[h])) * inv)
            )
        else:
            self._count += 1
        d_new = px - py
        v_sq = 2.0 - 2.0 * math.exp(-float(d_new @ d_new) * inv)  # ||k(px,.) - k(py,.)||^2
        self._norm_sq = max(0.0, self._norm_sq + 2.0 * eta * (gx - gy) + eta * eta * v_sq)
        self._px[h] = px
        self._py[h] = py
        self._coef[h] = eta
        self._head = (h + 1) % self.max_terms
        if self._steps % self.max_terms == 0:  # remove accumulated rounding error
            self._norm_sq = self._exact_norm_sq()
        self._project()


def default_epsilon_grid() -> np.ndarray:
    """Epsilons 0, 0.25, ..., 8 (33 values)."""
    return np.round(np.arange(0.0, 8.0 + 1e-9, 0.25), 10)


@dataclass(frozen=True)
class _GridOutcome:
    epsilon: float
    rejected: bool
    stopping_time: int | None
    log_wealth: float


def sequential_epsilon_lower_bound(
    xs,
    ys,
    *,
    delta: float,
    alpha: float = 0.05,
    grid=None,
    bandwidth: float | None = None,
    calibration: int = 20,
    max_terms: int = 500,
    threat_model: str = "all_iterates",
) -> EpsilonResult:
    """Largest epsilon on ``grid`` whose (epsilon, delta)-DP hypothesis the sequential test rejects.

    One :class:`SequentialDPTest` per grid value runs over the paired stream, each at level
    ``alpha / len(grid)`` (Bonferroni), so with probability >= 1 - alpha no true claim is
    rejected and the mechanism is not (eps_hat, delta)-DP. 0.0 when nothing is rejected.

    Parameters
    ----------
    xs, ys : array_like
        Paired streams (seen side, unseen side), same length; scalars (1-d) or vectors (2-d).
    delta : float
        Delta of the tested claims, in (0, 1).
    alpha : float, optional
        Family-wise level, in (0, 1); confidence is ``1 - alpha``.
    grid : array_like, optional
        Epsilons to test (>= 0, finite); default :func:`default_epsilon_grid`.
    bandwidth, calibration, max_terms
        As in :class:`SequentialDPTest` (with ``bandwidth=None`` the first ``calibration``
        pairs set it and are not tested).
    threat_model : str, optional
        Label of what the stream measures (default ``"all_iterates"``).

    Returns
    -------
    EpsilonResult
        ``estimator=sequential``, ``correction=bonferroni``; ``details``: ``num_pairs``,
        ``grid_size``, ``alpha_per_test``, ``tau`` and ``stopping_time`` of the reported
        epsilon, ``num_rejected``, ``bandwidth``.

    Raises
    ------
    ValueError
        Naming the bad argument (NaN in ``xs``/``ys``, unequal lengths, ``delta`` or ``alpha``
        outside (0, 1), an empty or negative ``grid``).
    """
    x = _as_points(xs, "xs")
    y = _as_points(ys, "ys")
    if x.shape[0] != y.shape[0]:
        raise ValueError(f"xs and ys must have the same length, got {x.shape[0]} and {y.shape[0]}")
    if x.shape[1] != y.shape[1]:
        raise ValueError(
            f"xs and ys must have the same dimension, got {x.shape[1]} and {y.shape[1]}"
        )
    delta = check_delta(delta)
    alpha = check_delta(alpha, "alpha")
    eps_grid = (
        default_epsilon_grid() if grid is None else np.asarray(grid, dtype=np.float64).reshape(-1)
    )
    if eps_grid.size == 0:
        raise ValueError("grid must not be empty")
    if not np.all(np.isfinite(eps_grid)) or np.any(eps_grid < 0):
        raise ValueError("grid must contain finite epsilons >= 0")
    eps_grid = np.unique(eps_grid)
    alpha_each = alpha / eps_grid.size
    outcomes = []
    used_bandwidth = bandwidth
    for eps in eps_grid:
        test = SequentialDPTest(
            float(eps),
            delta,
            alpha=alpha_each,
            bandwidth=bandwidth,
            calibration=calibration,
            max_terms=max_terms,
        )
        test.update_many(x, y)
        used_bandwidth = test.bandwidth
        outcomes.append(
            _GridOutcome(float(eps), test.rejected, test.stopping_time, test.log_wealth)
        )
    rejected = [o for o in outcomes if o.rejected]
    best = max(rejected, key=lambda o: o.epsilon) if rejected else None
    eps_hat = best.epsilon if best else 0.0
    details = {
        "num_pairs": int(x.shape[0]),
        "grid_size": int(eps_grid.size),
        "grid_max": float(eps_grid[-1]),
        "alpha_per_test": alpha_each,
        "num_rejected": len(rejected),
        "tau": mmd_threshold(eps_hat, delta),
        "stopping_time": best.stopping_time if best else None,
        "bandwidth": float(used_bandwidth) if used_bandwidth is not None else None,
    }
    method = (
        f"sequential MMD test by betting (González et al. 2025) on {x.shape[0]} seen/unseen pairs: "
        f"largest of {eps_grid.size} grid epsilons rejected, each at alpha/{eps_grid.size} "
        "(Bonferroni)"
    )
    return EpsilonResult(
        epsilon=eps_hat,
        estimator=Estimator.sequential,
        threat_model=threat_model,
        delta=delta,
        correction=Correction.bonferroni,
        confidence=1.0 - alpha,
        method=method,
        details=details,
    )
