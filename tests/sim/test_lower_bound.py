"""The lower bound (autoscaler/sim/lower_bound.py): what it is built from (the burn-in and warm start of simulate, the
engine's monotonicity, forks, the search, the held count under a cold start) and the claim it makes: no policy whose
SLO-meeting minutes cover every attainable minute comes out below it."""

from __future__ import annotations

import dataclasses
import math
from itertools import pairwise

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import autoscaler.sim.lower_bound as lb
from autoscaler.api.spec import ModelSpec, SpecError
from autoscaler.estimation.capacity import ServiceProfile
from autoscaler.policies import make_policy
from autoscaler.sim.cluster import SimCluster
from autoscaler.sim.defaults import model_specs
from autoscaler.sim.fluid import FluidEngine
from autoscaler.sim.harness import default_cluster, run_policies
from autoscaler.sim.queueing import Workload
from autoscaler.sim.run import SimConfig, SimResult, _warm_start, simulate
from autoscaler.sim.workload import SimWorkload, build_workload, served_as
from forecasting.traces import resolve_trace
from forecasting.traces.model import RateSeries, RequestLog
from forecasting.traces.ops import head
from sharing.cluster import nodes_from_spec
from sharing.packer import CostAwarePacker

NODES = nodes_from_spec("16xH100-80GB:mig")
POLICIES = ["slotwise", "predictive", "hpa", "kpa", "static", "oracle"]

# ------------------------------------------------------------------------------------------------ toy workloads


def toy(bursts: tuple[tuple[int, int, float], ...] = ((10, 12, 4.75),), minutes: int = 20, cold_s: float = 60.0,
        slo_ms: float = 100.0, service_ms: float = 100.0, max_replicas: int = 50, base_rate: float = 0.0,
        memory_gib: float = 80.0, compute: float = 1.0) -> SimWorkload:
    """One model, deterministic service, one server per replica, rates per minute: ``base_rate`` except
    ``(first minute, end minute, rate)`` bursts. With the SLO equal to the service time a request meets it only if it
    does not wait, which it does with probability rho (Erlang C of one server): 95 % within needs rho <= 0.05.
    By default a replica takes a whole GPU (a 7g.80gb instance or the GPU): the reference speed, one GPU."""
    rates = np.full((1, minutes), base_rate)
    for a, b, r in bursts:
        rates[0, a:b] = r
    spec = ModelSpec(name="toy", slo_latency_ms=slo_ms, slo_percentile=95, slo_metric="e2e", service_time_ms=service_ms,
                     concurrency=1, cold_start_s=cold_s, gpu_memory_gib=memory_gib, gpu_compute_share=compute,
                     min_replicas=1, max_replicas=max_replicas)
    s = service_ms / 1000.0
    profile = ServiceProfile(occupancy_s=np.full(32, s), latency_part_s=np.full(32, s), concurrency=1,
                             slo_s=slo_ms / 1000.0, percentile=95.0)
    trace = RateSeries(rates=rates, models=("toy",), step_s=60.0)
    return SimWorkload(trace, {"toy": spec}, Workload.from_rates(("toy",), rates, 60.0, [profile]))


