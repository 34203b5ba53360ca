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
        self._held = np.zeros(m)  # requests held by the engine (no routable replica), newest tick (issue 18)
        self._kv = np.full(m, np.nan)  # KV-cache use per model (a fraction), newest tick; NaN: not simulated
        self._itl = np.full(m, np.nan)  # ITL at the SLO percentile per model, newest tick; NaN: none
        self._no_itl = self._itl  # (read-only: what a tick without ITL readings reports)
        self._queued = self._no_queue = np.zeros(m)  # requests waiting for a slot, newest tick
        self._running = self._no_running = np.full(m, np.nan)  # requests in the engines' batches, newest tick
        self._filled = 0
        self.warmup = warmup  # samples needed before the data counts (a fresh scrape is not a window)
        self.stale = np.zeros(m, dtype=bool)  # fault injection: a lost metric source
        self.future_rate: np.ndarray | None = None  # set only when the policy is the clairvoyant oracle
        self._rows: tuple[int, list[tuple[np.ndarray, np.ndarray, np.ndarray]]] | None = None  # (lo, views per model)

    def push(
        self, rate: np.ndarray, in_flight: np.ndarray, latency: np.ndarray, within_rate: np.ndarray | None = None,
        kv_cache: np.ndarray | None = None, held: np.ndarray | None = None, itl: np.ndarray | None = None,
        queued: np.ndarray | None = None, running: np.ndarray | None = None,
    ) -> None:
        """One tick's samples; ``within_rate``: requests/s settled within the SLO (default: all of them);
        ``kv_cache``: each model's KV-cache use as a fraction (default: not simulated, NaN -- the KV rail then has
        no effect, as on a live engine without the gauge); ``held``: the engine's held queue at the tick's end (requests
        waiting for a model at zero: ``ModelMetrics.held_requests``; default none); ``itl``: the ITL at each model's SLO
        percentile (``ModelMetrics.itl_s``; default none, NaN); ``queued``: requests waiting for a slot at the tick's
        end (the engines' waiting gauge, ``ModelMetrics.queue_depth``; default 0, as before the KV cache was
        simulated); ``running``: the requests the engines ran, the tick's mean (their running gauge,
        ``ModelMetrics.running``; default none, NaN)."""
        self._rate[:, :-1] = self._rate[:, 1:]
        self._rate[:, -1] = rate
        self._in_flight[:, :-1] = self._in_flight[:, 1:]
        self._in_flight[:, -1] = in_flight
        self._within[:, :-1] = self._within[:, 1:]
        self._within[:, -1] = rate if within_rate is None else within_rate
        self._latency = latency
        if kv_cache is not None:
            self._kv = kv_cache
        self._held = np.zeros(len(self.models)) if held is None else np.asarray(held, dtype=np.float64)
        self._itl = self._no_itl if itl is None else np.asarray(itl, dtype=np.float64)
        self._queued = self._no_queue if queued is None else np.asarray(queued, dtype=np.float64)
        self._running = self._no_running if running is None else np.asarray(running, dtype=np.float64)
        self._filled = min(self._filled + 1, self.size)

    def window(self, now: float) -> MetricsWindow:
        n = self._filled
        lo = self.size - n
        if self._rows is None or self._rows[0] != lo:
            # Each model's row views: the ring shifts in place, so the same views show every tick's samples (made
            # anew only while the ring fills).
            self._rows = (lo, [(self._rate[i, lo:], self._in_flight[i, lo:], self._within[i, lo:])
                               for i in range(len(self.models))])
        rows = self._rows[1]
        fut = None if self.future_rate is None else self.future_rate.tolist()
        latency = np.asarray(self._latency, dtype=np.float64).tolist()
        kv = np.asarray(self._kv, dtype=np.float64).tolist()
        young = n < self.warmup  # too little data is "no data", not "zero load": policies hold until it arrives
        stale = self.stale.tolist()
        held = self._held.tolist()
        itl = self._itl.tolist()
        queued = self._queued.tolist()
        running = self._running.tolist()
        models = {
            name: ModelMetrics(
                rate=rows[i][0],
                in_flight=rows[i][1],
                within_rate=rows[i][2],
                latency_s=latency[i],
                stale=stale[i] or young,
                future_rate=None if fut is None else fut[i],
                kv_cache_usage=kv[i],
                held_requests=held[i],
                itl_s=itl[i],
                queue_depth=queued[i],
                running=running[i],
            )
            for i, name in enumerate(self.models)
        }
        return MetricsWindow(now=now, step_s=self.step_s, models=models)

