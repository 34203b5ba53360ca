"""The annotation schema (autoscaler/api/spec.py): every key parses, every bad value is reported precisely."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from autoscaler.api.spec import (
    PREFIX,
    SCHEMA,
    ModelSpec,
    SpecError,
    is_managed,
    parse_annotations,
    parse_mapping,
)

DOCS = Path(__file__).resolve().parents[2] / "docs" / "annotations.md"

# One valid, non-default value per key and the ModelSpec field value it must produce.
VALID: dict[str, tuple[str, str, object]] = {
    "slo-latency-ms": ("250.5", "slo_latency_ms", 250.5),
    "slo-percentile": ("99.9", "slo_percentile", 99.9),
    "slo-metric": ("ttft", "slo_metric", "ttft"),
    "slo-itl-ms": ("45", "slo_itl_ms", 45.0),
    "min-replicas": ("3", "min_replicas", 3),
    "max-replicas": ("7", "max_replicas", 7),
    "gpu-memory-gib": ("20", "gpu_memory_gib", 20.0),
    "gpu-compute-share": ("0.25", "gpu_compute_share", 0.25),
    "gpus-per-replica": ("2", "gpus_per_replica", 2),
    "slot-kinds": ("mig, share", "slot_kinds", ("mig", "share")),
    "slot-speeds": ("L4=0.4, 1g.10gb = 0.25", "slot_speeds", (("L4", 0.4), ("1g.10gb", 0.25))),
    "team": ("search", "team", "search"),
    "priority": ("-5", "priority", -5),
    "cold-start-seconds": ("0", "cold_start_s", 0.0),
    "service-time-ms": ("42", "service_time_ms", 42.0),
    "prefill-ms-per-1k-tokens": ("150", "prefill_ms_per_1k_tokens", 150.0),
    "decode-ms-per-token": ("0", "decode_ms_per_token", 0.0),
    "decode-batch-slowdown": ("0.05", "decode_batch_slowdown", 0.05),
    "concurrency": ("8", "concurrency", 8),
    "kv-cache-tokens": ("65536", "kv_cache_tokens", 65536),
    "expected-rps": ("12.5", "expected_rps", 12.5),
    "keep-alive": ("hybrid", "keep_alive", "hybrid"),
    "keep-alive-seconds": ("900", "keep_alive_s", 900.0),
    "cold-start-worth-seconds": ("120", "cold_start_worth_s", 120.0),
}

# (key, bad value, a fragment of the rule the message must state)
INVALID: list[tuple[str, str, str]] = [
    ("slo-latency-ms", "0", "positive"),
    ("slo-latency-ms", "-3", "positive"),
    ("slo-latency-ms", "inf", "positive"),
    ("slo-latency-ms", "nan", "positive"),
    ("slo-latency-ms", "fast", ""),
    ("slo-percentile", "100", "strictly between 0 and 100"),
    ("slo-percentile", "0", "strictly between 0 and 100"),
    ("slo-metric", "p99", "one of e2e, ttft"),
    ("min-replicas", "-1", ">= 0"),
    ("min-replicas", "1.5", "whole number"),
    ("max-replicas", "0", ">= 1"),
    ("max-replicas", "many", "whole number"),
    ("gpu-memory-gib", "0", "positive"),
    ("gpu-compute-share", "1.5", "(0, 1]"),
    ("gpu-compute-share", "0", "(0, 1]"),
    ("gpus-per-replica", "0", ">= 1"),
    ("slot-kinds", "whole,fpga", "subset of whole, mig, share"),
    ("slot-kinds", " , ", "subset of whole, mig, share"),
    ("slot-speeds", "L4=fast", "L4: speed 'fast' must be a number > 0"),
    ("slot-speeds", "L4=0", "L4: speed '0' must be a number > 0"),
    ("slot-speeds", "=0.5", "empty slot kind"),
    ("slot-speeds", "L4", "not KIND=SPEED"),
    ("team", "x" * 64, "at most 63"),
    ("team", "   ", "non-empty"),
    ("priority", "high", "whole number"),
    ("cold-start-seconds", "-1", ">= 0"),
    ("service-time-ms", "0", "positive"),
    ("prefill-ms-per-1k-tokens", "-0.5", ">= 0"),
    ("decode-ms-per-token", "-2", ">= 0"),
    ("decode-batch-slowdown", "1.5", "[0, 1]"),
    ("decode-batch-slowdown", "-0.1", "[0, 1]"),
    ("slo-itl-ms", "0", "positive"),
    ("concurrency", "0", ">= 1"),
    ("keep-alive", "forever", "one of learned, hybrid, fixed"),
    ("keep-alive-seconds", "0", "positive"),
    ("cold-start-worth-seconds", "-1", ">= 0"),
]


def ann(**kv: str) -> dict[str, str]:
    """Annotations from python-friendly names: ``slo_latency_ms="100"`` -> ``slotwise.io/slo-latency-ms``."""
    return {PREFIX + k.replace("_", "-"): v for k, v in kv.items()}


def test_schema_is_the_documented_schema() -> None:
    documented = set(re.findall(r"`slotwise\.io/([a-z0-9-]+)`", DOCS.read_text()))
    documented.discard("status")  # written by slotwise, not a user key
    assert documented == set(SCHEMA)
    assert set(VALID) == set(SCHEMA), "this test's table must cover every key"


@pytest.mark.parametrize("key", sorted(VALID))
def test_every_key_parses_to_its_field(key: str) -> None:
    raw, field_name, expected = VALID[key]
    annotations = {PREFIX + "slo-latency-ms": "500", PREFIX + key: raw}
    if key == "min-replicas":
        annotations[PREFIX + "max-replicas"] = "10"
    if key == "slo-itl-ms":
        annotations[PREFIX + "decode-ms-per-token"] = "20"  # an ITL target needs the ITL of a batch of one
    spec = parse_annotations("llama", annotations, namespace="ml")
    assert getattr(spec, field_name) == expected
    assert spec.name == "llama" and spec.namespace == "ml" and spec.key == "ml/llama"


def test_all_keys_at_once() -> None:
    annotations = {PREFIX + k: raw for k, (raw, _, _) in VALID.items()}
    spec = parse_annotations("m", annotations)
    for _key, (_raw, field_name, expected) in VALID.items():
        assert getattr(spec, field_name) == expected, field_name
    assert spec.slo_latency_s == pytest.approx(0.2505)
    assert spec.service_time_s == pytest.approx(0.042)


def test_defaults_when_only_the_latency_is_given() -> None:
    spec = parse_annotations("m", {PREFIX + "slo-latency-ms": "800"})
    assert spec == ModelSpec(name="m", slo_latency_ms=800.0)
    assert spec.slo_percentile == 95.0 and spec.min_replicas == 1 and spec.max_replicas == 100
    assert spec.gpu_memory_gib is None and spec.slot_kinds == ("whole", "mig", "share")


def test_values_are_stripped() -> None:
    spec = parse_annotations("m", ann(slo_latency_ms="  300 ", slo_metric=" ttft"))
    assert spec.slo_latency_ms == 300.0 and spec.slo_metric == "ttft"


@pytest.mark.parametrize(("key", "value", "rule"), INVALID)
def test_each_invalid_value_names_key_value_and_rule(key: str, value: str, rule: str) -> None:
    annotations = {PREFIX + "slo-latency-ms": "500", PREFIX + key: value}
    with pytest.raises(SpecError) as info:
        parse_annotations("llama", annotations, namespace="ml")
    err = info.value
    assert err.model == "ml/llama"
    assert len(err.problems) == 1
    p = err.problems[0]
    assert p.key == PREFIX + key
    assert p.value == value.strip()
    assert p.reason, "a problem must state the rule it broke"
    assert rule in p.reason
    msg = str(err)
    assert msg.startswith("model ml/llama: ")
    assert PREFIX + key in msg and repr(value.strip()) in msg and p.reason in msg


@pytest.mark.parametrize(
    ("key", "rule"),
    [
        ("slo-latency-ms", "positive"),
        ("slo-percentile", "between 0 and 100"),
        ("gpu-compute-share", "(0, 1]"),
        ("cold-start-seconds", ">= 0"),
    ],
)
def test_non_numeric_value_states_the_rule(key: str, rule: str) -> None:
    with pytest.raises(SpecError) as info:
        parse_mapping("m", {"slo-latency-ms": "100", key: "fast"})
    assert rule in info.value.problems[0].reason


def test_several_problems_are_reported_at_once() -> None:
    annotations = ann(slo_latency_ms="-1", slo_percentile="100", concurrency="zero")
    annotations[PREFIX + "min-replcas"] = "2"  # typo
    annotations["app.kubernetes.io/name"] = "llama"  # not ours: ignored
    with pytest.raises(SpecError) as info:
        parse_annotations("llama", annotations)
    keys = {p.key for p in info.value.problems}
    assert keys == {
        PREFIX + "slo-latency-ms",
        PREFIX + "slo-percentile",
        PREFIX + "concurrency",
        PREFIX + "min-replcas",
    }
    msg = str(info.value)
    assert msg.count(";") == 3
    for k in keys:
        assert k in msg


def test_missing_required_latency_is_a_problem_with_the_others() -> None:
    with pytest.raises(SpecError) as info:
        parse_mapping("m", {"concurrency": "0"})
    by_key = {p.key: p for p in info.value.problems}
    assert set(by_key) == {"slo-latency-ms", "concurrency"}
    assert "required" in by_key["slo-latency-ms"].reason


def test_unknown_slotwise_key_is_rejected_not_defaulted() -> None:
    with pytest.raises(SpecError) as info:
        parse_annotations("m", {PREFIX + "slo-latency-ms": "100", PREFIX + "max-replica": "5"})
    (p,) = info.value.problems
    assert p.key == PREFIX + "max-replica" and p.value == "5" and "unknown key" in p.reason


def test_status_key_written_by_slotwise_is_ignored() -> None:
    spec = parse_annotations("m", {PREFIX + "slo-latency-ms": "100", PREFIX + "status": '{"desired": 3}'})
    assert spec.slo_latency_ms == 100.0


def test_non_slotwise_annotations_are_ignored() -> None:
    annotations = {
        PREFIX + "slo-latency-ms": "100",
        "deployment.kubernetes.io/revision": "4",
        "autoscaling.knative.dev/min-scale": "not-a-number",
        "slotwise.io": "x",  # no slash suffix: not a slotwise.io/ key
        "other.slotwise.io/min-replicas": "-1",
    }
    spec = parse_annotations("m", annotations)
    assert spec == ModelSpec(name="m", slo_latency_ms=100.0)


@pytest.mark.parametrize(("lo", "hi"), [("5", "4"), ("101", None), (None, "0")])
def test_min_greater_than_max_is_rejected(lo: str | None, hi: str | None) -> None:
    values = {"slo-latency-ms": "100"}
    if lo is not None:
        values["min-replicas"] = lo
    if hi is not None:
        values["max-replicas"] = hi
    with pytest.raises(SpecError) as info:
        parse_annotations("m", {PREFIX + k: v for k, v in values.items()})
    keys = [p.key for p in info.value.problems]
    assert len(keys) == 1
    assert keys[0] in (PREFIX + "min-replicas", PREFIX + "max-replicas")
    assert "max" in info.value.problems[0].reason or ">= 1" in info.value.problems[0].reason


def test_min_equal_to_max_is_fine() -> None:
    spec = parse_annotations("m", ann(slo_latency_ms="100", min_replicas="4", max_replicas="4"))
    assert spec.min_replicas == spec.max_replicas == 4


def test_min_above_default_max_names_the_max() -> None:
    with pytest.raises(SpecError) as info:
        parse_annotations("m", ann(slo_latency_ms="100", min_replicas="150"))
    (p,) = info.value.problems
    assert p.key == PREFIX + "min-replicas" and p.value == "150" and "100" in p.reason


def test_parse_mapping_applies_defaults_and_keeps_the_rest() -> None:
    base = ModelSpec(name="ignored", namespace="ignored", slo_percentile=99.0, concurrency=8, team="infra")
    spec = parse_mapping("code", {"slo-latency-ms": 800, "concurrency": 4}, namespace="prod", defaults=base)
    assert spec.name == "code" and spec.namespace == "prod"
    assert spec.slo_latency_ms == 800.0
    assert spec.concurrency == 4  # overridden
    assert spec.slo_percentile == 99.0 and spec.team == "infra"  # from the defaults


def test_parse_mapping_accepts_non_string_values_and_no_required() -> None:
    spec = parse_mapping("m", {"gpu-memory-gib": 40, "slot-kinds": "whole"}, required=())
    assert spec.gpu_memory_gib == 40.0 and spec.slot_kinds == ("whole",)
    assert spec.slo_latency_ms == ModelSpec(name="m").slo_latency_ms


def test_parse_mapping_checks_min_against_the_defaults_max() -> None:
    base = ModelSpec(name="m", max_replicas=3)
    with pytest.raises(SpecError) as info:
        parse_mapping("m", {"slo-latency-ms": 1, "min-replicas": 4}, defaults=base)
    assert info.value.problems[0].key == "min-replicas"


def test_parse_mapping_keys_are_unprefixed_in_messages() -> None:
    with pytest.raises(SpecError) as info:
        parse_mapping("m", {"slo-latency-ms": "x"})
    assert info.value.problems[0].key == "slo-latency-ms"
    assert PREFIX not in str(info.value)


def test_is_managed() -> None:
    assert is_managed({PREFIX + "slo-latency-ms": "100"})
    assert is_managed({PREFIX + "slo-latency-ms": "garbage"})  # managed, and then reported invalid
    assert not is_managed({})
    assert not is_managed({PREFIX + "min-replicas": "1", PREFIX + "team": "a"})
    assert not is_managed({"slo-latency-ms": "100"})


def test_with_returns_a_changed_copy() -> None:
    spec = ModelSpec(name="m")
    other = spec.with_(concurrency=3)
    assert other.concurrency == 3 and spec.concurrency == 1
