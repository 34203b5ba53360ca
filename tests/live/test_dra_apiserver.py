"""DRA end to end against the real kube-apiserver (1.20.2). ``resource.k8s.io/v1`` is NOT built into 1.20: it is the
upstream API served as CRDs carrying the upstream v1 schema (tests/realparts/dra_crds.yaml), with ResourceSlices
shaped as NVIDIA's DRA driver publishes them (tests/realparts/dra.py).

- A DRA-only GPU node pool, every object read back through the API (discovery picks ``resource.k8s.io/v1``), is
  scaled and packed with the same decisions as the same pool described by device-plugin labels and capacities.
- The actuator expresses a slot on DRA nodes as a ResourceClaimTemplate owned by the Deployment and rewrites the
  pod template (no ``nvidia.com/*`` resources, no GFD product selector). 1.20's built-in PodSpec has no
  ``resourceClaims`` field (1.26+), so the server drops the claim reference the patch adds; the patch's content is
  pinned in tests/live/test_dra_claims.py.
- A MIG re-layout on a static-MIG DRA node is refused (skipped, Warning Event on the node naming DynamicMIG); on a
  dynamic-MIG node it is skipped with nothing to write.
"""

from __future__ import annotations

import contextlib
import copy
import uuid
from typing import Any

import pytest
import pytest_asyncio
from kubernetes_asyncio import client
from realparts.crds import crds_installed
from realparts.dra import dra_twin, node_slice
from test_dra_translate import _canonical, _cluster, _decided, _plan

from autoscaler.api.plan import Plan, SetMigLayout, SetSlotTemplate
from autoscaler.api.snapshot import ClusterSnapshot
from autoscaler.live.controller import read_view
from autoscaler.live.kube.actuator import ActuatorConfig, KubeActuator
from autoscaler.live.kube.discovery import RESOURCE, discover
from autoscaler.live.kube.fields import parse_time
from autoscaler.live.kube.objects import ClusterView, ManagedModel
from sharing.catalog import load_catalog
from sharing.render import GPU_PRODUCT
from sharing.slots import Inventory

pytest_plugins = ("realparts.kube",)

aio = pytest.mark.asyncio
CAT = load_catalog()
H100 = CAT.get("H100-80GB")
G, V = "resource.k8s.io", "v1"
MERGE = "application/merge-patch+json"


@pytest_asyncio.fixture
async def ns(api: client.ApiClient) -> str:
    name = f"slotwise-dra-{uuid.uuid4().hex[:8]}"
    core = client.CoreV1Api(api)
    await core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    await core.create_namespaced_service_account(name, {"metadata": {"name": "default"}})
    return name


@contextlib.asynccontextmanager
async def nodes_created(api: client.ApiClient, nodes: list[dict]):
    core = client.CoreV1Api(api)
    try:
        for n in nodes:
            await core.create_node({k: v for k, v in n.items() if k != "status"})
        yield
    finally:
        for n in nodes:
            with contextlib.suppress(client.ApiException):
                await core.delete_node(n["metadata"]["name"])


def _in_ns(objs: list[dict], ns: str) -> list[dict]:
    out = copy.deepcopy(objs)
    for o in out:
        o["metadata"]["namespace"] = ns
    return out


async def _listed(api: client.ApiClient, ns: str) -> dict[str, list[dict]]:
    """Everything a view is built from, as the server lists it (kind/apiVersion set, as the informers stamp)."""
    s = api.sanitize_for_serialization
    core, apps, custom = client.CoreV1Api(api), client.AppsV1Api(api), client.CustomObjectsApi(api)
    version = (await discover(api)).pick(RESOURCE)
    assert version == "v1"  # the CRDs serve resource.k8s.io/v1 and discovery says so

    def stamp(items: list, kind: str, api_version: str) -> list[dict]:
        return [{**s(i), "kind": kind, "apiVersion": api_version} for i in items]

    return {
        "deployments": stamp((await apps.list_namespaced_deployment(ns)).items, "Deployment", "apps/v1"),
        "pods": stamp((await core.list_namespaced_pod(ns)).items, "Pod", "v1"),
        "nodes": stamp((await core.list_node()).items, "Node", "v1"),
        "resource_slices": (await custom.list_cluster_custom_object(G, version, "resourceslices"))["items"],
        "resource_claims": (await custom.list_namespaced_custom_object(G, version, ns, "resourceclaims"))["items"],
    }


