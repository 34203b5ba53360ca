"""The headline on scale to zero (issue 18): how cold-started requests were judged is said where it matters, and the
lower bound's ratio is not printed where it bounds nothing."""

from __future__ import annotations

from typing import Any

from autoscaler.report.headline import cold_start_lines, headline


def card(policy: str = "slotwise", how: str = "count", cold: int = 7, **kw: Any) -> dict[str, Any]:
    base = {"policy": policy, "gpu_hours": 10.0, "slo_attainment": 0.999, "violating_requests": 3,
            "requests": 1000, "unattainable_requests": 0, "lower_bound_gpu_hours": 5.0,
            "gpu_hours_vs_lower_bound": None if how == "exempt" else 2.0, "cold_start_slo": how,
            "cold_started_requests": cold, "warm_idle_gpu_hours": 1.5, "cost": {"hours": 2.0}}
    return {**base, **kw}


def test_nothing_is_said_without_cold_started_requests_when_they_count() -> None:
    assert cold_start_lines([card(cold=0)]) == []
    assert not any("cold-started" in line for line in headline([card(cold=0)]))


def test_counted_cold_starts_are_said_with_each_policys_count() -> None:
    (line,) = cold_start_lines([card(), card("hpa", cold=0)])
    assert "counted against the SLO" in line and "slotwise 7" in line and "hpa 0" in line and "1.50" in line


def test_exempt_is_said_in_the_objective_and_the_bound_is_not_compared() -> None:
    lines = headline([card(how="exempt", cold=0)])
    assert "cold-started requests exempt" in lines[0]
    bound = next(line for line in lines if line.startswith("lower bound"))
    assert "not comparable" in bound and "slotwise at" not in bound
    assert any("EXEMPT" in line for line in lines)
    counted = next(line for line in headline([card()]) if line.startswith("lower bound"))
    assert "slotwise at 2.00x" in counted
