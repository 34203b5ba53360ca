"""Combining the quantile candidates: a loss-weighted mean that stays inside the eligible candidates'
range, reduces to the argmin at blend_power = inf, and ignores candidates that are not yet eligible."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from forecasting import SlotwiseBatch

SHAPE = (3, 2, 4, 5)  # candidates, series, steps, levels (the default 5 levels)


def _batch(power: float) -> SlotwiseBatch:
    return SlotwiseBatch(2, horizon=4, step_s=60.0, unit=1.0, blend_power=power)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), power=st.sampled_from([1.0, 4.0, 10.0]))
def test_blend_lies_between_the_eligible_candidates(seed: int, power: float) -> None:
    rng = np.random.default_rng(seed)
    b = _batch(power)
    cand = rng.gamma(2.0, 10.0, SHAPE)
    b.qloss_ = rng.gamma(2.0, 1.0, SHAPE) * (rng.random(SHAPE) > 0.2)  # some exact (zero-loss) candidates
    ok = rng.random(SHAPE[:3]) > 0.3
    ok[0] = True  # the conformal candidate is always eligible
    f = b._combine(cand, ok)
    masked = np.where(ok[..., None], cand, np.nan)
    assert np.all(f >= np.nanmin(masked, axis=0) - 1e-9)
    assert np.all(f <= np.nanmax(masked, axis=0) + 1e-9)
    # a candidate that is not eligible has no say: changing it changes nothing
    cand2 = np.where(ok[..., None], cand, 1e9)
    np.testing.assert_allclose(b._combine(cand2, ok), f)


def test_infinite_power_is_the_argmin_and_a_clearly_worse_candidate_weighs_little() -> None:
    cand = np.zeros(SHAPE)
    cand[1] = 100.0
    ok = np.ones(SHAPE[:3], dtype=bool)
    b = _batch(float("inf"))
    b.qloss_ = np.ones(SHAPE)
    b.qloss_[1] = 0.5  # candidate 1 is the best
    np.testing.assert_array_equal(b._combine(cand, ok), 100.0)
    b = _batch(4.0)
    b.qloss_ = np.ones(SHAPE)
    b.qloss_[1] = 2.0  # candidate 1 has twice the others' loss: weight 1/16 against 1 + 1
    np.testing.assert_allclose(b._combine(cand, ok), 100.0 * (1 / 16) / (2 + 1 / 16))


def test_blend_is_the_shipped_default() -> None:
    from autoscaler.estimation.forecast import FleetForecaster

    assert FleetForecaster(step_s=60.0, horizon_s=600.0).new_batch(3).blend_power == 4.0


def test_non_finite_losses_and_forecasts_never_make_the_blend_nan() -> None:
    # An ineligible candidate whose forecast is inf, all-infinite eligible losses, a NaN loss: the blend stays
    # finite (0 weight means no say; with no finite loss the argmin's pick stands).
    b = _batch(4.0)
    cand = np.full(SHAPE, 5.0)
    cand[2] = np.inf
    ok = np.ones(SHAPE[:3], dtype=bool)
    ok[2] = False
    b.qloss_ = np.ones(SHAPE)
    assert np.all(np.isfinite(b._combine(cand, ok)))
    b.qloss_ = np.full(SHAPE, np.inf)
    assert np.all(b._combine(np.full(SHAPE, 5.0), np.ones(SHAPE[:3], dtype=bool)) == 5.0)
    b.qloss_ = np.ones(SHAPE)
    b.qloss_[1] = np.nan
    assert np.all(np.isfinite(b._combine(np.full(SHAPE, 5.0), np.ones(SHAPE[:3], dtype=bool))))


def test_a_negative_blend_power_is_refused() -> None:
    import pytest

    with pytest.raises(ValueError, match="blend_power"):
        _batch(-1.0)
