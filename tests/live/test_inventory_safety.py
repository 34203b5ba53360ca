"""Issue 16, failure modes 6 and 9: the GPU inventory sees every GPU in use, and only GPUs that are capacity.

Against a REAL kube-apiserver, through the controller's own informers and view (``Controller.view()``):

- **6, namespace mode is blind to other tenants' GPUs.** A controller scoped to namespace A must still see the
  GPU that a pod of namespace B holds: the inventory is built from every pod on the GPU nodes (cluster-wide,
  read-only), only the models are scoped. Before, the pods informer was namespaced too, so the GPU looked free:
  the packer placed on it and the MIG gate re-partitioned under it.
- **9, NotReady nodes count as capacity.** A node whose Ready condition is not True, or whose GPUs the device
  plugin no longer advertises (allocatable 0, capacity 2), leaves the inventory; its replicas are no capacity
  (observed as draining, counted in ``ManagedModel.unavailable_replicas``) and the plan places nothing there.

Node conditions and capacity are set through the status subresource, as a kubelet reports them.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Mapping

import numpy as np
import pytest
import pytest_asyncio
from kubernetes_asyncio import client
from realparts.clusterplay import create_gpu_node

from autoscaler.api.plan import PlaceReplica
from autoscaler.api.snapshot import MetricsWindow, ModelMetrics
from autoscaler.api.spec import ModelSpec
from autoscaler.live.controller import Controller, ControllerSettings
from autoscaler.live.kube.gpu_nodes import out_of_service
from autoscaler.live.kube.translate import build_view

pytest_plugins = ("realparts.kube",)

H100 = "NVIDIA-H100-80GB-HBM3"
STAMP = "2024-05-01T12:00:00Z"


class Load:
    """A metrics port: one constant request rate per model (req/s)."""

    def __init__(self, rates: Mapping[str, float]) -> None:
        self.rates = dict(rates)
        self.last_error: str | None = None

    async def window(self, now: float, models: Mapping[str, ModelSpec]) -> MetricsWindow:
        out = {}
        for key, spec in models.items():
            r = self.rates.get(key, 0.0)
            out[key] = ModelMetrics(rate=np.full(20, r), in_flight=np.full(20, r * spec.service_time_s))
        return MetricsWindow(now=now, step_s=15.0, models=out)


def _deployment(name: str, replicas: int, annotations: Mapping[str, str] | None = None) -> dict:
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "labels": labels,
                     "annotations": {"slotwise.io/slo-latency-ms": "500", "slotwise.io/service-time-ms": "100",
                                     "slotwise.io/max-replicas": "4", "slotwise.io/slot-kinds": "whole",
                                     **(annotations or {})}},
        "spec": {"replicas": replicas, "selector": {"matchLabels": labels},
                 "template": {"metadata": {"labels": labels}, "spec": {"containers": [
                     {"name": "server", "image": "registry.invalid/vllm:test",
                      "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}},
    }


async def _namespace(core: client.CoreV1Api, name: str) -> None:
    await core.create_namespace({"metadata": {"name": name}})
    # the ServiceAccount admission plugin wants one; no controller-manager here makes it
    await core.create_namespaced_service_account(name, {"metadata": {"name": "default"}})


async def _gpu_pod(core: client.CoreV1Api, ns: str, name: str, node: str, labels: Mapping[str, str],
                   ready: bool = True) -> None:
    """A pod bound to ``node`` holding one whole GPU, Running (and Ready) as its kubelet last reported."""
    await core.create_namespaced_pod(ns, {
        "metadata": {"name": name, "labels": dict(labels)},
        "spec": {"nodeName": node, "automountServiceAccountToken": False, "containers": [
            {"name": "c", "image": "registry.invalid/x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}})
    await core.patch_namespaced_pod_status(name, ns, {"status": {"phase": "Running", "conditions": [
        {"type": "Ready", "status": "True" if ready else "False", "lastTransitionTime": STAMP}]}})


async def _node_status(api: client.ApiClient, name: str, *, ready: str | None = None,
                       allocatable: Mapping[str, str] | None = None) -> None:
    """Set the node's Ready condition and/or allocatable through the status subresource (what a kubelet does)."""
    core = client.CoreV1Api(api)
    node = api.sanitize_for_serialization(await core.read_node(name))
    status = node.setdefault("status", {})
    if ready is not None:
        status["conditions"] = [{"type": "Ready", "status": ready, "reason": "KubeletReady" if ready == "True"
                                 else "KubeletNotReady", "lastHeartbeatTime": STAMP, "lastTransitionTime": STAMP}]
    if allocatable is not None:
        status["allocatable"] = {**status.get("allocatable", {}), **allocatable}
    await core.replace_node_status(name, node)


