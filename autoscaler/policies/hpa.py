"""Kubernetes HPA v2 on a per-pod in-flight metric, as the real controller computes it.

Follows ``pkg/controller/podautoscaler`` (``replica_calculator.go`` ``calcPlainMetricReplicas`` and
``horizontal.go`` ``normalizeDesiredReplicasWithBehaviors``) with the defaults of
``pkg/apis/autoscaling/v2/defaults.go``:

- desired = ceil(ready × metric / target), unchanged while |metric/target − 1| <= ``tolerance`` (0.1);
- scale-up: no stabilization, limited per ``scale_up_period_s`` (15 s) to the larger of +100 % and +4 pods
  (selectPolicy Max), counted from the replica count at the start of that period;
- scale-down: the highest recommendation of the last ``scale_down_stabilization_s`` (300 s) wins, and at
  most 100 % may go per 15 s.

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
from dataclasses import dataclass, replace

from autoscaler.api.plan import Reason
from autoscaler.api.spec import ModelSpec
from autoscaler.policies.base import PolicyContext, PolicyResult, window_mean

_EPS = 1e-9


@dataclass(frozen=True)
class HPAState:
    # (time, unstabilized recommendation), as the controller's ``recommendations`` list.
    recommendations: tuple[tuple[float, int], ...] = ()
    # (time, replica change) of rescales this policy made, as ``scaleUpEvents``/``scaleDownEvents``.
    scale_events: tuple[tuple[float, int], ...] = ()


class HPAPolicy:
    """Kubernetes HPA v2 with default behavior on average in-flight requests per ready replica.

    ``target_utilization`` defaults to 0.7 of a replica's ``concurrency``: an HPA on a custom Pods metric
    has no built-in target (the user writes ``averageValue``); 0.7 is the common choice (Knative's 70 %,
    SageMaker's target-tracking examples) and makes HPA and KPA comparable.
    """

    name = "hpa"
    instant_start = False
    uses_forecast = False  # reacts to observed (or, for the oracle, true) load only

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

    # -- horizontal.go ---------------------------------------------------------------------------

    def _changed_in_period(
        self, events: tuple[tuple[float, int], ...], now: float, period_s: float
    ) -> tuple[int, int]:
        """(replicas added, replicas deleted) by events strictly inside the last ``period_s``."""
        cutoff = now - period_s
        added = sum(c for t, c in events if t > cutoff and c > 0)
        deleted = sum(-c for t, c in events if t > cutoff and c < 0)
        return added, deleted

    def _scale_up_limit(self, current: int, events: tuple[tuple[float, int], ...], now: float) -> int:
        added, deleted = self._changed_in_period(events, now, self.scale_up_period_s)
        start = current - added + deleted
        # selectPolicy Max: the policy allowing the largest change wins. Percent rounds up so that a
        # small fleet always grows (as the controller does).
        by_percent = math.ceil(start * (1 + self.scale_up_percent / 100) - _EPS)
        by_pods = start + self.scale_up_pods
        return max(by_percent, by_pods, current)

    def _scale_down_limit(self, current: int, events: tuple[tuple[float, int], ...], now: float) -> int:
        added, deleted = self._changed_in_period(events, now, self.scale_down_period_s)
        start = current - added + deleted
        # int32(float) truncation in the controller: floor for non-negative values.
        limit = math.floor(start * (1 - self.scale_down_percent / 100) + _EPS)
        return min(limit, current)

    def decide(self, ctx: PolicyContext) -> PolicyResult:
        state: HPAState = ctx.state if isinstance(ctx.state, HPAState) else HPAState()
        now, spec, current = ctx.now, ctx.spec, ctx.current_replicas
        total = window_mean(ctx.metrics.in_flight, ctx.metrics_step_s, self.sync_period_s)
        if total is None:
            # Like a failed metric fetch: the HPA records nothing and keeps the scale.
            return PolicyResult(current, state, Reason.METRICS_STALE, "no in-flight samples in the window")
        target = spec.concurrency * self.target_utilization
        raw, why = self._metric_replicas(total, current, ctx.ready_replicas, target)

        # Stabilization over recommendations: the lowest of the up window and the highest of the
        # down window bound the move away from the current count.
        up_rec, down_rec = raw, raw
        up_cut, down_cut = now - self.scale_up_stabilization_s, now - self.scale_down_stabilization_s
        for t, r in state.recommendations:
            if t > up_cut:
                up_rec = min(up_rec, r)
            if t > down_cut:
                down_rec = max(down_rec, r)
        stabilized = min(max(current, up_rec), down_rec)
        keep_after = min(up_cut, down_cut)
        recs = (*((t, r) for t, r in state.recommendations if t > keep_after), (now, raw))

        # Behavior rate limits, then the spec's bounds (the controller clamps to min/max here too).
        desired = stabilized
        limited = ""
        if desired > current:
            cap = min(self._scale_up_limit(current, state.scale_events, now), spec.max_replicas)
            if desired > cap:
                desired, limited = cap, f"; scale-up limited to {cap} (wanted {stabilized})"
        elif desired < current:
            floor_ = max(self._scale_down_limit(current, state.scale_events, now), spec.min_replicas)
            if desired < floor_:
                desired, limited = floor_, f"; scale-down limited to {floor_} (wanted {stabilized})"
        desired = min(max(desired, spec.min_replicas), spec.max_replicas)

        horizon = max(self.scale_up_period_s, self.scale_down_period_s)
        events = tuple((t, c) for t, c in state.scale_events if t > now - horizon)
        if desired != current:
            events = (*events, (now, desired - current))
        new_state = replace(state, recommendations=recs, scale_events=events)

        detail = f"in-flight {total:.2f}, target {target:.2f}/replica: {why}; recommend {raw}"
        if stabilized != raw and desired == stabilized:
            detail += f"; stabilization window holds {stabilized}"
        detail += limited
        reason = Reason.STABLE if desired == current else Reason.REACTIVE
        return PolicyResult(desired, new_state, reason, detail)
