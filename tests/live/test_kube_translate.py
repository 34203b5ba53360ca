"""Kubernetes objects -> ClusterView (``autoscaler.live.kube.translate``), on dicts shaped as the API serves them.

Pure translation, so plain fixtures: Deployments, Pods, Nodes (GPU Feature Discovery labels, device-plugin
capacity), Jobs and Kueue Workloads. A hypothesis property checks on random clusters that the inventory built
from observed pods is always legal (no memory over-commit, no overlapping or illegal MIG instances) and that
every pod of a model is exactly one of its replicas.
"""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autoscaler.live.kube.gpu_nodes import mig_layout, node_spec
from autoscaler.live.kube.translate import UNMANAGED_MODEL_PREFIX, build_view
from sharing.catalog import load_catalog
from sharing.render import check_layout
from sharing.slots import Inventory, NodeSpec, SlotKind

CAT = load_catalog()
H100 = CAT.get("H100-80GB")
T0 = "2024-05-01T12:00:00Z"
T0_EPOCH = 1714564800.0
NS = "ml"


# -- fixtures written the way the API serves them -------------------------------------------------------------
def gpu_node(
    name: str,
    product: str = "NVIDIA-H100-80GB-HBM3",
    count: int | None = 8,
    capacity: dict[str, Any] | None = None,
    labels: dict[str, str] | None = None,
    unschedulable: bool = False,
) -> dict:
    lab = {"kubernetes.io/hostname": name, "nvidia.com/gpu.product": product, "nvidia.com/cuda.driver.major": "550"}
    if count is not None:
        lab["nvidia.com/gpu.count"] = str(count)
    lab.update(labels or {})
    cap = {"cpu": "96", "memory": "1056Gi", "pods": "110"}
    cap.update({"nvidia.com/gpu": str(count or 0)} if capacity is None else capacity)
    obj: dict[str, Any] = {
        "kind": "Node",
        "apiVersion": "v1",
        "metadata": {"name": name, "labels": lab, "uid": f"uid-{name}"},
        "spec": {},
        "status": {"capacity": cap, "allocatable": dict(cap)},
    }
    if unschedulable:
        obj["spec"]["unschedulable"] = True
    return obj


def mig_node(name: str, caps: dict[str, int], count: int = 8, product: str = "NVIDIA-H100-80GB-HBM3",
             plain: int = 0, config: str = "custom", **kw: Any) -> dict:
    capacity = {f"nvidia.com/mig-{p}": str(n) for p, n in caps.items()}
    capacity["nvidia.com/gpu"] = str(plain)
    labels = {"nvidia.com/mig.strategy": "mixed", "nvidia.com/mig.capable": "true", "nvidia.com/mig.config": config,
              "nvidia.com/mig.config.state": "success"}
    labels.update(kw.pop("labels", {}))
    return gpu_node(name, product, count, capacity=capacity, labels=labels, **kw)


def deployment(name: str, annotations: dict[str, str] | None = None, *, ns: str = NS, replicas: int | None = 2,
               selector: dict | None = None, resources: dict | None = None, managed: bool = True) -> dict:
    ann = {"slotwise.io/slo-latency-ms": "500"} if managed else {}
    ann.update(annotations or {})
    spec: dict[str, Any] = {
        "selector": selector if selector is not None else {"matchLabels": {"app": name}},
        "template": {
            "metadata": {"labels": {"app": name}},
            "spec": {
                "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
                "containers": [
                    {"name": "server", "image": "vllm/vllm-openai:v0.6.0",
                     "resources": resources or {"limits": {"nvidia.com/gpu": "1"}}},
                    {"name": "sidecar", "image": "envoy"},
                ],
            },
        },
    }
    if replicas is not None:
        spec["replicas"] = replicas
    return {
        "kind": "Deployment",
        "apiVersion": "apps/v1",
        "metadata": {"name": name, "namespace": ns, "uid": f"uid-{ns}-{name}", "annotations": ann,
                     "labels": {"app": name}, "creationTimestamp": T0},
        "spec": spec,
        "status": {"replicas": replicas or 1},
    }


def pod(name: str, app: str | None = None, *, ns: str = NS, node: str | None = "gpu-1",
        gpus: dict[str, Any] | None = None, ready: bool = True, phase: str = "Running",
        created: str = T0, deleting: bool = False, labels: dict[str, str] | None = None,
        annotations: dict[str, str] | None = None, owner: dict | None = None, grace: int | None = None) -> dict:
    lab = {"pod-template-hash": "7d9f8c"}
    if app is not None:
        lab["app"] = app
    lab.update(labels or {})
    meta: dict[str, Any] = {"name": name, "namespace": ns, "uid": f"uid-pod-{name}", "labels": lab,
                            "creationTimestamp": created}
    if annotations:
        meta["annotations"] = annotations
    if owner is not None:
        meta["ownerReferences"] = [owner]
    if deleting:
        meta["deletionTimestamp"] = "2024-05-01T12:30:00Z"
        meta["deletionGracePeriodSeconds"] = 30
    res = {"nvidia.com/gpu": "1"} if gpus is None else gpus
    spec: dict[str, Any] = {"containers": [{"name": "server", "image": "x",
                                            "resources": {"limits": dict(res), "requests": dict(res)}}]}
    if node:
        spec["nodeName"] = node
    if grace is not None:
        spec["terminationGracePeriodSeconds"] = grace
    status: dict[str, Any] = {"phase": phase}
    if phase == "Running":
        status["startTime"] = created
        status["conditions"] = [
            {"type": "Initialized", "status": "True"},
            {"type": "Ready", "status": "True" if ready else "False"},
            {"type": "ContainersReady", "status": "True" if ready else "False"},
            {"type": "PodScheduled", "status": "True"},
        ]
    return {"kind": "Pod", "apiVersion": "v1", "metadata": meta, "spec": spec, "status": status}


