"""Quantile forecasting of request rates: the slotwise online forecaster and the trace readers.

``quantile_forecast(history, h, quantiles, step_s, season)`` runs the controller's forecaster on one
series; :class:`SlotwiseBatch` holds many series (the decision core's fleet forecaster shards them). The
baselines it is measured against and the backtest protocol are benchmark code
(:mod:`autoscaler.benchmarks.backtest`). Depends on numpy and scikit-learn, never on ``autoscaler``.
"""

from forecasting.api import quantile_forecast
from forecasting.slotwise import SlotwiseBatch, SlotwiseForecaster, prior_from_similar

__all__ = [
    "SlotwiseBatch",
    "SlotwiseForecaster",
    "prior_from_similar",
    "quantile_forecast",
]
