"""slotwise's policy on a TTFT+ITL model (issue 17, item 3): it sizes for the larger of the two counts and its detail
names the bound that set it."""

from __future__ import annotations

import numpy as np

from autoscaler.api.plan import Reason
from autoscaler.api.snapshot import ModelMetrics
from autoscaler.api.spec import ModelSpec
from autoscaler.estimation import capacity as C
from autoscaler.policies import SloPolicy
from autoscaler.policies.base import PolicyContext

LLM = ModelSpec(name="llm", slo_latency_ms=2000.0, slo_metric="ttft", prefill_ms_per_1k_tokens=150.0,
                decode_ms_per_token=20.0, service_time_ms=4150.0, concurrency=32, decode_batch_slowdown=0.05,
                max_replicas=100)


def _decide(spec: ModelSpec, rate: float = 5.0) -> tuple[int, Reason, str]:
    policy = SloPolicy(burstiness=False)
    profile = C.profile_from_spec(spec)
    r = np.full(120, rate)
    ctx = PolicyContext(now=1000.0, spec=spec, current_replicas=1, ready_replicas=1,
                        metrics=ModelMetrics(rate=r, in_flight=r * profile.mean_s), metrics_step_s=1.0,
                        forecast=None, capacity=profile, state=policy.initial_state(spec, 1), sizing_quantile=None,
                        burn=0.0)
    res = policy.decide(ctx)
    return res.desired, res.reason, res.detail


def test_itl_binds() -> None:
    spec = LLM.with_(slo_itl_ms=25.0)  # a batch of 6 of the 32 slots
    n, _, detail = _decide(spec)
    lat, itl = C.slo_bounds(C.quantize_up(5.0), C.profile_from_spec(spec), 101)
    assert n == itl > lat
    assert "ITL binds" in detail and "batch of 6 of 32" in detail


def test_ttft_binds_when_the_full_batch_meets_the_itl() -> None:
    spec = LLM.with_(slo_itl_ms=60.0)  # a full batch decodes at 51 ms a token
    n, _, detail = _decide(spec)
    assert n == _decide(LLM)[0] == C.slo_bounds(C.quantize_up(5.0), C.profile_from_spec(spec), 101)[0]
    assert "ttft binds" in detail


def test_an_itl_out_of_reach_is_said_and_the_ttft_sizes() -> None:
    n, reason, detail = _decide(LLM.with_(slo_itl_ms=15.0))  # one request alone decodes at 20 ms a token
    assert reason is Reason.SLO_UNATTAINABLE
    assert "ITL SLO 15 ms out of reach" in detail
    assert n == _decide(LLM)[0]


def test_a_model_without_an_itl_slo_has_the_detail_of_before() -> None:
    _, reason, detail = _decide(LLM)
    assert "binds" not in detail and reason is Reason.REACTIVE
