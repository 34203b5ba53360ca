"""The simulator: SimCluster (cold start, drain), SimMetrics (the window), and simulate() end to end
on small synthetic traces built with the canonical trace types."""

from __future__ import annotations

import math
from itertools import pairwise

import numpy as np
import pytest

from autoscaler.api.plan import PlaceReplica, Plan, Reason, RemoveReplica, ScaleModel
from autoscaler.api.spec import ModelSpec, SpecError, slot_request
from autoscaler.policies import make_policy
from autoscaler.sim.cluster import SimCluster
from autoscaler.sim.defaults import model_specs
from autoscaler.sim.metrics import SimMetrics
from autoscaler.sim.run import SimConfig, SimResult, simulate
from autoscaler.sim.scorecard import COLUMNS, scorecard
from autoscaler.sim.workload import build_workload, peak_replicas
from forecasting.traces.model import RateSeries, RequestLog
from sharing.cluster import nodes_from_spec
from sharing.packer import FirstFitPacker
from sharing.slots import Inventory

# ------------------------------------------------------------------------------------------------ helpers

SLICE = ModelSpec(
    name="a",
    slo_latency_ms=500,
    gpu_memory_gib=20,
    gpu_compute_share=0.25,
    service_time_ms=100,
    cold_start_s=60,
    concurrency=1,
)


def first_fit_slots(nodes: list, spec: ModelSpec, n: int) -> list:
    inv = Inventory.from_nodes(nodes)
    out = []
    for k in range(n):
        s = FirstFitPacker().place(inv, slot_request(spec))
        assert s is not None
        inv.allocate(s, f"x{k}")
        out.append(s)
    return out


def make_cluster(
    spec: ModelSpec = SLICE, nodes_spec: str = "2xH100-80GB:mig", drain: float = 20.0, instant: bool = False
) -> tuple[SimCluster, list]:
    nodes = nodes_from_spec(nodes_spec)
    return SimCluster(nodes, [spec.name], {spec.name: spec}, np.array([drain]), instant_start=instant), nodes


def poisson_log(rates: dict[str, float], duration_s: float, seed: int = 1) -> RequestLog:
    rng = np.random.default_rng(seed)
    ts, mis = [], []
    for i, r in enumerate(rates.values()):
        n = rng.poisson(r * duration_s)
        ts.append(rng.uniform(0.0, duration_s, n))
        mis.append(np.full(n, i, dtype=np.int32))
    t = np.concatenate(ts)
    mi = np.concatenate(mis)
    order = np.argsort(t, kind="stable")
    return RequestLog(t=t[order], model_index=mi[order], models=tuple(rates))


def run(trace, specs, policy, nodes_spec="16xH100-80GB", **cfg) -> SimResult:  # type: ignore[no-untyped-def]
    workload = build_workload(trace, specs)
    cfg.setdefault("burn_in_s", 0.0)  # these tests check the mechanics from t = 0
    return simulate(workload, nodes_from_spec(nodes_spec), policy, SimConfig(**cfg))


# ------------------------------------------------------------------------------------------------ SimCluster


def test_replica_becomes_routable_exactly_after_cold_start() -> None:
    cluster, nodes = make_cluster()
    (slot,) = first_fit_slots(nodes, SLICE, 1)
    plan = Plan(now=100.0, actions=[PlaceReplica("a", "a-1", slot), ScaleModel("a", 1, 0, Reason.REACTIVE)])
    cluster.apply(plan)
    assert cluster.gpus_allocated() == pytest.approx(slot.gpu_fraction)  # paid from placement on
    assert cluster.desired[0] == 1 and cluster.scale_events == 1 and cluster.reasons == {"reactive": 1}
    for now in (100.0, 130.0, 159.9):
        assert cluster.advance(now)[0] == 0, f"routable at {now}, before the 60 s cold start"
        (rep,) = cluster.snapshot(now).models["a"].replicas
        assert not rep.ready and rep.started_at == 100.0
    assert cluster.advance(160.0)[0] == 1
    o = cluster.snapshot(160.0).models["a"]
    assert o.ready_replicas == 1 and o.active_replicas == 1 and o.desired_replicas == 1