@pytest_asyncio.fixture
async def nodes(api: client.ApiClient) -> AsyncIterator[str]:
    """A name prefix for this test's GPU nodes (cluster-wide: all of them deleted afterwards)."""
    prefix = f"inv-{uuid.uuid4().hex[:6]}"
    yield prefix
    core = client.CoreV1Api(api)
    for n in (await core.list_node()).items:
        if n.metadata.name.startswith(prefix):
            await core.delete_node(n.metadata.name)


async def _synced_view(controller: Controller, until=lambda view: True):
    """Run the controller's informers until synced and ``until(view)``; the view then, informers stopped."""
    tasks = [asyncio.create_task(i.run()) for i in controller.informers]
    try:
        for inf in controller.informers:
            assert await inf.wait_synced(20.0), f"informer {inf.name} did not sync: {inf.stats.last_error}"
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 20.0
        view = controller.view()
        while not until(view) and loop.time() < deadline:
            await asyncio.sleep(0.05)
            view = controller.view()
        return view
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _settings(ns: str) -> ControllerSettings:
    return ControllerSettings(namespace=ns, lease_namespace=ns, lease_name="slotwise-inv", identity="inv-test",
                              http_port=0)


@pytest.mark.asyncio
async def test_namespaced_controller_sees_gpus_other_namespaces_hold(api: client.ApiClient, nodes: str) -> None:
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    ns_a, ns_b = f"{nodes}-a", f"{nodes}-b"
    for ns in (ns_a, ns_b):
        await _namespace(core, ns)
    node = f"{nodes}-gpu"
    await create_gpu_node(api, node, H100, 2, {"nvidia.com/gpu": "2", "cpu": "32", "memory": "128Gi", "pods": "110"})
    # namespace A: the controller's model, one replica on the node; namespace B: another tenant's training pod
    # on the node's other GPU, and a managed-looking Deployment that is not A's business
    await apps.create_namespaced_deployment(ns_a, _deployment("chat", 1))
    await apps.create_namespaced_deployment(ns_b, _deployment("theirs", 1))
    await _gpu_pod(core, ns_a, "chat-0", node, {"app": "chat"})
    await _gpu_pod(core, ns_b, "trainer", node, {"team": "research"})

    controller = Controller(api, _settings(ns_a))
    view = await _synced_view(controller, until=lambda v: node in v.nodes and v.nodes[node].gpu_pods)
    inv = view.snapshot.inventory
    assert node in inv.nodes
    # B's pod holds its GPU: the node has no GPU free, the packer places nothing there
    assert inv.model_of(f"{ns_b}/trainer") == f"pod:{ns_b}/trainer", "another namespace's GPU looks free"
    assert [inv.device(node, i).idle for i in range(2)] == [False, False]
    # the MIG gate and the lending actuator count every GPU pod on the node, whoever's
    assert view.nodes[node].gpu_pods == {"nvidia.com/gpu": 2}
    assert {p.key for p in view.nodes[node].pods} == {f"{ns_a}/chat-0", f"{ns_b}/trainer"}
    # models (and their replicas) stay in scope: only A's
    assert list(view.models) == [f"{ns_a}/chat"]
    assert [r.replica_id for r in view.snapshot.models[f"{ns_a}/chat"].replicas] == [f"{ns_a}/chat-0"]
    # and the cached pods carry nothing the translation does not read
    cached = controller.pods.get(f"{ns_b}/trainer")
    assert cached is not None and "image" not in cached["spec"]["containers"][0]


