"""IdleTimes (autoscaler/estimation/idle_times.py): idle gaps, heads, ages from per-step samples, each step once."""

from __future__ import annotations

import numpy as np
import pytest

from autoscaler.estimation.idle_times import BIN_S, IdleTimes

STEP = 10.0


def _periodic(period_steps: int, n: int, burst: float = 0.3) -> np.ndarray:
    r = np.zeros(n)
    r[::period_steps] = burst
    return r


def test_from_rates_learns_the_gap_between_activities() -> None:
    # one busy step every 30 steps (300 s): idle time = 290 s (from the end of one busy step to the next's start)
    it = IdleTimes.from_rates(_periodic(30, 600), STEP, end=6000.0, keep_alive_s=600)
    assert it.n_idle == 19
    assert it.counts[int(290 // BIN_S)] == pytest.approx(it.counts.sum())
    assert it.overflow == 0
    assert it.head == pytest.approx(3.0)  # 0.3 rps x 10 s in the one busy step


def test_overlapping_windows_count_each_step_once() -> None:
    rate = _periodic(30, 600)
    once = IdleTimes.from_rates(rate, STEP, end=6000.0)
    again = IdleTimes(range_s=600)
    for end in range(60, 601, 6):  # windows of 60 steps, overlapping by 54
        w = rate[max(0, end - 60):end]
        again.observe(w, np.zeros(w.size), 0.0, STEP, end * STEP)
    assert again.n_idle == once.n_idle
    np.testing.assert_allclose(again.counts, once.counts, rtol=1e-6)


def test_gaps_beyond_the_range_overflow_and_age_grows_while_idle() -> None:
    it = IdleTimes.from_rates(_periodic(100, 401), STEP, end=4010.0, keep_alive_s=300)
    assert it.counts.sum() == 0 and it.overflow > 0
    assert it.age(4010.0) == 0.0  # the last step was busy
    it.observe(np.zeros(3), np.zeros(3), 0.0, STEP, 4040.0)
    assert it.age(4040.0) == pytest.approx(30.0)


def test_in_flight_and_held_keep_an_activity_open() -> None:
    it = IdleTimes(range_s=600)
    it.observe(np.array([1.0, 0.0, 0.0]), np.array([1.0, 2.0, 1.0]), 0.0, STEP, 30.0)
    assert it.age(30.0) == 0.0  # in flight until the last step's end
    it.observe(np.array([0.0]), np.array([0.0]), 0.0, STEP, 40.0)
    assert it.age(40.0) == pytest.approx(10.0)


def test_decay_weighs_recent_idle_times_more() -> None:
    it = IdleTimes(range_s=600, half_life_s=100.0)
    it.add_idle(30.0, 0.0)
    it.add_idle(130.0, 100.0)
    assert it.counts[0] == pytest.approx(0.5) and it.counts[2] == pytest.approx(1.0)


def test_held_requests_are_an_arrival_that_opens_the_activity() -> None:
    # idle from t=0; at t=1000 requests are held (live: not in the pods' rate); forwarded a cold start (60 s)
    # later, 3 of them show in the rate. The idle time ends when they were held, not when they were forwarded, and
    # the head counts them once.
    it = IdleTimes(range_s=1200, head_s=30.0, half_life_s=1e12)
    it.observe(np.array([0.3]), np.zeros(1), 0.0, STEP, 10.0)  # an activity at [0, 10)
    it.observe(np.zeros(99), np.zeros(99), 0.0, STEP, 1000.0)  # idle from t=10 ... 1000
    assert it.age(1000.0) > 0
    n_before = it.n_idle
    it.observe(np.zeros(1), np.zeros(1), 3.0, STEP, 1010.0)  # held at the end of [1000, 1010)
    assert it.age(1010.0) == 0.0 and it.n_idle == n_before + 1
    assert it.counts.sum() == pytest.approx(1.0)
    assert it.counts[int((1000.0 - 10.0) // BIN_S)] == pytest.approx(1.0)  # not 1050 s: no cold start inside
    for k in range(2, 8):  # still held until the replica is Ready at 1060, then forwarded: 0.3 rps for 10 s
        held = 3.0 if k < 6 else 0.0
        rate = 0.3 if k == 6 else 0.0
        it.observe(np.array([rate]), np.array([1.0 if k == 6 else 0.0]), held, STEP, 1000.0 + 10.0 * k)
    assert it.head_weight == pytest.approx(2.0, rel=1e-3)
    assert it.head_sum / it.head_weight == pytest.approx(3.0, rel=1e-3)  # both heads 3, not 0 for the held one


def test_held_requests_with_nothing_to_scrape_open_the_activity() -> None:
    it = IdleTimes(range_s=600)
    it.observe(np.array([0.3, 0.0]), np.zeros(2), 0.0, STEP, 20.0)
    it.observe(np.zeros(0), np.zeros(0), 2.0, STEP, 500.0)  # at zero: no samples, requests held
    assert it.age(500.0) == 0.0 and it.n_idle == 1