def test_a_replica_starts_as_it_is_served_whatever_the_controller_was_told() -> None:
    """A what-if's declared spec (SimWorkload.declared) is what the controller reads; the replica is the served one: it
    becomes Ready after the served cold start (60 s), not the declared 5 s, and the snapshot shows the declared spec."""
    nodes = nodes_from_spec("2xH100-80GB:mig")
    told = SLICE.with_(cold_start_s=5.0)
    cluster = SimCluster(nodes, ["a"], {"a": told}, np.array([20.0]), served={"a": SLICE})
    (slot,) = first_fit_slots(nodes, SLICE, 1)
    cluster.apply(Plan(now=100.0, actions=[PlaceReplica("a", "a-1", slot)]))
    assert cluster.advance(105.0)[0] == 0 and cluster.advance(159.9)[0] == 0
    assert cluster.advance(160.0)[0] == 1
    assert cluster.snapshot(160.0).models["a"].spec is told


def test_placed_replica_holds_its_slot_in_the_inventory() -> None:
    cluster, nodes = make_cluster(nodes_spec="1xH100-80GB:mig")
    slots = first_fit_slots(nodes, SLICE, 2)
    cluster.apply(Plan(0.0, [PlaceReplica("a", "a-1", slots[0])]))
    assert not cluster.inventory.fits(slots[0])
    assert cluster.snapshot(0.0).inventory.slots_of("a-1") == [slots[0]]


def test_drain_frees_the_slot_only_after_the_drain_time() -> None:
    cluster, nodes = make_cluster(drain=20.0)
    (slot,) = first_fit_slots(nodes, SLICE, 1)
    cluster.apply(Plan(0.0, [PlaceReplica("a", "a-1", slot)]))
    cluster.advance(60.0)
    assert cluster.routable[0] == 1
    # The model's in-flight work needs 20 s (its drain time): the slot is held 20 s.
    cluster.apply(Plan(100.0, [RemoveReplica("a", "a-1"), ScaleModel("a", 0, 1, Reason.REACTIVE)]))
    assert cluster.routable[0] == 0, "a draining replica gets no new traffic"
    o = cluster.snapshot(100.0).models["a"]
    assert o.active_replicas == 0 and o.replicas[0].draining
    for now in (100.0, 110.0, 119.9):
        cluster.advance(now)
        assert cluster.gpus_allocated() == pytest.approx(slot.gpu_fraction)
        assert not cluster.inventory.fits(slot)
    cluster.advance(120.0)
    assert cluster.gpus_allocated() == pytest.approx(0.0)
    assert cluster.inventory.fits(slot)
    assert cluster.snapshot(120.0).models["a"].replicas == ()


def test_drain_time_is_the_simulators_not_the_plans() -> None:
    # The plan carries no drain timeout (on Kubernetes the pod's grace period governs): the simulator's per-model
    # drain time (in-flight work, at most SimConfig.drain_timeout_s) does.
    cluster, nodes = make_cluster(drain=30.0)
    (slot,) = first_fit_slots(nodes, SLICE, 1)
    cluster.apply(Plan(0.0, [PlaceReplica("a", "a-1", slot)]))
    cluster.advance(60.0)
    cluster.apply(Plan(100.0, [RemoveReplica("a", "a-1")]))
    cluster.advance(129.0)
    assert not cluster.inventory.fits(slot)
    cluster.advance(130.0)
    assert cluster.inventory.fits(slot)


def test_removing_a_starting_replica_frees_it_at_once_and_it_never_turns_ready() -> None:
    cluster, nodes = make_cluster()
    (slot,) = first_fit_slots(nodes, SLICE, 1)
    cluster.apply(Plan(0.0, [PlaceReplica("a", "a-1", slot)]))
    cluster.apply(Plan(10.0, [RemoveReplica("a", "a-1")]))
    assert cluster.gpus_allocated() == pytest.approx(0.0) and cluster.inventory.fits(slot)
    assert cluster.advance(1000.0)[0] == 0
    # Removing it again is idempotent.
    cluster.apply(Plan(20.0, [RemoveReplica("a", "a-1")]))
    assert cluster.routable[0] == 0


def test_instant_start_is_ready_and_drains_at_once() -> None:
    cluster, nodes = make_cluster(instant=True, drain=20.0)
    (slot,) = first_fit_slots(nodes, SLICE, 1)
    cluster.apply(Plan(50.0, [PlaceReplica("a", "a-1", slot)]))
    assert cluster.advance(50.0)[0] == 1
    cluster.apply(Plan(70.0, [RemoveReplica("a", "a-1")]))
    cluster.advance(70.0)
    assert cluster.routable[0] == 0 and cluster.inventory.fits(slot)


