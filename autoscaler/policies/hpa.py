"""Kubernetes HPA v2 on a per-pod in-flight metric, as the real controller computes it.

Follows ``pkg/controller/podautoscaler`` (``replica_calculator.go`` ``calcPlainMetricReplicas`` and
``horizontal.go`` ``normalizeDesiredReplicasWithBehaviors``) with the defaults of
``pkg/apis/autoscaling/v2/defaults.go``:

- desired = ceil(ready × metric / target), unchanged while |metric/target − 1| <= ``tolerance`` (0.1);
- scale-up: no stabilization, limited per ``scale_up_period_s`` (15 s) to the larger of +100 % and +4 pods
  (selectPolicy Max), counted from the replica count at the start of that period;
- scale-down: the highest recommendation of the last ``scale_down_stabilization_s`` (300 s) wins, and at
  most 100 % may go per 15 s.

This module computes the recommendation (``replica_calculator.go``); the behaviour (stabilization windows, rate
limits, the min/max clamp of ``horizontal.go``) is declared as :attr:`HPAPolicy.behavior` and applied by
:mod:`autoscaler.decision.scaledown`, the one place every policy's scale-down goes through.

The metric is the model's mean in-flight requests (running + queued) averaged over the last sync period,
divided by the ready replicas; the target is ``concurrency × target_utilization``.

Simplifications (documented so nobody mistakes them for the real thing):

- Replicas that are placed but not ready are treated as the HPA treats *Pending* pods: they carry no metric;
  on a scale-up they count as 0 usage (which damps the ratio), on a scale-down they are left out.
- Only selectPolicy Max (the default) is implemented; the scale-down percent policy is the only down policy.
- With no ready replica the HPA cannot read a per-pod metric and keeps the scale; at 0 replicas with load
  waiting we scale from zero as the ``HPAScaleToZero`` gate does with an Object metric.
- A restarted real controller forgets its recommendations; here they live in the explicit state.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from autoscaler.api.plan import Reason
from autoscaler.api.snapshot import window_mean
from autoscaler.api.spec import ModelSpec
from autoscaler.policies.base import PolicyContext, PolicyResult, RateLimit, ScalingBehavior

_EPS = 1e-9


@dataclass(frozen=True)
class HPAState:
    """Nothing: the controller's ``recommendations`` and scale events are the behaviour's
    (:class:`autoscaler.decision.scaledown.ScaleDownState`)."""


class HPAPolicy:
    """Kubernetes HPA v2 with default behavior on average in-flight requests per ready replica.

    ``target_utilization`` defaults to 0.7 of a replica's ``concurrency``: an HPA on a custom Pods metric
    has no built-in target (the user writes ``averageValue``); 0.7 is the common choice (Knative's 70 %,
    SageMaker's target-tracking examples) and makes HPA and KPA comparable.
    """

    name = "hpa"
    instant_start = False
    uses_forecast = False  # reacts to observed (or, for the oracle, true) load only
    learns = False
    behavior: ScalingBehavior

    def __init__(
        self,
        target_utilization: float = 0.7,
        tolerance: float = 0.1,
        sync_period_s: float = 15.0,
        scale_down_stabilization_s: float = 300.0,
        scale_up_stabilization_s: float = 0.0,
        scale_up_percent: float = 100.0,
        scale_up_pods: int = 4,
        scale_up_period_s: float = 15.0,
        scale_down_percent: float = 100.0,
        scale_down_period_s: float = 15.0,
    ) -> None:
        if not target_utilization > 0:
            raise ValueError("target_utilization must be > 0")
        if tolerance < 0:
            raise ValueError("tolerance must be >= 0")
        if not sync_period_s > 0:
            raise ValueError("sync_period_s must be > 0")
        if min(scale_down_stabilization_s, scale_up_stabilization_s) < 0:
            raise ValueError("stabilization windows must be >= 0")
        if scale_up_percent < 0 or scale_up_pods < 0 or not 0 <= scale_down_percent <= 100:
            raise ValueError("scale_up_percent/scale_up_pods must be >= 0, scale_down_percent in [0, 100]")
        if not (scale_up_period_s > 0 and scale_down_period_s > 0):
            raise ValueError("policy periods must be > 0")
        self.target_utilization = target_utilization
        self.tolerance = tolerance
        self.sync_period_s = sync_period_s
        self.scale_down_stabilization_s = scale_down_stabilization_s
        self.scale_up_stabilization_s = scale_up_stabilization_s
        self.scale_up_percent = scale_up_percent
        self.scale_up_pods = scale_up_pods
        self.scale_up_period_s = scale_up_period_s
        self.scale_down_percent = scale_down_percent
        self.scale_down_period_s = scale_down_period_s
        self.tick_s = sync_period_s
        # selectPolicy Max over the percent and pods policies; the controller clamps to min/max within them.
        self.behavior = ScalingBehavior(
            stabilization_s=scale_down_stabilization_s,
            down_limits=(RateLimit("percent", scale_down_percent, scale_down_period_s),),
            up_stabilization_s=scale_up_stabilization_s,
            up_limits=(RateLimit("percent", scale_up_percent, scale_up_period_s),
                       RateLimit("pods", scale_up_pods, scale_up_period_s)),
            bounds_in_limits=True,
        )

    def initial_state(self, spec: ModelSpec, replicas: int) -> HPAState:
        return HPAState()

    # -- replica_calculator.go -------------------------------------------------------------------

    def _metric_replicas(
        self, total_in_flight: float, current: int, ready: int, target: float
    ) -> tuple[int, str]:
        """The unstabilized recommendation and why (``calcPlainMetricReplicas``)."""
        if current == 0:
            if total_in_flight <= 0:
                return 0, "no load at zero replicas"
            return math.ceil(total_in_flight / target - _EPS), "scale from zero"
        if ready == 0:
            return current, "no ready replica reports the metric"
        ratio = (total_in_flight / ready) / target
        unready = max(0, current - ready)
        if unready > 0 and ratio > 1.0:
            # Scale-up with unready pods: they count as 0 usage, so a burst that starting pods will
            # absorb does not trigger a second wave of pods.
            new_ratio = total_in_flight / (current * target)
            if abs(new_ratio - 1.0) <= self.tolerance or new_ratio < 1.0:
                return current, f"within tolerance counting {unready} unready at 0 (ratio {new_ratio:.2f})"
            wanted = math.ceil(new_ratio * current - _EPS)
            return max(wanted, current), f"ratio {new_ratio:.2f} counting {unready} unready at 0"
        if abs(ratio - 1.0) <= self.tolerance:
            return current, f"within tolerance (ratio {ratio:.2f})"
        return math.ceil(ratio * ready - _EPS), f"ratio {ratio:.2f}"

    def decide(self, ctx: PolicyContext) -> PolicyResult:
        state: HPAState = ctx.state if isinstance(ctx.state, HPAState) else HPAState()
        current = ctx.current_replicas
        total = window_mean(ctx.metrics.in_flight, ctx.metrics_step_s, self.sync_period_s)
        if total is None:
            # Like a failed metric fetch: the HPA records nothing and keeps the scale.
            return PolicyResult(current, state, Reason.METRICS_STALE, "no in-flight samples in the window",
                                holds=True)
        target = ctx.spec.concurrency * self.target_utilization
        raw, why = self._metric_replicas(total, current, ctx.ready_replicas, target)
        detail = f"in-flight {total:.2f}, target {target:.2f}/replica: {why}; recommend {raw}"
        # (the reason when the count moves; a count the behaviour holds is ``stable``)
        return PolicyResult(raw, state, Reason.REACTIVE, detail)
