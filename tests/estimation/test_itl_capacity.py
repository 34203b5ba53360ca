"""Decode-bound saturation and the TTFT+ITL SLO in the capacity model (issue 17, item 3): ITL(b) = d (1 + alpha
(b - 1)); the ITL target caps the decode batch; the replicas a model needs are the larger of its two counts."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autoscaler.api.spec import ModelSpec
from autoscaler.estimation import capacity as C

LLM = ModelSpec(name="llm", slo_latency_ms=2000.0, slo_metric="ttft", prefill_ms_per_1k_tokens=150.0,
                decode_ms_per_token=20.0, service_time_ms=4150.0, concurrency=32)


def test_the_itl_target_caps_the_batch_by_the_linear_law() -> None:
    # ITL(b) = 20 ms (1 + 0.05 (b - 1)) <= 40 ms  <=>  b <= 21
    p = C.profile_from_spec(LLM.with_(slo_itl_ms=40.0, decode_batch_slowdown=0.05))
    assert p.itl_cap == 21
    assert p.itl_s(21) == pytest.approx(0.040) and p.itl_s(22) > 0.040
    # a full batch (32) already meets 60 ms: the ITL never binds; 15 ms no batch meets: out of reach, not a cap
    assert C.profile_from_spec(LLM.with_(slo_itl_ms=60.0, decode_batch_slowdown=0.05)).itl_cap is None
    out = C.profile_from_spec(LLM.with_(slo_itl_ms=15.0, decode_batch_slowdown=0.05))
    assert out.itl_cap is None and not out.itl_reachable


def test_the_itl_bound_binds_and_names_itself() -> None:
    itl = C.profile_from_spec(LLM.with_(slo_itl_ms=25.0, decode_batch_slowdown=0.05))  # batch <= 6 of 32
    lat, itl_n = C.slo_bounds(5.0, itl)
    assert itl_n > lat >= 1
    assert C.min_replicas_for_slo(5.0, itl) == itl_n == C.itl_replicas(5.0, itl)
    # at that count the ITL is met at the percentile, one fewer misses it
    assert C.itl_attainment(5.0, itl_n, itl) >= 0.95 > C.itl_attainment(5.0, itl_n - 1, itl)


def test_the_batch_slows_the_service_so_a_replica_saturates() -> None:
    plain = C.profile_from_spec(LLM)
    slowed = C.profile_from_spec(LLM.with_(decode_batch_slowdown=0.05))
    # full batch: the decode (4 s of the 4.15 s) takes 1 + 0.05 x 31 = 2.55 times as long: 32 / 10.35 s per replica
    assert C.batch_factor(100.0, slowed) == float("inf")
    assert C.latency_attainment(3.2, 1, slowed) == 0.0 < C.latency_attainment(3.2, 1, plain)
    assert C.min_replicas_for_slo(20.0, slowed) > C.min_replicas_for_slo(20.0, plain)
    assert C.min_replicas_for_slo(20.0, slowed) >= 20.0 * 10.35 / 32


def test_without_an_itl_slo_and_a_slowdown_the_model_answers_as_before() -> None:
    p = C.profile_from_spec(LLM)
    bare = C.ServiceProfile(occupancy_s=p.occupancy_s, latency_part_s=p.latency_part_s, concurrency=32,
                            slo_s=2.0, percentile=95.0)
    assert not p.decode_bound and p.itl_cap is None
    for rate in (0.5, 5.0, 50.0):
        for n in (1, 3, 10):
            assert C.attainment(rate, n, p) == C.attainment(rate, n, bare)
        assert C.min_replicas_for_slo(rate, p) == C.min_replicas_for_slo(rate, bare)
        assert C.predicted_latency_s(rate, 10, p) == C.predicted_latency_s(rate, 10, bare)


def test_an_out_of_reach_itl_is_left_to_the_status_not_to_the_count() -> None:
    ttft_only = C.profile_from_spec(LLM.with_(decode_batch_slowdown=0.05))
    out = C.profile_from_spec(LLM.with_(slo_itl_ms=15.0, decode_batch_slowdown=0.05))
    assert C.min_replicas_for_slo(5.0, out) == C.min_replicas_for_slo(5.0, ttft_only)


def test_scaling_keeps_the_itl_law_and_slows_the_tokens() -> None:
    p = C.profile_from_spec(LLM.with_(slo_itl_ms=40.0, decode_batch_slowdown=0.05))
    slow = p.scaled(1.5)
    assert slow.itl_base_s == pytest.approx(0.030) and slow.decode_slowdown == 0.05
    assert slow.itl_cap == 1 + int((40 / 30 - 1) / 0.05)  # 7: slower tokens, a smaller batch


@settings(max_examples=120, deadline=None)
@given(
    c=st.integers(1, 64),
    alpha=st.floats(0.0, 0.2),
    d_ms=st.floats(5.0, 50.0),
    itl_over=st.floats(1.0, 4.0),  # the ITL SLO as a multiple of the batch-1 ITL
    ttft_ms=st.floats(200.0, 5000.0),
    rates=st.lists(st.floats(0.01, 60.0), min_size=2, max_size=4),
    metric=st.sampled_from(["ttft", "e2e"]),
)
def test_replicas_are_monotone_in_load_and_never_below_either_slo(
        c: int, alpha: float, d_ms: float, itl_over: float, ttft_ms: float, rates: list[float], metric: str) -> None:
    spec = LLM.with_(concurrency=c, decode_batch_slowdown=alpha, decode_ms_per_token=d_ms,
                     service_time_ms=150.0 + 200 * d_ms, slo_itl_ms=d_ms * itl_over, slo_latency_ms=ttft_ms,
                     slo_metric=metric)
    both = C.profile_from_spec(spec)
    latency_only = replace(both, itl_slo_s=None, _memo={}, _variants={})
    prev = 0
    for rate in sorted(rates):
        n = C.min_replicas_for_slo(rate, both)
        assert n >= prev
        prev = n
        assert n >= C.min_replicas_for_slo(rate, latency_only)
        assert n >= C.itl_replicas(rate, both)
        assert n == max(C.slo_bounds(rate, both))
        if n < 10_000:
            assert C.attainment(rate, n, both) >= 0.95 - 1e-12
            assert np.isfinite(C.predicted_latency_s(rate, n, both))


def test_a_burst_is_served_in_the_batch_the_itl_allows() -> None:
    """The burst floor (a batch of arrivals served in time) fills only the ITL's batch on each replica, each request
    as slowly as that batch: on the Azure code trace, bursts sized on all 8 slots left minutes of ITL misses."""
    plain = C.profile_from_spec(LLM)
    capped = C.profile_from_spec(LLM.with_(slo_itl_ms=25.0, decode_batch_slowdown=0.05))  # 6 of the 32 slots
    assert C.batch_replicas(2.0, 64.0, capped) > C.batch_replicas(2.0, 64.0, plain)
    assert C.batch_replicas(2.0, 1.0, capped) == 0  # no burst, no floor
