"""Issue 30 item 2: a namespaced controller caches, and reads each tick, only the pods that can matter to it.

The pods informer stays cluster-wide (another namespace's GPUs are never free: the guarantee test is
``test_inventory_safety.py::test_namespaced_controller_sees_gpus_other_namespaces_hold``), but before, it held every
pod of the cluster and ``build_view`` walked (and sorted) all of them every tick, even in namespace mode where
most are nobody's business. Now its ``keep`` (:class:`~autoscaler.live.kube.pods.PodScope`) drops, at ingest,
other namespaces' pods that request no GPU, claim no DRA device, are no preemptible training pod and run on no
GPU node, and every terminal pod.

Against a REAL kube-apiserver, through the controller's own informers: namespace A is the controller's, B
another tenant's. B's CPU pod on a CPU node (and a pending one) is not cached; B's GPU pod, B's CPU pod on the GPU
node (its CPU counts against the node's host capacity), B's preemptible pod and A's own CPU pod are. A node that
gets its GPUs only after a CPU pod was bound to it (the device plugin starting late) brings that pod back (a
re-list); a pod that finishes leaves the cache.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from kubernetes_asyncio import client
from realparts.clusterplay import create_gpu_node

from autoscaler.live.controller import Controller, ControllerSettings

pytest_plugins = ("realparts.kube",)

H100 = "NVIDIA-H100-80GB-HBM3"
CAP = {"nvidia.com/gpu": "2", "cpu": "32", "memory": "128Gi", "pods": "110"}
WAIT_S = 20.0


async def _namespace(core: client.CoreV1Api, name: str) -> None:
    await core.create_namespace({"metadata": {"name": name}})
    await core.create_namespaced_service_account(name, {"metadata": {"name": "default"}})


async def _pod(core: client.CoreV1Api, ns: str, name: str, node: str | None, *, gpus: int = 0,
               labels: dict[str, str] | None = None) -> None:
    limits = {"nvidia.com/gpu": str(gpus)} if gpus else {}
    spec: dict = {"automountServiceAccountToken": False, "containers": [
        {"name": "c", "image": "registry.invalid/x", "resources": {"requests": {"cpu": "2"}, "limits": limits}}]}
    if node is not None:
        spec["nodeName"] = node
    await core.create_namespaced_pod(ns, {"metadata": {"name": name, "labels": labels or {}}, "spec": spec})


async def _eventually(condition, what: str, timeout: float = WAIT_S) -> None:  # type: ignore[no-untyped-def]
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for: {what}")
        await asyncio.sleep(0.05)


@pytest_asyncio.fixture
async def prefix(api: client.ApiClient) -> AsyncIterator[str]:
    prefix = f"scope-{uuid.uuid4().hex[:6]}"
    yield prefix
    core = client.CoreV1Api(api)
    for n in (await core.list_node()).items:
        if n.metadata.name.startswith(prefix):
            await core.delete_node(n.metadata.name)


@pytest.mark.asyncio
async def test_a_namespaced_controller_does_not_hold_other_namespaces_unrelated_pods(
    api: client.ApiClient, prefix: str
) -> None:
    core = client.CoreV1Api(api)
    ns_a, ns_b = f"{prefix}-a", f"{prefix}-b"
    for ns in (ns_a, ns_b):
        await _namespace(core, ns)
    gpu, cpu, late = f"{prefix}-gpu", f"{prefix}-cpu", f"{prefix}-late"
    await create_gpu_node(api, gpu, H100, 2, CAP)
    for name in (cpu, late):  # no GPU (yet): what the device plugin has not advertised
        await core.create_node({"metadata": {"name": name}})
    await _pod(core, ns_a, "mine", cpu)  # the scope's own CPU pod: kept whatever it requests
    await _pod(core, ns_b, "web", cpu)  # the unrelated pod: another namespace, no GPU, a CPU node
    await _pod(core, ns_b, "pending", None)  # not bound anywhere yet
    await _pod(core, ns_b, "trainer", gpu, gpus=1)  # another tenant's GPU: the inventory must see it
    await _pod(core, ns_b, "agent", gpu)  # a CPU pod on the GPU node: its CPU is the node's host capacity
    await _pod(core, ns_b, "borrower", cpu, labels={"slotwise.io/preemptible": "true"})  # the lend stage's
    await _pod(core, ns_b, "daemon", late)  # on a node that gets its GPUs later

    controller = Controller(api, ControllerSettings(namespace=ns_a, lease_namespace=ns_a, identity="scope-test",
                                                    http_port=0))
    tasks = [asyncio.create_task(i.run()) for i in controller.informers]
    pods = controller.pods
    try:
        for inf in controller.informers:
            assert await inf.wait_synced(WAIT_S), f"informer {inf.name} did not sync: {inf.stats.last_error}"
        cached = {k for k in (f"{ns}/{n}" for ns in (ns_a, ns_b)
                              for n in ("mine", "web", "pending", "trainer", "agent", "borrower", "daemon"))
                  if pods.get(k) is not None}
        assert cached == {f"{ns_a}/mine", f"{ns_b}/trainer", f"{ns_b}/agent", f"{ns_b}/borrower"}, (
            "the namespaced controller's pods cache holds pods that cannot matter to it (or misses one that does)")
        assert pods.stats.dropped >= 3
        # what each tick reads: the GPU node's pods all there (the inventory's and the host capacity's view)
        view = controller.view()
        assert {p.key for p in view.nodes[gpu].pods} == {f"{ns_b}/trainer", f"{ns_b}/agent"}
        assert view.nodes[gpu].gpu_pods == {"nvidia.com/gpu": 1}

        # a pod bound later to the GPU node is kept from its binding on
        await core.create_namespaced_binding(ns_b, {"apiVersion": "v1", "kind": "Binding",
                                                    "metadata": {"name": "pending"},
                                                    "target": {"apiVersion": "v1", "kind": "Node", "name": gpu}},
                                             _preload_content=False)  # what the scheduler does
        await _eventually(lambda: pods.get(f"{ns_b}/pending") is not None, "the pod bound to the GPU node cached")
        # the late node's device plugin advertises its GPUs: the pod bound to it before comes back
        node = api.sanitize_for_serialization(await core.read_node(late))
        node.setdefault("status", {})["capacity"] = node["status"]["allocatable"] = dict(CAP)
        await core.replace_node_status(late, node)
        await _eventually(lambda: pods.get(f"{ns_b}/daemon") is not None, "the late GPU node's pod re-listed")
        assert pods.stats.relists >= 1 and pods.get(f"{ns_b}/web") is None
        # a pod that finishes leaves the cache (nobody's replica, holds nothing)
        await core.patch_namespaced_pod_status("agent", ns_b, {"status": {"phase": "Succeeded"}})
        await _eventually(lambda: pods.get(f"{ns_b}/agent") is None, "the finished pod dropped")
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def test_the_scope_keeps_what_matters() -> None:
    from autoscaler.live.kube.pods import PodScope

    relists: list[int] = []
    scope = PodScope(frozenset({"a"}), relist=lambda: relists.append(1))

    def pod(ns: str, node: str | None = None, **spec: object) -> dict:
        return {"metadata": {"namespace": ns, "name": "p"}, "spec": {"nodeName": node, **spec}, "status": {}}

    assert scope.keep(pod("a")) and not scope.keep(pod("b", "n1"))
    assert scope.keep(pod("b", None, resourceClaims=[{"name": "gpu"}]))  # a DRA claim
    assert scope.keep(pod("b", None, containers=[{"resources": {"limits": {"nvidia.com/mig-1g.10gb": "1"}}}]))
    scope.on_slice("ADDED", {"metadata": {"name": "s1"}, "spec": {"nodeName": "n1"}})  # a DRA node
    assert scope.keep(pod("b", "n1")) and relists == [1]
    scope.on_slice("DELETED", {"metadata": {"name": "s1"}, "spec": {"nodeName": "n1"}})
    assert not scope.keep(pod("b", "n1"))
    assert not scope.keep({**pod("a"), "status": {"phase": "Failed"}})  # terminal: never
    everything = PodScope(None)
    assert everything.keep(pod("b", "n1")) and not everything.keep({**pod("b"), "status": {"phase": "Succeeded"}})