def test_preplace_is_ready_and_not_a_scale_event() -> None:
    cluster, nodes = make_cluster()
    slots = first_fit_slots(nodes, SLICE, 3)
    cluster.preplace("a", slots)
    assert cluster.routable[0] == 3 and cluster.scale_events == 0
    assert cluster.gpus_allocated() == pytest.approx(sum(s.gpu_fraction for s in slots))
    o = cluster.snapshot(0.0).models["a"]
    assert o.ready_replicas == 3 and o.desired_replicas == 3


def test_invalid_spec_is_observed_as_such() -> None:
    err = SpecError("default/a", [])
    nodes = nodes_from_spec("1xH100-80GB")
    cluster = SimCluster(nodes, ["a"], {"a": err}, np.array([1.0]))
    o = cluster.snapshot(0.0).models["a"]
    assert o.spec is None and o.spec_error is err


# ------------------------------------------------------------------------------------------------ SimMetrics


def test_metrics_window_oldest_first_and_bounded() -> None:
    m = SimMetrics(["a", "b"], step_s=10.0, size=3, warmup=1)
    for k in range(1, 6):
        m.push(np.array([k, 10 * k]), np.array([0.5 * k, 0.0]), np.array([0.1 * k, np.nan]))
    w = m.window(50.0)
    assert w.now == 50.0 and w.step_s == 10.0
    np.testing.assert_array_equal(w.models["a"].rate, [3, 4, 5])
    np.testing.assert_array_equal(w.models["b"].rate, [30, 40, 50])
    np.testing.assert_array_equal(w.models["a"].in_flight, [1.5, 2.0, 2.5])
    assert w.models["a"].latency_s == pytest.approx(0.5)
    assert math.isnan(w.models["b"].latency_s)
    assert not w.models["a"].stale and w.models["a"].future_rate is None


def test_metrics_partial_window_has_only_what_was_pushed() -> None:
    m = SimMetrics(["a"], step_s=10.0, size=5, warmup=1)
    assert len(m.window(0.0).models["a"].rate) == 0
    m.push(np.array([7.0]), np.array([1.0]), np.array([0.2]))
    m.push(np.array([8.0]), np.array([1.0]), np.array([0.2]))
    np.testing.assert_array_equal(m.window(20.0).models["a"].rate, [7.0, 8.0])


def test_metrics_stale_until_warm_and_on_fault() -> None:
    m = SimMetrics(["a", "b"], step_s=10.0, size=10, warmup=3)
    for k in range(3):
        assert all(x.stale for x in m.window(10.0 * k).models.values()), f"not stale after {k} samples"
        m.push(np.ones(2), np.ones(2), np.ones(2))
    assert not any(x.stale for x in m.window(30.0).models.values())
    m.stale[1] = True
    w = m.window(30.0)
    assert not w.models["a"].stale and w.models["b"].stale


def test_metrics_future_rate_only_when_set() -> None:
    m = SimMetrics(["a", "b"], step_s=10.0, size=4)
    m.future_rate = np.array([3.0, 4.0])
    w = m.window(0.0)
    assert w.models["a"].future_rate == 3.0 and w.models["b"].future_rate == 4.0


# ------------------------------------------------------------------------------------------------ simulate()


def check_card(card: dict) -> None:
    for key in COLUMNS:
        assert key in card, key
    for key in ("slo_attainment", "slo_minutes_met", "requests_within_latency", "fragmentation"):
        assert 0.0 <= card[key] <= 1.0, (key, card[key])
    assert card["gpu_hours"] >= 0 and card["unplaced_replica_minutes"] >= 0 and card["scale_events"] >= 0
    assert card["sim_wall_s"] > 0 and card["lent_gpu_hours"] == 0.0
    assert card["gpus_total"] > 0
    for pm in card["per_model"].values():
        assert 0.0 <= pm["slo_attainment"] <= 1.0
        assert pm["latency_at_slo_percentile_s"] is None or pm["latency_at_slo_percentile_s"] >= 0
        assert pm["mean_replicas"] >= 0


