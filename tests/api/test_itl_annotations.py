"""The ITL (TPOT) SLO beside the TTFT one (issue 17, item 3): parsed in one place, bounded like the other latency
keys, and the existing keys keep their meaning."""

from __future__ import annotations

import pytest

from autoscaler.api.spec import (
    PREFIX,
    ModelSpec,
    SpecError,
    SpecLimits,
    limit_problems,
    parse_annotations,
    parse_mapping,
)


def _ann(**kv: str) -> dict[str, str]:
    return {PREFIX + k.replace("_", "-"): v for k, v in kv.items()}


def test_ttft_and_itl_are_declared_together() -> None:
    spec = parse_annotations("llama", _ann(slo_latency_ms="2000", slo_metric="ttft", slo_itl_ms="40",
                                           decode_ms_per_token="20", decode_batch_slowdown="0.05"))
    assert spec.slo_metric == "ttft" and spec.slo_latency_s == pytest.approx(2.0)
    assert spec.slo_itl_s == pytest.approx(0.04)
    assert spec.decode_batch_slowdown == 0.05


def test_without_the_new_keys_a_spec_means_what_it_meant() -> None:
    spec = parse_annotations("m", _ann(slo_latency_ms="800", slo_metric="ttft", decode_ms_per_token="20"))
    assert spec.slo_itl_ms is None and spec.slo_itl_s is None and spec.decode_batch_slowdown == 0.0
    assert spec == ModelSpec(name="m", slo_latency_ms=800.0, slo_metric="ttft", decode_ms_per_token=20.0)


def test_an_itl_target_needs_the_decode_cost() -> None:
    with pytest.raises(SpecError) as info:
        parse_annotations("m", _ann(slo_latency_ms="800", slo_itl_ms="40"))
    (p,) = info.value.problems
    assert p.key == PREFIX + "slo-itl-ms" and "decode-ms-per-token" in p.reason
    # ... which the simulator's defaults may supply (a models file's defaults apply to every model)
    base = ModelSpec(name="x", decode_ms_per_token=20.0)
    assert parse_mapping("m", {"slo-latency-ms": 800, "slo-itl-ms": 40}, defaults=base).slo_itl_ms == 40.0


@pytest.mark.parametrize(("value", "why"), [("1e300", "above the cap limits.max_latency_ms"),
                                            ("1e-300", "below the floor limits.min_latency_ms")])
def test_the_itl_target_is_bounded_like_the_other_latencies(value: str, why: str) -> None:
    spec = parse_annotations("m", _ann(slo_latency_ms="800", slo_itl_ms=value, decode_ms_per_token="20"))
    (p,) = limit_problems(spec, SpecLimits())
    assert p.key == PREFIX + "slo-itl-ms" and why in p.reason