def at(minute: int) -> str:
    return f"2024-05-01T12:{minute:02d}:00Z"


def view(deployments=(), pods=(), nodes=(), training=(), **kw):
    return build_view(list(deployments), list(pods), list(nodes), list(training), now=T0_EPOCH + 3600, **kw)


def assert_inventory_legal(inv: Inventory) -> None:
    """What the Inventory promises, checked through its API: legal MIG layouts, no memory over-commit."""
    for (node, idx), d in inv.devices.items():
        gpu = inv.gpu_of(node)
        layout = list(d.instances())
        if d.mig_enabled:
            assert check_layout(gpu, layout) == sorted(layout, key=lambda x: x[1])
        else:
            assert not layout
        if d.whole_owner is not None:
            assert len(d.entries) == 1 and not d.pinned
        for inst, u in d.usage.items():
            cap = gpu.memory_gib if inst is None else gpu.profiles[inst[0]].memory_gib
            if u.shares:
                assert u.share_memory_gib + inv.share_reserve_gib <= cap + 1e-9
                assert u.exclusive == 0
            assert u.exclusive <= 1
        assert inv.device_free_memory_gib(node, idx) >= -1e-9


# -- models -------------------------------------------------------------------------------------------------------
def test_managed_and_unmanaged_deployments() -> None:
    v = view(
        deployments=[
            deployment("llama", {"slotwise.io/min-replicas": "2", "slotwise.io/gpu-memory-gib": "40"}, replicas=3),
            deployment("web", managed=False),
            deployment("default-scale", replicas=None),
        ],
        pods=[pod("llama-1", "llama", node="gpu-1"), pod("web-1", "web", node="gpu-1")],
        nodes=[gpu_node("gpu-1")],
    )
    assert list(v.models) == ["ml/default-scale", "ml/llama"]
    assert list(v.snapshot.models) == ["ml/default-scale", "ml/llama"]
    m = v.models["ml/llama"]
    assert (m.key, m.namespace, m.name, m.uid, m.replicas, m.container) == (
        "ml/llama", "ml", "llama", "uid-ml-llama", 3, "server")
    assert m.resources == {"limits": {"nvidia.com/gpu": "1"}}
    assert m.node_selector == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert m.annotations["slotwise.io/min-replicas"] == "2"
    obs = v.snapshot.models["ml/llama"]
    assert obs.spec is not None and obs.spec_error is None
    # The spec's name is the model key: slot requests, and so the inventory's model names, use it.
    assert obs.spec.name == "ml/llama" and obs.spec.namespace == "ml"
    assert obs.spec.min_replicas == 2 and obs.spec.gpu_memory_gib == 40.0
    assert obs.desired_replicas == 3
    assert [r.replica_id for r in obs.replicas] == ["ml/llama-1"]
    assert v.snapshot.models["ml/default-scale"].desired_replicas == 1  # spec.replicas defaults to 1
    assert v.snapshot.now == T0_EPOCH + 3600
    # The unmanaged pod still holds its GPU, under a model name no key can take.
    inv = v.snapshot.inventory
    assert inv.model_of("ml/web-1") == UNMANAGED_MODEL_PREFIX + "ml/web-1"
    assert inv.model_of("ml/llama-1") == "ml/llama"
    assert inv.model_allocation_count("ml/llama") == 1
    assert v.problems == []


def test_bad_annotation_affects_only_that_model() -> None:
    v = view(
        deployments=[
            deployment("bad", {"slotwise.io/slo-percentile": "120", "slotwise.io/colour": "blue"}, replicas=2),
            deployment("good", {"slotwise.io/slo-percentile": "99"}),
        ],
        pods=[pod("bad-1", "bad", node="gpu-1"), pod("good-1", "good", node="gpu-1")],
        nodes=[gpu_node("gpu-1")],
    )
    bad = v.snapshot.models["ml/bad"]
    assert bad.spec is None
    assert bad.spec_error is not None and bad.spec_error.model == "ml/bad"
    assert str(bad.spec_error).startswith("model ml/bad: ")
    assert {p.key for p in bad.spec_error.problems} == {"slotwise.io/slo-percentile", "slotwise.io/colour"}
    assert bad.desired_replicas == 2
    assert [r.replica_id for r in bad.replicas] == ["ml/bad-1"]  # its pods are still observed
    assert bad.replicas[0].slot is not None
    good = v.snapshot.models["ml/good"]
    assert good.spec is not None and good.spec.slo_percentile == 99.0
    assert "ml/bad" in v.models


