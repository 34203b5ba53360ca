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


def test_at_fixed_reads_the_fixed_curve_at_the_run_s_idle_gpu_hours():
    rows = [{"keep_alive": "fixed", "warm_idle_gpu_hours": 20.0, "scale_events": 6000, "cold_started_requests": 1800},
            {"keep_alive": "fixed", "warm_idle_gpu_hours": 40.0, "scale_events": 2000, "cold_started_requests": 600},
            {"keep_alive": "learned", "warm_idle_gpu_hours": 1.0, "scale_events": 1, "cold_started_requests": 1}]
    c = s2z.at_fixed(rows, {"warm_idle_gpu_hours": 30.0, "scale_events": 2000, "cold_started_requests": 300})
    assert c["events"] == pytest.approx(4000.0) and c["events_ratio"] == pytest.approx(0.5)
    assert c["cold"] == pytest.approx(1200.0) and c["cold_ratio"] == pytest.approx(0.25)
    out = s2z.at_fixed(rows, {"warm_idle_gpu_hours": 50.0, "scale_events": 1, "cold_started_requests": 1})
    assert out["events"] is None and out["events_ratio"] is None  # beyond fixed's range: no reading


def test_the_scale_event_variants_run_the_shipped_learned_keep_alive():
    todo = s2z.variants([], [], [300.0], [0.0, 150.0])
    assert ("learned event 0s", "learned", None, 0.0) in todo and ("learned event 150s", "learned", None, 150.0) in todo
    spec = parse_mapping("m", {"slo-latency-ms": 500, "service-time-ms": 50})
    v = s2z.with_keep_alive(spec, todo[-2])
    assert (v.min_replicas, v.keep_alive, v.cold_start_worth_s) == (0, "learned", spec.cold_start_worth_s)


def test_the_scale_event_cost_is_set_for_the_run_only():
    from autoscaler.decision.zero import ZeroConfig
    from autoscaler.policies import make_policy
    from autoscaler.sim import run as sim_run

    policy, cfg = make_policy("slotwise"), sim_run.SimConfig()
    with s2z._scale_event_cost(150.0):
        assert sim_run.sim_core(policy, cfg).zero.scale_event_s == 150.0
    assert sim_run.sim_core(policy, cfg).zero.scale_event_s == ZeroConfig().scale_event_s
    with s2z._scale_event_cost(None):
        assert sim_run.sim_core(policy, cfg).zero == ZeroConfig()
