"""Last-value forecaster: the first, simplest member (every quantile = the last finite observation)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


class LastValue:
    """Predicts the last finite observation for every step and quantile; 0 before any data."""

    def __init__(self) -> None:
        self.last_: float = 0.0
        self.n_seen_: int = 0

    def fit(self, y: np.ndarray) -> LastValue:
        self.last_, self.n_seen_ = 0.0, 0
        return self.update(y)

    def update(self, y_new: np.ndarray) -> LastValue:
        y = np.asarray(y_new, dtype=float).ravel()
        finite = y[np.isfinite(y)]
        if finite.size:
            self.last_ = float(finite[-1])
            self.n_seen_ += int(finite.size)
        return self

    def predict_quantiles(self, h: int, quantiles: Sequence[float]) -> np.ndarray:
        return np.full((len(quantiles), h), self.last_, dtype=float)