@pytest.mark.parametrize("mode", ["fluid", "des"])
def test_requests_are_conserved(mode: str) -> None:
    log = poisson_log({"a": 5.0, "b": 2.0}, 600.0)
    specs = {"a": SLICE, "b": SLICE.with_(name="b")}
    res = run(log, specs, make_policy("slotwise"), mode=mode, burn_in_s=0.0)
    card = scorecard(res)
    assert card["requests"] == len(log)
    counts = np.bincount(log.model_index, minlength=2)
    assert card["per_model"]["a"]["requests"] == counts[0]
    assert card["per_model"]["b"]["requests"] == counts[1]
    assert res.minute_within.sum() <= res.minute_arrivals.sum() + 1e-9
    check_card(card)


def test_rate_series_requests_are_the_integral_of_the_rates() -> None:
    rates = np.array([[2.0, 4.0, 6.0, 1.0] * 3, [0.5] * 12])
    series = RateSeries(rates=rates, models=("a", "b"), step_s=60.0)
    specs = {"a": SLICE, "b": SLICE.with_(name="b")}
    card = scorecard(run(series, specs, make_policy("hpa")))
    assert card["requests"] == pytest.approx(float(rates.sum() * 60.0))
    check_card(card)


@pytest.mark.parametrize(
    ("spec", "nodes_spec"),
    [
        (SLICE.with_(min_replicas=1), "8xH100-80GB:mig"),  # MIG slices
        (ModelSpec(name="a", slo_latency_ms=500, service_time_ms=100), "8xH100-80GB"),  # whole GPUs
    ],
)
def test_static_gpu_hours_are_replicas_times_slot_times_hours(spec: ModelSpec, nodes_spec: str) -> None:
    n = 4
    duration = 1800.0
    series = RateSeries(rates=np.full((1, 30), 1.0), models=("a",), step_s=60.0)
    res = run(series, {"a": spec}, make_policy("static", replicas=n), nodes_spec=nodes_spec, warmup_s=0.0)
    (slot,) = first_fit_slots(nodes_from_spec(nodes_spec), spec, 1)
    assert res.gpu_hours == pytest.approx(n * slot.gpu_fraction * duration / 3600.0)
    assert res.minute_desired[0, 1:] == pytest.approx(n)
    # Ready after the cold start: routable replicas reach n and stay there.
    assert res.minute_replicas[0, -1] == pytest.approx(n)


def test_static_gpu_hours_with_pinned_spec_and_default_warmup() -> None:
    spec = SLICE.with_(min_replicas=3, max_replicas=3)
    series = RateSeries(rates=np.full((1, 20), 2.0), models=("a",), step_s=60.0)
    res = run(series, {"a": spec}, make_policy("static", replicas=3), nodes_spec="8xH100-80GB:mig")
    (slot,) = first_fit_slots(nodes_from_spec("8xH100-80GB:mig"), spec, 1)
    assert res.gpu_hours == pytest.approx(3 * slot.gpu_fraction * 1200.0 / 3600.0)
    assert res.scale_events == 0


def test_more_replicas_never_lower_slo_attainment() -> None:
    # ~ 25 req/s of 100 ms requests: 1 replica is hopelessly overloaded, 5 is comfortable.
    log = poisson_log({"a": 25.0}, 900.0, seed=3)
    spec = SLICE.with_(min_replicas=1, max_replicas=50)
    att = {}
    for n in (1, 2, 3, 5, 8):
        for mode in ("fluid", "des"):
            res = run(
                log,
                {"a": spec},
                make_policy("static", replicas=n),
                nodes_spec="8xH100-80GB:mig",
                warmup_s=0.0,
                mode=mode,
            )
            att[n, mode] = scorecard(res)["requests_within_latency"]
    for mode in ("fluid", "des"):
        seq = [att[n, mode] for n in (1, 2, 3, 5, 8)]
        assert all(b >= a - 1e-9 for a, b in pairwise(seq)), (mode, seq)
        assert att[5, mode] > att[1, mode] + 0.2, (mode, seq)


