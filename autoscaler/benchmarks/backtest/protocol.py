"""Rolling-origin backtest implementing ``reference/forecast_protocol.md`` exactly.

* series: per-step request counts ``y`` (rates x step), all series of a set scored together;
* h = 10 steps for minute series, 3 for 10-minute series; season m = one day in steps when the
  series spans >= 3 days;
* origins t = ceil(n/2), ceil(n/2)+s, ... <= n-h with s = ceil((n-h-ceil(n/2)+1)/2000);
* at origin t a forecaster sees y[0:t] and gives quantiles (0.5, 0.9, 0.99) of y[t..t+h-1];
* pooled over series, origins and steps: wQL(q) = 2 sum pinball_q / sum |y|, coverage(q) =
  fraction of targets y <= yhat_q; ms per (series, origin) forecast on one core.

Baselines naive and snaive follow the protocol's empirical-residual definitions (vectorised over
series: all series of a set share the clock); ets / mstl need statsforecast (benchmark-only extra,
:mod:`autoscaler.benchmarks.backtest.sfbaselines`); hgb is :func:`_run_hgb` (the global GBM of
:mod:`forecasting.gbm`); slotwise is the controller's forecaster exactly as it ships: the batch
:meth:`autoscaler.estimation.forecast.FleetForecaster.new_batch` builds (a ``FleetForecaster`` with the
set's step and horizon, every other setting at the controller's default; req/s in and out, as the
controller feeds it), warm-started on y[0:ceil(n/2)] and updated online with every new point. There is
no backtest-only configuration.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from autoscaler.benchmarks.backtest.empirical import naive_quantiles, snaive_quantiles
from autoscaler.benchmarks.backtest.setup import Setup, protocol_setup
from autoscaler.benchmarks.backtest.sfbaselines import run_ets, run_mstl
from autoscaler.estimation.forecast import FleetForecaster
from forecasting.calibration import pinball
from forecasting.gbm import GlobalQuantileGBM
from forecasting.slotwise import SlotwiseBatch

QUANTILES = (0.5, 0.9, 0.99)
BASELINES = ("naive", "snaive", "ets")


# ---------------------------------------------------------------- scoring


@dataclass
class Score:
    quantiles: tuple[float, ...]
    pin: np.ndarray = field(init=False)
    hits: np.ndarray = field(init=False)
    abs_y: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        self.pin = np.zeros(len(self.quantiles))
        self.hits = np.zeros(len(self.quantiles))

    def add(self, y: np.ndarray, pred: np.ndarray) -> None:
        """y (M, h) targets, pred (M, Q, h); NaN targets are skipped."""
        ok = np.isfinite(y)
        yy = np.where(ok, y, 0.0)[:, None, :]
        q = np.asarray(self.quantiles)[None, :, None]
        w = ok[:, None, :]
        self.pin += (pinball(yy, pred, q) * w).sum(axis=(0, 2))
        self.hits += ((yy <= pred) & w).sum(axis=(0, 2))
        self.abs_y += float(np.abs(yy[:, 0, :])[ok].sum())
        self.count += int(ok.sum())

    def result(self) -> dict[str, dict[str, float]]:
        denom = self.abs_y if self.abs_y > 0 else float("nan")
        return {
            "wql": {f"{q:g}": float(2 * p / denom) for q, p in zip(self.quantiles, self.pin, strict=True)},
            "coverage": {
                f"{q:g}": float(c / max(self.count, 1)) for q, c in zip(self.quantiles, self.hits, strict=True)
            },
        }


# ---------------------------------------------------------------- runners

Runner = Callable[[np.ndarray, Setup, np.ndarray], tuple[np.ndarray, dict[str, object]]]


def run_naive(y: np.ndarray, setup: Setup, qs: np.ndarray) -> tuple[np.ndarray, dict[str, object]]:
    return np.stack([naive_quantiles(y, int(t), setup.h, qs, setup.window) for t in setup.origins]), {}


def run_snaive(y: np.ndarray, setup: Setup, qs: np.ndarray) -> tuple[np.ndarray, dict[str, object]]:
    out = [snaive_quantiles(y, int(t), setup.h, qs, setup.window, setup.season) for t in setup.origins]
    return np.stack(out), {}


def shipped_fleet(setup: Setup) -> FleetForecaster:
    """The controller's forecast stage for a set's step and horizon (every other setting its default)."""
    return FleetForecaster(step_s=setup.step_s, horizon_s=setup.h * setup.step_s)


def slotwise_batch(n_series: int, setup: Setup) -> SlotwiseBatch:
    """The slotwise forecaster exactly as the controller builds it (req/s in and out)."""
    return shipped_fleet(setup).new_batch(n_series)


def run_slotwise(y: np.ndarray, setup: Setup, qs: np.ndarray) -> tuple[np.ndarray, dict[str, object]]:
    model = slotwise_batch(y.shape[0], setup)
    missing = [q for q in qs if not np.isclose(model.levels, q).any()]
    if missing:  # (the protocol's levels are tracked ones: no interpolation between levels is scored)
        raise ValueError(f"quantiles {missing} are not among the controller's tracked levels {model.levels}")
    rate = y / setup.step_s  # the controller forecasts req/s
    model.warm_start(rate[:, : setup.first])  # the history seen at the first origin
    out = []
    origins = setup.origins
    for i, t in enumerate(origins):
        out.append(model.predict_quantiles(setup.h, qs) * setup.step_s)
        nxt = int(origins[i + 1]) if i + 1 < len(origins) else int(t)
        if nxt > t:
            model.update(rate[:, int(t) : nxt])
    names = model.member_names
    sel = model.selected()
    usage = {names[j]: float((sel == j).mean()) for j in range(len(names))}
    info: dict[str, object] = {"members_in_use_at_end": {k: round(v, 3) for k, v in usage.items() if v > 0}}
    return np.stack(out), info


def _run_hgb(y: np.ndarray, setup: Setup, qs: np.ndarray) -> tuple[np.ndarray, dict[str, object]]:
    """Protocol hgb: trained on the first half of every series, then predicts every origin."""
    day = setup.season or round(86400.0 / setup.step_s)
    model = GlobalQuantileGBM(
        setup.h, tuple(qs), lags=setup.lags, season=day, step_s=setup.step_s, start_tod_s=setup.start_tod_s
    )
    t0 = time.perf_counter()
    model.fit(y[:, : setup.first])
    train = time.perf_counter() - t0
    return model.predict(y, setup.origins), {"train_s": train}


RUNNERS: dict[str, Runner] = {
    "naive": run_naive,
    "snaive": run_snaive,
    "ets": run_ets,
    "mstl": run_mstl,
    "hgb": _run_hgb,
    "slotwise": run_slotwise,
}
DEFAULT_FORECASTERS = ("naive", "snaive", "ets", "mstl", "hgb", "slotwise")


def have_statsforecast() -> bool:
    try:
        import statsforecast  # noqa: F401
    except ImportError:
        return False
    return True


def backtest(
    y: np.ndarray,
    step_s: float,
    forecasters: tuple[str, ...] = DEFAULT_FORECASTERS,
    start_tod_s: float = 0.0,
    quantiles: tuple[float, ...] = QUANTILES,
    log: Callable[[str], None] | None = None,
) -> dict[str, object]:
    """Run the protocol on counts ``y`` (M, n). Returns a JSON-ready dict."""
    y = np.asarray(y, dtype=float)
    setup = protocol_setup(y.shape[1], step_s, start_tod_s)
    qs = np.asarray(quantiles, dtype=float)
    names = list(dict.fromkeys([*BASELINES, *forecasters]))  # baselines in every run, in order
    result: dict[str, object] = {
        "series": int(y.shape[0]),
        "steps": setup.n,
        "step_s": setup.step_s,
        "h": setup.h,
        "season": setup.season,
        "window": setup.window,
        "origins_per_series": len(setup.origins),
        "origin_stride": int(setup.origins[1] - setup.origins[0]) if len(setup.origins) > 1 else 1,
        "first_origin": setup.first,
        "quantiles": list(quantiles),
        "forecasters": {},
    }
    table: dict[str, object] = {}
    targets = np.stack([y[:, int(t) : int(t) + setup.h] for t in setup.origins])  # (O, M, h)
    for name in names:
        if name not in RUNNERS:
            raise ValueError(f"unknown forecaster {name!r} (known: {', '.join(RUNNERS)})")
        if name in ("ets", "mstl") and not have_statsforecast():
            table[name] = {"skipped": "statsforecast is not installed (pip install statsforecast)"}
            continue
        if name == "mstl" and setup.season is None:
            table[name] = {"skipped": "no season (series spans < 3 days)"}
            continue
        if log:
            log(f"{name} ...")
        t0 = time.perf_counter()
        pred, info = _single_core(RUNNERS[name], y, setup, qs)
        wall = time.perf_counter() - t0
        train = float(info.pop("train_s", 0.0))  # type: ignore[arg-type]
        score = Score(tuple(quantiles))
        for o in range(len(setup.origins)):
            score.add(targets[o], pred[o])
        n_fc = y.shape[0] * len(setup.origins)
        entry: dict[str, object] = {
            **score.result(),
            "ms_per_forecast": 1000.0 * (wall - train) / n_fc,
            "wall_s": wall,
        }
        if train:
            entry["train_s"] = train
        entry.update(info)
        table[name] = entry
        if log:
            r = score.result()
            log(f"  {name}: wQL {r['wql']}  cov {r['coverage']}  {entry['ms_per_forecast']:.3f} ms/forecast")
    result["forecasters"] = table
    result["best_baseline"] = _best_baselines(table)
    return result


def _single_core(run: Runner, y: np.ndarray, setup: Setup, qs: np.ndarray) -> tuple[np.ndarray, dict[str, object]]:
    """The protocol times one core: pin BLAS / OpenMP pools (HistGradientBoosting) to one thread."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # pragma: no cover - threadpoolctl ships with scikit-learn
        return run(y, setup, qs)
    with threadpool_limits(limits=1):
        return run(y, setup, qs)