def test_pods_match_by_namespace_and_selector_not_owner_references() -> None:
    sel = {
        "matchLabels": {"app": "llama"},
        "matchExpressions": [
            {"key": "track", "operator": "In", "values": ["stable", "canary"]},
            {"key": "debug", "operator": "DoesNotExist"},
        ],
    }
    v = view(
        deployments=[deployment("llama", selector=sel), deployment("llama", ns="other")],
        pods=[
            pod("a", "llama", labels={"track": "stable"}),
            pod("b", "llama", labels={"track": "canary"}),
            pod("c", "llama", labels={"track": "canary", "debug": "1"}),  # DoesNotExist fails
            pod("d", "llama", labels={"track": "dev"}),  # In fails
            pod("e", "llama"),  # no track label: In fails
            pod("f", "mistral", labels={"track": "stable"}),
            pod("g", "llama", ns="other", labels={"track": "stable"}),  # other namespace: the other model's
        ],
        nodes=[gpu_node("gpu-1")],
    )
    assert [r.replica_id for r in v.snapshot.models["ml/llama"].replicas] == ["ml/a", "ml/b"]
    assert [r.replica_id for r in v.snapshot.models["other/llama"].replicas] == ["other/g"]


def test_expression_only_selector_and_invalid_selector() -> None:
    only_expr = {"matchExpressions": [{"key": "app", "operator": "In", "values": ["x", "y"]}]}
    v = view(
        deployments=[
            deployment("xy", selector=only_expr),
            deployment("broken", selector={"matchExpressions": [{"key": "app", "operator": "Gt", "values": ["1"]}]}),
        ],
        pods=[pod("x1", "x"), pod("y1", "y"), pod("z1", "z")],
        nodes=[gpu_node("gpu-1")],
    )
    assert [r.replica_id for r in v.snapshot.models["ml/xy"].replicas] == ["ml/x1", "ml/y1"]
    assert v.snapshot.models["ml/broken"].replicas == ()
    assert any("deployment ml/broken: selector" in p and "unknown operator" in p for p in v.problems)


def test_pod_selected_by_two_models_counts_once() -> None:
    v = view(
        deployments=[
            deployment("a", selector={"matchLabels": {"team": "x"}}),
            deployment("b", selector={"matchLabels": {"team": "x"}}),
        ],
        pods=[pod("p", labels={"team": "x"})],
        nodes=[gpu_node("gpu-1")],
    )
    assert [r.replica_id for r in v.snapshot.models["ml/a"].replicas] == ["ml/p"]
    assert v.snapshot.models["ml/b"].replicas == ()
    assert any("selected by deployments ml/a and ml/b" in p for p in v.problems)


def test_ready_draining_pending_and_terminal_pods() -> None:
    v = view(
        deployments=[deployment("m")],
        pods=[
            pod("ready", "m", created=at(1)),
            pod("starting", "m", ready=False, created=at(2)),
            pod("leaving", "m", deleting=True, created=at(3)),
            pod("pending", "m", node=None, phase="Pending", created=at(4)),
            pod("done", "m", phase="Succeeded"),
            pod("crashed", "m", phase="Failed"),
        ],
        nodes=[gpu_node("gpu-1")],
    )
    reps = {r.replica_id: r for r in v.snapshot.models["ml/m"].replicas}
    assert set(reps) == {"ml/ready", "ml/starting", "ml/leaving", "ml/pending"}
    assert reps["ml/ready"].ready and not reps["ml/ready"].draining
    assert not reps["ml/starting"].ready
    assert reps["ml/leaving"].draining and reps["ml/leaving"].slot is not None  # still holds its GPU
    assert reps["ml/pending"].slot is None and not reps["ml/pending"].ready
    assert reps["ml/ready"].started_at == T0_EPOCH + 60
    assert reps["ml/pending"].started_at == T0_EPOCH + 240
    obs = v.snapshot.models["ml/m"]
    assert obs.active_replicas == 3 and obs.ready_replicas == 1
    # Terminal pods hold nothing; the terminating one still counts on its node.
    assert v.nodes["gpu-1"].gpu_pods == {"nvidia.com/gpu": 3}
    assert v.snapshot.inventory.gpus_in_use() == 3


# -- slots ------------------------------------------------------------------------------------------------------
def test_whole_gpu_pods_take_first_free_devices_oldest_first() -> None:
    v = view(
        deployments=[deployment("m"), deployment("big", resources={"limits": {"nvidia.com/gpu": "2"}})],
        pods=[
            pod("m-b", "m", created=at(2)),
            pod("m-a", "m", created=at(1)),
            pod("big-1", "big", gpus={"nvidia.com/gpu": "2"}, created=at(3)),
            pod("big-2", "big", gpus={"nvidia.com/gpu": "2"}, created=at(4)),  # only one GPU left
        ],
        nodes=[gpu_node("gpu-1", count=4)],
    )
    slots = {r.replica_id: r.slot for o in v.snapshot.models.values() for r in o.replicas}
    assert slots["ml/m-a"].devices == (0,) and slots["ml/m-a"].kind is SlotKind.WHOLE
    assert slots["ml/m-b"].devices == (1,)
    assert slots["ml/big-1"].devices == (2, 3) and slots["ml/big-1"].memory_gib == 160.0
    assert slots["ml/big-2"] is None
    assert any(p.startswith("pod ml/big-2 on gpu-1: asks for 2 whole GPU(s), 0 free") for p in v.problems)
    inv = v.snapshot.inventory
    assert inv.slots_of("ml/m-a") == [slots["ml/m-a"]]
    assert inv.model_device_counts("ml/big") == {("gpu-1", 2): 1, ("gpu-1", 3): 1}
    assert_inventory_legal(inv)


