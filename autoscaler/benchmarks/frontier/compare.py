"""Where a point lies against a baseline's GPU-hours-vs-violating-requests curve: pure functions of the numbers.

A baseline swept over its knob gives points (GPU-hours, violating requests). Its *curve* is the lower convex
frontier of those points: a point another point dominates (no more GPU-hours and no more violations) is not on it,
nor is one above the segment joining its neighbours -- running the two neighbouring knob values for parts of the
time reaches that segment, so the segment, not the point, is what the baseline can do. The curve is read
piecewise-linearly in order of GPU-hours; it is never extrapolated.

:func:`compare` reads the curve at the point's GPU-hours (the baseline's violations there -> violation ratio) and at
the point's violations (the baseline's GPU-hours there -> GPU-hour saving). Where the point lies beyond the curve's
end on the side where the comparison still says something, it is compared with that end point and says so:

- fewer violations than every curve point: compared with the least-violating point (the baseline needs at least
  its GPU-hours to do better), so the saving is a lower bound;
- fewer GPU-hours than every curve point: compared with the cheapest point (with less, the baseline has at least
  its violations), so the ratio is an upper bound.

On the other sides (more GPU-hours, or more violations, than every point) nothing is said. The verdict is PASS
when at equal violations the saving is at least ``min_saving`` or at equal GPU-hours the ratio is at most
``max_ratio`` (the issue's "at equal violations >= 25 % fewer GPU-hours, or at equal GPU-hours at most 1/3 of the
violating requests"), FAIL otherwise.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

MIN_SAVING = 0.25  # at equal violations, at least 25 % fewer GPU-hours (SageServe's production saving)
MAX_RATIO = 1 / 3  # at equal GPU-hours, at most a third of the violating requests
_EPS = 1e-12


@dataclass(frozen=True)
class Point:
    gpu_hours: float
    violations: float
    knob: float | None = None  # the baseline's target utilisation; None for a point that is not swept


def frontier(points: Sequence[Point]) -> list[Point]:
    """The lower convex frontier of ``points``, in order of GPU-hours (violations strictly falling).

    Dominated points go first (of equal GPU-hours the fewer violations stay, of equal violations the fewer
    GPU-hours), then the points above the lower convex hull."""
    pareto: list[Point] = []
    for p in sorted(points, key=lambda p: (p.gpu_hours, p.violations)):
        if not pareto or p.violations < pareto[-1].violations:
            pareto.append(p)
    hull: list[Point] = []
    for p in pareto:
        # Pop the last point while it is on or above the segment from the one before it to p.
        while len(hull) >= 2 and _cross(hull[-2], hull[-1], p) <= 0:
            hull.pop()
        hull.append(p)
    return hull


def _cross(o: Point, a: Point, b: Point) -> float:
    return (a.gpu_hours - o.gpu_hours) * (b.violations - o.violations) - (a.violations - o.violations) * (
        b.gpu_hours - o.gpu_hours
    )


def violations_at(curve: Sequence[Point], gpu_hours: float) -> float | None:
    """The curve's violations at ``gpu_hours``; None outside its GPU-hour range. ``curve`` is a :func:`frontier`."""
    if not curve or not curve[0].gpu_hours - _EPS <= gpu_hours <= curve[-1].gpu_hours + _EPS:
        return None
    for a, b in pairwise(curve):
        if gpu_hours <= b.gpu_hours:
            f = (gpu_hours - a.gpu_hours) / (b.gpu_hours - a.gpu_hours)
            return a.violations + f * (b.violations - a.violations)
    return curve[-1].violations  # a one-point curve, or the last point itself


def gpu_hours_at(curve: Sequence[Point], violations: float) -> float | None:
    """The curve's GPU-hours at ``violations``; None outside its range of violations. ``curve`` is a
    :func:`frontier` (violations strictly falling, so the answer is unique)."""
    if not curve or not curve[-1].violations - _EPS <= violations <= curve[0].violations + _EPS:
        return None
    for a, b in pairwise(curve):
        if violations >= b.violations:
            f = (a.violations - violations) / (a.violations - b.violations)
            return a.gpu_hours + f * (b.gpu_hours - a.gpu_hours)
    return curve[-1].gpu_hours


@dataclass(frozen=True)
class Comparison:
    """A point against one baseline's curve (see the module docstring)."""

    curve: tuple[Point, ...]  # the frontier the point was compared with
    curve_violations: float | None  # the curve's violations at the point's GPU-hours (or at its cheapest point)
    violation_ratio: float | None  # point's violations / curve_violations
    ratio_at_end: bool  # True: compared with the cheapest point (the point is cheaper than the whole curve)
    curve_gpu_hours: float | None  # the curve's GPU-hours at the point's violations (or at its least-violating)
    saving: float | None  # 1 - point's GPU-hours / curve_gpu_hours
    saving_at_end: bool  # True: compared with the least-violating point (fewer violations than the whole curve)
    verdict: str  # PASS or FAIL (N/A for an empty curve)
    notes: tuple[str, ...] = field(default=())


