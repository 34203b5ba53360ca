"""Behaviour of the baseline policies (static, HPA, KPA, oracle), the rails and the registry.

slotwise's own policy (``SloPolicy``) is tested in tests/policies/test_slo_policy.py. A policy's ``decide`` is
its recommendation; what becomes of it (HPA's stabilization and rate limits, the rails) is
``autoscaler.decision.scaledown.normalize``, which these tests run where the behaviour matters.

Contexts are built by small helpers; ``drive`` plays a load schedule through a policy tick by tick, with
the replicas it asks for becoming ready at once (cold start is the simulator's business, not the policy's).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from itertools import pairwise
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autoscaler.api.plan import Reason
from autoscaler.api.snapshot import ModelMetrics
from autoscaler.api.spec import ModelSpec
from autoscaler.decision.scaledown import ScaleDownState, normalize
from autoscaler.estimation import capacity
from autoscaler.estimation.capacity import ServiceProfile
from autoscaler.policies import (
    POLICIES,
    HPAPolicy,
    KPAPolicy,
    OraclePolicy,
    StaticPolicy,
    make_policy,
)
from autoscaler.policies.base import Forecast, Policy, PolicyContext, PolicyResult, ScalingBehavior

SPEC = ModelSpec(name="m", concurrency=1, service_time_ms=100.0, min_replicas=1, max_replicas=100)
TARGET = 0.7  # in-flight per replica at the default 70 % of concurrency 1
PROFILE = ServiceProfile(
    occupancy_s=np.full(8, 0.1), latency_part_s=np.full(8, 0.1), concurrency=1, slo_s=1.0, percentile=95.0
)


def metrics(
    in_flight: float | list[float] | np.ndarray,
    n: int = 120,
    rate: float | list[float] | np.ndarray = 1.0,
    stale: bool = False,
    future_rate: float | None = None,
) -> ModelMetrics:
    """A window of ``n`` samples; a scalar fills it, a sequence is used as is (oldest first)."""

    def arr(x: float | list[float] | np.ndarray) -> np.ndarray:
        return np.full(n, float(x)) if np.isscalar(x) else np.asarray(x, dtype=float)

    return ModelMetrics(rate=arr(rate), in_flight=arr(in_flight), stale=stale, future_rate=future_rate)


def context(
    policy: Policy,
    m: ModelMetrics,
    current: int,
    ready: int | None = None,
    now: float = 1000.0,
    state: Any = None,
    spec: ModelSpec = SPEC,
    step_s: float = 1.0,
    forecast: Forecast | None = None,
) -> PolicyContext:
    return PolicyContext(
        now=now,
        spec=spec,
        current_replicas=current,
        ready_replicas=current if ready is None else ready,
        metrics=m,
        metrics_step_s=step_s,
        forecast=forecast,
        capacity=PROFILE,
        state=policy.initial_state(spec, current) if state is None else state,
    )


@dataclass
class Tick:
    t: float
    desired: int
    reason: Reason
    ready: int


def drive(
    policy: Policy,
    load: Callable[[float], float],
    t_end: float,
    replicas: int,
    spec: ModelSpec = SPEC,
    t_start: float = 0.0,
    history_s: float = 120.0,
) -> list[Tick]:
    """Call ``policy`` every ``tick_s`` from ``t_start`` with 1 s in-flight samples of ``load(t)``."""
    state = policy.initial_state(spec, replicas)
    window = ScaleDownState()
    ticks: list[Tick] = []
    current = replicas
    t = t_start
    while t <= t_end + 1e-9:
        samples = np.array([load(s) for s in np.arange(t - history_s + 1, t + 1)])
        ctx = context(policy, metrics(samples, n=len(samples)), current, now=t, state=state, spec=spec)
        res = normalize(policy, ctx, window)
        ticks.append(Tick(t, res.desired, res.reason, current))
        state, window, current = res.state, res.scale_down, res.desired
        t += policy.tick_s
    return ticks


@pytest.fixture
def fake_slo(monkeypatch: pytest.MonkeyPatch) -> list[tuple[float, ServiceProfile]]:
    """Replace the capacity model by 10 req/s per replica and record its calls."""
    calls: list[tuple[float, ServiceProfile]] = []

    def fake(rate: float, profile: ServiceProfile, max_replicas: int = 10_000) -> int:
        calls.append((rate, profile))
        return math.ceil(rate / 10.0 - 1e-9)

    monkeypatch.setattr(capacity, "min_replicas_for_slo", fake)
    return calls


# -- static ---------------------------------------------------------------------------------------


def test_static_is_constant_whatever_the_load() -> None:
    p = StaticPolicy(replicas_by_model={"default/m": 7}, replicas=3)
    for load in (0.0, 0.5, 50.0, 500.0):
        res = p.decide(context(p, metrics(load), current=2))
        assert (res.desired, res.reason) == (7, Reason.STATIC)


def test_static_lookup_by_name_then_fallbacks() -> None:
    assert StaticPolicy(replicas_by_model={"m": 4}).replicas_for(SPEC) == 4
    assert StaticPolicy(replicas_by_model={"other": 4}, replicas=2).replicas_for(SPEC) == 2
    assert StaticPolicy().replicas_for(SPEC) == SPEC.max_replicas


# -- HPA ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("ratio", [0.91, 0.95, 1.0, 1.05, 1.09])
def test_hpa_holds_within_tolerance(ratio: float) -> None:
    p = HPAPolicy()
    res = normalize(p, context(p, metrics(10 * TARGET * ratio), current=10))
    assert res.desired == 10
    assert res.reason == Reason.STABLE


@pytest.mark.parametrize(("ratio", "expected"), [(1.12, 12), (1.5, 15), (0.85, 9), (0.5, 5)])
def test_hpa_scales_outside_tolerance(ratio: float, expected: int) -> None:
    p = HPAPolicy()
    res = normalize(p, context(p, metrics(10 * TARGET * ratio), current=10))
    assert res.desired == expected
    assert res.reason == Reason.REACTIVE


def test_hpa_uses_metric_averaged_over_the_sync_period() -> None:
    # An old spike outside the last 15 s does not count; one inside it does.
    p = HPAPolicy()
    old_spike = [100.0] * 100 + [2 * TARGET] * 15
    assert p.decide(context(p, metrics(old_spike, n=115), current=2)).desired == 2
    new_spike = [2 * TARGET] * 100 + [4 * TARGET] * 15
    assert p.decide(context(p, metrics(new_spike, n=115), current=2)).desired == 4


def test_hpa_scale_up_capped_at_max_of_double_or_plus_four_per_period() -> None:
    p = HPAPolicy()
    load = 2 * TARGET * 10  # a 10x spike on 2 pods: raw recommendation 20
    assert p.decide(context(p, metrics(load), current=2, now=0.0)).desired == 20  # the recommendation
    r1 = normalize(p, context(p, metrics(load), current=2, now=0.0))
    assert r1.desired == 6  # max(2 * 2, 2 + 4)
    # Called again inside the same 15 s period, the pods already added count against the limit.
    r_again = normalize(p, context(p, metrics(load), current=6, now=5.0), r1.scale_down)
    assert r_again.desired == 6
    r2 = normalize(p, context(p, metrics(load), current=6, now=15.0), r1.scale_down)
    assert r2.desired == 12  # then doubling: max(12, 10)
    r3 = normalize(p, context(p, metrics(load), current=12, now=30.0), r2.scale_down)
    assert r3.desired == 20  # the recommendation itself


def test_hpa_scale_up_counts_unready_pods_as_idle() -> None:
    p = HPAPolicy()
    # 2 ready pods at 150 % of target, 2 more starting: counted at 0 the ratio is 0.75 -> no change.
    res = p.decide(context(p, metrics(2 * TARGET * 1.5), current=4, ready=2))
    assert res.desired == 4
    # With the starting pods counted at 0 the surge still needs more: 2 ready at 400 % -> ceil(5.6 / 0.7) = 8.
    res = p.decide(context(p, metrics(2 * TARGET * 4), current=4, ready=2))
    assert res.desired == 8


def test_hpa_scale_down_waits_for_the_window_and_takes_its_max() -> None:
    def load(t: float) -> float:
        # Phases aligned to the 15 s syncs, each of which averages the samples in (t - 15, t].
        if t <= 90:
            return 10 * TARGET  # recommendation 10, last at t=90
        if 195 < t <= 210:
            return 5 * TARGET  # the sync at t=210 recommends 5
        return 2 * TARGET  # recommendation 2

    ticks = drive(HPAPolicy(), load, t_end=600.0, replicas=10)
    by_t = {tk.t: tk.desired for tk in ticks}
    # The last "10" recommendation is at t=90: it holds the count until it leaves the 300 s window.
    assert all(by_t[t] == 10 for t in by_t if t < 390)
    assert by_t[390.0] == 5  # the highest recommendation still in the window (t=210)
    assert all(by_t[t] == 5 for t in by_t if 390 <= t < 510)
    assert by_t[510.0] == 2
    held = [tk for tk in ticks if 100 <= tk.t < 390]
    assert all(tk.reason == Reason.STABILIZING for tk in held)


def test_hpa_scales_up_immediately_even_inside_the_down_window() -> None:
    ticks = drive(HPAPolicy(), lambda t: 4 * TARGET if t < 60 else 8 * TARGET, t_end=90.0, replicas=4)
    assert ticks[-1].desired == 8
    assert next(tk.t for tk in ticks if tk.desired == 8) <= 75.0


def test_hpa_clamps_to_spec_bounds_itself() -> None:
    p = HPAPolicy()
    spec = SPEC.with_(max_replicas=5)
    res = normalize(p, context(p, metrics(100.0), current=4, spec=spec))
    assert (res.desired, res.reason) == (5, Reason.REACTIVE)  # the bound is one of its limits: no BOUNDS


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0.0, 50.0), min_size=5, max_size=40))
def test_hpa_never_exceeds_its_rate_limits(levels: list[float]) -> None:
    p = HPAPolicy()
    ticks = drive(
        p, lambda t: levels[min(max(int(t // 15), 0), len(levels) - 1)], t_end=15.0 * len(levels), replicas=2
    )
    for tk in ticks:
        assert SPEC.min_replicas <= tk.desired <= SPEC.max_replicas
        assert tk.desired <= max(2 * tk.ready, tk.ready + 4)


# -- KPA ------------------------------------------------------------------------------------------


def kpa_window(stable: float, panic: float) -> ModelMetrics:
    """60 s of samples: 54 at ``stable``, the last 6 (the panic window) at ``panic``."""
    return metrics([stable] * 54 + [panic] * 6, n=60)


def test_kpa_enters_panic_at_twice_the_ready_pods() -> None:
    p = KPAPolicy()
    # 2 ready; panic-window pods ceil(2.75 / 0.7) = 4 -> 4 / 2 = 200 %: panic.
    res = p.decide(context(p, kpa_window(1.0, 2.75), current=2))
    assert res.reason == Reason.PANIC
    assert res.desired == 4
    # ceil(2.0 / 0.7) = 3 -> 150 %: no panic, the stable window decides.
    res = p.decide(context(p, kpa_window(1.0, 2.0), current=2))
    assert res.reason != Reason.PANIC
    assert res.state.panic_time is None


def test_kpa_stable_mode_sizes_on_the_stable_window() -> None:
    p = KPAPolicy()
    res = p.decide(context(p, metrics(7.0), current=6))  # 10 pods / 6 ready < 200 %: no panic
    assert (res.desired, res.reason) == (10, Reason.REACTIVE)
    res = p.decide(context(p, metrics(7.0), current=10))
    assert (res.desired, res.reason) == (10, Reason.STABLE)


def test_kpa_never_scales_down_in_panic_and_leaves_after_a_stable_window() -> None:
    def load(t: float) -> float:
        return 6.0 if 100 <= t < 110 else 1.0

    ticks = drive(KPAPolicy(), load, t_end=300.0, replicas=2)
    panic = [tk for tk in ticks if tk.reason == Reason.PANIC]
    assert panic, "the burst must trigger panic"
    for a, b in pairwise(panic):
        assert b.desired >= a.desired
    peak = max(tk.desired for tk in ticks)
    assert peak >= math.ceil(6.0 / TARGET)
    # Panic ends a full stable window after the last tick over the threshold, not before.
    states = drive_states(KPAPolicy(), load, t_end=300.0, replicas=2)
    last_over = max(s.panic_time for s in states if s.panic_time is not None)
    end = next(tk.t for tk in ticks if tk.t > last_over and tk.reason != Reason.PANIC)
    assert last_over + 60.0 < end <= last_over + 62.0
    # ...and only then does the count come down (by at most half per decision).
    held = [tk.desired for tk in ticks if last_over <= tk.t < end]
    assert held == sorted(held) and held[-1] == peak
    after = next(tk for tk in ticks if tk.t == end)
    assert peak // 2 <= after.desired < peak
    assert ticks[-1].desired < peak


def drive_states(policy: KPAPolicy, load: Callable[[float], float], t_end: float, replicas: int) -> list[Any]:
    state = policy.initial_state(SPEC, replicas)
    states, current, t = [], replicas, 0.0
    while t <= t_end:
        samples = np.array([load(s) for s in np.arange(t - 119, t + 1)])
        res = policy.decide(context(policy, metrics(samples, n=120), current, now=t, state=state))
        states.append(res.state)
        state, current = res.state, res.desired
        t += policy.tick_s
    return states


def test_kpa_scale_down_at_most_halves_per_decision() -> None:
    p = KPAPolicy()
    assert p.decide(context(p, metrics(0.0), current=10)).desired == 5
    assert p.decide(context(p, metrics(0.0), current=5)).desired == 2
    ticks = drive(p, lambda t: 0.0, t_end=20.0, replicas=40)
    for a, b in pairwise(ticks):
        assert b.desired >= a.desired // 2
    assert ticks[-1].desired == SPEC.min_replicas


def test_kpa_scale_up_rate_is_relative_to_ready_pods() -> None:
    p = KPAPolicy(max_scale_up_rate=2.0)
    res = p.decide(context(p, metrics(70.0), current=3))
    assert res.desired == 6


def test_kpa_scale_to_zero_waits_for_the_grace_period() -> None:
    spec = SPEC.with_(min_replicas=0)
    ticks = drive(KPAPolicy(), lambda t: 0.0, t_end=40.0, replicas=1, spec=spec)
    assert all(tk.desired == 1 for tk in ticks if tk.t < 30.0)
    assert ticks[-1].desired == 0


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0.0, 40.0), min_size=5, max_size=40))
def test_kpa_panic_never_lowers_and_down_steps_at_most_halve(levels: list[float]) -> None:
    p = KPAPolicy()
    ticks = drive(
        p, lambda t: levels[min(max(int(t // 6), 0), len(levels) - 1)], t_end=6.0 * len(levels), replicas=2
    )
    for a, b in pairwise(ticks):
        if b.reason == Reason.PANIC and a.reason == Reason.PANIC:
            assert b.desired >= a.desired
        assert b.desired >= max(SPEC.min_replicas, b.ready // 2)


# -- oracle ---------------------------------------------------------------------------------------


def test_oracle_sizes_for_the_future_rate(fake_slo: list[tuple[float, ServiceProfile]]) -> None:
    p = OraclePolicy()
    res = p.decide(context(p, metrics(1.0, rate=5.0, future_rate=87.0), current=1))
    assert res.desired == 9
    assert res.reason == Reason.ORACLE
    assert fake_slo == [(87.0, PROFILE)]
    assert p.instant_start is True and p.tick_s == 10.0


def test_oracle_matches_the_real_capacity_model() -> None:
    p = OraclePolicy()
    expected = capacity.min_replicas_for_slo(42.0, PROFILE)
    assert p.decide(context(p, metrics(1.0, future_rate=42.0), current=1)).desired == expected


# -- rails and registry ---------------------------------------------------------------------------


class _Exploding:
    name, tick_s, instant_start, uses_forecast, learns = "boom", 1.0, False, False, False
    behavior: ScalingBehavior | None = None

    def initial_state(self, spec: ModelSpec, replicas: int) -> None:
        return None

    def decide(self, ctx: PolicyContext) -> PolicyResult:
        raise AssertionError("a policy must not run on stale metrics")


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_stale_metrics_hold_replicas(name: str) -> None:
    p = make_policy(name)
    res = normalize(p, context(p, metrics(1000.0, stale=True, future_rate=1000.0), current=3, ready=3))
    assert (res.desired, res.reason) == (3, Reason.METRICS_STALE)
    res = normalize(_Exploding(), context(p, metrics(0.0, stale=True), current=3))
    assert res.desired == 3


def test_rails_clamp_to_bounds(fake_slo: list[Any]) -> None:
    spec = SPEC.with_(min_replicas=2, max_replicas=5)
    kpa = KPAPolicy()
    res = normalize(kpa, context(kpa, metrics(100.0), current=4, spec=spec))
    assert (res.desired, res.reason) == (5, Reason.BOUNDS)
    static = StaticPolicy(replicas=0)
    res = normalize(static, context(static, metrics(0.0), current=4, spec=spec))
    assert (res.desired, res.reason) == (2, Reason.BOUNDS)
    oracle = OraclePolicy()
    res = normalize(oracle, context(oracle, metrics(0.0, future_rate=0.0), current=4, spec=spec))
    assert (res.desired, res.reason) == (2, Reason.BOUNDS)


def test_empty_metrics_window_holds() -> None:
    for p in (HPAPolicy(), KPAPolicy()):
        res = p.decide(context(p, metrics([], n=0, rate=[]), current=3))
        assert res.desired == 3


def test_registry_builds_every_policy_with_real_knob_names() -> None:
    assert set(POLICIES) == {"static", "hpa", "kpa", "oracle", "slotwise", "predictive"}
    hpa = make_policy("hpa", tolerance=0.05, sync_period_s=30.0, scale_down_stabilization_s=60.0)
    assert isinstance(hpa, HPAPolicy) and hpa.tick_s == 30.0 and hpa.tolerance == 0.05
    kpa = make_policy("kpa", stable_window_s=120.0, panic_window_percentage=5.0)
    assert isinstance(kpa, KPAPolicy) and kpa.panic_window_s == 6.0 and kpa.tick_s == 2.0
    assert make_policy("slotwise").name == "slotwise"
    for name in POLICIES:
        p = make_policy(name)
        assert p.tick_s > 0 and isinstance(p.instant_start, bool) and isinstance(p.name, str)
        assert p.instant_start == (name == "oracle")
        assert p.learns == (name == "slotwise") and p.uses_forecast == (name == "slotwise")
        assert (p.behavior is not None) == (name in ("slotwise", "hpa"))


def test_registry_rejects_unknown_names_and_knobs() -> None:
    with pytest.raises(ValueError, match="unknown policy"):
        make_policy("hpaa")
    with pytest.raises(ValueError, match="stable_window_s"):
        make_policy("hpa", stable_window_s=60.0)
    with pytest.raises(ValueError):
        make_policy("kpa", max_scale_down_rate=1.0)


def test_oracle_reports_an_unreachable_slo_as_bounds() -> None:
    # Service alone (100 ms) exceeds the 50 ms SLO: no replica count meets it, so it asks for the ceiling
    # and the rails say it wanted more.
    tight = ServiceProfile(
        occupancy_s=np.full(8, 0.1),
        latency_part_s=np.full(8, 0.1),
        concurrency=1,
        slo_s=0.05,
        percentile=95.0,
    )
    p = OraclePolicy()
    ctx = context(p, metrics(1.0, future_rate=5.0), current=1, spec=SPEC.with_(max_replicas=7))
    res = normalize(p, replace(ctx, capacity=tight))
    assert (res.desired, res.reason) == (7, Reason.BOUNDS)
