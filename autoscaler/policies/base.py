"""The policy contract: a policy is a function of one context returning (desired replicas, state, reason).

As in Ray Serve's ``autoscaling_policy.py`` a policy sees one :class:`PolicyContext` and returns a
:class:`PolicyResult`; its state is passed in and out explicitly (a typed dataclass, never a dict),
so the same policy runs in the simulator, the benchmarks and the live controller. The rails every
policy needs (hold on stale metrics, min/max bounds) are composed once, in :func:`apply_rails`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from autoscaler.api.plan import Reason
from autoscaler.api.snapshot import ModelMetrics
from autoscaler.api.spec import ModelSpec
from autoscaler.estimation.capacity import ServiceProfile


@dataclass(frozen=True)
class Forecast:
    """Quantiles of the request rate (req/s) over the next ``horizon_s``: ``values[i]`` is the
    ``quantiles[i]`` quantile of the peak step rate in the horizon."""

    quantiles: tuple[float, ...]
    values: np.ndarray
    horizon_s: float

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


@dataclass(frozen=True)
class PolicyResult:
    desired: int
    state: Any
    reason: Reason
    detail: str = ""


class Policy(Protocol):
    """A scaling policy. ``tick_s`` is how often it decides (HPA 15 s, KPA 2 s, …);
    ``instant_start`` asks the simulator for zero cold start (only the oracle lower bound);
    ``uses_forecast`` tells the core whether to compute a forecast for it. A policy may also set
    ``learns = True`` to get learned capacity, cold start (the forecast's lead time) and sizing quantile."""

    name: str
    tick_s: float
    instant_start: bool
    uses_forecast: bool

    def initial_state(self, spec: ModelSpec, replicas: int) -> Any: ...

    def decide(self, ctx: PolicyContext) -> PolicyResult: ...


def replicas_for_load(rate: float, spec: ModelSpec, utilization: float) -> int:
    """Replicas that carry ``rate`` req/s at ``utilization`` of each replica's capacity
    (``concurrency / service_time`` req/s per replica)."""
    if rate <= 0 or not math.isfinite(rate):
        return 0
    per_replica = spec.concurrency / spec.service_time_s
    return math.ceil(rate / (per_replica * utilization) - 1e-9)


def window_mean(samples: np.ndarray, step_s: float, window_s: float) -> float | None:
    """Mean of the samples covering the last ``window_s`` (at least one sample); None without data.

    The window is rounded to the nearest whole number of steps: rounding up would make a short window
    (KPA's 6 s panic window on 5 s steps) twice as long and hide the very bursts it exists to catch.
    """
    if samples.size == 0:
        return None
    n = max(1, math.floor(window_s / step_s + 0.5)) if step_s > 0 else 1
    if n <= 8:
        # (every policy asks every tick: for a few samples plain floats beat numpy's call overhead)
        vals = [v for v in samples[-n:].tolist() if math.isfinite(v)]
        return sum(vals) / len(vals) if vals else None
    tail = samples[-n:]
    finite = tail[np.isfinite(tail)]
    if finite.size == 0:
        return None
    return float(finite.mean())


def apply_rails(policy: Policy, ctx: PolicyContext) -> PolicyResult:
    """Run ``policy`` with the rails every policy needs.

    - Metrics stale or missing: hold the current replicas (never scale down on missing data).
    - Clamp to the spec's min/max replicas.
    """
    if ctx.metrics.stale:
        held = max(ctx.current_replicas, ctx.spec.min_replicas)
        return PolicyResult(min(held, ctx.spec.max_replicas), ctx.state, Reason.METRICS_STALE, "holding replicas")
    result = policy.decide(ctx)
    clamped = min(max(result.desired, ctx.spec.min_replicas), ctx.spec.max_replicas)
    if clamped != result.desired:
        return PolicyResult(clamped, result.state, Reason.BOUNDS, f"wanted {result.desired}")
    return result
