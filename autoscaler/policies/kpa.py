"""Knative KPA (concurrency mode), as ``pkg/autoscaler/scaling/autoscaler.go`` ``Scale`` computes it.

Defaults from ``config/core/configmaps/autoscaler.yaml``: a 2 s tick; target = containerConcurrency × 70 %;
stable window 60 s, panic window 10 % of it (6 s); panic when the panic-window pod count ÷ ready pods
>= 200 %; max scale-up rate 1000× and max scale-down rate 2× of the ready pods per decision.

- desired = ceil(mean concurrency over the window / target), for both windows, kept within
  [floor(ready / max_scale_down_rate), ceil(ready × max_scale_up_rate)];
- panic begins (or is extended) whenever the panic-window count is over the threshold, and ends only after
  a full stable window has passed since it was last over; in panic the larger of the two counts is used and
  the count never goes down;
- with ``min_replicas`` 0 a zero recommendation is held at one replica for the scale-to-zero grace
  period (30 s), roughly what the activator hand-over does.

The observed concurrency is the model's mean in-flight requests (running + queued, which is what the
queue-proxy reports) per metrics step, averaged over each window.

Not modelled: the activator and target-burst-capacity (routing, not sizing), activation scale, scale-down
delay (default 0), and starting in panic after a restart — Knative does that because a restarted
autoscaler loses its metric history; here the metrics window is supplied from outside and is not lost.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from autoscaler.api.plan import Reason
from autoscaler.api.snapshot import window_mean
from autoscaler.api.spec import ModelSpec
from autoscaler.policies.base import PolicyContext, PolicyResult, ScalingBehavior

_EPS = 1e-9


@dataclass(frozen=True)
class KPAState:
    panic_time: float | None = None  # last time the panic threshold was crossed; None = stable mode
    max_panic_pods: int = 0  # the high-water mark held while panicking
    zero_since: float | None = None  # when the recommendation first became 0 (scale-to-zero grace)


class KPAPolicy:
    """Knative Pod Autoscaler on observed concurrency.

    ``target_utilization`` is ``container-concurrency-target-percentage`` as a fraction (0.7 = 70 %);
    the percentages keep Knative's own units.
    """

    name = "kpa"
    instant_start = False
    uses_forecast = False  # reacts to observed (or, for the oracle, true) load only
    learns = False
    # Its own decider: the scale-up/-down rate bounds feed the panic high-water mark (Knative's ``Scale`` applies
    # them to both windows' counts before it), so they are part of the recommendation, not a behaviour after it.
    behavior: ScalingBehavior | None = None

    def __init__(
        self,
        target_utilization: float = 0.7,
        stable_window_s: float = 60.0,
        panic_window_percentage: float = 10.0,
        panic_threshold_percentage: float = 200.0,
        tick_s: float = 2.0,
        max_scale_up_rate: float = 1000.0,
        max_scale_down_rate: float = 2.0,
        scale_to_zero_grace_period_s: float = 30.0,
    ) -> None:
        if not target_utilization > 0:
            raise ValueError("target_utilization must be > 0")
        if not stable_window_s > 0:
            raise ValueError("stable_window_s must be > 0")
        if not 0 < panic_window_percentage <= 100:
            raise ValueError("panic_window_percentage must be in (0, 100]")
        if not panic_threshold_percentage > 0:
            raise ValueError("panic_threshold_percentage must be > 0")
        if not tick_s > 0:
            raise ValueError("tick_s must be > 0")
        if not (max_scale_up_rate > 1 and max_scale_down_rate > 1):
            raise ValueError("max_scale_up_rate and max_scale_down_rate must be > 1 (Knative's validation)")
        if scale_to_zero_grace_period_s < 0:
            raise ValueError("scale_to_zero_grace_period_s must be >= 0")
        self.target_utilization = target_utilization
        self.stable_window_s = stable_window_s
        self.panic_window_percentage = panic_window_percentage
        self.panic_threshold_percentage = panic_threshold_percentage
        self.tick_s = tick_s
        self.max_scale_up_rate = max_scale_up_rate
        self.max_scale_down_rate = max_scale_down_rate
        self.scale_to_zero_grace_period_s = scale_to_zero_grace_period_s

    @property
    def panic_window_s(self) -> float:
        return self.stable_window_s * self.panic_window_percentage / 100.0

    def initial_state(self, spec: ModelSpec, replicas: int) -> KPAState:
        return KPAState()

    def decide(self, ctx: PolicyContext) -> PolicyResult:
        state: KPAState = ctx.state if isinstance(ctx.state, KPAState) else KPAState()
        now, spec, current = ctx.now, ctx.spec, ctx.current_replicas
        step = ctx.metrics_step_s
        stable = window_mean(ctx.metrics.in_flight, step, self.stable_window_s)
        panic = window_mean(ctx.metrics.in_flight, step, self.panic_window_s)
        if stable is None or panic is None:
            # Knative returns ScaleValid=false and the reconciler keeps the scale.
            return PolicyResult(current, state, Reason.METRICS_STALE, "no concurrency samples in the window")

        # Knative presumes at least one ready pod so the ratios stay defined while scaling from zero.
        ready = max(1, ctx.ready_replicas)
        target = spec.concurrency * self.target_utilization
        max_up = math.ceil(self.max_scale_up_rate * ready - _EPS)
        max_down = math.floor(ready / self.max_scale_down_rate + _EPS)
        dspc = math.ceil(stable / target - _EPS)
        dppc = math.ceil(panic / target - _EPS)
        stable_pods = min(max(dspc, max_down), max_up)
        panic_pods = min(max(dppc, max_down), max_up)

        over = dppc / ready >= self.panic_threshold_percentage / 100.0
        panic_time, max_panic = state.panic_time, state.max_panic_pods
        if over:
            panic_time = now  # begin, or extend, the panic
        elif panic_time is not None and panic_time + self.stable_window_s < now:
            # The surge has made its way into the stable window: leave panic.
            panic_time, max_panic = None, 0

        desired = stable_pods
        if panic_time is not None:
            # The stable window can run above the panic one (a burst just ended); provision for the larger.
            desired = max(desired, panic_pods)
            max_panic = max(max_panic, desired)
            desired = max_panic  # never scale down while panicking

        zero_since = state.zero_since
        detail = f"concurrency stable {stable:.2f} panic {panic:.2f}, target {target:.2f}/pod"
        if desired == 0 and spec.min_replicas == 0 and current > 0:
            zero_since = now if zero_since is None else zero_since
            if now - zero_since < self.scale_to_zero_grace_period_s:
                # Keep the last pod until the grace period lets the activator take over the route.
                desired = 1
                detail += f"; scale-to-zero grace ({now - zero_since:.0f}s)"
        elif desired > 0:
            zero_since = None

        new_state = KPAState(panic_time=panic_time, max_panic_pods=max_panic, zero_since=zero_since)
        if panic_time is not None:
            reason = Reason.PANIC
            detail += f"; panic (panic pods {dppc} / ready {ready})"
        else:
            reason = Reason.STABLE if desired == current else Reason.REACTIVE
        return PolicyResult(desired, new_state, reason, detail)