def test_oracle_costs_no_more_than_static_peak() -> None:
    t = np.arange(120)
    rates = np.vstack([20 + 18 * np.sin(2 * np.pi * t / 60), 5 + 4 * np.cos(2 * np.pi * t / 40)])
    series = RateSeries(rates=rates, models=("a", "b"), step_s=60.0)
    # SLOs with room above the exponential service's tail (its top prior bin is 4.5x the mean), so the
    # sizing follows the load rather than sitting at the room's cap
    specs = {"a": SLICE.with_(slo_latency_ms=1000), "b": SLICE.with_(name="b", service_time_ms=200,
                                                                   slo_latency_ms=2000)}
    workload = build_workload(series, specs)
    nodes = nodes_from_spec("16xH100-80GB:mig")
    cfg = SimConfig(tick_s=10.0)
    peaks = peak_replicas(workload, cfg.tick_s)
    static = simulate(workload, nodes, make_policy("static", replicas_by_model=peaks), cfg)
    oracle = simulate(workload, nodes, make_policy("oracle"), cfg)
    assert oracle.gpu_hours <= static.gpu_hours
    assert oracle.gpu_hours < 0.9 * static.gpu_hours, "a sinusoidal load leaves the oracle room to save"
    o_card, s_card = scorecard(oracle, oracle.gpu_hours), scorecard(static, oracle.gpu_hours)
    assert o_card["gpu_hours_vs_oracle"] == pytest.approx(1.0)
    assert s_card["gpu_hours_vs_oracle"] >= 1.0
    check_card(o_card)
    check_card(s_card)
    assert o_card["requests"] == pytest.approx(s_card["requests"])


def test_scorecard_all_policies_sane() -> None:
    log = poisson_log({"a": 8.0, "b": 1.0}, 900.0, seed=5)
    specs = {"a": SLICE, "b": SLICE.with_(name="b", gpu_memory_gib=None, gpu_compute_share=1.0)}
    workload = build_workload(log, specs)
    nodes = nodes_from_spec("8xH100-80GB:mig")
    for name in ("slotwise", "hpa", "kpa", "oracle"):
        policy = make_policy(name)
        res = simulate(workload, nodes, policy, SimConfig(tick_s=min(10.0, policy.tick_s), burn_in_s=0.0))
        card = scorecard(res)
        check_card(card)
        assert card["policy"] == name and card["requests"] == len(log)
        assert res.minute_arrivals.shape == (2, 15)
        assert card["gpu_hours"] <= res.gpus_total * 900.0 / 3600.0 + 1e-9


def test_fluid_and_des_agree_on_a_poisson_log() -> None:
    log = poisson_log({"a": 20.0}, 1200.0, seed=7)
    spec = SLICE.with_(slo_latency_ms=300, min_replicas=1)
    out = {}
    for mode in ("fluid", "des"):
        res = run(
            log, {"a": spec}, make_policy("static", replicas=3), nodes_spec="8xH100-80GB:mig", warmup_s=0.0, mode=mode
        )
        out[mode] = scorecard(res)["requests_within_latency"]
    assert out["des"] < 0.999, f"the load should not be trivial: {out}"
    assert abs(out["fluid"] - out["des"]) < 0.04, out


def test_invalid_model_in_models_file_is_reported_while_others_run(tmp_path) -> None:  # type: ignore[no-untyped-def]
    log = poisson_log({"good": 5.0, "bad": 5.0}, 600.0, seed=2)
    models = tmp_path / "models.yaml"
    models.write_text(
        "defaults:\n  slo-latency-ms: 500\n  service-time-ms: 100\n"
        "models:\n  bad:\n    slo-percentile: 100\n    min-replcas: 2\n  good:\n    gpu-memory-gib: 20\n"
    )
    specs = model_specs(log, str(models))
    assert isinstance(specs["good"], ModelSpec) and specs["good"].gpu_memory_gib == 20
    assert isinstance(specs["bad"], SpecError)
    res = run(log, specs, make_policy("slotwise"))
    card = scorecard(res)
    assert set(card["invalid_models"]) == {"bad"}
    assert "slo-percentile" in card["invalid_models"]["bad"] and "min-replcas" in card["invalid_models"]["bad"]
    assert card["per_model"]["good"]["mean_replicas"] >= 1
    assert card["per_model"]["good"]["requests_within_latency"] > 0.9
    # Unmanaged: never given replicas, and its traffic still counts.
    assert card["per_model"]["bad"]["mean_replicas"] == 0
    assert card["requests"] == len(log)


