"""The queueing model's tables read backwards: from what the replicas hold (the mean in-flight count, the latency at
the SLO percentile) to the offered load in Erlangs that implies. One table per shape of service (concurrency,
dispersion, and for the latency the latency part's shape), computed once and shared by every learner of that shape
(:class:`autoscaler.estimation.learning.CapacityLearner` inverts one observation with a bisect on the lists, and a
window on arrays with :class:`InFlightInversion`, which :func:`autoscaler.estimation.work.offered_rates` applies to
the fleet's windows at once)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from scipy import special

from autoscaler.estimation.capacity import wait_params

# Utilisation grid for the inverse tables: uniform in logit(rho) over [1e-4, 0.9999] (plus 0), so the
# points crowd geometrically toward both ends: near 0 the in-flight count is ~x and near saturation it
# explodes like 1/(1 - rho), and either way neighbours differ by ~2%, which keeps linear interpolation
# within ~0.01% for the mean (tests/estimation/test_learning.py checks the recovery against the forward model).
_GRID_N = 1024
_RHO = np.concatenate(([0.0], special.expit(np.linspace(-math.log(1e4), math.log(1e4), _GRID_N))))


@lru_cache(maxsize=512)
def in_flight_table(c: int, scv: float) -> tuple[list[float], list[float]]:
    """``(y, x)``: per-replica mean in system ``y = x * (1 + Wq/mean)`` at offered load ``x`` Erlangs.

    Little's law per replica: in flight = busy servers (``x``) + queue (``x * Wq / mean``). With service
    ``s * mean``, ``x = rate/replicas * s * mean`` and ``Wq/(s*mean)`` depends on ``x`` only, so one
    table per (concurrency, scv) inverts every observation: the scale search is a bisect on a list.
    The wait is the capacity model's (``p_wait / decay`` is the mean of its exponential tail).
    """
    x = _RHO * c
    p_wait, decay = wait_params(x, c, 1.0, scv)
    y = x * (1.0 + p_wait / decay)
    return [float(v) for v in y], [float(v) for v in x]


@dataclass(frozen=True, eq=False)
class InFlightInversion:
    """:func:`in_flight_table` read the other way on arrays, the batch's own slowdown taken out: a per-replica
    in-flight count -> the offered Erlangs it implies. Shared (:func:`inversion`) by the learners of one
    (concurrency, scv, slowdown): rows of several models' windows with the same object invert in one call."""

    y: np.ndarray
    x: np.ndarray
    batch_k: float
    c_1: float

    def erlangs(self, per_replica: np.ndarray) -> np.ndarray:
        """Elementwise (any shape): NaN where the reading is missing, negative or beyond the stable range."""
        with np.errstate(invalid="ignore"):
            x = np.interp(per_replica, self.y, self.x, right=np.nan)
            x[~(per_replica >= 0.0)] = np.nan  # (NaN in, negative in)
            if self.batch_k:
                x = x / (1.0 + self.batch_k * np.minimum(x, self.c_1))
        return x


@lru_cache(maxsize=512)
def inversion(c: int, scv: float, batch_k: float) -> InFlightInversion:
    y, x = in_flight_table(c, scv)
    return InFlightInversion(np.asarray(y), np.asarray(x), batch_k, c - 1.0)


@lru_cache(maxsize=512)
def latency_table(c: int, scv: float, p: float, shape: bytes) -> tuple[list[float], list[float]] | None:
    """``(h, x)``: ``h = x * q(x)`` with ``q`` the ``p``-quantile of latency in units of the mean service.

    Latency = latency part + wait; with service ``s * mean`` it is ``s * mean * q(x)``, so an observed
    latency ``l`` at ``rate/replicas`` gives ``l * rate/replicas = x * q(x)``, monotone in ``x``.
    ``shape`` is the latency part divided by the mean occupancy. None when the latency part is 0 at the
    quantile (nothing to learn from latency at low load).

    The latency CDF is the capacity model's, ``F(t) = mean_k within_prob(t - lat_k, p_wait, decay)``
    (tests/estimation/test_learning.py inverts it by bisection and compares). Between two sorted points,
    ``t = lat_j + u``, it is ``j/K - (p_wait/K) * D_j * exp(-decay*u)`` with
    ``D_j = sum_{k<=j} exp(-decay*(lat_j - lat_k))`` (a recursion, exponents <= 0: no overflow), so the
    quantile is a closed form on the first segment that reaches ``p``: exact, and one pass over the K
    points for the whole grid (about a millisecond), where a bisection took several.
    """
    lat = np.sort(np.frombuffer(shape, dtype=np.float64))
    k_pts = lat.size
    x = _RHO * c
    p_wait, decay = wait_params(x, c, 1.0, scv)
    q = np.full_like(x, np.nan)
    todo = np.ones(x.shape, dtype=bool)
    d_sum = np.zeros_like(x)
    pk = p * k_pts
    for j in range(1, k_pts + 1):
        if j > 1:
            d_sum *= np.exp(-decay * (lat[j - 1] - lat[j - 2]))
        d_sum += 1.0
        cd = p_wait * d_sum
        at_start = todo & (j - cd >= pk)  # the jump at lat_j already reaches p
        q[at_start] = lat[j - 1]
        todo &= ~at_start
        if j <= pk or not todo.any():
            continue
        with np.errstate(divide="ignore"):
            u = np.log(cd / (j - pk)) / decay
        inside = todo if j == k_pts else todo & (u < lat[j] - lat[j - 1])
        q[inside] = lat[j - 1] + u[inside]
        todo &= ~inside
    if not q[0] > 0.0:
        return None
    h = x * q
    return [float(v) for v in h], [float(v) for v in x]
