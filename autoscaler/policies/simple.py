"""slotwise's first policy: size for the forecast's upper quantile, scale down only after a quiet window.

Registered as ``slotwise``; later issues replace it. Scale-up follows the forecast (a horizon as long as the
cold start, so new replicas are Ready when the load arrives); scale-down waits until every recommendation of
the last ``scale_down_stabilization_s`` was lower, because a replica removed too early costs a cold start
when the load comes back, while a replica kept too long only costs GPU time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from autoscaler import capacity as capacity_model
from autoscaler.plan import Reason
from autoscaler.policies.base import PolicyContext, PolicyResult, replicas_for_load
from autoscaler.spec import ModelSpec


@dataclass(frozen=True)
class SimpleState:
    started_at: float | None = None  # first decision: before a full window has passed, hold on scale-down
    # (time, unstabilized recommendation) as a monotone queue: the window's maximum comes first
    recommendations: tuple[tuple[float, int], ...] = ()


class SimplePolicy:
    """Forecast-based sizing with a scale-down stabilization window.

    rate = max(last observed rate, forecast at ``quantile``); desired = the fewest replicas meeting the SLO
    at that rate (``capacity.min_replicas_for_slo`` on the context's service profile), or, with
    ``use_slo_sizing=False``, the replicas that carry it at ``target_utilization``. The observed rate is a
    floor because a forecast that lags a ramp must not shed replicas that are busy now.
    """

    name = "slotwise"
    instant_start = False
    uses_forecast = True

    def __init__(
        self,
        quantile: float = 0.9,
        scale_down_stabilization_s: float = 120.0,
        tick_s: float = 10.0,
        target_utilization: float = 0.7,
        use_slo_sizing: bool = True,
    ) -> None:
        if not 0 < quantile < 1:
            raise ValueError("quantile must be in (0, 1)")
        if scale_down_stabilization_s < 0:
            raise ValueError("scale_down_stabilization_s must be >= 0")
        if not tick_s > 0:
            raise ValueError("tick_s must be > 0")
        if not target_utilization > 0:
            raise ValueError("target_utilization must be > 0")
        self.quantile = quantile
        self.scale_down_stabilization_s = scale_down_stabilization_s
        self.tick_s = tick_s
        self.target_utilization = target_utilization
        self.use_slo_sizing = use_slo_sizing

    def initial_state(self, spec: ModelSpec, replicas: int) -> SimpleState:
        return SimpleState()

    def _size(self, rate: float, ctx: PolicyContext) -> int:
        if self.use_slo_sizing:
            # One past the ceiling, so that "needs more than allowed" still shows as BOUNDS in the rails.
            return capacity_model.min_replicas_for_slo(rate, ctx.capacity, ctx.spec.max_replicas + 1)
        return replicas_for_load(rate, ctx.spec, self.target_utilization)

    def decide(self, ctx: PolicyContext) -> PolicyResult:
        state: SimpleState = ctx.state if isinstance(ctx.state, SimpleState) else SimpleState()
        now, current = ctx.now, ctx.current_replicas
        observed = _last_finite(ctx.metrics.rate)
        forecast = ctx.forecast.at(self.quantile) if ctx.forecast is not None else None
        if forecast is not None and math.isfinite(forecast):
            rate = max(observed, forecast)
            sized_reason = Reason.FORECAST
        else:
            # Without a forecast this is a reactive policy; say so rather than claim a forecast.
            forecast = None
            rate = observed
            sized_reason = Reason.REACTIVE
        raw = self._size(max(rate, 0.0), ctx)

        started = state.started_at if state.started_at is not None else now
        # The window's recommendations are kept as a monotone queue (times increasing, counts strictly
        # decreasing), so its maximum is the first entry: O(1) per tick instead of a scan of the window.
        cutoff = now - self.scale_down_stabilization_s
        recs = state.recommendations
        while recs and recs[-1][1] <= raw:
            recs = recs[:-1]
        recs = (*recs, (now, raw))
        while recs[0][0] <= cutoff:
            recs = recs[1:]
        new_state = SimpleState(started_at=started, recommendations=recs)

        if raw >= current:
            return PolicyResult(raw, new_state, sized_reason, _detail(self.quantile, forecast, observed, raw))
        # Scale down to the highest recommendation of the window; until a whole window of history exists,
        # the current count stands in for the recommendations we have not seen.
        window_max = recs[0][1]
        if now - started < self.scale_down_stabilization_s:
            window_max = max(window_max, current)
        desired = min(current, window_max)
        detail = _detail(self.quantile, forecast, observed, raw)
        if desired == current:
            return PolicyResult(current, new_state, Reason.STABLE, f"{detail}, held by the scale-down window")
        return PolicyResult(desired, new_state, sized_reason, f"{detail}, window max {desired}")


def _last_finite(rate: np.ndarray) -> float:
    if rate.size and math.isfinite(last := float(rate[-1])):
        return last
    finite = rate[np.isfinite(rate)]
    return float(finite[-1]) if finite.size else 0.0


def _detail(quantile: float, forecast: float | None, observed: float, raw: int) -> str:
    if forecast is None:
        return f"no forecast, observed {observed:.2f} req/s: {raw}"
    return f"forecast q{quantile:g} {forecast:.2f}, observed {observed:.2f} req/s: {raw}"