def test_mig_pods_take_instances_of_their_profile() -> None:
    node = mig_node("mig-1", {"3g.40gb": 2, "1g.10gb": 4}, count=2, config="custom-mix")
    v = view(
        deployments=[
            deployment("big", {"slotwise.io/gpu-memory-gib": "35"},
                       resources={"limits": {"nvidia.com/mig-3g.40gb": "1"}}),
            deployment("small", resources={"limits": {"nvidia.com/mig-1g.10gb": "1"}}),
        ],
        pods=[
            pod("big-1", "big", node="mig-1", gpus={"nvidia.com/mig-3g.40gb": "1"}, created=at(1)),
            pod("big-2", "big", node="mig-1", gpus={"nvidia.com/mig-3g.40gb": "1"}, created=at(2)),
            pod("big-3", "big", node="mig-1", gpus={"nvidia.com/mig-3g.40gb": "1"}, created=at(3)),
            pod("small-1", "small", node="mig-1", gpus={"nvidia.com/mig-1g.10gb": "1"}, created=at(4)),
            pod("odd", "small", node="mig-1", gpus={"nvidia.com/mig-7g.80gb": "1"}, created=at(5)),
            pod("whole", "small", node="mig-1", gpus={"nvidia.com/gpu": "1"}, created=at(6)),
        ],
        nodes=[node],
    )
    slots = {r.replica_id: r.slot for o in v.snapshot.models.values() for r in o.replicas}
    b1, b2 = slots["ml/big-1"], slots["ml/big-2"]
    assert b1.kind is SlotKind.MIG and b1.profile == "3g" and b1.memory_gib == 40.0
    assert abs(b1.compute_fraction - 3 / 7) < 1e-12
    assert (b1.devices, b2.devices) == ((0,), (1,))  # round-robin layout: one 3g per GPU
    assert slots["ml/big-3"] is None
    assert slots["ml/small-1"].kind is SlotKind.MIG and slots["ml/small-1"].profile == "1g"
    assert slots["ml/odd"] is None and slots["ml/whole"] is None
    text = "\n".join(v.problems)
    assert "pod ml/big-3 on mig-1: no free 3g.40gb instance on the node" in text
    assert "pod ml/odd on mig-1: no free 7g.80gb instance" in text
    assert "pod ml/whole on mig-1: asks for 1 whole GPU(s), 0 free" in text
    inv = v.snapshot.inventory
    assert sum(1 for _ in inv.allocations()) == 3
    assert_inventory_legal(inv)
    assert v.nodes["mig-1"].gpu_pods == {"nvidia.com/gpu": 1, "nvidia.com/mig-1g.10gb": 1,
                                          "nvidia.com/mig-3g.40gb": 3, "nvidia.com/mig-7g.80gb": 1}


def test_time_sliced_gpus_hold_shares_with_hard_memory() -> None:
    labels = {"nvidia.com/gpu.replicas": "4", "nvidia.com/gpu.sharing-strategy": "time-slicing"}
    node = gpu_node("l4-1", "NVIDIA-L4-SHARED", count=2, capacity={"nvidia.com/gpu": "8"}, labels=labels)
    v = view(
        deployments=[deployment("sized", {"slotwise.io/gpu-memory-gib": "10"}), deployment("plain")],
        pods=[
            pod("sized-1", "sized", node="l4-1", created=at(1)),
            pod("sized-2", "sized", node="l4-1", created=at(2)),
            pod("sized-3", "sized", node="l4-1", created=at(3)),
            pod("plain-1", "plain", node="l4-1", created=at(4)),
            pod("plain-2", "plain", node="l4-1", created=at(5)),
            pod("two", "plain", node="l4-1", gpus={"nvidia.com/gpu": "2"}, created=at(6)),
        ],
        nodes=[node],
        share_reserve_gib=1.0,
    )
    assert node_spec(node, CAT) == NodeSpec("l4-1", "L4-24GB", 2, labels={
        k: val for k, val in node["metadata"]["labels"].items() if k.startswith("nvidia.com/")})
    slots = {r.replica_id: r.slot for o in v.snapshot.models.values() for r in o.replicas}
    s1 = slots["ml/sized-1"]
    assert s1.kind is SlotKind.SHARE and s1.profile is None and s1.memory_gib == 10.0
    assert s1.compute_fraction == 0.25
    # 10 + 10 + 1 reserve fit one 24 GiB L4; the third 10 GiB share goes to the next GPU.
    assert [slots[f"ml/sized-{i}"].devices for i in (1, 2, 3)] == [(0,), (0,), (1,)]
    # Without a memory figure a share gets an equal part of what the reserve leaves: (24 - 1) / 4.
    assert slots["ml/plain-1"].memory_gib == pytest.approx(5.75)
    assert slots["ml/plain-1"].devices == (1,) and slots["ml/plain-2"].devices == (1,)
    assert slots["ml/two"] is None
    assert any("asks for 2 time-sliced nvidia.com/gpu" in p for p in v.problems)
    assert_inventory_legal(v.snapshot.inventory)