@pytest.mark.asyncio
async def test_notready_and_unadvertised_nodes_are_no_capacity(api: client.ApiClient, nodes: str) -> None:
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    ns = f"{nodes}-m"
    await _namespace(core, ns)
    cap = {"nvidia.com/gpu": "2", "cpu": "32", "memory": "128Gi", "pods": "110"}
    up, down, unplugged = f"{nodes}-up", f"{nodes}-down", f"{nodes}-unplugged"
    for n in (up, down, unplugged):
        await create_gpu_node(api, n, H100, 2, cap)
    await _node_status(api, up, ready="True")
    await _node_status(api, down, ready="Unknown")  # the kubelet stopped reporting
    await _node_status(api, unplugged, ready="True", allocatable={"nvidia.com/gpu": "0"})  # device plugin gone
    # chat has three pods, as the kubelets last reported them: Running and Ready on each node
    await apps.create_namespaced_deployment(ns, _deployment("chat", 3, {"slotwise.io/expected-rps": "5"}))
    for i, n in enumerate((up, down, unplugged)):
        await _gpu_pod(core, ns, f"chat-{i}", n, {"app": "chat"})

    controller = Controller(api, _settings(ns), metrics_source=Load({f"{ns}/chat": 400.0}))
    view = await _synced_view(controller, until=lambda v: len(v.nodes.get(unplugged, ()).pods or ()) == 1)
    inv = view.snapshot.inventory
    assert up in inv.nodes
    assert down not in inv.nodes, "a NotReady node is still capacity"
    assert unplugged not in inv.nodes, "a node whose device plugin advertises no GPUs is still capacity"
    assert "NotReady" in (view.nodes[down].out_of_service or "")
    assert "device plugin" in (view.nodes[unplugged].out_of_service or "")
    assert view.nodes[up].out_of_service is None

    obs = view.snapshot.models[f"{ns}/chat"]
    by_id = {r.replica_id: r for r in obs.replicas}
    assert set(by_id) == {f"{ns}/chat-{i}" for i in range(3)}  # still observed ...
    assert obs.active_replicas == 1 and obs.ready_replicas == 1  # ... but only the one on the good node is capacity
    assert by_id[f"{ns}/chat-1"].draining and not by_id[f"{ns}/chat-1"].ready
    assert by_id[f"{ns}/chat-2"].draining and by_id[f"{ns}/chat-2"].slot is None
    # the ReplicaSet still counts the two lost pods in spec.replicas: the actuator must ask for that many more
    assert view.models[f"{ns}/chat"].unavailable_replicas == 2

    # Heavy load: the plan scales up, and places only on the node that is capacity (its one free GPU).
    window = await controller.metrics_window(view)
    plan = controller.plan(view, window)
    placed = [a for a in plan.actions if isinstance(a, PlaceReplica)]
    assert placed, "the plan placed nothing"
    assert {a.slot.node for a in placed} == {up}, [a.slot for a in placed]


# -- the rules, on objects shaped as the API serves them (pure) -----------------------------------------------------
def _node(name: str, *, ready: str | None = "True", capacity: Mapping[str, str] | None = None,
          allocatable: Mapping[str, str] | None = None, alloc_map: bool = True) -> dict:
    cap = dict(capacity if capacity is not None else {"nvidia.com/gpu": "2"})
    status: dict = {"capacity": cap}
    if alloc_map:
        status["allocatable"] = dict(cap if allocatable is None else allocatable)
    if ready is not None:
        status["conditions"] = [{"type": "MemoryPressure", "status": "False"},
                                {"type": "Ready", "status": ready, "reason": "KubeletNotReady"}]
    return {"kind": "Node", "metadata": {"name": name, "labels": {"nvidia.com/gpu.product": H100,
                                                                  "nvidia.com/gpu.count": "2"}},
            "spec": {}, "status": status}