@aio
async def test_a_dra_only_pool_through_the_api_is_scaled_and_packed_like_the_device_plugin_pool(api, ns) -> None:
    # whole H100s and MIG H100s (1g.10gb instances), two models each running one replica, load for more
    deps, dp_pods, dp_nodes = _cluster([("whole-h100", 2, [0, 0, 0]), ("mig-h100", 2, [1, 2, 2])],
                                       [(0, 0, 1), (1, 1, 2)])
    deps, dp_pods = _in_ns(deps, ns), _in_ns(dp_pods, ns)
    core, apps, custom = client.CoreV1Api(api), client.AppsV1Api(api), client.CustomObjectsApi(api)
    async with crds_installed(api, "dra_crds.yaml"):
        for d in deps:
            await apps.create_namespaced_deployment(ns, d)
        # the pods as a DRA cluster runs them: no nvidia.com/* resources (their devices come by claims)
        _n, bare_pods, _s, _c = dra_twin(dp_nodes, dp_pods, Inventory.from_nodes([]))
        for p in bare_pods:
            status = p.pop("status")
            p["spec"]["automountServiceAccountToken"] = False
            await core.create_namespaced_pod(ns, p)
            await core.patch_namespaced_pod_status(p["metadata"]["name"], ns, {"status": status})
        pods = (await _listed(api, ns))["pods"]
        # the device-plugin description of the same pods (their GPU requests back) and nodes
        wants = {p["metadata"]["name"]: p["spec"]["containers"][0]["resources"] for p in dp_pods}
        for p in pods:
            p["spec"]["containers"][0]["resources"] = wants[p["metadata"]["name"]]
        now = max(parse_time(p["metadata"]["creationTimestamp"]) or 0.0 for p in pods) + 60.0  # one instant for both
        listed = await _listed(api, ns)
        dp = read_view(listed["deployments"], pods, dp_nodes, now=now)
        assert not dp.problems, dp.problems
        # the DRA description: bare nodes, the driver's slices (the layout, MIG GPUs first), allocated claims
        twin_nodes, _p, slices, claims = dra_twin(dp_nodes, pods, dp.snapshot.inventory)
        uids = {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods}
        async with nodes_created(api, twin_nodes):
            for sl in slices:
                await custom.create_cluster_custom_object(G, V, "resourceslices", sl)
            for c in claims:
                status = c.pop("status")
                for r in status["reservedFor"]:
                    r["uid"] = uids[r["name"]]  # the pod the server made
                await custom.create_namespaced_custom_object(G, V, ns, "resourceclaims", c)
                await custom.patch_namespaced_custom_object_status(G, V, ns, "resourceclaims", c["metadata"]["name"],
                                                                   {"status": status}, _content_type=MERGE)
            listed = await _listed(api, ns)
            assert not any(k.startswith("nvidia.com/") for n in listed["nodes"]
                           for k in (n["metadata"].get("labels") or {}))  # a DRA-only pool: no GFD labels
            dra = read_view(listed["deployments"], listed["pods"], listed["nodes"], now=now,
                            resource_slices=listed["resource_slices"], resource_claims=listed["resource_claims"])
            for sl in slices:
                await custom.delete_cluster_custom_object(G, V, "resourceslices", sl["metadata"]["name"])
    assert not dra.problems, dra.problems
    assert _canonical(dra.snapshot.inventory) == _canonical(dp.snapshot.inventory)
    assert dra.snapshot.models == dp.snapshot.models
    plan = _plan(dp)
    assert _decided(_plan(dra)) == _decided(plan)
    kinds = {type(a).__name__ for a in plan.actions}
    assert {"ScaleModel", "PlaceReplica"} <= kinds  # scaled and packed, the same way


def _view(models: list[ManagedModel]) -> ClusterView:
    return ClusterView(ClusterSnapshot(0.0, {}, Inventory.from_nodes([])), {m.key: m for m in models}, {})


def _bare(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}}}


