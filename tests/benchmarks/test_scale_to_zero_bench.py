"""bench/scale_to_zero.py: the curve reading and the variants' annotations (pure functions, no simulation)."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest

from autoscaler.api.spec import parse_mapping

_PATH = Path(__file__).resolve().parents[2] / "bench" / "scale_to_zero.py"
_spec = importlib.util.spec_from_file_location("bench_scale_to_zero", _PATH)
assert _spec is not None and _spec.loader is not None
s2z = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(s2z)

# (warm idle GPU-hours, cold-started requests): more idle, fewer cold starts; given out of order on purpose.
LEARNED = [(4.0, 100.0), (1.0, 900.0), (2.0, 300.0)]


def test_cold_at_interpolates_in_idle_order_and_never_extrapolates():
    assert s2z.cold_at(LEARNED, 1.5) == pytest.approx(600.0)
    assert s2z.cold_at(LEARNED, 3.0) == pytest.approx(200.0)
    assert s2z.cold_at(LEARNED, 4.0) == pytest.approx(100.0)
    assert s2z.cold_at(LEARNED, 0.5) is None
    assert s2z.cold_at(LEARNED, 4.5) is None


def test_versus_reads_the_curve_at_each_rival_point():
    rows = s2z.versus(LEARNED, [(2.0, 600.0), (3.0, 100.0), (9.0, 1.0), (3.0, 0.0)])
    assert rows[0]["ratio"] == pytest.approx(0.5)  # learned 300 vs the rival's 600 at the same idle GPU-hours
    assert rows[1]["ratio"] == pytest.approx(2.0)  # learned worse here
    assert rows[2]["curve_cold"] is None and rows[2]["ratio"] is None  # outside learned's range: no ratio
    assert math.isinf(rows[3]["ratio"])  # the rival has none, learned has some


def test_each_variant_sets_only_its_keep_alive_annotations():
    spec = parse_mapping("m", {"slo-latency-ms": 500, "service-time-ms": 50})
    floor = s2z.with_keep_alive(spec, ("floor-1", "floor-1", None))
    assert floor.min_replicas == 1
    learned = s2z.with_keep_alive(spec, ("x", "learned", 120.0))
    assert (learned.min_replicas, learned.keep_alive, learned.cold_start_worth_s) == (0, "learned", 120.0)
    assert learned.keep_alive_s == spec.keep_alive_s
    hybrid = s2z.with_keep_alive(spec, ("x", "hybrid", 14400.0))
    assert (hybrid.min_replicas, hybrid.keep_alive, hybrid.keep_alive_s) == (0, "hybrid", 14400.0)
    default = s2z.with_keep_alive(spec, ("x", "learned", None))
    assert default.cold_start_worth_s == spec.cold_start_worth_s  # the shipped default untouched