def test_models_file_naming_a_model_not_in_the_trace_is_an_error(tmp_path) -> None:  # type: ignore[no-untyped-def]
    log = poisson_log({"good": 1.0}, 60.0)
    models = tmp_path / "models.yaml"
    models.write_text("models:\n  nope:\n    slo-latency-ms: 5\n")
    with pytest.raises(ValueError, match="nope"):
        model_specs(log, str(models))


def test_same_run_twice_same_result() -> None:
    log = poisson_log({"a": 10.0}, 600.0, seed=11)
    r1 = run(log, {"a": SLICE}, make_policy("slotwise"), mode="des", seed=4)
    r2 = run(log, {"a": SLICE}, make_policy("slotwise"), mode="des", seed=4)
    np.testing.assert_array_equal(r1.minute_within, r2.minute_within)
    np.testing.assert_array_equal(r1.minute_replicas, r2.minute_replicas)
    assert r1.gpu_hours == r2.gpu_hours and r1.scale_events == r2.scale_events


def test_shortfall_lasts_until_the_model_is_no_longer_unplaceable() -> None:
    from autoscaler.api.plan import Shortfall, UpdateStatus

    cluster, _ = make_cluster()
    name = cluster.models[0]
    cluster.apply(Plan(0.0, [Shortfall(name, 2, "full"), UpdateStatus(name, 3, 1, Reason.UNPLACEABLE)]))
    assert cluster.shortfall[0] == 2
    cluster.apply(Plan(10.0, [Shortfall(name, 1, "full")]))  # still unplaceable, smaller gap
    assert cluster.shortfall[0] == 1
    cluster.apply(Plan(20.0, [UpdateStatus(name, 1, 1, Reason.STABLE)]))  # demand fell back to what fits
    assert cluster.shortfall[0] == 0


def test_burn_in_minutes_are_not_scored() -> None:
    log = poisson_log({"a": 5.0, "b": 2.0}, 600.0)
    specs = {"a": SLICE, "b": SLICE.with_(name="b")}
    full = run(log, specs, make_policy("hpa"), burn_in_s=0.0)
    default = run(log, specs, make_policy("hpa"), burn_in_s=None)  # warmup + longest cold start, whole minutes
    expected = 60.0 * np.ceil((60.0 + SLICE.cold_start_s) / 60.0)
    assert default.burn_in_s == expected
    skipped = int(expected // 60)
    assert default.minute_arrivals.shape[1] == full.minute_arrivals.shape[1] - skipped
    np.testing.assert_allclose(default.minute_arrivals, full.minute_arrivals[:, skipped:])
    assert default.gpu_hours < full.gpu_hours


def test_decisions_by_reason_counts_every_decision_also_those_that_change_nothing() -> None:
    # A static fleet scales once (to its fixed count), yet every model decides once a minute (its tick), and says why.
    specs = {"a": SLICE.with_(name="a"), "b": SLICE.with_(name="b")}
    r = run(poisson_log({"a": 3.0, "b": 1.0}, 600.0), specs, make_policy("static", replicas=2))
    card = scorecard(r)
    assert card["scale_events"] <= 2
    # 2 models x 10 one-minute ticks; the first holds (no metrics history yet)
    assert card["decisions_by_reason"] == {"metrics_stale": 2, "static": 2 * 9}
    r = run(poisson_log({"a": 3.0, "b": 1.0}, 600.0), specs, make_policy("slotwise"))
    card = scorecard(r)
    assert sum(card["decisions_by_reason"].values()) == 2 * 60  # every 10 s tick of both models
    assert sum(card["scale_events_by_reason"].values()) == card["scale_events"]


@pytest.mark.parametrize("mode", ["fluid", "des"])
def test_latency_is_reported_at_each_models_own_percentile(mode: str) -> None:
    specs = {"p95": SLICE.with_(name="p95", slo_percentile=95.0), "p99": SLICE.with_(name="p99", slo_percentile=99.0)}
    r = run(poisson_log({"p95": 6.0, "p99": 6.0}, 600.0), specs, make_policy("static", replicas=1), mode=mode)
    card = scorecard(r)
    lat = {m: pm["latency_at_slo_percentile_s"] for m, pm in card["per_model"].items()}
    assert lat["p95"] is not None and lat["p99"] is not None  # (it used to be None for every non-p95 model)
    assert lat["p95"] == pytest.approx(float(r.latency_p95_s[0]))
    # the same load and service: the 99th percentile is the higher one
    assert lat["p99"] >= float(r.latency_p95_s[1])
