"""The planned packing of time-slice shares (sharing/gap_plan.py): the LP's dual prices, the knapsack over them,
and the loss a share's placement gives."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.optimize import linprog

from sharing.gap_plan import GapPlan, _best_config, knapsack, packing_prices


def _primal_bins(sizes: list[int], demand: list[float]) -> float:
    """The LP optimum by brute-force enumeration of every configuration (small cases only)."""
    configs: list[list[int]] = []

    def rec(i: int, left: int, cur: list[int]) -> None:
        if i == len(sizes):
            if any(cur):
                configs.append(cur.copy())
            return
        for k in range(left // sizes[i] + 1):
            cur[i] = k
            rec(i + 1, left - k * sizes[i], cur)
        cur[i] = 0

    rec(0, 1000, [0] * len(sizes))
    a = np.array(configs, dtype=np.float64)
    res = linprog(np.ones(len(a)), A_ub=-a.T, b_ub=-np.asarray(demand), bounds=[(0, None)] * len(a), method="highs")
    return float(res.fun)


@pytest.mark.parametrize("sizes,demand", [
    ([500], [10.0]),
    ([320, 470, 650], [5.0, 5.0, 5.0]),
    ([160, 230, 320, 470, 650, 810], [74.0, 140.0, 328.0, 750.0, 253.0, 1078.0]),
    ([220, 370, 460, 590], [3.0, 9.0, 2.0, 7.0]),
])
def test_prices_are_dual_optimal(sizes, demand):
    """Column generation ends with dual-feasible prices whose value equals the LP's bins (strong duality)."""
    y = packing_prices(sizes, demand)
    assert min(y) >= 0
    assert knapsack(sizes, y)[-1] <= 1.0 + 1e-7  # no configuration is worth more than one GPU
    assert float(np.dot(y, demand)) == pytest.approx(_primal_bins(sizes, demand), rel=1e-6)


def test_best_config_walks_back_the_knapsack():
    value, counts = _best_config([320, 650], [0.3, 0.75], 1000)
    assert counts == [1, 1] and value == pytest.approx(1.05)  # beats 3 x 320 = 0.9


def test_the_loss_is_zero_on_plan_and_positive_off_it():
    """With 650, 470 and 320 equally common the plan pairs 320 with 650 and 470 with 470."""
    plan = GapPlan.for_demand({650: 1.0, 470: 1.0, 320: 1.0})
    assert plan.loss(350, 320) == pytest.approx(0.0, abs=1e-9)  # next to a 650: 30 left, as planned
    assert plan.loss(530, 320) > 0.1  # next to a 470: 210 left, which no planned share fills
    assert all(plan.loss(v, 470) >= 0 for v in range(470, 1001, 10))
    assert plan.loss(100, 320) == 0.0  # does not fit: no loss (the packer never offers it)


def test_plans_are_shared_between_equal_demand_mixes():
    assert GapPlan.for_demand({500: 2.0, 250: 1.0}) is GapPlan.for_demand({500: 4.0, 250: 2.0})
    assert GapPlan.for_demand({}).loss(1000, 300) == 0.0  # no shares planned: nothing to lose