def test_time_sliced_mig_profile_holds_shares_inside_the_instance() -> None:
    node = mig_node("mig-ts", {"3g.40gb": 2}, count=1, labels={"nvidia.com/mig-3g.40gb.replicas": "2"})
    node["status"]["capacity"]["nvidia.com/mig-3g.40gb"] = "4"  # 2 instances x 2 replicas
    v = view(
        deployments=[deployment("m", resources={"limits": {"nvidia.com/mig-3g.40gb": "1"}})],
        pods=[pod(f"m-{i}", "m", node="mig-ts", gpus={"nvidia.com/mig-3g.40gb": "1"}, created=at(i)) for i in range(4)],
        nodes=[node],
    )
    slots = [r.slot for r in v.snapshot.models["ml/m"].replicas]
    assert all(s is not None and s.kind is SlotKind.SHARE and s.profile == "3g" for s in slots)
    assert sorted(s.start for s in slots) == [0, 0, 4, 4]
    assert all(s.memory_gib == pytest.approx(19.5) and s.compute_fraction == pytest.approx(3 / 14) for s in slots)
    assert v.snapshot.inventory.mig_layout("mig-ts", 0) == (("3g", 0), ("3g", 4))
    assert_inventory_legal(v.snapshot.inventory)


def test_pod_asking_for_two_gpu_resources_gets_no_slot() -> None:
    v = view(
        deployments=[deployment("m")],
        pods=[pod("m-1", "m", node="mig-1", gpus={"nvidia.com/gpu": "1", "nvidia.com/mig-1g.10gb": "1"})],
        nodes=[mig_node("mig-1", {"1g.10gb": 7}, count=2, plain=1)],
    )
    assert v.snapshot.models["ml/m"].replicas[0].slot is None
    assert any("asks for several GPU resources" in p for p in v.problems)


# -- nodes ------------------------------------------------------------------------------------------------------
def test_unknown_gpu_product_is_a_problem_and_left_out() -> None:
    v = view(
        deployments=[deployment("m")],
        pods=[pod("m-1", "m", node="odd-1")],
        nodes=[gpu_node("odd-1", "NVIDIA-Quantum-Z9000"), gpu_node("gpu-1")],
    )
    assert list(v.snapshot.inventory.nodes) == ["gpu-1"]
    assert v.problems == ["node odd-1: unknown GPU product 'NVIDIA-Quantum-Z9000'; left out"]
    assert v.nodes["odd-1"].gpu_pods == {"nvidia.com/gpu": 1}
    assert v.snapshot.models["ml/m"].replicas[0].slot is None
    assert node_spec(gpu_node("odd-1", "NVIDIA-Quantum-Z9000"), CAT) == v.problems[0]


def test_cordoned_node_is_left_out_but_reported() -> None:
    v = view(
        deployments=[deployment("m")],
        pods=[pod("m-1", "m", node="gpu-2"), pod("other", node="gpu-2", gpus={"nvidia.com/gpu": "2"})],
        nodes=[gpu_node("gpu-1"), gpu_node("gpu-2", unschedulable=True),
               {"metadata": {"name": "cpu-1", "labels": {}}, "spec": {}, "status": {"capacity": {"cpu": "8"}}}],
    )
    assert list(v.snapshot.inventory.nodes) == ["gpu-1"]
    assert set(v.nodes) == {"gpu-1", "gpu-2"}  # every GPU node, cordoned or not; no CPU node
    info = v.nodes["gpu-2"]
    assert info.unschedulable and info.gpu_pods == {"nvidia.com/gpu": 2}
    assert info.labels["kubernetes.io/hostname"] == "gpu-2"  # all labels, for the MIG gate
    assert v.snapshot.models["ml/m"].replicas[0].slot is None
    assert v.problems == []


def test_node_spec_reads_count_kind_and_nvidia_labels() -> None:
    n = gpu_node("gpu-1", "NVIDIA-A100-SXM4-80GB", count=4)
    spec = node_spec(n, CAT)
    assert isinstance(spec, NodeSpec)
    assert (spec.name, spec.gpu_model, spec.gpu_count, spec.mig_enabled) == ("gpu-1", "A100-80GB", 4, False)
    assert set(spec.labels) == {"nvidia.com/gpu.product", "nvidia.com/gpu.count", "nvidia.com/cuda.driver.major"}
    # No gpu.count label: capacity says, divided by the time-slicing replicas.
    n2 = gpu_node("t4", "Tesla-T4-SHARED", count=None, capacity={"nvidia.com/gpu": "12"},
                  labels={"nvidia.com/gpu.replicas": "3"})
    assert node_spec(n2, CAT).gpu_count == 4
    # Capacity but no GFD label: a problem, not a guess.
    bare = {"metadata": {"name": "bare", "labels": {}}, "status": {"capacity": {"nvidia.com/gpu": "2"}}}
    assert "without a nvidia.com/gpu.product label" in node_spec(bare, CAT)
    assert node_spec({"metadata": {"name": "cpu"}, "status": {"capacity": {"cpu": "4"}}}, CAT).endswith(
        "not a GPU node")
    # MIG reported on a GPU without MIG: read as plain GPUs, with a problem line.
    v = view(nodes=[mig_node("l4", {"1g.6gb": 4}, count=1, product="NVIDIA-L4")])
    assert not v.snapshot.inventory.nodes["l4"].mig_enabled
    assert any("does not support MIG" in p for p in v.problems)


def test_mig_balanced_layout_is_reconstructed_legally_per_gpu() -> None:
    # mig-parted's all-balanced on 8 x H100: 1 x 3g, 1 x 2g, 2 x 1g per GPU.
    node = mig_node("h100", {"3g.40gb": 8, "2g.20gb": 8, "1g.10gb": 16}, config="all-balanced")
    spec = node_spec(node, CAT)
    assert spec.mig_enabled and spec.gpu_count == 8
    layout = mig_layout(node, CAT)
    assert len(layout) == 8
    for i, lay in layout.items():
        assert lay is not None
        assert check_layout(H100, lay) == lay
        assert Counter(k for k, _ in lay) == {"3g": 1, "2g": 1, "1g": 2}, i
    v = view(nodes=[node])
    assert v.problems == []
    inv = v.snapshot.inventory
    assert all(inv.mig_layout("h100", i) == tuple(layout[i]) for i in range(8))
    assert_inventory_legal(inv)


