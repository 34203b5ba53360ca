"""A global quantile model across all series: scikit-learn HistGradientBoostingRegressor(loss='quantile')
on scale-free lag / time-of-day features (the protocol's ``hgb`` baseline, and a reusable model).

Features per (series, origin t, step k): k, time of day of the target, log scale, the lags
y[t-1..t-L], 24 hourly means over the last day, the value one day before the target and the 5-step
mean around it -- all divided by scale = 1 + mean(y[t-L:t]), so one model serves series of any size.
The target is y/scale with sample_weight = scale, which makes the training loss the wQL the protocol
scores. Values before the start of a series are NaN (the trees route them), so short histories work.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

MAX_ROWS = 200_000


class GlobalQuantileGBM:
    """One HistGradientBoostingRegressor per quantile level, trained across series.

    ``fit(Y)`` trains on every (series, origin) of the (M, T) history whose h targets lie inside it;
    ``predict(Y, origins)`` gives (len(origins), M, Q, h) quantiles for origins t (seeing Y[:, :t]).
    """

    def __init__(
        self,
        h: int,
        quantiles: Sequence[float] = (0.5, 0.9, 0.99),
        lags: int = 60,
        season: int = 1440,
        step_s: float = 60.0,
        start_tod_s: float = 0.0,
        max_rows: int = MAX_ROWS,
        max_iter: int = 100,
        random_state: int = 0,
    ) -> None:
        self.h = h
        self.quantiles = tuple(quantiles)
        self.lags = lags
        self.season = season
        self.step_s = step_s
        self.start_tod_s = start_tod_s
        self.max_rows = max_rows
        self.max_iter = max_iter
        self.random_state = random_state

    # -------------------------------------------------------------- features

    def _pad(self, y: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
        pad = self.season + self.lags + 8
        yp = np.concatenate([np.full((y.shape[0], pad), np.nan), y], axis=1)
        z = np.nan_to_num(yp)
        csum = np.concatenate([np.zeros((y.shape[0], 1)), np.cumsum(z, axis=1)], axis=1)
        ccnt = np.concatenate([np.zeros((y.shape[0], 1)), np.cumsum(np.isfinite(yp), axis=1)], axis=1)
        return yp, csum, ccnt, pad

    def _features(
        self, padded: tuple[np.ndarray, np.ndarray, np.ndarray, int], ii: np.ndarray, tt: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Rows for pairs (ii, tt) x steps k = 1..h (pair-major): X, scale, target index."""
        yp, csum, ccnt, pad = padded
        L, D, h = self.lags, self.season, self.h
        lag_idx = tt[:, None] - np.arange(1, L + 1)[None, :] + pad
        lags = yp[ii[:, None], lag_idx]
        with np.errstate(invalid="ignore"):
            scale = 1.0 + np.nan_to_num(np.nanmean(np.where(np.isfinite(lags), lags, np.nan), axis=1))
        # 24 hourly means over the last day (NaN where the day reaches before the series starts).
        b = max(1, D // 24)
        starts = tt[:, None] - D + b * np.arange(24)[None, :] + pad
        ends = starts + b
        cnt = ccnt[ii[:, None], ends] - ccnt[ii[:, None], starts]
        with np.errstate(invalid="ignore", divide="ignore"):
            hourly = (csum[ii[:, None], ends] - csum[ii[:, None], starts]) / cnt
        hourly = np.where((starts >= pad) & (cnt > 0), hourly, np.nan)
        per_pair = np.concatenate([np.log(scale)[:, None], lags / scale[:, None], hourly / scale[:, None]], axis=1)
        rows = []
        for k in range(1, h + 1):
            target = tt + k - 1
            tod = ((self.start_tod_s + target * self.step_s) % 86400.0) / 86400.0
            day = target - D + pad
            prev = yp[ii, day]
            around = yp[ii[:, None], day[:, None] + np.arange(-2, 3)[None, :]]
            with np.errstate(invalid="ignore"):
                cnt5 = np.isfinite(around).sum(axis=1)
                mean5 = np.where(cnt5 > 0, np.nansum(around, axis=1) / np.maximum(cnt5, 1), np.nan)
            rows.append(
                np.concatenate(
                    [
                        np.full((len(tt), 1), float(k)),
                        tod[:, None],
                        per_pair,
                        (prev / scale)[:, None],
                        (mean5 / scale)[:, None],
                    ],
                    axis=1,
                )
            )
        x = np.stack(rows, axis=1).reshape(len(tt) * h, -1).astype(np.float32)
        target_idx = (tt[:, None] + np.arange(h)[None, :]).ravel()
        return x, np.repeat(scale, h), target_idx

    # -------------------------------------------------------------- fit / predict

    def fit(self, y: np.ndarray) -> GlobalQuantileGBM:
        from sklearn.ensemble import HistGradientBoostingRegressor

        y = np.asarray(y, dtype=float)
        m, n = y.shape
        t_lo, t_hi = min(self.lags, max(1, n - self.h)), n - self.h  # targets y[t..t+h-1] inside y
        if t_hi < t_lo:
            raise ValueError("history too short to train the global model")
        ii, tt = np.meshgrid(np.arange(m), np.arange(t_lo, t_hi + 1), indexing="ij")
        ii, tt = ii.ravel(), tt.ravel()
        max_pairs = max(1, self.max_rows // self.h)
        if len(ii) > max_pairs:
            pick = np.sort(np.random.default_rng(self.random_state).choice(len(ii), max_pairs, replace=False))
            ii, tt = ii[pick], tt[pick]
        padded = self._pad(y)
        x, scale, tidx = self._features(padded, ii, tt)
        target = y[np.repeat(ii, self.h), tidx]
        ok = np.isfinite(target)
        # A feature with no value at all in training (the hourly means of a day that lies before every
        # short series' start) carries nothing and breaks the binner: drop it, at predict time too.
        self.keep_ = np.isfinite(x[ok]).any(axis=0)
        x = x[:, self.keep_]
        self.models_ = []
        for q in self.quantiles:
            reg = HistGradientBoostingRegressor(
                loss="quantile", quantile=q, max_iter=self.max_iter, random_state=self.random_state
            )
            reg.fit(x[ok], (target / scale)[ok], sample_weight=scale[ok])
            self.models_.append(reg)
        return self

    def predict(
        self, y: np.ndarray, origins: np.ndarray, chunk: int = 50_000, start_tod_s: float | None = None
    ) -> np.ndarray:
        """``start_tod_s``: time of day of y[:, 0] when ``y`` is a recent window, not the training
        history's clock."""
        y = np.asarray(y, dtype=float)
        saved = self.start_tod_s
        if start_tod_s is not None:
            self.start_tod_s = start_tod_s
        try:
            return self._predict(y, origins, chunk)
        finally:
            self.start_tod_s = saved

    def _predict(self, y: np.ndarray, origins: np.ndarray, chunk: int) -> np.ndarray:
        m = y.shape[0]
        padded = self._pad(y)
        out = np.empty((len(origins), m, len(self.quantiles), self.h))
        per = max(1, chunk // (m * self.h))
        for a in range(0, len(origins), per):
            ts = np.asarray(origins[a : a + per])
            ii = np.tile(np.arange(m), len(ts))
            tt = np.repeat(ts, m)
            x, scale, _ = self._features(padded, ii, tt)
            x = x[:, self.keep_]
            for qi, reg in enumerate(self.models_):
                pred = (reg.predict(x) * scale).reshape(len(ts), m, self.h)
                out[a : a + len(ts), :, qi, :] = pred
        return np.sort(np.maximum(out, 0.0), axis=2)