def random_workload(seed: int, models: int, request_log: bool) -> SimWorkload:
    """A few models of random, bursty load (a request log or a rate series) for the engine properties."""
    rng = np.random.default_rng(seed)
    names = tuple(f"m{i}" for i in range(models))
    profiles = [ServiceProfile(occupancy_s=rng.exponential(rng.uniform(0.05, 1.0), 32),
                               latency_part_s=np.zeros(32), concurrency=int(rng.integers(1, 9)),
                               slo_s=float(rng.uniform(0.2, 3.0)), percentile=95.0) for _ in names]
    profiles = [dataclasses.replace(p, latency_part_s=p.occupancy_s * rng.uniform(0.1, 1.0)) for p in profiles]
    specs: dict[str, ModelSpec | SpecError] = {
        x: ModelSpec(name=x, slo_latency_ms=p.slo_s * 1000.0, concurrency=p.concurrency, cold_start_s=20.0,
                     max_replicas=40) for x, p in zip(names, profiles, strict=True)}
    if not request_log:
        rates = rng.gamma(0.5, 20.0, (models, 10))
        return SimWorkload(RateSeries(rates, names, 30.0), specs, Workload.from_rates(names, rates, 30.0, profiles))
    t, mi, occ, lat = [], [], [], []
    for i, p in enumerate(profiles):
        n = int(rng.integers(50, 600))
        times = np.sort(np.concatenate([rng.uniform(0, 300, n // 2), rng.uniform(100, 105, n - n // 2)]))
        t.append(times)
        mi.append(np.full(n, i))
        k = rng.integers(0, 32, n)
        occ.append(p.occupancy_s[k])
        lat.append(p.latency_part_s[k])
    q = Workload.from_requests(names, np.concatenate(t), np.concatenate(mi), np.concatenate(occ),
                               np.concatenate(lat), [p.concurrency for p in profiles], [p.slo_s for p in profiles])
    assert q.t is not None and q.model_index is not None
    return SimWorkload(RequestLog(t=q.t, model_index=q.model_index.astype(np.int32), models=names), specs, q)


def demo(hours: float = 0.35) -> SimWorkload:
    trace = head(resolve_trace("azure-llm-2023", None), (0.25 + hours) * 3600.0)
    return build_workload(trace, model_specs(trace), history_s=0.25 * 3600.0)


def met(result: SimResult) -> np.ndarray:
    return lb.minutes_met(result.minute_arrivals, result.minute_within, result.slo_percentile)


# ------------------------------------------------------------------------------------------------ building blocks


@pytest.mark.parametrize("cfg", [SimConfig(), SimConfig(tick_s=7.0), SimConfig(burn_in_s=300.0),
                                 SimConfig(warmup_s=30.0, tick_s=15.0)])
def test_scored_period_is_simulates(cfg: SimConfig) -> None:
    w = toy(minutes=9, cold_s=45.0)
    r = simulate(w, NODES, make_policy("static"), cfg)
    burn_in, first, n_ticks, n_min = lb.scored_period(w, cfg)
    assert burn_in == r.burn_in_s
    assert (n_ticks - first) * cfg.tick_s == r.scored_s
    assert n_min == r.minute_arrivals.shape[1]


def test_warm_start_is_simulates() -> None:
    w = demo(0.2)
    specs = dict(w.specs)
    specs["code"] = SpecError("code", "slotwise.io/slo-latency-ms: broken on purpose")
    w = dataclasses.replace(w, specs=specs)
    cluster = SimCluster(nodes_from_spec("64xH100-80GB:mig"), w.models, w.specs, drain_s=np.zeros(len(w.models)))
    _warm_start(cluster, w, served_as(w.specs), 10.0, CostAwarePacker())
    assert [len(cluster.replicas[i]) for i in range(len(w.models))] == list(lb.warm_start_replicas(w, 10.0))
    assert lb.warm_start_replicas(w, 10.0)[w.models.index("code")] == 0


def test_gpu_fraction_is_the_smallest_slot() -> None:
    spec = toy(memory_gib=10.0, compute=0.1).specs["toy"]
    assert isinstance(spec, ModelSpec)
    assert lb.replica_gpu_fraction(spec, NODES) == pytest.approx(1 / 7)  # a 1g MIG slice
    assert lb.replica_gpu_fraction(spec, nodes_from_spec("8xH100-80GB")) == pytest.approx(0.1)  # a 0.1 share
    whole = dataclasses.replace(spec, gpu_memory_gib=80.0, gpu_compute_share=1.0)
    assert lb.replica_gpu_fraction(whole, NODES) == 1.0
    options = lb.slot_options(spec, NODES)
    # a front: each further option holds more of a GPU and serves faster
    assert all(a.fraction < b.fraction and a.speed < b.speed for a, b in pairwise(options))


def test_a_slot_too_slow_for_the_slo_is_not_the_bounds() -> None:
    """With slot speeds, a 1g slice declared at a fifth of the reference speed serves 0.1 s requests far slower
    than the 0.1 s SLO: the bound takes a faster slot that meets the minutes, not the cheaper one that meets none.
    (A 1g slice's table speed is capped at 1 for a model sized for 0.1 of a GPU, so the slowness is declared, as
    ``slotwise.io/slot-speeds`` does.)"""
    w = toy(bursts=((10, 12, 4.9),), minutes=16, memory_gib=10.0, compute=0.1)
    spec = w.specs["toy"]
    assert isinstance(spec, ModelSpec)
    spec = dataclasses.replace(spec, slot_speeds=(("H100-80GB/1g.10gb", 0.2), ("H100-80GB/1g.20gb", 0.2)))
    w.specs["toy"] = spec
    options = lb.slot_options(spec, NODES)
    assert lb.engine_takes_speeds("fluid") and options[0].speed == 0.2 and "/1g." in options[0].kind
    b = lb.lower_bound(w, NODES)
    assert b.attainable.all()
    # the cheapest slot at the reference speed (2g.20gb), not the 1g slice
    assert b.slot["toy"].speed == 1.0 and b.gpu_fraction["toy"] > options[0].fraction
    assert b.slot["toy"] == min((o for o in options if o.speed == 1.0), key=lambda o: o.fraction)


def _random_state(seed: int, request_log: bool, warm_ticks: int) -> tuple[SimWorkload, FluidEngine, np.ndarray]:
    """An engine after ``warm_ticks`` ticks of random replica counts (overloads, scale-downs, zero replicas), and
    the counts of the last of them."""
    w = random_workload(seed, 3, request_log)
    rng = np.random.default_rng(seed + 1)
    engine = FluidEngine(w.queue)
    last = np.zeros(3)
    for k in range(warm_ticks):
        last = rng.integers(0, 6, 3).astype(float)
        engine.step(k * 10.0, 10.0, last)
    return w, engine, last


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), request_log=st.booleans(), warm_ticks=st.integers(0, 12),
       extra=st.lists(st.integers(0, 8), min_size=3, max_size=3))
def test_more_replicas_never_lower_the_within_share(seed: int, request_log: bool, warm_ticks: int,
                                                    extra: list[int]) -> None:
    """What the construction rests on: from any state, one more replica for a tick does not lower that tick's
    within-SLO count, nor its count completed within the timeout (the knee's second test); and the other models are
    untouched (the engine is per-model independent). Exact for rate series (up to rounding). For request logs, from
    the current count up, within 1 pp of the tick's requests (measured: 9 of 9,000 random cases lower, by at most
    0.5 pp): the burst model's allowance is not exactly monotone. Below the current count it is not monotone at all
    (next test)."""
    _, engine, last = _random_state(seed, request_log, warm_ticks)
    n = last + np.array(extra, dtype=float)
    now = warm_ticks * 10.0
    base = lb.fork(engine).step(now, 10.0, n)
    # Rate series: exact up to floating point (seed 1745, 7 replicas more on 5: a drop of 2.4e-7 of 37 requests,
    # the Erlang sums' rounding), so 1e-6 of the tick's requests.
    tol = 1e-2 if request_log else 1e-6
    for i in range(3):
        more = lb.fork(engine).step(now, 10.0, n + np.eye(3)[i])
        slack = tol * max(base.arrivals[i], 1.0)
        assert more.within_slo[i] >= base.within_slo[i] - slack
        assert more.within_timeout[i] >= base.within_timeout[i] - slack
        others = np.arange(3) != i
        assert np.allclose(more.within_slo[others], base.within_slo[others], rtol=1e-12, atol=1e-12)


@pytest.mark.xfail(strict=True, reason="fluid engine: scaling down from a backlog can raise the within share (the "
                   "burst model's M/D/1 allowance grows as 1/n while the survivors keep their backlog)")
def test_scale_down_from_a_backlog_never_raises_the_within_share() -> None:
    """A request log, four replicas with a backlog (16 in system, 30 in the burst backlog each): one replica meets
    10.58 of the next tick's 12 requests, four meet 9.97. Without the burst model (per_request_state=False) it is
    monotone. A schedule, the bound's or a policy's, that scales down into such a backlog is scored better for it."""
    w = random_workload(2996, 3, request_log=True)
    engine = FluidEngine(w.queue)
    for k, count in enumerate([2, 4, 2, 1, 3, 5, 2, 2, 0, 4, 4]):  # model 2's history; the others idle
        engine.step(k * 10.0, 10.0, np.array([0.0, 0.0, float(count)]))
    n = np.array([0.0, 0.0, 1.0])
    one = lb.fork(engine).step(110.0, 10.0, n)
    four = lb.fork(engine).step(110.0, 10.0, n + 3 * np.eye(3)[2])
    assert four.within_slo[2] >= one.within_slo[2] - 1e-9


@pytest.mark.parametrize("mode", ["fluid", "des"])
def test_a_fork_leaves_the_engine_as_it_was(mode: str) -> None:
    w = random_workload(3, 3, request_log=True)
    from autoscaler.sim.engines import make_engine

    a, b = make_engine(mode, w, 10.0, seed=1), make_engine(mode, w, 10.0, seed=1)
    for k in range(5):
        a.step(k * 10.0, 10.0, np.array([2.0, 1.0, 3.0]))
        b.step(k * 10.0, 10.0, np.array([2.0, 1.0, 3.0]))
    f = lb.fork(a)
    for k in range(5, 9):
        f.step(k * 10.0, 10.0, np.array([0.0, 7.0, 1.0]))
    for k in range(5, 9):
        sa = a.step(k * 10.0, 10.0, np.array([1.0, 2.0, 2.0]))
        sb = b.step(k * 10.0, 10.0, np.array([1.0, 2.0, 2.0]))
        for field in dataclasses.fields(sa):
            assert np.array_equal(getattr(sa, field.name), getattr(sb, field.name), equal_nan=True)


def test_merged_states_are_the_served_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    """Taking each model's state from the trial that tried its count is the same as serving the counts again."""
    w = random_workload(5, 3, request_log=True)
    cfg = SimConfig(burn_in_s=60.0)
    merged = lb.lower_bound(w, NODES, cfg, rule="tick")
    monkeypatch.setattr(lb, "_merge", lambda engines, pick: None)
    served = lb.lower_bound(w, NODES, cfg, rule="tick")
    assert np.array_equal(merged.serving, served.serving)
    assert np.array_equal(merged.minute_within, served.minute_within)
    assert merged.engine_steps < served.engine_steps


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 8), st.integers(0, 40), st.integers(0, 45), st.integers(-5, 50)),
                min_size=1, max_size=6))
