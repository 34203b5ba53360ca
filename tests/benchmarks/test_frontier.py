"""``slotwise frontier``: the curve (lower convex frontier), the comparisons against hand-built curves with known
answers, the checks, the scorecard accessor, the cases and one tiny end-to-end run of the command."""

from __future__ import annotations

import json
import math
from itertools import pairwise

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from autoscaler.benchmarks.frontier.compare import (
    Point,
    attainment_check,
    compare,
    defaults_check,
    frontier,
    gpu_hours_at,
    off_curve,
    violations_at,
)
from autoscaler.benchmarks.frontier.sweep import (
    Case,
    card_numbers,
    case_for,
    default_cases,
    default_knob,
    evaluate,
    only_models,
    sweep_jobs,
)
from autoscaler.cli.main import main
from forecasting.traces.model import RateSeries, RequestLog

# A convex baseline curve (slopes -300 then -100 violations per GPU-hour), given out of order on purpose.
CURVE = [Point(10.0, 100.0, 0.3), Point(6.0, 900.0, 0.9), Point(8.0, 300.0, 0.6)]


def test_frontier_sorts_by_gpu_hours_and_drops_dominated_and_above_hull_points():
    dominated = Point(9.0, 400.0, 0.5)  # (8, 300) has fewer GPU-hours and fewer violations
    above = Point(7.0, 700.0, 0.7)  # the segment (6, 900)-(8, 300) has 600 at 7 GPU-h
    pts = [*CURVE, dominated, above]
    curve = frontier(pts)
    assert [p.knob for p in curve] == [0.9, 0.6, 0.3]
    assert off_curve(pts, curve) == [None, None, None, "dominated", "above the frontier"]


def test_frontier_keeps_the_better_of_equal_gpu_hours_or_equal_violations():
    curve = frontier([Point(5.0, 50.0), Point(5.0, 30.0), Point(7.0, 10.0), Point(9.0, 10.0)])
    assert [(p.gpu_hours, p.violations) for p in curve] == [(5.0, 30.0), (7.0, 10.0)]


def test_interpolation_is_piecewise_linear_on_the_frontier_and_never_extrapolates():
    curve = frontier(CURVE)
    assert violations_at(curve, 7.0) == pytest.approx(600.0)
    assert violations_at(curve, 9.5) == pytest.approx(150.0)
    assert violations_at(curve, 6.0) == pytest.approx(900.0)
    assert violations_at(curve, 10.0) == pytest.approx(100.0)
    assert gpu_hours_at(curve, 600.0) == pytest.approx(7.0)
    assert gpu_hours_at(curve, 150.0) == pytest.approx(9.5)
    assert violations_at(curve, 5.9) is None and violations_at(curve, 10.1) is None
    assert gpu_hours_at(curve, 99.0) is None and gpu_hours_at(curve, 901.0) is None


def test_a_point_between_sweep_points_is_read_on_both_axes():
    c = compare(CURVE, Point(7.0, 150.0))
    assert c.curve_violations == pytest.approx(600.0) and c.violation_ratio == pytest.approx(0.25)
    assert c.curve_gpu_hours == pytest.approx(9.5) and c.saving == pytest.approx(1 - 7.0 / 9.5)
    assert not c.ratio_at_end and not c.saving_at_end
    assert c.verdict == "PASS"


def test_a_point_on_the_wrong_side_of_the_curve_fails():
    c = compare(CURVE, Point(9.5, 200.0))
    assert c.violation_ratio == pytest.approx(200.0 / 150.0)
    assert c.saving == pytest.approx(1 - 9.5 / 9.0)
    assert c.verdict == "FAIL"


def test_the_criteria_are_inclusive_at_their_thresholds():
    # 300 violating needs 8 GPU-h: 6 GPU-h is exactly 25 % fewer (and 6 GPU-h has 900 on the curve: ratio 1/3)
    c = compare(CURVE, Point(6.0, 300.0))
    assert c.saving == pytest.approx(0.25) and c.violation_ratio == pytest.approx(1 / 3)
    assert c.verdict == "PASS"
    assert compare(CURVE, Point(6.01, 301.0)).verdict == "FAIL"


def test_fewer_violations_than_every_point_is_compared_with_the_least_violating_point():
    c = compare(CURVE, Point(9.0, 50.0))
    assert c.saving_at_end and c.curve_gpu_hours == pytest.approx(10.0) and c.saving == pytest.approx(0.1)
    assert c.violation_ratio == pytest.approx(50.0 / 200.0)  # read on the curve at 9 GPU-h
    assert c.verdict == "PASS"  # by the ratio
    assert any("least-violating" in n for n in c.notes)
    # More GPU-hours than every point: no ratio; the lower-bound saving is negative.
    c = compare(CURVE, Point(11.0, 50.0))
    assert c.violation_ratio is None and c.saving == pytest.approx(-0.1) and c.verdict == "FAIL"
    assert any("more GPU-hours than every point" in n for n in c.notes)


