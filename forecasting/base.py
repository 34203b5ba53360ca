"""The forecaster contract (scikit-learn style).

Parameters go in ``__init__``; ``fit(y)`` learns from a history (oldest first, NaN = missing);
``update(y_new)`` folds in new observations online; ``predict_quantiles(h, quantiles)`` returns an
array of shape ``(len(quantiles), h)``: the quantiles of each of the next ``h`` steps. Learned
attributes end in ``_``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np


class Forecaster(Protocol):
    def fit(self, y: np.ndarray) -> Forecaster: ...

    def update(self, y_new: np.ndarray) -> Forecaster: ...

    def predict_quantiles(self, h: int, quantiles: Sequence[float]) -> np.ndarray: ...