def test_mig_mixed_node_puts_mig_gpus_first_and_plain_gpus_after() -> None:
    node = mig_node("mix", {"7g.80gb": 1, "1g.10gb": 7}, count=4, plain=2)
    layout = mig_layout(node, CAT)
    assert layout[0] == [("7g", 0)]
    assert layout[1] == [("1g", s) for s in range(7)]
    assert layout[2] is None and layout[3] is None
    v = view(deployments=[deployment("m")], pods=[pod("m-1", "m", node="mix")], nodes=[node])
    assert v.snapshot.models["ml/m"].replicas[0].slot.devices == (2,)
    # No gpu.count label: the fewest MIG GPUs that hold the instances, plus the plain ones.
    del node["metadata"]["labels"]["nvidia.com/gpu.count"]
    assert node_spec(node, CAT).gpu_count == 4


def test_mig_layout_that_cannot_fit_keeps_what_fits() -> None:
    node = mig_node("h100", {"7g.80gb": 1, "3g.40gb": 2, "1g.10gb": 2}, count=1)  # > one GPU
    v = view(nodes=[node])
    inv = v.snapshot.inventory
    assert inv.mig_layout("h100", 0) == (("7g", 0),)
    assert v.problems == ["node h100: MIG capacity does not fit its 1 MIG GPU(s) (H100-80GB); "
                          "left out: 2 x 1g.10gb, 2 x 3g.40gb"]
    assert_inventory_legal(inv)


def test_mig_single_strategy() -> None:
    node = gpu_node("a100", "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb", count=14, capacity={"nvidia.com/gpu": "14"},
                    labels={"nvidia.com/mig.strategy": "single", "nvidia.com/mig.config": "all-1g.5gb"})
    spec = node_spec(node, CAT)
    assert (spec.gpu_model, spec.gpu_count, spec.mig_enabled) == ("A100-40GB", 2, True)
    v = view(deployments=[deployment("m")], pods=[pod("m-1", "m", node="a100")], nodes=[node])
    slot = v.snapshot.models["ml/m"].replicas[0].slot
    assert slot.kind is SlotKind.MIG and slot.profile == "1g" and slot.memory_gib == 5.0
    assert [len(v.snapshot.inventory.mig_layout("a100", i)) for i in range(2)] == [7, 7]


def test_mig_config_label_alone_enables_mig() -> None:
    node = mig_node("h100", {}, count=2, config="all-1g.10gb")  # the MIG manager has not finished yet
    assert node_spec(node, CAT).mig_enabled
    off = mig_node("h100", {}, count=2, plain=2, config="all-disabled")
    assert not node_spec(off, CAT).mig_enabled


def test_mig_counts_from_gfd_labels_when_the_device_plugin_has_no_capacity_yet() -> None:
    node = gpu_node("h100", count=1, capacity={}, labels={
        "nvidia.com/mig.strategy": "mixed", "nvidia.com/mig.config": "custom",
        "nvidia.com/mig-3g.40gb.count": "2", "nvidia.com/mig-3g.40gb.replicas": "2",
        "nvidia.com/mig-3g.40gb.memory": "40448"})
    assert mig_layout(node, CAT) == {0: [("3g", 0), ("3g", 4)]}  # .count counts instances, not replicas
    v = view(pods=[pod("x", node="h100", gpus={"nvidia.com/mig-3g.40gb": "1"})], nodes=[node])
    (slot,) = v.snapshot.inventory.slots_of("ml/x")
    assert slot.kind is SlotKind.SHARE and slot.profile == "3g"


