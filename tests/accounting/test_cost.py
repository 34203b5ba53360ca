"""Cost attribution: GPU-equivalent fractions, the price table, per team/namespace/model usage, idle reserved
capacity, the exported counters, and the simulator's accounting (checked against the pure functions and against
its own ``gpu_hours``)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from autoscaler.accounting.cost import (
    UNKNOWN_TEAM,
    Usage,
    idle,
    idle_reserved,
    price_table,
    slot_fraction,
    usage,
)
from autoscaler.api.plan import PlaceReplica, Plan, RemoveReplica
from autoscaler.api.snapshot import ClusterSnapshot, ModelObservation, Replica
from autoscaler.api.spec import ModelSpec, SpecError, SpecProblem, slot_request
from autoscaler.live.cost_metrics import CostMetrics
from autoscaler.policies import make_policy
from autoscaler.sim.cluster import SimCluster
from autoscaler.sim.run import SimConfig, simulate
from autoscaler.sim.scorecard import scorecard
from autoscaler.sim.workload import build_workload
from forecasting.traces.model import RateSeries
from sharing.catalog import load_catalog
from sharing.cluster import nodes_from_spec
from sharing.packer import CostAwarePacker
from sharing.slots import Inventory, NodeSpec, Slot

CAT = load_catalog()
H100 = CAT.get("H100-80GB")
L4 = CAT.get("L4-24GB")
A100 = CAT.get("A100-80GB")


# ------------------------------------------------------------------------------------------------ fractions


def test_whole_slots_cost_their_gpu_count() -> None:
    assert slot_fraction(Slot.whole("n", 0, H100)) == 1.0
    assert slot_fraction(Slot.whole("n", [0, 1, 2], H100)) == 3.0


@pytest.mark.parametrize(("gpu", "profile", "fraction"), [
    (H100, "1g", 1 / 7), (H100, "1g.2mem", 1 / 7), (H100, "2g", 2 / 7), (H100, "3g", 3 / 7), (H100, "4g", 4 / 7),
    (H100, "7g", 1.0), (A100, "3g", 3 / 7),
])
def test_a_mig_instance_costs_its_compute_share(gpu, profile: str, fraction: float) -> None:  # type: ignore[no-untyped-def]
    s = Slot.mig("n", 0, gpu, profile, 0)
    assert slot_fraction(s) == pytest.approx(fraction)
    assert slot_fraction(s) == pytest.approx(s.gpu_fraction)  # the simulator's gpu_hours count the same


def test_a_time_slice_share_costs_its_fraction() -> None:
    assert slot_fraction(Slot.share("n", 0, L4, memory_gib=6.0, compute_fraction=0.25)) == 0.25
    # a share inside a MIG instance: its fraction of the whole GPU, not of the instance
    inside = Slot.share("n", 0, H100, memory_gib=10.0, compute_fraction=1 / 7, profile="3g", start=0)
    assert slot_fraction(inside) == pytest.approx(1 / 7)


# ------------------------------------------------------------------------------------------------ prices


def test_price_table_defaults_are_the_catalogs() -> None:
    table = price_table(CAT)
    assert set(table) == set(CAT.names())
    assert table["H100-80GB"] == H100.price_per_hour and table["L4-24GB"] == L4.price_per_hour


@pytest.mark.parametrize("alias", ["H100-80GB", "H100", "NVIDIA-H100-80GB-HBM3", "h100-80gb"])
def test_price_overrides_accept_any_name_and_land_on_the_canonical_kind(alias: str) -> None:
    table = price_table(CAT, {alias: 2.25, "nvidia-l4": 0.5})
    assert table["H100-80GB"] == 2.25
    assert table["L4-24GB"] == 0.5
    assert table["A100-80GB"] == A100.price_per_hour  # untouched kinds keep the default
    assert alias not in table or alias == "H100-80GB"


def test_price_overrides_reject_unknown_kinds_and_negative_prices() -> None:
    with pytest.raises(ValueError, match="unknown GPU kind 'Z900'"):
        price_table(CAT, {"Z900": 1.0})
    with pytest.raises(ValueError, match="non-negative"):
        price_table(CAT, {"H100": -1.0})


# ------------------------------------------------------------------------------------------------ usage, idle


def _obs(key: str, team: str | None, slots: list[Slot | None], spec_ok: bool = True) -> ModelObservation:
    ns, name = key.split("/") if "/" in key else ("serving", key)
    reps = tuple(Replica(f"{key}-{i}", s, ready=True, started_at=0.0) for i, s in enumerate(slots))
    if not spec_ok:
        err = SpecError(key, [SpecProblem("slo-p95-ms", "abc", "not a number")])
        return ModelObservation(key, None, len(slots), reps, spec_error=err)
    return ModelObservation(key, ModelSpec(name, ns, team=team or "default"), len(slots), reps)


def cluster_snapshot(llm_team: str = "chat", with_embed: bool = True) -> ClusterSnapshot:
    """n1: 2 plain H100 under one 2-GPU replica; n2: 2 MIG H100 (3g + 1g on gpu0, a 7g on gpu1); n3: 1 L4 with a
    0.25 share; n4: 4 H100 with only an unmanaged pod (not inference's reservation)."""
    inv = Inventory.from_nodes([
        NodeSpec("n1", "H100-80GB", 2), NodeSpec("n2", "H100-80GB", 2, mig_enabled=True), NodeSpec("n3", "L4", 1),
        NodeSpec("n4", "H100-80GB", 4),
    ])
    ranker = Slot.whole("n1", [0, 1], H100)
    embed = Slot.mig("n2", 0, H100, "3g", 0)
    llm_mig = Slot.mig("n2", 0, H100, "1g", 4)
    llm_share = Slot.share("n3", 0, L4, memory_gib=10.0, compute_fraction=0.25)
    bad = Slot.mig("n2", 1, H100, "7g", 0)
    other = Slot.whole("n4", 0, H100)
    for owner, slot in [("prod/ranker-0", ranker), ("prod/embed-0", embed), ("chat/llm-0", llm_mig),
                        ("chat/llm-1", llm_share), ("bad/x-0", bad), ("kube:some-pod", other)]:
        if owner.startswith("prod/embed") and not with_embed:
            continue
        inv.allocate(slot, owner)
    models = {
        "prod/ranker": _obs("prod/ranker", "search", [ranker]),
        "chat/llm": _obs("chat/llm", llm_team, [llm_mig, llm_share]),
        "bad/x": _obs("bad/x", None, [bad], spec_ok=False),
    }
    if with_embed:
        models["prod/embed"] = _obs("prod/embed", "search", [embed, None])  # the second one is Pending
    return ClusterSnapshot(now=0.0, models=models, inventory=inv)


def test_usage_groups_by_team_namespace_model_and_kind() -> None:
    rows = usage(cluster_snapshot())
    got = {(u.team, u.namespace, u.model, u.gpu_model): u.gpus for u in rows}
    assert got == pytest.approx({
        ("search", "prod", "prod/ranker", "H100-80GB"): 2.0,
        ("search", "prod", "prod/embed", "H100-80GB"): 3 / 7,  # the Pending replica holds nothing
        ("chat", "chat", "chat/llm", "H100-80GB"): 1 / 7,
        ("chat", "chat", "chat/llm", "L4-24GB"): 0.25,
        (UNKNOWN_TEAM, "bad", "bad/x", "H100-80GB"): 1.0,  # invalid annotations: its team cannot be read
    })
    assert all(isinstance(u, Usage) for u in rows)
    # an unmanaged pod is nobody's cost
    assert sum(u.gpus for u in rows) == pytest.approx(2 + 3 / 7 + 1 / 7 + 0.25 + 1)


def test_a_plain_model_name_takes_the_namespace_from_its_spec() -> None:
    inv = Inventory.from_nodes([NodeSpec("n", "L4", 1)])
    s = Slot.whole("n", 0, L4)
    inv.allocate(s, "conv-0")
    snap = ClusterSnapshot(0.0, {"conv": _obs("conv", "assist", [s])}, inv)
    assert usage(snap) == [Usage("assist", "serving", "conv", "L4-24GB", 1.0)]


def test_idle_is_free_capacity_on_nodes_holding_inference_only() -> None:
    snap = cluster_snapshot()
    got = idle_reserved(snap)
    # n1 full, n2: gpu0 has 3/7 + 1/7 taken, gpu1 is a full 7g; n3: 0.75 of the L4 free; n4 is not inference's
    assert got == pytest.approx({"H100-80GB": 3 / 7, "L4-24GB": 0.75})
    # n4 with its 3 idle GPUs would count if inference held something there
    assert idle(snap.inventory, ["n4"]) == pytest.approx({"H100-80GB": 3.0})
    # an allocation nobody manages still uses its device: capacity running other work is not idle
    assert idle(snap.inventory, ["n1", "n4"]) == pytest.approx({"H100-80GB": 3.0})


# ------------------------------------------------------------------------------------------------ counters


def _v(reg: CollectorRegistry, name: str, **labels: str) -> float | None:
    return reg.get_sample_value(name, labels)


def test_cost_metrics_accumulate_over_two_records() -> None:
    reg = CollectorRegistry()
    cm = CostMetrics(reg, CAT, prices={"H100": 2.0, "nvidia-l4": 1.0})
    snap = cluster_snapshot()
    cm.record(snap, 10.0)
    cm.record(snap, 20.0)
    slot = "slotwise_gpu_slot_seconds_total"
    assert _v(reg, slot, team="search", namespace="prod", model="prod/ranker", gpu_model="H100-80GB") == \
        pytest.approx(60.0)
    assert _v(reg, slot, team="chat", namespace="chat", model="chat/llm", gpu_model="L4-24GB") == pytest.approx(7.5)
    assert _v(reg, slot, team="chat", namespace="chat", model="chat/llm", gpu_model="H100-80GB") == \
        pytest.approx(30 / 7)
    cost = "slotwise_gpu_cost_dollars_total"
    assert _v(reg, cost, team="search", namespace="prod", model="prod/ranker") == pytest.approx(60 * 2.0 / 3600)
    assert _v(reg, cost, team="chat", namespace="chat", model="chat/llm") == \
        pytest.approx((30 / 7 * 2.0 + 7.5 * 1.0) / 3600)
    assert _v(reg, cost, team=UNKNOWN_TEAM, namespace="bad", model="bad/x") == pytest.approx(30 * 2.0 / 3600)
    idle_name = "slotwise_gpu_idle_seconds_total"
    assert _v(reg, idle_name, gpu_model="H100-80GB") == pytest.approx(30 * 3 / 7)
    assert _v(reg, idle_name, gpu_model="L4-24GB") == pytest.approx(30 * 0.75)
    assert _v(reg, "slotwise_gpu_price_dollars_per_hour", gpu_model="H100-80GB") == 2.0
    assert _v(reg, "slotwise_gpu_price_dollars_per_hour", gpu_model="L4-24GB") == 1.0
    assert _v(reg, "slotwise_gpu_price_dollars_per_hour", gpu_model="A100-80GB") is None  # not in the cluster


def test_models_that_leave_or_change_team_lose_their_old_series() -> None:
    reg = CollectorRegistry()
    cm = CostMetrics(reg, CAT)
    cm.record(cluster_snapshot(), 10.0)
    ranker = {"team": "search", "namespace": "prod", "model": "prod/ranker"}
    before = _v(reg, "slotwise_gpu_cost_dollars_total", **ranker)
    # embed leaves, llm moves to another team
    cm.record(cluster_snapshot(llm_team="assistants", with_embed=False), 10.0)
    slot = "slotwise_gpu_slot_seconds_total"
    assert _v(reg, slot, team="search", namespace="prod", model="prod/embed", gpu_model="H100-80GB") is None
    assert _v(reg, "slotwise_gpu_cost_dollars_total", team="search", namespace="prod", model="prod/embed") is None
    assert _v(reg, slot, team="chat", namespace="chat", model="chat/llm", gpu_model="L4-24GB") is None
    assert _v(reg, "slotwise_gpu_cost_dollars_total", team="chat", namespace="chat", model="chat/llm") is None
    # the new identity counts from its first record
    assert _v(reg, slot, team="assistants", namespace="chat", model="chat/llm", gpu_model="L4-24GB") == \
        pytest.approx(2.5)
    assert _v(reg, "slotwise_gpu_cost_dollars_total", **ranker) == pytest.approx(2 * before)
    # a non-positive or unknown interval refreshes the series and charges nothing
    cm.record(cluster_snapshot(llm_team="assistants", with_embed=False), math.nan)
    cm.record(cluster_snapshot(llm_team="assistants", with_embed=False), -5.0)
    assert _v(reg, "slotwise_gpu_cost_dollars_total", **ranker) == pytest.approx(2 * before)


def test_a_model_holding_nothing_has_a_zero_cost_series() -> None:
    reg = CollectorRegistry()
    inv = Inventory.from_nodes([NodeSpec("n", "L4", 1)])
    snap = ClusterSnapshot(0.0, {"ns/idle": _obs("ns/idle", "t", [])}, inv)
    CostMetrics(reg, CAT).record(snap, 60.0)
    assert _v(reg, "slotwise_gpu_cost_dollars_total", team="t", namespace="ns", model="ns/idle") == 0.0
    # no replica anywhere: no node is inference's, nothing is idle reserved
    assert _v(reg, "slotwise_gpu_idle_seconds_total", gpu_model="L4-24GB") == 0.0


# ------------------------------------------------------------------------------------------------ simulator


SLICE = ModelSpec(name="a", slo_latency_ms=500, gpu_memory_gib=20, gpu_compute_share=0.25, service_time_ms=100,
                  cold_start_s=60, team="search")
WHOLE = ModelSpec(name="b", slo_latency_ms=500, service_time_ms=100, cold_start_s=60, team="chat",
                  namespace="llm")


def test_sim_cluster_accounting_matches_the_pure_functions() -> None:
    """The simulator keeps per-model and idle holdings incrementally; after every change they equal what
    autoscaler.accounting.cost computes from the snapshot."""
    nodes = nodes_from_spec("8xH100-80GB:mig,2xL4,2xA100-80GB")
    specs = {"a": SLICE, "b": WHOLE}
    cluster = SimCluster(nodes, ["a", "b"], specs, drain_s=np.array([0.0, 0.0]))
    packer = CostAwarePacker()

    def check(now: float) -> None:
        snap = cluster.snapshot(now)
        want = np.zeros_like(cluster.held)
        for u in usage(snap):
            want[cluster.index[u.model], cluster.gpu_kinds.index(u.gpu_model)] += u.gpus
        np.testing.assert_allclose(cluster.held, want, atol=1e-12)
        free = idle_reserved(snap)
        np.testing.assert_allclose(cluster.idle_by_kind(), [free.get(k, 0.0) for k in cluster.gpu_kinds],
                                   atol=1e-12)
        assert cluster.held.sum() == pytest.approx(cluster.gpus_allocated())

    check(0.0)
    placed: list[tuple[str, str]] = []
    now = 0.0
    for step in range(12):
        now += 10.0
        name = "a" if step % 3 else "b"
        scratch = cluster.inventory.copy()
        slot = packer.place(scratch, slot_request(specs[name]))
        assert slot is not None
        rid = f"{name}-{step}"
        cluster.apply(Plan(now, [PlaceReplica(name, rid, slot)]))
        placed.append((name, rid))
        check(now)
    assert len(set(cluster.gpu_kinds)) == 3
    for name, rid in placed[::2]:  # remove every other (starting ones are freed at once)
        now += 1.0
        cluster.apply(Plan(now, [RemoveReplica(name, rid)]))
        cluster.advance(now)
        check(now)


def _static_two_models(nodes_spec: str, duration: float = 1800.0) -> tuple:  # type: ignore[type-arg]
    series = RateSeries(rates=np.full((2, int(duration // 60)), 1.0), models=("a", "b"), step_s=60.0)
    workload = build_workload(series, {"a": SLICE, "b": WHOLE})
    policy = make_policy("static", replicas_by_model={"a": 4, "b": 2})
    res = simulate(workload, nodes_from_spec(nodes_spec), policy, SimConfig(burn_in_s=0.0, warmup_s=0.0))
    return res, scorecard(res)


def test_static_run_costs_replicas_times_fraction_times_price() -> None:
    res, card = _static_two_models("8xH100-80GB:mig")
    hours = 0.5
    slice_frac = 2 / 7  # 20 GiB at >= 0.25 compute on an H100: a 2g.20gb
    cost = card["cost"]
    a, b = card["per_model"]["a"], card["per_model"]["b"]
    assert a["gpu_hours_by_kind"] == {"H100-80GB": pytest.approx(4 * slice_frac * hours)}
    assert b["gpu_hours_by_kind"] == {"H100-80GB": pytest.approx(2 * 1.0 * hours)}
    price = H100.price_per_hour
    assert cost["prices_usd_per_gpu_hour"] == {"H100-80GB": price}
    assert a["cost_usd"] == pytest.approx(4 * slice_frac * hours * price)
    assert (a["team"], a["namespace"], b["team"], b["namespace"]) == ("search", "default", "chat", "llm")
    assert cost["by_team"]["search"]["cost_usd"] == pytest.approx(a["cost_usd"])
    assert cost["by_team"]["chat"]["models"] == ["b"]
    # one node of 8 GPUs holds both models: the rest of it is idle reserved
    idle_gpus = 8 - 4 * slice_frac - 2
    assert cost["idle_gpu_hours_by_kind"] == {"H100-80GB": pytest.approx(idle_gpus * hours)}
    assert card["idle_cost_usd"] == pytest.approx(idle_gpus * hours * price)
    assert cost["hours"] == pytest.approx(hours)
    # attributed GPU-hours are exactly what gpu_hours counts; held + idle = the node, all the time
    assert a["gpu_hours"] + b["gpu_hours"] == pytest.approx(res.gpu_hours)
    assert card["serving_cost_usd"] == pytest.approx(res.gpu_hours * price)
    # cost is serving + idle: here the whole node, all the time
    assert card["cost_usd"] == card["serving_cost_usd"] + card["idle_cost_usd"] == pytest.approx(8 * hours * price)
    assert cost["serving_gpu_hours"] + cost["idle_gpu_hours"] == cost["total_gpu_hours"] == pytest.approx(8 * hours)


def test_idle_counts_only_nodes_holding_replicas() -> None:
    # one replica on a cluster of two nodes of different kinds: the node it is not on is nobody's reservation
    series = RateSeries(rates=np.full((1, 30), 0.5), models=("a",), step_s=60.0)
    workload = build_workload(series, {"a": SLICE})
    res = simulate(workload, nodes_from_spec("8xH100-80GB:mig,4xL4"), make_policy("static", replicas=1),
                   SimConfig(burn_in_s=0.0, warmup_s=0.0))
    cost = scorecard(res)["cost"]
    (kind,) = scorecard(res)["per_model"]["a"]["gpu_hours_by_kind"]
    other = ({"H100-80GB", "L4-24GB"} - {kind}).pop()
    gpus = {"H100-80GB": 8, "L4-24GB": 4}[kind]
    assert cost["idle_gpu_hours_by_kind"][other] == 0.0
    assert cost["idle_gpu_hours_by_kind"][kind] == pytest.approx(gpus * 0.5 - res.gpu_hours)
