"""The simulated Metrics port: what Prometheus would hold, one sample per simulator tick."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from autoscaler.api.snapshot import MetricsWindow, ModelMetrics


class SimMetrics:
    """Ring of the last ``size`` samples per model (rate, in-flight, latency at the SLO percentile).

    The arrays handed out in a window are views valid for the current tick only (the core copies what
    it keeps: forecasters fold samples in, they do not hold the arrays).
    """

    def __init__(self, models: Sequence[str], step_s: float, size: int, warmup: int = 1) -> None:
        self.models = list(models)
        self.step_s = step_s
        self.size = size
        m = len(self.models)
        self._rate = np.zeros((m, size))
        self._in_flight = np.zeros((m, size))
        self._within = np.zeros((m, size))
        self._latency = np.full(m, np.nan)
        self._filled = 0
        self.warmup = warmup  # samples needed before the data counts (a fresh scrape is not a window)
        self.stale = np.zeros(m, dtype=bool)  # fault injection: a lost metric source
        self.future_rate: np.ndarray | None = None  # set only when the policy is the clairvoyant oracle

    def push(
        self, rate: np.ndarray, in_flight: np.ndarray, latency: np.ndarray, within_rate: np.ndarray | None = None
    ) -> None:
        """One tick's samples; ``within_rate``: requests/s settled within the SLO (default: all of them)."""
        self._rate[:, :-1] = self._rate[:, 1:]
        self._rate[:, -1] = rate
        self._in_flight[:, :-1] = self._in_flight[:, 1:]
        self._in_flight[:, -1] = in_flight
        self._within[:, :-1] = self._within[:, 1:]
        self._within[:, -1] = rate if within_rate is None else within_rate
        self._latency = latency
        self._filled = min(self._filled + 1, self.size)

    def window(self, now: float) -> MetricsWindow:
        n = self._filled
        lo = self.size - n
        fut = self.future_rate
        models = {
            name: ModelMetrics(
                rate=self._rate[i, lo:],
                in_flight=self._in_flight[i, lo:],
                within_rate=self._within[i, lo:],
                latency_s=float(self._latency[i]),
                # Too little data is "no data", not "zero load": policies hold until it arrives.
                stale=bool(self.stale[i]) or n < self.warmup,
                future_rate=None if fut is None else float(fut[i]),
            )
            for i, name in enumerate(self.models)
        }
        return MetricsWindow(now=now, step_s=self.step_s, models=models)