# -- training -----------------------------------------------------------------------------------------------------
def test_training_workloads_from_pods_jobs_and_kueue() -> None:
    pre = {"slotwise.io/preemptible": "true"}
    job = {
        "kind": "Job",
        "metadata": {"name": "pretrain", "namespace": "train", "uid": "job-uid", "labels": dict(pre),
                     "annotations": {"slotwise.io/last-checkpoint": "2024-05-01T11:50:00Z"}},
        "spec": {"parallelism": 2, "template": {"metadata": {"labels": dict(pre)}, "spec": {
            "terminationGracePeriodSeconds": 120,
            "containers": [{"name": "t", "resources": {"limits": {"nvidia.com/mig-3g.40gb": "1"}}}]}}},
        "status": {"active": 2, "startTime": at(5)},
    }
    owner = {"apiVersion": "batch/v1", "kind": "Job", "name": "pretrain", "uid": "job-uid", "controller": True}
    job_pods = [
        pod(f"pretrain-{i}", ns="train", node=f"mig-{i}", gpus={"nvidia.com/mig-3g.40gb": "1"},
            labels={**pre, "job-name": "pretrain"}, owner=owner)
        for i in range(2)
    ]
    workload = {  # listed: no "kind" on items, inferred from the shape
        "metadata": {"name": "job-finetune-ab12", "namespace": "train", "labels": dict(pre)},
        "spec": {"podSets": [
            {"name": "main", "count": 4, "template": {"spec": {"terminationGracePeriodSeconds": 90, "containers": [
                {"name": "t", "resources": {"requests": {"nvidia.com/gpu": "1"}}}]}}},
            {"name": "aux", "count": 1, "template": {"spec": {"containers": [{"name": "a"}]}}},
        ]},
        "status": {"conditions": [{"type": "QuotaReserved", "status": "True"},
                                  {"type": "Admitted", "status": "True", "lastTransitionTime": at(7)}]},
    }
    lone = pod("scratch", ns="train", node="gpu-1", gpus={"nvidia.com/gpu": "2"}, labels=pre, grace=45,
               annotations={"slotwise.io/last-checkpoint": "not-a-time"})
    unlabelled = pod("batch", ns="train", node="gpu-1")
    nodes = [gpu_node("gpu-1"), mig_node("mig-0", {"3g.40gb": 2}, count=1), mig_node("mig-1", {"3g.40gb": 2}, count=1)]
    v = view(pods=[*job_pods, lone, unlabelled], nodes=nodes, training=[job, workload])
    by_name = {w.name: w for w in v.snapshot.training}
    assert list(by_name) == ["train/job-finetune-ab12", "train/pretrain", "train/scratch"]
    j = by_name["train/pretrain"]
    assert j.kind == "Job" and j.gpus == pytest.approx(2 * 3 / 7) and j.running
    assert j.nodes == ("mig-0", "mig-1") and j.grace_s == 120.0
    assert j.started_at == T0_EPOCH + 300 and j.last_checkpoint_at == T0_EPOCH - 600
    w = by_name["train/job-finetune-ab12"]
    assert w.kind == "Workload" and w.gpus == 4.0 and w.running and w.grace_s == 90.0
    assert w.started_at == T0_EPOCH + 420
    p = by_name["train/scratch"]
    assert p.kind == "Pod" and p.gpus == 2.0 and p.nodes == ("gpu-1",) and p.running and p.grace_s == 45.0
    assert p.last_checkpoint_at is None
    assert any("slotwise.io/last-checkpoint='not-a-time'" in x for x in v.problems)
    # Training pods hold their GPUs in the inventory, as nobody's model.
    inv = v.snapshot.inventory
    assert inv.model_of("train/scratch") == "pod:train/scratch"
    assert inv.gpus_in_use() == 5  # scratch 2 + batch 1 on gpu-1, one 3g on each MIG node