def test_fewest_finds_the_threshold(cases: list[tuple[int, int, int, int]]) -> None:
    lo = np.array([c[0] for c in cases])
    hi = np.maximum(lo, [c[1] for c in cases])
    need = np.array([c[2] for c in cases])  # ok(n) <=> n >= need
    guess = np.array([c[3] for c in cases])
    calls = []

    def trial(n: np.ndarray):  # type: ignore[no-untyped-def]
        calls.append(n.copy())
        assert ((n >= lo) & (n <= hi)).all()
        return n

    out = lb.fewest(trial, lo, hi, guess, lambda n, s: n >= need, np.ones(len(cases), dtype=bool))
    assert np.array_equal(out, np.where(need > hi, hi + 1, np.maximum(need, lo)))
    assert len(calls) <= 2 * math.ceil(math.log2(int(hi.max()) + 2)) + 2


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 6), min_size=1, max_size=40), st.integers(0, 12))
def test_held_is_the_running_max_over_the_cold_start(serving: list[int], lead: int) -> None:
    held = lb.held_replicas(np.array([serving]), np.array([lead]))[0]
    expect = [max(serving[t : t + lead + 1]) for t in range(len(serving))]
    assert list(held) == expect


def test_held_bridges_short_gaps_and_pays_one_cold_start_for_long_ones() -> None:
    n = np.array([[1, 3, 1, 1, 3, 1, 1, 1, 1, 1, 1, 3]])
    held = lb.held_replicas(n, np.array([2]))[0]
    # the gap of 2 ticks is kept (2 <= lead); before the third burst 2 ticks of cold start, not the whole gap of 6
    assert list(held) == [3, 3, 3, 3, 3, 1, 1, 1, 1, 3, 3, 3]


