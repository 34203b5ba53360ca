"""Missing or partial metrics never read as low load (issue 16, failure mode 4), against a REAL Prometheus.

- live: one model served by two model-server processes (two scrape targets), scraped every second. One of them
  hangs (SIGSTOP: its scrapes time out, ``up == 0``, as an overloaded pod's do): the model's in-flight and rate
  halve while its window stays fresh. Before the fix the HPA policy scaled it 2 -> 1 on that; now the window is
  flagged partial (``observed_fraction`` 0.5) and the rails hold. The target stays the model's after its last
  sample leaves the window (remembered while ``up == 0``), and the flag clears once it answers again.
- backfilled: a model whose counter has one sample (a pod scraped once): fresh, but no per-step count at all, an
  all-NaN window. Before the fix slotwise read it as zero load and halved the model; now it holds.
- pure: how the target-health answer and the targets remembered from earlier ticks combine.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from autoscaler.api.plan import Reason
from autoscaler.api.spec import ModelSpec
from autoscaler.decision.scaledown import ScaleDownState, normalize
from autoscaler.estimation.capacity import profile_from_spec
from autoscaler.live.prometheus.metrics import MetricNames, PrometheusMetrics
from autoscaler.policies import HPAPolicy, make_policy
from autoscaler.policies.base import PolicyContext

pytest_plugins = ("realparts.prometheus",)

VLLM = MetricNames.preset("vllm")
MODELSERVER = Path(__file__).resolve().parents[1] / "realparts" / "modelserver.py"
STEP, WINDOW = 1.0, 8.0
# Each alpha server: 50 req/s of ~200 ms on 16 slots -> ~10 in flight, hardly any queue. HPA's target per replica
# is 16 x 0.88 = 14.08: both servers (20 in flight on 2 replicas) read 0.71 of target -> keep 2; one (10) reads 0.36
# -> ceil(0.71) = 1. (The threshold, 14.08 in flight, is ~3.7 standard deviations of an 8-step mean from both.)
ALPHA = ModelSpec("alpha", "team-a", concurrency=16, min_replicas=1, max_replicas=10)
BETA = ModelSpec("beta", "team-b", concurrency=16, min_replicas=1, max_replicas=10)
SPECS = {"team-a/alpha": ALPHA, "team-b/beta": BETA}
HPA = HPAPolicy(target_utilization=0.88, scale_down_stabilization_s=0.0)  # decides on this window alone


def _ctx(spec: ModelSpec, m, current: int, now: float, state=None) -> PolicyContext:  # type: ignore[no-untyped-def]
    return PolicyContext(now=now, spec=spec, current_replicas=current, ready_replicas=current, metrics=m,
                         metrics_step_s=STEP, forecast=None, capacity=profile_from_spec(spec), state=state)


def _query(url: str, promql: str) -> list[dict]:
    q = urllib.parse.urlencode({"query": promql})
    with urllib.request.urlopen(f"{url}/api/v1/query?{q}", timeout=5) as r:
        return json.load(r)["data"]["result"]


def _wait_until(check, timeout_s: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.2)
    raise AssertionError(f"{what} not within {timeout_s}s")


@pytest.fixture(scope="module")
def two_targets(prometheus_factory, tmp_path_factory):
    from realparts.prometheus import free_port

    work = tmp_path_factory.mktemp("partial")
    servers: dict[str, subprocess.Popen] = {}
    targets = []
    try:
        for seed, (name, model, ns) in enumerate((("alpha-0", "alpha", "team-a"), ("alpha-1", "alpha", "team-a"),
                                                  ("beta-0", "beta", "team-b"))):
            port = free_port()
            replicas = work / f"{name}.replicas"
            replicas.write_text("1")  # one pod each: the model alpha has two
            servers[name] = proc = subprocess.Popen(
                [sys.executable, str(MODELSERVER), "--port", str(port), "--model", model, "--rps", "50",
                 "--service-ms", "200", "--concurrency", "16", "--replicas-file", str(replicas),
                 "--seed", str(seed + 1)],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            )
            assert proc.stdout is not None
            line = proc.stdout.readline()
            assert line.startswith("listening"), line
            targets.append((f"127.0.0.1:{port}", {"namespace": ns}))
        prom = prometheus_factory(scrape_targets=targets, scrape_interval_s=1.0)
        _wait_until(lambda: len(_query(prom.url, "up == 1")) == len(targets), 30.0, "all targets scraped")
        time.sleep(WINDOW + 3.0)  # a whole window of both alpha servers
        yield prom, servers
    finally:
        for p in servers.values():
            if p.poll() is None:
                p.send_signal(signal.SIGCONT)  # a stopped process acts on SIGTERM only once continued
                p.terminate()
                p.wait(timeout=10)


@pytest.mark.asyncio
async def test_a_target_that_stops_answering_makes_the_model_partial_and_holds(two_targets) -> None:
    prom, servers = two_targets
    async with PrometheusMetrics(prom.url, VLLM, step_s=STEP, window_s=WINDOW, stale_after_s=5.0) as pm:
        whole = (await pm.window(time.time(), SPECS)).models["team-a/alpha"]
        before = normalize(HPA, _ctx(ALPHA, whole, current=2, now=time.time()), ScaleDownState(started_at=0.0))
        assert before.desired >= 2, f"both targets answering must not scale down ({before.detail})"

        hung = servers["alpha-1"]
        os.kill(hung.pid, signal.SIGSTOP)  # accepts connections, answers nothing: its scrapes time out
        stopped = time.monotonic()
        _wait_until(lambda: any(float(r["value"][1]) == 0 for r in _query(prom.url, "up")), 10.0, "up == 0")
        early = (await pm.window(time.time(), SPECS)).models["team-a/alpha"]  # its last sample still in the window
        await asyncio.sleep(max(0.0, stopped + WINDOW + 2.0 - time.monotonic()))  # the window: one server only

        now = time.time()
        w = await pm.window(now, SPECS)
        alpha = w.models["team-a/alpha"]
        assert not alpha.stale and np.isfinite(alpha.rate[-1])  # fresh, and the load looks halved
        res = normalize(HPA, _ctx(ALPHA, alpha, current=2, now=now), ScaleDownState(started_at=0.0))
        assert res.desired == 2, f"scaled 2 -> {res.desired} with one of two targets not answering ({res.detail})"
        assert res.reason is Reason.METRICS_PARTIAL
        # the same load judged by the whole was not a scale-down: the halving is the missing target
        assert np.nanmean(alpha.in_flight) < 0.8 * np.nanmean(whole.in_flight)
        # what the lead exports and puts in status; the same while its last sample was inside the window and now,
        # past it (the target remembered while up == 0)
        for m in (early, alpha):
            assert m.partial == "1 of 2 scrape targets not answering (up == 0)" and m.observed_fraction == 0.5
        beta = w.models["team-b/beta"]
        assert beta.partial is None and beta.observed_fraction == 1.0 and not beta.stale
        assert pm.health_error is None and pm.last_error is None

        hung.send_signal(signal.SIGCONT)
        _wait_until(lambda: all(float(r["value"][1]) == 1 for r in _query(prom.url, "up")), 10.0, "up == 1 again")
        again = (await pm.window(time.time(), SPECS)).models["team-a/alpha"]
        assert again.partial is None and again.observed_fraction == 1.0


@pytest.mark.asyncio
async def test_a_killed_target_of_a_fresh_model_is_partial_not_stale(two_targets) -> None:
    # (runs after the hang test: the same servers) a killed server refuses connections: up == 0 at once
    prom, servers = two_targets
    async with PrometheusMetrics(prom.url, VLLM, step_s=STEP, window_s=WINDOW, stale_after_s=5.0) as pm:
        assert (await pm.window(time.time(), SPECS)).models["team-a/alpha"].partial is None
        servers["alpha-0"].kill()
        servers["alpha-0"].wait(timeout=10)
        _wait_until(lambda: any(float(r["value"][1]) == 0 for r in _query(prom.url, "up")), 10.0, "up == 0")
        await asyncio.sleep(1.5)
        alpha = (await pm.window(time.time(), SPECS)).models["team-a/alpha"]
        assert not alpha.stale and alpha.partial is not None and alpha.observed_fraction == 0.5


# -- backfilled: a fresh model without one per-step count --------------------------------------------------

END = math.floor(time.time() / 60) * 60 - 60
T0 = END - 60


def _openmetrics() -> str:
    lab = 'namespace="ns",model_name="{}",instance="a"'
    lines = ["# TYPE vllm:request_success counter"]
    # steady: 5 req/s for a minute; fresh: a pod scraped once, at END (no earlier value: no increment anywhere)
    lines += [f"vllm:request_success_total{{{lab.format('steady')}}} {5.0 * (t - T0)} {t}" for t in range(T0, END + 1)]
    lines.append(f"vllm:request_success_total{{{lab.format('fresh')}}} 1234.0 {END}")
    lines.append("# EOF")
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def backfilled(prometheus_factory):
    return prometheus_factory(_openmetrics())


@pytest.mark.asyncio
async def test_an_all_nan_window_that_is_not_stale_does_not_halve_the_model(backfilled) -> None:
    prom = backfilled
    fresh, steady = ModelSpec("fresh", "ns", slo_latency_ms=1000), ModelSpec("steady", "ns", slo_latency_ms=1000)
    now = END + 0.5
    async with PrometheusMetrics(prom.url, VLLM, step_s=2.0, window_s=40.0, stale_after_s=20.0) as pm:
        w = await pm.window(now, {"ns/fresh": fresh, "ns/steady": steady})
    m = w.models["ns/fresh"]
    assert not m.stale and m.rate.size == 20 and np.isnan(m.rate).all()  # what Prometheus gives: fresh, no counts
    np.testing.assert_allclose(w.models["ns/steady"].rate, 5.0)
    policy = make_policy("slotwise")
    state, window, current = policy.initial_state(fresh, 4), ScaleDownState(started_at=0.0), 4
    for tick in range(3):  # one decision per stabilization window, as the controller would make them
        t = now + 100.0 * tick
        res = normalize(policy, _ctx(fresh, m, current, t, state), window)
        assert res.desired == 4, f"scaled {current} -> {res.desired} on a window without one count ({res.detail})"
        state, window, current = res.state, res.scale_down, res.desired
    assert res.reason is Reason.METRICS_PARTIAL
    # the steady model, fully observed at 5 req/s, still decides on its data
    assert w.models["ns/steady"].partial_reason() is None


@pytest.mark.asyncio
async def test_a_failing_health_query_alone_makes_models_partial_not_stale(backfilled, monkeypatch) -> None:
    steady = {"ns/steady": ModelSpec("steady", "ns")}
    async with PrometheusMetrics(backfilled.url, VLLM, step_s=2.0, window_s=40.0, stale_after_s=20.0) as pm:
        monkeypatch.setattr(pm, "health_query", lambda: "max by (job) (up) * on () group_left ()")  # a PromQL error
        m = (await pm.window(END + 0.5, steady)).models["ns/steady"]
        assert not m.stale and m.partial is not None and "health unknown" in m.partial
        np.testing.assert_allclose(m.rate, 5.0)  # the window's own answers still count
        assert pm.errors == 0 and pm.last_error is None and pm.health_error is not None
        monkeypatch.undo()
        m = (await pm.window(END + 0.5, steady)).models["ns/steady"]
        assert m.partial is None and m.observed_fraction == 1.0 and pm.health_error is None  # no up series here


# -- pure: the health answer and the memory ---------------------------------------------------------------


def _row(up: int, job: str = "models", instance: str = "a:1", ns: str | None = "team-a",
         model: str | None = "alpha") -> dict:
    labels = {"job": job, "instance": instance}
    if ns is not None:
        labels["namespace"] = ns
    if model is not None:
        labels["model_name"] = model
    return {"metric": labels, "value": [0, str(up)]}


def test_target_health_remembers_a_down_target_until_it_leaves_discovery() -> None:
    pm = PrometheusMetrics("http://x", VLLM)
    models = {"team-a/alpha": ALPHA, "team-b/beta": BETA}
    both = [_row(1, instance="a:1"), _row(1, instance="a:2"), _row(1, instance="b:1", ns="team-b", model="beta")]
    assert pm._target_health(both, models) == {}
    # a:2 hangs: still inside the lookback, its model row says up 0
    hung = [_row(1, instance="a:1"), _row(0, instance="a:2"), _row(1, instance="b:1", ns="team-b", model="beta")]
    assert pm._target_health(hung, models) == {"team-a/alpha": ("1 of 2 scrape targets not answering (up == 0)", 0.5)}
    # past the lookback only the bare up == 0 row is left (target labels, no model): remembered, still partial
    later = [_row(1, instance="a:1"), _row(0, instance="a:2", model=None),
             _row(1, instance="b:1", ns="team-b", model="beta")]
    assert pm._target_health(later, models)["team-a/alpha"][1] == 0.5
    assert pm._target_health(later, models)["team-a/alpha"][1] == 0.5  # and the tick after
    # the pod is gone (no up series): forgotten -- neither observed nor missing
    gone = [_row(1, instance="a:1"), _row(1, instance="b:1", ns="team-b", model="beta")]
    assert pm._target_health(gone, models) == {}
    assert pm._target_health(later, models) == {}  # once forgotten, a bare down row is nobody's
    # a model whose key labels are target labels is matched by its up == 0 row even if it never answered
    assert pm._target_health([_row(0, instance="c:1", ns="team-b", model="beta")], models) == {
        "team-b/beta": ("1 of 1 scrape targets not answering (up == 0)", 0.0)}


def test_a_failed_health_query_makes_every_model_partial_not_stale() -> None:
    from autoscaler.live.prometheus.client import PrometheusError

    pm = PrometheusMetrics("http://x", VLLM)
    out = pm._target_health(PrometheusError("HTTP 422: many-to-many matching", url="http://x"), SPECS)
    assert set(out) == set(SPECS) and all(why is not None and "health unknown" in why for why, _ in out.values())
    assert all(math.isnan(fraction) for _, fraction in out.values())  # unknown, not "all observed"
    assert pm.health_error is not None and "many-to-many" in pm.health_error