def test_training_job_not_running_when_suspended_and_defaults() -> None:
    job = {
        "kind": "Job",
        "metadata": {"name": "j", "namespace": "t", "labels": {"slotwise.io/preemptible": "true"}},
        "spec": {"suspend": True, "template": {"spec": {"containers": [
            {"name": "t", "resources": {"limits": {"nvidia.com/gpu": "8"}}}]}}},
        "status": {"active": 1},
    }
    finished = {
        "kind": "Workload",
        "metadata": {"name": "w", "namespace": "t", "labels": {"slotwise.io/preemptible": "true"}},
        "spec": {"podSets": [{"name": "m", "count": 2, "template": {"spec": {"containers": [
            {"name": "t", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}}]},
        "status": {"conditions": [{"type": "Admitted", "status": "True"}, {"type": "Finished", "status": "True"}]},
    }
    not_ours = {"kind": "Job", "metadata": {"name": "x", "namespace": "t", "labels": {"slotwise.io/preemptible": "no"}},
                "spec": {}}
    v = view(training=[job, finished, not_ours])
    j, w = v.snapshot.training
    assert (j.name, j.gpus, j.running, j.grace_s, j.nodes) == ("t/j", 8.0, False, 30.0, ())
    assert (w.name, w.gpus, w.running) == ("t/w", 2.0, False)


# -- determinism and scale-free properties ------------------------------------------------------------------------
def _cluster(seed: int) -> tuple[list[dict], list[dict], list[dict]]:
    rng = random.Random(seed)
    nodes = [
        gpu_node("gpu-1", count=4),
        mig_node("mig-1", {"3g.40gb": 2, "2g.20gb": 2, "1g.10gb": 4}, count=2, config="all-balanced"),
        gpu_node("l4-1", "NVIDIA-L4-SHARED", count=2, capacity={"nvidia.com/gpu": "8"},
                 labels={"nvidia.com/gpu.replicas": "4"}),
    ]
    deps = [deployment("w"), deployment("g", resources={"limits": {"nvidia.com/mig-2g.20gb": "1"}}),
            deployment("s", {"slotwise.io/gpu-memory-gib": "4"})]
    pods = []
    for i in range(12):
        app, node, gpus = rng.choice([
            ("w", "gpu-1", {"nvidia.com/gpu": "1"}),
            ("g", "mig-1", {"nvidia.com/mig-2g.20gb": "1"}),
            ("s", "l4-1", {"nvidia.com/gpu": "1"}),
            ("w", None, {"nvidia.com/gpu": "1"}),
        ])
        pods.append(pod(f"p{i}", app, node=node, gpus=gpus, created=at(rng.randrange(60))))
    return deps, pods, nodes


def test_same_objects_in_any_order_give_the_same_view() -> None:
    deps, pods, nodes = _cluster(7)
    a = view(deps, pods, nodes)
    rng = random.Random(3)
    for _ in range(3):
        rng.shuffle(deps)
        rng.shuffle(pods)
        rng.shuffle(nodes)
        b = view(deps, pods, nodes)
        assert b.snapshot.models == a.snapshot.models
        assert b.snapshot.inventory == a.snapshot.inventory
        assert b.nodes == a.nodes and b.models == a.models and b.problems == a.problems
        assert list(b.snapshot.models) == sorted(b.snapshot.models)


_NODE_KINDS = st.sampled_from(["whole-h100", "mig-h100", "mig-a30", "shared-l4", "cordoned", "unknown"])
_ANY_RESOURCE = (
    {"nvidia.com/gpu": "1"}, {"nvidia.com/gpu": "2"}, {"nvidia.com/mig-1g.10gb": "1"},
    {"nvidia.com/mig-3g.40gb": "1"}, {"nvidia.com/mig-1g.6gb": "1"}, {"nvidia.com/mig-2g.12gb": "1"}, {},
)
# What pods on each kind of node usually ask for (a pod drawn "matching" takes one of these).
_FITTING = {
    "whole-h100": ({"nvidia.com/gpu": "1"}, {"nvidia.com/gpu": "2"}),
    "cordoned": ({"nvidia.com/gpu": "1"},),
    "unknown": ({"nvidia.com/gpu": "1"},),
    "shared-l4": ({"nvidia.com/gpu": "1"},),
    "mig-h100": ({"nvidia.com/mig-3g.40gb": "1"}, {"nvidia.com/mig-2g.20gb": "1"}, {"nvidia.com/mig-1g.10gb": "1"},
                 {"nvidia.com/gpu": "1"}),
    "mig-a30": ({"nvidia.com/mig-2g.12gb": "1"}, {"nvidia.com/mig-1g.6gb": "1"}),
}


def _random_node(i: int, kind: str, draw_counts: dict[str, int], count: int) -> dict:
    name = f"n{i}"
    if kind == "whole-h100":
        return gpu_node(name, count=count)
    if kind == "cordoned":
        return gpu_node(name, count=count, unschedulable=True)
    if kind == "unknown":
        return gpu_node(name, "NVIDIA-Mystery", count=count)
    if kind == "shared-l4":
        return gpu_node(name, "NVIDIA-L4-SHARED", count=count, capacity={"nvidia.com/gpu": str(count * 3)},
                        labels={"nvidia.com/gpu.replicas": "3"})
    if kind == "mig-h100":
        caps = {p: n for p, n in zip(("3g.40gb", "2g.20gb", "1g.10gb"), draw_counts.values(), strict=False)}
        return mig_node(name, caps, count=count, plain=min(1, count - 1))
    caps = {p: n for p, n in zip(("2g.12gb", "1g.6gb"), draw_counts.values(), strict=False)}
    return mig_node(name, caps, count=count, product="NVIDIA-A30")


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    nodes=st.lists(st.tuples(_NODE_KINDS, st.dictionaries(st.sampled_from("abc"), st.integers(0, 5), min_size=3),
                             st.integers(1, 3)), min_size=1, max_size=4),
    pods=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 4), st.booleans(), st.integers(0, 6),
                            st.integers(0, 59), st.booleans()), min_size=3, max_size=30),
    reserve=st.sampled_from([0.0, 1.0, 2.5]),
    mem=st.sampled_from([None, "3", "9"]),
)
def test_property_inventory_stays_legal_and_every_pod_is_one_replica(nodes, pods, reserve, mem) -> None:
    node_objs = [_random_node(i, kind, counts, count) for i, (kind, counts, count) in enumerate(nodes)]
    models = ["m0", "m1", "m2"]
    deps = [deployment(m, {"slotwise.io/gpu-memory-gib": mem} if mem and m != "m2" else {}) for m in models]
    pod_objs = []
    for j, (app_i, node_i, fitting, res_i, minute, ready) in enumerate(pods):
        app = models[app_i] if app_i < 3 else "stray"
        node = f"n{node_i}" if node_i < len(node_objs) else None
        choices = _FITTING[nodes[node_i][0]] if fitting and node is not None else _ANY_RESOURCE
        res = choices[res_i % len(choices)]
        pod_objs.append(pod(f"p{j}", app, node=node, gpus=res, ready=ready, created=at(minute)))

    v = view(deps, pod_objs, node_objs, share_reserve_gib=reserve)
    inv = v.snapshot.inventory
    assert_inventory_legal(inv)

    # Every pod of a model appears exactly once, as a replica of that model; nothing else does.
    seen = Counter(r.replica_id for o in v.snapshot.models.values() for r in o.replicas)
    expected = {f"{NS}/p{j}" for j, (app_i, *_rest) in enumerate(pods) if app_i < 3}
    assert set(seen) == expected and all(n == 1 for n in seen.values())
    for key, obs in v.snapshot.models.items():
        for r in obs.replicas:
            assert r.replica_id.removeprefix(f"{NS}/p").isdigit()
            j = int(r.replica_id.removeprefix(f"{NS}/p"))
            assert models[pods[j][0]] == key.removeprefix(f"{NS}/")
            if r.slot is not None:
                # A replica's slot is its allocation in the inventory, under its model.
                assert inv.slots_of(r.replica_id) == [r.slot]
                assert inv.model_of(r.replica_id) == key
                assert r.slot.node in inv.nodes
    # Nothing on a node outside the inventory, and every allocation belongs to a live pod.
    owners = {o for o, _ in inv.allocations()}
    assert owners <= {f"{NS}/p{j}" for j in range(len(pods))}
    for name, info in v.nodes.items():
        assert info.unschedulable == (name not in inv.nodes and "Mystery" not in
                                      info.labels["nvidia.com/gpu.product"])