def test_fewer_gpu_hours_than_every_point_is_compared_with_the_cheapest_point():
    c = compare(CURVE, Point(5.0, 800.0))
    assert c.ratio_at_end and c.curve_violations == pytest.approx(900.0)
    assert c.violation_ratio == pytest.approx(800.0 / 900.0)
    assert c.curve_gpu_hours == pytest.approx(6.0 + 2.0 / 6.0)
    assert c.saving == pytest.approx(1 - 5.0 / (6.0 + 2.0 / 6.0))  # 21 %: not enough
    assert c.verdict == "FAIL"
    assert compare(CURVE, Point(4.0, 800.0)).verdict == "PASS"  # 37 % fewer


def test_a_point_every_sweep_point_beats_fails_and_says_why():
    c = compare(CURVE, Point(12.0, 1000.0))
    assert c.violation_ratio is None and c.saving is None and c.verdict == "FAIL"
    assert any("every point of the curve has fewer" in n for n in c.notes)


def test_zero_violations():
    curve = [Point(5.0, 10.0), Point(8.0, 0.0)]
    c = compare(curve, Point(6.0, 0.0))
    assert c.violation_ratio == 0.0 and c.curve_gpu_hours == pytest.approx(8.0) and c.saving == pytest.approx(0.25)
    assert c.verdict == "PASS"
    same = compare(curve, Point(8.0, 0.0))  # on the curve's own point: not below it
    assert same.violation_ratio is None and same.saving == pytest.approx(0.0) and same.verdict == "FAIL"
    inf = compare(curve, Point(8.0, 3.0))
    assert inf.violation_ratio == math.inf and inf.verdict == "FAIL"


def test_an_empty_curve_is_not_a_verdict():
    assert compare([], Point(1.0, 1.0)).verdict == "N/A"


points_st = st.lists(st.tuples(st.floats(0.1, 100.0), st.floats(0.0, 1e5)), min_size=1, max_size=12)


@given(points_st)
def test_frontier_invariants(raw):
    pts = [Point(x, y) for x, y in raw]
    curve = frontier(pts)
    assert curve and all(any(p is q for q in pts) for p in curve)
    xs, ys = [p.gpu_hours for p in curve], [p.violations for p in curve]
    assert all(a < b for a, b in pairwise(xs))
    assert all(a > b for a, b in pairwise(ys))
    slopes = [(ys[i + 1] - ys[i]) / (xs[i + 1] - xs[i]) for i in range(len(xs) - 1)]
    assert all(a < b + 1e-9 * (1 + abs(a) + abs(b)) for a, b in pairwise(slopes))  # convex
    # No sweep point lies below the curve: the curve is the baseline's best.
    for p in pts:
        y = violations_at(curve, p.gpu_hours)
        if y is not None:
            assert p.violations >= y - 1e-6 * (1 + y)
        else:
            assert p.gpu_hours > xs[-1] or p.violations >= ys[0]


@given(points_st, st.floats(0.1, 100.0), st.floats(0.0, 1e5))
def test_a_point_no_better_than_a_sweep_point_never_passes(raw, dx, dy):
    pts = [Point(x, y) for x, y in raw]
    p = pts[0]
    assert compare(pts, Point(p.gpu_hours + dx, p.violations + dy)).verdict == "FAIL"


def test_defaults_check():
    assert defaults_check(Point(5.0, 100.0), Point(6.0, 10.0)).verdict == "PASS"  # cheaper
    more_but_fewer = defaults_check(Point(7.0, 5.0), Point(6.0, 10.0))
    assert more_but_fewer.verdict == "PASS" and "fewer violating" in more_but_fewer.why
    assert defaults_check(Point(7.0, 10.0), Point(6.0, 10.0)).verdict == "FAIL"


def test_attainment_check_prefers_the_lower_bound_and_falls_back_to_the_oracle():
    a = attainment_check(0.996, 1.2, 3.0)
    assert (a.reference, a.vs_reference, a.verdict) == ("lower bound", 1.2, "PASS")
    a = attainment_check(0.996, None, 1.3)
    assert (a.reference, a.verdict) == ("oracle", "FAIL")
    assert attainment_check(0.99, 1.0, None).verdict == "FAIL"
    assert attainment_check(0.999, None, None).verdict == "N/A"
    assert attainment_check(0.99, None, None).verdict == "FAIL"


def test_card_numbers_reads_the_headline_under_either_name():
    common = {"gpu_hours": 3.0, "violating_requests": 7, "requests": 100}
    before = card_numbers(common | {"slo_attainment": 0.99, "slo_requests_met": 0.93})
    assert before["slo_attainment"] == 0.93 and before["gpu_hours_vs_lower_bound"] is None
    after = card_numbers(common | {"slo_attainment": 0.93, "gpu_hours_vs_lower_bound": 1.1})
    assert after["slo_attainment"] == 0.93 and after["gpu_hours_vs_lower_bound"] == 1.1


