"""The warm start's request-rate history against a REAL Prometheus (Debian's binary), backfilled with promtool.

Backfilled: four hours of ``slotwise_requests_total{model=...}`` every 15 s, ending at the last whole minute:
``a`` at 4 req/s, ``b`` at 2 req/s with a 20-minute hole (no samples), ``c`` at 1 req/s then 3 req/s for the
last 90 minutes; and ``r``, two pods scraped every 5 s (2 and 5 req/s), the second restarting (its counter
reset) five minutes before the end. The history reads request rate exactly as the live metrics window does
(reset-safe per-step counter differences), so the numbers are exact, and the two agree to the last bit.
"""

from __future__ import annotations

import dataclasses
import math
import time

import numpy as np
import pytest
import pytest_asyncio

from autoscaler.api.spec import ModelSpec
from autoscaler.estimation.forecast import FleetForecaster
from autoscaler.live.prometheus import promql
from autoscaler.live.prometheus.client import MAX_POINTS, PrometheusClient, PrometheusError
from autoscaler.live.prometheus.history import grid, load_history, warm_start_from_prometheus
from autoscaler.live.prometheus.metrics import MetricNames, PrometheusMetrics

# the real-Prometheus fixture; its helpers are imported inside functions, after pytest has loaded the plugin
# (a top-level import would come first and keep pytest from assert-rewriting the plugin module)
pytest_plugins = ("realparts.prometheus",)

NAMES = MetricNames(requests="slotwise_requests_total", key_labels=("model",))
SCRAPE_S = 15
HOURS = 4
END = math.floor(time.time() / 60) * 60  # the newest backfilled sample
START = END - HOURS * 3600
GAP = (END - 2 * 3600, END - 2 * 3600 + 20 * 60)  # b has no samples strictly inside
CHANGE = END - 90 * 60  # c's rate changes from 1 to 3 here
LOOKBACK = 300  # Prometheus' default: an instant value is the newest sample at most 5 min old
R_SCRAPE_S = 5
R_PODS = {"p1": 2.0, "p2": 5.0}
RESET = END - 302.5  # p2 restarts here, between two of its scrapes


def _rate(model: str, t: float) -> float:
    if model == "a":
        return 4.0
    if model == "b":
        return 2.0
    return 1.0 if t <= CHANGE else 3.0


def _history() -> dict[str, list[tuple[float, float]]]:
    series: dict[str, list[tuple[float, float]]] = {}
    for model in ("a", "b", "c"):
        value = 1000.0
        samples = []
        for t in range(START, END + 1, SCRAPE_S):
            if t > START:
                value += _rate(model, t) * SCRAPE_S
            if model == "b" and GAP[0] < t < GAP[1]:
                continue
            samples.append((float(t), value))
        series[model] = samples
    return series


def _r(pod: str, t: float) -> float:
    if pod == "p2" and t >= RESET:
        return R_PODS[pod] * (t - RESET)  # the count since the restart
    return 10_000.0 + R_PODS[pod] * (t - START)


def _openmetrics() -> str:
    lines = ["# HELP slotwise_requests x", "# TYPE slotwise_requests counter"]
    for model, samples in _history().items():
        lines += [f'slotwise_requests_total{{model="{model}"}} {v!r} {t!r}' for t, v in samples]
    for pod in R_PODS:
        lines += [f'slotwise_requests_total{{model="r",instance="{pod}"}} {_r(pod, t)!r} {t}'
                  for t in range(START, END + 1, R_SCRAPE_S)]
    return "\n".join([*lines, "# EOF"]) + "\n"


@pytest.fixture(scope="module")
def prom(prometheus_factory):
    return prometheus_factory(_openmetrics())


@pytest_asyncio.fixture
async def client(prom):
    async with PrometheusClient(prom.url) as c:
        yield c


def _counter(model: str, t: float) -> float:
    """The backfilled counter's value as Prometheus reads it at ``t`` (the newest sample at or before t)."""
    return max((v for ts, v in _history()[model] if ts <= t), default=math.nan)


