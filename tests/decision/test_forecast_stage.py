"""The core's forecast stage: one fleet forecaster, shards, warm start, new models, the step clock."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autoscaler.api.snapshot import MetricsWindow, ModelMetrics
from autoscaler.estimation.forecast import FleetForecaster, resample, step_means

STEP = 10.0  # metrics sample step


def window(now: float, rates: dict[str, np.ndarray], stale: frozenset[str] = frozenset()) -> MetricsWindow:
    return MetricsWindow(
        now=now,
        step_s=STEP,
        models={
            n: ModelMetrics(rate=r, in_flight=np.zeros_like(r), stale=n in stale) for n, r in rates.items()
        },
    )


def run(ff: FleetForecaster, load: dict[str, callable], start: float, end: float) -> None:
    """Drive the forecaster tick by tick with a 600 s window of 10 s samples of ``load[name](t)``."""
    t = start
    while t <= end:
        times = t - STEP * np.arange(60)[::-1]
        ff.observe(t, window(t, {n: np.array([f(x) for x in times]) for n, f in load.items()}))
        t += STEP


def test_step_means_groups_the_newest_samples() -> None:
    rate = np.array([1.0, 2.0, 3.0, 4.0, np.nan, 6.0])
    np.testing.assert_allclose(step_means(rate, 2, 3), [1.5, 3.5, 6.0])
    out = step_means(np.array([5.0]), 2, 2)
    assert np.isnan(out[0]) and out[1] == 5.0


def test_resample_coarse_to_fine_repeats_and_fine_to_coarse_averages() -> None:
    np.testing.assert_allclose(resample(np.array([1.0, 3.0]), 600.0, 300.0), [1, 1, 3, 3])
    np.testing.assert_allclose(resample(np.array([1.0, 3.0, 5.0, 7.0]), 30.0, 60.0), [2, 6])
    out = resample(np.array([1.0, np.nan, 5.0, 7.0]), 30.0, 60.0)
    assert np.isnan(out[0]) and out[1] == 6.0


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(0, 1e4), min_size=1, max_size=50), st.sampled_from([10.0, 60.0, 600.0]))
def test_resample_keeps_the_request_count(values: list[float], to_step: float) -> None:
    series = np.array(values)
    out = resample(series, 60.0, to_step)
    # the new grid ends where the series ends; whole new steps only
    covered = out.size * to_step
    tail = covered / 60.0
    full = int(tail)
    expected = series[series.size - full :].sum() * 60.0 if full else 0.0
    if tail > full:
        expected += series[series.size - full - 1] * (tail - full) * 60.0
    assert out.sum() * to_step == pytest.approx(expected, rel=1e-9, abs=1e-6)


def test_folds_only_at_step_boundaries() -> None:
    ff = FleetForecaster(step_s=60.0)
    ff.sync(["a"], {})
    assert not ff.observe(0.0, window(0.0, {"a": np.ones(6)}))  # the clock starts
    assert not ff.observe(30.0, window(30.0, {"a": np.ones(6)}))
    assert ff.observe(60.0, window(60.0, {"a": np.ones(6)}))
    assert not ff.observe(70.0, window(70.0, {"a": np.ones(6)}))


def test_follows_a_level_shift_up() -> None:
    ff = FleetForecaster(step_s=60.0, season_s=None)
    ff.sync(["a"], {})
    run(ff, {"a": lambda t: 10.0 if t < 3600 else 40.0}, 0.0, 3600.0 + 1800.0)
    q = ff.quantiles("a", 5400.0, 120.0)
    levels = ff.levels
    assert q is not None
    median = float(np.interp(0.5, levels, q))
    upper = float(np.interp(0.9, levels, q))
    assert 35.0 <= median <= 45.0
    assert upper >= median


def test_warm_start_forecasts_the_history_at_once() -> None:
    ff = FleetForecaster(step_s=60.0, season_s=None)
    rng = np.random.default_rng(1)
    ff.warm_start({"a": 20.0 + rng.normal(0, 1, 600)}, 60.0)
    ff.sync(["a"], {})
    q = ff.quantiles("a", 0.0, 60.0)
    assert q is not None
    assert 17.0 <= float(np.interp(0.5, ff.levels, q)) <= 23.0


def test_a_new_model_uses_its_hint_then_similar_models() -> None:
    ff = FleetForecaster(step_s=60.0, season_s=None)
    ff.warm_start({"a": np.full(300, 50.0), "b": np.full(300, 70.0)}, 60.0)
    ff.sync(["a", "b"], {})
    ff.sync(["a", "b", "hinted", "unhinted"], {"hinted": 5.0})
    hinted = ff.quantiles("hinted", 0.0, 60.0)
    unhinted = ff.quantiles("unhinted", 0.0, 60.0)
    assert hinted is not None and unhinted is not None
    # the prior's median is near the hint (an exponential spread around it) and the upper quantiles wide
    assert 2.0 <= float(np.interp(0.5, ff.levels, hinted)) <= 6.0
    assert float(np.interp(0.99, ff.levels, hinted)) > 15.0
    # no hint: the median recent load of the models with data (60 req/s)
    assert 30.0 <= float(np.interp(0.5, ff.levels, unhinted)) <= 70.0
    # the established models kept their history through the rebuild
    a = ff.quantiles("a", 0.0, 60.0)
    assert a is not None and 45.0 <= float(np.interp(0.5, ff.levels, a)) <= 55.0


def test_models_leave_and_shards_stay_small() -> None:
    ff = FleetForecaster(step_s=60.0, season_s=None, shard_size=2)
    ff.sync(["a", "b", "c"], {})
    assert sorted(ff.models) == ["a", "b", "c"]
    assert len({ff._where[n][0] for n in "abc"}) == 2
    ff.sync(["a", "c"], {})
    assert ff.quantiles("b", 0.0, 60.0) is None
    assert sorted(ff.models) == ["a", "c"]
    run(ff, {"a": lambda t: 3.0, "c": lambda t: 9.0}, 0.0, 1200.0)
    a, c = ff.quantiles("a", 1200.0, 60.0), ff.quantiles("c", 1200.0, 60.0)
    assert a is not None and c is not None
    assert float(np.interp(0.5, ff.levels, a)) < float(np.interp(0.5, ff.levels, c))


def test_stale_metrics_are_missing_points_not_zeros() -> None:
    ff = FleetForecaster(step_s=60.0, season_s=None)
    ff.warm_start({"a": np.full(300, 30.0)}, 60.0)
    ff.sync(["a"], {})
    t = 0.0
    for _ in range(60):  # ten minutes of lost metrics
        ff.observe(t, window(t, {"a": np.zeros(60)}, stale=frozenset({"a"})))
        t += STEP
    q = ff.quantiles("a", t, 60.0)
    assert q is not None and float(np.interp(0.5, ff.levels, q)) >= 25.0


def test_longer_lead_time_never_lowers_the_forecast() -> None:
    ff = FleetForecaster(step_s=60.0, season_s=None)
    rng = np.random.default_rng(2)
    ff.warm_start({"a": np.abs(10 + np.cumsum(rng.normal(0, 1, 500)))}, 60.0)
    ff.sync(["a"], {})
    leads = [10.0, 60.0, 120.0, 240.0, 1000.0]
    qs = [ff.quantiles("a", 0.0, x) for x in leads]
    for lo, hi in itertools.pairwise(qs):
        assert lo is not None and hi is not None
        assert np.all(hi >= lo - 1e-12)


def test_the_ready_window_is_the_peak_of_the_steps_a_replica_asked_for_now_can_serve() -> None:
    ff = FleetForecaster(step_s=60.0, season_s=None)
    rng = np.random.default_rng(3)
    ff.warm_start({"a": np.abs(10 + np.cumsum(rng.normal(0, 1, 500)))}, 60.0)
    ff.sync(["a"], {})
    per_step = ff._shards[0].quantiles[0]  # (levels, steps) from the forecast's origin
    # 30 s past the origin, a 120 s cold start and an 80 s tick: the window (to 230 s) touches steps 1-4, a replica
    # serves from the middle of step 3 (150 s) on
    found = ff.lead_quantiles("a", 30.0, 200.0, from_s=120.0)
    assert found is not None
    ready = found[1]
    assert ready is not None
    np.testing.assert_array_equal(ready, per_step[:, 2:4].max(axis=1))
    np.testing.assert_array_equal(ff.quantiles("a", 30.0, 200.0), per_step[:, :4].max(axis=1))
    assert np.all(ready <= ff.quantiles("a", 30.0, 200.0))
    # a cold start within the first step leaves no step out: the whole window is the ready window
    assert ff.lead_quantiles("a", 0.0, 70.0, from_s=20.0)[1] is None
    # a cold start past the forecast's horizon: the last step (the horizon's quantiles repeat beyond it)
    np.testing.assert_array_equal(ff.lead_quantiles("a", 0.0, 1000.0, from_s=900.0)[1], per_step[:, -1])
    np.testing.assert_array_equal(found[0], ff.quantiles("a", 30.0, 200.0))  # (the whole window, as quantiles())
    assert ff.lead_quantiles("unknown", 0.0, 70.0, from_s=20.0) is None


def test_shards_are_spread_over_the_ticks_and_aligned_to_the_boundary() -> None:
    names = [f"m{i}" for i in range(12)]
    ff = FleetForecaster(step_s=60.0, season_s=None, shard_size=1)
    ff.sync(names, {})
    # the load is 10 req/s before t = 60 and 1000 after: a late shard must still fold 10 for the first step
    load = {n: (lambda t: 10.0 if t < 60.0 else 1000.0) for n in names}

    def window_at(t: float) -> MetricsWindow:
        times = t - STEP * np.arange(60)[::-1] - STEP  # sample k covers [t - (k+1) STEP, t - k STEP)
        return window(t, {n: np.array([f(x) for x in times]) for n, f in load.items()})

    ff.observe(0.0, window_at(0.0))
    updated_per_tick = []
    for t in (60.0, 70.0, 80.0, 90.0, 100.0, 110.0):
        before = [sh.step for sh in ff._shards]
        ff.observe(t, window_at(t))
        updated_per_tick.append(sum(a != sh.step for a, sh in zip(before, ff._shards, strict=True)))
    assert updated_per_tick == [2, 2, 2, 2, 2, 2]  # ceil(12 shards / 6 ticks per step) per tick
    assert all(sh.step == 1 and sh.boundary_s == 60.0 for sh in ff._shards)
    # every shard folded the first step's 10 req/s, not samples of the next step
    for sh in ff._shards:
        assert sh.batch is not None
        assert sh.batch.history()[0, -1] == pytest.approx(10.0)


def test_a_model_joining_with_a_metrics_window_starts_from_that_past() -> None:
    """A live controller (re)starting sees Prometheus' past in its first window: the forecast starts from it,
    not from the wide prior of a model with no history."""
    import numpy as np

    from autoscaler.api.snapshot import ClusterSnapshot, MetricsWindow, ModelMetrics, ModelObservation
    from autoscaler.api.spec import ModelSpec
    from autoscaler.decision.config import CoreConfig
    from autoscaler.decision.core import decide
    from autoscaler.decision.state import fresh_state
    from autoscaler.policies import make_policy
    from sharing.slots import Inventory, NodeSpec

    spec = ModelSpec(name="m", slo_latency_ms=500, service_time_ms=100, expected_rps=40.0)
    inv = Inventory.from_nodes([NodeSpec("n", "L4", 64)])
    now = 6000.0
    snap = ClusterSnapshot(now, {"m": ModelObservation("m", spec, 2)}, inv)

    def first_forecast(window_rates: np.ndarray) -> float:
        state = fresh_state()
        cfg = CoreConfig(policy=make_policy("slotwise"), report_every_decision=True)
        win = MetricsWindow(now, 15.0, {"m": ModelMetrics(rate=window_rates, in_flight=window_rates * 0.1)})
        decide(snap, win, state, cfg)
        return state.forecaster.quantiles("m", now, 60.0)[-1]

    steady = np.full(60, 10.0)  # 15 minutes at 10 req/s
    from_window = first_forecast(steady)
    from_prior = first_forecast(steady[:2])  # 30 s: less than one forecast step, the prior (40 req/s) rules
    assert from_window < 20.0 < from_prior
