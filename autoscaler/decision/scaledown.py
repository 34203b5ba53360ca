"""Scale-down in one place: how every policy's recommendation becomes a scale, and which replicas go.

Every policy's result passes through :func:`normalize`, once per decision (``decide`` calls it), the way HPA's
``normalizeDesiredReplicasWithBehaviors`` wraps its metric recommendation and Ray Serve's rails wrap every policy:

1. **rails**: stale or missing metrics hold the current count (never scale down on missing data; the hold enters
   the down-stabilization window as the current count, as a partial hold does); a partially
   observed window (:meth:`~autoscaler.api.snapshot.ModelMetrics.partial_reason`: a scrape target down, no
   request rate for the newest step) never scales down either -- what is missing reads as low load, and the
   replicas whose scrapes time out are the overloaded ones -- but may scale up on what it does show (HPA counts a
   missing pod as busy for a scale-down and as idle for a scale-up: this is at least as careful); such a hold
   enters the down-stabilization window as the current count, so that a scale-down after the data is whole again
   still waits a whole window; while the engines report their KV cache at or above ``CoreConfig.kv_saturation``
   nothing scales down either, and a growing queue adds one replica at a time (:func:`_kv_rail`; not for a fixed
   count or the oracle); the spec's min/max replicas bound the result (reason ``bounds`` when they change
   it, unless the behaviour counts them among its rate limits, as HPA's controller does);
2. **stabilization**, as the policy declares it (:class:`~autoscaler.policies.base.ScalingBehavior`): down only
   to the highest recommendation of the window (with ``warm_up``, a window not yet seen whole holds the current
   count), up only to the lowest of the up window;
3. **limits** on a scale-down: the N-1 floor the policy computed (:class:`~autoscaler.policies.base.NMinus1`:
   the check needs the capacity model, the policy's), a step per decision, rate limits per period (HPA's
   percent/pods policies, which count the changes of both directions, hence the up limits here too);
4. **which replicas go** (:func:`choose_removals`, :func:`removals`): those that serve nothing yet first,
   newest first, then the newest ready ones; with consolidation, on the nodes holding the fewest replicas
   first, so that nodes empty whole and can be lent.

The drain is the executor's: a :class:`~autoscaler.api.plan.RemoveReplica` stops routing at once; the simulator
keeps the slot for the replica's in-flight work (at most ``SimConfig.drain_timeout_s``), Kubernetes for the
pod's ``terminationGracePeriodSeconds``.

A policy without a behaviour (``behavior = None``: static, oracle, KPA, predictive) is its own decider: its
recommendation is the scale, within the rails, with the reason it gave. What this module remembers between
decisions (the windows, the scale events) is the model's :class:`ScaleDownState`, kept in ``ModelState``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from autoscaler.api.plan import Reason, RemoveReplica
from autoscaler.api.snapshot import ClusterSnapshot, ModelObservation, Replica
from autoscaler.api.spec import ModelSpec
from autoscaler.policies.base import Policy, PolicyContext, PolicyResult, RateLimit, ScalingBehavior
from sharing.lending import LENT_MODEL

_EPS = 1e-9
DEFAULT_KV_SATURATION = 0.9  # CoreConfig.kv_saturation's default: vLLM's KV cache 90 % used (docs/metrics.md)

Window = tuple[tuple[float, int], ...]


@dataclass  # (never mutated; not frozen: one per model and tick, and a frozen __init__ costs 4x)
class ScaleDownState:
    """What a model's behaviour remembers between decisions."""

    started_at: float | None = None  # the first decision (``warm_up``: the window is seen whole from then on)
    # (time, recommendation) of the down window as a monotone queue (times increasing, counts strictly
    # decreasing): its maximum is the first entry, O(1) per tick instead of a scan of the window.
    highs: Window = ()
    lows: Window = ()  # the up window, counts strictly increasing: its minimum first (only with up stabilization)
    events: Window = ()  # (time, replica change) of the scales made, for the rate limits (only with limits)


