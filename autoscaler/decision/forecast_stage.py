"""The decision core's forecast stage: the fleet forecaster kept in step with the valid models, fed each tick.

``decide`` (autoscaler/decision/core.py) calls :func:`forecast_stage` first when the policy forecasts. The forecaster
sees the whole fleet at once (a shard of models folds a step together), so this stage is where one model's data
must be kept from stopping the others: a model whose window cannot be read or resampled is left out of the step
(``FleetForecaster.failed``) and holds; a failure of the forecaster itself holds every forecasting model for the tick
and rebuilds the forecaster from the metrics windows on the next one.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from autoscaler.api.plan import Plan
from autoscaler.api.snapshot import ClusterSnapshot, MetricsWindow, ModelMetrics
from autoscaler.decision.config import CoreConfig
from autoscaler.decision.state import ControllerState
from autoscaler.estimation.forecast import FleetForecaster
from autoscaler.estimation.work import WorkInputs, offered_rates
from autoscaler.policies.base import Forecast


def forecast_of(
    forecaster: FleetForecaster, name: str, cold_start_s: float, now: float, config: CoreConfig
) -> Forecast | None:
    # Lead time: a replica asked for now serves only after its cold start, and the next chance to
    # correct comes one tick later; metrics arrive late by the metric lag.
    horizon_s = cold_start_s + config.policy.tick_s + config.metric_lag_s
    # (and what a replica asked for now serves: from its cold start to the end of the window, the next decision's
    # replicas' ready time; autoscaler/policies/horizon.py)
    found = forecaster.lead_quantiles(name, now, horizon_s, cold_start_s)
    if found is None:
        return None
    values, ready = found
    after = None if ready is None else Forecast(forecaster.levels, ready, horizon_s - cold_start_s)
    return Forecast(quantiles=forecaster.levels, values=values, horizon_s=horizon_s, ready=after)


def update_forecaster(
    snapshot: ClusterSnapshot, metrics: MetricsWindow, state: ControllerState, config: CoreConfig
) -> FleetForecaster:
    """Keep the fleet forecaster's models in step with the valid specs, then fold in new samples."""
    forecaster = state.forecaster
    if forecaster is None:
        forecaster = state.forecaster = config.forecaster_factory()
    valid = frozenset(n for n, o in snapshot.models.items() if o.spec is not None)
    if valid != state.forecast_models:
        # A model joining with a metrics window that already spans forecast steps (a controller restart,
        # a fixed annotation: Prometheus kept its past) starts from that past, not from its prior.
        for name in valid - state.forecast_models:
            m = metrics.models.get(name)
            if (m is not None and not m.stale and m.rate.size * metrics.step_s >= forecaster.step_s
                    and not forecaster.has_history(name)):
                try:  # a window that cannot be resampled: this model starts from its prior, the others warm
                    forecaster.warm_start({name: m.rate}, metrics.step_s)
                except Exception as e:
                    forecaster.failed[name] = e
        priors = {n: _finite_or_none(o.spec.expected_rps) for n, o in snapshot.models.items() if o.spec is not None}
        forecaster.sync(sorted(valid), priors)
        state.forecast_models = valid
    work = work_signal(snapshot, state) if config.policy.learns else None
    forecaster.observe(snapshot.now, metrics, work)
    return forecaster


def _finite_or_none(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def forecast_stage(snapshot: ClusterSnapshot, metrics: MetricsWindow, state: ControllerState, config: CoreConfig,
                    plan: Plan) -> tuple[FleetForecaster | None, dict[str, Exception]]:
    """The forecaster after this tick's samples, and the models it could not take them from (they hold this tick).

    One model's data is confined to that model inside the forecaster (``FleetForecaster.failed``). Anything else that
    raises is the forecaster's own failure, not a model's: every forecasting model holds this tick (no forecast is no
    reason to scale anything), the failure is reported on the plan, and the forecaster is rebuilt from the metrics
    windows on the next tick (the warm start a restart gets)."""
    try:
        forecaster = update_forecaster(snapshot, metrics, state, config)
    except Exception as e:
        plan.stage_failures["forecast"] = f"{type(e).__name__}: {e}"[:300]
        state.forecaster, state.forecast_models = None, frozenset()
        held = RuntimeError(f"the fleet's forecast failed this tick: {type(e).__name__}: {e}")
        return None, {n: held for n, o in snapshot.models.items() if o.spec is not None}
    failed = dict(forecaster.failed)
    if failed:
        plan.stage_failures["forecast"] = "models left out: " + ", ".join(sorted(failed))[:300]
    return forecaster, failed


def work_signal(snapshot: ClusterSnapshot,
                 state: ControllerState) -> Callable[[list[tuple[str, ModelMetrics]]], list[np.ndarray]]:
    """What the forecaster forecasts for a model that learns: its offered work (autoscaler/estimation/work.py), read
    for the models it asks about together; the request rate for one that does not learn (yet)."""
    def signal(rows: list[tuple[str, ModelMetrics]]) -> list[np.ndarray]:
        out = [m.rate for _, m in rows]
        asks: list[WorkInputs] = []
        where: list[int] = []
        for i, (name, m) in enumerate(rows):
            ms = state.models.get(name)
            obs = snapshot.models.get(name)
            if ms is None or ms.learning is None or obs is None:
                continue
            asks.append(WorkInputs(m, obs.ready_replicas, ms.learning.capacity, ms.work_unit, ms.arrival_scv,
                                   ms.profile().median_budget_s))
            where.append(i)
        for i, work in zip(where, offered_rates(asks), strict=True):
            out[i] = work
        return out
    return signal
