"""Behaviour of the Dynamo-Planner-like ``predictive`` baseline (a point forecast, throughput sizing).

``drive`` plays a request-rate schedule through the policy once per adjustment interval, with 1 s rate
samples over a 600 s window (as the simulator's metrics ring holds) and the replicas it asks for in force at
once (cold start is the simulator's business).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from autoscaler.api.plan import Reason
from autoscaler.api.snapshot import ModelMetrics
from autoscaler.api.spec import ModelSpec
from autoscaler.decision.scaledown import normalize
from autoscaler.estimation.capacity import ServiceProfile, profile_from_spec
from autoscaler.policies import POLICIES, PredictivePolicy, PredictiveState, make_policy
from autoscaler.policies.base import PolicyContext, replicas_for_load
from autoscaler.policies.predictive import throughput_per_replica

# 1 / 0.1 s = 10 req/s per replica; 7 req/s at the default 70 %.
SPEC = ModelSpec(name="m", concurrency=1, service_time_ms=100.0, min_replicas=1, max_replicas=1000)


def profile(mean_s: float, concurrency: int) -> ServiceProfile:
    occ = mean_s * np.linspace(0.5, 1.5, 8)  # a spread around the mean, as a measured profile has
    return ServiceProfile(occupancy_s=occ, latency_part_s=occ, concurrency=concurrency, slo_s=10.0, percentile=95.0)


PROFILE = profile(0.1, 1)
WINDOW_S = 600


def context(
    policy: PredictivePolicy,
    rate: np.ndarray,
    current: int,
    now: float = 1000.0,
    state: Any = None,
    spec: ModelSpec = SPEC,
    step_s: float = 1.0,
    stale: bool = False,
    capacity: ServiceProfile | None = None,
) -> PolicyContext:
    m = ModelMetrics(rate=np.asarray(rate, dtype=float), in_flight=np.zeros(len(rate)), stale=stale)
    return PolicyContext(
        now=now,
        spec=spec,
        current_replicas=current,
        ready_replicas=current,
        metrics=m,
        metrics_step_s=step_s,
        forecast=None,
        capacity=(PROFILE if spec is SPEC else profile_from_spec(spec)) if capacity is None else capacity,
        state=policy.initial_state(spec, current) if state is None else state,
    )


@dataclass
class Tick:
    t: float
    desired: int
    reason: Reason
    detail: str


def drive(
    policy: PredictivePolicy, load: Callable[[np.ndarray], np.ndarray], t_end: float, replicas: int = 1
) -> list[Tick]:
    """Decide every ``tick_s`` from t = ``tick_s`` with 1 s samples of ``load(t)`` (vectorised) in the window."""
    state = policy.initial_state(SPEC, replicas)
    current, ticks = replicas, []
    t = policy.tick_s
    while t <= t_end + 1e-9:
        times = np.arange(max(0.0, t - WINDOW_S) + 1, t + 1)
        res = normalize(policy, context(policy, load(times), current, now=t, state=state))
        ticks.append(Tick(t, res.desired, res.reason, res.detail))
        state, current = res.state, res.desired
        t += policy.tick_s
    return ticks


def next_interval_mean(load: Callable[[np.ndarray], np.ndarray], t: float, interval: float) -> float:
    return float(load(np.arange(t + 1, t + interval + 1)).mean())


def ramp(times: np.ndarray) -> np.ndarray:
    return 0.05 * times  # +9 req/s per 180 s interval: more than one replica's 7 req/s


# ------------------------------------------------------------------------------------------------ forecasting


def test_holt_follows_a_linear_ramp_ahead_of_last_value() -> None:
    holt, last = PredictivePolicy(predictor="holt"), PredictivePolicy(predictor="constant")
    h_ticks, c_ticks = drive(holt, ramp, 3600.0), drive(last, ramp, 3600.0)
    behind_last = behind_holt = 0
    for h, c in zip(h_ticks[1:], c_ticks[1:], strict=True):  # from the second interval Holt has a trend
        needed = replicas_for_load(next_interval_mean(ramp, h.t, 180.0), SPEC, 0.7)
        assert h.desired >= c.desired
        assert h.desired == needed, (h.t, h.detail)  # an exact ramp is forecast exactly
        assert h.reason in (Reason.FORECAST, Reason.STABLE)
        behind_holt += h.desired < needed
        behind_last += c.desired < needed
    assert behind_holt == 0
    assert behind_last == len(c_ticks) - 1, "last value is always one interval behind a steep ramp"


def test_kalman_learns_the_ramp_trend() -> None:
    kalman, last = PredictivePolicy(predictor="kalman"), PredictivePolicy(predictor="constant")
    k_ticks, c_ticks = drive(kalman, ramp, 3600.0), drive(last, ramp, 3600.0)
    # After a few intervals the filter's trend has converged: it provisions for the next interval, ahead of
    # the last value.
    for k, c in list(zip(k_ticks, c_ticks, strict=True))[5:]:
        needed = replicas_for_load(next_interval_mean(ramp, k.t, 180.0), SPEC, 0.7)
        assert k.desired > c.desired
        assert abs(k.desired - needed) <= 1, (k.t, k.detail)


@pytest.mark.parametrize("predictor", ["holt", "kalman", "constant"])
def test_each_predictor_sizes_for_the_first_observation(predictor: str) -> None:
    policy = PredictivePolicy(predictor=predictor)
    res = policy.decide(context(policy, np.full(600, 30.0), current=1))
    assert res.desired == math.ceil(30.0 / 7.0)
    assert res.reason is Reason.FORECAST
    assert isinstance(res.state, PredictiveState) and res.state.observations == 1
    assert predictor in res.detail and "forecast 30.00" in res.detail and "observed 30.00" in res.detail


@pytest.mark.parametrize("predictor", ["holt", "kalman", "constant"])
def test_holds_on_flat_load(predictor: str) -> None:
    rng = np.random.default_rng(3)

    def flat(times: np.ndarray) -> np.ndarray:
        return 10.0 + rng.uniform(-1.0, 1.0, size=len(times))

    ticks = drive(PredictivePolicy(predictor=predictor), flat, 7200.0, replicas=2)
    assert {t.desired for t in ticks} == {2}  # 10 req/s / 7 req/s per replica
    assert {t.reason for t in ticks} == {Reason.STABLE}


@pytest.mark.parametrize("predictor", ["holt", "kalman", "constant"])
def test_follows_a_step_down_within_a_few_intervals(predictor: str) -> None:
    def step(times: np.ndarray) -> np.ndarray:
        return np.where(times <= 1800, 70.0, 6.0)

    ticks = drive(PredictivePolicy(predictor=predictor), step, 5400.0, replicas=10)
    assert ticks[0].desired == 10
    assert ticks[-1].desired == 1
    assert all(t.desired >= 1 for t in ticks)


# ------------------------------------------------------------------------------------------------ sizing


def test_lower_target_utilization_means_more_replicas() -> None:
    counts = []
    for target in (0.4, 0.5, 0.7, 0.9):
        policy = PredictivePolicy(target_utilization=target)
        counts.append(policy.decide(context(policy, np.full(600, 30.0), current=1)).desired)
    assert counts == [8, 6, 5, 4]  # ceil(30 / (10 × target))


def test_without_a_measured_profile_the_spec_prior_is_replicas_for_load() -> None:
    spec = SPEC.with_(concurrency=4, service_time_ms=2000.0)  # 2 req/s per replica, 1 at 50 %
    policy = PredictivePolicy(target_utilization=0.5)
    ctx = context(policy, np.full(600, 5.0), current=1, spec=spec)  # capacity = profile_from_spec(spec)
    assert throughput_per_replica(ctx) == pytest.approx(2.0)
    assert policy.decide(ctx).desired == 5 == replicas_for_load(5.0, spec, 0.5)


def test_throughput_comes_from_the_profile_not_an_unused_service_time() -> None:
    # A token-priced LLM spec: service_time_ms is the unused 100 ms default, a request really takes ~4 s.
    spec = SPEC.with_(concurrency=8, prefill_ms_per_1k_tokens=150.0, decode_ms_per_token=20.0)
    policy = PredictivePolicy(target_utilization=0.5)
    ctx = context(policy, np.full(600, 10.0), current=1, spec=spec, capacity=profile(4.0, 8))
    assert throughput_per_replica(ctx) == pytest.approx(2.0)  # 8 slots / 4 s
    res = policy.decide(ctx)
    assert res.desired == 10  # 10 req/s / (2 req/s × 50 %)
    assert "1.00 req/s/replica at 50%" in res.detail


def test_only_the_last_interval_is_observed() -> None:
    policy = PredictivePolicy(predictor="constant")
    rate = np.concatenate([np.full(420, 1000.0), np.full(180, 14.5)])
    res = policy.decide(context(policy, rate, current=1))
    assert res.desired == 3 and "observed 14.50" in res.detail


def test_min_endpoint_is_the_floor_at_zero_load() -> None:
    spec = SPEC.with_(min_replicas=0)
    policy = PredictivePolicy()
    assert normalize(policy, context(policy, np.zeros(600), current=3, spec=spec)).desired == 1
    policy = PredictivePolicy(min_endpoint=0)
    assert normalize(policy, context(policy, np.zeros(600), current=3, spec=spec)).desired == 0
    policy = PredictivePolicy(min_endpoint=2)
    assert normalize(policy, context(policy, np.zeros(600), current=3, spec=spec)).desired == 2


def test_max_replicas_clamped_by_the_rails() -> None:
    policy = PredictivePolicy()
    res = normalize(policy, context(policy, np.full(600, 1000.0), current=1, spec=SPEC.with_(max_replicas=5)))
    assert res.desired == 5 and res.reason is Reason.BOUNDS and "wanted 143" in res.detail


def test_negative_forecast_is_zero_load() -> None:
    policy = PredictivePolicy(predictor="holt", min_endpoint=0)
    state = policy.decide(context(policy, np.full(600, 50.0), current=8)).state
    res = policy.decide(context(policy, np.full(600, 1.0), current=8, state=state))  # trend -49: forecast < 0
    assert res.desired == 0 and "forecast 0.00" in res.detail


# ------------------------------------------------------------------------------------------------ missing data


def test_nan_samples_are_ignored() -> None:
    policy = PredictivePolicy(predictor="constant")
    rate = np.full(600, 14.5)
    rate[-180::2] = np.nan
    res = policy.decide(context(policy, rate, current=1))
    assert res.desired == 3 and "observed 14.50" in res.detail


@pytest.mark.parametrize("predictor", ["holt", "kalman", "constant"])
def test_an_interval_without_data_holds_and_does_not_feed_the_predictor(predictor: str) -> None:
    policy = PredictivePolicy(predictor=predictor)
    state = policy.decide(context(policy, np.full(600, 30.0), current=1)).state
    rate = np.full(600, 30.0)
    rate[-180:] = np.nan
    res = policy.decide(context(policy, rate, current=5, state=state))
    assert res.desired == 5 and res.reason is Reason.METRICS_STALE and res.state == state


def test_stale_metrics_hold_through_the_rails() -> None:
    policy = PredictivePolicy()
    res = normalize(policy, context(policy, np.zeros(600), current=4, stale=True))
    assert res.desired == 4 and res.reason is Reason.METRICS_STALE


# ------------------------------------------------------------------------------------------------ knobs, registry


@pytest.mark.parametrize(
    ("knobs", "match"),
    [
        ({"target_utilization": 0.0}, "target_utilization"),
        ({"target_utilization": 1.5}, "target_utilization"),
        ({"target_utilization": float("nan")}, "target_utilization"),
        ({"adjustment_interval_s": 0.0}, "adjustment_interval_s"),
        ({"adjustment_interval_s": float("inf")}, "adjustment_interval_s"),
        ({"predictor": "arima"}, "holt, kalman, constant"),
        ({"min_endpoint": -1}, "min_endpoint"),
        ({"min_endpoint": 1.5}, "min_endpoint"),
        ({"min_endpoint": True}, "min_endpoint"),
    ],
)
def test_bad_knobs_are_value_errors(knobs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        PredictivePolicy(**knobs)


def test_adjustment_interval_is_the_tick() -> None:
    policy = PredictivePolicy(adjustment_interval_s=60.0)
    assert policy.tick_s == 60.0
    assert PredictivePolicy().tick_s == 180.0


def test_registered() -> None:
    assert POLICIES["predictive"] is PredictivePolicy
    policy = make_policy("predictive", target_utilization=0.5)
    assert isinstance(policy, PredictivePolicy)
    assert policy.name == "predictive" and policy.target_utilization == 0.5
    assert policy.uses_forecast is False and policy.instant_start is False and policy.tick_s == 180.0
    with pytest.raises(ValueError, match="no knob"):
        make_policy("predictive", quantile=0.9)