@dataclass  # (never mutated; not frozen: one per model and tick, and a frozen __init__ costs 4x)
class Scaled:
    """A policy's decision after its behaviour and the rails: the count, why, and the states to keep."""

    desired: int
    reason: Reason
    detail: str
    state: Any  # the policy's own state
    scale_down: ScaleDownState
    arrival_scv: float | None = None  # as the policy reported it (None: not measured, or the policy was not asked)


def normalize(policy: Policy, ctx: PolicyContext, window: ScaleDownState | None = None,
              kv_saturation: float | None = DEFAULT_KV_SATURATION) -> Scaled:
    """Run ``policy`` on ``ctx`` and turn its recommendation into this decision's count (see the module
    docstring). ``window``: the model's state from its previous decision (None: its first). ``kv_saturation``:
    ``CoreConfig.kv_saturation``, the KV-cache fraction at which the engines count as saturated (None: no KV rail)."""
    window = window if window is not None else ScaleDownState()
    spec, current = ctx.spec, ctx.current_replicas
    if ctx.metrics.stale:
        # (the hold enters the down window as the current count, as a partial hold does: a scale-down once the data
        # is fresh again waits a whole window of it)
        held = min(max(current, spec.min_replicas), spec.max_replicas)
        return Scaled(held, Reason.METRICS_STALE, "holding replicas", ctx.state,
                      _hold_in_window(policy.behavior, window, ctx.now, current))
    gap = ctx.metrics.partial_reason()
    result = policy.decide(ctx)
    behavior = policy.behavior
    if gap is not None and (result.holds or result.desired <= current):
        # Only a scale-up may come of a partial window; the policy's state is not advanced on it.
        held = min(max(current, spec.min_replicas), spec.max_replicas)
        return Scaled(held, Reason.METRICS_PARTIAL, f"holding replicas: {gap}", ctx.state,
                      _hold_in_window(behavior, window, ctx.now, current))
    if behavior is None or result.holds:
        desired, reason, detail = result.desired, result.reason, result.detail
    else:
        desired, reason, detail, window = _behave(behavior, result, ctx, window)
    bounded = _bounded(desired, spec)
    if bounded != desired:
        reason, detail = Reason.BOUNDS, f"wanted {desired}"
    if gap is not None:
        # (a scale-up the policy asked for on what is observed; never below the held count, whatever the behaviour)
        bounded = max(bounded, min(max(current, spec.min_replicas), spec.max_replicas))
        detail = f"{detail}; metrics partial: {gap}"
    if kv_saturation is not None and result.reason not in _FIXED_COUNT:
        bounded, reason, detail, window = _kv_rail(ctx, kv_saturation, policy, bounded, reason, detail, window)
    if behavior is not None and not result.holds and (behavior.up_limits or behavior.down_limits):
        window = _record(window, behavior, ctx.now, bounded - current)
    return Scaled(bounded, reason, detail, result.state, window, result.arrival_scv)


# Policies whose count is not sized on load: a fixed count, and the clairvoyant bound (rails would make it no bound).
_FIXED_COUNT = frozenset({Reason.STATIC, Reason.ORACLE})