@aio
async def test_the_actuator_writes_a_claim_template_owned_by_the_deployment(api, ns) -> None:
    apps, custom = client.AppsV1Api(api), client.CustomObjectsApi(api)
    res = {"limits": {"nvidia.com/gpu": "1", "cpu": "4"}, "requests": {"nvidia.com/gpu": "1", "memory": "16Gi"}}
    body = {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "llm", "annotations": {"slotwise.io/slo-latency-ms": "250"}},
            "spec": {"replicas": 0, "selector": {"matchLabels": {"app": "llm"}},
                     "template": {"metadata": {"labels": {"app": "llm"}}, "spec": {
                         "nodeSelector": {GPU_PRODUCT: "NVIDIA-H100-80GB-HBM3", "pool": "inference"},
                         "containers": [{"name": "server", "image": "registry.invalid/vllm:test", "resources": res}]}}}}
    dep = await apps.create_namespaced_deployment(ns, body)
    m = ManagedModel(key=f"{ns}/llm", namespace=ns, name="llm", uid=dep.metadata.uid, replicas=0,
                     container="server", resources=res)
    async with crds_installed(api, "dra_crds.yaml"), nodes_created(api, [_bare("dra-dyn")]):
        sl = node_slice(H100, "dra-dyn", dynamic=1)
        await custom.create_cluster_custom_object(G, V, "resourceslices", sl)
        act = KubeActuator(api, ActuatorConfig())
        wanted = {"limits": {"nvidia.com/mig-3g.40gb": "1"}, "requests": {"nvidia.com/mig-3g.40gb": "1"}}
        r = await act.apply(Plan(0.0, [SetSlotTemplate(m.key, wanted, {GPU_PRODUCT: "NVIDIA-H100-80GB-HBM3"})]),
                            _view([m]))
        assert not r.errors, r.errors
        (line,) = r.applied
        assert "ResourceClaimTemplate" in line and "dra-dyn" in line
        templates = (await custom.list_namespaced_custom_object(G, V, ns, "resourceclaimtemplates"))["items"]
        (tmpl,) = templates
        assert tmpl["metadata"]["ownerReferences"] == [{"apiVersion": "apps/v1", "kind": "Deployment", "name": "llm",
                                                        "uid": dep.metadata.uid, "blockOwnerDeletion": False,
                                                        "controller": False}]
        (req,) = tmpl["spec"]["spec"]["devices"]["requests"]
        assert req["name"] == "gpu" and req["exactly"]["deviceClassName"] == "mig.nvidia.com"
        exprs = [s["cel"]["expression"] for s in req["exactly"]["selectors"]]
        assert exprs == ['device.attributes["gpu.nvidia.com"].productName == "NVIDIA H100 80GB HBM3"',
                         'device.attributes["gpu.nvidia.com"].profile == "3g.40gb"']
        spec = api.sanitize_for_serialization(await apps.read_namespaced_deployment("llm", ns))["spec"]["template"]
        c = spec["spec"]["containers"][0]
        assert c["resources"]["limits"] == {"cpu": "4"} and c["resources"]["requests"] == {"memory": "16Gi"}
        assert spec["spec"]["nodeSelector"] == {"pool": "inference"}  # DRA nodes carry no GFD product label
        await custom.delete_cluster_custom_object(G, V, "resourceslices", sl["metadata"]["name"])


