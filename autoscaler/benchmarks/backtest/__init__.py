"""The forecasting evaluation protocol (``slotwise backtest``, ``../shared/reference/forecast_protocol.md``) and the
baselines it scores slotwise's forecaster against: naive and seasonal naive with empirical quantiles, online ETS,
the last value, the global GBM, and statsforecast's AutoETS / MSTL (the optional ``bench`` extra)."""