def _kv_rail(ctx: PolicyContext, threshold: float, policy: Policy, bounded: int, reason: Reason, detail: str,
             window: ScaleDownState) -> tuple[int, Reason, str, ScaleDownState]:
    """KV-cache saturation as a signal beside the policy's (llm-d's variant autoscaler: up if any analyzer wants,
    down only if all agree). While the engines report KV-cache use at or above ``threshold``:

    - no scale-down: a full cache means requests wait for KV blocks or are preempted and recomputed, whatever the
      request counts say (they lag: the queue is what fills first). The hold enters the down window as the current
      count, like a partial hold, so that a scale-down after the cache drains still waits a whole window;
    - one replica more when the queue also grows and every replica is ready, if the policy asks for no more: a load
      signal the policy may not see (a rate-based policy sees steady throughput while requests pile up). One at a
      time, and only once the last one serves, so a cold start is never stacked on: the next +1 comes when the new
      replica is ready and the cache is still full. The +1 enters the down window too (no flap back on the next dip).

    NaN (no KV gauge) fails every comparison: no effect."""
    kv = ctx.metrics.kv_cache_usage
    if not kv >= threshold:
        return bounded, reason, detail, window
    spec, current = ctx.spec, ctx.current_replicas
    held = _bounded(current, spec)
    what = f"KV cache {kv:.0%} >= {threshold:.0%}"
    behavior = policy.behavior
    if bounded < held:
        return (held, Reason.KV_SATURATED, f"holding replicas: {what}, the engines are saturated (wanted {bounded})",
                _hold_in_window(behavior, window, ctx.now, held))
    if (bounded == current < spec.max_replicas and 0 < current <= ctx.ready_replicas
            and _queue_grows(ctx, policy.tick_s)):
        return (current + 1, Reason.KV_SATURATED, f"{what} and the queue grows: one more replica",
                _hold_in_window(behavior, window, ctx.now, current + 1))
    return bounded, reason, detail, window


def _queue_grows(ctx: PolicyContext, tick_s: float) -> bool:
    """Requests are queued and more are in the system now than a decision ago (in-flight is running + queued; with
    the KV cache full the running part is pinned, so its growth is the queue's)."""
    m = ctx.metrics
    if not m.queue_depth > 0:
        return False
    back = max(1, round(tick_s / ctx.metrics_step_s)) if ctx.metrics_step_s > 0 else 1
    f = m.in_flight
    if f.size <= back:
        return False
    now, before = float(f[-1]), float(f[-1 - back])
    return math.isfinite(now) and math.isfinite(before) and now > before


def _hold_in_window(b: ScalingBehavior | None, w: ScaleDownState, now: float, current: int) -> ScaleDownState:
    """The down-stabilization window after a partial hold: the current count recorded as this decision's
    recommendation (HPA's "a pod without metrics is busy" for a scale-down), so the window's highest stays at
    least the current count for a whole window after the data is whole again."""
    if b is None or b.stabilization_s <= 0:
        return w
    started = w.started_at if w.started_at is not None else now
    highs = _push(w.highs, now, current, now - b.stabilization_s, higher=True)
    return ScaleDownState(started_at=started, highs=highs, lows=w.lows, events=w.events)


def _bounded(desired: int, spec: ModelSpec) -> int:
    return min(max(desired, spec.min_replicas), spec.max_replicas)