def compare(
    points: Sequence[Point], point: Point, min_saving: float = MIN_SAVING, max_ratio: float = MAX_RATIO
) -> Comparison:
    """``point`` against the lower convex frontier of a baseline's sweep ``points``."""
    curve = frontier(points)
    if not curve:
        return Comparison((), None, None, False, None, None, False, "N/A", ("no baseline points",))
    gh, v = point.gpu_hours, point.violations
    cheap, best = curve[0], curve[-1]
    notes: list[str] = []

    ratio_at_end = gh < cheap.gpu_hours - _EPS
    cv = cheap.violations if ratio_at_end else violations_at(curve, gh)
    if ratio_at_end:
        notes.append(f"fewer GPU-hours than every point: compared with the cheapest ({_knob(cheap)}); "
                     "the ratio is an upper bound")
    elif cv is None:
        notes.append(f"more GPU-hours than every point (the most is {best.gpu_hours:.4g} at {_knob(best)}): "
                     "no violations to compare at equal GPU-hours")
    ratio: float | None = None
    if cv is not None:
        if cv > 0:
            ratio = v / cv
        elif v > 0:
            ratio = math.inf
        else:
            notes.append("no violations on either side at equal GPU-hours: no ratio")

    saving_at_end = v < best.violations - _EPS
    cg = best.gpu_hours if saving_at_end else gpu_hours_at(curve, v)
    if saving_at_end:
        notes.append(f"fewer violations than every point: compared with the least-violating ({_knob(best)}); "
                     "the saving is a lower bound")
    elif cg is None:
        notes.append(f"more violations than every point (the most is {cheap.violations:.4g} at {_knob(cheap)}): "
                     "no GPU-hours to compare at equal violations")
    saving = 1.0 - gh / cg if cg is not None and cg > 0 else None

    ok = (saving is not None and saving >= min_saving - _EPS) or (ratio is not None and ratio <= max_ratio + _EPS)
    if cv is None and cg is None:
        notes.append("every point of the curve has fewer GPU-hours and fewer violations")
    return Comparison(tuple(curve), cv, ratio, ratio_at_end, cg, saving, saving_at_end,
                      "PASS" if ok else "FAIL", tuple(notes))


def _knob(p: Point) -> str:
    return "its own point" if p.knob is None else f"target {p.knob:g}"


@dataclass(frozen=True)
class DefaultsCheck:
    """The issue's "at defaults, slotwise never uses more GPU-hours than HPA at its defaults unless it has fewer
    violating requests"."""

    verdict: str  # PASS or FAIL
    why: str


def defaults_check(slotwise: Point, hpa: Point) -> DefaultsCheck:
    cheaper = slotwise.gpu_hours <= hpa.gpu_hours + _EPS
    fewer = slotwise.violations < hpa.violations - _EPS
    if cheaper:
        why = f"no more GPU-hours ({slotwise.gpu_hours:.4g} vs {hpa.gpu_hours:.4g})"
    elif fewer:
        why = (f"more GPU-hours ({slotwise.gpu_hours:.4g} vs {hpa.gpu_hours:.4g}) but fewer violating requests "
               f"({slotwise.violations:,.0f} vs {hpa.violations:,.0f})")
    else:
        why = (f"more GPU-hours ({slotwise.gpu_hours:.4g} vs {hpa.gpu_hours:.4g}) and no fewer violating requests "
               f"({slotwise.violations:,.0f} vs {hpa.violations:,.0f})")
    return DefaultsCheck("PASS" if cheaper or fewer else "FAIL", why)


MIN_ATTAINMENT = 0.995  # requests in SLO-meeting model-minutes
MAX_VS_BOUND = 1.25  # GPU-hours over the lower bound


@dataclass(frozen=True)
class AttainmentCheck:
    """The issue's ">= 99.5 % of requests in SLO-meeting model-minutes at <= 1.25x the lower bound"."""

    attainment: float
    vs_reference: float | None
    reference: str  # "lower bound", or "oracle" while the scorecard has no lower bound yet
    verdict: str  # PASS, FAIL, or N/A (no reference at all)


def attainment_check(attainment: float, vs_bound: float | None, vs_oracle: float | None) -> AttainmentCheck:
    reference, vs = ("lower bound", vs_bound) if vs_bound is not None else ("oracle", vs_oracle)
    if attainment < MIN_ATTAINMENT - _EPS or (vs is not None and vs > MAX_VS_BOUND + _EPS):
        verdict = "FAIL"
    else:
        verdict = "N/A" if vs is None else "PASS"  # the attainment holds; without a reference the cost is unknown
    return AttainmentCheck(attainment, vs, reference, verdict)


def off_curve(points: Sequence[Point], curve: Sequence[Point]) -> list[str | None]:
    """Per point, why it is not on ``curve`` (its :func:`frontier`): "dominated" (another point has no more
    GPU-hours and no more violations), "above the frontier" (above the segment of its neighbours), None: on it."""
    on = {id(p) for p in curve}
    out: list[str | None] = []
    for p in points:
        if id(p) in on:
            out.append(None)
        elif any(q is not p and q.gpu_hours <= p.gpu_hours and q.violations <= p.violations for q in points):
            out.append("dominated")
        else:
            out.append("above the frontier")
    return out


def json_safe(x: Any) -> Any:
    """JSON has no infinity: an infinite ratio (the curve has no violations there, slotwise has) is "inf"."""
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    if isinstance(x, dict):
        return {k: json_safe(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [json_safe(v) for v in x]
    return x
