"""The zero rail (autoscaler/decision/zero.py) and its hooks in the decision core (issue 18)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from autoscaler.api.plan import Reason, ScaleModel, SetRouting
from autoscaler.api.snapshot import ClusterSnapshot, MetricsWindow, ModelMetrics, ModelObservation, Replica
from autoscaler.api.spec import ModelSpec, slot_request
from autoscaler.decision import zero
from autoscaler.decision.config import CoreConfig
from autoscaler.decision.core import decide
from autoscaler.decision.state import fresh_state
from autoscaler.estimation.idle_times import IdleTimes
from autoscaler.policies.base import PolicyContext, PolicyResult, ScalingBehavior
from sharing.cluster import nodes_from_spec
from sharing.packer import FirstFitPacker
from sharing.slots import Inventory

STEP = 10.0
SPEC = ModelSpec(name="m", slo_latency_ms=1000, min_replicas=0, max_replicas=5, keep_alive="fixed",
                 keep_alive_s=300.0, cold_start_s=30.0)


@dataclass
class AtMostOne:
    """A sizing policy that wants one replica for any load and none without (what leaves the rest to the rail)."""

    tick_s: float = 10.0
    name: str = "one"
    instant_start: bool = False
    uses_forecast: bool = False
    learns: bool = False
    behavior: ScalingBehavior | None = None
    calls: list[float] = field(default_factory=list)

    def initial_state(self, spec: ModelSpec, replicas: int) -> int:
        return 0

    def decide(self, ctx: PolicyContext) -> PolicyResult:
        self.calls.append(ctx.now)
        return PolicyResult(1, ctx.state, Reason.REACTIVE, "one")


def _m(rate: list[float], in_flight: list[float] | None = None, held: float = 0.0, stale: bool = False,
       partial: str | None = None) -> ModelMetrics:
    r = np.array(rate, dtype=float)
    return ModelMetrics(rate=r, in_flight=np.array(in_flight if in_flight is not None else [0.0] * len(rate)),
                        held_requests=held, stale=stale, partial=partial)


def _obs(n: int, spec: ModelSpec = SPEC, via: bool | None = None, ready: bool = True) -> ModelObservation:
    return ModelObservation(spec.name, spec, n, tuple(Replica(f"r{i}", None, ready, 0.0) for i in range(n)),
                            via_activator=via)


metrics_st = st.builds(
    _m, st.lists(st.floats(0, 5), min_size=1, max_size=6), st.none(), st.floats(0, 3), st.booleans(),
    st.sampled_from([None, "a target down"]))


@settings(max_examples=300, deadline=None)
@given(metrics_st, st.integers(0, 3), st.integers(0, 3), st.floats(0, 2000))
def test_the_rail_never_goes_to_zero_on_stale_or_partial_metrics(m: ModelMetrics, current: int, desired: int,
                                                                 age: float) -> None:
    idle = IdleTimes(range_s=300)
    idle.idle_since, idle.first_t = 0.0, 0.0
    out, _, _ = zero.apply(_obs(current), SPEC, m, desired, Reason.REACTIVE, "", idle, age, 60.0, None)
    if (m.stale or m.partial_reason() is not None) and current > 0:
        assert out >= 1
    if current == 0 and m.held_requests > 0:
        assert out >= 1  # held requests at zero: one at once, stale or not
    assert 0 <= out <= max(desired, 1)


@settings(max_examples=200, deadline=None)
@given(metrics_st, st.integers(1, 4), st.integers(0, 5), st.integers(0, 5))
def test_a_model_with_a_floor_is_never_touched(m: ModelMetrics, floor: int, current: int, desired: int) -> None:
    spec = SPEC.with_(min_replicas=floor)
    assert zero.apply(_obs(current, spec), spec, m, desired, Reason.REACTIVE, "x", None, 1e6, 60.0, None) == (
        desired, Reason.REACTIVE, "x")
    assert zero.routing(_obs(current, spec, via=False), spec, desired) is None


def test_serving_keeps_one_and_idle_follows_the_keep_alive() -> None:
    idle = IdleTimes(range_s=300)
    idle.idle_since, idle.first_t = 0.0, 0.0
    busy = _m([0.0, 0.2])
    assert zero.apply(_obs(1), SPEC, busy, 0, Reason.REACTIVE, "", idle, 1000.0, 60.0, None)[0] == 1
    quiet = _m([0.0, 0.0])
    assert zero.apply(_obs(1), SPEC, quiet, 1, Reason.REACTIVE, "", idle, 100.0, 60.0, None)[:2] == (
        1, Reason.KEEP_WARM)
    assert zero.apply(_obs(1), SPEC, quiet, 1, Reason.REACTIVE, "", idle, 400.0, 60.0, None)[:2] == (
        0, Reason.SCALED_TO_ZERO)
    assert zero.apply(_obs(0), SPEC, _m([0.0], held=2), 0, Reason.METRICS_STALE, "", idle, 400.0, 60.0, None)[:2] \
        == (1, Reason.ACTIVATED)


def _window(now: float, rate: float, held: float = 0.0, n: int = 12) -> MetricsWindow:
    return MetricsWindow(now=now, step_s=STEP, models={"m": ModelMetrics(
        rate=np.full(n, rate), in_flight=np.zeros(n), held_requests=held)})


def test_decide_scales_to_zero_after_the_keep_alive_and_back_on_held_requests() -> None:
    inv = Inventory.from_nodes(nodes_from_spec("1xH100-80GB"))
    slot = FirstFitPacker().place(inv, slot_request(SPEC))
    assert slot is not None
    inv.allocate(slot, "m-1")
    one = ModelObservation("m", SPEC, 1, (Replica("m-1", slot, True, 0.0),), via_activator=False)
    policy = AtMostOne()
    config = CoreConfig(policy=policy)  # type: ignore[arg-type]
    state = fresh_state()
    # busy first, then idle: kept warm until keep_alive_s (300 s) after the last request, then to zero
    d = decide(ClusterSnapshot(120.0, {"m": one}, inv), _window(120.0, 1.0), state, config)
    assert d.plan.decisions["m"] is Reason.REACTIVE
    t, reasons = 120.0, []
    while t < 1000.0:
        t += 10.0
        d = decide(ClusterSnapshot(t, {"m": one}, inv), _window(t, 0.0), state, config)
        reasons.append((t, d.plan.decisions.get("m")))
        if d.plan.of_type(SetRouting):
            break
    assert reasons[0][1] is Reason.KEEP_WARM
    # tick 1 past the keep-alive: routed through the activator first, still one replica (nothing is dropped
    # between the routing switch and the scale)
    assert 120.0 + 300.0 <= t <= 120.0 + 300.0 + 20.0
    assert d.plan.of_type(SetRouting) == [SetRouting("m", True, "to zero")]
    assert reasons[-1][1] is Reason.KEEP_WARM and not [a for a in d.plan.of_type(ScaleModel) if a.replicas == 0]
    # tick 2, the view shows the routing through the activator: to zero, no routing change
    routed = dataclasses.replace(one, via_activator=True)
    t += 10.0
    d = decide(ClusterSnapshot(t, {"m": routed}, inv), _window(t, 0.0), state, config)
    assert d.plan.decisions["m"] is Reason.SCALED_TO_ZERO
    assert [a.replicas for a in d.plan.of_type(ScaleModel)] == [0] and not d.plan.of_type(SetRouting)
    # at zero, routed through the activator: held requests bring one replica back at once, even not due and stale
    empty = Inventory.from_nodes(nodes_from_spec("1xH100-80GB"))
    at_zero = ModelObservation("m", SPEC, 0, (), via_activator=True)
    stale = MetricsWindow(now=t + 1.0, step_s=STEP, models={"m": ModelMetrics(
        rate=np.zeros(0), in_flight=np.zeros(0), stale=True, held_requests=3.0)})
    d = decide(ClusterSnapshot(t + 1.0, {"m": at_zero}, empty), stale, state, config)
    (scale,) = d.plan.of_type(ScaleModel)
    assert (scale.replicas, scale.reason) == (1, Reason.ACTIVATED)
    assert not d.plan.of_type(SetRouting)  # already through the activator
    # without held requests, a model at zero that is not due is not decided
    calls = len(policy.calls)
    quiet = MetricsWindow(now=t + 2.0, step_s=STEP, models={"m": ModelMetrics(
        rate=np.zeros(0), in_flight=np.zeros(0), stale=True)})
    decide(ClusterSnapshot(t + 2.0, {"m": at_zero}, empty), quiet, state, config)
    assert len(policy.calls) == calls


def test_a_model_first_seen_at_zero_is_not_pre_warmed() -> None:
    # Live, a model at zero has nothing to scrape (stale), and one never seen serving gives no sign of a request
    # soon: it stays at zero until a request is held (a fixed keep-alive used to read its idle age as 0 and start
    # a replica at once).
    for metrics in (_m([], stale=True), _m([0.0] * 6)):
        idle = IdleTimes(range_s=SPEC.keep_alive_s)
        if not metrics.stale:
            zero.observe(idle, metrics, STEP, 100.0, 40.0)
        n, reason, _ = zero.apply(_obs(0), SPEC, metrics, 0, Reason.METRICS_STALE, "", idle, 100.0, 40.0, None)
        assert (n, reason) == (0, Reason.SCALED_TO_ZERO)
    n, reason, _ = zero.apply(_obs(0), SPEC, _m([], stale=True, held=2.0), 0, Reason.METRICS_STALE, "", None,
                              100.0, 40.0, None)
    assert (n, reason) == (1, Reason.ACTIVATED)


def test_held_requests_keep_a_starting_replica_whatever_the_idle_age() -> None:
    # After ACTIVATED: one active replica, not Ready, the requests still held by the activator (live, they are not
    # in the pods' rate), a fresh zero-rate window and a long idle age: the replica must not be killed before it
    # serves them.
    idle = IdleTimes(range_s=300)
    idle.idle_since, idle.first_t = 0.0, 0.0
    starting = _obs(1, ready=False)
    for desired in (0, 1, 3):
        n, reason, _ = zero.apply(starting, SPEC, _m([0.0] * 6, held=3.0), desired, Reason.REACTIVE, "", idle,
                                  5000.0, 60.0, None)
        assert n == max(desired, 1)
    n, reason, _ = zero.apply(starting, SPEC, _m([0.0] * 6, held=3.0), 0, Reason.REACTIVE, "", idle, 5000.0, 60.0,
                              None)
    assert reason is Reason.KEEP_WARM


held_st = st.builds(
    _m, st.lists(st.sampled_from([0.0, 0.0, 2.0]), min_size=1, max_size=6), st.none(), st.floats(0.5, 3),
    st.booleans(), st.sampled_from([None, None, "a target down"]))


@settings(max_examples=200, deadline=None)
@given(held_st, st.integers(0, 4), st.integers(0, 5), st.floats(0, 1e5), st.sampled_from([None, False, True]),
       st.booleans())
def test_held_requests_always_keep_at_least_one(m: ModelMetrics, current: int, desired: int, age: float,
                                                via: bool | None, ready: bool) -> None:
    idle = IdleTimes(range_s=300)
    idle.idle_since, idle.first_t = 0.0, 0.0
    out, _, _ = zero.apply(_obs(current, via=via, ready=ready), SPEC, m, desired, Reason.REACTIVE, "", idle, age,
                           60.0, None)
    assert out == max(desired, 1)


def test_never_to_zero_before_the_routing_through_the_activator() -> None:
    idle = IdleTimes(range_s=300)
    idle.idle_since, idle.first_t = 0.0, 0.0
    quiet = _m([0.0, 0.0])
    direct = _obs(1, via=False)
    n, reason, detail = zero.apply(direct, SPEC, quiet, 1, Reason.REACTIVE, "", idle, 400.0, 60.0, None)
    assert (n, reason, detail) == (1, Reason.KEEP_WARM, zero.ROUTING_WAIT)
    assert zero.routing(direct, SPEC, n, detail) == SetRouting("m", True, "to zero")
    routed = _obs(1, via=True)
    n, reason, detail = zero.apply(routed, SPEC, quiet, 1, Reason.REACTIVE, "", idle, 400.0, 60.0, None)
    assert (n, reason) == (0, Reason.SCALED_TO_ZERO)
    assert zero.routing(routed, SPEC, n, detail) is None
    # nobody fronts it: to zero at once, no routing
    n, reason, detail = zero.apply(_obs(1), SPEC, quiet, 1, Reason.REACTIVE, "", idle, 400.0, 60.0, None)
    assert (n, reason) == (0, Reason.SCALED_TO_ZERO) and zero.routing(_obs(1), SPEC, n, detail) is None
    # kept warm for its own reasons: stays straight to the pods
    n, reason, detail = zero.apply(direct, SPEC, quiet, 1, Reason.REACTIVE, "", idle, 100.0, 60.0, None)
    assert (n, reason) == (1, Reason.KEEP_WARM) and zero.routing(direct, SPEC, n, detail) is None
