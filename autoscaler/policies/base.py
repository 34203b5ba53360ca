"""The policy contract: a policy is a function of one context returning (recommended replicas, state, reason).

As in Ray Serve's ``autoscaling_policy.py`` a policy sees one :class:`PolicyContext` and returns a
:class:`PolicyResult`; its state is passed in and out explicitly (a typed dataclass, never a dict),
so the same policy runs in the simulator, the benchmarks and the live controller.

A policy returns what it *recommends* now; how a recommendation becomes a scale is declared, as data, by the
policy's :attr:`Policy.behavior` (a :class:`ScalingBehavior`: stabilization window, step and rate limits, the N-1
floor) and applied, with the rails every policy needs (hold on stale metrics, min/max bounds), once for every
policy by :mod:`autoscaler.decision.scaledown` -- the way HPA's ``normalizeDesiredReplicasWithBehaviors`` wraps
its metric recommendation.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Literal, Protocol

import numpy as np

from autoscaler.api.plan import Reason
from autoscaler.api.snapshot import ModelMetrics
from autoscaler.api.spec import ModelSpec
from autoscaler.estimation.capacity import ServiceProfile


@dataclass(frozen=True)
class Forecast:
    """Quantiles of the request rate (req/s) over the next ``horizon_s``: ``values[i]`` is the
    ``quantiles[i]`` quantile of the peak step rate in the horizon.

    ``ready``: the same over the part of the horizon a replica asked for now can serve, from its cold start on (None:
    the whole horizon); what a scale-up is sized for (:mod:`autoscaler.policies.horizon`)."""

    quantiles: tuple[float, ...]
    values: np.ndarray
    horizon_s: float
    ready: Forecast | None = None

    def at(self, q: float) -> float:
        """The ``q`` quantile: interpolated between the levels, and beyond the top level extrapolated with
        an exponential tail through the top two (each 10x rarer event adds the same step), never below
        the top level's value."""
        if q in self.quantiles:
            return float(self.values[self.quantiles.index(q)])
        top = self.quantiles[-1]
        q = min(q, 1.0 - 1e-9)  # the 1-quantile of a rate has no finite forecast
        if q > top and len(self.quantiles) >= 2:
            below = self.quantiles[-2]
            v_top, v_below = float(self.values[-1]), float(self.values[-2])
            per_decade = (v_top - v_below) / math.log10((1.0 - below) / (1.0 - top))
            return v_top + max(per_decade, 0.0) * math.log10((1.0 - top) / (1.0 - q))
        # (a handful of levels: a scan beats numpy's call overhead, and every policy asks every tick)
        qs, vs = self.quantiles, self.values
        if q <= qs[0]:
            return float(vs[0])
        for i in range(1, len(qs)):
            if q <= qs[i]:
                lo, hi = float(vs[i - 1]), float(vs[i])
                return lo + (hi - lo) * (q - qs[i - 1]) / (qs[i] - qs[i - 1])
        return float(vs[-1])


@dataclass(frozen=True)
class PolicyContext:
    now: float
    spec: ModelSpec
    current_replicas: int  # desired count now in force (placed, incl. starting; excl. draining)
    ready_replicas: int
    metrics: ModelMetrics
    metrics_step_s: float
    forecast: Forecast | None
    capacity: ServiceProfile  # how one replica serves (prior from spec, or measured / learned)
    state: Any  # the policy's own state dataclass, from initial_state() or its previous result
    # For policies that learn (``learns = True``): the forecast quantile to size for (from the SLO,
    # corrected by error-budget burn) and the current burn rate (1 = spending the budget exactly).
    sizing_quantile: float | None = None
    burn: float = 0.0
    # For policies that learn: the window's arrivals as the offered work they carry, in requests/s of
    # ``capacity``'s mean service (aligned with ``metrics.rate``; autoscaler/estimation/work.py) -- the unit the
    # forecast is in. None: the request rate is that unit.
    work_rate: np.ndarray | None = None


@dataclass(frozen=True)
class NMinus1:
    """What a policy's N-1 check allows: ``replicas`` is the fewest replicas that still pass its stricter
    scale-down test (a scale-down needs ``replicas`` below the current count); ``test`` names the test, for
    the status message ("the SLO at q0.975"). The floor may be given as a function: it is a sizing search, and
    the scale-down rails ask for it only when the stabilization window lets the count go down."""

    floor: int | Callable[[], int]
    test: str

    @cached_property
    def replicas(self) -> int:
        return self.floor() if callable(self.floor) else self.floor


