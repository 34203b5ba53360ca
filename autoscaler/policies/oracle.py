"""Oracle baseline: a clairvoyant lower bound that sizes for the load of the next tick and starts instantly.

Nothing real can do this; it shows how much of the cost gap is left to close. It reads
``ModelMetrics.future_rate``, which the simulator gives only to this policy, and asks for zero cold start.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from autoscaler.api.plan import Reason
from autoscaler.api.spec import ModelSpec
from autoscaler.estimation import capacity as capacity_model
from autoscaler.policies.base import PolicyContext, PolicyResult, ScalingBehavior


@dataclass(frozen=True)
class OracleState:
    pass


class OraclePolicy:
    name = "oracle"
    instant_start = True
    uses_forecast = False  # reacts to observed (or, for the oracle, true) load only
    learns = False
    behavior: ScalingBehavior | None = None  # a lower bound: it sheds at once what the next tick does not need

    def __init__(self, tick_s: float = 10.0) -> None:
        if not tick_s > 0:
            raise ValueError("tick_s must be > 0")
        self.tick_s = tick_s

    def initial_state(self, spec: ModelSpec, replicas: int) -> OracleState:
        return OracleState()

    def decide(self, ctx: PolicyContext) -> PolicyResult:
        rate = ctx.metrics.future_rate
        detail = "future rate"
        if rate is None or not math.isfinite(rate):
            # Run outside the simulator there is no future: degrade to the last observed rate rather than
            # fail, and say so, since the result is then no lower bound.
            finite = ctx.metrics.rate[np.isfinite(ctx.metrics.rate)]
            rate = float(finite[-1]) if finite.size else 0.0
            detail = "no future rate given: last observed rate"
        # Search one past the ceiling: a result above max_replicas then means "needs more than allowed"
        # (or the SLO is out of reach), which the rails clamp and report as BOUNDS.
        desired = capacity_model.min_replicas_for_slo(max(rate, 0.0), ctx.capacity, ctx.spec.max_replicas + 1)
        return PolicyResult(desired, ctx.state, Reason.ORACLE, f"{detail} {rate:.2f} req/s")
