"""The capacity learner on a decode-bound model (issue 17): the batch's own slowdown is the capacity model's, not a
slower service, so the learned factor stays at the hardware's (else sizing would charge the batch twice)."""

from __future__ import annotations

import numpy as np
import pytest

from autoscaler.api.spec import ModelSpec
from autoscaler.estimation import capacity as C
from autoscaler.estimation.learning import CapacityLearner, _in_flight_table

LLM = ModelSpec(name="llm", slo_latency_ms=2000.0, slo_metric="ttft", prefill_ms_per_1k_tokens=150.0,
                decode_ms_per_token=20.0, service_time_ms=4150.0, concurrency=32, decode_batch_slowdown=0.05)


@pytest.mark.parametrize("hardware", [1.0, 1.3])
def test_the_learned_factor_is_the_hardwares_not_the_batchs(hardware: float) -> None:
    prior = C.profile_from_spec(LLM)
    truth = prior.scaled(hardware)
    rate, replicas = 6.0, 3
    g = C.batch_factor(rate / replicas, truth)
    assert g > 1.3  # the batch slows this load's service by a third or more
    a = rate / replicas * truth.mean_s * g  # busy slots per replica (the capacity model's mean-field batch)
    ys, xs = _in_flight_table(32, round(prior.scv, 9))
    in_flight = float(np.interp(a, xs, ys)) * replicas  # what the replicas hold: in service + queued
    est = CapacityLearner(prior).estimate(rate, replicas, in_flight)
    assert est == pytest.approx(hardware, rel=0.02)


def test_a_learned_factor_leaves_the_declared_itl_alone() -> None:
    """The factor is learned from in-flight counts, not from tokens: a factor learned low must not lift the ITL's
    batch cap (on the Azure conv trace it did, and the model was sized below its ITL count)."""
    spec = LLM.with_(slo_itl_ms=25.0, concurrency=8)
    prior = C.profile_from_spec(spec)
    learner = CapacityLearner(prior, prior_weight=0.0)
    for _ in range(50):  # readings of a service 30 % faster than declared
        learner.observe(4.0, 4, 4.0 * 0.7 * prior.mean_s / 4 * 4)
    prof = learner.profile()
    assert learner.scale < 0.8 and prof.mean_s < 0.8 * prior.mean_s
    assert prof.itl_base_s == prior.itl_base_s and prof.itl_cap == prior.itl_cap == 6
    learner.declare_speed("L4-24GB/whole", 0.5)  # a kind declared twice as slow decodes twice as slowly
    assert learner.profile("L4-24GB/whole").itl_base_s == pytest.approx(2 * prior.itl_base_s)