def _best_baselines(table: dict[str, object]) -> dict[str, object]:
    """Best of {naive, snaive, ets, mstl, hgb} per metric (the issue's comparison set), and slotwise's ratio."""
    ref = [k for k in ("naive", "snaive", "ets", "mstl", "hgb") if isinstance(table.get(k), dict) and "wql" in table[k]]
    out: dict[str, object] = {}
    for q in ("0.5", "0.9", "0.99"):
        vals = {k: table[k]["wql"][q] for k in ref}  # type: ignore[index]
        if not vals:
            continue
        best = min(vals, key=lambda k: vals[k])
        entry: dict[str, object] = {"forecaster": best, "wql": vals[best]}
        sw = table.get("slotwise")
        if isinstance(sw, dict) and "wql" in sw:
            entry["slotwise_ratio"] = sw["wql"][q] / vals[best] if vals[best] else float("nan")
        out[q] = entry
    return out


# ---------------------------------------------------------------- loading


def load_counts(path: str | Path, fmt: str | None = None, step_s: float = 60.0) -> tuple[np.ndarray, float, float]:
    """Any trace the readers accept -> (counts per step (M, n), step_s, time of day of step 0 in s).

    Rate series are converted to counts (rate x step: ServeGen rate x 600 s); request logs are binned
    at ``step_s`` first.
    """
    from forecasting.traces import RateSeries, RequestLog, resolve_trace, to_rate_series

    trace = resolve_trace(path, fmt)
    if isinstance(trace, RequestLog):
        trace = to_rate_series(trace, step_s)
    assert isinstance(trace, RateSeries)
    start = float(trace.start_s)
    first_minute = trace.meta.get("first_minute") if trace.meta else None
    if start == 0.0 and isinstance(first_minute, (int, float)):
        start = 60.0 * float(first_minute)  # Azure Functions: columns are minutes of the day
    return trace.rates * trace.step_s, float(trace.step_s), start % 86400.0
