"""The zero rail: scale to and from zero for models with ``min-replicas: 0`` (issue 18), for every policy.

Applied once per decision after :func:`autoscaler.decision.scaledown.normalize` (``core._decide``), to the count the
policy and the rails chose; models with ``min_replicas >= 1`` are never touched. In order:

1. requests held (``ModelMetrics.held_requests > 0``): at least one, for any current count -- from zero at once
   (``activated``), even on stale or missing metrics (a model at zero has no pods, hence nothing to scrape) and
   even when the model was not due (``core._size_models`` decides it now); with a replica still starting, held
   requests are live traffic the pods' rate does not show yet, so they keep it (``keep_warm``) however long the
   idle age;
2. stale or partial metrics: never to zero (a model with replicas keeps at least one; the hold of ``normalize``
   stays); a model already at zero may still be pre-warmed (a scale-up; live, it has nothing to scrape);
3. serving (arrivals or requests in flight at the newest step): at least one;
4. idle and the count is at most one: 0 or 1 as the model's keep-alive policy says
   (:mod:`autoscaler.policies.keepalive`: ``scaled_to_zero``, ``keep_warm``, from zero ``pre_warm``), unless the
   forecast's median over the lead time expects about a request or more (then one, the forecast's reason).

Never to zero before the routing (no traffic dropped between the switch and the scale): a model the activator
fronts (``via_activator`` not None) is scaled to zero only once the view already shows it routed through the
activator (``via_activator is True``: the activator's EndpointSlice exists and was seen, so the activator's informer
had a tick to learn the route). While it is False the rail keeps one replica this decision (``keep_warm``, detail
:data:`ROUTING_WAIT`) and :func:`routing` plans the switch; the scale to zero comes on a later decision. Models
nobody fronts (None) go to zero at once.

Routing (:func:`routing`): a model the activator can front is routed through it before its scale to zero (the
decision before, see above) and whenever it has no Ready replica; straight to its pods once one is Ready and it
wants one or more. Pure.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from autoscaler.api.plan import Reason, SetRouting
from autoscaler.api.snapshot import ModelMetrics, ModelObservation
from autoscaler.api.spec import ModelSpec
from autoscaler.estimation.idle_times import IdleTimes
from autoscaler.policies.base import Forecast
from autoscaler.policies.keepalive import LEARNED_SCALE_EVENT_S, keep_alive

# The forecast expects "about a request or more" over the lead time at this many expected arrivals (median).
FORECAST_REQUESTS = 1.0
# The idle age of a model at zero that was never seen serving: longer than any keep-alive or histogram range.
NEVER_ACTIVE_AGE_S = 1e9
# The detail of a one-replica hold that waits for the routing through the activator before the scale to zero.
ROUTING_WAIT = "waits for the routing through the activator before scaling to zero"


@dataclass(frozen=True)
class ZeroConfig:
    """The zero rail's settings (``CoreConfig.zero``). ``half_life_s``: the idle-time histograms' decay;
    ``prior_weight``: how many idle times the fleet's pooled histogram counts for in a model's learned policy (0:
    no fleet prior); ``fleet_prior``: pool every model's idle times as that prior; ``scale_event_s``: what one
    scale event costs the learned keep-alive, in replica-seconds (its hysteresis, ``keepalive.learned_bins``; 0:
    none)."""

    half_life_s: float = 86_400.0
    prior_weight: float = 2.0
    fleet_prior: bool = True
    scale_event_s: float = LEARNED_SCALE_EVENT_S


def held(m: ModelMetrics) -> bool:
    """Requests held for the model now (the activator's report, the simulator's held queue)."""
    return m.held_requests > 0


def needs_activation(obs: ModelObservation, m: ModelMetrics | None) -> bool:
    """A model at zero with requests held: decided now, due or not."""
    return (m is not None and m.held_requests > 0 and obs.active_replicas == 0 and obs.spec is not None
            and obs.spec.min_replicas == 0)


def _serving(m: ModelMetrics) -> bool:
    if held(m):  # (live, held requests are not in the pods' rate yet)
        return True
    r, f = m.rate, m.in_flight
    arrivals = r.size > 0 and math.isfinite(r[-1]) and r[-1] > 0
    flight = f.size > 0 and math.isfinite(f[-1]) and f[-1] > 0
    return bool(arrivals or flight)


def _forecast_expects(forecast: Forecast | None) -> bool:
    if forecast is None:
        return False
    median = forecast.at(0.5)
    return math.isfinite(median) and median * forecast.horizon_s >= FORECAST_REQUESTS


def apply(obs: ModelObservation, spec: ModelSpec, m: ModelMetrics, desired: int, reason: Reason, detail: str,
          idle: IdleTimes | None, now: float, lead_s: float, forecast: Forecast | None,
          prior: IdleTimes | None = None, config: ZeroConfig | None = None) -> tuple[int, Reason, str]:
    """The rail on one decision's (desired, reason, detail); see the module docstring."""
    if spec.min_replicas != 0:
        return desired, reason, detail
    n, reason, detail = _apply(obs, spec, m, desired, reason, detail, idle, now, lead_s, forecast, prior, config)
    if n == 0 and obs.active_replicas >= 1 and obs.via_activator is False:
        return min(1, spec.max_replicas), Reason.KEEP_WARM, ROUTING_WAIT
    return n, reason, detail


