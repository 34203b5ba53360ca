"""Forecast cost per series per tick: 1,000 series forecast together, one core.

The 1,000 series are Azure Functions 2019's 500 real per-minute series (8 h), each twice: the second
copy shifted by half the trace so the two are not in phase. Each series is warm-started on its first
240 minutes; then every tick folds in one new point per series and asks for the quantiles
(0.5, 0.9, 0.99) of the next 10 minutes. Reports the amortised milliseconds per series per tick for

* fleet      -- the controller's configuration, as ``slotwise backtest`` scores it: the batches
                ``FleetForecaster.new_batch`` builds (shards of ``shard_size`` = 64 series, daily season,
                every setting the controller's), req/s in and out;
* batch      -- one SlotwiseBatch over all 1,000 series (no season), and
* per-model  -- 1,000 SlotwiseForecaster objects, one per model: the online API a library user holds
                (``fit`` once, ``update`` + ``predict_quantiles`` per step).

Every path is one-step-per-tick online updating (no refits exist: the forecaster has nothing to refit;
warm starts are reported apart). Thread pools are pinned to one thread.

    .venv/bin/python bench/forecast_speed.py [--series 1000] [--ticks 120] [--skip-per-model]
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

from autoscaler.benchmarks.backtest.protocol import load_counts
from autoscaler.estimation.forecast import FleetForecaster
from forecasting.slotwise import SlotwiseBatch, SlotwiseForecaster

QS = (0.5, 0.9, 0.99)
H = 10
WARM = 240


def _series(n: int) -> np.ndarray:
    y, _, _ = load_counts("azure-functions-2019")
    reps = [np.roll(y, s * (y.shape[1] // 2), axis=1) for s in range(-(-n // y.shape[0]))]
    return np.concatenate(reps)[:n]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--series", type=int, default=1000)
    ap.add_argument("--ticks", type=int, default=120)
    ap.add_argument("--skip-per-model", action="store_true")
    args = ap.parse_args()
    try:
        from threadpoolctl import threadpool_limits

        threadpool_limits(limits=1)
    except ImportError:  # pragma: no cover - ships with scikit-learn
        pass
    y = _series(args.series)
    ticks = min(args.ticks, y.shape[1] - WARM)
    print(
        f"{y.shape[0]} series, warm start {WARM} steps, {ticks} ticks, h={H}, quantiles {QS}, "
        f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}"
    )

    # the controller's path: shards of FleetForecaster.new_batch, fed req/s
    fleet = FleetForecaster(step_s=60.0, horizon_s=H * 60.0)
    rate = y / 60.0
    t0 = time.perf_counter()
    size = fleet.shard_size
    shards = [
        (fleet.new_batch(len(rows)).warm_start(rate[rows, :WARM]), rows)
        for rows in (np.arange(i, min(i + size, y.shape[0])) for i in range(0, y.shape[0], size))
    ]
    warm = time.perf_counter() - t0
    t0 = time.perf_counter()
    for t in range(WARM, WARM + ticks):
        for b, rows in shards:
            b.update(rate[rows, t])
            b.predict_quantiles(H, QS)
    tick = (time.perf_counter() - t0) / ticks
    print(
        f"fleet:     {1000 * tick / y.shape[0]:.4f} ms per series per tick  "
        f"({1000 * tick:.1f} ms per tick, {len(shards)} shards of <= {size}; warm start {warm:.1f} s)"
    )

    t0 = time.perf_counter()
    batch = SlotwiseBatch(y.shape[0], horizon=H, step_s=60.0, unit=1.0).warm_start(y[:, :WARM])
    warm = time.perf_counter() - t0
    t0 = time.perf_counter()
    for t in range(WARM, WARM + ticks):
        batch.update(y[:, t])
        batch.predict_quantiles(H, QS)
    tick = (time.perf_counter() - t0) / ticks
    print(
        f"batch:     {1000 * tick / y.shape[0]:.4f} ms per series per tick  "
        f"({1000 * tick:.1f} ms per tick; warm start {warm:.1f} s = {1000 * warm / y.shape[0] / WARM:.4f} ms "
        f"per series-step)"
    )

    if args.skip_per_model:
        return
    t0 = time.perf_counter()
    models = [SlotwiseForecaster(horizon=H, step_s=60.0, unit=1.0).fit(y[i, :WARM]) for i in range(y.shape[0])]
    warm = time.perf_counter() - t0
    n_ticks = min(ticks, 20)  # the per-object path is slower: fewer ticks give the same average
    t0 = time.perf_counter()
    for t in range(WARM, WARM + n_ticks):
        for i, f in enumerate(models):
            f.update(y[i, t : t + 1])
            f.predict_quantiles(H, QS)
    tick = (time.perf_counter() - t0) / n_ticks
    print(
        f"per-model: {1000 * tick / y.shape[0]:.4f} ms per series per tick  "
        f"({1000 * tick:.0f} ms per tick over {n_ticks} ticks; warm start {warm:.1f} s)"
    )


if __name__ == "__main__":
    main()