@dataclass(frozen=True)
class PolicyResult:
    """A policy's recommendation: ``desired`` is what it wants now, before its :class:`ScalingBehavior`
    (stabilization, limits) is applied; ``reason`` is why, for when the count moves.

    ``n_minus_1``: the floor the policy's N-1 check allows (policies whose behaviour has ``n_minus_1``; needed
    only when ``desired`` is below the current count). ``arrival_scv``: the arrivals' dispersion the policy
    sized with (None: it does not measure one); the lend stage sizes a model's need-soon with it.
    ``holds``: no recommendation this tick (no samples to decide on): the count is held and nothing is
    recorded in the stabilization window."""

    desired: int
    state: Any
    reason: Reason
    detail: str = ""
    n_minus_1: NMinus1 | None = None
    arrival_scv: float | None = None
    holds: bool = False


@dataclass(frozen=True)
class RateLimit:
    """One of HPA's ``HPAScalingPolicy``: within any ``period_s``, the count may move by at most ``value`` percent
    (``kind`` "percent") or ``value`` replicas ("pods") of the count at the start of that period."""

    kind: Literal["percent", "pods"]
    value: float
    period_s: float


@dataclass(frozen=True)
class ScalingBehavior:
    """How a policy's recommendations become a scale, applied by :mod:`autoscaler.decision.scaledown`.

    - ``stabilization_s``: scale down only to the highest recommendation of this window (HPA's
      ``scaleDown.stabilizationWindowSeconds``); ``warm_up``: a window not yet seen whole (since the policy's
      first decision) counts as holding the current count.
    - ``step_fraction``: per decision, at most this fraction of the replicas go (rounded down, at least one).
    - ``down_limits`` / ``up_limits``: rate limits per period, HPA's percent and pods policies with
      ``selectPolicy: Max`` (the policy allowing the largest change wins); counted from the count at the start of
      each period, so they keep the scale changes of that long. The up limits are here because those periods
      count changes in both directions.
    - ``up_stabilization_s``: scale up only to the lowest recommendation of this window.
    - ``n_minus_1``: a scale-down must also pass the policy's N-1 check (:attr:`PolicyResult.n_minus_1`).
    - ``bounds_in_limits``: the spec's min/max replicas are part of the rate limits, as in HPA's
      ``horizontal.go`` (a clamped scale is reported as any other); otherwise a clamp is reported as ``bounds``.
    """

    stabilization_s: float = 0.0
    warm_up: bool = False
    step_fraction: float | None = None
    down_limits: tuple[RateLimit, ...] = ()
    up_stabilization_s: float = 0.0
    up_limits: tuple[RateLimit, ...] = ()
    n_minus_1: bool = False
    bounds_in_limits: bool = False


class Policy(Protocol):
    """A scaling policy. ``tick_s`` is how often it decides (HPA 15 s, KPA 2 s, …);
    ``instant_start`` asks the simulator for zero cold start (only the oracle lower bound);
    ``uses_forecast`` tells the core whether to compute a forecast for it; ``learns`` whether to give it learned
    capacity, cold start (the forecast's lead time) and sizing quantile. ``behavior``: how its recommendations
    become a scale (None: the recommendation is the scale, within the rails -- a policy that is its own
    decider, as KPA's or a fixed count)."""

    name: str
    tick_s: float
    instant_start: bool
    uses_forecast: bool
    learns: bool
    behavior: ScalingBehavior | None

    def initial_state(self, spec: ModelSpec, replicas: int) -> Any: ...

    def decide(self, ctx: PolicyContext) -> PolicyResult: ...


def replicas_for_load(rate: float, spec: ModelSpec, utilization: float) -> int:
    """Replicas that carry ``rate`` req/s at ``utilization`` of each replica's capacity
    (``concurrency / service_time`` req/s per replica)."""
    if rate <= 0 or not math.isfinite(rate):
        return 0
    per_replica = spec.concurrency / spec.service_time_s
    return math.ceil(rate / (per_replica * utilization) - 1e-9)