def _apply(obs: ModelObservation, spec: ModelSpec, m: ModelMetrics, desired: int, reason: Reason, detail: str,
           idle: IdleTimes | None, now: float, lead_s: float, forecast: Forecast | None,
           prior: IdleTimes | None, config: ZeroConfig | None) -> tuple[int, Reason, str]:
    current = obs.active_replicas
    top = spec.max_replicas
    if held(m):  # held requests are serving, whatever the count (a replica still starting included)
        if desired >= 1:
            return desired, reason, detail
        if current == 0:
            return min(1, top), Reason.ACTIVATED, f"{m.held_requests:g} request(s) held at zero"
        return min(1, top), Reason.KEEP_WARM, f"serving: {m.held_requests:g} request(s) held"
    unseen = m.stale or m.partial_reason() is not None
    if unseen and current > 0:
        if desired < 1:
            return 1, reason, f"{detail}; not to zero on stale or partial metrics".strip("; ")
        return desired, reason, detail
    if desired > 1 or (unseen and desired >= 1):
        return desired, reason, detail
    # (stale at zero -- live, a model at zero has nothing to scrape -- : only a pre-warm may come of it, below)
    if not unseen and _serving(m):
        if desired < 1:
            return 1, Reason.KEEP_WARM, "serving"
        return desired, reason, detail
    if _forecast_expects(forecast):
        return max(desired, 1), reason if desired >= 1 else Reason.FORECAST, detail or "forecast expects a request"
    cfg = config or ZeroConfig()
    age = idle.age(now) if idle is not None else 0.0
    if current == 0 and (idle is None or (idle.idle_since is None and not idle.active)):
        # At zero and never seen serving (live, a model at zero has nothing to scrape): no sign of a request
        # soon, so no pre-warm -- the first held request brings it up (rule 1).
        age = NEVER_ACTIVE_AGE_S
    ka = keep_alive(idle, age, lead_s, spec, prior if cfg.fleet_prior else None, cfg.prior_weight,
                    cfg.scale_event_s)
    if ka.warm:
        return 1, Reason.KEEP_WARM if current >= 1 else Reason.PRE_WARM, ka.detail
    return 0, Reason.SCALED_TO_ZERO, ka.detail


def routing(obs: ModelObservation, spec: ModelSpec, target: int, detail: str = "") -> SetRouting | None:
    """The routing change this decision needs (None: none), for a model the activator can front; ``detail``: the
    decision's (:data:`ROUTING_WAIT`: it waits for this switch to scale to zero)."""
    via = obs.via_activator
    if via is None or spec.min_replicas != 0:
        return None
    if not via and (target == 0 or detail == ROUTING_WAIT):
        return SetRouting(obs.name, True, "to zero")
    if not via and obs.ready_replicas == 0:
        return SetRouting(obs.name, True, "no Ready replica")
    if via and target >= 1 and obs.ready_replicas >= 1:
        return SetRouting(obs.name, False, "a replica is Ready")
    return None


def observe(idle: IdleTimes, m: ModelMetrics, step_s: float, now: float, lead_s: float) -> None:
    """Fold the window into the model's idle times (each step once); the head is counted over the lead time."""
    idle.head_s = lead_s
    if not m.stale:
        idle.observe(m.rate, m.in_flight if m.in_flight.size else np.zeros(m.rate.size), m.held_requests, step_s,
                     now)
    elif held(m):  # (a model at zero has nothing to scrape: its held requests alone open the activity)
        idle.hold(m.held_requests, now)