# ------------------------------------------------------------------------------------------------ the bound


def test_a_single_burst_gives_the_hand_computed_gpu_hours() -> None:
    """Zero load, then two minutes at 4.9 req/s of 0.1 s requests (0.49 Erlang) that may not wait: 95 % within
    needs rho = 0.49 / n <= 0.05, so 10 replicas (9 give rho 0.054: 94.6 %); otherwise min_replicas (1). Nine of
    them start a cold start (60 s) before the burst. Scored: after warmup 60 s + cold start 60 s. A replica is a
    whole GPU. Ticks of a minute, so that the burst's first tick, which starts from an empty state,
    is within 5 % of the steady state (the engine's trapezoid over a tick of n substeps sees 1 - 1/2n of it)."""
    w = toy(bursts=((10, 12, 4.9),), minutes=20, cold_s=60.0)
    cfg = SimConfig(tick_s=60.0)
    b = lb.lower_bound(w, NODES, cfg)
    assert b.burn_in_s == 120.0
    minutes = np.arange(20)
    assert list(b.serving[0]) == list(np.where((minutes >= 10) & (minutes < 12), 10, 1))
    assert list(b.replicas[0]) == list(np.where((minutes >= 9) & (minutes < 12), 10, 1))
    scored_s = 1200.0 - 120.0
    expect = (1 * scored_s + 9 * (120.0 + 60.0)) / 3600.0  # GPU-seconds / 3600
    assert b.gpu_hours == pytest.approx(expect)
    assert b.per_model_gpu_hours["toy"] == pytest.approx(expect)
    assert b.attainable.all() and not b.unattainable_reason
    inst = lb.lower_bound(w, NODES, cfg, instant_start=True)  # the same, less the cold starts
    assert inst.gpu_hours == pytest.approx((1 * scored_s + 9 * 120.0) / 3600.0)
    # At 10 s ticks the first tick of the burst needs fewer (it starts empty), and the cold start hides most of it.
    fine = lb.lower_bound(w, NODES)
    assert list(fine.serving[0, 61:]) == list(np.where(np.arange(61, 120) < 72, 10, 1))
    assert expect - 9 * 10.0 / 3600.0 <= fine.gpu_hours <= expect


