"""slotwise's policy (``SloPolicy``, registered as ``slotwise``), ``Forecast.at``, and the per-model learning
the decision core gives policies with ``learns = True``.

Most tests replace the capacity model by a round 10 req/s per replica (``fake_slo``) so that the arithmetic
of the policy is visible; the ones named ``real_capacity`` size with :func:`capacity.min_replicas_for_slo`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from itertools import pairwise
from statistics import NormalDist
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autoscaler.api.plan import Reason
from autoscaler.api.snapshot import ClusterSnapshot, MetricsWindow, ModelMetrics, ModelObservation, Replica
from autoscaler.api.spec import ModelSpec, slot_request
from autoscaler.decision.config import CoreConfig
from autoscaler.decision.core import decide
from autoscaler.decision.scaledown import Scaled, ScaleDownState, normalize
from autoscaler.decision.state import fresh_state
from autoscaler.estimation import capacity
from autoscaler.estimation.capacity import ServiceProfile, quantize_up
from autoscaler.estimation.learning import SloQuantile
from autoscaler.policies import SloPolicy, SloState, make_policy
from autoscaler.policies import slo as slo_module
from autoscaler.policies.base import Forecast, PolicyContext, PolicyResult, ScalingBehavior
from autoscaler.policies.slo import FORECAST_STEP_S, arrival_dispersion, intensity_quantile
from sharing.cluster import nodes_from_spec
from sharing.packer import FirstFitPacker
from sharing.slots import Inventory, Slot

SPEC = ModelSpec(name="m", concurrency=1, service_time_ms=100.0, min_replicas=1, max_replicas=100)  # p95
PROFILE = ServiceProfile(
    occupancy_s=np.full(8, 0.1), latency_part_s=np.full(8, 0.1), concurrency=1, slo_s=1.0, percentile=95.0
)
Q95 = SloQuantile.initial(95.0)  # 0.995: the quantile a p95 SLO sizes for before any burn
Q95_DOWN = 1.0 - (1.0 - Q95) * 0.5  # 0.9975: the N-1 check's stricter quantile at the default down_margin
LEVELS = (0.5, 0.9, 0.99)
# 10, 30, 50 req/s at the levels: 20 req/s per decade above 0.9, so 0.995 -> 50 + 20 * log10(2) = 56.02
# and 0.9975 -> 50 + 20 * log10(4) = 62.04
FC = (10.0, 30.0, 50.0)


def forecast(values: tuple[float, ...] = FC, levels: tuple[float, ...] = LEVELS) -> Forecast:
    return Forecast(quantiles=levels, values=np.array(values, dtype=float), horizon_s=60.0)


def metrics(
    rate: float | list[float], n: int = 120, stale: bool = False, in_flight: float | list[float] | None = None
) -> ModelMetrics:
    """``n`` 1 s samples of the request rate (a scalar fills the window; a list is used as is, oldest first).

    In flight defaults to Little's law without a queue, ``rate * mean service time`` (PROFILE's 0.1 s): no
    backlog, so the drain rule stays out of the way unless a test gives ``in_flight`` (scalar or samples).
    """
    r = np.full(n, float(rate)) if np.isscalar(rate) else np.asarray(rate, dtype=float)
    f = r * PROFILE.mean_s if in_flight is None else np.broadcast_to(np.asarray(in_flight, dtype=float), r.shape)
    return ModelMetrics(rate=r, in_flight=np.array(f, dtype=float), stale=stale)


def fake_count(rate: float) -> int:
    """What ``fake_slo`` answers: 10 req/s per replica."""
    return math.ceil(rate / 10.0 - 1e-9)


def context(
    policy: SloPolicy,
    m: ModelMetrics,
    current: int,
    *,
    now: float = 1000.0,
    state: Any = None,
    spec: ModelSpec = SPEC,
    fc: Forecast | None = None,
    q: float | None = None,
    burn: float = 0.0,
    profile: ServiceProfile = PROFILE,
    ready: int | None = None,
) -> PolicyContext:
    return PolicyContext(
        now=now,
        spec=spec,
        current_replicas=current,
        ready_replicas=current if ready is None else ready,
        metrics=m,
        metrics_step_s=1.0,
        forecast=fc,
        capacity=profile,
        state=policy.initial_state(spec, current) if state is None else state,
        sizing_quantile=q,
        burn=burn,
    )


# A scale-down state whose first decision lies long in the past: the initial stabilization window has passed.
SETTLED = ScaleDownState(started_at=0.0)


def run(policy: SloPolicy, ctx: PolicyContext, window: ScaleDownState | None = None) -> Scaled:
    """The policy's decision as the core takes it: its recommendation through its behaviour (stabilization, the
    N-1 check, the step limit) and the rails."""
    return normalize(policy, ctx, window)


@pytest.fixture
def fake_slo(monkeypatch: pytest.MonkeyPatch) -> list[tuple[float, ServiceProfile, int]]:
    """Replace the capacity model by 10 req/s per replica and record its calls (rate, profile, max)."""
    calls: list[tuple[float, ServiceProfile, int]] = []

    def fake(rate: float, profile: ServiceProfile, max_replicas: int = 10_000) -> int:
        calls.append((rate, profile, max_replicas))
        return min(math.ceil(rate / 10.0 - 1e-9), max_replicas)

    monkeypatch.setattr(capacity, "min_replicas_for_slo", fake)
    return calls


# -- Forecast.at ------------------------------------------------------------------------------------


def test_forecast_at_levels_and_interpolation() -> None:
    f = forecast()
    assert [f.at(q) for q in LEVELS] == list(FC)
    assert f.at(0.7) == pytest.approx(20.0)  # halfway between 0.5 and 0.9
    assert f.at(0.945) == pytest.approx(40.0)
    assert f.at(0.1) == 10.0  # below the lowest level: the lowest value, not an extrapolation


def test_forecast_at_exponential_tail_above_the_top_level() -> None:
    f = forecast()
    # (50 - 30) per decade of rarity between 0.9 and 0.99: every further 10x rarer quantile adds 20.
    assert f.at(0.999) == pytest.approx(70.0)
    assert f.at(0.9999) == pytest.approx(90.0)
    assert f.at(0.995) == pytest.approx(50.0 + 20.0 * math.log10(2.0))
    steps = [f.at(1 - 10.0**-k) - f.at(1 - 10.0 ** -(k - 1)) for k in (3, 4, 5, 6)]
    assert steps == pytest.approx([20.0] * 4)
    qs = np.linspace(0.99, 0.99999, 50)
    tail = [f.at(float(q)) for q in qs]
    assert all(v >= 50.0 for v in tail)
    assert all(a < b for a, b in pairwise(tail))  # rarer quantile, higher load


def test_forecast_at_one_is_finite() -> None:
    # The 1-quantile of a rate has no finite forecast: q is clamped to 1 - 1e-9 (9 decades into the tail).
    f = forecast()
    assert f.at(1.0) == pytest.approx(50.0 + 20.0 * 7.0)  # 0.99 -> 1 - 1e-9 is 7 decades at 20 per decade
    assert f.at(1.0) == f.at(1.0 - 1e-9)
    assert f.at(0.99999) < f.at(1.0) == f.at(1.5)  # still monotone; beyond 1 is the same clamp
    assert all(math.isfinite(g.at(1.0)) for g in (forecast((10.0, 30.0, 30.0)), forecast((10.0, 35.0, 30.0))))
    single = Forecast(quantiles=(0.9,), values=np.array([42.0]), horizon_s=60.0)
    assert single.at(1.0) == 42.0
    at_one = forecast(levels=(0.5, 0.9, 1.0))  # a level at exactly 1 is taken as given
    assert at_one.at(1.0) == 50.0


def test_forecast_at_tail_never_below_top_and_flat_when_top_two_equal() -> None:
    flat = forecast((10.0, 30.0, 30.0))
    assert flat.at(0.999) == 30.0 and flat.at(0.99999) == 30.0
    crossed = forecast((10.0, 35.0, 30.0))  # quantile crossing: the tail does not go below the top value
    assert crossed.at(0.999) == 30.0
    single = Forecast(quantiles=(0.9,), values=np.array([42.0]), horizon_s=60.0)
    assert single.at(0.99) == 42.0 and single.at(0.5) == 42.0
    # The extrapolation is in the two top levels' own spacing: 0.95 -> 0.99 is log10(5) decades.
    five = Forecast(quantiles=(0.5, 0.75, 0.9, 0.95, 0.99), values=np.array([1.0, 2.0, 3.0, 4.0, 6.0]), horizon_s=1)
    assert five.at(0.999) == pytest.approx(6.0 + 2.0 / math.log10(5.0))


# -- contract and knobs ---------------------------------------------------------------------------


def test_registered_as_slotwise_with_defaults() -> None:
    p = make_policy("slotwise")
    assert isinstance(p, SloPolicy)
    assert (p.name, p.tick_s, p.instant_start, p.uses_forecast, p.learns) == ("slotwise", 10.0, False, True, True)
    assert (p.burstiness, p.drain_s) == (True, None)  # None: drain within the model's SLO latency
    assert p.initial_state(SPEC, 3) == SloState()
    q = make_policy(
        "slotwise",
        tick_s=5.0,
        stable_window_s=30.0,
        panic_window_s=5.0,
        scale_down_stabilization_s=60.0,
        max_scale_down_fraction=0.25,
        down_margin=1.0,
        burstiness=False,
        drain_s=30.0,
    )
    assert isinstance(q, SloPolicy)
    assert (q.tick_s, q.stable_window_s, q.panic_window_s) == (5.0, 30.0, 5.0)
    assert (q.scale_down_stabilization_s, q.max_scale_down_fraction, q.down_margin) == (60.0, 0.25, 1.0)
    assert (q.burstiness, q.drain_s) == (False, 30.0)


@pytest.mark.parametrize(
    "knobs",
    [
        {"tick_s": 0.0},
        {"tick_s": -1.0},
        {"tick_s": math.nan},
        {"tick_s": math.inf},
        {"stable_window_s": 0.0},
        {"stable_window_s": math.inf},
        {"panic_window_s": -5.0},
        {"panic_window_s": math.nan},
        {"scale_down_stabilization_s": -1.0},
        {"scale_down_stabilization_s": math.nan},
        {"max_scale_down_fraction": 0.0},
        {"max_scale_down_fraction": 1.01},
        {"max_scale_down_fraction": math.nan},
        {"down_margin": 0.0},
        {"down_margin": 1.5},
        {"down_margin": math.nan},
        {"drain_s": 0.0},
        {"drain_s": -60.0},
        {"drain_s": math.nan},
        {"drain_s": math.inf},
    ],
)
def test_rejects_bad_knobs(knobs: dict[str, float]) -> None:
    with pytest.raises(ValueError, match=next(iter(knobs))):
        SloPolicy(**knobs)
    with pytest.raises(ValueError):
        make_policy("slotwise", **knobs)


def test_accepts_knobs_at_their_limits() -> None:
    p = SloPolicy(scale_down_stabilization_s=0.0, max_scale_down_fraction=1.0, down_margin=1.0)
    assert (p.scale_down_stabilization_s, p.max_scale_down_fraction, p.down_margin) == (0.0, 1.0, 1.0)


def test_zero_stabilization_scales_down_at_once(fake_slo: list[Any]) -> None:
    # A zero window is "now": only this tick's recommendation counts, and it is kept in the state.
    p = SloPolicy(scale_down_stabilization_s=0.0, max_scale_down_fraction=1.0)
    res = run(p, context(p, metrics(20.0), current=6))
    assert (res.desired, res.reason) == (2, Reason.REACTIVE)
    assert res.scale_down.highs == ((1000.0, 2),)
    # Higher recommendations of earlier ticks do not hold it: they are out of the window at once.
    window = ScaleDownState(started_at=0.0, highs=((990.0, 9), (995.0, 7)))
    res = run(p, context(p, metrics(20.0), current=6), window)
    assert (res.desired, res.scale_down.highs) == (2, ((1000.0, 2),))
    # ...still subject to the per-tick bound (half of 6 at the default fraction)...
    half = SloPolicy(scale_down_stabilization_s=0.0)
    assert run(half, context(half, metrics(20.0), current=6)).desired == 3
    # ...and to the N-1 check: the plan (at Q95: 56.02 req/s) says 6, but at the stricter quantile (0.9975:
    # 62.04 req/s) the forecast needs 7, so 7 hold.
    plan, check = fake_count(forecast().at(Q95)), fake_count(forecast().at(Q95_DOWN))
    assert (plan, check) == (6, 7)
    res = run(p, context(p, metrics(5.0), current=check, fc=forecast()))
    assert (res.desired, res.reason) == (check, Reason.N_MINUS_1)


# -- plan: forecast at the sizing quantile, observed floor ---------------------------------------------


def test_sizes_for_the_forecast_at_the_sizing_quantile(fake_slo: list[Any]) -> None:
    p = SloPolicy()
    low = metrics(5.0)
    # No sizing quantile given: the SLO's initial one (p95 -> 0.995), in the tail above the top level (0.99).
    res = run(p, context(p, low, current=1, fc=forecast()))
    assert forecast().at(Q95) == pytest.approx(50.0 + 20.0 * math.log10(2.0))
    # ... less the Poisson noise of a minute's count, which the queueing model charges again
    load = intensity_quantile(forecast(), Q95, FORECAST_STEP_S)
    assert forecast().at(0.5) < load < forecast().at(Q95)
    assert (res.desired, res.reason) == (fake_count(load), Reason.FORECAST) == (6, Reason.FORECAST)
    assert fake_slo[0] == (load, PROFILE, SPEC.max_replicas + 1)  # one past the ceiling: BOUNDS shows
    fake_slo.clear()
    raw = SloPolicy(deflate_poisson=False)
    run(raw, context(raw, low, current=1, fc=forecast()))
    assert fake_slo[0] == (forecast().at(Q95), PROFILE, SPEC.max_replicas + 1)
    assert run(p, context(p, low, current=1, fc=forecast(), q=0.99)).desired == 5  # the top level: 50
    assert run(p, context(p, low, current=1, fc=forecast(), q=0.9)).desired == 3
    assert run(p, context(p, low, current=1, fc=forecast(), q=0.7)).desired == 2  # interpolated: 20
    assert run(p, context(p, low, current=1, fc=forecast(), q=0.999)).desired == 7  # tail: 70


def test_a_scale_up_is_sized_for_the_ready_window_and_the_whole_window_is_held(fake_slo: list[Any]) -> None:
    # The lead window peaks before a replica asked for now could serve (q0.995 56 req/s over the whole window, 30
    # req/s from the cold start on): the receding horizon's first step (policies/horizon.py).
    p = SloPolicy(deflate_poisson=False)
    ready = Forecast(quantiles=LEVELS, values=np.array((10.0, 20.0, 25.0)), horizon_s=30.0)
    fc = replace(forecast(), ready=ready)
    low = metrics(5.0)
    up = fake_count(ready.at(Q95))
    assert (up, fake_count(forecast().at(Q95))) == (3, 6)
    res = run(p, context(p, low, current=1, fc=fc), SETTLED)
    assert (res.desired, res.reason) == (up, Reason.FORECAST)  # not 6: those would arrive after the peak
    assert "ready window" in res.detail
    assert run(p, context(p, low, current=4, fc=fc), SETTLED).desired == 4  # in between: what is in place serves
    # above: the whole window is held (a scale-down to the N-1 check's count at its stricter quantile, 62 req/s)
    assert run(p, context(p, low, current=9, fc=fc), SETTLED).desired == fake_count(forecast().at(Q95_DOWN)) == 7
    # without a ready window (the usual case: the quantiles peak at the window's end) the whole window sizes both
    assert run(p, context(p, low, current=1, fc=forecast()), SETTLED).desired == 6


def test_observed_stable_window_is_a_floor_under_the_forecast(fake_slo: list[Any]) -> None:
    p = SloPolicy()
    # A forecast lagging a ramp (10 req/s at q) does not shed replicas busy with 80 req/s now.
    res = run(p, context(p, metrics(80.0), current=1, fc=forecast((5.0, 8.0, 10.0))))
    assert (res.desired, res.reason) == (8, Reason.FORECAST)
    # Only the stable window (60 s) counts: 200 req/s a minute ago is not a floor any more.
    res = run(p, context(p, metrics([200.0] * 60 + [40.0] * 60), current=1, fc=forecast((5.0, 8.0, 10.0))))
    assert res.desired == 4
    assert fake_slo[-1][0] == 40.0


def test_reactive_without_a_forecast(fake_slo: list[Any]) -> None:
    p = SloPolicy()
    res = run(p, context(p, metrics(33.0), current=1))
    assert (res.desired, res.reason) == (4, Reason.REACTIVE)
    # A forecast that has no number for the quantile (NaN) is no forecast either.
    nan = forecast((math.nan, math.nan, math.nan))
    res = run(p, context(p, metrics(33.0), current=1, fc=nan))
    assert (res.desired, res.reason) == (4, Reason.REACTIVE)
    # ...and a burning error budget does not make a reactive decision an SLO_BURN one.
    res = run(p, context(p, metrics(33.0), current=1, q=0.999, burn=5.0))
    assert res.reason == Reason.REACTIVE


def test_real_capacity_sizes_for_max_of_forecast_and_observed() -> None:
    p = SloPolicy()
    for rate, fc, q in [(12.0, forecast(), None), (12.0, forecast(), 0.9), (45.0, forecast(), 0.9)]:
        res = run(p, context(p, metrics(rate), current=1, fc=fc, q=q))
        load = max(fc.at(Q95 if q is None else q), rate)
        assert res.desired == capacity.min_replicas_for_slo(load, PROFILE, SPEC.max_replicas + 1)
        assert res.desired > 1
    res = run(p, context(p, metrics(33.0), current=1))
    assert (res.desired, res.reason) == (capacity.min_replicas_for_slo(33.0, PROFILE, 101), Reason.REACTIVE)


def test_real_capacity_unreachable_slo_is_sized_at_the_knee_and_says_so() -> None:
    # Service alone (100 ms) exceeds a 50 ms SLO: no count meets it, so the policy does not buy the ceiling (it
    # used to ask for one past max replicas); it keeps up with the load (the knee: more replicas stop helping).
    tight = replace(PROFILE, slo_s=0.05)
    p = SloPolicy()
    spec = SPEC.with_(max_replicas=50, slo_latency_ms=50.0)
    res = run(p, context(p, metrics(5.0), current=1, spec=spec, fc=forecast(), profile=tight))
    load = intensity_quantile(forecast(), Q95, FORECAST_STEP_S)
    assert res.reason == Reason.SLO_UNATTAINABLE
    assert res.desired == capacity.knee_replicas(quantize_up(load), tight, 51) < 50
    assert "service time 0.10 s vs SLO 0.05 s" in res.detail and "at most 0.0% of requests" in res.detail


def test_a_partly_attainable_slo_is_sized_for_its_percentile_of_the_requests_that_can_meet_it() -> None:
    # Half the requests' service alone is over the SLO: the knee asks 95 % of the other half, 47.5 % in all.
    half = replace(PROFILE, latency_part_s=np.array([0.1] * 4 + [2.0] * 4), slo_s=1.0)
    assert capacity.attainable_share(half) == 0.5
    assert capacity.knee_target(half) == pytest.approx(0.475)
    n = capacity.knee_replicas(30.0, half, 100)
    assert capacity.attainment(30.0, n, half) >= 0.475 > capacity.attainment(30.0, n - 1, half)
    p = SloPolicy()
    res = run(p, context(p, metrics(30.0), current=1, profile=half))
    assert (res.desired, res.reason) == (n, Reason.SLO_UNATTAINABLE)
    # within reach: the knee is the SLO's own count
    assert capacity.knee_target(PROFILE) is None
    assert capacity.knee_replicas(30.0, PROFILE, 100) == capacity.min_replicas_for_slo(30.0, PROFILE, 100)


def test_capacity_comes_from_the_context(fake_slo: list[Any]) -> None:
    learned = PROFILE.scaled(2.0)
    p = SloPolicy()
    run(p, context(p, metrics(20.0), current=1, fc=forecast(), profile=learned))
    assert fake_slo and all(prof is learned for _, prof, _ in fake_slo)


# -- panic ----------------------------------------------------------------------------------------------


def test_panic_when_the_short_window_needs_more_than_the_plan(fake_slo: list[Any]) -> None:
    p = SloPolicy()
    burst = metrics([10.0] * 110 + [100.0] * 10)  # stable (60 s) mean 25, short (10 s) 100
    res = run(p, context(p, burst, current=2, fc=forecast((5.0, 10.0, 20.0))))
    assert (res.desired, res.reason) == (10, Reason.PANIC)
    assert "short-window" in res.detail
    # Already enough replicas for the burst: no panic (and no scale-down inside the window).
    res = run(p, context(p, burst, current=10, fc=forecast((5.0, 10.0, 20.0))))
    assert (res.desired, res.reason) == (10, Reason.STABLE)
    # A plan that already covers the burst is the plan, not a panic (at Q95: 120 + 20 * log10(2) = 126.02).
    high = forecast((50.0, 100.0, 120.0))
    res = run(p, context(p, burst, current=2, fc=high))
    assert (res.desired, res.reason) == (fake_count(high.at(Q95)), Reason.FORECAST) == (13, Reason.FORECAST)


def test_panic_window_is_the_knob(fake_slo: list[Any]) -> None:
    burst = metrics([10.0] * 110 + [100.0] * 10)
    wide = SloPolicy(panic_window_s=60.0)  # then the short window is the stable one: no panic
    res = run(wide, context(wide, burst, current=2, fc=forecast((5.0, 10.0, 20.0))))
    assert (res.desired, res.reason) == (3, Reason.FORECAST)


# -- drain: a backlog in flight ---------------------------------------------------------------------------
# A backlog is the in-flight count beyond Little's law at the larger of the stable and short windows' rates;
# it drains only when the Ready replicas would need longer than the SLO latency to serve it. With SPEC and
# PROFILE (1 s SLO, 0.1 s service, one slot) a Ready replica serves 10 req/s: more than 10 queued per Ready
# replica is a backlog.

PER_REPLICA = PROFILE.concurrency / PROFILE.mean_s  # 10 req/s: a replica's throughput


def _with_backlog(rate: float, backlog: float, n: int = 120) -> ModelMetrics:
    """A steady ``rate`` whose last in-flight sample holds ``backlog`` requests beyond those in service."""
    return metrics(rate, n=n, in_flight=rate * PROFILE.mean_s + backlog)


def test_drain_a_backlog_raises_the_count_with_panic(fake_slo: list[Any]) -> None:
    p = SloPolicy(drain_s=60.0)
    rate, current = 20.0, 2
    # No backlog: the plan (reactive, 20 req/s -> 2) is what is in place.
    res = run(p, context(p, metrics(rate), current=current))
    assert (res.desired, res.reason) == (2, Reason.STABLE)
    # 600 requests queued (30 s of the 2 replicas' 20 req/s: a backlog): size for the arrivals plus the backlog
    # spread over drain_s (60 s): 20 + 10 req/s.
    backlog = 600.0
    res = run(p, context(p, _with_backlog(rate, backlog), current=current))
    drain_load = rate + backlog / 60.0
    assert (res.desired, res.reason) == (fake_count(drain_load), Reason.PANIC) == (3, Reason.PANIC)
    assert "backlog 600" in res.detail
    assert any(r == pytest.approx(drain_load) for r, _, _ in fake_slo)
    # drain_s is the knob: the same backlog over 20 s is 30 req/s more.
    fast = SloPolicy(drain_s=20.0)
    res = run(fast, context(fast, _with_backlog(rate, backlog), current=current))
    assert (res.desired, res.reason) == (fake_count(rate + backlog / 20.0), Reason.PANIC) == (5, Reason.PANIC)


@pytest.mark.parametrize(("slo_ms", "expected"), [(1000.0, 32), (2000.0, 17), (500.0, 62)])
def test_by_default_a_backlog_drains_within_the_slo_latency(fake_slo: list[Any], slo_ms: float, expected: int) -> None:
    # drain_s None: the backlog is to be gone within the model's own SLO latency (a queue older than that is
    # late requests): 300 queued at 20 req/s sizes for 20 + 300 / slo_latency_s.
    spec = SPEC.with_(slo_latency_ms=slo_ms)
    p = SloPolicy()
    assert p.drain_s is None
    rate, backlog = 20.0, 300.0
    m = _with_backlog(rate, backlog)
    res = run(p, context(p, m, current=2, spec=spec))
    drain_load = rate + backlog / spec.slo_latency_s
    assert (res.desired, res.reason) == (fake_count(drain_load), Reason.PANIC) == (expected, Reason.PANIC)
    assert any(r == pytest.approx(drain_load) for r, _, _ in fake_slo)
    # An explicit drain_s still overrides it, whatever the SLO latency: 20 + 300 / 60 = 25 req/s -> 3.
    slow = SloPolicy(drain_s=60.0)
    res = run(slow, context(slow, m, current=2, spec=spec))
    assert (res.desired, res.reason) == (fake_count(rate + backlog / 60.0), Reason.PANIC) == (3, Reason.PANIC)


def test_drain_sizes_on_the_larger_of_the_stable_and_short_windows(fake_slo: list[Any]) -> None:
    p = SloPolicy(drain_s=60.0)
    # Stable (60 s) mean 25, short (10 s) 100: the backlog beyond 100 req/s * 0.1 s in service is what drains.
    rates = [10.0] * 110 + [100.0] * 10
    in_flight = 100.0 * PROFILE.mean_s + 1200.0
    res = run(p, context(p, metrics(rates, in_flight=in_flight), current=2))
    assert (res.desired, res.reason) == (fake_count(100.0 + 1200.0 / 60.0), Reason.PANIC) == (12, Reason.PANIC)


@pytest.mark.parametrize("slo_ms", [1000.0, 2000.0])
def test_a_backlog_is_a_queue_the_ready_replicas_need_longer_than_the_slo_latency_to_serve(
    fake_slo: list[Any], slo_ms: float
) -> None:
    spec = SPEC.with_(slo_latency_ms=slo_ms)
    p = SloPolicy()
    for ready in (1, 2, 5):
        # What the replicas in place serve within the SLO latency: 10 (20 at a 2 s SLO) per Ready replica.
        threshold = spec.slo_latency_s * ready * PER_REPLICA
        base = run(p, context(p, metrics(20.0), current=ready, spec=spec))
        # Just below: not a backlog; the decision is the one without any queue.
        res = run(p, context(p, _with_backlog(20.0, threshold - 0.01), current=ready, spec=spec))
        assert (res.desired, res.reason) == (base.desired, base.reason) and res.reason != Reason.PANIC
        # Just above: it drains within the SLO latency, i.e. for 20 req/s plus a little over the Ready
        # replicas' throughput -- the plan (2) plus one more than the Ready replicas.
        backlog = threshold + 0.01
        res = run(p, context(p, _with_backlog(20.0, backlog), current=ready, spec=spec))
        expected = fake_count(20.0 + backlog / spec.slo_latency_s)
        assert (res.desired, res.reason) == (expected, Reason.PANIC) == (2 + ready + 1, Reason.PANIC)


def test_the_backlog_threshold_counts_the_ready_replicas_not_the_current_count(fake_slo: list[Any]) -> None:
    # 3 replicas, only 1 Ready (2 still starting): 10.01 queued is more than the Ready one serves in the 1 s
    # SLO latency, so it drains (20 + 10.01 req/s -> 4), although 3 Ready replicas would serve it in time.
    p = SloPolicy()
    m = _with_backlog(20.0, 10.01)
    res = run(p, context(p, m, current=3, ready=1))
    assert (res.desired, res.reason) == (fake_count(20.0 + 10.01), Reason.PANIC) == (4, Reason.PANIC)
    res = run(p, context(p, m, current=3, ready=3))
    assert (res.desired, res.reason) == (3, Reason.STABILIZING)  # all 3 Ready: not a backlog (the window holds 3)
    # No Ready replica at all (all starting): the threshold is one replica's, not zero.
    res = run(p, context(p, _with_backlog(20.0, 9.99), current=3, ready=0))
    assert (res.desired, res.reason) == (3, Reason.STABILIZING)
    res = run(p, context(p, m, current=3, ready=0))
    assert (res.desired, res.reason) == (4, Reason.PANIC)


def test_no_backlog_no_drain(fake_slo: list[Any]) -> None:
    p = SloPolicy()
    # In flight below what is in service (the replicas are idle-ish), missing, or never scraped: nothing drains.
    for in_flight in (0.0, 1.0, math.nan):
        res = run(p, context(p, metrics(20.0, in_flight=in_flight), current=2))
        assert (res.desired, res.reason) == (2, Reason.STABLE)
    empty = ModelMetrics(rate=np.full(120, 20.0), in_flight=np.zeros(0))
    assert run(p, context(p, empty, current=2)).reason == Reason.STABLE
    # Scale from zero: with no replica the threshold is one replica's (10 queued within the 1 s SLO latency)...
    to_zero = SPEC.with_(min_replicas=0)
    res = run(p, context(p, metrics(0.0, in_flight=9.99), current=0, spec=to_zero))
    assert (res.desired, res.reason) == (0, Reason.STABLE)
    # ...and 30 queued drain within it by default (30 req/s -> 3), or over drain_s when given (0.5 req/s -> 1).
    res = run(p, context(p, metrics(0.0, in_flight=30.0), current=0, spec=to_zero))
    assert (res.desired, res.reason) == (fake_count(30.0 / SPEC.slo_latency_s), Reason.PANIC) == (3, Reason.PANIC)
    slow = SloPolicy(drain_s=60.0)
    res = run(slow, context(slow, metrics(0.0, in_flight=30.0), current=0, spec=to_zero))
    assert (res.desired, res.reason) == (fake_count(30.0 / 60.0), Reason.PANIC) == (1, Reason.PANIC)


def test_real_capacity_a_steady_queue_is_not_a_backlog() -> None:
    # In flight at steady state is rate * (mean service + mean wait) (Little's law): the queue the model
    # itself predicts at a count that meets the SLO never triggers the drain -- the Ready replicas serve it
    # well within the SLO latency (its mean wait is below it).
    p = SloPolicy()
    hair_trigger = SloPolicy(drain_s=1e-9)  # were it a backlog, this would ask for the ceiling
    for rate in (5.0, 12.0, 33.0, 60.0):
        current = capacity.min_replicas_for_slo(rate, PROFILE, SPEC.max_replicas + 1)
        p_wait, decay = capacity.wait_params(rate / current, PROFILE.concurrency, PROFILE.mean_s, PROFILE.scv)
        in_system = rate * (PROFILE.mean_s + float(p_wait / decay))
        backlog = in_system - rate * PROFILE.mean_s
        assert backlog > 0  # some queue...
        assert backlog / (current * PER_REPLICA) < SPEC.slo_latency_s  # ...served within the SLO latency...
        for policy in (p, hair_trigger):
            res = run(policy, context(policy, metrics(rate, in_flight=in_system), current=current), SETTLED)
            assert (res.desired, res.reason) == (current, Reason.STABLE)  # ...so nothing to drain
            assert "backlog" not in res.detail


@pytest.mark.parametrize("drain_s", [None, 60.0])
def test_real_capacity_a_bigger_backlog_never_needs_fewer_replicas(drain_s: float | None) -> None:
    p = SloPolicy(drain_s=drain_s)
    for rate, current in [(20.0, 3), (20.0, 1), (45.0, 6), (0.0, 0)]:
        counts = [
            run(p, context(p, _with_backlog(rate, backlog), current=current)).desired
            for backlog in np.linspace(0.0, 6000.0, 61)
        ]
        assert all(a <= b for a, b in pairwise(counts))
        assert counts[0] >= current or rate == 0.0
        assert counts[-1] > counts[0]  # 6,000 queued: 100 req/s more to serve over 60 s, 6,000 over the 1 s SLO


def test_scale_down_does_not_shed_the_replicas_a_backlog_needs(fake_slo: list[Any]) -> None:
    # 20 req/s (the plan: 2) and 3,600 requests queued: the drain rule (over 60 s) sizes for 20 + 60 = 80 req/s
    # -> 8. The drain count is a floor even when it is not above the count in place, so 8 replicas stay (it used
    # to count only above it: the policy stepped 8 down to 4, where the next tick's drain panicked back to 8).
    p = SloPolicy(drain_s=60.0)
    m = _with_backlog(20.0, 3600.0)
    res = run(p, context(p, m, current=4), SETTLED)
    assert (res.desired, res.reason) == (8, Reason.PANIC)  # the drain rule, from below
    res = run(p, context(p, m, current=8), SETTLED)
    assert (res.desired, res.reason) == (8, Reason.STABLE)  # held by the floor: no panic, no shedding
    assert "backlog 3600" in res.detail
    # From above it steps down, but only to the drain count (not the plan's 2, nor the half-step floor of 6).
    res = run(p, context(p, m, current=12), SETTLED)
    assert (res.desired, res.reason) == (8, Reason.REACTIVE)


# -- burstiness: arrival_dispersion, ServiceProfile.with_arrival_scv -------------------------------------

GRID = 2.0**0.25  # arrival_dispersion rounds to the nearest step of this geometric grid...
DEAD_BAND = math.sqrt(2.0)  # ...above this dead band (below it, Poisson scatter: 1)


def _index(counts: np.ndarray) -> float:
    """The definition: mean squared first difference over twice the mean (var/mean for independent counts)."""
    d = np.diff(counts)
    return float(np.dot(d, d) / (2.0 * d.size * counts.mean()))


def _on_grid(index: float) -> float:
    """1 below the dead band, else the nearest point of the 2^(1/4) grid (no cap)."""
    return 1.0 if index < DEAD_BAND else 2.0 ** (round(math.log2(index) * 4.0) / 4.0)


def _alternating(mean: float, half: float, n: int = 120) -> np.ndarray:
    """mean + half, mean - half, ...: every first difference is 2 * half, so the index is 2 half^2 / mean."""
    return np.where(np.arange(n) % 2 == 0, mean + half, mean - half).astype(float)


def test_arrival_dispersion_poisson_counts_read_as_one() -> None:
    # Constant counts carry no dispersion at all.
    assert arrival_dispersion(np.full(120, 50.0), 1.0) == 1.0
    # Poisson counts: the estimate is centred on 1, well inside the dead band below 2^(1/2): exactly 1.
    results, raw = [], []
    for seed in range(20):
        counts = np.random.default_rng(seed).poisson(50.0, 3600).astype(float)
        results.append(arrival_dispersion(counts, 1.0))
        raw.append(_index(counts))
    assert float(np.mean(raw)) == pytest.approx(1.0, abs=0.02)
    assert max(raw) < DEAD_BAND
    assert results == [1.0] * 20
    # Over a one-minute window the estimate scatters more, and the dead band absorbs nearly all of it
    # (measured: 191 of these 200 windows read exactly 1; the rest 2^(1/2) or 2^(3/4)).
    short = [arrival_dispersion(np.random.default_rng(s).poisson(50.0, 60).astype(float), 1.0) for s in range(200)]
    assert short.count(1.0) >= 180
    assert max(short) <= GRID**3


def test_arrival_dispersion_bursty_on_off_counts_read_as_more_than_one() -> None:
    # 5 s on at 100 req/s, 5 s off, for two minutes: same mean as a steady 50 req/s.
    on_off = np.tile([100.0] * 5 + [0.0] * 5, 12)
    d = arrival_dispersion(on_off, 1.0)
    # 23 jumps of 100 over 119 differences at mean 50: 19.33 -> nearest 2^4.25 = 19.03 (2^4.27 raw)
    assert _index(on_off) == pytest.approx(23 * 100.0**2 / (2 * 119 * 50.0))
    assert d == pytest.approx(_on_grid(_index(on_off)))
    assert d > 1.0 and d == pytest.approx(2.0**4.25)
    # Poisson arrivals inside the on periods: still far above Poisson.
    rng = np.random.default_rng(7)
    noisy = rng.poisson(on_off).astype(float)
    assert arrival_dispersion(noisy, 1.0) > 8.0


def test_arrival_dispersion_a_linear_ramp_is_not_burstiness() -> None:
    ramp = np.linspace(10.0, 130.0, 120)  # 10 -> 130 req/s over two minutes
    assert arrival_dispersion(ramp, 1.0) == 1.0
    # ...whereas the plain variance / mean of the counts would call it very bursty.
    assert float(ramp.var() / ramp.mean()) > 10.0
    assert arrival_dispersion(ramp[::-1].copy(), 1.0) == 1.0  # nor a ramp down
    steep = np.linspace(0.0, 600.0, 120)  # 5 req/s more every second
    assert arrival_dispersion(steep, 1.0) == 1.0


@pytest.mark.parametrize(
    ("half", "mean", "expected"),
    [
        (5.0, 50.0, 1.0),  # index exactly 1: Poisson
        (math.sqrt(35.0), 50.0, 1.0),  # 1.4: inside the dead band below 2^(1/2) = 1.414
        (math.sqrt(37.5), 50.0, 2.0**0.5),  # 1.5 (2^(2.34/4)) -> down to 1.414
        (math.sqrt(45.0), 50.0, 2.0**0.75),  # 1.8 (2^(3.39/4)) -> down to 1.68
        (5.0, 25.0, 2.0),  # exactly on the grid: stays
        (math.sqrt(55.0), 50.0, 2.0**1.25),  # 2.2 (2^(4.55/4)) -> up to 2.38
        (math.sqrt(75.0), 50.0, 2.0**1.5),  # 3.0 (2^(6.34/4)) -> down to 2.83
        (2.0, 50.0, 1.0),  # 0.16: under-dispersed is still 1
    ],
)
def test_arrival_dispersion_rounds_to_the_nearest_grid_step(half: float, mean: float, expected: float) -> None:
    counts = _alternating(mean, half)
    assert _index(counts) == pytest.approx(2.0 * half * half / mean)
    assert arrival_dispersion(counts, 1.0) == pytest.approx(expected)


def test_arrival_dispersion_counts_are_rate_times_step() -> None:
    # The same rates sampled every 2 s are twice the counts: twice the index (1.5 -> 3.0).
    rates = _alternating(50.0, math.sqrt(37.5))
    assert arrival_dispersion(rates, 1.0) == pytest.approx(2.0**0.5)
    assert arrival_dispersion(rates, 2.0) == pytest.approx(2.0**1.5)
    assert arrival_dispersion(rates / 10.0, 10.0) == pytest.approx(2.0**0.5)
    # Half the counts: half the index (1.5 -> 0.75), inside the dead band.
    assert arrival_dispersion(rates, 0.5) == 1.0


def test_arrival_dispersion_is_capped() -> None:
    wild = _alternating(500.0, 500.0)  # index 1,000
    assert _index(wild) == pytest.approx(1000.0)
    assert arrival_dispersion(wild, 1.0) == 64.0
    assert arrival_dispersion(wild, 1.0, cap=8.0) == 8.0


def test_arrival_dispersion_too_few_samples_or_no_load_is_one() -> None:
    bursty = _alternating(500.0, 500.0, n=6)
    assert arrival_dispersion(bursty, 1.0) > 1.0  # six samples are enough...
    assert arrival_dispersion(bursty[:5], 1.0) == 1.0  # ...five are not
    assert arrival_dispersion(np.zeros(0), 1.0) == 1.0
    with_gaps = np.array([1000.0, np.nan, 0.0, np.inf, 1000.0, np.nan, 0.0, 1000.0, np.nan])
    assert arrival_dispersion(with_gaps, 1.0) == 1.0  # five finite samples
    assert arrival_dispersion(np.zeros(120), 1.0) == 1.0  # no load
    assert arrival_dispersion(np.full(120, np.nan), 1.0) == 1.0


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0.0, 1e4), min_size=6, max_size=200), st.sampled_from([1.0, 5.0, 10.0]))
def test_arrival_dispersion_is_on_the_grid_and_bounded(rates: list[float], step: float) -> None:
    r = np.asarray(rates)
    d = arrival_dispersion(r, step)
    assert d == 1.0 or DEAD_BAND * (1.0 - 1e-12) <= d <= 64.0  # {1} and [2^(1/2) .. cap]
    assert math.log2(d) * 4.0 == pytest.approx(round(math.log2(d) * 4.0), abs=1e-9)  # on the 2^(1/4) grid
    counts = r * step
    index = _index(counts) if counts.mean() > 0 else 0.0
    if index < DEAD_BAND * (1.0 - 1e-9):
        assert d == 1.0  # the dead band
    elif index > DEAD_BAND * (1.0 + 1e-9):
        # The nearest grid step: within half a step (in log2 * 4) of the raw index, capped.
        assert abs(math.log2(d) * 4.0 - math.log2(min(index, 64.0)) * 4.0) <= 0.5 + 1e-9


def test_with_arrival_scv_returns_the_same_object_for_the_same_value() -> None:
    assert PROFILE.arrival_scv == 1.0
    assert PROFILE.with_arrival_scv(1.0) is PROFILE
    bursty = PROFILE.with_arrival_scv(2.0)
    assert bursty is not PROFILE and bursty is PROFILE.with_arrival_scv(2.0)  # kept: sizing keeps its memo
    assert bursty.with_arrival_scv(2.0) is bursty
    assert bursty.arrival_scv == 2.0 and PROFILE.arrival_scv == 1.0  # the original is untouched
    assert bursty._memo is not PROFILE._memo
    fields = ("mean_s", "scv", "concurrency", "slo_s", "percentile")
    assert [getattr(bursty, f) for f in fields] == [getattr(PROFILE, f) for f in fields]
    assert bursty.scaled(2.0).arrival_scv == 2.0  # a learned scale keeps the arrivals' variability


def test_attainment_uses_allen_cunneen_for_the_arrivals() -> None:
    # (ca^2 + cs^2) / 2: Poisson arrivals of a service with scv cs^2 wait like the M/G/c model of cs^2, and
    # arrivals of scv ca^2 stretch the wait like a service of scv cs^2 + ca^2 - 1.
    prof = capacity.profile_from_spec(SPEC.with_(concurrency=4))
    for arrival_scv in (1.0, 2.0, 4.5):
        p_wait, decay = capacity.wait_params(30.0 / 2, 4, prof.mean_s, prof.scv + arrival_scv - 1.0)
        expected = float(np.mean(capacity.within_prob(prof.budget_s, p_wait, decay)))
        assert capacity.attainment(30.0, 2, prof.with_arrival_scv(arrival_scv)) == pytest.approx(expected)


PROFILES = {
    "deterministic": PROFILE,
    "exponential": capacity.profile_from_spec(SPEC),
    "batched": capacity.profile_from_spec(SPEC.with_(concurrency=8, service_time_ms=400.0, slo_latency_ms=2000.0)),
}


@settings(max_examples=150, deadline=None)
@given(
    st.sampled_from(sorted(PROFILES)),
    st.floats(0.5, 400.0),
    st.floats(1.0, 64.0),
    st.floats(1.0, 64.0),
)
def test_burstier_arrivals_never_need_fewer_replicas(name: str, rate: float, a: float, b: float) -> None:
    lo, hi = sorted((a, b))
    prof = PROFILES[name]
    smooth, bursty = prof.with_arrival_scv(lo), prof.with_arrival_scv(hi)
    n_lo = capacity.min_replicas_for_slo(rate, smooth, 10_000)
    n_hi = capacity.min_replicas_for_slo(rate, bursty, 10_000)
    assert n_lo <= n_hi
    for n in {n_lo, n_hi, max(1, n_lo - 1)}:
        assert capacity.attainment(rate, n, bursty) <= capacity.attainment(rate, n, smooth) + 1e-12


def test_policy_charges_bursts_as_batches_not_as_a_longer_poisson_wait(fake_slo: list[Any]) -> None:
    on_off = list(np.tile([100.0] * 5 + [0.0] * 5, 12))  # mean 50 in both windows, dispersion 19.03
    scv = arrival_dispersion(np.asarray(on_off), 1.0)
    assert scv > 1.0
    p = SloPolicy()
    res = run(p, context(p, metrics(on_off), current=1, fc=forecast()))
    # sizing asks the queueing model at Poisson arrivals only; the burst is a floor of its own
    assert fake_slo and all(prof is PROFILE for _, prof, _ in fake_slo)
    assert res.arrival_scv == scv


def test_real_capacity_bursty_traffic_gets_more_replicas_than_smooth_at_the_same_mean() -> None:
    on_off = list(np.tile([100.0] * 5 + [0.0] * 5, 12))
    p, plain = SloPolicy(), SloPolicy(burstiness=False)
    smooth = run(p, context(p, metrics(50.0), current=1)).desired
    assert smooth == capacity.min_replicas_for_slo(50.0, PROFILE, SPEC.max_replicas + 1)
    bursty = run(p, context(p, metrics(on_off), current=1)).desired
    scv = arrival_dispersion(np.asarray(on_off), 1.0)
    assert bursty == max(smooth, capacity.batch_replicas(50.0, scv, PROFILE))
    assert bursty > smooth
    assert run(plain, context(plain, metrics(on_off), current=1)).desired == smooth


# -- scale-down: stabilization, N-1, bounded step -----------------------------------------------------


@dataclass
class Tick:
    t: float
    desired: int
    reason: Reason


def drive(
    p: SloPolicy, rate_at: Any, current: int, t_end: float, fc_at: Any = None, spec: ModelSpec = SPEC
) -> list[Tick]:
    """Call ``p`` through the rails every ``tick_s`` from t=0, the window filled with ``rate_at(t)``."""
    state: Any = p.initial_state(spec, current)
    window = ScaleDownState()
    out: list[Tick] = []
    t = 0.0
    while t <= t_end + 1e-9:
        fc = None if fc_at is None else fc_at(t)
        res = run(p, context(p, metrics(rate_at(t)), current, now=t, state=state, spec=spec, fc=fc), window)
        out.append(Tick(t, res.desired, res.reason))
        state, window, current = res.state, res.scale_down, res.desired
        t += p.tick_s
    return out


def test_scale_down_only_after_the_stabilization_window(fake_slo: list[Any]) -> None:
    p = SloPolicy(scale_down_stabilization_s=120.0)
    ticks = drive(p, lambda t: 100.0 if t < 50 else 20.0, current=10, t_end=200.0)  # recommends 10, then 2
    by_t = {tk.t: tk for tk in ticks}
    # The last "10" is at t=40: it holds the count until it leaves the 120 s window, at t=160.
    assert all(by_t[t].desired == 10 for t in by_t if t < 160)
    assert all(by_t[t].reason == Reason.STABILIZING for t in by_t if 50 <= t < 160)
    # Then down by at most half per tick: 10 -> 5 -> 3 -> 2 (the recommendation).
    assert [by_t[t].desired for t in (160.0, 170.0, 180.0, 190.0, 200.0)] == [5, 3, 2, 2, 2]
    assert by_t[160.0].reason == Reason.REACTIVE


def test_first_window_counts_as_current(fake_slo: list[Any]) -> None:
    # Before the controller has seen a whole window, it does not scale down: a restart must not shed.
    p = SloPolicy(scale_down_stabilization_s=120.0)
    ticks = drive(p, lambda t: 20.0, current=10, t_end=130.0)
    assert all(tk.desired == 10 and tk.reason == Reason.STABILIZING for tk in ticks if tk.t < 120)
    assert {tk.t: tk.desired for tk in ticks}[120.0] == 5


def test_scale_up_is_immediate_inside_the_window(fake_slo: list[Any]) -> None:
    p = SloPolicy()
    ticks = drive(p, lambda t: 20.0 if t < 30 else 60.0, current=2, t_end=40.0)
    assert [tk.desired for tk in ticks] == [2, 2, 2, 6, 6]


def test_a_short_dip_inside_the_window_sheds_nothing(fake_slo: list[Any]) -> None:
    p = SloPolicy(scale_down_stabilization_s=120.0)
    ticks = drive(p, lambda t: 20.0 if 200 <= t < 260 else 80.0, current=8, t_end=400.0)
    assert all(tk.desired == 8 for tk in ticks)


@pytest.mark.parametrize(
    ("current", "fraction", "expected"),
    [(10, 0.5, 5), (10, 0.1, 9), (10, 0.01, 9), (3, 0.5, 2), (2, 0.5, 1), (10, 1.0, 1), (40, 0.25, 30)],
)
def test_scale_down_is_bounded_per_tick_but_at_least_one(
    fake_slo: list[Any], current: int, fraction: float, expected: int
) -> None:
    p = SloPolicy(max_scale_down_fraction=fraction)
    res = run(p, context(p, metrics(0.0), current=current, fc=forecast((0.0, 0.0, 0.0))), SETTLED)
    assert res.desired == expected
    assert res.desired < current


def test_n_minus_1_holds_when_the_smaller_count_misses_at_the_stricter_quantile(fake_slo: list[Any]) -> None:
    p = SloPolicy()  # down_margin 0.5: the check sizes for 1 - (1 - 0.995) * 0.5 = 0.9975 -> 62.04 req/s: 7
    plan, check = fake_count(forecast().at(Q95)), fake_count(forecast().at(Q95_DOWN))
    assert (plan, check) == (6, 7)
    res = run(p, context(p, metrics(5.0), current=check, fc=forecast()), SETTLED)
    assert (res.desired, res.reason) == (check, Reason.N_MINUS_1)  # the plan (q 0.995 -> 56.02) says 6
    assert f"{check - 1} would miss the SLO at q{Q95_DOWN:.3g}" in res.detail
    # With one more replica the step down is taken, but only to what the stricter quantile needs.
    res = run(p, context(p, metrics(5.0), current=check + 1, fc=forecast()), SETTLED)
    assert (res.desired, res.reason) == (check, Reason.FORECAST)
    # down_margin 1: the check uses the sizing quantile itself, so 7 -> 6 goes through.
    same = SloPolicy(down_margin=1.0)
    res = run(same, context(same, metrics(5.0), current=check, fc=forecast()), SETTLED)
    assert (res.desired, res.reason) == (plan, Reason.FORECAST)


def test_n_minus_1_follows_the_sizing_quantile(fake_slo: list[Any]) -> None:
    p = SloPolicy(down_margin=0.1)
    # q 0.9: plan 30 -> 3; the check at 1 - 0.1 * 0.1 = 0.99 -> 50 -> 5: 5 replicas stay, 6 go to 5.
    res = run(p, context(p, metrics(5.0), current=5, fc=forecast(), q=0.9), SETTLED)
    assert (res.desired, res.reason) == (5, Reason.N_MINUS_1)
    res = run(p, context(p, metrics(5.0), current=6, fc=forecast(), q=0.9), SETTLED)
    assert res.desired == 5


def test_the_short_window_load_is_a_floor_under_scale_down(fake_slo: list[Any]) -> None:
    p = SloPolicy()
    # No forecast: the plan is the stable window (18.3 req/s -> 2) but the last 10 s ran at 60 req/s, which
    # 5 replicas would not carry. The panic count (6) is a floor even when not above the count in place: the
    # 6 in place stay (not a panic: they carry it), held by the floor before the N-1 check is reached.
    m = metrics([10.0] * 110 + [60.0] * 10)
    res = run(p, context(p, m, current=6), SETTLED)
    assert (res.desired, res.reason) == (6, Reason.STABLE)
    assert "short-window load 60.00" in res.detail
    res = run(p, context(p, m, current=9), SETTLED)
    assert (res.desired, res.reason) == (6, Reason.REACTIVE)
    res = run(p, context(p, m, current=4), SETTLED)
    assert (res.desired, res.reason) == (6, Reason.PANIC)  # below it, the same count is a panic


# -- error budget ----------------------------------------------------------------------------------------


def test_slo_burn_when_the_quantile_was_raised_and_the_budget_burns(fake_slo: list[Any]) -> None:
    p = SloPolicy()
    m = metrics(5.0)
    res = run(p, context(p, m, current=1, fc=forecast(), q=0.999, burn=2.0))
    # 0.999 -> 70 req/s: one more than at the initial 0.995 (56.02)
    assert (res.desired, res.reason) == (fake_count(forecast().at(0.999)), Reason.SLO_BURN) == (7, Reason.SLO_BURN)
    # Raised but no longer burning, or burning but not raised: a plain forecast decision.
    assert run(p, context(p, m, current=1, fc=forecast(), q=0.999, burn=0.9)).reason == Reason.FORECAST
    assert run(p, context(p, m, current=1, fc=forecast(), q=0.999, burn=1.0)).reason == Reason.FORECAST
    assert run(p, context(p, m, current=1, fc=forecast(), q=Q95, burn=3.0)).reason == Reason.FORECAST
    # "Raised" means above the initial quantile by more than 1e-6 (rounding in the logit round trip is not).
    assert run(p, context(p, m, current=1, fc=forecast(), q=Q95 + 5e-7, burn=3.0)).reason == Reason.FORECAST
    assert run(p, context(p, m, current=1, fc=forecast(), q=Q95 + 2e-6, burn=3.0)).reason == Reason.SLO_BURN
    assert run(p, context(p, m, current=1, fc=forecast(), q=Q95 + 5e-4, burn=3.0)).reason == Reason.SLO_BURN
    assert run(p, context(p, m, current=1, fc=forecast(), q=0.9, burn=3.0)).reason == Reason.FORECAST
    # The initial quantile is the SLO's: a p99.9 model starts higher and is not "raised" there.
    strict = SPEC.with_(slo_percentile=99.9)
    q999 = SloQuantile.initial(99.9)
    res = run(p, context(p, m, current=1, spec=strict, fc=forecast(), q=q999, burn=3.0))
    assert res.reason == Reason.FORECAST
    # A p99 model (initial 0.9978) raised to 0.999 while burning: SLO_BURN.
    p99 = SPEC.with_(slo_percentile=99.0)
    res = run(p, context(p, m, current=1, spec=p99, fc=forecast(), q=0.999, burn=3.0))
    assert res.reason == Reason.SLO_BURN


CEILING = 0.9999  # SloQuantile's default upper bound (its start is clipped lower, to 0.9995)


def test_slo_burn_is_reported_for_a_p99_slo_raised_to_the_ceiling(fake_slo: list[Any]) -> None:
    # With the learner's own numbers: a p99 model (initial 0.9978) missing every window rises to the 0.9999
    # ceiling, and that is reported as SLO_BURN.
    p = SloPolicy()
    p99 = SPEC.with_(slo_percentile=99.0)
    sq = SloQuantile(99.0, ticks_per_window=1)
    assert sq.quantile == pytest.approx(1 - 0.005 * math.sqrt(0.2)) and sq.quantile < CEILING
    for _ in range(200):
        sq.update(1000.0, 980.0)  # 2 % late against a 1 % allowance: every window missed
    assert sq.quantile == pytest.approx(CEILING) and sq.burn > 1.0
    res = run(p, context(p, metrics(5.0), current=1, spec=p99, fc=forecast(), q=sq.quantile, burn=sq.burn))
    # 0.9999: two decades beyond the top level (0.99 -> 50), 20 req/s each: 90 req/s -> 9
    assert (res.desired, res.reason) == (fake_count(forecast().at(CEILING)), Reason.SLO_BURN) == (9, Reason.SLO_BURN)


@pytest.mark.parametrize(
    ("slo", "start"),
    [
        (99.9, 1 - 0.005 * math.sqrt(0.02)),  # 0.99929: below the 0.9995 cap on the start
        (99.98, 0.9995),  # 0.99955 clipped to the cap, still below the ceiling
    ],
)
def test_a_strict_slo_starts_below_the_ceiling_and_is_reported_as_burn(
    fake_slo: list[Any], slo: float, start: float
) -> None:
    # A p99.9 model starts at 1 - 0.005 * sqrt(0.02) = 0.99929 (stricter ones at the 0.9995 cap), below the
    # 0.9999 ceiling, so the learner can raise it while the budget burns and the policy reports SLO_BURN.
    p = SloPolicy()
    strict = SPEC.with_(slo_percentile=slo)
    sq = SloQuantile(slo, ticks_per_window=1)
    assert sq.quantile == pytest.approx(start, abs=1e-12) == SloQuantile.initial(slo)
    assert sq.quantile < CEILING
    # Not raised yet: a plain forecast decision even while burning.
    res = run(p, context(p, metrics(5.0), current=1, spec=strict, fc=forecast(), q=sq.quantile, burn=3.0))
    assert (res.desired, res.reason) == (fake_count(forecast().at(start)), Reason.FORECAST)
    q1 = sq.update(1000.0, 990.0)  # 1 % late against a <= 0.1 % allowance: a missed window
    assert sq.burn > 1.0 and q1 > start + 1e-6  # raised above its start at once
    res = run(p, context(p, metrics(5.0), current=1, spec=strict, fc=forecast(), q=q1, burn=sq.burn))
    assert res.reason == Reason.SLO_BURN
    for _ in range(100):
        sq.update(1000.0, 990.0)  # every window missed
    assert sq.burn > 1.0 and sq.quantile == pytest.approx(CEILING)
    res = run(p, context(p, metrics(5.0), current=1, spec=strict, fc=forecast(), q=sq.quantile, burn=sq.burn))
    assert (res.desired, res.reason) == (fake_count(forecast().at(CEILING)), Reason.SLO_BURN) == (9, Reason.SLO_BURN)


# -- rails ------------------------------------------------------------------------------------------------


def test_stale_metrics_hold_the_replicas(fake_slo: list[Any]) -> None:
    p = SloPolicy()
    state, window = SloState(dispersion=2.0, dispersion_at=990.0), ScaleDownState(started_at=5.0, highs=((990.0, 4),))
    res = run(p, context(p, metrics(500.0, stale=True), current=3, state=state, fc=forecast()), window)
    assert (res.desired, res.reason, res.state) == (3, Reason.METRICS_STALE, state)
    # the hold enters the down window as the current count (issue 30), the rest of the window as it was
    assert res.scale_down == ScaleDownState(started_at=5.0, highs=((990.0, 4), (1000.0, 3)))
    assert res.arrival_scv is None  # nothing measured: the lend stage keeps what it had
    assert fake_slo == []  # the policy itself did not run
    empty = ModelMetrics(rate=np.zeros(0), in_flight=np.zeros(0), stale=True)
    res = run(p, context(p, empty, current=0, spec=SPEC.with_(min_replicas=2)))
    assert (res.desired, res.reason) == (2, Reason.METRICS_STALE)


def test_rails_clamp_to_min_and_max(fake_slo: list[Any]) -> None:
    p = SloPolicy()
    spec = SPEC.with_(min_replicas=2, max_replicas=5)
    res = run(p, context(p, metrics(500.0), current=3, spec=spec, fc=forecast()))
    assert (res.desired, res.reason) == (5, Reason.BOUNDS)
    all_at_once = SloPolicy(max_scale_down_fraction=1.0)
    res = run(all_at_once, context(all_at_once, metrics(0.0), current=5, spec=spec), SETTLED)
    assert (res.desired, res.reason, res.detail) == (2, Reason.BOUNDS, "wanted 0")


def test_state_keeps_only_the_window_as_a_monotone_queue(fake_slo: list[Any]) -> None:
    p = SloPolicy(scale_down_stabilization_s=100.0)
    state: Any = p.initial_state(SPEC, 1)
    window = ScaleDownState()
    current = 1
    for t, rate in [(0.0, 50.0), (10.0, 80.0), (20.0, 30.0), (30.0, 40.0), (40.0, 10.0)]:
        res = run(p, context(p, metrics(rate), current, now=t, state=state), window)
        state, window, current = res.state, res.scale_down, res.desired
    assert window.started_at == 0.0
    assert window.highs == ((10.0, 8), (30.0, 4), (40.0, 1))
    res = run(p, context(p, metrics(10.0), current, now=111.0, state=state), window)
    assert res.scale_down.highs == ((30.0, 4), (111.0, 1))
    assert res.desired == 4


# -- the decision core's learning (ModelLearning) -------------------------------------------------------


@dataclass
class Recorder:
    """A policy that learns and uses the forecast, keeps the count, and records every context."""

    learns: bool = True
    uses_forecast: bool = True
    name: str = "recorder"
    tick_s: float = 10.0
    instant_start: bool = False
    behavior: ScalingBehavior | None = None
    seen: list[PolicyContext] = field(default_factory=list)

    def initial_state(self, spec: ModelSpec, replicas: int) -> None:
        return None

    def decide(self, ctx: PolicyContext) -> PolicyResult:
        self.seen.append(ctx)
        return PolicyResult(ctx.current_replicas, None, Reason.STABLE)


def _first_whole(inv: Inventory) -> Slot:
    slot = FirstFitPacker().place(inv, slot_request(LEARN_SPEC))
    assert slot is not None
    return slot


LEARN_SPEC = ModelSpec(name="l", cold_start_s=60.0, slo_percentile=99.0, expected_rps=5.0)


def _tick(policy: Recorder, state: Any, now: float, ready: bool, metric_lag_s: float) -> Any:
    inv = Inventory.from_nodes(nodes_from_spec("2xH100-80GB"))
    slot = _first_whole(inv)
    inv.allocate(slot, "l-0")
    rep = Replica("l-0", slot, ready=ready, started_at=0.0)
    snap = ClusterSnapshot(now=now, models={"l": ModelObservation("l", LEARN_SPEC, 1, (rep,))}, inventory=inv)
    win = MetricsWindow(
        now=now, step_s=10.0, models={"l": ModelMetrics(rate=np.full(30, 5.0), in_flight=np.full(30, 0.5))}
    )
    return decide(snap, win, state, CoreConfig(policy=policy, metric_lag_s=metric_lag_s)).state  # type: ignore[arg-type]


@pytest.mark.parametrize("learns", [True, False])
def test_core_learns_the_lead_time_from_a_slow_cold_start(learns: bool) -> None:
    policy = Recorder(learns=learns)
    state = fresh_state()
    for now, ready in [(10.0, False), (20.0, False), (150.0, True), (160.0, True)]:
        state = _tick(policy, state, now, ready, metric_lag_s=5.0)
    assert [c.now for c in policy.seen] == [10.0, 20.0, 150.0, 160.0]
    assert all(c.forecast is not None for c in policy.seen)
    horizons = [c.forecast.horizon_s for c in policy.seen if c.forecast is not None]
    tick, lag = policy.tick_s, 5.0
    if not learns:
        # Without learning: the annotation's cold start, whatever was observed; no sizing quantile.
        assert horizons == [60.0 + tick + lag] * 4
        assert all(c.sizing_quantile is None and c.burn == 0.0 for c in policy.seen)
        assert state.models["l"].learning is None
        return
    # Before any start was measured: the prior (the annotation). The replica placed at t=0 is seen Ready
    # at t=150: one slow start is remembered as the lead (a 150 s start can happen again).
    assert horizons == [60.0 + tick + lag] * 2 + [150.0 + tick + lag] * 2
    learning = state.models["l"].learning
    assert learning is not None and learning.cold_start.lead_s == 150.0 and learning.cold_start.count == 1
    first = policy.seen[0]
    assert first.sizing_quantile == pytest.approx(SloQuantile.initial(99.0))
    assert first.burn == pytest.approx(1.0)  # no window judged yet: the prior, exactly on budget
    assert first.capacity.slo_s == pytest.approx(LEARN_SPEC.slo_latency_s)



@pytest.fixture(autouse=True)
def _exact_rates(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """The tests above size exact rates (a fake capacity curve with integer boundaries); the 0.5 % grid
    the policy rounds loads up to is tested on its own."""
    if "quantize" not in request.node.name:
        monkeypatch.setattr(slo_module, "quantize_up", lambda rate: rate)


@settings(max_examples=200, deadline=None)
@given(st.floats(1e-6, 1e9))
def test_quantize_rounds_up_by_at_most_half_a_percent(rate: float) -> None:
    q = capacity.quantize_up(rate)
    assert rate * (1 - 1e-9) <= q <= rate * 1.005 * (1 + 1e-9)
    assert capacity.quantize_up(q) == pytest.approx(q, rel=1e-12)


@settings(max_examples=60, deadline=None)
@given(median=st.floats(0.01, 1e4), spread=st.floats(0.0, 1e4), q=st.sampled_from([0.6, 0.9, 0.99, 0.995, 0.999]))
def test_intensity_quantile_lies_between_the_median_and_the_raw_quantile(
    median: float, spread: float, q: float
) -> None:
    fc = Forecast(quantiles=(0.5, q), values=np.array([median, median + spread]), horizon_s=60.0)
    value = intensity_quantile(fc, q, FORECAST_STEP_S)
    assert median - 1e-9 <= value <= median + spread + 1e-9
    # all Poisson noise (spread no wider than z sd of a minute's count): the intensity is the median
    z = NormalDist().inv_cdf(q)
    if spread <= z * math.sqrt(median / FORECAST_STEP_S):
        assert value == pytest.approx(median)


def test_a_quiet_window_lowers_the_burst_the_model_is_sized_for_only_slowly() -> None:
    on_off = list(np.tile([100.0] * 5 + [0.0] * 5, 12))
    scv = arrival_dispersion(np.asarray(on_off), 1.0)
    p = SloPolicy(burst_memory_s=3600.0)
    first = run(p, context(p, metrics(on_off), current=5, now=1000.0))
    assert first.arrival_scv == scv
    # an hour later, after a smooth window: half of the excess over Poisson is remembered
    later = run(p, context(p, metrics(50.0), current=5, now=4600.0, state=first.state))
    assert later.arrival_scv == pytest.approx(1.0 + (scv - 1.0) / 2.0)
    # no memory: the smooth window is all there is
    forget = SloPolicy(burst_memory_s=1e-9)
    first = run(forget, context(forget, metrics(on_off), current=5, now=1000.0))
    assert run(forget, context(forget, metrics(50.0), current=5, now=1060.0, state=first.state)).arrival_scv == 1.0


# -- over the lead time (issue 28) ---------------------------------------------------------------------------


def test_a_burst_is_charged_as_a_batch_on_the_expected_load_not_on_the_upper_quantile(
        monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[float, float]] = []
    real = capacity.batch_replicas

    def spy(rate: float, batch: float, profile: ServiceProfile) -> int:
        seen.append((rate, batch))
        return real(rate, batch, profile)

    monkeypatch.setattr(capacity, "batch_replicas", spy)
    p = SloPolicy()
    bursty = [0.0] * 50 + [60.0] * 5 + [0.0] * 60 + [60.0] * 5  # 10-sample bursts: dispersion far above Poisson
    fc = forecast((3.0, 20.0, 40.0))
    run(p, context(p, metrics(bursty), current=3, fc=fc, state=SloState()))
    stable = float(np.mean(bursty[-60:]))
    rate, batch = seen[0]
    assert batch > 2.0
    assert rate == pytest.approx(max(3.0, stable)) and rate < fc.at(Q95)


def test_scale_down_keeps_the_batch_of_the_largest_burst_within_the_burst_memory() -> None:
    p = SloPolicy(scale_down_stabilization_s=0.0)
    quiet = metrics(2.0)  # a window without a burst: measured dispersion 1, faded one low
    fc = forecast((2.0, 2.5, 3.0))
    faded = SloState(dispersion=4.0, dispersion_at=990.0, peak=1.0, peak_at=900.0)
    held = SloState(dispersion=4.0, dispersion_at=990.0, peak=200.0, peak_at=900.0)
    down = run(p, context(p, quiet, current=30, fc=fc, state=faded), SETTLED)
    keep = run(p, context(p, quiet, current=30, fc=fc, state=held), SETTLED)
    floor = capacity.batch_replicas(2.0, 200.0, PROFILE)
    assert keep.desired >= min(floor, 30) > down.desired
    # past the burst memory the peak is measured again: the window's own (no burst) replaces it
    later = run(p, context(p, quiet, current=30, fc=fc, state=held, now=900.0 + p.burst_memory_s + 61.0), SETTLED)
    assert later.desired == down.desired
