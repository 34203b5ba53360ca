"""Every numeric annotation has a bound (issue 16, failure mode 5): :class:`SpecLimits` and :func:`limit_problems`.

A value that parses can still be extreme (``concurrency`` = 10^400 is a valid whole number); the caps name the
annotation, the value and the cap, and nothing a user can write makes parsing or the check raise anything but a
:class:`SpecError`.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autoscaler.api.spec import (
    PREFIX,
    SCHEMA,
    ModelSpec,
    SpecError,
    SpecLimits,
    limit_problems,
    parse_annotations,
    within_limits,
)
from autoscaler.sim.defaults import CLIENT_DEFAULTS, FUNCTION_DEFAULTS, LLM_DEFAULTS

HUGE = "1" + "0" * 400
BASE = {PREFIX + "slo-latency-ms": "500"}


def _spec(**annotations: str) -> ModelSpec:
    return parse_annotations("m", {**BASE, **{PREFIX + k: v for k, v in annotations.items()}})


@pytest.mark.parametrize(("key", "value", "cap"), [
    ("concurrency", HUGE, "limits.max_concurrency (4096)"),
    ("gpus-per-replica", HUGE, "limits.max_gpus_per_replica (64)"),
    ("max-replicas", "100000", "limits.max_replicas (1000)"),
    ("priority", HUGE, "limits.max_priority (+-1000)"),
    ("priority", "-" + HUGE, "limits.max_priority (+-1000)"),
    ("cold-start-seconds", "1e300", "limits.max_cold_start_s (3600)"),
    ("service-time-ms", "1e300", "limits.max_latency_ms (3.6e+06)"),
    ("expected-rps", "1e300", "limits.max_rps (1e+06)"),
    ("gpu-memory-gib", "1e300", "limits.max_gpu_memory_gib (4096)"),
    ("decode-ms-per-token", "1e300", "limits.max_latency_ms (3.6e+06)"),
    # (the queueing model's latency search never ended for a percentile this low: issue 16)
    ("slo-percentile", "0.001", "limits.min_slo_percentile (50)"),
    ("service-time-ms", "1e-300", "limits.min_latency_ms (0.01)"),
    ("slo-latency-ms", "1e-300", "limits.min_latency_ms (0.01)"),
])
def test_a_value_over_its_cap_names_the_annotation_the_value_and_the_cap(key: str, value: str, cap: str) -> None:
    spec = _spec(**{key: value})  # it parses: the value is valid, only extreme
    (problem,) = limit_problems(spec, SpecLimits())
    assert problem.key == PREFIX + key
    assert cap in problem.reason
    assert len(str(problem)) < 200  # a 401-digit number is shown by its size, not its digits


def test_min_replicas_over_the_cap_is_named_too() -> None:
    spec = _spec(**{"min-replicas": "5000", "max-replicas": "5000"})
    keys = {p.key for p in limit_problems(spec, SpecLimits())}
    assert keys == {PREFIX + "min-replicas", PREFIX + "max-replicas"}


def test_time_slice_shares_are_bounded_by_the_shares_per_gpu_cap() -> None:
    thin = _spec(**{"gpu-compute-share": "0.001", "gpu-memory-gib": "1"})
    (problem,) = limit_problems(thin, SpecLimits())
    assert problem.key == PREFIX + "gpu-compute-share" and "limits.max_time_slice_replicas" in problem.reason
    # the same share on MIG or whole GPUs only asks for no time-slicing at all
    assert not limit_problems(thin.with_(slot_kinds=("whole", "mig")), SpecLimits())
    assert not limit_problems(_spec(**{"gpu-compute-share": "0.0625"}), SpecLimits())  # exactly 1/16
    assert not limit_problems(thin, SpecLimits(max_time_slice_replicas=1000))  # the operator may allow more


def test_slot_speeds_are_bounded_both_ways() -> None:
    spec = _spec(**{"slot-speeds": "L4=1e-300,H100=2"})
    (problem,) = limit_problems(spec, SpecLimits())
    assert problem.key == PREFIX + "slot-speeds" and problem.value.startswith("L4=")


def test_the_operator_sets_the_caps() -> None:
    spec = _spec(**{"max-replicas": "100000"})
    assert limit_problems(spec, SpecLimits())
    assert not limit_problems(spec, SpecLimits(max_replicas=100000))


@pytest.mark.parametrize("table", [LLM_DEFAULTS, FUNCTION_DEFAULTS, CLIENT_DEFAULTS])
def test_defaults_and_the_simulators_models_are_within_the_caps(table: dict) -> None:
    assert not limit_problems(ModelSpec(name="m"), SpecLimits())
    spec = parse_annotations("m", {**BASE, **{PREFIX + k: str(v) for k, v in table.items()}})
    assert not limit_problems(spec, SpecLimits())


@pytest.mark.parametrize("bad", [0, -1, 1.5, "10", True, None, 10**10])
def test_limits_themselves_are_checked_and_named(bad: object) -> None:
    with pytest.raises(ValueError, match=r"limits\.max_replicas"):
        SpecLimits(max_replicas=bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [0, 0.5, 99.5, 100, "50", float("nan")])
def test_the_percentile_floor_is_a_percentile(bad: object) -> None:
    with pytest.raises(ValueError, match=r"limits\.min_slo_percentile must be a number in \[1, 99\]"):
        SpecLimits(min_slo_percentile=bad)  # type: ignore[arg-type]


def test_float_limits_refuse_infinity_and_nan() -> None:
    for bad in (float("inf"), float("nan"), 0.5):
        with pytest.raises(ValueError, match=r"limits\.max_rps"):
            SpecLimits(max_rps=bad)


# Values a namespace owner could write: huge and tiny numbers, signs, exponents, overlong digit strings, junk.
VALUES = st.one_of(
    st.sampled_from([HUGE, "-" + HUGE, "1" * 5000, "1e400", "-1e400", "1e-400", "nan", "inf", "-inf", "0", "-0",
                     "1", "0.0001", "4097", "100000", "0x10", "1_000", " 7 ", "", "share", "whole,share",
                     "L4=1e308,H100=1e-308", "e2e", "99.9999999999"]),
    st.integers(min_value=-(10**30), max_value=10**30).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.text(max_size=20),
)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(sorted(SCHEMA)), VALUES, max_size=6))
def test_no_annotation_value_raises_anything_but_a_spec_error(values: dict[str, str]) -> None:
    try:
        spec = parse_annotations("m", {**BASE, **{PREFIX + k: v for k, v in values.items()}})
    except SpecError as e:
        assert e.problems
        return
    for limits in (SpecLimits(), SpecLimits(max_replicas=5, max_concurrency=2, max_time_slice_replicas=2,
                                              max_priority=1, max_slot_speed=2.0, max_latency_ms=10.0)):
        problems = limit_problems(spec, limits)  # never raises either
        assert all(p.key.startswith(PREFIX) and p.reason for p in problems)
        assert within_limits(spec, limits) is (not problems)  # the fast path agrees with the full check