def test_a_cold_start_raises_the_bound() -> None:
    bursts = ((20, 22, 4.75), (40, 41, 9.0), (43, 44, 3.0))
    cfg = SimConfig(burn_in_s=660.0)  # the same scored period for both
    cold = lb.lower_bound(toy(bursts=bursts, minutes=60, cold_s=600.0, base_rate=0.3), NODES, cfg)
    none = lb.lower_bound(toy(bursts=bursts, minutes=60, cold_s=0.0, base_rate=0.3), NODES, cfg)
    assert cold.burn_in_s == none.burn_in_s == 660.0
    assert none.gpu_hours < cold.gpu_hours
    assert np.array_equal(none.serving, none.replicas)  # no cold start: held is what serves
    assert (cold.replicas >= cold.serving).all()


def test_an_infeasible_slo_is_sized_at_the_knee() -> None:
    """The service time alone (0.1 s) is above the SLO (0.05 s): no replica count meets a minute. The bound says so
    and holds the knee, where more replicas stop helping (here: every request completes in time), not 200."""
    w = toy(bursts=((0, 20, 20.0),), minutes=20, slo_ms=50.0, max_replicas=200)
    b = lb.lower_bound(w, NODES)
    assert not b.attainable.any()
    reason = b.unattainable_reason["toy"]
    assert "with 200 replicas vs SLO 0.05 s" in reason and "knee" in reason
    assert "latency at p95 is 0.1 s" in reason
    assert 0 < b.knee_replicas["toy"] <= 10  # 2 Erlang of load: stable from 3
    scored = b.serving[:, 12:]
    assert scored.max() <= 10
    assert b.gpu_hours < 0.1 * 200 * (1200 - 120) / 3600


def test_an_invalid_spec_is_left_unmanaged() -> None:
    w = demo(0.2)
    specs = dict(w.specs)
    specs["code"] = SpecError("code", "slotwise.io/slo-latency-ms: broken on purpose")
    b = lb.lower_bound(dataclasses.replace(w, specs=specs), default_cluster(w, 10.0))
    assert b.per_model_gpu_hours["code"] == 0.0
    assert "invalid spec" in b.unattainable_reason["code"]


def test_des_mode_runs_on_forks() -> None:
    w = toy(bursts=((10, 12, 4.75),), minutes=16)
    cfg = SimConfig(mode="des", seed=3)
    b = lb.lower_bound(w, NODES, cfg, rule="tick")
    # Poisson arrivals, random routing: a tick's need is noisy (here from 4 to 31), but every minute is met, and the
    # quiet minutes hold min_replicas.
    assert b.attainable.all()
    assert (b.serving[0, 60:72] > 1).all() and b.serving[0, 12:60].max() == 1
    assert np.array_equal(lb.lower_bound(w, NODES, cfg, rule="tick").serving, b.serving)  # forks replay the RNG


