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
