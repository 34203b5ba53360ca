"""KV-cache saturation in the rails (autoscaler/decision/scaledown.py ``_kv_rail``; issue 17 item 3).

While the engines report KV-cache use at or above ``CoreConfig.kv_saturation`` (0.9 by default), no policy scales the
model down, and a growing queue adds one replica at a time once every replica is ready. A window without a KV gauge
(NaN) changes nothing. The real-Prometheus side (the KV gauge of vLLM- and SGLang-named servers read and acted on) is
tests/live/test_prometheus_engines.py.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autoscaler.api.plan import Reason, RemoveReplica, ScaleModel
from autoscaler.api.snapshot import ClusterSnapshot, MetricsWindow, ModelMetrics, ModelObservation, Replica
from autoscaler.api.spec import ModelSpec, slot_request
from autoscaler.decision.config import CoreConfig, build_core
from autoscaler.decision.core import decide
from autoscaler.decision.scaledown import DEFAULT_KV_SATURATION, ScaleDownState, normalize
from autoscaler.decision.state import fresh_state
from autoscaler.estimation.capacity import profile_from_spec
from autoscaler.policies import make_policy
from autoscaler.policies.base import PolicyContext, PolicyResult, ScalingBehavior
from sharing.cluster import nodes_from_spec
from sharing.packer import FirstFitPacker
from sharing.slots import Inventory

SPEC = ModelSpec(name="m", min_replicas=1, max_replicas=40)
SLOTWISE_LIKE = ScalingBehavior(stabilization_s=120.0, warm_up=True, step_fraction=0.5, n_minus_1=True)
SETTLED = ScaleDownState(started_at=0.0)
STEP = 10.0


class Scripted:
    """Recommends ``wants`` under ``behavior``."""

    name, tick_s, instant_start, uses_forecast, learns = "scripted", 10.0, False, False, False

    def __init__(self, behavior: ScalingBehavior | None, wants: int, reason: Reason = Reason.FORECAST) -> None:
        self.behavior, self.wants, self.reason = behavior, wants, reason

    def initial_state(self, spec: ModelSpec, replicas: int) -> int:
        return 0

    def decide(self, ctx: PolicyContext) -> PolicyResult:
        return PolicyResult(self.wants, (ctx.state or 0) + 1, self.reason, "scripted")


def metrics(kv: float = math.nan, queue: float = 0.0, in_flight: list[float] | None = None) -> ModelMetrics:
    f = np.asarray(in_flight if in_flight is not None else [4.0] * 12, dtype=float)
    return ModelMetrics(rate=np.full(f.size, 5.0), in_flight=f, queue_depth=queue, kv_cache_usage=kv)


GROWING = {"queue": 6.0, "in_flight": [4.0] * 10 + [8.0, 10.0]}  # queued, and more than a decision (10 s) ago


def ctx(current: int, m: ModelMetrics, *, ready: int | None = None, now: float = 1000.0, spec: ModelSpec = SPEC,
        state=0) -> PolicyContext:  # type: ignore[no-untyped-def]
    return PolicyContext(now=now, spec=spec, current_replicas=current,
                         ready_replicas=current if ready is None else ready, metrics=m, metrics_step_s=STEP,
                         forecast=None, capacity=profile_from_spec(spec), state=state)


# -- no scale-down while saturated --------------------------------------------------------------------------


@pytest.mark.parametrize("behavior", [None, SLOTWISE_LIKE])
def test_a_saturated_kv_cache_holds_a_scale_down(behavior: ScalingBehavior | None) -> None:
    p = Scripted(behavior, wants=2)
    w = SETTLED if behavior is None else ScaleDownState(started_at=0.0, highs=((990.0, 2),))
    assert normalize(p, ctx(4, metrics()), w).desired < 4  # the same recommendation without a KV gauge: down
    res = normalize(p, ctx(4, metrics(kv=0.95)), w)
    assert (res.desired, res.reason) == (4, Reason.KV_SATURATED)
    assert "KV cache 95% >= 90%" in res.detail
    assert res.state == 1  # the metrics are whole: the policy's state advances
    at_threshold = normalize(p, ctx(4, metrics(kv=DEFAULT_KV_SATURATION)), w)
    assert at_threshold.desired == 4  # "at or above"


def test_below_the_threshold_or_without_a_gauge_nothing_changes() -> None:
    p = Scripted(SLOTWISE_LIKE, wants=2)
    w = ScaleDownState(started_at=0.0, highs=((990.0, 2),))
    base = normalize(p, ctx(4, metrics(**GROWING)), w, kv_saturation=None)  # no KV rail at all
    for kv in (math.nan, 0.0, 0.5, 0.899):
        res = normalize(p, ctx(4, metrics(kv=kv, **GROWING)), w)
        assert (res.desired, res.reason, res.detail) == (base.desired, base.reason, base.detail)
        assert res.scale_down == base.scale_down


def test_the_threshold_is_a_setting() -> None:
    p = Scripted(None, wants=2)
    assert normalize(p, ctx(4, metrics(kv=0.8)), SETTLED, kv_saturation=0.75).desired == 4
    assert normalize(p, ctx(4, metrics(kv=0.99)), SETTLED, kv_saturation=None).desired == 2  # off
    assert CoreConfig(policy=p).kv_saturation == DEFAULT_KV_SATURATION == 0.9  # type: ignore[arg-type]
    assert build_core(p, kv_saturation=0.8).kv_saturation == 0.8  # type: ignore[arg-type]
    for bad in (0.0, 1.5, -0.1):
        with pytest.raises(ValueError, match="kv_saturation"):
            CoreConfig(policy=p, kv_saturation=bad)  # type: ignore[arg-type]


def test_the_bounds_still_win() -> None:
    # over max replicas (the spec lowered): down to the max, saturated or not
    res = normalize(Scripted(None, wants=2), ctx(8, metrics(kv=0.99), spec=SPEC.with_(max_replicas=5)), SETTLED)
    assert res.desired == 5


def test_after_a_saturated_hold_a_scale_down_waits_a_whole_window() -> None:
    p = Scripted(SLOTWISE_LIKE, wants=2)
    w = SETTLED
    for t in (1000.0, 1010.0, 1020.0):
        res = normalize(p, ctx(8, metrics(kv=0.97), now=t), w)
        assert res.desired == 8
        w = res.scale_down
    assert normalize(p, ctx(8, metrics(kv=0.5), now=1030.0), w).desired == 8  # the cache drained: the window holds
    assert normalize(p, ctx(8, metrics(kv=0.5), now=1020.0 + SLOTWISE_LIKE.stabilization_s + 1), w).desired < 8


# -- one more replica while saturated and queueing ------------------------------------------------------------


def test_saturated_and_queueing_adds_one_replica_and_only_then() -> None:
    p = Scripted(None, wants=4)
    res = normalize(p, ctx(4, metrics(kv=0.95, **GROWING)), SETTLED)
    assert (res.desired, res.reason) == (5, Reason.KV_SATURATED)
    assert "the queue grows" in res.detail
    flat = {"queue": 6.0, "in_flight": [9.0] * 12}
    assert normalize(p, ctx(4, metrics(kv=0.95, **flat)), SETTLED).desired == 4  # a queue, not growing
    assert normalize(p, ctx(4, metrics(kv=0.95, queue=0.0, in_flight=GROWING["in_flight"])), SETTLED).desired == 4
    # one replica still starting: its capacity is on the way, no second cold start stacked on it
    assert normalize(p, ctx(4, metrics(kv=0.95, **GROWING), ready=3), SETTLED).desired == 4
    at_max = SPEC.with_(max_replicas=4)
    assert normalize(p, ctx(4, metrics(kv=0.95, **GROWING), spec=at_max), SETTLED).desired == 4
    # the policy already scales up further: its count stands
    res = normalize(Scripted(None, wants=9), ctx(4, metrics(kv=0.95, **GROWING)), SETTLED)
    assert (res.desired, res.reason) == (9, Reason.FORECAST)
    # a fixed count and the clairvoyant oracle are left alone, both ways
    for reason in (Reason.STATIC, Reason.ORACLE):
        fixed = Scripted(None, wants=2, reason=reason)
        assert normalize(fixed, ctx(4, metrics(kv=0.99, **GROWING)), SETTLED).desired == 2
        fixed.wants = 4
        assert normalize(fixed, ctx(4, metrics(kv=0.99, **GROWING)), SETTLED).desired == 4


def test_the_extra_replica_is_not_taken_back_on_the_next_dip() -> None:
    p = Scripted(SLOTWISE_LIKE, wants=4)
    w = ScaleDownState(started_at=0.0)
    res = normalize(p, ctx(4, metrics(kv=0.95, **GROWING), now=1000.0), w)
    assert res.desired == 5
    after = normalize(p, ctx(5, metrics(kv=0.85), now=1010.0), res.scale_down)
    assert after.desired == 5  # the +1 sits in the down window like a recommendation


# -- through decide ---------------------------------------------------------------------------------------------


def _fleet(n: int) -> ClusterSnapshot:
    spec = ModelSpec(name="a", slo_latency_ms=1000, max_replicas=50)
    inv = Inventory.from_nodes(nodes_from_spec("8xH100-80GB:mig"))
    replicas = []
    for i in range(n):
        slot = FirstFitPacker().place(inv, slot_request(spec))
        assert slot is not None
        inv.allocate(slot, f"a-{i}")
        replicas.append(Replica(f"a-{i}", slot, ready=True, started_at=0.0))
    model = ModelObservation("a", spec, desired_replicas=n, replicas=tuple(replicas))
    return ClusterSnapshot(now=100.0, models={"a": model}, inventory=inv)


def test_through_decide_a_saturated_model_emits_no_scale_down() -> None:
    snap = _fleet(3)
    config = CoreConfig(policy=Scripted(None, wants=1))  # type: ignore[arg-type]
    saturated = MetricsWindow(now=100.0, step_s=STEP, models={"a": metrics(kv=0.96)})
    d = decide(snap, saturated, fresh_state(), config)
    assert d.plan.decisions["a"] is Reason.KV_SATURATED
    assert not d.plan.of_type(ScaleModel) and not d.plan.of_type(RemoveReplica)
    drained = MetricsWindow(now=100.0, step_s=STEP, models={"a": metrics(kv=0.3)})
    d = decide(snap, drained, fresh_state(), config)
    assert [a.replicas for a in d.plan.of_type(ScaleModel)] == [1]



def test_through_decide_the_threshold_setting_is_the_one_used() -> None:
    """CoreConfig.kv_saturation reaches the rail through decide: None switches it off, 0.98 lets 0.96 pass."""
    snap = _fleet(3)
    saturated = MetricsWindow(now=100.0, step_s=STEP, models={"a": metrics(kv=0.96)})
    for threshold in (None, 0.98):
        config = CoreConfig(policy=Scripted(None, wants=1), kv_saturation=threshold)  # type: ignore[arg-type]
        d = decide(snap, saturated, fresh_state(), config)
        assert [a.replicas for a in d.plan.of_type(ScaleModel)] == [1], threshold

# -- the property -----------------------------------------------------------------------------------------------

POLICY_NAMES = ["slotwise", "hpa", "kpa", "predictive"]
_sample = st.one_of(st.floats(0.0, 500.0), st.just(math.nan))


@st.composite
def saturated_windows(draw: st.DrawFn) -> ModelMetrics:
    n = draw(st.integers(1, 30))
    rate = np.array(draw(st.lists(st.floats(0.0, 500.0), min_size=n, max_size=n)), dtype=float)
    in_flight = np.array(draw(st.lists(_sample, min_size=n, max_size=n)), dtype=float)
    return ModelMetrics(rate=rate, in_flight=in_flight, queue_depth=draw(st.floats(0.0, 100.0)),
                        kv_cache_usage=draw(st.floats(DEFAULT_KV_SATURATION, 1.0)))


@settings(max_examples=120, deadline=None)
@given(which=st.sampled_from(POLICY_NAMES), ticks=st.lists(saturated_windows(), min_size=1, max_size=6),
       current=st.integers(0, 60), lo=st.integers(0, 10), hi=st.integers(10, 60))
def test_whatever_the_policy_a_saturated_model_never_goes_down(
    which: str, ticks: list[ModelMetrics], current: int, lo: int, hi: int
) -> None:
    spec = ModelSpec(name="m", min_replicas=lo, max_replicas=hi)
    policy = make_policy(which)
    state, window = policy.initial_state(spec, current), ScaleDownState(started_at=0.0)
    for i, m in enumerate(ticks):
        res = normalize(policy, ctx(current, m, now=1000.0 + 10.0 * i, spec=spec, state=state), window)
        assert res.desired >= min(max(current, lo), hi), (which, m, current, res)
        assert lo <= res.desired <= hi
        state, window, current = res.state, res.scale_down, res.desired


@settings(max_examples=120, deadline=None)
@given(which=st.sampled_from(POLICY_NAMES), m=saturated_windows(), current=st.integers(0, 60))
def test_without_a_kv_gauge_every_policy_decides_as_before(which: str, m: ModelMetrics, current: int) -> None:
    policy = make_policy(which)
    blind = replace(m, kv_cache_usage=math.nan)
    c = ctx(current, blind, state=policy.initial_state(SPEC, current))
    with_rail, without = normalize(policy, c, SETTLED), normalize(policy, c, SETTLED, kv_saturation=None)
    assert (with_rail.desired, with_rail.reason, with_rail.detail) == (without.desired, without.reason,
                                                                        without.detail)


# -- the simulator's window -------------------------------------------------------------------------------------


def test_the_simulators_window_carries_the_kv_it_is_given_and_nan_otherwise() -> None:
    from autoscaler.sim.metrics import SimMetrics

    sim = SimMetrics(["a", "b"], step_s=STEP, size=6)
    ones = np.ones(2)
    sim.push(ones, ones, np.full(2, 0.1))
    assert all(math.isnan(m.kv_cache_usage) for m in sim.window(10.0).models.values())  # not simulated: no effect
    sim.push(ones, ones, np.full(2, 0.1), kv_cache=np.array([0.97, 0.2]))
    w = sim.window(20.0)
    assert (w.models["a"].kv_cache_usage, w.models["b"].kv_cache_usage) == (0.97, 0.2)
    # what the simulated engine reports is acted on like a live one's
    d = decide(_fleet(3), replace(w, models={"a": replace(w.models["a"], rate=np.full(2, 5.0))}), fresh_state(),
               CoreConfig(policy=Scripted(None, wants=1)))  # type: ignore[arg-type]
    assert d.plan.decisions["a"] is Reason.KV_SATURATED and not d.plan.of_type(ScaleModel)