# ------------------------------------------------------------------------------------------------ the claim


def _check_claim(w: SimWorkload, nodes: list, cfg: SimConfig) -> dict[str, bool]:
    """Every policy whose SLO-meeting minutes cover the attainable ones holds at least the bound (instant-start
    policies: the bound without a cold start). If none does, a static fleet at max_replicas does, above the bound."""
    bound = lb.lower_bound(w, nodes, cfg)
    instant = lb.lower_bound(w, nodes, cfg, instant_start=True)
    assert instant.gpu_hours <= bound.gpu_hours + 1e-9
    results, _ = run_policies(w, nodes, POLICIES, cfg, quiet=True)
    covered = {}
    for r in results:
        ref = instant if make_policy(r.policy).instant_start else bound
        covered[r.policy] = lb.covers(r, ref)
        if covered[r.policy]:
            assert r.gpu_hours >= ref.gpu_hours - 1e-9, (r.policy, r.gpu_hours, ref.gpu_hours)
    if not any(covered.values()):
        top = {x: s.max_replicas for x, s in served_as(w.specs).items()}
        gpus = sum(top.values()) * max(s.gpus_per_replica for s in served_as(w.specs).values())
        big = nodes_from_spec(f"{8 * math.ceil(gpus / 8)}xH100-80GB:mig")
        r = simulate(w, big, make_policy("static", replicas_by_model=top), cfg)
        assert lb.covers(r, bound)
        assert r.gpu_hours >= bound.gpu_hours
    return covered


def test_no_policy_that_meets_every_attainable_minute_is_below_the_bound_toy() -> None:
    w = toy(bursts=((8, 10, 4.75), (14, 15, 2.0)), minutes=24, base_rate=0.2)
    covered = _check_claim(w, NODES, SimConfig())
    assert covered["static"]  # sized for the peak all along: it meets every minute


@pytest.mark.slow
def test_no_policy_that_meets_every_attainable_minute_is_below_the_bound_demo() -> None:
    w = demo(0.35)
    _check_claim(w, default_cluster(w, 10.0), SimConfig())


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000))
def test_no_static_fleet_or_oracle_that_meets_every_attainable_minute_is_below_the_bound(seed: int) -> None:
    """Random bursty rate series: the oracle (clairvoyant, instant start, sized per tick) against the bound without
    a cold start; static fleets of every size around the bound's peak against the bound."""
    rng = np.random.default_rng(seed)
    rates = rng.gamma(0.7, 1.5, (2, 20))
    w = toy(minutes=20)
    specs = {f"m{i}": dataclasses.replace(w.specs["toy"], name=f"m{i}", slo_latency_ms=float(rng.uniform(150, 600)),
                                          concurrency=int(rng.integers(1, 5))) for i in range(2)}
    profiles = [ServiceProfile(occupancy_s=rng.exponential(0.1, 32), latency_part_s=np.zeros(32),
                               concurrency=s.concurrency, slo_s=s.slo_latency_s, percentile=95.0)
                for s in specs.values()]
    profiles = [dataclasses.replace(p, latency_part_s=p.occupancy_s) for p in profiles]
    names = tuple(specs)
    w = SimWorkload(RateSeries(rates, names, 60.0), dict(specs), Workload.from_rates(names, rates, 60.0, profiles))
    cfg = SimConfig()
    nodes = nodes_from_spec("64xH100-80GB:mig")
    bound = lb.lower_bound(w, nodes, cfg)
    instant = lb.lower_bound(w, nodes, cfg, instant_start=True)
    oracle = simulate(w, nodes, make_policy("oracle"), cfg)
    if lb.covers(oracle, instant):
        assert oracle.gpu_hours >= instant.gpu_hours
    peak = bound.serving.max(axis=1)
    any_covers = False
    for extra in (-2, -1, 0, 1, 3):
        fleet = {x: int(max(1, peak[i] + extra)) for i, x in enumerate(names)}
        r = simulate(w, nodes, make_policy("static", replicas_by_model=fleet), cfg)
        if lb.covers(r, bound):
            any_covers = True
            assert r.gpu_hours >= bound.gpu_hours
    assert any_covers  # at least the fleet a few above the bound's peak
