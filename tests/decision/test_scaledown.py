"""Scale-down's one home (autoscaler/decision/scaledown.py): the rails, stabilization, the N-1 floor, step and rate
limits applied to any policy's recommendation, and which replicas a scale-down removes.

The behaviour is driven by a scripted policy (``Scripted``: it recommends what it is told, with the behaviour it is
given), so the properties hold for every policy that declares one; HPA's and slotwise's own numbers are tested
with those policies in tests/policies/.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from autoscaler.api.plan import Plan, PreemptionReason, Reason, RemoveReplica
from autoscaler.api.snapshot import ModelMetrics, ModelObservation, Replica
from autoscaler.api.spec import ModelSpec
from autoscaler.decision.scaledown import ScaleDownState, choose_removals, normalize, removals
from autoscaler.estimation.capacity import profile_from_spec
from autoscaler.policies import HPAPolicy
from autoscaler.policies.base import NMinus1, PolicyContext, PolicyResult, RateLimit, ScalingBehavior
from sharing.catalog import load_catalog
from sharing.slots import Slot

SPEC = ModelSpec(name="m", min_replicas=1, max_replicas=40)
FRESH = ModelMetrics(rate=np.full(6, 1.0), in_flight=np.full(6, 0.1))
STALE = ModelMetrics(rate=np.zeros(0), in_flight=np.zeros(0), stale=True)
SLOTWISE_LIKE = ScalingBehavior(stabilization_s=120.0, warm_up=True, step_fraction=0.5, n_minus_1=True)
HPA_LIKE = HPAPolicy().behavior


@dataclass
class Scripted:
    """Recommends ``wants`` (with the N-1 floor ``floor`` when given), under ``behavior``."""

    behavior: ScalingBehavior | None
    wants: int = 0
    floor: int | None = None
    reason: Reason = Reason.FORECAST
    name: str = "scripted"
    tick_s: float = 10.0
    instant_start: bool = False
    uses_forecast: bool = False
    learns: bool = False
    calls: list[float] = field(default_factory=list)

    def initial_state(self, spec: ModelSpec, replicas: int) -> None:
        return None

    def decide(self, ctx: PolicyContext) -> PolicyResult:
        self.calls.append(ctx.now)
        n1 = None if self.floor is None else NMinus1(self.floor, "the test's SLO")
        return PolicyResult(self.wants, None, self.reason, "scripted", n_minus_1=n1, arrival_scv=2.0)


def ctx(current: int, now: float = 1000.0, metrics: ModelMetrics = FRESH, spec: ModelSpec = SPEC) -> PolicyContext:
    return PolicyContext(now=now, spec=spec, current_replicas=current, ready_replicas=current, metrics=metrics,
                         metrics_step_s=10.0, forecast=None, capacity=profile_from_spec(spec), state=None)


SETTLED = ScaleDownState(started_at=0.0)


# -- the rails ----------------------------------------------------------------------------------------------


@settings(max_examples=100, deadline=None)
@given(current=st.integers(0, 60), wants=st.integers(0, 60), hpa=st.booleans())
def test_stale_data_never_scales_down_and_never_asks_the_policy(current: int, wants: int, hpa: bool) -> None:
    p = Scripted(HPA_LIKE if hpa else SLOTWISE_LIKE, wants=wants)
    res = normalize(p, ctx(current, metrics=STALE), SETTLED)
    assert res.reason is Reason.METRICS_STALE and not p.calls
    assert res.desired == min(max(current, SPEC.min_replicas), SPEC.max_replicas)
    assert res.arrival_scv is None
    # the hold enters the down window as the current count (a scale-down on fresh data waits a whole window)
    assert max(c for _, c in res.scale_down.highs) == current
    assert res.scale_down.lows == SETTLED.lows and res.scale_down.events == SETTLED.events


@settings(max_examples=100, deadline=None)
@given(current=st.integers(0, 60), wants=st.integers(0, 80), which=st.sampled_from(["none", "slotwise", "hpa"]))
def test_always_within_the_spec_bounds(current: int, wants: int, which: str) -> None:
    behavior = {"none": None, "slotwise": SLOTWISE_LIKE, "hpa": HPA_LIKE}[which]
    res = normalize(Scripted(behavior, wants=wants), ctx(current), SETTLED)
    assert SPEC.min_replicas <= res.desired <= SPEC.max_replicas


def test_without_a_behaviour_the_recommendation_is_the_scale() -> None:
    res = normalize(Scripted(None, wants=3, reason=Reason.STATIC), ctx(10))
    assert (res.desired, res.reason, res.detail) == (3, Reason.STATIC, "scripted")
    assert res.arrival_scv == 2.0  # what the policy measured, for the lend stage
    res = normalize(Scripted(None, wants=99), ctx(10))
    assert (res.desired, res.reason, res.detail) == (SPEC.max_replicas, Reason.BOUNDS, "wanted 99")


def test_bounds_inside_the_limits_are_not_reported_as_bounds() -> None:
    res = normalize(Scripted(HPA_LIKE, wants=99, reason=Reason.REACTIVE), ctx(30))
    assert (res.desired, res.reason) == (SPEC.max_replicas, Reason.REACTIVE)
    res = normalize(Scripted(SLOTWISE_LIKE, wants=99), ctx(30))
    assert (res.desired, res.reason) == (SPEC.max_replicas, Reason.BOUNDS)


def test_a_policy_without_samples_holds_and_records_nothing() -> None:
    class NoData(Scripted):
        def decide(self, ctx: PolicyContext) -> PolicyResult:
            return PolicyResult(ctx.current_replicas, None, Reason.METRICS_STALE, "no samples", holds=True)

    res = normalize(NoData(HPA_LIKE), ctx(5), SETTLED)
    assert (res.desired, res.reason, res.scale_down) == (5, Reason.METRICS_STALE, SETTLED)


# -- stabilization ------------------------------------------------------------------------------------------


def test_scale_up_is_at_once_and_holding_is_stable() -> None:
    res = normalize(Scripted(SLOTWISE_LIKE, wants=9, reason=Reason.PANIC), ctx(4), SETTLED)
    assert (res.desired, res.reason) == (9, Reason.PANIC)
    res = normalize(Scripted(SLOTWISE_LIKE, wants=4), ctx(4), SETTLED)
    assert (res.desired, res.reason) == (4, Reason.STABLE)


def test_warm_up_a_window_not_yet_seen_holds_the_current_count() -> None:
    p = Scripted(SLOTWISE_LIKE, wants=2)
    res = normalize(p, ctx(8, now=0.0))
    assert (res.desired, res.reason) == (8, Reason.STABILIZING) and res.scale_down.started_at == 0.0
    res = normalize(p, ctx(8, now=110.0), res.scale_down)
    assert res.desired == 8  # 110 s of a 120 s window seen
    res = normalize(p, ctx(8, now=120.0), res.scale_down)
    assert res.desired == 4  # seen whole: down, by half at most
    # Without warm_up (HPA) the first decision may scale down at once.
    res = normalize(Scripted(HPA_LIKE, wants=2), ctx(8, now=0.0))
    assert res.desired == 2


@settings(max_examples=80, deadline=None)
@given(st.lists(st.integers(0, 40), min_size=1, max_size=30), st.integers(1, 40))
def test_never_below_the_highest_recommendation_of_the_window(recs: list[int], current: int) -> None:
    # A fixed count (the executor lags), recommendations every 10 s: the count never drops below what any
    # recommendation of the last 120 s asked for (nor goes up by stabilization).
    window = SETTLED
    b = ScalingBehavior(stabilization_s=120.0)
    for i, want in enumerate(recs):
        now = 1000.0 + 10.0 * i
        res = normalize(Scripted(b, wants=want), ctx(current, now=now), window)
        window = res.scale_down
        in_window = [r for j, r in enumerate(recs[: i + 1]) if 1000.0 + 10.0 * j > now - 120.0 or j == i]
        if want < current:
            assert res.desired == max(min(current, max(in_window)), SPEC.min_replicas)
        else:
            assert res.desired == min(want, SPEC.max_replicas)


# -- the N-1 floor and the step limit ------------------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(current=st.integers(1, 40), wants=st.integers(0, 40), floor=st.integers(0, 45),
       fraction=st.floats(0.01, 1.0))
def test_a_scale_down_never_goes_below_the_n_minus_1_floor_nor_past_the_step(
    current: int, wants: int, floor: int, fraction: float
) -> None:
    b = ScalingBehavior(stabilization_s=0.0, step_fraction=fraction, n_minus_1=True)
    res = normalize(Scripted(b, wants=wants, floor=floor), ctx(current), SETTLED)
    if wants >= current:
        return
    if floor >= current:
        assert (res.desired, res.reason) == (current, Reason.N_MINUS_1)
        assert f"{current - 1} would miss the test's SLO" in res.detail
        return
    step = max(1, math.floor(current * fraction))
    assert res.desired >= max(floor, current - step, SPEC.min_replicas)
    assert res.desired == max(wants, floor, current - step, SPEC.min_replicas)
    assert res.desired < current or current == SPEC.min_replicas


def test_the_n_minus_1_floor_applies_only_when_declared() -> None:
    b = ScalingBehavior(stabilization_s=0.0)
    res = normalize(Scripted(b, wants=2, floor=9), ctx(10), SETTLED)
    assert res.desired == 2


# -- rate limits (HPA's percent / pods policies) -------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 40), min_size=2, max_size=30), st.integers(1, 30))
def test_rate_limits_bound_every_period(recs: list[int], start: int) -> None:
    # Up at most +100 % or +4 pods, down at most 50 %, per 30 s, counted from the count at the period's start.
    b = ScalingBehavior(up_limits=(RateLimit("percent", 100.0, 30.0), RateLimit("pods", 4, 30.0)),
                        down_limits=(RateLimit("percent", 50.0, 30.0),), bounds_in_limits=True)
    window, current, history = SETTLED, start, [(0.0, start)]
    for i, want in enumerate(recs):
        now = 10.0 * (i + 1)
        res = normalize(Scripted(b, wants=want, reason=Reason.REACTIVE), ctx(current, now=now), window)
        before, window, current = current, res.scale_down, res.desired
        history.append((now, current))
        # A move is bounded by the count at the start of the last 30 s (the latest at or before now - 30).
        ref = [c for t, c in history if t <= now - 30.0][-1] if now >= 30.0 else start
        if current > before:
            assert current <= max(2 * ref, ref + 4, SPEC.min_replicas)
        if current < before:
            assert current >= max(math.floor(ref * 0.5 + 1e-9), SPEC.min_replicas)
    horizon = 30.0
    assert all(t > recs.__len__() * 10.0 - horizon for t, _ in window.events)


def test_hpa_scale_down_limit_counts_the_changes_of_the_period() -> None:
    b = ScalingBehavior(down_limits=(RateLimit("pods", 2, 60.0),))
    p = Scripted(b, wants=0)
    r1 = normalize(p, ctx(10, now=0.0), SETTLED)
    assert r1.desired == 8 and r1.scale_down.events == ((0.0, -2),)
    r2 = normalize(p, ctx(8, now=30.0), r1.scale_down)
    assert (r2.desired, r2.reason) == (8, Reason.STABILIZING) and "scale-down limited to 8" in r2.detail
    r3 = normalize(p, ctx(8, now=61.0), r2.scale_down)
    assert r3.desired == 6


# -- which replicas go ---------------------------------------------------------------------------------------


H100 = load_catalog().get("H100-80GB")


def _rep(i: int, ready: bool, started: float, node: str = "n0", draining: bool = False) -> Replica:
    return Replica(f"m-{i}", Slot.whole(node, i, H100), ready=ready, started_at=started, draining=draining)


def test_removals_take_the_starting_first_then_the_newest_ready_never_a_draining_one() -> None:
    reps = (_rep(0, True, 0.0), _rep(1, True, 50.0), _rep(2, False, 70.0), _rep(3, True, 90.0, draining=True),
            _rep(4, False, 60.0))
    obs = ModelObservation("m", SPEC, 4, reps)
    assert choose_removals(obs, 3) == ["m-2", "m-4", "m-1"]
    acts = removals(obs, 2)
    assert acts == [RemoveReplica("m", "m-2"), RemoveReplica("m", "m-4")]
    assert all(a.reason is None and not a.preempted_by for a in acts)


def test_consolidation_removes_from_the_least_loaded_node_first() -> None:
    reps = (_rep(0, True, 0.0, "a"), _rep(1, True, 10.0, "b"), _rep(2, True, 20.0, "a"))
    obs = ModelObservation("m", SPEC, 3, reps)
    assert choose_removals(obs, 1) == ["m-2"]  # the newest
    assert choose_removals(obs, 1, {"a": 5, "b": 1}) == ["m-1"]  # the one on the emptier node


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.floats(0.0, 1e4), st.booleans()), max_size=12), st.integers(0, 14))
def test_removals_are_distinct_live_replicas(spec: list[tuple[bool, float, bool]], count: int) -> None:
    reps = tuple(_rep(i, ready, started, draining=draining) for i, (ready, started, draining) in enumerate(spec))
    obs = ModelObservation("m", SPEC, len(reps), reps)
    chosen = choose_removals(obs, count)
    live = {r.replica_id for r in reps if not r.draining}
    assert len(chosen) == len(set(chosen)) == min(count, len(live)) and set(chosen) <= live


def test_the_plan_carries_no_drain_timeout() -> None:
    plan = Plan(0.0, [RemoveReplica("m", "m-1"),
                      RemoveReplica("m", "m-2", preempted_by="x", reason=PreemptionReason.PRIORITY, message="why")])
    assert plan.describe() == ["drain m/m-1", "drain m/m-2 preempted (priority) for x"]
    assert not hasattr(RemoveReplica("m", "m-1"), "drain_s")
