"""The trace's past as the controller's history: trace splitting, the workload's history, the warm start."""

from __future__ import annotations

import numpy as np
import pytest

from autoscaler.api.spec import ModelSpec
from autoscaler.policies import make_policy
from autoscaler.sim.run import SimConfig, _forecaster, simulate
from autoscaler.sim.workload import build_workload
from forecasting.traces.model import RateSeries, RequestLog
from forecasting.traces.ops import split
from sharing.cluster import nodes_from_spec

SPEC = ModelSpec(name="a", slo_latency_ms=1000.0, service_time_ms=100.0, concurrency=4, cold_start_s=30.0)


def log(times: list[float], models: list[int]) -> RequestLog:
    return RequestLog(t=np.array(times), model_index=np.array(models, dtype=np.int32), models=("a", "b"))


def test_split_a_request_log_bins_the_past_and_moves_the_rest_to_zero() -> None:
    trace = log([1.0, 30.0, 61.0, 119.0, 125.0, 200.0], [0, 1, 0, 0, 1, 0])
    past, rest = split(trace, 120.0, step_s=60.0)
    # two 60 s steps of history, as rates
    np.testing.assert_allclose(past.rates * 60.0, [[1, 2], [1, 0]])
    assert past.step_s == 60.0 and past.models == ("a", "b")
    np.testing.assert_allclose(rest.t, [5.0, 80.0])
    assert list(rest.model_index) == [1, 0]


def test_split_a_rate_series_keeps_whole_steps() -> None:
    rates = np.arange(12.0).reshape(2, 6)
    trace = RateSeries(rates=rates, models=("a", "b"), step_s=600.0)
    past, rest = split(trace, 1800.0)
    np.testing.assert_array_equal(past.rates, rates[:, :3])
    np.testing.assert_array_equal(rest.rates, rates[:, 3:])


@pytest.mark.parametrize("seconds", [0.0, -5.0, 3600.0, 1e9])
def test_split_rejects_a_history_that_is_not_a_proper_prefix(seconds: float) -> None:
    trace = RateSeries(rates=np.ones((1, 6)), models=("a",), step_s=600.0)
    with pytest.raises(ValueError, match=r"history|positive"):
        split(trace, seconds)


def test_the_sim_warm_starts_the_forecaster_from_the_history() -> None:
    # six hours at 20 req/s, then the simulated hour: the forecaster knows the level before the first tick
    rates = np.full((1, 42), 20.0)
    trace = RateSeries(rates=rates, models=("a",), step_s=600.0)
    workload = build_workload(trace, {"a": SPEC}, history_s=6 * 3600.0)
    assert workload.history is not None and workload.history.rates.shape == (1, 36)
    assert workload.duration_s == pytest.approx(3600.0)
    forecaster = _forecaster(workload, make_policy("slotwise"))
    assert forecaster is not None
    forecaster.sync(["a"], {})
    q = forecaster.quantiles("a", 0.0, 60.0)
    assert q is not None and float(np.interp(0.5, forecaster.levels, q)) == pytest.approx(20.0, rel=0.1)
    # policies that do not forecast get none, and a workload without history none either
    assert _forecaster(workload, make_policy("hpa")) is None
    assert _forecaster(build_workload(trace, {"a": SPEC}), make_policy("slotwise")) is None


def test_history_changes_only_what_is_simulated() -> None:
    rates = np.full((1, 12), 5.0)
    trace = RateSeries(rates=rates, models=("a",), step_s=600.0)
    nodes = nodes_from_spec("4xH100-80GB")
    full = simulate(build_workload(trace, {"a": SPEC}), nodes, make_policy("hpa"), SimConfig(burn_in_s=0.0))
    later = simulate(
        build_workload(trace, {"a": SPEC}, history_s=3600.0), nodes, make_policy("hpa"), SimConfig(burn_in_s=0.0)
    )
    assert later.minute_arrivals.sum() == pytest.approx(full.minute_arrivals.sum() / 2, rel=1e-6)  # 1 h of 2
