"""Partial metrics never scale a model down (autoscaler/decision/scaledown.py, issue 16 failure mode 4).

A window that holds only part of the model -- a scrape target not answering (``ModelMetrics.partial``), an empty
window, no request rate for the newest step -- reads as low load. The rails hold it for every policy, as they hold
stale metrics; a scale-up the policy asks for on what is observed still goes through. The real-Prometheus side
(a model server that stops answering scrapes) is tests/live/test_prometheus_partial.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from autoscaler.api.plan import Reason, RemoveReplica, ScaleModel
from autoscaler.api.snapshot import (
    ClusterSnapshot,
    MetricsWindow,
    ModelMetrics,
    ModelObservation,
    Replica,
)
from autoscaler.api.spec import ModelSpec, slot_request
from autoscaler.decision.config import CoreConfig
from autoscaler.decision.core import decide
from autoscaler.decision.scaledown import ScaleDownState, normalize
from autoscaler.decision.state import fresh_state
from autoscaler.estimation.capacity import profile_from_spec
from autoscaler.policies import HPAPolicy, make_policy
from autoscaler.policies.base import PolicyContext, PolicyResult, ScalingBehavior
from sharing.cluster import nodes_from_spec
from sharing.packer import FirstFitPacker
from sharing.slots import Inventory

SPEC = ModelSpec(name="m", min_replicas=1, max_replicas=40)
DOWN = "1 of 2 scrape targets not answering (up == 0)"
SLOTWISE_LIKE = ScalingBehavior(stabilization_s=120.0, warm_up=True, step_fraction=0.5, n_minus_1=True)
SETTLED = ScaleDownState(started_at=0.0)


@dataclass
class Scripted:
    """Recommends ``wants`` under ``behavior``; counts its calls."""

    behavior: ScalingBehavior | None
    wants: int = 0
    name: str = "scripted"
    tick_s: float = 10.0
    instant_start: bool = False
    uses_forecast: bool = False
    learns: bool = False
    calls: list[float] = field(default_factory=list)

    def initial_state(self, spec: ModelSpec, replicas: int) -> int:
        return 0

    def decide(self, ctx: PolicyContext) -> PolicyResult:
        self.calls.append(ctx.now)
        return PolicyResult(self.wants, (ctx.state or 0) + 1, Reason.FORECAST, "scripted")


def metrics(rate: float | list[float] = 1.0, n: int = 12, **kw) -> ModelMetrics:
    r = np.asarray(rate, dtype=float) if isinstance(rate, list) else np.full(n, rate)
    return ModelMetrics(rate=r, in_flight=np.full(r.size, 0.5), **kw)


def ctx(current: int, m: ModelMetrics, now: float = 1000.0, spec: ModelSpec = SPEC, state=0) -> PolicyContext:  # type: ignore[no-untyped-def]
    return PolicyContext(now=now, spec=spec, current_replicas=current, ready_replicas=current, metrics=m,
                         metrics_step_s=10.0, forecast=None, capacity=profile_from_spec(spec), state=state)


# -- what counts as partial ----------------------------------------------------------------------------------


def test_partial_reason_the_source_and_the_samples() -> None:
    from autoscaler.api.snapshot import NO_NEWEST_RATE, NO_RATE_SAMPLES

    assert metrics().partial_reason() is None
    assert metrics(partial=DOWN, observed_fraction=0.5).partial_reason() == DOWN
    assert metrics([]).partial_reason() == NO_RATE_SAMPLES
    assert metrics(math.nan).partial_reason() == NO_NEWEST_RATE  # all NaN: no load known
    assert metrics([1.0, 2.0, math.nan]).partial_reason() == NO_NEWEST_RATE  # the load now is unknown
    assert metrics([math.nan, math.nan, 3.0]).partial_reason() is None  # a series that just started: its first step
    assert metrics(0.0).partial_reason() is None  # zero load is a measurement, not a gap


# -- the rails ------------------------------------------------------------------------------------------------


def test_a_partial_window_holds_where_the_policy_would_scale_down() -> None:
    p = Scripted(None, wants=2)
    whole = normalize(p, ctx(4, metrics()), SETTLED)
    assert whole.desired == 2  # the same recommendation on whole data is a scale-down
    res = normalize(p, ctx(4, metrics(partial=DOWN, observed_fraction=0.5)), SETTLED)
    assert (res.desired, res.reason) == (4, Reason.METRICS_PARTIAL)
    assert DOWN in res.detail
    assert res.state == 0  # the policy's state is not advanced on a window that is not the model


def test_an_all_nan_window_does_not_halve_the_model_every_tick() -> None:
    # Not flagged stale, no finite sample: slotwise read it as a load of 0 and halved the model each decision.
    policy = make_policy("slotwise")
    spec = SPEC.with_(slo_latency_ms=1000)
    state, window, current = policy.initial_state(spec, 8), SETTLED, 8
    for t in (1000.0, 1100.0, 1200.0, 1300.0):
        res = normalize(policy, ctx(current, metrics(math.nan, n=30), now=t, spec=spec, state=state), window)
        assert res.desired == 8, f"scaled {current} -> {res.desired} on a window without one sample ({res.reason})"
        assert res.reason is Reason.METRICS_PARTIAL
        state, window, current = res.state, res.scale_down, res.desired


def test_a_partial_window_still_scales_up_on_what_it_shows() -> None:
    res = normalize(Scripted(SLOTWISE_LIKE, wants=9), ctx(4, metrics(partial=DOWN)), SETTLED)
    assert (res.desired, res.reason) == (9, Reason.FORECAST)
    assert f"metrics partial: {DOWN}" in res.detail


def test_after_a_partial_hold_a_scale_down_waits_a_whole_window() -> None:
    # The hold counts as "the current count" in the down window: a scale-down right after the data is whole again
    # would otherwise rest on a window of one decision.
    p = Scripted(SLOTWISE_LIKE, wants=2)
    w = SETTLED
    for t in (1000.0, 1010.0, 1020.0):
        res = normalize(p, ctx(8, metrics(partial=DOWN), now=t), w)
        assert res.desired == 8
        w = res.scale_down
    assert normalize(p, ctx(8, metrics(), now=1030.0), w).desired == 8  # held by the window
    assert normalize(p, ctx(8, metrics(), now=1020.0 + SLOTWISE_LIKE.stabilization_s + 1), w).desired < 8


def test_after_a_stale_hold_a_scale_down_waits_a_whole_window() -> None:
    # The same for a stale window (issue 30): the hold enters the down window as the current count. Before, the
    # window kept only the decisions before the data went stale, so a scale-down came on the first fresh window.
    p = Scripted(SLOTWISE_LIKE, wants=2)
    w = SETTLED
    for t in (1000.0, 1010.0, 1020.0):
        res = normalize(p, ctx(8, metrics(stale=True), now=t), w)
        assert (res.desired, res.reason) == (8, Reason.METRICS_STALE)
        w = res.scale_down
    assert normalize(p, ctx(8, metrics(), now=1030.0), w).desired == 8  # held by the window
    assert normalize(p, ctx(8, metrics(), now=1020.0 + SLOTWISE_LIKE.stabilization_s + 1), w).desired < 8


def test_partial_hold_through_decide_emits_no_scale_down() -> None:
    spec = ModelSpec(name="a", slo_latency_ms=1000, max_replicas=50)
    inv = Inventory.from_nodes(nodes_from_spec("8xH100-80GB:mig"))
    replicas = []
    for n in range(3):
        slot = FirstFitPacker().place(inv, slot_request(spec))
        assert slot is not None
        inv.allocate(slot, f"a-{n}")
        replicas.append(Replica(f"a-{n}", slot, ready=True, started_at=0.0))
    model = ModelObservation("a", spec, desired_replicas=3, replicas=tuple(replicas))
    snap = ClusterSnapshot(now=100.0, models={"a": model}, inventory=inv)
    for m in (metrics(math.nan), metrics(5.0, partial=DOWN, observed_fraction=0.5)):
        window = MetricsWindow(now=100.0, step_s=10.0, models={"a": m})
        d = decide(snap, window, fresh_state(), CoreConfig(policy=Scripted(None, wants=1)))  # type: ignore[arg-type]
        assert d.plan.decisions["a"] is Reason.METRICS_PARTIAL
        assert not d.plan.of_type(ScaleModel) and not d.plan.of_type(RemoveReplica)
    whole = MetricsWindow(now=100.0, step_s=10.0, models={"a": metrics(5.0)})
    d = decide(snap, whole, fresh_state(), CoreConfig(policy=Scripted(None, wants=1)))  # type: ignore[arg-type]
    assert [a.replicas for a in d.plan.of_type(ScaleModel)] == [1]  # the same policy on whole data: down


# -- the property -------------------------------------------------------------------------------------------

_finite = st.floats(0.0, 500.0)
_sample = st.one_of(_finite, st.just(math.nan))


@st.composite
def windows(draw: st.DrawFn) -> ModelMetrics:
    """Any window: samples with NaNs anywhere (or none), flagged partial / stale or not."""
    n = draw(st.integers(0, 30))
    rate = np.array(draw(st.lists(_sample, min_size=n, max_size=n)), dtype=float)
    in_flight = np.array(draw(st.lists(_sample, min_size=n, max_size=n)), dtype=float)
    flags = {"partial": DOWN, "observed_fraction": draw(st.floats(0.0, 0.99))} if draw(st.booleans()) else {}
    return ModelMetrics(rate=rate, in_flight=in_flight, queue_depth=draw(st.floats(0.0, 100.0)),
                        stale=draw(st.booleans()), **flags)


def unobserved(m: ModelMetrics) -> bool:
    """The invariant's premise, spelled out here rather than read from the code under test: stale, flagged
    partial by the source, empty, or without a request rate for the newest step."""
    rate = m.rate
    return m.stale or getattr(m, "partial", None) is not None or rate.size == 0 or not math.isfinite(rate[-1])


POLICY_NAMES = ["slotwise", "hpa", "kpa", "predictive", "static", "oracle"]


@settings(max_examples=150, deadline=None)
@given(which=st.sampled_from(POLICY_NAMES), ticks=st.lists(windows(), min_size=1, max_size=6),
       current=st.integers(0, 60), lo=st.integers(0, 10), hi=st.integers(10, 60))
def test_whatever_the_window_a_partial_or_stale_model_never_goes_down(
    which: str, ticks: list[ModelMetrics], current: int, lo: int, hi: int
) -> None:
    spec = ModelSpec(name="m", min_replicas=lo, max_replicas=hi)
    policy = make_policy(which)
    state, window = policy.initial_state(spec, current), ScaleDownState(started_at=0.0)
    for i, m in enumerate(ticks):
        res = normalize(policy, ctx(current, m, now=1000.0 + 10.0 * i, spec=spec, state=state), window)
        if unobserved(m):
            # never below the count in force (within the spec's bounds, which a hold also obeys)
            assert res.desired >= min(max(current, lo), hi), (which, m, current, res)
        assert lo <= res.desired <= hi
        state, window, current = res.state, res.scale_down, res.desired


@settings(max_examples=100, deadline=None)
@given(current=st.integers(0, 60), wants=st.integers(0, 80), hpa=st.booleans(), m=windows())
def test_scripted_any_behaviour_partial_never_below_current(current: int, wants: int, hpa: bool,
                                                            m: ModelMetrics) -> None:
    behavior = HPAPolicy().behavior if hpa else SLOTWISE_LIKE
    res = normalize(Scripted(behavior, wants=wants), ctx(current, m), SETTLED)
    if unobserved(m):
        assert res.desired >= min(max(current, SPEC.min_replicas), SPEC.max_replicas)
        if wants > current and not m.stale and current < SPEC.max_replicas:
            assert res.desired > current  # the scale-up goes through