def test_out_of_service_rules() -> None:
    assert out_of_service(_node("a")) is None
    assert out_of_service(_node("a", ready=None)) is None  # no Ready condition reported yet: not judged
    assert "NotReady (Ready=False" in (out_of_service(_node("a", ready="False")) or "")
    assert "Ready=Unknown" in (out_of_service(_node("a", ready="Unknown")) or "")
    assert "device plugin" in (out_of_service(_node("a", allocatable={"nvidia.com/gpu": "0"})) or "")
    assert "device plugin" in (out_of_service(_node("a", allocatable={"cpu": "8"})) or "")  # missing = none
    # some devices unhealthy, some advertised: still capacity (of what the scheduler can place)
    assert out_of_service(_node("a", allocatable={"nvidia.com/gpu": "1"})) is None
    mig = {"nvidia.com/gpu": "0", "nvidia.com/mig-3g.40gb": "2"}
    assert out_of_service(_node("a", capacity=mig)) is None  # MIG instances advertised, no plain GPU: fine
    assert out_of_service(_node("a", capacity=mig, allocatable={"nvidia.com/mig-3g.40gb": "0"})) is not None
    assert out_of_service(_node("a", alloc_map=False)) is None  # nothing said about allocatable: not judged
    assert out_of_service(_node("a", capacity={"nvidia.com/gpu": "0"}, allocatable={})) is None  # none to lose


def _pod(name: str, ns: str, node: str, app: str, deleting: bool = False) -> dict:
    meta = {"name": name, "namespace": ns, "uid": name, "labels": {"app": app}, "creationTimestamp": STAMP}
    if deleting:
        meta["deletionTimestamp"] = STAMP
    return {"kind": "Pod", "metadata": meta,
            "spec": {"nodeName": node, "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}}


def test_build_view_scopes_models_not_the_inventory_and_counts_lost_replicas() -> None:
    deps = [{**_deployment("chat", 3), "metadata": {**_deployment("chat", 3)["metadata"], "namespace": "a"}},
            {**_deployment("other", 1), "metadata": {**_deployment("other", 1)["metadata"], "namespace": "b"}}]
    pods = [_pod("chat-0", "a", "up", "chat"), _pod("chat-1", "a", "down", "chat"),
            _pod("chat-2", "a", "down", "chat", deleting=True), _pod("other-0", "b", "up", "other")]
    nodes = [_node("up"), _node("down", ready="False")]
    v = build_view(deps, pods, nodes, now=1.7e9, namespace="a")
    assert list(v.models) == ["a/chat"]  # b's Deployment is no model of a controller scoped to a ...
    assert v.snapshot.inventory.model_of("b/other-0") == "pod:b/other-0"  # ... but its pod's GPU is taken
    assert list(v.snapshot.inventory.nodes) == ["up"]
    assert v.nodes["down"].out_of_service and v.nodes["down"].gpu_pods == {"nvidia.com/gpu": 2}
    obs = v.snapshot.models["a/chat"]
    assert obs.active_replicas == 1 and obs.ready_replicas == 1 and len(obs.replicas) == 3
    assert v.models["a/chat"].unavailable_replicas == 1  # the deleting one is no longer counted by the ReplicaSet
    everyone = build_view(deps, pods, nodes, now=1.7e9)
    assert list(everyone.models) == ["a/chat", "b/other"]
    assert everyone.snapshot.inventory.gpus_in_use() == v.snapshot.inventory.gpus_in_use() == 2
