"""Offered work (autoscaler/estimation/work.py): what the slotwise forecaster forecasts for a model that learns."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from autoscaler.api.snapshot import ModelMetrics
from autoscaler.estimation.capacity import ServiceProfile, wait_params
from autoscaler.estimation.learning import CapacityLearner
from autoscaler.estimation.work import offered_rate, work_unit

PRIOR = ServiceProfile(occupancy_s=np.full(8, 2.0), latency_part_s=np.full(8, 0.5), concurrency=8, slo_s=10.0,
                       percentile=95.0)


def in_flight_at(rate: float, ready: int, mean_s: float, profile: ServiceProfile = PRIOR) -> float:
    """The queueing model's mean in system at ``rate`` on ``ready`` replicas whose mean service is ``mean_s``
    (the forward model the learner inverts: busy servers + queue, Little's law)."""
    x = rate / ready * mean_s
    p_wait, decay = wait_params(np.array([x]), profile.concurrency, 1.0, round(profile.scv, 9))
    queue = p_wait[0] / decay[0] if p_wait[0] > 0 and decay[0] > 0 else (0.0 if p_wait[0] <= 0 else math.inf)
    return float(ready * x * (1.0 + queue))


@given(rate=st.floats(0.5, 20.0), ready=st.integers(1, 8), scale=st.floats(0.3, 3.0))
def test_work_is_rate_times_the_service_the_requests_took(rate: float, ready: int, scale: float) -> None:
    # Requests taking ``scale`` x the declared service: the in-flight count says so, whatever the learner has learned.
    mean_s = PRIOR.mean_s * scale
    if rate / ready * mean_s >= 0.95 * PRIOR.concurrency:
        return  # beyond the stable range: no steady state to read (covered below)
    learner = CapacityLearner(PRIOR)
    f = in_flight_at(rate, ready, mean_s)
    m = ModelMetrics(rate=np.full(6, rate), in_flight=np.full(6, f))
    work = offered_rate(m, ready, learner, unit=1.0, arrival_scv=1.0, budget_s=10.0)
    assert np.allclose(work, rate * scale, rtol=2e-3)


def test_many_short_and_few_long_requests_that_keep_the_replicas_as_busy_are_the_same_work() -> None:
    learner = CapacityLearner(PRIOR)
    busy = ModelMetrics(rate=np.array([6.0, 3.0]),
                        in_flight=np.array([in_flight_at(6.0, 4, 1.0), in_flight_at(3.0, 4, 2.0)]))
    work = offered_rate(busy, 4, learner, unit=1.0, arrival_scv=1.0, budget_s=10.0)
    assert work[0] == work[1] != 0  # (6 req/s of 1 s and 3 req/s of 2 s: 3 req/s of the declared 2 s each)
    assert math.isclose(work[0], 3.0, rel_tol=2e-3)


def test_over_dispersed_arrivals_saturated_or_missing_samples_fall_back_to_the_request_rate() -> None:
    learner = CapacityLearner(PRIOR)
    rate = np.array([4.0, 4.0, np.nan, 4.0])
    in_flight = np.array([in_flight_at(4.0, 2, 3.0), 1e6, 3.0, np.nan])  # steady, saturated, rate missing, missing
    m = ModelMetrics(rate=rate, in_flight=in_flight)
    # requests taking 3 s on a profile of 3 s (unit 1.5: learned 1.5 x the declared 2 s) are 4 req/s of it
    work = offered_rate(m, 2, learner, unit=1.5, arrival_scv=1.0, budget_s=10.0)
    assert math.isclose(work[0], 4.0, rel_tol=2e-3)
    assert work[1] == work[3] == 4.0 and math.isnan(work[2])
    # bursts (dispersion above Poisson): the in-flight count holds a burst's queue, not its work
    bursty = offered_rate(m, 2, learner, unit=1.5, arrival_scv=8.0, budget_s=10.0)
    assert np.array_equal(bursty, rate, equal_nan=True)
    # no replica ready: nothing to read from
    assert np.array_equal(offered_rate(m, 0, learner, unit=1.5, arrival_scv=1.0, budget_s=10.0), rate,
                          equal_nan=True)


def test_the_unit_is_the_profile_mean_over_the_declared_one() -> None:
    learner = CapacityLearner(PRIOR)
    assert work_unit(learner, PRIOR.mean_s * 1.25) == 1.25


def test_the_fleet_forecaster_forecasts_the_signal_it_is_given_not_the_request_rate() -> None:
    from autoscaler.api.snapshot import MetricsWindow
    from autoscaler.estimation.forecast import FleetForecaster

    def run(signal: object) -> float:
        fc = FleetForecaster(step_s=60.0, horizon_s=120.0, season_s=None)
        fc.sync(["m"], {"m": 2.0})
        for k in range(40):
            now = 60.0 * k
            m = ModelMetrics(rate=np.full(6, 2.0), in_flight=np.full(6, 4.0))
            fc.observe(now, MetricsWindow(now=now, step_s=10.0, models={"m": m}), signal)  # type: ignore[arg-type]
        values = fc.quantiles("m", 40 * 60.0, 60.0)
        assert values is not None
        return float(values[len(values) // 2])

    rate_only = run(None)
    work = run(lambda rows: [m.rate * 3.0 for _, m in rows])
    assert math.isclose(rate_only, 2.0, rel_tol=0.15)
    assert math.isclose(work, 6.0, rel_tol=0.15)


def test_replicas_that_do_not_keep_up_read_at_least_the_request_rate() -> None:
    # 3.5 req/s of the declared 2 s on 1 replica of 8 slots: a steady queue, read as its work. The same rate with an
    # in-flight count whose wait is beyond the budget is a saturated replica: its in-flight says what it serves,
    # the rate what is offered.
    learner = CapacityLearner(PRIOR)
    f = in_flight_at(3.5, 1, 2.0)
    assert math.isfinite(f) and f > 7.0  # (a queue: more in flight than busy slots)
    m = ModelMetrics(rate=np.array([3.5]), in_flight=np.array([f]))
    steady = offered_rate(m, 1, learner, unit=1.0, arrival_scv=1.0, budget_s=10.0)
    assert math.isclose(steady[0], 3.5, rel_tol=2e-3)
    slow = ModelMetrics(rate=np.array([4.0]), in_flight=np.array([7.9]))  # in service ~7.4 + a queue of half a second
    assert offered_rate(slow, 1, learner, unit=1.0, arrival_scv=1.0, budget_s=10.0)[0] < 4.0  # (within budget)
    read = offered_rate(slow, 1, learner, unit=1.0, arrival_scv=1.0, budget_s=0.05)
    assert read[0] >= 4.0


_WINDOW = st.lists(st.one_of(st.floats(0.0, 400.0), st.just(math.nan), st.just(-1.0)), min_size=6, max_size=6)


@given(rows=st.lists(st.tuples(st.sampled_from([2, 8]), st.sampled_from([0.0, 0.05]), st.integers(0, 6),
                               st.sampled_from([1.0, 2.0]), st.floats(0.2, 3.0), st.floats(0.1, 20.0),
                               _WINDOW, _WINDOW, st.booleans()),
                     min_size=0, max_size=8))
def test_the_fleet_read_together_equals_each_model_read_alone(rows: list) -> None:
    # offered_rates stacks the windows of the learners that share an inversion table: every row must be exactly its
    # offered_rate, whatever the mix of table shapes, window lengths, missing or negative samples, replicas and
    # dispersions (a row that cannot read its work keeps its request rate).
    from autoscaler.estimation.work import WorkInputs, offered_rates

    inputs = []
    for c, slows, ready, scv, unit, budget, rate, in_flight, short in rows:
        prior = ServiceProfile(occupancy_s=np.full(8, 2.0), latency_part_s=np.full(8, 0.5), concurrency=c,
                               slo_s=10.0, percentile=95.0, decode_slowdown=slows, decode_share=1.0 if slows else 0.0)
        n = 4 if short else 6
        m = ModelMetrics(rate=np.array(rate[:n]), in_flight=np.array(in_flight[:n]))
        inputs.append(WorkInputs(m, ready, CapacityLearner(prior), unit, scv, budget))
    together = offered_rates(inputs)
    assert len(together) == len(inputs)
    for got, r in zip(together, inputs, strict=True):
        alone = offered_rate(r.metrics, r.ready, r.learner, r.unit, r.arrival_scv, r.budget_s)
        np.testing.assert_array_equal(got, alone)
