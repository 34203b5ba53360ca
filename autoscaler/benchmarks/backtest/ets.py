"""Exponential smoothing in numpy, online: damped-trend Holt with parameters picked by one-step
squared error on the history, and empirical k-step-error quantiles over a recent window.

statsforecast's AutoETS is the benchmark baseline; this is the light, dependency-free version the
controller can run every tick (an ``update`` is a few float operations).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

ALPHAS = np.array([0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 0.9, 1.0])


class ExpSmoothing:
    """Holt's linear method with a damped trend (``beta = 0`` gives simple exponential smoothing).

    ``fit`` chooses ``alpha`` from a grid by one-step squared error over the history (all candidates
    run in one vectorised pass); ``update`` runs the recursion; quantiles of step k are the forecast
    plus the empirical quantiles of the k-step errors over the last ``window`` points. NaN points are
    skipped (the state coasts), so gaps do not reset the model.
    """

    def __init__(self, beta: float = 0.0, phi: float = 0.9, window: int = 1440, max_h: int = 64) -> None:
        self.beta = beta
        self.phi = phi
        self.window = window
        self.max_h = max_h

    def fit(self, y: np.ndarray) -> ExpSmoothing:
        y = np.asarray(y, dtype=float).ravel()
        finite = y[np.isfinite(y)]
        if finite.size >= 3:
            level = np.full(len(ALPHAS), finite[0])
            trend = np.zeros(len(ALPHAS))
            sse = np.zeros(len(ALPHAS))
            for v in finite[1:]:
                pred = level + self.phi * trend
                err = v - pred
                sse += err * err
                new = pred + ALPHAS * err
                trend = self.phi * trend + self.beta * (new - level - self.phi * trend)
                level = new
            self.alpha_ = float(ALPHAS[int(np.argmin(sse))])
        else:
            self.alpha_ = 0.5
        self.level_ = float("nan")
        self.trend_ = 0.0
        self.y_ = np.zeros(0)
        self.fc_ = np.zeros((0, self.max_h))  # forecasts made before each kept point
        return self.update(y)

    def update(self, y_new: np.ndarray) -> ExpSmoothing:
        if not hasattr(self, "alpha_"):
            return self.fit(y_new)
        ys, fcs = [], []
        for v in np.asarray(y_new, dtype=float).ravel():
            fcs.append(self._path(self.max_h))
            ys.append(v)
            if not np.isfinite(v):
                continue
            if not np.isfinite(self.level_):
                self.level_ = float(v)
                continue
            pred = self.level_ + self.phi * self.trend_
            new = pred + self.alpha_ * (v - pred)
            self.trend_ = self.phi * self.trend_ + self.beta * (new - self.level_ - self.phi * self.trend_)
            self.level_ = new
        if ys:
            self.y_ = np.concatenate([self.y_, ys])[-self.window :]
            self.fc_ = np.concatenate([self.fc_, np.array(fcs)])[-self.window :]
        return self

    def _path(self, h: int) -> np.ndarray:
        if not np.isfinite(self.level_):
            return np.full(h, np.nan)
        damp = np.cumsum(self.phi ** np.arange(1, h + 1))
        return self.level_ + damp * self.trend_

    def predict_quantiles(self, h: int, quantiles: Sequence[float]) -> np.ndarray:
        qs = np.asarray(quantiles, dtype=float)
        if not hasattr(self, "alpha_") or not np.isfinite(self.level_):
            return np.zeros((len(qs), h))
        point = self._path(h)
        out = np.empty((len(qs), h))
        for k in range(1, h + 1):
            kk = min(k, self.max_h)
            # Error of the k-step forecast made k points before each kept point.
            if len(self.y_) > kk:
                err = self.y_[kk:] - self.fc_[:-kk, kk - 1]
                err = err[np.isfinite(err)]
            else:
                err = np.zeros(0)
            out[:, k - 1] = point[k - 1] + (np.quantile(err, qs) if err.size else 0.0)
        return np.sort(np.maximum(out, 0.0), axis=0)
