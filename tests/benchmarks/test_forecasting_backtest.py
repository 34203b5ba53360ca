"""The backtest protocol (reference/forecast_protocol.md): origins, h, season, baselines, pooled
metrics on a hand-computed example, and the ``slotwise backtest`` command."""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
from pathlib import Path

import numpy as np
import pytest

from autoscaler.benchmarks.backtest.empirical import naive_quantiles, snaive_quantiles
from autoscaler.benchmarks.backtest.protocol import Score, backtest, load_counts
from autoscaler.benchmarks.backtest.setup import protocol_setup
from forecasting.gbm import GlobalQuantileGBM
from forecasting.traces import RateSeries, write_rates

HAS_SF = importlib.util.find_spec("statsforecast") is not None


def test_minute_setup() -> None:
    s = protocol_setup(480, 60.0)
    assert s.h == 10 and s.season is None and s.window == 1440 and s.refit == 60 and s.lags == 60
    assert s.origins[0] == 240 and s.origins[-1] == 470 and len(s.origins) == 231
    assert np.all(np.diff(s.origins) == 1)


def test_ten_minute_setup() -> None:
    s = protocol_setup(2016, 600.0)
    assert s.h == 3 and s.season == 144 and s.window == 1008 and s.refit == 144 and s.lags == 36
    assert s.origins[0] == 1008 and s.origins[-1] == 2013


def test_long_series_stride_caps_origins() -> None:
    n = 20000
    s = protocol_setup(n, 60.0)
    stride = math.ceil((n - 10 - 10000 + 1) / 2000)
    assert s.origins[1] - s.origins[0] == stride == 5
    assert len(s.origins) <= 2000 and s.origins[-1] <= n - 10
    assert s.season is not None  # 20000 minutes > 3 days


def test_pooled_wql_and_coverage_hand_computed() -> None:
    # Two series, h = 2, quantiles 0.5 / 0.9.
    y = np.array([[10.0, 0.0], [4.0, 6.0]])
    pred = np.array([[[8.0, 1.0], [12.0, 2.0]], [[4.0, 7.0], [5.0, 9.0]]])
    s = Score((0.5, 0.9))
    s.add(y, pred)
    # q=0.5: |10-8|/2 + |0-1|/2 + 0 + |6-7|/2 = 2.0 ; q=0.9: 0.1*2 + 0.1*2 + 0.1*1 + 0.1*3 = 0.8
    # sum|y| = 20 -> wQL = 2*pin/20.
    r = s.result()
    assert r["wql"]["0.5"] == pytest.approx(2 * 2.0 / 20)
    assert r["wql"]["0.9"] == pytest.approx(2 * 0.8 / 20)
    assert r["coverage"]["0.5"] == pytest.approx(3 / 4)  # 10 > 8 misses; 0<=1, 4<=4, 6<=7
    assert r["coverage"]["0.9"] == pytest.approx(1.0)


def test_score_skips_nan_targets() -> None:
    s = Score((0.5,))
    s.add(np.array([[np.nan, 2.0]]), np.array([[[5.0, 2.0]]]))
    assert s.count == 1 and s.result()["wql"]["0.5"] == 0.0


def test_naive_baseline_by_hand() -> None:
    y = np.array([[1.0, 3.0, 2.0, 6.0]])
    q = naive_quantiles(y, 4, 2, np.array([0.5]), window=1440)
    # 1-step changes 2, -1, 4 -> median 2; 2-step changes 1, 3 -> median 2; point 6.
    np.testing.assert_allclose(q[0, 0], [8.0, 8.0])
    # window 3: only y[1:4] -> 1-step changes -1, 4 -> median 1.5
    assert naive_quantiles(y, 4, 1, np.array([0.5]), window=3)[0, 0, 0] == pytest.approx(7.5)