@aio
async def test_mig_relayout_is_refused_on_static_mig_dra_nodes_and_skipped_on_dynamic_ones(api) -> None:
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    static = node_slice(H100, "dra-static", mig={0: [("3g", 0), ("3g", 4)]})
    dynamic = node_slice(H100, "dra-dynamic", dynamic=1)
    async with crds_installed(api, "dra_crds.yaml"), nodes_created(api, [_bare("dra-static"), _bare("dra-dynamic")]):
        for sl in (static, dynamic):
            await custom.create_cluster_custom_object(G, V, "resourceslices", sl)
        act = KubeActuator(api, ActuatorConfig(mig_relayout=True))
        layouts = {0: (("7g", 0),)}
        plan = Plan(0.0, [SetMigLayout("dra-static", "cfg", {}, dict(layouts), (0,)),
                          SetMigLayout("dra-dynamic", "cfg", {}, dict(layouts), (0,))])
        r = await act.apply(plan, _view([]))
        assert not r.errors, r.errors
        assert r.why("mig-layout dra-static") == ["dra-static-mig"]
        assert r.why("mig-layout dra-dynamic") == ["dra-dynamic-mig"]
        assert not act.gate.jobs  # nothing reached the device-plugin MIG gate
        events = (await core.list_namespaced_event("default", field_selector="involvedObject.name=dra-static")).items
        (ev,) = events
        assert (ev.type, ev.reason, ev.involved_object.kind) == ("Warning", "MigRelayoutRefused", "Node")
        assert "DynamicMIG" in ev.message
        assert not (await core.list_namespaced_event("default", field_selector="involvedObject.name=dra-dynamic")).items
        for name in ("dra-static", "dra-dynamic"):
            assert "nvidia.com/mig.config" not in ((await core.read_node(name)).metadata.labels or {})
        for sl in (static, dynamic):
            await custom.delete_cluster_custom_object(G, V, "resourceslices", sl["metadata"]["name"])


@aio
async def test_dra_nodes_that_cannot_be_read_stop_no_other_action(api, ns) -> None:
    """Review finding: the fresh ResourceSlice read behind a MIG re-layout failed (here: the server says DRA is
    served but the collection answers 404) and the whole apply() raised -- the tick's scale-ups were lost. Now
    the re-layouts wait (skipped ``dra-unknown``, an error line) and the scale in the same plan is written."""
    from autoscaler.api.plan import Reason, ScaleModel
    from autoscaler.live.kube.discovery import ServedApis
    from autoscaler.live.kube.dra_act import DraActuation

    apps = client.AppsV1Api(api)
    await apps.create_namespaced_deployment(ns, {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "llm"},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "llm"}},
                 "template": {"metadata": {"labels": {"app": "llm"}},
                              "spec": {"containers": [{"name": "srv", "image": "registry.invalid/x"}]}}}})
    mm = ManagedModel(key=f"{ns}/llm", namespace=ns, name="llm", uid="", replicas=1, container="srv")
    act = KubeActuator(api, ActuatorConfig(mig_relayout=True))
    act.dra = DraActuation(api, ServedApis({G: (V,)}))  # "served", but no CRDs installed: the list fails
    plan = Plan(0.0, [SetMigLayout("some-node", "cfg", {}, {0: (("7g", 0),)}, (0,)),
                      ScaleModel(mm.key, 2, 1, Reason.FORECAST)])
    r = await act.apply(plan, _view([mm]))
    assert r.why("mig-layout some-node") == ["dra-unknown"] and any("DRA nodes" in e for e in r.errors), r
    assert r.applied == [f"scale {mm.key}: 1 -> 2 (forecast)"], r
    assert (await apps.read_namespaced_deployment_scale("llm", ns)).spec.replicas == 2


