"""Each engine's preset against a REAL Prometheus scraping stand-in servers that export that engine's names.

Prometheus scrapes ``tests/realparts/modelserver.py`` processes every second: for vLLM, SGLang and TGI one
model that keeps up and one driven past its capacity, whose queue grows and whose KV cache fills. That is a real
Prometheus over the names and label shapes each engine documents (docs/metrics.md); the engines themselves need a
GPU. For every preset the window's rate, in-flight, latency, ITL and KV-cache use are read from it, and the rails
act on what was read: the saturated vLLM and SGLang models are not scaled down, and they get one replica more
while their queue grows. TGI exports no KV gauge, so the same recommendation scales its model down.
"""

from __future__ import annotations

import math
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import numpy as np
import pytest

from autoscaler.api.plan import Reason
from autoscaler.api.snapshot import ModelMetrics
from autoscaler.api.spec import ModelSpec
from autoscaler.decision.scaledown import normalize
from autoscaler.estimation.capacity import profile_from_spec
from autoscaler.live.prometheus.metrics import MetricNames, PrometheusMetrics
from autoscaler.policies.base import PolicyContext, PolicyResult

pytest_plugins = ("realparts.prometheus",)

MODELSERVER = Path(__file__).resolve().parents[1] / "realparts" / "modelserver.py"
STEP = 2.0
ENGINES = ("vllm", "sglang", "tgi")
# name: (rps, service ms, concurrency). busy: 2 slots of 300 ms serve ~6.7 req/s of the 20 sent.
LOADS = {"light": (5.0, 200.0, 8), "busy": (20.0, 300.0, 2)}


def key(engine: str, load: str) -> str:
    return f"team-{engine}/{engine}-{load}"


@pytest.fixture(scope="module")
def servers(prometheus_factory, tmp_path_factory):
    from realparts.prometheus import free_port

    work = tmp_path_factory.mktemp("engines")
    procs: list[subprocess.Popen] = []
    targets = []
    try:
        for seed, (engine, (load, (rps, service_ms, conc))) in enumerate(
                (e, item) for e in ENGINES for item in LOADS.items()):
            ns, name = key(engine, load).split("/")
            port = free_port()
            replicas = work / f"{name}.replicas"
            replicas.write_text("1")
            p = subprocess.Popen(
                [sys.executable, str(MODELSERVER), "--port", str(port), "--model", name, "--engine", engine,
                 "--rps", str(rps), "--service-ms", str(service_ms), "--concurrency", str(conc),
                 "--replicas-file", str(replicas), "--seed", str(seed + 1), "--tick-ms", "20"],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            )
            procs.append(p)
            assert p.stdout is not None
            line = p.stdout.readline()
            assert line.startswith("listening"), line
            # TGI's series name no model: the Service does (the label a ServiceMonitor adds)
            labels = {"namespace": ns, "service": name} if engine == "tgi" else {"namespace": ns}
            targets.append((f"127.0.0.1:{port}", labels))
        prom = prometheus_factory(scrape_targets=targets, scrape_interval_s=1.0)
        from realparts.prometheus import wait_scraped  # after pytest loaded the plugin (assert rewriting)

        wait_scraped(prom.url, len(targets))
        time.sleep(15.0)  # a full window (12 s), the step before it and a scrape
        yield prom
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
                p.wait(timeout=10)



async def _instant(url: str, names: MetricNames, promql: str, at: float) -> dict[str, float]:
    async with aiohttp.ClientSession() as s, s.post(f"{url}/api/v1/query", data={"query": promql, "time": at}) as r:
        body = await r.json()
    assert body["status"] == "success", body
    return {names.key(x["metric"]): float(x["value"][1]) for x in body["data"]["result"]}


def _quantile(names: MetricNames, hist: str, q: float) -> str:
    """Prometheus' own answer for the last step: histogram_quantile of the buckets' increase over it."""
    b = f"{{__name__=\"{hist}_bucket\"}}"
    by = ", ".join((*names.key_labels, "le"))
    return f"histogram_quantile({q}, sum by ({by}) ({b} - {b} offset {int(STEP)}s))"


