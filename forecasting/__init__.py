"""Quantile forecasting of request rates: baselines, the slotwise online forecaster, the backtest.

``quantile_forecast(history, h, quantiles, step_s, season)`` runs the controller's forecaster on one
series; :class:`SlotwiseForecaster` is the per-model object the decision core holds.
"""

from forecasting.api import quantile_forecast
from forecasting.empirical import NaiveQuantile, SeasonalNaiveQuantile
from forecasting.ets import ExpSmoothing
from forecasting.naive import LastValue
from forecasting.slotwise import SlotwiseBatch, SlotwiseForecaster, prior_from_similar

__all__ = [
    "ExpSmoothing",
    "LastValue",
    "NaiveQuantile",
    "SeasonalNaiveQuantile",
    "SlotwiseBatch",
    "SlotwiseForecaster",
    "prior_from_similar",
    "quantile_forecast",
]