@aio
async def test_tainted_devices_and_devices_the_device_class_leaves_out_are_no_capacity(api, ns) -> None:
    """Issue 30: devices[].taints (KEP 5055; the CRD carries upstream's DeviceTaint schema) and the DeviceClass the
    claims name, both read back through the API. Of five whole H100s: gpu-0 NoSchedule, gpu-1 NoExecute, gpu-2 a
    taint of effect None (no effect), gpu-3 left out by the admin's narrowed gpu.nvidia.com DeviceClass, gpu-4
    tainted by a DeviceTaintRule (alpha ``v1alpha3``, served as a CRD too, tests/realparts/dra_taint_rule_crds.yaml):
    only gpu-2 is free. The MIG device is selected by mig.nvidia.com and free too."""
    from realparts.dra import gpu_device, mig_device, resource_slice

    custom = client.CustomObjectsApi(api)

    def taint(dev: dict[str, Any], effect: str) -> dict[str, Any]:
        return {**dev, "taints": [{"key": "gpu.nvidia.com/unhealthy", "value": "xid-79", "effect": effect}]}

    devices = [taint(gpu_device(H100, 0), "NoSchedule"), taint(gpu_device(H100, 1), "NoExecute"),
               taint(gpu_device(H100, 2), "None"), gpu_device(H100, 3), gpu_device(H100, 4),
               mig_device(H100, 5, "3g", 0)]
    rule = {"apiVersion": f"{G}/v1alpha3", "kind": "DeviceTaintRule", "metadata": {"name": "drain-gpu-4"},
            "spec": {"deviceSelector": {"driver": "gpu.nvidia.com", "pool": "dra-taint", "device": "gpu-4"},
                     "taint": {"key": "example.com/maintenance", "effect": "NoSchedule"}}}
    # NVIDIA's class, narrowed by the admin to leave gpu-3 (PCIe bus 0000:13:00.0) out
    gpu_class = {"apiVersion": f"{G}/{V}", "kind": "DeviceClass", "metadata": {"name": "gpu.nvidia.com"},
                 "spec": {"selectors": [
                     {"cel": {"expression": "device.driver == 'gpu.nvidia.com' && "
                                            "device.attributes['gpu.nvidia.com'].type == 'gpu'"}},
                     {"cel": {"expression": "device.attributes['gpu.nvidia.com'].pcieBusID != '0000:13:00.0'"}}]}}
    mig_class = {"apiVersion": f"{G}/{V}", "kind": "DeviceClass", "metadata": {"name": "mig.nvidia.com"},
                 "spec": {"selectors": [{"cel": {"expression": "device.driver == 'gpu.nvidia.com' && "
                                                               "device.attributes['gpu.nvidia.com'].type == 'mig'"}}]}}
    async with crds_installed(api, "dra_crds.yaml", "dra_taint_rule_crds.yaml"), \
            nodes_created(api, [_bare("dra-taint")]):
        sl = resource_slice("dra-taint", devices)
        await custom.create_cluster_custom_object(G, V, "resourceslices", sl)
        bad = resource_slice("dra-bad", [{**gpu_device(H100, 0), "taints": [{"key": "k", "effect": "Sometimes"}]}])
        with pytest.raises(client.ApiException) as refused:  # the schema is upstream's: effect is an enum
            await custom.create_cluster_custom_object(G, V, "resourceslices", bad)
        assert refused.value.status == 422
        for c in (gpu_class, mig_class):
            await custom.create_cluster_custom_object(G, V, "deviceclasses", c)
        await custom.create_cluster_custom_object(G, "v1alpha3", "devicetaintrules", rule)
        rules = (await custom.list_cluster_custom_object(G, "v1alpha3", "devicetaintrules"))["items"]
        listed = await _listed(api, ns)
        (served,) = [s for s in listed["resource_slices"] if s["spec"]["nodeName"] == "dra-taint"]
        assert served["spec"]["devices"][0]["taints"][0]["effect"] == "NoSchedule"  # kept by the server
        classes = (await custom.list_cluster_custom_object(G, V, "deviceclasses"))["items"]
        nodes = [n for n in listed["nodes"] if n["metadata"]["name"] == "dra-taint"]
        v = read_view([], [], nodes, now=0.0, resource_slices=listed["resource_slices"], device_classes=classes,
                      device_taint_rules=rules)
        await custom.delete_cluster_custom_object(G, V, "resourceslices", sl["metadata"]["name"])
        for c in (gpu_class, mig_class):
            await custom.delete_cluster_custom_object(G, V, "deviceclasses", c["metadata"]["name"])
    inv = v.snapshot.inventory
    free = [i for i in range(inv.nodes["dra-taint"].gpu_count) if inv.device("dra-taint", i).idle]
    # index 0 is the MIG GPU (MIG GPUs first), then gpu-0..4 as indices 1..5: only gpu-2 (index 3) is free whole
    assert free == [3], (free, v.problems)
    assert not inv.device("dra-taint", 0).occupants(("3g", 0))  # the MIG instance: selected, untainted, free
    assert any("gpu-0: tainted gpu.nvidia.com/unhealthy=xid-79:NoSchedule" in x for x in v.problems), v.problems
    assert any("gpu-3: not selected by DeviceClass gpu.nvidia.com" in x for x in v.problems), v.problems
    assert any("gpu-4: tainted example.com/maintenance:NoSchedule" in x for x in v.problems), v.problems