def _behave(
    b: ScalingBehavior, result: PolicyResult, ctx: PolicyContext, w: ScaleDownState
) -> tuple[int, Reason, str, ScaleDownState]:
    """Stabilization and limits: (count, reason, detail, new state); the count before the rails' bounds, unless
    the behaviour has them among its limits."""
    now, current, spec = ctx.now, ctx.current_replicas, ctx.spec
    raw = result.desired
    started = w.started_at if w.started_at is not None else now
    highs = _push(w.highs, now, raw, now - b.stabilization_s, higher=True)
    high = highs[0][1]
    if b.warm_up and now - started < b.stabilization_s:
        high = max(high, current)  # a window not yet seen counts as "current"
    if b.up_stabilization_s > 0:
        lows = _push(w.lows, now, raw, now - b.up_stabilization_s, higher=False)
        low = lows[0][1]
    else:
        lows, low = (), raw
    # The lowest of the up window and the highest of the down window bound the move away from the current count.
    stabilized = min(max(current, low), high)
    new_state = ScaleDownState(started_at=started, highs=highs, lows=lows, events=w.events)

    detail = result.detail
    if stabilized != raw:
        held = "scale-down" if raw < current else "scale-up"
        detail += f"; held by the {held} window" if stabilized == current else \
            f"; the stabilization window holds {stabilized}"
    desired = stabilized
    if stabilized > current and b.up_limits:
        cap = _up_limit(current, w.events, now, b.up_limits)
        if b.bounds_in_limits:
            cap = min(cap, spec.max_replicas)
        if desired > cap:
            desired, detail = cap, f"{detail}; scale-up limited to {cap} (wanted {stabilized})"
    elif stabilized < current:
        n1 = result.n_minus_1 if b.n_minus_1 else None
        # (the floor read once, past NMinus1.replicas' cached_property: its lock costs as much as a memo hit)
        floor = None if n1 is None else n1.floor() if callable(n1.floor) else n1.floor
        if n1 is not None and floor is not None and floor >= current:  # (n1: for its test's name)
            # N-1 check: the smaller count must still pass the policy's stricter scale-down test.
            return current, Reason.N_MINUS_1, f"{detail}; {current - 1} would miss {n1.test}", new_state
        if floor is not None:
            desired = max(desired, floor)
        if b.step_fraction is not None:
            desired = max(desired, current - max(1, math.floor(current * b.step_fraction)))
        if b.down_limits:
            limit = _down_limit(current, w.events, now, b.down_limits)
            if b.bounds_in_limits:
                limit = max(limit, spec.min_replicas)
            if desired < limit:
                desired, detail = limit, f"{detail}; scale-down limited to {limit} (wanted {stabilized})"
    if b.bounds_in_limits:
        desired = _bounded(desired, spec)
    if desired == current:
        # A standing condition keeps its name (the knee of an unattainable SLO is held, not "stable"); a count the
        # window holds against the policy's wish says so.
        if result.reason is Reason.SLO_UNATTAINABLE:
            return desired, result.reason, detail, new_state
        return desired, Reason.STABLE if raw == current else Reason.STABILIZING, detail, new_state
    if desired < current:
        detail += f"; down to {desired}"
    return desired, result.reason, detail, new_state


def _push(queue: Window, now: float, value: int, cutoff: float, higher: bool) -> Window:
    """``queue`` (a monotone queue of the window) with ``value`` at ``now`` added and what is at or before
    ``cutoff`` dropped; the newest entry stays (a zero window is "now")."""
    if higher:
        while queue and queue[-1][1] <= value:
            queue = queue[:-1]
    else:
        while queue and queue[-1][1] >= value:
            queue = queue[:-1]
    queue = (*queue, (now, value))
    while len(queue) > 1 and queue[0][0] <= cutoff:
        queue = queue[1:]
    return queue


def _period_start(current: int, events: Window, now: float, period_s: float) -> int:
    """The count at the start of the last ``period_s``: ``current`` less the changes made strictly inside it."""
    cutoff = now - period_s
    added = sum(c for t, c in events if t > cutoff and c > 0)
    deleted = sum(-c for t, c in events if t > cutoff and c < 0)
    return current - added + deleted


def _up_limit(current: int, events: Window, now: float, limits: tuple[RateLimit, ...]) -> int:
    """The highest count the up limits allow (selectPolicy Max: the policy allowing the largest change wins)."""
    out = current
    for lim in limits:
        start = _period_start(current, events, now, lim.period_s)
        if lim.kind == "percent":
            # Rounded up so that a small fleet always grows (as the controller does).
            out = max(out, math.ceil(start * (1 + lim.value / 100) - _EPS))
        else:
            out = max(out, start + int(lim.value))
    return out


def _down_limit(current: int, events: Window, now: float, limits: tuple[RateLimit, ...]) -> int:
    """The lowest count the down limits allow (selectPolicy Max: the policy allowing the largest change wins)."""
    out = current
    for lim in limits:
        start = _period_start(current, events, now, lim.period_s)
        if lim.kind == "percent":
            # int32(float) truncation in the controller: floor for non-negative values.
            out = min(out, math.floor(start * (1 - lim.value / 100) + _EPS))
        else:
            out = min(out, start - int(lim.value))
    return out


