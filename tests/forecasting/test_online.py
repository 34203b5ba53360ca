"""The online API: ``fit`` once then ``update`` per step is the same forecaster as a batch fit on the
same data; quantiles are monotone, >= 0 and finite whatever the series; the backtest scores exactly the
forecaster the controller builds."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from autoscaler.benchmarks.backtest.protocol import run_slotwise, shipped_fleet
from autoscaler.benchmarks.backtest.setup import protocol_setup
from autoscaler.estimation.forecast import FleetForecaster
from forecasting import SlotwiseBatch, SlotwiseForecaster, quantile_forecast
from forecasting.slotwise import DEFAULT_LEVELS, REPLAY

QS = (0.5, 0.9, 0.99)


def _series(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(n)
    lam = 20 + 15 * np.sin(2 * np.pi * t / 48) + 30 * (t > n // 2)
    return rng.poisson(lam).astype(float)


def test_online_updates_equal_batch_fit_when_replay_covers_the_history() -> None:
    y = _series(400, 0)
    kw = {"horizon": 5, "step_s": 60.0, "unit": 1.0, "season": 48, "replay": 1000}
    batch = SlotwiseForecaster(**kw).fit(y)  # type: ignore[arg-type]
    online = SlotwiseForecaster(**kw).fit(y[:100])  # type: ignore[arg-type]
    for v in y[100:]:
        online.update(v)
    np.testing.assert_allclose(online.predict_quantiles(5, QS), batch.predict_quantiles(5, QS), rtol=1e-9, atol=1e-9)


def test_online_converges_to_batch_fit_with_the_default_replay() -> None:
    # fit(y) replays only the last REPLAY points; online updates saw everything. The state that differs
    # (running losses, trackers, error window) has a memory of a few hundred steps: the median and the 0.9
    # agree to a small fraction of the level; the 0.99 (1 miss in 100 steps moves its tracker) more loosely.
    y = _series(4 * REPLAY, 1)
    batch = SlotwiseForecaster(horizon=4, step_s=60.0, unit=1.0).fit(y)
    online = SlotwiseForecaster(horizon=4, step_s=60.0, unit=1.0).fit(y[:REPLAY])
    online.update(y[REPLAY:])
    a, b = online.predict_quantiles(4, QS), batch.predict_quantiles(4, QS)
    level = y[-100:].mean()
    assert np.max(np.abs(a[:2] - b[:2])) < 0.1 * level
    assert np.max(np.abs(a[2] - b[2])) < 0.4 * level
    # and with a replay as long as the history they are the same forecaster (previous test)


def test_update_cost_does_not_grow_with_history() -> None:
    # O(1) state: what one update touches is the same size after 200 or 3,000 points.
    f = SlotwiseForecaster(horizon=3, step_s=60.0, unit=1.0)
    y = _series(3000, 2)
    f.fit(y[:200])
    sizes = sum(v.size for v in vars(f.batch_).values() if isinstance(v, np.ndarray))
    f.update(y[200:])
    assert sum(v.size for v in vars(f.batch_).values() if isinstance(v, np.ndarray)) == sizes


@settings(max_examples=30, deadline=None)
@given(
    st.lists(st.one_of(st.floats(0, 1e4), st.just(float("nan")), st.just(0.0)), min_size=0, max_size=120),
    st.integers(1, 12),
)
def test_quantiles_monotone_nonnegative_finite(values: list[float], h: int) -> None:
    f = SlotwiseForecaster(horizon=4, step_s=60.0, unit=1.0, prior_rate=2.0).fit(np.array(values[: len(values) // 2]))
    for v in values[len(values) // 2 :]:
        f.update(v)
        q = f.predict_quantiles(h, (0.1, 0.5, 0.75, 0.9, 0.99, 0.999))
        assert q.shape == (6, h) and np.all(np.isfinite(q)) and np.all(q >= 0)
        assert np.all(np.diff(q, axis=0) >= -1e-9)


def test_quantile_forecast_is_the_online_forecaster() -> None:
    y = _series(600, 3) / 60.0
    f = SlotwiseForecaster(horizon=5, levels=DEFAULT_LEVELS, step_s=60.0, unit=1 / 60.0).fit(y[:300])
    f.update(y[300:])
    # the one-call path replays the last REPLAY points of the same history through the same updates
    a, b = quantile_forecast(y, 5, QS, step_s=60.0), f.predict_quantiles(5, QS)
    level = y[-100:].mean()
    assert np.max(np.abs(a[:2] - b[:2])) < 0.15 * level and np.max(np.abs(a[2] - b[2])) < 0.4 * level
    g = SlotwiseForecaster(horizon=5, levels=DEFAULT_LEVELS, step_s=60.0, unit=1 / 60.0).fit(y)
    np.testing.assert_allclose(a, g.predict_quantiles(5, QS))


def test_backtest_scores_the_controllers_batch() -> None:
    # The backtest's slotwise is FleetForecaster.new_batch with the set's step and horizon, fed req/s.
    rng = np.random.default_rng(5)
    y = rng.poisson(10 + 5 * rng.random((4, 1)), (4, 300)).astype(float)
    setup = protocol_setup(y.shape[1], 60.0)
    pred, _ = run_slotwise(y, setup, np.array(QS))
    ff = FleetForecaster(step_s=60.0, horizon_s=setup.h * 60.0)
    batch = ff.new_batch(4)
    assert batch.levels.tolist() == list(ff.levels) and batch.replay == ff.replay and batch.season == ff.season
    batch.warm_start(y[:, : setup.first] / 60.0)
    np.testing.assert_allclose(pred[0], batch.predict_quantiles(setup.h, QS) * 60.0)
    batch.update(y[:, setup.first : setup.first + 1] / 60.0)
    np.testing.assert_allclose(pred[1], batch.predict_quantiles(setup.h, QS) * 60.0)
    assert shipped_fleet(setup).horizon == setup.h


def test_series_in_a_batch_do_not_interact() -> None:
    # The controller's shards (any grouping of models) forecast each model as it would alone.
    ys = np.stack([_series(300, s) for s in range(3)])
    ys[1, 100:140] = np.nan
    together = SlotwiseBatch(3, horizon=3, step_s=60.0, unit=1.0).warm_start(ys).predict_quantiles(3, QS)
    for i in range(3):
        alone = SlotwiseBatch(1, horizon=3, step_s=60.0, unit=1.0).warm_start(ys[i : i + 1]).predict_quantiles(3, QS)
        np.testing.assert_allclose(alone[0], together[i])
