"""Naive and seasonal-naive forecasters with empirical-residual quantiles (the protocol's baselines).

naive   point y[t-1]; quantile q of step k = point + empirical q-quantile ('linear') of the k-step
        changes y[j+k] - y[j] over the last W observed values.
snaive  point y[t+k-1-m]; quantile = point + empirical q-quantile of y[j] - y[j-m] over the last W
        values; naive without a season (or before a full season is seen).

The functions work on all series of a set at once (M, n) -- the backtest's path; the classes are the
per-series, scikit-learn-style forecasters built on them.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import numpy as np


def _finish(pred: np.ndarray) -> np.ndarray:
    """Every baseline clips at 0 and sorts across quantiles (axis -2)."""
    return np.sort(np.maximum(pred, 0.0), axis=-2)


def _quantile(x: np.ndarray, qs: np.ndarray) -> np.ndarray:
    """Row-wise empirical quantiles (numpy 'linear'), NaN-aware; (M, n) -> (M, Q); 0 if no data."""
    if x.shape[1] == 0:
        return np.zeros((x.shape[0], len(qs)))
    if np.isnan(x).any():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            out = np.nanquantile(x, qs, axis=1).T
        return np.nan_to_num(out, nan=0.0)
    return np.quantile(x, qs, axis=1).T


def naive_quantiles(y: np.ndarray, t: int, h: int, qs: np.ndarray, window: int) -> np.ndarray:
    """Protocol naive at origin t for all series: (M, Q, h)."""
    lo = max(0, t - window)
    hist = y[:, lo:t]
    last = y[:, t - 1]
    out = np.empty((y.shape[0], len(qs), h))
    for k in range(1, h + 1):
        err = hist[:, k:] - hist[:, :-k] if hist.shape[1] > k else np.zeros((y.shape[0], 0))
        out[:, :, k - 1] = last[:, None] + _quantile(err, qs)
    return _finish(out)


def snaive_quantiles(y: np.ndarray, t: int, h: int, qs: np.ndarray, window: int, season: int | None) -> np.ndarray:
    """Protocol seasonal naive at origin t: (M, Q, h); naive without a season or a full season."""
    if season is None or t <= season or h > season:
        return naive_quantiles(y, t, h, qs, window)
    lo = max(t - window, season)
    res = y[:, lo:t] - y[:, lo - season : t - season]
    point = y[:, t - season : t - season + h]  # y[t+k-1-m], k = 1..h
    return _finish(point[:, None, :] + _quantile(res, qs)[:, :, None])


class NaiveQuantile:
    """Last value plus empirical k-step-change quantiles over the last ``window`` points."""

    def __init__(self, window: int = 1440) -> None:
        self.window = window

    def fit(self, y: np.ndarray) -> NaiveQuantile:
        self.y_ = np.zeros(0)
        return self.update(y)

    def update(self, y_new: np.ndarray) -> NaiveQuantile:
        y = np.asarray(y_new, dtype=float).ravel()
        self.y_ = np.concatenate([getattr(self, "y_", np.zeros(0)), y])[-self._keep() :]
        return self

    def _keep(self) -> int:
        return self.window

    def predict_quantiles(self, h: int, quantiles: Sequence[float]) -> np.ndarray:
        y = getattr(self, "y_", np.zeros(0))
        qs = np.asarray(quantiles, dtype=float)
        if not np.isfinite(y).any():
            return np.zeros((len(qs), h))
        # A missing last point: forecast from the last finite one (the errors skip NaN pairs).
        last = np.flatnonzero(np.isfinite(y))[-1]
        return self._predict(y[: last + 1][None, :], h, qs)[0]

    def _predict(self, y: np.ndarray, h: int, qs: np.ndarray) -> np.ndarray:
        return naive_quantiles(y, y.shape[1], h, qs, self.window)


class SeasonalNaiveQuantile(NaiveQuantile):
    """Same value one season ago plus empirical seasonal-difference quantiles; naive without a season."""

    def __init__(self, season: int | None = None, window: int = 1008) -> None:
        super().__init__(window)
        self.season = season

    def _keep(self) -> int:
        return self.window + (self.season or 0)

    def _predict(self, y: np.ndarray, h: int, qs: np.ndarray) -> np.ndarray:
        return snaive_quantiles(y, y.shape[1], h, qs, self.window, self.season)