def _record(w: ScaleDownState, b: ScalingBehavior, now: float, change: int) -> ScaleDownState:
    """The scale events the rate limits count: those within their longest period, and this one."""
    horizon = max(lim.period_s for lim in (*b.up_limits, *b.down_limits))
    events = tuple((t, c) for t, c in w.events if t > now - horizon)
    if change:
        events = (*events, (now, change))
    return ScaleDownState(started_at=w.started_at, highs=w.highs, lows=w.lows, events=events)


# -- which replicas go ---------------------------------------------------------------------------------------


def choose_removals(obs: ModelObservation, count: int, per_node: dict[str, int] | None = None) -> list[str]:
    """Remove replicas that serve nothing yet first (still starting), newest first, then the newest ready.

    With ``per_node`` (allocations per node, ``CoreConfig.consolidate_removals``): among those that serve (or among
    those that do not), the replicas on the nodes with the fewest allocations first, so that a node empties and
    can be lent whole.

    A model whose workload removes its highest-index replicas itself (``obs.removal_by_index``: a StatefulSet its
    highest ordinals, a LeaderWorkerSet its highest group indices) loses those whatever slotwise names, Ready or
    not: the replicas named are the highest indices, so that the capacity the decision counts on is what stays.
    The index is the replica id's (``"<ns>/<pod>"``: ``<name>-<ordinal>``, a group's leader ``<lws>-<index>``);
    an id without one goes last."""
    live = [r for r in obs.replicas if not r.draining]
    if obs.removal_by_index:
        live.sort(key=lambda r: _by_index(r.replica_id))
    elif per_node is None:
        live.sort(key=lambda r: (r.ready, -r.started_at))
    else:
        live.sort(key=lambda r: (r.ready, _node_load_of(r, per_node), -r.started_at))
    return [r.replica_id for r in live[:count]]


def replica_index(replica_id: str) -> int | None:
    """A replica's index in a workload that removes by index: a StatefulSet pod's ordinal, a LeaderWorkerSet
    leader's group index -- the number after the last ``-`` of the pod name (``"<ns>/<pod>"``); None without one."""
    _, _, index = replica_id.rpartition("/")[2].rpartition("-")
    return int(index) if index.isascii() and index.isdigit() else None


def _by_index(replica_id: str) -> tuple[bool, int, str]:
    """Sort key: the highest index first, ids without one last."""
    index = replica_index(replica_id)
    return (index is None, -(index or 0), replica_id)


def _node_load_of(r: Replica, per_node: dict[str, int]) -> int:
    """The allocations on the replica's node; a replica that is a group of pods (it frees all its pods' slots):
    its least used node's, the one its removal is likeliest to empty."""
    if r.slot is None:
        return 0
    load = per_node.get(r.slot.node, 0)
    for s in r.group_slots:
        load = min(load, per_node.get(s.node, 0))
    return load


def node_load(snapshot: ClusterSnapshot) -> dict[str, int]:
    """Allocations per node in the snapshot's inventory (lent GPUs aside)."""
    out: dict[str, int] = {}
    inv = snapshot.inventory
    for owner, s in inv.allocations():
        if inv.model_of(owner) != LENT_MODEL:
            out[s.node] = out.get(s.node, 0) + 1
    return out


def removals(obs: ModelObservation, count: int, per_node: dict[str, int] | None = None) -> list[RemoveReplica]:
    """The :class:`RemoveReplica` actions taking ``count`` replicas of ``obs`` down (see :func:`choose_removals`). A
    replica that is a group of pods goes whole: the executor drains every pod, and the decision counts all its
    pods' slots as being freed."""
    return [RemoveReplica(obs.name, rid) for rid in choose_removals(obs, count, per_node)]
