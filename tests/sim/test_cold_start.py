"""Scale to and from zero in the simulator (issue 18): cold-started requests (arrived while their model had no
routable replica), their wait for a replica and their timeouts in both engines; the SLO accounting that counts or
exempts them; warm idle GPU-hours; the held queue in the metrics window; SetRouting round trip in SimCluster."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autoscaler.api.plan import Plan, SetRouting
from autoscaler.api.spec import ModelSpec
from autoscaler.policies import make_policy
from autoscaler.sim.cluster import SimCluster
from autoscaler.sim.des import DesEngine
from autoscaler.sim.fluid import FluidEngine
from autoscaler.sim.metrics import SimMetrics
from autoscaler.sim.queueing import ColdWaits, Workload
from autoscaler.sim.run import SimConfig, SimResult, simulate
from autoscaler.sim.scorecard import scorecard
from autoscaler.sim.workload import build_workload
from forecasting.traces.model import RateSeries
from sharing.cluster import nodes_from_spec

ENGINES = (FluidEngine, DesEngine)


def one_request(at: float = 5.0) -> Workload:
    return Workload.from_requests(["a"], t=np.array([at]), model_index=np.array([0]), occupancy_s=np.array([0.5]),
                                  latency_part_s=np.array([0.5]), concurrency=4, slo_s=2.0)


@pytest.mark.parametrize("engine", ENGINES)
def test_a_request_to_a_model_at_zero_waits_for_the_cold_start(engine: type) -> None:
    # a model at zero, one request at t=5 s, a replica routable from t=30 s (a 30 s cold start from t=0): one
    # cold-started request that waited 25 s for its replica, held until then, dispatched once
    e = engine(one_request())
    cold, held = 0.0, []
    for k in range(6):
        st_ = e.step(k * 10.0, 10.0, np.array([0 if k < 3 else 1]))
        cold += float(st_.cold_arrivals[0])
        held.append(float(st_.held[0]))
    assert cold == pytest.approx(1.0)
    assert held == pytest.approx([1.0, 1.0, 1.0, 0.0, 0.0, 0.0])
    w = e.cold_waits(60.0)
    assert w.dispatched.tolist() == [True]
    assert w.wait_s == pytest.approx([25.0])
    assert w.weight == pytest.approx([1.0])


@pytest.mark.parametrize("engine", ENGINES)
def test_a_request_with_a_replica_is_not_cold_started(engine: type) -> None:
    e = engine(one_request())
    st_ = e.step(0.0, 10.0, np.array([1]))
    assert float(st_.cold_arrivals[0]) == 0.0 and float(st_.held[0]) == 0.0
    assert len(e.cold_waits(10.0).t) == 0


@pytest.mark.parametrize("engine", ENGINES)
def test_a_request_still_held_at_the_end_has_waited_until_then(engine: type) -> None:
    e = engine(one_request(), request_timeout_s=1000.0)
    for k in range(9):
        e.step(k * 10.0, 10.0, np.array([0]))
    w = e.cold_waits(90.0)
    assert w.dispatched.tolist() == [False] and w.wait_s == pytest.approx([85.0])


@pytest.mark.parametrize("engine", ENGINES)
def test_a_held_request_gives_up_at_the_request_timeout(engine: type) -> None:
    # held from t=5 s with a 60 s timeout: gone at 65 s (its client leaves then, not at the next tick start, issue 30),
    # not held at the end of that tick, a cold-start timeout; the replica that comes at 90 s serves nothing (no load,
    # nothing completed or successful)
    e = engine(one_request(), request_timeout_s=60.0)
    held, done, ok, busy = [], 0.0, 0.0, 0.0
    for k in range(12):
        st_ = e.step(k * 10.0, 10.0, np.array([0 if k < 9 else 1]))
        held.append(float(st_.held[0]))
        done += float(st_.completed[0])
        ok += float(st_.within_timeout[0]) + float(st_.within_slo[0])
        busy += float(st_.busy[0])
    assert held == pytest.approx([1.0] * 6 + [0.0] * 6)
    assert done == pytest.approx(0.0, abs=1e-4) and ok == 0.0 and busy == pytest.approx(0.0, abs=1e-4)
    w = e.cold_waits(120.0)
    assert w.dispatched.tolist() == [False] and w.wait_s == pytest.approx([60.0])  # the timeout, not 65 s
    assert w.weight == pytest.approx([1.0])


def test_both_engines_give_up_the_same_held_requests() -> None:
    # many requests held over a long zero stretch, then a replica: the same held series and the same timeouts
    t = np.arange(0.5, 200.0, 2.0)
    wl = Workload.from_requests(["a"], t=t, model_index=np.zeros(t.size, dtype=np.int64),
                                occupancy_s=np.full(t.size, 0.2), latency_part_s=np.full(t.size, 0.2),
                                concurrency=4, slo_s=2.0)
    out = []
    for engine in ENGINES:
        e = engine(wl, request_timeout_s=30.0)
        held = [float(e.step(k * 10.0, 10.0, np.array([0 if k < 15 else 1])).held[0]) for k in range(25)]
        w = e.cold_waits(250.0)
        out.append((held, float(w.weight[(~w.dispatched) & (w.wait_s >= 30.0 - 1e-9)].sum()),
                    float(w.weight[w.dispatched].sum())))
    (h_f, gone_f, met_f), (h_d, gone_d, met_d) = out
    assert max(h_d) <= 16 and h_d[14] == pytest.approx(15.0)  # at most ~30 s of arrivals held, never the pile
    assert gone_d == 60.0 and met_d == 15.0  # requests from 120 s on met the replica at 150 s; the rest gave up
    assert gone_f == pytest.approx(gone_d, abs=5.0) and met_f == pytest.approx(met_d, abs=5.0)
    np.testing.assert_allclose(h_f, h_d, atol=5.0)


def test_the_des_counts_the_cold_started_requests_within_the_slo_where_it_settles_them() -> None:
    # a 1.5 s SLO-latency request would meet a 2 s SLO, but it waited 25 s: settled late in the dispatch tick
    e = DesEngine(one_request())
    for k in range(3):
        assert float(e.step(k * 10.0, 10.0, np.array([0])).within_slo[0]) == 0.0
    st_ = e.step(30.0, 10.0, np.array([1]))
    assert float(st_.cold_within[0]) == 0.0 and float(st_.within_slo[0]) == 0.0


def test_the_metrics_window_carries_the_held_queue() -> None:
    metrics = SimMetrics(["a", "b"], 10.0, 4)
    metrics.push(np.zeros(2), np.zeros(2), np.full(2, np.nan), held=np.array([3.0, 0.0]))
    win = metrics.window(10.0)
    assert win.models["a"].held_requests == 3.0 and win.models["b"].held_requests == 0.0
    metrics.push(np.zeros(2), np.zeros(2), np.full(2, np.nan))
    assert metrics.window(20.0).models["a"].held_requests == 0.0


def spec(name: str, min_replicas: int = 1, **kw: float) -> ModelSpec:
    return ModelSpec(name=name, service_time_ms=100, slo_latency_ms=1000, min_replicas=min_replicas,
                     cold_start_s=kw.pop("cold_start_s", 30.0), **kw)


def test_set_routing_round_trip_in_the_simulated_cluster() -> None:
    specs = {"z": spec("z", 0), "w": spec("w", 1)}
    cluster = SimCluster(nodes_from_spec("2xH100-80GB"), ["z", "w"], specs, drain_s=np.zeros(2))
    snap = cluster.snapshot(0.0)
    assert snap.models["z"].via_activator is False  # fronted, starts with replicas: straight to the pods
    assert snap.models["w"].via_activator is None  # nobody fronts a model that cannot go to zero
    cluster.apply(Plan(now=10.0, actions=[SetRouting("z", True), SetRouting("w", True)]))
    snap = cluster.snapshot(10.0)
    assert snap.models["z"].via_activator is True and snap.models["w"].via_activator is None
    cluster.apply(Plan(now=20.0, actions=[SetRouting("z", False)]))
    assert cluster.snapshot(20.0).models["z"].via_activator is False
    assert cluster.routing_actions == {"z": 2, "w": 1}


def run(rates: list[list[float]], specs: dict[str, ModelSpec], policy: str = "static", mode: str = "fluid",
        **kw: object) -> SimResult:
    series = RateSeries(rates=np.array(rates, dtype=float), models=tuple(specs), step_s=60.0)
    knobs = {"replicas": kw.pop("replicas")} if "replicas" in kw else {}
    cfg = SimConfig(tick_s=10.0, mode=mode, burn_in_s=60.0, **kw)  # type: ignore[arg-type]
    return simulate(build_workload(series, specs), nodes_from_spec("2xH100-80GB"), make_policy(policy, **knobs), cfg)


@pytest.mark.parametrize("mode", ["fluid", "des"])
def test_the_card_reads_the_waits_and_timeouts_and_exempt_leaves_out_the_cold_started(mode: str) -> None:
    # a real run whose every request is declared cold-started, with three known waits for a replica: 10 s and
    # 70 s (dispatched), 90 s (still held at the end); the timeout is 60 s
    res = run([[1.0, 1.0, 1.0, 1.0, 1.0]], {"z": spec("z", 0)}, mode=mode)
    waits = ColdWaits(model_index=np.zeros(3, dtype=np.int64), t=np.array([70.0, 80.0, 90.0]),
                      wait_s=np.array([10.0, 70.0, 90.0]), weight=np.ones(3), dispatched=np.array([True, True, False]))
    res = dataclasses.replace(res, minute_cold=res.minute_arrivals, minute_cold_within=res.minute_within,
                              cold_waits=waits)
    card = scorecard(res)
    assert card["requests"] > 3 and card["cold_started_requests"] == card["requests"]
    assert card["cold_start_wait_mean_s"] == pytest.approx(40.0)  # over those that met a replica
    assert card["cold_start_wait_p95_s"] == 70.0
    assert card["cold_start_timeouts"] == 2  # 70 s dispatched, 90 s still held: both past 60 s
    assert card["per_model"]["z"]["cold_start_timeouts"] == 2
    exempt = scorecard(dataclasses.replace(res, cold_start_slo="exempt"))
    assert exempt["slo_judged_requests"] == 0 and exempt["slo_attainment"] == 1.0  # nothing left to judge
    assert exempt["violating_requests"] == 0 and exempt["slo_minutes_met"] == 1.0
    assert exempt["requests"] == card["requests"] and exempt["success_rate"] == card["success_rate"]


def test_warm_idle_gpu_hours_on_a_known_schedule() -> None:
    # one whole-GPU replica each, always; model i idle in scored minutes 2-4 (3 minutes), model b never idle
    specs = {"i": spec("i", 1), "b": spec("b", 1)}
    res = run([[1.0, 1.0, 0.0, 0.0, 0.0, 1.0], [1.0] * 6], specs, replicas=1)
    card = scorecard(res)
    pm = card["per_model"]
    assert pm["b"]["warm_idle_gpu_hours"] == 0.0
    # 3 idle minutes of 1 GPU, less at most the tick in which the last requests drain
    assert 3 / 60 - 10 / 3600 - 1e-9 <= pm["i"]["warm_idle_gpu_hours"] <= 3 / 60 + 1e-9
    assert card["warm_idle_gpu_hours"] == pytest.approx(pm["i"]["warm_idle_gpu_hours"])
    assert card["warm_idle_gpu_hours"] <= card["gpu_hours"]
    assert card["idle_gpu_hours"] == pytest.approx(scorecard(res)["idle_gpu_hours"])  # a different, untouched number


def test_cold_start_slo_must_be_count_or_exempt() -> None:
    with pytest.raises(ValueError, match="cold_start_slo"):
        SimConfig(cold_start_slo="ignore")


@st.composite
def zero_runs(draw: st.DrawFn) -> SimResult:
    m = draw(st.integers(1, 2))
    specs = {f"m{i}": spec(f"m{i}", draw(st.sampled_from((0, 1))),
                           cold_start_s=draw(st.sampled_from((10.0, 30.0)))) for i in range(m)}
    minutes = draw(st.integers(4, 7))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    rates = rng.uniform(0.0, 2.0, (m, minutes)) * (rng.uniform(size=(m, minutes)) < 0.5)  # idle stretches
    policy = draw(st.sampled_from(("static", "hpa", "slotwise")))
    kw = {"replicas": draw(st.integers(0, 1))} if policy == "static" else {}
    return run(rates.tolist(), specs, policy=policy, mode=draw(st.sampled_from(("fluid", "des"))), **kw)


@given(zero_runs())
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_count_and_exempt_differ_by_exactly_the_cold_started_requests(res: SimResult) -> None:
    count = scorecard(dataclasses.replace(res, cold_start_slo="count"), lower_bound_gpu_hours=1.0)
    exempt = scorecard(dataclasses.replace(res, cold_start_slo="exempt"), lower_bound_gpu_hours=1.0)
    for card in (count, exempt):
        assert 0 <= card["cold_start_timeouts"] <= card["cold_started_requests"] <= card["requests"]
        assert 0.0 <= card["warm_idle_gpu_hours"] <= card["gpu_hours"] + 1e-9
        n, v = card["slo_judged_requests"], card["violating_requests"]
        assert card["slo_attainment"] == ((n - v) / n if n else 1.0)
        assert sum(p["cold_started_requests"] for p in card["per_model"].values()) == card["cold_started_requests"]
        assert sum(p["requests"] for p in card["per_model"].values()) == card["requests"]
    assert count["cold_start_slo"] == "count" and exempt["cold_start_slo"] == "exempt"
    assert count["slo_judged_requests"] == count["requests"]
    # the same run, judged two ways: exempt leaves out exactly the cold-started requests
    assert exempt["requests"] == count["requests"] and exempt["success_rate"] == count["success_rate"]
    assert exempt["slo_judged_requests"] == count["requests"] - count["cold_started_requests"]
    assert exempt["cold_started_requests"] == count["cold_started_requests"]
    assert exempt["gpu_hours"] == count["gpu_hours"]
    # the bound's ratio is not printed where it bounds nothing
    assert count["lower_bound_comparable"] is True and count["gpu_hours_vs_lower_bound"] is not None
    assert exempt["lower_bound_comparable"] is False and exempt["gpu_hours_vs_lower_bound"] is None
    if count["cold_start_wait_mean_s"] is not None:  # a wait for a replica is never negative
        assert count["cold_start_wait_mean_s"] >= 0.0 and count["cold_start_wait_p95_s"] >= 0.0
