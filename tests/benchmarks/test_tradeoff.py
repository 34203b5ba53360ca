"""bench/tradeoff.py: the curve interpolation and the per-policy verdict (pure functions, no simulation)."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[2] / "bench" / "tradeoff.py"
_spec = importlib.util.spec_from_file_location("bench_tradeoff", _PATH)
assert _spec is not None and _spec.loader is not None
tradeoff = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tradeoff)

# A typical baseline curve: more GPU-hours, fewer violations. Given out of order on purpose.
CURVE = [(10.0, 100.0), (6.0, 900.0), (8.0, 300.0)]


def test_y_at_x_interpolates_between_sweep_points_in_gpu_hour_order():
    assert tradeoff.y_at_x(CURVE, 7.0) == pytest.approx(600.0)
    assert tradeoff.y_at_x(CURVE, 9.5) == pytest.approx(150.0)
    assert tradeoff.y_at_x(CURVE, 6.0) == pytest.approx(900.0)  # an end point is inside
    assert tradeoff.y_at_x(CURVE, 10.0) == pytest.approx(100.0)


def test_no_extrapolation_outside_the_curve():
    assert tradeoff.y_at_x(CURVE, 5.9) is None
    assert tradeoff.y_at_x(CURVE, 10.1) is None
    assert tradeoff.x_at_y(CURVE, 50.0) is None
    assert tradeoff.x_at_y(CURVE, 1000.0) is None


def test_x_at_y_takes_the_cheapest_crossing_of_a_non_monotone_curve():
    assert tradeoff.x_at_y(CURVE, 600.0) == pytest.approx(7.0)
    # Violations rise again at 12 GPU-h (noise): 200 violating is crossed at 9 and at 10.5 GPU-h.
    bumpy = [*CURVE, (12.0, 400.0)]
    assert tradeoff.x_at_y(bumpy, 200.0) == pytest.approx(9.0)
    # Equal GPU-hours at two knobs: the baseline's better (lower) value counts.
    assert tradeoff.y_at_x([(5.0, 50.0), (5.0, 30.0), (7.0, 10.0)], 5.0) == pytest.approx(30.0)


def test_verdict_pass_on_violation_ratio():
    # At 7 GPU-h the curve has 600; 150 is a quarter of it.
    v = tradeoff.verdict(CURVE, (7.0, 150.0))
    assert v["curve_violations"] == pytest.approx(600.0)
    assert v["violation_ratio"] == pytest.approx(0.25)
    assert v["curve_gpu_hours"] == pytest.approx(9.5)  # 150 violating on the 8..10 segment
    assert v["gpu_hour_saving"] == pytest.approx(1 - 7.0 / 9.5)
    assert v["verdict"] == "PASS"


def test_verdict_pass_on_gpu_hour_saving_alone():
    # 300 violating needs 8 GPU-h on the curve; 5.9 GPU-h is outside its GPU-hour range (no ratio).
    v = tradeoff.verdict(CURVE, (5.9, 300.0))
    assert v["violation_ratio"] is None
    assert v["gpu_hour_saving"] == pytest.approx(1 - 5.9 / 8.0)
    assert v["verdict"] == "PASS"
    assert any("outside" in n for n in v["notes"])


def test_verdict_fail_when_neither_criterion_holds():
    # At 8 GPU-h the curve has 300: 200 is 2/3 of it; 200 violating needs 9 GPU-h: 11 % saving.
    v = tradeoff.verdict(CURVE, (8.0, 200.0))
    assert v["violation_ratio"] == pytest.approx(2 / 3)
    assert v["gpu_hour_saving"] == pytest.approx(1 - 8 / 9)
    assert v["verdict"] == "FAIL"


def test_verdict_boundaries_are_inclusive():
    v = tradeoff.verdict(CURVE, (7.0, 200.0))  # exactly 1/3 of 600; 200 violating needs 9 GPU-h: 22 %
    assert v["violation_ratio"] == pytest.approx(1 / 3)
    assert v["verdict"] == "PASS"
    # exactly 25 % fewer GPU-hours than the curve's 8 at 300 violating (6 GPU-h: outside its range)
    v = tradeoff.verdict([(8.0, 300.0), (10.0, 100.0)], (6.0, 300.0))
    assert v["gpu_hour_saving"] == pytest.approx(0.25)
    assert v["verdict"] == "PASS"


def test_verdict_not_applicable_outside_both_ranges():
    v = tradeoff.verdict(CURVE, (4.0, 50.0))  # cheaper and better than every sweep point
    assert v["violation_ratio"] is None and v["gpu_hour_saving"] is None
    assert v["verdict"] == "N/A"
    assert any("cheaper and has fewer violations" in n for n in v["notes"])
    assert tradeoff.verdict(CURVE, (12.0, 2000.0))["verdict"] == "N/A"
    assert tradeoff.verdict([], (1.0, 1.0))["verdict"] == "N/A"


def test_verdict_zero_violations_on_the_curve():
    curve = [(6.0, 10.0), (8.0, 0.0)]
    v = tradeoff.verdict(curve, (8.0, 5.0))
    assert math.isinf(v["violation_ratio"])
    assert v["verdict"] == "FAIL"  # 5 violating is reached at 7 GPU-h: slotwise spends more
    v = tradeoff.verdict(curve, (8.0, 0.0))
    assert v["violation_ratio"] is None
    assert v["gpu_hour_saving"] == pytest.approx(0.0)
    assert v["verdict"] == "FAIL"


def test_sweep_jobs_skips_unknown_policies_and_missing_knobs():
    jobs, skipped = tradeoff.sweep_jobs(["hpa", "no-such-policy", "oracle"], [0.5, 0.7])
    assert jobs == [("reference", None), ("hpa", 0.5), ("hpa", 0.7)]
    assert any("no-such-policy" in m and "not a registered policy" in m for m in skipped)
    assert any(m.startswith("skipping oracle") for m in skipped)  # the oracle has no target_utilization
