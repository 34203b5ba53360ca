"""Online conformal calibration: quantile tracking of forecast scores.

A quantile forecast ``point + r * scale`` is calibrated by moving the offset ``r`` after every
observation with the pinball-loss gradient (Angelopoulos, Candès & Tibshirani, "Conformal PID
control", 2023, the "quantile tracking" part):

    r <- r + eta * (q - 1{score <= r})

Whatever the data do, the long-run fraction of scores at or below ``r`` converges to ``q`` (the
error is bounded by (max |r| + eta) / (eta * T)), so coverage matches the nominal level without any
distributional assumption -- the property a quantile that sizes GPUs needs. ``eta`` is scaled by a
running mean of ``|score|`` so the same learning rate suits series of any size and burstiness.

Everything is vectorised over a leading batch of arbitrary shape, so one tracker object serves all
members x series x horizon steps x quantile levels at once.
"""

from __future__ import annotations

import numpy as np


class QuantileTracker:
    """Tracks quantile levels ``levels`` (last axis) of scores arriving with shape ``shape``.

    ``r_`` has shape ``shape + (len(levels),)``. ``update(score, mask)`` takes scores of shape
    ``shape`` (NaN or ``mask == False`` = no observation: the tracker does not move).
    """

    def __init__(
        self,
        shape: tuple[int, ...],
        levels: np.ndarray,
        lr: float = 0.05,
        scale_decay: float = 0.02,
        init: np.ndarray | None = None,
        init_scale: float = 0.5,
        bound: float = 1e3,
    ) -> None:
        self.levels = np.asarray(levels, dtype=float)
        self.lr = float(lr)
        self.scale_decay = float(scale_decay)
        self.bound = float(bound)
        q = len(self.levels)
        self.r_ = np.zeros((*shape, q)) if init is None else np.broadcast_to(init, (*shape, q)).astype(float).copy()
        # Running mean of |score|: the step size follows the spread of the scores it tracks.
        self.scale_ = np.full(shape, float(init_scale))

    def update(
        self,
        score: np.ndarray,
        mask: np.ndarray | None = None,
        clip: float | None = None,
        target: np.ndarray | None = None,
    ) -> None:
        """Fold in one score per tracked cell: shape ``shape`` (shared by all levels) or
        ``shape + (len(levels),)`` (one per level, e.g. when each level has its own forecast)."""
        per_level = score.ndim == self.r_.ndim
        ok = np.isfinite(score).all(axis=-1) if per_level else np.isfinite(score)
        if mask is not None:
            ok &= mask
        s = np.where(ok[..., None] if per_level else ok, score, 0.0)
        if clip is not None:
            # Scores are relative errors; a 50x surprise says "outlier", not "widen by 50x".
            s = np.clip(s, -clip, clip)
        a = self.scale_decay * ok
        mag = np.abs(s).mean(axis=-1) if per_level else np.abs(s)
        self.scale_ += a * (mag - self.scale_)
        hit = (s if per_level else s[..., None]) <= self.r_
        step = (self.lr * self.scale_ * ok)[..., None]
        # ``target``: the level each cell aims at, when it differs from the nominal one (a pooled
        # correction); broadcast against r_.
        self.r_ += step * ((self.levels if target is None else target) - hit)
        # A bound keeps one absurd outlier (a series switching on from zero) from parking the
        # offset where it needs thousands of steps to come back.
        np.clip(self.r_, -self.bound, self.bound, out=self.r_)


def pinball(y: np.ndarray, pred: np.ndarray, q: np.ndarray | float) -> np.ndarray:
    """Pinball loss q*(y-p) if y >= p else (1-q)*(p-y), elementwise (broadcasting)."""
    d = y - pred
    return np.where(d >= 0, q * d, (q - 1.0) * d)
