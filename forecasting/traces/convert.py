"""Conversions between the canonical shapes."""

from __future__ import annotations

import math

import numpy as np

from forecasting.traces.model import RateSeries, RequestLog


def to_rate_series(log: RequestLog, step_s: float, n_steps: int | None = None) -> RateSeries:
    """Bin ``log`` into ``step_s`` intervals from t = 0: ``rates[m, k]`` = requests of model m with
    ``k*step <= t < (k+1)*step``, divided by ``step_s``.

    The default length covers the last request. Where the log has tokens / service times, their
    per-bin means ride along as ``meta["mean_input_tokens"]`` etc. (shaped like ``rates``, NaN in
    empty bins) -- a forecaster of request rate alone would otherwise lose the load per request.
    """
    if not (math.isfinite(step_s) and step_s > 0):
        raise ValueError(f"step must be a positive number of seconds, got {step_s}")
    n_models = len(log.models)
    k = np.floor(log.t / step_s).astype(np.int64)
    if n_steps is None:
        n_steps = int(k[-1]) + 1 if len(k) else 0
    keep = k < n_steps
    flat = log.model_index[keep].astype(np.int64) * n_steps + k[keep]
    counts = np.bincount(flat, minlength=n_models * n_steps).reshape(n_models, n_steps)
    meta: dict[str, object] = {key: v for key, v in log.meta.items() if not isinstance(v, (np.ndarray, tuple))}
    meta["binned_from"] = log.source
    for key, values in (
        ("mean_input_tokens", log.input_tokens),
        ("mean_output_tokens", log.output_tokens),
        ("mean_service_s", log.service_s),
    ):
        if values is None:
            continue
        v = values[keep].astype(np.float64)
        ok = ~np.isnan(v)
        sums = np.bincount(flat[ok], weights=v[ok], minlength=n_models * n_steps)
        seen = np.bincount(flat[ok], minlength=n_models * n_steps)
        with np.errstate(invalid="ignore", divide="ignore"):
            meta[key] = (sums / np.where(seen > 0, seen, np.nan)).reshape(n_models, n_steps)
    return RateSeries(
        rates=counts.astype(np.float64) / step_s,
        models=log.models,
        step_s=float(step_s),
        start_s=0.0,
        source=log.source,
        meta=meta,
    )


def rebin(series: RateSeries, factor: int) -> RateSeries:
    """Coarsen ``series`` by merging ``factor`` consecutive steps (mean rate over the merged interval).

    A merged interval with a missing point is NaN: averaging over the known part would silently
    bias it. A trailing partial group is dropped for the same reason. Per-window meta arrays do not
    survive (a mean cv is not the cv of the merged window); per-model meta does.
    """
    if factor < 1:
        raise ValueError(f"rebin factor must be >= 1, got {factor}")
    n = series.n_steps // factor
    rates = series.rates[:, : n * factor].reshape(len(series.models), n, factor).mean(axis=2)
    meta = {k: v for k, v in series.meta.items() if not (isinstance(v, np.ndarray) and v.shape == series.rates.shape)}
    return RateSeries(
        rates=rates,
        models=series.models,
        step_s=series.step_s * factor,
        start_s=series.start_s,
        source=series.source,
        meta=meta,
    )
