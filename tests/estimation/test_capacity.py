"""Queueing prior: Erlang C, steady-state attainment, minimal replica search, profiles."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from autoscaler.api.spec import ModelSpec
from autoscaler.estimation.capacity import (
    ServiceProfile,
    attainment,
    erlang_c,
    min_replicas_for_slo,
    profile_from_samples,
    profile_from_spec,
)


def test_erlang_c_known_values() -> None:
    assert erlang_c(1, 0.7) == pytest.approx(0.7)  # M/M/1: P(wait) = rho
    assert erlang_c(2, 1.0) == pytest.approx(1 / 3)
    assert erlang_c(10, 8.0) == pytest.approx(0.4092, abs=1e-4)  # textbook M/M/10 at 8 Erlangs
    assert erlang_c(4, 4.0) == 1.0 and erlang_c(4, 5.0) == 1.0  # unstable: everybody waits
    assert erlang_c(3, 0.0) == 0.0


def test_erlang_c_stable_for_large_c() -> None:
    c = np.array([200, 400, 800])
    v = erlang_c(c, 0.95 * c)
    assert np.all(np.isfinite(v)) and np.all((v > 0) & (v < 1))
    # More servers at the same utilisation: less waiting (pooling).
    assert v[0] > v[1] > v[2]


def _profile(conc: int = 4, slo: float = 5.0) -> ServiceProfile:
    # an exponential(1 s) prior: its top bin's mean is 1 + ln 32 = 4.47 s, so a 5 s SLO is reachable
    spec = ModelSpec("m", service_time_ms=1000.0, concurrency=conc, slo_latency_ms=slo * 1e3)
    return profile_from_spec(spec)


def test_attainment_monotone() -> None:
    p = _profile()
    by_replicas = [attainment(10.0, r, p) for r in range(1, 12)]
    assert all(b >= a for a, b in itertools.pairwise(by_replicas))
    assert by_replicas[0] == 0.0  # 10 req/s on 4 slots of 1 s: unstable
    by_load = [attainment(rate, 5, p) for rate in np.linspace(1, 19, 10)]
    assert all(b <= a for a, b in itertools.pairwise(by_load))
    assert attainment(0.0, 0, p) == 1.0
    assert attainment(1.0, 0, p) == 0.0


def test_min_replicas_minimal() -> None:
    p = _profile()
    target = p.percentile / 100
    for rate in (0.5, 3.0, 17.0, 250.0):
        r = min_replicas_for_slo(rate, p)
        assert attainment(rate, r, p) >= target
        assert r == 1 or attainment(rate, r - 1, p) < target
    assert min_replicas_for_slo(0.0, p) == 0
    # SLO below the service time itself: no replica count is enough.
    hopeless = _profile(slo=0.001)
    assert min_replicas_for_slo(5.0, hopeless, max_replicas=50) == 50


def test_profile_from_spec() -> None:
    p = profile_from_spec(ModelSpec("m", service_time_ms=250.0, concurrency=3, slo_latency_ms=900.0))
    assert p.mean_s == pytest.approx(0.25)
    assert 0.9 < p.scv < 1.0  # exponential, minus the within-bin spread
    assert p.concurrency == 3 and p.slo_s == pytest.approx(0.9)
    np.testing.assert_allclose(p.latency_part_s, p.occupancy_s)
    ttft = profile_from_spec(
        ModelSpec("m", service_time_ms=1000.0, slo_metric="ttft", prefill_ms_per_1k_tokens=200.0)
    )
    np.testing.assert_allclose(ttft.latency_part_s, 0.2 * ttft.occupancy_s)


def test_prior_points_are_the_exponential_bins_conditional_means() -> None:
    """Each prior point lies inside its own equal-probability bin of the exponential (never negative).

    A reflected set (the points mirrored about the mean) has the same mean and variance, so only the
    points themselves catch it: the top bin's conditional mean is then below zero.
    """
    k, mean = 32, 0.25
    occ = profile_from_spec(ModelSpec("m", service_time_ms=mean * 1000.0)).occupancy_s
    assert len(occ) == k and (occ > 0).all()
    assert np.all(np.diff(occ) > 0)  # bins in quantile order
    u = np.linspace(0.0, 1.0, k + 1)
    quantile = -mean * np.log1p(-u[:-1])  # each bin's lower edge; the upper edge of the top bin is infinite
    upper = np.append(-mean * np.log1p(-u[1:-1]), np.inf)
    assert np.all(occ >= quantile) and np.all(occ <= upper)
    # the top bin's conditional mean in closed form: mean * (1 + ln k)
    assert occ[-1] == pytest.approx(mean * (1.0 + np.log(k)))


def test_profile_from_samples_keeps_mean() -> None:
    rng = np.random.default_rng(0)
    occ = rng.lognormal(0.0, 1.0, 5000)
    p = profile_from_samples(occ, occ * 0.1, concurrency=8, slo_s=1.0, percentile=99.0, k=32)
    assert len(p.occupancy_s) == 32
    assert p.mean_s == pytest.approx(occ.mean(), rel=1e-3)  # bins differ by one sample at most
    true_scv = occ.var() / occ.mean() ** 2
    assert 0.7 * true_scv < p.scv <= true_scv


def test_predicted_latency_meets_slo_exactly_at_the_sized_replicas() -> None:
    from autoscaler.estimation.capacity import min_replicas_for_slo, predicted_latency_s

    spec = ModelSpec(name="m", slo_latency_ms=600, service_time_ms=100, concurrency=4)  # top bin: 447 ms
    prof = profile_from_spec(spec)
    n = min_replicas_for_slo(50.0, prof)
    # sized replicas meet the SLO, one fewer does not: the predicted latency brackets the SLO the same way
    assert predicted_latency_s(50.0, n, prof) <= prof.slo_s + 1e-6
    assert predicted_latency_s(50.0, n - 1, prof) > prof.slo_s
    # more replicas never predict a higher latency; no load is the service time's percentile
    assert predicted_latency_s(50.0, n + 3, prof) <= predicted_latency_s(50.0, n, prof)
    assert predicted_latency_s(0.0, 1, prof) <= prof.slo_s
    assert predicted_latency_s(1000.0, 1, prof) == float("inf")


# -- bursts as batches (issue 15) ------------------------------------------------------------------


def test_batch_replicas_serves_the_percentile_of_a_batch_within_the_budget() -> None:
    from autoscaler.estimation.capacity import batch_replicas

    # 0.1 s service, one slot, SLO 1 s (budget 0.9 s at every point): a replica's slot turns over 1 + 9 times
    # within the budget, so 10 requests of a batch per replica are in time.
    prof = ServiceProfile(occupancy_s=np.full(8, 0.1), latency_part_s=np.full(8, 0.1), concurrency=1, slo_s=1.0,
                          percentile=95.0)
    assert batch_replicas(0.0, 1.0, prof) == 0  # Poisson: no batch to charge
    assert batch_replicas(0.0, 40.0, prof) == 4  # 0.95 x 40 = 38 -> 4 replicas of 10
    # the base load holds slots too: 20 req/s x 0.1 s = 2 busy slots, over 10 turnovers each = 20 more
    assert batch_replicas(20.0, 40.0, prof) == 6
    # a bigger batch never needs fewer replicas
    counts = [batch_replicas(5.0, float(b), prof) for b in range(1, 200)]
    assert all(a <= b for a, b in itertools.pairwise(counts))


def test_batch_replicas_of_the_azure_code_model_is_a_handful_not_the_ceiling() -> None:
    # the bursts that Allen-Cunneen at ca^2 = 64 sized at 201 replicas: a batch of 64 at 6 req/s, 0.86 s service
    from autoscaler.estimation.capacity import batch_replicas

    prof = ServiceProfile(occupancy_s=np.full(8, 0.86), latency_part_s=np.full(8, 0.5), concurrency=8, slo_s=2.0,
                          percentile=95.0)
    assert 2 <= batch_replicas(6.0, 64.0, prof) <= 5
