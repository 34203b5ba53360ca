"""DRA inventory (``autoscaler.live.kube.dra``, ``translate.build_view(resource_slices=, resource_claims=)``), on
objects shaped as NVIDIA's DRA driver publishes them (tests/realparts/dra.py), and the differential property: the
same cluster described by the device plugin (GPU Feature Discovery labels, ``nvidia.com/*`` capacities and
requests) and by DRA (ResourceSlices, allocated ResourceClaims) gives the same snapshot inventory and the same plan.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from realparts.dra import as_v1beta1, claim, dra_twin, gpu_device, node_slice, resource_slice
from test_kube_translate import NS, T0_EPOCH, deployment, gpu_node, mig_node, pod, view

from autoscaler.api.plan import Plan, UpdateStatus
from autoscaler.api.snapshot import MetricsWindow, ModelMetrics
from autoscaler.decision.config import build_core
from autoscaler.decision.node_actions import NodeActionState
from autoscaler.decision.state import fresh_state
from autoscaler.decision.tick import plan_tick
from autoscaler.live.controller import read_view
from autoscaler.live.kube.dra import DraNode, read_slices
from autoscaler.policies import make_policy
from sharing.catalog import load_catalog
from sharing.render import GPU_PRODUCT
from sharing.slots import Inventory, SlotKind

CAT = load_catalog()
H100, A100, A30, L4 = (CAT.get(k) for k in ("H100-80GB", "A100-80GB", "A30-24GB", "L4-24GB"))
NOW = T0_EPOCH + 3600


def bare_node(name: str) -> dict:
    """A node of a DRA-only pool: no GPU Feature Discovery labels, no device-plugin capacity."""
    cap = {"cpu": "96", "memory": "1056Gi", "pods": "110"}
    return {"kind": "Node", "apiVersion": "v1", "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name},
                                                              "uid": f"uid-{name}"},
            "spec": {}, "status": {"capacity": cap, "allocatable": dict(cap),
                                   "conditions": [{"type": "Ready", "status": "True"}]}}


def dra_pod(name: str, app: str, node: str = "d1", **kw) -> dict:
    return pod(name, app, node=node, gpus={}, **kw)


# -- reading slices ---------------------------------------------------------------------------------------------
def test_whole_gpus_from_slices_read_like_gfd_labels() -> None:
    inv = read_slices([node_slice(A100, "d1", plain=4)], CAT)
    dn = inv.nodes["d1"]
    assert isinstance(dn, DraNode) and not dn.dynamic_mig
    assert (dn.spec.gpu_model, dn.spec.gpu_count, dn.spec.mig_enabled) == ("A100-80GB", 4, False)
    assert dn.spec.labels[GPU_PRODUCT] == "NVIDIA-A100-SXM4-80GB"  # GFD's spelling of "NVIDIA A100-SXM4-80GB"
    assert {d.name: d.index for d in dn.devices.values()} == {f"gpu-{i}": i for i in range(4)}
    assert dn.devices["gpu-0"].memory_gib == 80.0
    assert inv.pool_node == {"d1": "d1"}


def test_static_mig_devices_keep_their_published_placements() -> None:
    # 1g.10gb at 6 alone on GPU 1: a layout the device-plugin path (counts only) would rebuild at start 0
    layout = {0: [("3g", 0), ("3g", 4)], 1: [("1g", 6)]}
    v = view([], [], [bare_node("d1")], resource_slices=[node_slice(H100, "d1", mig=layout, plain=1)])
    inv = v.snapshot.inventory
    assert not v.problems, v.problems
    assert inv.nodes["d1"].gpu_count == 3 and inv.nodes["d1"].mig_enabled
    assert inv.mig_layout("d1", 0) == (("3g", 0), ("3g", 4))
    assert inv.mig_layout("d1", 1) == (("1g", 6),)
    assert not inv.device("d1", 2).mig_enabled and inv.device("d1", 2).idle  # the plain GPU comes after


def test_v1beta1_basic_wrapper_reads_the_same() -> None:
    s = node_slice(H100, "d1", mig={0: [("2g", 0), ("1g", 6)]}, plain=2)
    assert read_slices([as_v1beta1(s)], CAT).nodes["d1"] == read_slices([s], CAT).nodes["d1"]


def test_dynamic_mig_gpu_is_mig_enabled_without_instances_and_claims_make_them() -> None:
    s = node_slice(H100, "d1", dynamic=2)
    dn = read_slices([s], CAT).nodes["d1"]
    assert dn.dynamic_mig and dn.spec.mig_enabled and dn.layout == {0: (), 1: ()}
    p0, p1 = dra_pod("a-0", "a"), dra_pod("b-0", "b")
    claims = [claim(NS, "a-0-gpu", "d1", ["gpu-0-mig-3g40gb-9-4"], pod=p0), claim(NS, "b-0-gpu", "d1", ["gpu-1"],
                                                                                   pod=p1)]
    v = view([deployment("a"), deployment("b")], [p0, p1], [bare_node("d1")], resource_slices=[s],
             resource_claims=claims)
    assert not v.problems, v.problems
    inv = v.snapshot.inventory
    (mig,) = inv.slots_of(f"{NS}/a-0")
    assert (mig.kind, mig.devices, mig.profile, mig.start) == (SlotKind.MIG, (0,), "3g", 4)
    (whole,) = inv.slots_of(f"{NS}/b-0")
    assert whole.kind is SlotKind.WHOLE and whole.devices == (1,)
    assert inv.device("d1", 0).pinned == ()  # nothing else exists: the rest of GPU 0 is free to lay out


def test_claims_found_by_pod_status_spec_and_reserved_for_other_drivers_ignored() -> None:
    s = node_slice(A100, "d1", plain=3)
    by_status = dra_pod("a-0", "a")
    by_status["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "a-gpu"}]
    by_status["status"]["resourceClaimStatuses"] = [{"name": "gpu", "resourceClaimName": "a-0-gpu-x7k2p"}]
    by_spec = dra_pod("a-1", "a", created="2024-05-01T12:01:00Z")
    by_spec["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": "shared-name"},
                                         {"name": "nic", "resourceClaimName": "a-1-nic"}]
    by_reservation = dra_pod("a-2", "a", created="2024-05-01T12:02:00Z")
    claims = [claim(NS, "a-0-gpu-x7k2p", "d1", ["gpu-2"]), claim(NS, "shared-name", "d1", ["gpu-0"]),
              claim(NS, "a-1-nic", "d1", ["eth1"], driver="net.example.com"),
              claim(NS, "a-2-gpu", "d1", ["gpu-1"], pod=by_reservation)]
    v = view([deployment("a")], [by_status, by_spec, by_reservation], [bare_node("d1")], resource_slices=[s],
             resource_claims=claims)
    assert not v.problems, v.problems
    slots = {r.replica_id: r.slot.devices for r in v.snapshot.models[f"{NS}/a"].replicas}
    assert slots == {f"{NS}/a-0": (2,), f"{NS}/a-1": (0,), f"{NS}/a-2": (1,)}


def test_share_of_consumable_capacity_is_a_share_slot() -> None:
    dev = {**gpu_device(H100, 0), "allowMultipleAllocations": True}
    p = dra_pod("a-0", "a")
    v = view([deployment("a")], [p], [bare_node("d1")], resource_slices=[resource_slice("d1", [dev])],
             resource_claims=[claim(NS, "a-0-gpu", "d1", ["gpu-0"], pod=p, consumed_memory_gib=20)])
    (slot,) = v.snapshot.inventory.slots_of(f"{NS}/a-0")
    assert slot.kind is SlotKind.SHARE and slot.memory_gib == 20 and slot.compute_fraction == 0.25


def test_only_the_newest_complete_generation_of_a_pool_counts() -> None:
    old = resource_slice("d1", [gpu_device(H100, i) for i in range(8)], generation=1, suffix="old")
    new = resource_slice("d1", [gpu_device(H100, i) for i in range(2)], generation=2, suffix="a", slice_count=2)
    # generation 2 is half published: no new placement on the node this read (a problem line says why), but its
    # serving pods are not lost (review finding: a transient partial read made them draining -> a scale-up)
    p = dra_pod("a-0", "a")
    v = view([deployment("a")], [p], [bare_node("d1")], resource_slices=[old, new])
    assert "d1" not in v.snapshot.inventory.nodes
    assert any("d1" in line and "1 of 2 slices" in line for line in v.problems), v.problems
    assert v.nodes["d1"].out_of_service is None and v.models[f"{NS}/a"].unavailable_replicas == 0
    (replica,) = v.snapshot.models[f"{NS}/a"].replicas
    assert replica.ready and not replica.draining and replica.slot is None
    rest = resource_slice("d1", [gpu_device(H100, i) for i in range(2, 4)], generation=2, suffix="b", slice_count=2)
    v = view([], [], [bare_node("d1")], resource_slices=[old, new, rest])
    assert v.snapshot.inventory.nodes["d1"].gpu_count == 4 and v.nodes["d1"].out_of_service is None


def test_device_plugin_and_dra_nodes_in_one_inventory() -> None:
    p_dp = pod("a-0", "a", node="gpu-1")
    p_dra = dra_pod("a-1", "a", node="d1", created="2024-05-01T12:01:00Z")
    v = view([deployment("a")], [p_dp, p_dra], [gpu_node("gpu-1", count=2), bare_node("d1")],
             resource_slices=[node_slice(A100, "d1", plain=2)],
             resource_claims=[claim(NS, "a-1-gpu", "d1", ["gpu-1"], pod=p_dra)])
    assert not v.problems, v.problems
    inv = v.snapshot.inventory
    assert {n: (s.gpu_model, s.gpu_count) for n, s in inv.nodes.items()} == {"d1": ("A100-80GB", 2),
                                                                              "gpu-1": ("H100-80GB", 2)}
    assert inv.slots_of(f"{NS}/a-0")[0].node == "gpu-1" and inv.slots_of(f"{NS}/a-1")[0].devices == (1,)
    assert set(v.nodes) == {"gpu-1", "d1"}


def test_problems_unknown_device_cordoned_and_missing_node() -> None:
    p = dra_pod("a-0", "a")
    v = view([deployment("a")], [p], [bare_node("d1")],
             resource_slices=[node_slice(A100, "d1", plain=1), node_slice(A100, "ghost", plain=1)],
             resource_claims=[claim(NS, "a-0-gpu", "d1", ["gpu-7"], pod=p)])
    assert any("gpu-7" in x and "no slot" in x for x in v.problems)
    assert any("ghost" in x and "no such Node" in x for x in v.problems)
    cordoned = bare_node("d1")
    cordoned["spec"]["unschedulable"] = True
    v = view([], [], [cordoned], resource_slices=[node_slice(A100, "d1", plain=1)])
    assert "d1" not in v.snapshot.inventory.nodes and v.nodes["d1"].unschedulable


# -- the differential property -------------------------------------------------------------------------------
BASE = {"slotwise.io/slo-latency-ms": "500", "slotwise.io/service-time-ms": "100",
        "slotwise.io/cold-start-seconds": "10", "slotwise.io/max-replicas": "6"}
MODELS = {
    "whole": ({**BASE, "slotwise.io/min-replicas": "1"}, {"nvidia.com/gpu": "1"}),
    "slice": ({**BASE, "slotwise.io/gpu-memory-gib": "15", "slotwise.io/gpu-compute-share": "0.25",
               "slotwise.io/slot-kinds": "mig", "slotwise.io/min-replicas": "1"}, None),
}
_KINDS = st.sampled_from(["whole-h100", "whole-l4", "mig-h100", "mig-a30"])
_MIG_CHOICES = {"mig-h100": ("3g.40gb", "2g.20gb", "1g.10gb"), "mig-a30": ("2g.12gb", "1g.6gb")}
_POD_RES = {"whole-h100": {"nvidia.com/gpu": "1"}, "whole-l4": {"nvidia.com/gpu": "1"},
            "mig-h100": {"nvidia.com/mig-1g.10gb": "1"}, "mig-a30": {"nvidia.com/mig-1g.6gb": "1"}}


def _dp_node(i: int, kind: str, count: int, counts: list[int]) -> dict:
    if kind == "whole-h100":
        return gpu_node(f"n{i}", count=count)
    if kind == "whole-l4":
        return gpu_node(f"n{i}", "NVIDIA-L4", count=count)
    product = "NVIDIA-H100-80GB-HBM3" if kind == "mig-h100" else "NVIDIA-A30"
    caps = {p: n for p, n in zip(_MIG_CHOICES[kind], counts, strict=False) if n}
    return mig_node(f"n{i}", caps, count=count, product=product)


def _canonical(inv: Inventory) -> tuple:
    """The inventory less the node labels GPU Feature Discovery adds beside the product (count, driver, MIG
    strategy ...), which a DRA node does not carry."""
    nodes = [(n.name, n.gpu_model, n.gpu_count, n.mig_enabled, n.labels.get(GPU_PRODUCT)) for n in inv.nodes.values()]
    return nodes, dict(inv.devices)


def _plan(v) -> Plan:
    core = build_core(make_policy("slotwise"), metric_lag_s=15.0, report_every_decision=True)
    window = MetricsWindow(v.snapshot.now, 15.0, {k: ModelMetrics(rate=np.full(60, 12.0), in_flight=np.full(60, 2.0))
                                                  for k in v.snapshot.models})
    return plan_tick(v.snapshot, window, fresh_state(), core, NodeActionState())


def _decided(plan: Plan) -> list:
    return [dataclasses.replace(a, predicted_latency_ms=None) if isinstance(a, UpdateStatus) else a
            for a in plan.actions]


def both_ways(deployments: list[dict], pods: list[dict], nodes: list[dict]):
    dp = read_view(deployments, pods, nodes, now=NOW)
    d_nodes, d_pods, slices, claims = dra_twin(nodes, pods, dp.snapshot.inventory)
    dra = read_view(deployments, d_pods, d_nodes, now=NOW, resource_slices=slices, resource_claims=claims)
    return dp, dra


def _cluster(nodes, pods) -> tuple[list[dict], list[dict], list[dict]]:
    node_objs = [_dp_node(i, kind, count, counts) for i, (kind, count, counts) in enumerate(nodes)]
    deps = [deployment(m, ann, resources={"limits": lim} if lim else None, replicas=1)
            for m, (ann, lim) in MODELS.items()]
    pod_objs = []
    for j, (node_i, model_i, minute) in enumerate(pods):
        node_i %= len(node_objs)
        app = list(MODELS)[model_i]
        pod_objs.append(pod(f"{app}-{j}", app, node=f"n{node_i}", gpus=_POD_RES[nodes[node_i][0]],
                            created=f"2024-05-01T12:{minute:02d}:00Z"))
    return deps, pod_objs, node_objs


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    nodes=st.lists(st.tuples(_KINDS, st.integers(1, 3), st.lists(st.integers(0, 3), min_size=3, max_size=3)),
                   min_size=1, max_size=4),
    pods=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 1), st.integers(0, 59)), max_size=10),
)
def test_property_the_same_cluster_both_ways_gives_the_same_inventory_and_plan(nodes, pods) -> None:
    deps, pod_objs, node_objs = _cluster(nodes, pods)
    dp, dra = both_ways(deps, pod_objs, node_objs)
    inv = dp.snapshot.inventory
    # a MIG GPU the device-plugin view laid out with no instance has no DRA twin (static MIG publishes none)
    assume(all(d.instances() for d in inv.devices.values() if d.mig_enabled))
    assert _canonical(dra.snapshot.inventory) == _canonical(inv)
    assert dra.snapshot.models == dp.snapshot.models
    assert _decided(_plan(dra)) == _decided(_plan(dp))


def test_a_mixed_pool_both_ways_scales_and_packs_alike() -> None:
    """One concrete cluster: whole H100s and a MIG H100 with a model running on each and load for more."""
    deps, pod_objs, node_objs = _cluster([("whole-h100", 2, [0, 0, 0]), ("mig-h100", 2, [1, 2, 2])],
                                         [(0, 0, 1), (1, 1, 2)])
    dp, dra = both_ways(deps, pod_objs, node_objs)
    assert not dra.problems, dra.problems
    assert _canonical(dra.snapshot.inventory) == _canonical(dp.snapshot.inventory)
    plan = _plan(dp)
    assert _decided(_plan(dra)) == _decided(plan)
    assert any(type(a).__name__ == "ScaleModel" for a in plan.actions)
