"""The keep-alive policies (autoscaler/policies/keepalive.py): fixed, hybrid (Shahrad et al. ATC'20), learned."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autoscaler.api.spec import ModelSpec
from autoscaler.estimation.idle_times import BIN_S, IdleTimes
from autoscaler.policies.keepalive import fixed, hybrid, hybrid_windows, learned, learned_bins

SPEC = ModelSpec(name="m", min_replicas=0, keep_alive_s=600.0, cold_start_worth_s=300.0)


def _hist(counts: list[float], overflow: float = 0.0, head: float = 1.0) -> IdleTimes:
    it = IdleTimes(range_s=len(counts) * BIN_S)
    it.counts = np.array(counts, dtype=float)
    it.overflow = overflow
    it.n_idle = int(sum(counts) + overflow)
    it.head_sum, it.head_weight = head, 1.0
    it.version += 1
    return it


def test_fixed_is_warm_until_the_keep_alive() -> None:
    assert fixed(None, 599.0, 60.0, SPEC).warm
    assert not fixed(None, 600.0, 60.0, SPEC).warm


def test_hybrid_windows_on_a_known_histogram() -> None:
    # all idle times in minute 5 (300-360 s): 5th percentile in bin 5, 99th in bin 5
    it = _hist([0, 0, 0, 0, 0, 100, 0, 0, 0, 0])
    start, end = hybrid_windows(it)  # type: ignore[misc]
    assert start == pytest.approx(300 * 0.9) and end == pytest.approx(360 * 1.1)
    assert not hybrid(it, 10.0, 60.0, SPEC).warm  # unloaded right after an execution
    assert hybrid(it, 270.0 - 60.0, 60.0, SPEC).warm  # started a lead time before the pre-warm time
    assert hybrid(it, 300.0, 60.0, SPEC).warm
    assert not hybrid(it, 400.0, 60.0, SPEC).warm


def test_hybrid_falls_back_to_fixed_when_not_representative() -> None:
    flat = _hist([10] * 10)  # coefficient of variation 0 < 2
    assert hybrid_windows(flat) is None
    assert hybrid(flat, 500.0, 60.0, SPEC).warm and not hybrid(flat, 650.0, 60.0, SPEC).warm
    few = _hist([0, 0, 3, 0, 0, 0, 0, 0, 0, 0])
    assert hybrid_windows(few) is None  # too few idle times
    out = _hist([0, 0, 20, 0, 0, 0, 0, 0, 0, 0], overflow=50)
    assert hybrid_windows(out) is None  # mostly out of range


def test_learned_keeps_exactly_the_high_hazard_bins() -> None:
    # 50 idle times in bin 0, 50 in bin 4: hazard 0.5 in bin 0, 0 in 1-3, 1.0 in bin 4
    # (the bare knapsack: no hysteresis)
    it = _hist([50, 0, 0, 0, 50, 0, 0, 0, 0, 0], head=1.0)
    mask = learned_bins(it, worth_s=100.0, scale_event_s=0.0)
    assert mask is not None and mask.tolist() == [False, False, False, False, True] + [False] * 5
    mask = learned_bins(it, worth_s=120.0, scale_event_s=0.0)  # 0.5 x 120 >= 60: bin 0 too
    assert mask is not None and mask.tolist() == [True, False, False, False, True] + [False] * 5


def test_the_hysteresis_keeps_a_cold_run_warm_only_when_its_zero_is_not_worth_two_scale_events() -> None:
    it = _hist([50, 0, 0, 0, 50, 0, 0, 0, 0, 0], head=1.0)
    # Bins 0-3 cold, bin 4 warm: at zero from the activity's end to 240 - lead s. Lead 60: 180 s at zero, of which
    # bins 1-2 only half the gaps reach (survival 0.5): 60 + 30 + 30 - 50 (bin 0's cold starts at worth 100) = 70
    # replica-seconds saved, against two events of 60 s (at survival 1): kept warm.
    mask = learned_bins(it, worth_s=100.0, lead_s=60.0, scale_event_s=60.0)
    assert mask is not None and mask.tolist() == [True] * 5 + [False] * 5
    # Events worth 30 s each: the 70 s saved are worth two of them; the knapsack's answer stands.
    mask = learned_bins(it, worth_s=100.0, lead_s=60.0, scale_event_s=30.0)
    assert mask is not None and mask.tolist() == [False] * 4 + [True] + [False] * 5
    # The cold run after the last warm bin is never filled (the model waits at zero for the next request).
    assert not mask[5:].any()


def test_learned_pre_warms_a_lead_time_before_a_periodic_arrival() -> None:
    rate = np.zeros(720)
    rate[::30] = 0.3  # a request burst every 300 s: idle times of 290 s (bin 4)
    it = IdleTimes.from_rates(rate, 10.0, end=7200.0, keep_alive_s=600)
    lead = 70.0
    bare = {"scale_event_s": 0.0}  # (the knapsack alone; the hysteresis below)
    assert not learned(it, 60.0, lead, SPEC, **bare).warm  # just after an execution: to zero
    assert not learned(it, 160.0, lead, SPEC, **bare).warm  # 160 + 70 < 240: too early
    assert learned(it, 175.0, lead, SPEC, **bare).warm  # 175 + 70 reaches bin 4: pre-warm
    assert learned(it, 290.0, lead, SPEC, **bare).warm
    assert not learned(it, 300.0 + lead, lead, SPEC, **bare).warm  # past it
    # The shipped hysteresis: 170 s at zero a gap are not worth two scale events (2 x 120 s): warm through it.
    assert learned(it, 60.0, lead, SPEC).warm and learned(it, 160.0, lead, SPEC).warm
    assert not learned(it, 300.0 + lead, lead, SPEC).warm  # (past the gap it still goes to zero)


def test_learned_falls_back_to_fixed_with_too_few_idle_times() -> None:
    empty = IdleTimes(range_s=600)
    assert learned(empty, 100.0, 60.0, SPEC).warm and not learned(empty, 700.0, 60.0, SPEC).warm


def test_learned_borrows_the_fleet_prior() -> None:
    own = _hist([0, 0, 0, 0, 1, 0, 0, 0, 0, 0])  # one idle time of its own: too few alone
    pool = _hist([0, 0, 0, 0, 500, 0, 0, 0, 0, 0])
    assert learned_bins(own, 300.0) is None
    mask = learned_bins(own, 300.0, prior=pool, prior_weight=2.0)
    assert mask is not None and mask.tolist() == [False] * 4 + [True] + [False] * 5


@settings(max_examples=300, deadline=None)
@given(st.lists(st.floats(0, 50), min_size=10, max_size=10), st.floats(0, 50), st.floats(0, 5),
       st.floats(0, 2000), st.floats(0, 2000), st.floats(0, 300), st.sampled_from([0.0, 16.0, 60.0, 600.0]))
def test_a_larger_cold_start_worth_is_never_colder(counts: list[float], overflow: float, head: float,
                                                  w1: float, w2: float, lead: float, event_s: float) -> None:
    it = _hist(counts, overflow, head)
    lo, hi = sorted((w1, w2))
    a = learned_bins(it, lo, lead_s=lead, scale_event_s=event_s)
    b = learned_bins(it, hi, lead_s=lead, scale_event_s=event_s)
    if a is None:
        assert b is None
        return
    assert b is not None and not np.any(a & ~b)  # the warm set only grows


def test_learned_pre_warms_an_hourly_model_beyond_its_fallback_keep_alive() -> None:
    # A model called once an hour (idle times of 59 min, a single request each time): with keep-alive-seconds 600
    # (the fallback) learned's histogram still spans 4 h, so it goes to zero after the call and is started again a
    # lead time before the next one -- fixed at 600 s would pay a cold start every hour.
    from autoscaler.policies.keepalive import LEARNED_RANGE_S, histogram_range_s

    assert histogram_range_s(SPEC) == LEARNED_RANGE_S
    assert histogram_range_s(ModelSpec(name="h", keep_alive="hybrid", keep_alive_s=600.0)) == 600.0
    it = IdleTimes(range_s=histogram_range_s(SPEC))
    for k in range(12):
        it.add_idle(59 * 60.0 + 10.0, 3600.0 * (k + 1))
    it.head_sum, it.head_weight = 1.0, 1.0
    it.version += 1
    assert not learned(it, 600.0, 60.0, SPEC).warm  # well inside the gap: at zero
    assert learned(it, 59 * 60.0 - 60.0, 60.0, SPEC).warm  # a lead time before the call's minute: pre-warmed
    assert not fixed(it, 59 * 60.0, 60.0, SPEC).warm


def _toggles(it: IdleTimes, gap_s: float, lead: float, spec: ModelSpec = SPEC, **kw: float) -> int:
    """Scale events ``learned`` makes over one idle gap of ``gap_s`` decided every 10 s (warm while serving before
    it; the request that ends it needs one replica)."""
    warm, events = True, 0
    for age in np.arange(0.0, gap_s, 10.0):
        now = learned(it, float(age), lead, spec, **kw).warm
        events += now != warm
        warm = now
    return events + (not warm)  # (at zero when the request comes: its activation is one more event)


def test_a_steady_short_gap_pattern_does_not_toggle() -> None:
    # A request every 180 s (idle times of 170 s, bin 2) and a 70 s lead time. The bare knapsack keeps only bin 2
    # warm: the model goes to zero at the activity's end and is pre-warmed 50 s later, two scale events in every
    # gap for 50 replica-seconds. The hysteresis keeps it warm through the gap: no event at all (fixed 300 s's).
    rate = np.zeros(720)
    rate[::18] = 0.3
    it = IdleTimes.from_rates(rate, 10.0, end=7200.0, keep_alive_s=600)
    lead = 70.0
    assert _toggles(it, 170.0, lead, scale_event_s=0.0) == 2  # (the old behaviour: down, then pre-warm)
    assert _toggles(it, 170.0, lead) == 0
    assert all(learned(it, age, lead, SPEC).warm for age in range(0, 170, 10))
    # A long gap is still worth its zero: requests every 20 min are pre-warmed, not held (two events a gap).
    rate = np.zeros(720 * 4)
    rate[::120] = 0.3
    it = IdleTimes.from_rates(rate, 10.0, end=4 * 7200.0, keep_alive_s=600)
    assert _toggles(it, 1190.0, lead) == 2
    assert not learned(it, 300.0, lead, SPEC).warm


@settings(max_examples=300, deadline=None)
@given(st.lists(st.floats(0, 50), min_size=10, max_size=10), st.floats(0, 50), st.floats(0, 5),
       st.floats(0, 2000), st.floats(0, 300), st.floats(1, 600))
def test_the_hysteresis_only_adds_warm_bins_and_never_adds_a_zero(counts: list[float], overflow: float,
                                                                   head: float, worth: float, lead: float,
                                                                   event_s: float) -> None:
    it = _hist(counts, overflow, head)
    spec = SPEC.with_(cold_start_worth_s=worth)
    bare = learned_bins(it, worth, lead_s=lead, scale_event_s=0.0)
    held = learned_bins(it, worth, lead_s=lead, scale_event_s=event_s)
    if bare is None:
        assert held is None
        return
    assert held is not None and not np.any(bare & ~held)  # never colder than the knapsack
    for gap in (60.0 * k + 30.0 for k in range(10)):  # every gap makes no more scale events than without it
        assert (_toggles(it, gap, lead, spec, scale_event_s=event_s)
                <= _toggles(it, gap, lead, spec, scale_event_s=0.0))
