"""statsforecast baselines of the backtest protocol (AutoETS, MSTL). Benchmark-only: statsforecast is
an optional extra, imported here and nowhere on the controller's path.

ets  AutoETS('ZZN', season_length=1) fit on the last W values at the first origin of each block of R
     steps (counted from the first origin), applied with ``forward`` on the last W values at the
     other origins of the block. q0.5 = mean, q0.9 = hi-80, q0.99 = hi-98. A failed / non-finite
     fit or forward refits at that origin, then falls back to "all quantiles = y[t-1]" (counted).
mstl seasonal sets: ``statsforecast.mstl.mstl`` (period m, defaults) of the last 7 days, refit daily;
     AutoETS('ZZN') on the deseasonalised part; inside a block the seasonal component is frozen (the
     last fitted day repeated) and the ETS part is moved with ``forward`` on y - seasonal.
"""

from __future__ import annotations

import warnings

import numpy as np

from autoscaler.benchmarks.backtest.setup import Setup

LEVELS = [80, 98]


def _quantiles(fc: dict[str, np.ndarray], qs: np.ndarray) -> np.ndarray:
    """statsforecast output -> (Q, h) for the protocol's levels (0.5 mean, 0.9 hi-80, 0.99 hi-98)."""
    rows = []
    for q in qs:
        if abs(q - 0.5) < 1e-9:
            rows.append(fc["mean"])
        elif abs(q - 0.9) < 1e-9:
            rows.append(fc["hi-80"])
        elif abs(q - 0.99) < 1e-9:
            rows.append(fc["hi-98"])
        else:
            raise ValueError(f"ets/mstl baselines give quantiles 0.5, 0.9, 0.99 only, not {q}")
    return np.asarray(rows, dtype=float)


def _fit(x: np.ndarray):
    from statsforecast.models import AutoETS

    return AutoETS(model="ZZN", season_length=1).fit(x)


def _block_start(t: int, setup: Setup) -> int:
    return setup.first + ((t - setup.first) // setup.refit) * setup.refit


def run_ets(y: np.ndarray, setup: Setup, qs: np.ndarray) -> tuple[np.ndarray, dict[str, object]]:
    h = setup.h
    out = np.empty((len(setup.origins), y.shape[0], len(qs), h))
    fallbacks = refits = 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for i in range(y.shape[0]):
            model = None
            block = None
            for o, t in enumerate(setup.origins):
                t = int(t)
                x = y[i, max(0, t - setup.window) : t]
                b = _block_start(t, setup)
                pred = None
                if b != block or model is None:
                    block = b
                    model = _try(lambda x=x: _fit(x))
                    if model is not None:
                        pred = _try(lambda m=model, x=x: _quantiles(m.predict(h, level=LEVELS), qs))
                else:
                    pred = _try(lambda m=model, x=x: _quantiles(m.forward(x, h, level=LEVELS), qs))
                    if pred is None:
                        refits += 1
                        model = _try(lambda x=x: _fit(x))
                        if model is not None:
                            pred = _try(lambda m=model, x=x: _quantiles(m.predict(h, level=LEVELS), qs))
                if pred is None:
                    fallbacks += 1
                    pred = np.full((len(qs), h), y[i, t - 1])
                out[o, i] = pred
    return np.sort(np.maximum(out, 0.0), axis=-2), {"fallbacks": fallbacks, "refits_after_failure": refits}


def _try(f):
    try:
        r = f()
    except Exception:  # statsforecast raises assorted errors on degenerate series: all "failed"
        return None
    if isinstance(r, np.ndarray) and not np.all(np.isfinite(r)):
        return None
    return r


def run_mstl(y: np.ndarray, setup: Setup, qs: np.ndarray) -> tuple[np.ndarray, dict[str, object]]:
    from statsforecast.mstl import mstl

    m = setup.season
    if m is None:
        raise ValueError("mstl needs a season")
    h = setup.h
    span = 7 * m
    out = np.empty((len(setup.origins), y.shape[0], len(qs), h))
    fallbacks = 0
    day = m  # refit daily
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for i in range(y.shape[0]):
            block = None
            model = None
            seas_hist = np.zeros(0)
            last_day = np.zeros(m)
            for o, t in enumerate(setup.origins):
                t = int(t)
                lo = max(0, t - span)
                b = setup.first + ((t - setup.first) // day) * day
                pred = None
                if b != block:
                    block = b
                    x = y[i, lo:t]
                    dec = _try(lambda x=x: mstl(x, period=m))
                    if dec is not None:
                        seas_hist = np.asarray(dec["seasonal"], dtype=float)
                        last_day = seas_hist[-m:]
                        seas_start = lo  # seas_hist[j] is the seasonal part of y[seas_start + j]
                        model = _try(lambda x=x, s=seas_hist: _fit(x - s))
                    else:
                        model = None
                    if model is not None:
                        fc = _try(lambda mm=model: _quantiles(mm.predict(h, level=LEVELS), qs))
                        if fc is not None:
                            pred = fc + _frozen(last_day, b, t, h)[None, :]
                elif model is not None:
                    times = np.arange(lo, t)
                    seas = np.where(
                        times < b,
                        seas_hist[np.clip(times - seas_start, 0, len(seas_hist) - 1)],
                        last_day[(times - b) % m],
                    )
                    x = y[i, lo:t] - seas
                    fc = _try(lambda mm=model, x=x: _quantiles(mm.forward(x, h, level=LEVELS), qs))
                    if fc is not None:
                        pred = fc + _frozen(last_day, b, t, h)[None, :]
                if pred is None or not np.all(np.isfinite(pred)):
                    fallbacks += 1
                    pred = np.full((len(qs), h), y[i, t - 1])
                out[o, i] = pred
    return np.sort(np.maximum(out, 0.0), axis=-2), {"fallbacks": fallbacks}


def _frozen(last_day: np.ndarray, block: int, t: int, h: int) -> np.ndarray:
    """Seasonal forecast of y[t..t+h): the last fitted day repeated from the block start on."""
    m = len(last_day)
    return last_day[(np.arange(t, t + h) - block) % m]
