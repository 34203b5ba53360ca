"""One plain function that runs the same forecaster as the controller."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from forecasting.slotwise import DEFAULT_LEVELS, REPLAY, SlotwiseForecaster, season_steps


def quantile_forecast(
    history: np.ndarray | Sequence[float],
    h: int,
    quantiles: Sequence[float] = (0.5, 0.9, 0.99),
    step_s: float = 60.0,
    season: int | str | None = "auto",
    prior_rate: float | None = None,
) -> np.ndarray:
    """Quantiles of the next ``h`` steps of a request-rate series: shape (len(quantiles), h).

    ``history`` is oldest first, in req/s (NaN = missing); the result is in the same unit, clipped at
    0 and sorted across quantiles. ``season`` is the season length in steps; "auto" uses one day when
    the step divides a day and the history spans >= 3 days. ``prior_rate`` (req/s) is used while the
    history is empty (a new model: the annotation hint, or :func:`forecasting.prior_from_similar`).

    Cost: every call is a warm start from nothing -- the last ``REPLAY`` (256) points through the full
    online updates, older points through the cheap lag/level updates -- about 0.2 s for 2,000 one-minute
    points and 0.5 s for 20,000 (one core). That suits a one-off forecast, not a per-tick loop: to
    forecast every step, hold a :class:`forecasting.SlotwiseForecaster` (``fit`` once, then
    ``update(y)`` and ``predict_quantiles`` per step, ~0.5 ms per step whatever the history length) or,
    for many models, one :class:`forecasting.SlotwiseBatch` (~0.03 ms per series per step). The result
    is the same forecaster's: ``quantile_forecast(y, ...)`` equals
    ``SlotwiseForecaster(...).fit(y).predict_quantiles(...)`` with the settings below.
    """
    y = np.asarray(history, dtype=float).ravel()
    if season == "auto":
        season = season_steps(step_s, len(y) * step_s)
    levels = tuple(sorted(set(DEFAULT_LEVELS) | {float(q) for q in quantiles}))
    model = SlotwiseForecaster(
        horizon=max(1, int(h)),
        levels=levels,
        season=season if isinstance(season, int) else None,
        step_s=step_s,
        unit=1.0 / step_s,  # one request per step, in req/s
        prior_rate=prior_rate,
        replay=REPLAY,
    )
    return model.fit(y).predict_quantiles(h, quantiles)