@pytest.mark.asyncio
async def test_rates_match_the_backfill(client) -> None:
    start = START + 3600
    hist = await load_history(client, NAMES, start, END, 60.0)
    t = grid(start, END, 60.0)
    assert set(hist) == {"a", "b", "c", "r"}
    assert all(v.shape == t.shape for v in hist.values())
    np.testing.assert_allclose(hist["a"], 4.0, rtol=1e-12)
    before, after = t <= CHANGE, t >= CHANGE + 60
    np.testing.assert_allclose(hist["c"][before], 1.0, rtol=1e-12)
    np.testing.assert_allclose(hist["c"][after], 3.0, rtol=1e-12)
    outside = (t <= GAP[0]) | (t >= GAP[1] + 60)
    np.testing.assert_allclose(hist["b"][outside], 2.0, rtol=1e-12)
    # the per-step counts add up EXACTLY to the counter's growth over the range (nothing extrapolated)
    assert float(hist["a"].sum() * 60.0) == pytest.approx(_counter("a", END) - _counter("a", start - 60), rel=1e-12)


@pytest.mark.asyncio
async def test_a_gap_reads_as_the_live_window_reads_it(client) -> None:
    start = START + 3600
    hist = await load_history(client, NAMES, start, END, 60.0)
    t = grid(start, END, 60.0)
    b = hist["b"]
    # within Prometheus' lookback the counter still reads its last value: steps of 0, never interpolated
    held = (t > GAP[0]) & (t < GAP[0] + LOOKBACK)
    assert held.sum() == 4 and (b[held] == 0).all()
    # beyond it the counter has no value: NaN, up to the step after the samples resume (its start has none)
    gone = (t > GAP[0] + LOOKBACK) & (t <= GAP[1])
    assert gone.sum() == 15 and np.isnan(b[gone]).all()
    assert b[t == GAP[1] + 60] == pytest.approx(2.0, rel=1e-12)
    assert np.isnan(b).sum() == gone.sum() + int(np.isnan(b[t == GAP[0] + LOOKBACK]).sum())


@pytest.mark.asyncio
async def test_chunks_concatenate_to_the_single_query(client) -> None:
    start = START + 3600
    whole = await load_history(client, NAMES, start, END, 60.0)
    for max_points in (1, 7, 50):
        chunked = await load_history(client, NAMES, start, END, 60.0, max_points=max_points)
        assert set(chunked) == set(whole)
        for name in whole:
            np.testing.assert_array_equal(chunked[name], whole[name])
    # the grid's first point is start, its last end when on the grid; a step under the scrape interval
    # reads 0 where no scrape fell inside it and the catch-up where one did, as the live window does
    h = await load_history(client, NAMES, start + 0.25, END, 7.5, max_points=100)
    t = grid(start + 0.25, END, 7.5)
    assert h["a"].size == t.size
    assert set(np.unique(h["a"]).tolist()) == {0.0, 4.0 * SCRAPE_S / 7.5}
    fine = await load_history(client, NAMES, END - 300, END, 0.5, max_points=100)
    assert fine["a"].size == 601
    assert float(fine["a"].sum() * 0.5) == pytest.approx(_counter("a", END) - _counter("a", END - 300.5), rel=1e-12)


@pytest.mark.asyncio
async def test_ranges_beyond_prometheus_point_limit_are_split(client) -> None:
    start = END - 12_000  # 12,001 points at a 1 s step: one query is refused by Prometheus itself
    query = promql.step_increments(NAMES.requests, NAMES.key_labels, 1.0)
    with pytest.raises(PrometheusError, match="11,000"):
        await client.query_range(query, start, END, 1.0, max_points=20_000)
    hist = await load_history(client, NAMES, start, END, 1.0)
    assert hist["a"].size == 12_001 > MAX_POINTS
    assert float(hist["a"].sum()) == pytest.approx(_counter("a", END) - _counter("a", start - 1), rel=1e-12)


