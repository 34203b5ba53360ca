"""Turn per-model ``(t, rate)`` points into the dense ``(models, steps)`` matrix of a RateSeries.

Shared by the canonical rate reader and the ServeGen reader: both list points per model with a
regular but not announced step, so the step is inferred (smallest interval between consecutive
points of any model) and every point is then validated against one common grid. Points a model
lacks become NaN, which is how RateSeries marks a gap.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from forecasting.traces._io import CsvTable
from forecasting.traces.model import TraceFormatError

# Relative tolerance for "t lies on the grid": times written as decimal text carry float noise.
_GRID_RTOL = 1e-6
# A tiny stray interval would make the grid explode (0.001 s steps over a day x 500 models);
# refuse before allocating and say why instead of dying of memory.
_MAX_CELLS = 200_000_000


@dataclass
class ModelPoints:
    """One model's points, in file order, plus where each came from (for error messages)."""

    model: str
    t: np.ndarray  # float64
    rate: np.ndarray  # float64, NaN allowed (an explicit gap)
    table: CsvTable
    rows: np.ndarray  # int64 index into table.rows per point
    extras: dict[str, np.ndarray] = field(default_factory=dict)  # per point, float64 or str


@dataclass
class Grid:
    rates: np.ndarray
    start_s: float
    step_s: float
    extras: dict[str, np.ndarray]


def assemble(points: list[ModelPoints], source: str, t_field: str = "t") -> Grid:
    if not points:
        raise TraceFormatError(source, None, None, "no models")
    for p in points:
        if len(p.t) > 1:
            d = np.diff(p.t)
            if (d <= 0).any():
                i = int(np.argmax(d <= 0)) + 1
                what = "duplicate time" if d[i - 1] == 0 else "time goes backwards"
                raise p.table.error(
                    int(p.rows[i]), t_field, f"{what} for model '{p.model}' ({p.t[i]} after {p.t[i - 1]})"
                )
    diffs = [np.diff(p.t) for p in points if len(p.t) > 1]
    if not diffs:
        raise TraceFormatError(source, None, t_field, "cannot infer the step: every model has a single time point")
    step = float(min(float(d.min()) for d in diffs))
    t0 = float(min(float(p.t[0]) for p in points))
    tol = _GRID_RTOL * step
    n = 0
    ks: list[np.ndarray] = []
    for p in points:
        pos = (p.t - t0) / step
        k = np.rint(pos)
        off = np.abs(p.t - (t0 + k * step)) > tol
        if off.any():
            i = int(np.argmax(off))
            raise p.table.error(
                int(p.rows[i]),
                t_field,
                f"t={p.t[i]:g} is not on the {step:g} s grid starting at {t0:g} "
                "(the step is the smallest interval between consecutive times of a model)",
            )
        ks.append(k.astype(np.int64))
        n = max(n, int(k[-1]) + 1)
    if n * len(points) > _MAX_CELLS:
        raise TraceFormatError(
            source,
            None,
            t_field,
            f"grid of {len(points)} models x {n} steps of {step:g} s is too large; are the times irregular?",
        )
    rates = np.full((len(points), n), np.nan)
    extras: dict[str, np.ndarray] = {}
    for m, (p, k) in enumerate(zip(points, ks, strict=True)):
        rates[m, k] = p.rate
        for name, vals in p.extras.items():
            if name not in extras:
                extras[name] = _blank((len(points), n), vals)
            elif vals.dtype.kind == "U" and extras[name].dtype.kind != "U":
                extras[name] = _to_str(extras[name])
            elif vals.dtype.kind == "U" and vals.dtype.itemsize > extras[name].dtype.itemsize:
                extras[name] = extras[name].astype(vals.dtype)
            extras[name][m, k] = _to_str(vals) if extras[name].dtype.kind == "U" else vals
    return Grid(rates=rates, start_s=t0, step_s=step, extras=extras)


def _blank(shape: tuple[int, int], like: np.ndarray) -> np.ndarray:
    if like.dtype.kind == "U":
        return np.full(shape, "", dtype=like.dtype)
    return np.full(shape, np.nan)


def _to_str(a: np.ndarray) -> np.ndarray:
    if a.dtype.kind == "U":
        return a
    out = np.where(np.isnan(a), "", a.astype(str))
    return out.astype(str)