def test_only_models_keeps_each_kept_models_traffic():
    log = RequestLog(t=np.array([0.0, 1.0, 2.0, 3.0]), model_index=np.array([0, 1, 1, 0], dtype=np.int32),
                     models=("code", "conv"), input_tokens=np.array([1, 2, 3, 4]), output_tokens=np.array([5, 6, 7, 8]))
    conv = only_models(log, ["conv"])
    assert conv.models == ("conv",) and list(conv.t) == [1.0, 2.0] and list(conv.model_index) == [0, 0]
    assert list(conv.input_tokens) == [2, 3] and list(conv.output_tokens) == [6, 7] and conv.service_s is None
    series = RateSeries(rates=np.arange(6.0).reshape(3, 2), models=("a", "b", "c"), step_s=60.0)
    kept = only_models(series, ["c", "a"])
    assert kept.models == ("a", "c") and kept.rates.tolist() == [[0.0, 1.0], [4.0, 5.0]]
    with pytest.raises(ValueError, match="not in the trace: x"):
        only_models(series, ["x"])


def test_cases():
    assert [c.label for c in default_cases()] == ["azure-llm-2023", "azure-llm-2023:conv", "azure-functions-2019",
                                                  "servegen-m-small"]
    conv = case_for("azure-llm-2023:conv")
    assert (conv.trace, conv.models, conv.history_hours, conv.hours) == ("azure-llm-2023", ("conv",), 0.25, None)
    assert case_for("servegen-m-small", hours=6.0).history_hours == 24.0
    own = case_for("/data/mine.csv", history_hours=0.0)
    assert (own.models, own.history_hours, own.hours) == (None, 0.0, None)
    with pytest.raises(ValueError, match="no model"):
        case_for("azure-llm-2023:")


def test_a_trace_file_with_a_colon_in_its_name_is_not_a_filter(tmp_path):
    f = tmp_path / "day:1.csv"
    f.write_text("")
    assert case_for(str(f)) == Case(str(f), None, 0.0, None)


def test_sweep_jobs_reuse_hpa_at_its_default_target():
    d = default_knob("hpa")
    jobs = sweep_jobs(["hpa", "kpa"], [0.3, d])
    assert jobs == [("reference", None), ("hpa", 0.3), ("kpa", 0.3), ("kpa", d)]
    with pytest.raises(ValueError):
        sweep_jobs(["static"], [0.5])  # no target_utilization knob


def _pt(policy: str, knob: float | None, gh: float, v: float) -> dict:
    return {"policy": policy, "knob": knob, "gpu_hours": gh, "violating_requests": v, "requests": 1000.0,
            "slo_attainment": 1 - v / 1000, "gpu_hours_vs_oracle": None, "gpu_hours_vs_lower_bound": None,
            "lower_bound_gpu_hours": None}


def test_evaluate_puts_hpa_at_defaults_on_its_curve_and_checks_everything():
    d = default_knob("hpa")
    points = [_pt("slotwise", None, 7.0, 150.0), _pt("hpa", None, 8.0, 300.0), _pt("oracle", None, 4.0, 500.0),
              _pt("hpa", 0.3, 10.0, 100.0), _pt("hpa", 0.9, 6.0, 900.0)]
    doc = evaluate(points, ["hpa"], [0.3, d, 0.9])
    assert [p["knob"] for p in doc["curves"]["hpa"]] == [0.3, d, 0.9]
    c = doc["comparisons"]["hpa"]
    assert c["verdict"] == "PASS" and c["violation_ratio"] == pytest.approx(0.25)
    assert c["curve_knobs"] == [0.9, d, 0.3]
    assert doc["frontier_verdict"] == "PASS" and doc["defaults_check"]["verdict"] == "PASS"
    assert doc["attainment_check"]["reference"] == "oracle"
    assert doc["attainment_check"]["vs_reference"] == pytest.approx(7.0 / 4.0)
    # Without the default target among the knobs, HPA's curve is the sweep alone.
    assert [p["knob"] for p in evaluate(points, ["hpa"], [0.3, 0.9])["curves"]["hpa"]] == [0.3, 0.9]


def test_the_command_end_to_end_on_a_slice(tmp_path, capsys):
    out = tmp_path / "f.json"
    rc = main(["frontier", "--trace", "azure-llm-2023:code", "--history-hours", "0.1", "--hours", "0.15",
               "--knobs", "0.5,0.9", "--baselines", "hpa,predictive", "--json", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "== azure-llm-2023:code" in text and "defaults: slotwise vs hpa" in text
    doc = json.loads(out.read_text())
    (case,) = doc["cases"]
    assert case["models"] == ["code"] and case["history_hours"] == 0.1
    assert {p["policy"] for p in case["reference_points"]} == {"slotwise", "hpa", "oracle"}
    assert [p["knob"] for p in case["curves"]["hpa"]] == [0.5, 0.9]
    assert set(case["comparisons"]) == {"hpa", "predictive"}
    assert all(c["verdict"] in ("PASS", "FAIL") for c in case["comparisons"].values())