@pytest.mark.asyncio
async def test_models_argument(client) -> None:
    start = END - 1800
    only = await load_history(client, NAMES, start, END, 60.0, models=["a", "nope"])
    assert list(only) == ["a", "nope"]  # exactly the models asked for, in order; others dropped
    assert np.isnan(only["nope"]).all() and only["nope"].shape == only["a"].shape
    assert np.isfinite(only["a"]).all()
    everything = await load_history(client, NAMES, start, END, 60.0)
    assert "nope" not in everything  # without `models`, absent models are simply absent
    # the configured matchers go on the selector, as in the live window
    assert await load_history(client, dataclasses.replace(NAMES, matchers='model="zz"'), start, END, 60.0) == {}


@pytest.mark.asyncio
async def test_history_before_the_data_is_nan(client) -> None:
    hist = await load_history(client, NAMES, START - 3600, START + 600, 60.0)
    t = grid(START - 3600, START + 600, 60.0)
    assert np.isnan(hist["a"][t <= START]).all()  # the first sample's step has no start value
    np.testing.assert_allclose(hist["a"][t >= START + 60], 4.0, rtol=1e-12)


@pytest.mark.asyncio
async def test_a_refused_query_raises_a_clear_error(client, prom) -> None:
    bad = dataclasses.replace(NAMES, matchers='job=~"("')
    with pytest.raises(PrometheusError) as err:
        await load_history(client, bad, END - 600, END, 60.0)
    msg = str(err.value)
    assert prom.url in msg and "HTTP 400" in msg and "parse error" in msg and 'job=~"("' in msg
    assert err.value.url == prom.url and err.value.query is not None and "slotwise_requests_total" in err.value.query


@pytest.mark.asyncio
@pytest.mark.parametrize("series", [["not a mapping"], [{"metric": {"model": "m"}, "values": [["x"]]}]])
async def test_a_malformed_answer_raises_the_clients_error(series) -> None:
    """A real Prometheus never answers like this, so the client's transport is replaced (the one stub here): a
    malformed series must surface as PrometheusError -- the error ``slotwise run`` logs before starting cold --
    not as an AttributeError that would abort the controller at startup."""

    class Garbled(PrometheusClient):
        async def query_range(self, promql: str, start: float, end: float, step_s: float, *,
                              max_points: int = MAX_POINTS) -> list:
            return series

    async with Garbled("http://127.0.0.1:1", timeout_s=1.0) as garbled:
        with pytest.raises(PrometheusError, match="malformed range-query series"):
            await load_history(garbled, NAMES, END - 600, END, 60.0)


@pytest.mark.asyncio
async def test_a_dead_url_raises_a_clear_error() -> None:
    from realparts.prometheus import free_port

    url = f"http://127.0.0.1:{free_port()}"
    async with PrometheusClient(url, timeout_s=5.0) as dead:
        with pytest.raises(PrometheusError, match="cannot reach Prometheus") as err:
            await load_history(dead, NAMES, END - 600, END, 60.0)
    assert url in str(err.value) and err.value.url == url
    assert isinstance(err.value, OSError)  # the CLI prints it as one line, exit 2


@pytest.mark.asyncio
async def test_the_warm_started_forecaster_forecasts_the_known_level(client) -> None:
    ff = FleetForecaster(step_s=60.0)
    hist = await warm_start_from_prometheus(ff, client, NAMES, now=END + 7, hours=3, step_s=15.0)
    assert set(hist) == {"a", "b", "c", "r"}
    ff.sync(["a", "b", "c"], {})
    for name, level in (("a", 4.0), ("b", 2.0), ("c", 3.0)):
        q = ff.quantiles(name, END, 60.0)
        assert q is not None
        median = float(np.interp(0.5, ff.levels, q))
        assert abs(median - level) <= 0.15 * level, (name, median)


