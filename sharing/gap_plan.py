"""The planned packing of time-slice shares: which gaps a share should leave, priced from the target workload.

Most of the capacity a good online packer can still save on shared GPUs is in shares paired badly: a 320-milli share
put next to a 470 leaves 150 that only rare small shares fill, where next to a 650 it would have left 330 for the
common 300s. So the plan comes from the target workload (:mod:`sharing.fragmentation`): over its share sizes s (milli
of one GPU) with demands n_s, the LP relaxation of bin packing, min sum_c x_c s.t. sum_c a_sc x_c >= n_s (c = a way
to fill one GPU), has dual prices y_s -- the share of a GPU each size costs in the best packing (Gilmore-Gomory;
column generation with a knapsack, HiGHS for the LP). K(r) is the most price a gap of r milli can hold (an unbounded
knapsack over y). Putting a share of size g into a GPU with v free loses

    loss(v, g) = K(v) - K(v - g) - y_g  >= 0

of planned value (in GPUs): 0 when the share goes where the plan would put it, more when it leaves a gap no planned
mix fills. A size outside the plan is priced at K(g), what its room could have held. No constant is fitted: the
prices come from whatever workload is learned. ``CostAwarePacker`` ranks time-slice shares by this loss before best
fit when it has a target workload.

Measured on the FGD protocol (docs/sharing.md): this is what took shared-GPU-heavy mixes below best fit.
"""

from __future__ import annotations

from collections.abc import Sequence
from math import gcd

MILLI = 1000
_EPS = 1e-9
_PLANS: dict[tuple, GapPlan] = {}  # one plan per (sizes, rounded demand shares): a workload changes slowly


def packing_prices(sizes: Sequence[int], demand: Sequence[float], cap: int = MILLI) -> list[float]:
    """Dual prices y of the bin-packing LP over ``sizes`` (with ``demand``), one per size.

    Gilmore-Gomory column generation: solve the dual max demand.y s.t. sum_s a_s y_s <= 1 for the configurations
    found so far, then add the most valuable configuration under y (an unbounded knapsack) until none exceeds 1.
    Starting from the one-size configurations keeps y bounded."""
    import numpy as np
    from scipy.optimize import linprog

    if not sizes:
        return []
    cols: list[list[int]] = [[cap // s if j == i else 0 for j in range(len(sizes))] for i, s in enumerate(sizes)]
    y = [0.0] * len(sizes)
    for _ in range(500):  # each round adds a new configuration; a few dozen suffice in practice
        res = linprog(-np.asarray(demand, dtype=np.float64), A_ub=np.array(cols, dtype=np.float64),
                      b_ub=np.ones(len(cols)), bounds=[(0, None)] * len(sizes), method="highs")
        if res.status != 0:
            raise RuntimeError(f"packing LP failed: {res.message}")
        y = [max(float(x), 0.0) for x in res.x]  # HiGHS can return -0.0
        value, config = _best_config(sizes, y, cap)
        if value <= 1.0 + _EPS or config in cols:
            break
        cols.append(config)
    return y


def _best_config(sizes: Sequence[int], y: Sequence[float], cap: int) -> tuple[float, list[int]]:
    """The configuration (count per size, sum <= cap) with the largest total price."""
    step = _step(sizes, cap)
    k = knapsack(sizes, y, cap)
    counts = [0] * len(sizes)
    r = cap // step
    while r > 0:  # walk back through the DP
        if k[r] <= k[r - 1] + _EPS:
            r -= 1
            continue
        for i, s in enumerate(sizes):
            q = s // step
            if q <= r and abs(k[r - q] + y[i] - k[r]) <= _EPS:
                counts[i] += 1
                r -= q
                break
        else:
            r -= 1
    return k[cap // step], counts


def _step(sizes: Sequence[int], cap: int) -> int:
    g = cap
    for s in sizes:
        g = gcd(g, s)
    return max(g, 1)


def knapsack(sizes: Sequence[int], y: Sequence[float], cap: int = MILLI) -> list[float]:
    """K[r // step]: the most price a gap of r milli holds (unbounded knapsack), r = 0..cap."""
    step = _step(sizes, cap)
    n = cap // step
    q = [s // step for s in sizes]
    k = [0.0] * (n + 1)
    for r in range(1, n + 1):
        best = k[r - 1]
        for qi, yi in zip(q, y, strict=True):
            if qi <= r and k[r - qi] + yi > best:
                best = k[r - qi] + yi
        k[r] = best
    return k


class GapPlan:
    """The plan for one GPU kind: prices per share size and the value of every gap, 0..1000 milli."""

    def __init__(self, sizes: Sequence[int], demand: Sequence[float]) -> None:
        self.sizes = list(sizes)
        prices = packing_prices(self.sizes, demand)
        self.price = dict(zip(self.sizes, prices, strict=True))
        steps = knapsack(self.sizes, prices) if self.sizes else [0.0]
        step = _step(self.sizes, MILLI)
        # A gap's value at 1 milli resolution (shares can ask for sizes the plan has not seen).
        self.gap_value = [steps[min(r // step, len(steps) - 1)] for r in range(MILLI + 1)]

    @classmethod
    def for_demand(cls, demand: dict[int, float]) -> GapPlan:
        """The plan for share sizes (milli) -> weight, shared between calls whose sizes and rounded shares match."""
        sizes = sorted(s for s in demand if 0 < s < MILLI)
        total = sum(demand[s] for s in sizes) or 1.0
        key = tuple((s, round(demand[s] / total, 3)) for s in sizes)
        hit = _PLANS.get(key)
        if hit is None:
            if len(_PLANS) > 256:
                _PLANS.clear()
            hit = _PLANS[key] = cls(sizes, [demand[s] for s in sizes])
        return hit

    def loss(self, v: int, g: int) -> float:
        """Planned value lost by taking ``g`` milli from a GPU with ``v`` free (GPUs; module doc)."""
        if not 0 < g <= v <= MILLI:
            return 0.0
        k = self.gap_value
        y = self.price.get(g, k[g])
        return max(k[v] - k[v - g] - y, 0.0)