class WantsOne:
    """A policy that recommends ``wants`` replicas whatever it sees."""

    behavior = None
    name, tick_s, instant_start, uses_forecast, learns = "scripted", 6.0, False, False, False

    def __init__(self, wants: int) -> None:
        self.wants = wants

    def initial_state(self, spec: ModelSpec, replicas: int) -> None:
        return None

    def decide(self, ctx: PolicyContext) -> PolicyResult:
        return PolicyResult(self.wants, None, Reason.REACTIVE, "scripted")


def _ctx(spec: ModelSpec, m: ModelMetrics, current: int) -> PolicyContext:
    return PolicyContext(now=1000.0, spec=spec, current_replicas=current, ready_replicas=current, metrics=m,
                         metrics_step_s=STEP, forecast=None, capacity=profile_from_spec(spec), state=None)


@pytest.mark.asyncio
@pytest.mark.parametrize("engine", ENGINES)
async def test_each_preset_reads_its_engine_from_a_real_prometheus(servers, engine: str) -> None:
    names = MetricNames.preset(engine)
    specs = {key(engine, load): ModelSpec(f"{engine}-{load}", f"team-{engine}", slo_latency_ms=1000,
                                          slo_percentile=90) for load in LOADS}
    now = time.time()
    async with PrometheusMetrics(servers.url, names, step_s=STEP, window_s=12.0, stale_after_s=5.0) as pm:
        w = await pm.window(now, specs)
        assert pm.last_error is None, pm.last_error
    t = pm.grid(now)
    light, busy = w.models[key(engine, "light")], w.models[key(engine, "busy")]
    for m in (light, busy):
        assert not m.stale and m.partial is None and m.rate.shape == t.shape and np.isfinite(m.rate).all()

    # rate: the per-step counts add up exactly to the counter's growth, and follow the load
    total = f"sum by ({', '.join(names.key_labels)}) ({{__name__=\"{names.requests}\"}})"
    at_end = await _instant(servers.url, names, total, t[-1])
    before = await _instant(servers.url, names, total, t[0] - STEP)
    for k in specs:
        assert float(w.models[k].rate.sum() * STEP) == pytest.approx(at_end[k] - before[k], abs=1e-6)
    assert light.rate.mean() == pytest.approx(5.0, rel=0.4)
    assert busy.rate.mean() == pytest.approx(2 / 0.3, rel=0.3)  # what 2 slots of 300 ms serve

    # in flight and the queue: the light model keeps up, the busy one's queue grows (~13 req/s more than served)
    assert light.queue_depth < 5 and busy.queue_depth > 20
    assert busy.in_flight[-1] > busy.in_flight[0] > light.in_flight.mean()

    # latency and ITL at the SLO percentile: what Prometheus' histogram_quantile says of the same last step
    assert names.e2e_histogram is not None and names.itl_histogram is not None
    for field, hist in (("latency_s", names.e2e_histogram), ("itl_s", names.itl_histogram)):
        want = await _instant(servers.url, names, _quantile(names, hist, 0.9), t[-1])
        for k in specs:
            assert getattr(w.models[k], field) == pytest.approx(want[k], rel=1e-9), (k, field)
    assert light.latency_s < 1.0 < busy.latency_s  # the busy model's requests queue for seconds
    assert 0 < light.itl_s < 0.05  # ~180 ms of decode over 16 tokens

    # KV-cache use: a full batch fills the stand-in's cache; TGI exports none (NaN, not 0)
    if engine == "tgi":
        assert math.isnan(light.kv_cache_usage) and math.isnan(busy.kv_cache_usage)
    else:
        assert busy.kv_cache_usage >= 0.9 and light.kv_cache_usage < 0.9

    # the rails on what was read: a policy asking for one replica of three
    spec = specs[key(engine, "busy")]
    down = normalize(WantsOne(1), _ctx(spec, busy, current=3))
    up = normalize(WantsOne(3), _ctx(spec, busy, current=3))
    if engine == "tgi":
        assert (down.desired, up.desired) == (1, 3)  # no KV signal: the policy's word
    else:
        assert (down.desired, down.reason) == (3, Reason.KV_SATURATED)
        assert (up.desired, up.reason) == (4, Reason.KV_SATURATED)  # saturated and queueing: one more
    light_spec = specs[key(engine, "light")]
    assert normalize(WantsOne(1), _ctx(light_spec, light, current=3)).desired == 1  # not saturated: down