@pytest.mark.asyncio
async def test_history_and_live_window_agree_across_a_counter_reset(prom, client) -> None:
    """One notion of load: the warm start's history and the live metrics window read the same per-step
    rates of the same counter over the same range, to the last bit -- across a pod's counter reset (its
    count since the restart, never a negative step) -- and a coarse history step is exactly the sum of the
    fine steps inside it."""
    step, points = 15.0, 40
    now = END + 4.0  # the live grid ends at END (now rounded down to the step)
    async with PrometheusMetrics(prom.url, NAMES, step_s=step, window_s=points * step, stale_after_s=60) as pm:
        window = await pm.window(now, {"r": ModelSpec("r", "ns")})
        assert pm.last_error is None, pm.last_error
    t = pm.grid(now)
    live = window.models["r"].rate
    history = (await load_history(client, NAMES, float(t[0]), float(t[-1]), step))["r"]
    np.testing.assert_array_equal(history, live)

    # what both must read: 2 + 5 req/s, except the step of p2's restart, which counts p2 since the restart
    want = np.full(points, sum(R_PODS.values()))
    first_after = t == math.ceil(RESET / step) * step
    assert first_after.sum() == 1
    want[first_after] = (R_PODS["p1"] * step + _r("p2", float(t[first_after][0]))) / step
    np.testing.assert_allclose(live, want, rtol=1e-12)
    assert (live > 0).all()

    # the warm start's minute steps: each count is the sum of the four 15 s counts inside it (telescoping),
    # but at the restart, where a coarse step loses more of what p2 counted before its crash (from the
    # step's start, not from the last 15 s point): it counts p1's minute and p2 since the restart
    minutes = (await load_history(client, NAMES, float(t[3]), float(t[-1]), 60.0))["r"]
    t60 = grid(float(t[3]), float(t[-1]), 60.0)
    fine = live * step
    coarse = np.array([fine[(t > x - 60) & (t <= x)].sum() for x in t60])
    at_reset = t60 == math.ceil(RESET / 60) * 60
    assert at_reset.sum() == 1
    np.testing.assert_allclose(minutes[~at_reset] * 60.0, coarse[~at_reset], rtol=1e-12)
    reset_minute = float(t60[at_reset][0])
    assert minutes[at_reset][0] * 60.0 == pytest.approx(R_PODS["p1"] * 60 + _r("p2", reset_minute), rel=1e-12)


@pytest.mark.asyncio
async def test_slotwise_run_warm_starts_its_forecaster_or_starts_cold(prom, caplog) -> None:
    """``slotwise run``'s warm start (the CLI glue): the model servers' counter read through the client,
    into a fresh forecaster the controller then uses; an unreachable Prometheus leaves it cold, logged."""
    from types import SimpleNamespace

    from realparts.prometheus import free_port

    from autoscaler.cli.run import warm_start
    from autoscaler.live.prometheus.client import PrometheusAuth

    def controller(url: str) -> SimpleNamespace:
        settings = SimpleNamespace(prometheus_url=url, history_hours=2.0, metric_names=NAMES,
                                   prometheus_auth=PrometheusAuth())
        return SimpleNamespace(settings=settings, core=SimpleNamespace(forecaster_factory=FleetForecaster),
                               clock=lambda: END + 7.0, state=SimpleNamespace(forecaster=None, idle_history={}))

    warm = controller(prom.url)
    await warm_start(warm)  # type: ignore[arg-type]
    ff = warm.state.forecaster
    assert isinstance(ff, FleetForecaster)
    ff.sync(["a"], {})
    q = ff.quantiles("a", END, 60.0)
    assert q is not None and abs(float(np.interp(0.5, ff.levels, q)) - 4.0) <= 0.6
    # the same history warm-starts the idle times (scale to zero): "a" served all along, so it is not idle
    idle = warm.state.idle_history["a"]
    assert idle.first_t is not None and idle.age(END) == 0.0

    cold = controller(f"http://127.0.0.1:{free_port()}")
    await warm_start(cold)  # type: ignore[arg-type]
    assert cold.state.forecaster is None and cold.state.idle_history == {}
    assert "forecaster starts cold: cannot reach Prometheus" in caplog.text
