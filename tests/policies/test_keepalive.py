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
    it = _hist([50, 0, 0, 0, 50, 0, 0, 0, 0, 0], head=1.0)
    mask = learned_bins(it, worth_s=100.0)
    assert mask is not None and mask.tolist() == [False, False, False, False, True] + [False] * 5
    mask = learned_bins(it, worth_s=120.0)  # 0.5 x 120 >= 60: bin 0 too
    assert mask is not None and mask.tolist() == [True, False, False, False, True] + [False] * 5


def test_learned_pre_warms_a_lead_time_before_a_periodic_arrival() -> None:
    rate = np.zeros(720)
    rate[::30] = 0.3  # a request burst every 300 s: idle times of 290 s (bin 4)
    it = IdleTimes.from_rates(rate, 10.0, end=7200.0, keep_alive_s=600)
    lead = 70.0
    assert not learned(it, 60.0, lead, SPEC).warm  # just after an execution: to zero
    assert not learned(it, 160.0, lead, SPEC).warm  # 160 + 70 < 240: too early
    assert learned(it, 175.0, lead, SPEC).warm  # 175 + 70 reaches bin 4: pre-warm
    assert learned(it, 290.0, lead, SPEC).warm
    assert not learned(it, 300.0 + lead, lead, SPEC).warm  # past it


def test_learned_falls_back_to_fixed_with_too_few_idle_times() -> None:
    empty = IdleTimes(range_s=600)
    assert learned(empty, 100.0, 60.0, SPEC).warm and not learned(empty, 700.0, 60.0, SPEC).warm


def test_learned_borrows_the_fleet_prior() -> None:
    own = _hist([0, 0, 0, 0, 1, 0, 0, 0, 0, 0])  # one idle time of its own: too few alone
    pool = _hist([0, 0, 0, 0, 500, 0, 0, 0, 0, 0])
    assert learned_bins(own, 300.0) is None
    mask = learned_bins(own, 300.0, prior=pool, prior_weight=2.0)
    assert mask is not None and mask.tolist() == [False] * 4 + [True] + [False] * 5


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0, 50), min_size=10, max_size=10), st.floats(0, 50), st.floats(0, 5),
       st.floats(0, 2000), st.floats(0, 2000))
def test_a_larger_cold_start_worth_is_never_colder(counts: list[float], overflow: float, head: float,
                                                  w1: float, w2: float) -> None:
    it = _hist(counts, overflow, head)
    lo, hi = sorted((w1, w2))
    a, b = learned_bins(it, lo), learned_bins(it, hi)
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
