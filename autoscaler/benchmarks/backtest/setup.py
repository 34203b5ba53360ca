"""The protocol's constants for one set of series (``reference/forecast_protocol.md``): horizon, season, windows
and the rolling origins. Its own module so that the protocol and every baseline it runs can share it."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

MAX_ORIGINS = 2000


@dataclass(frozen=True)
class Setup:
    """Protocol constants for one set of series."""

    n: int
    step_s: float
    h: int
    season: int | None
    window: int  # W: residual / fitting window
    refit: int  # R: ets refit block
    lags: int  # L: hgb lags
    origins: np.ndarray
    start_tod_s: float = 0.0  # time of day of y[0], seconds

    @property
    def first(self) -> int:
        return int(self.origins[0])


def protocol_setup(n: int, step_s: float, start_tod_s: float = 0.0) -> Setup:
    """The protocol's constants. Steps other than 60 s / 600 s follow the same rules in time units:
    minute-or-finer series forecast 10 minutes ahead, coarser ones 3 steps."""
    minute_like = step_s <= 60.0 + 1e-9
    h = max(1, round(600.0 / step_s)) if minute_like else 3
    per_day = 86400.0 / step_s
    season = round(per_day) if n * step_s >= 3 * 86400.0 and abs(per_day - round(per_day)) < 1e-6 else None
    window = round(86400.0 / step_s) if minute_like else round(7 * 86400.0 / step_s)
    refit = max(1, round(3600.0 / step_s)) if minute_like else max(1, round(per_day))
    lags = max(1, round(3600.0 / step_s)) if minute_like else 36
    half = math.ceil(n / 2)
    if n - h < half:
        raise ValueError(f"series of {n} steps is too short for h = {h}")
    s = math.ceil((n - h - half + 1) / MAX_ORIGINS)
    origins = np.arange(half, n - h + 1, s)
    return Setup(n, float(step_s), h, season, window, refit, lags, origins, start_tod_s)