def test_snaive_baseline_by_hand() -> None:
    y = np.array([[1.0, 2.0, 3.0, 2.0, 4.0, 5.0]])  # season 3: residuals y[j]-y[j-3] = 1, 2, 2
    q = snaive_quantiles(y, 6, 2, np.array([0.5, 0.9]), window=100, season=3)
    np.testing.assert_allclose(q[0, 0], [2.0 + 2, 4.0 + 2])
    # no season -> naive
    np.testing.assert_allclose(
        snaive_quantiles(y, 6, 2, np.array([0.5]), 100, None), naive_quantiles(y, 6, 2, np.array([0.5]), 100)
    )


def test_baselines_clip_and_sort() -> None:
    y = np.array([[5.0, 0.0, 5.0, 0.0, 5.0, 0.0, 0.0]])
    q = naive_quantiles(y, 7, 3, np.array([0.5, 0.9, 0.99]), 100)
    assert np.all(q >= 0) and np.all(np.diff(q, axis=1) >= 0)


def test_global_gbm_shapes() -> None:
    rng = np.random.default_rng(0)
    y = rng.poisson(20, (4, 300)).astype(float)
    m = GlobalQuantileGBM(h=3, lags=12, season=48, step_s=1800.0, max_iter=15).fit(y[:, :200])
    q = m.predict(y, np.array([200, 250]))
    assert q.shape == (2, 4, 3, 3)
    assert np.all(q >= 0) and np.all(np.diff(q, axis=2) >= 0)
    assert 10 < np.median(q[:, :, 0]) < 30


def _tiny(n_series: int = 3, n: int = 120, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    lam = np.array([5.0, 50.0, 0.2])[:n_series, None] * np.ones(n)
    return rng.poisson(lam).astype(float)


def test_backtest_result_layout() -> None:
    y = _tiny()
    r = backtest(y, 60.0, ("naive", "snaive", "slotwise"))
    assert r["h"] == 10 and r["origins_per_series"] == 51 and r["first_origin"] == 60
    fc = r["forecasters"]
    assert list(fc)[:3] == ["naive", "snaive", "ets"]  # the baselines are in every run
    for name in ("naive", "snaive", "slotwise"):
        assert set(fc[name]["wql"]) == {"0.5", "0.9", "0.99"}
        assert fc[name]["ms_per_forecast"] > 0
        assert 0.0 <= fc[name]["coverage"]["0.9"] <= 1.0
    if not HAS_SF:
        assert "skipped" in fc["ets"]
    # Without a season snaive is naive.
    assert fc["snaive"]["wql"] == fc["naive"]["wql"]


@pytest.mark.skipif(not HAS_SF, reason="statsforecast (benchmark-only extra) not installed")
def test_ets_baseline_runs() -> None:
    r = backtest(_tiny(2, 100), 60.0, ("naive",))
    ets = r["forecasters"]["ets"]
    assert "wql" in ets and ets["wql"]["0.5"] > 0


def test_backtest_command(tmp_path: Path) -> None:
    from autoscaler.cli import backtest as cmd

    y = _tiny()
    series = RateSeries(rates=y / 60.0, models=("a", "b", "c"), step_s=60.0)
    csv = write_rates(series, tmp_path / "rates.csv")
    counts, step, _ = load_counts(csv)
    np.testing.assert_allclose(counts, y)  # rate x step = counts
    assert step == 60.0

    parser = argparse.ArgumentParser()
    cmd.register(parser.add_subparsers(dest="command"))
    out = tmp_path / "bt.json"
    args = parser.parse_args(
        ["backtest", "--series", str(csv), "--json", str(out), "--forecasters", "slotwise", "--quiet"]
    )
    assert args.func(args) == 0
    data = json.loads(out.read_text())
    assert {"naive", "snaive", "ets", "slotwise"} <= set(data["forecasters"])
    bad = parser.parse_args(["backtest", "--series", str(csv), "--json", str(out), "--forecasters", "nope"])
    assert bad.func(bad) == 2
