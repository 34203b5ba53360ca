"""The controller's issue-17 watches on the real kube-apiserver (1.20.2): versions by discovery, kind stamped.

Before discovery every watch uses a version served wherever its group exists (HPAs: autoscaling/v1); after it,
the newest version both slotwise and the server speak (this server: autoscaling/v2beta2). Groups the server does
not serve (LeaderWorkerSet, Argo Rollouts, KEDA, resource.k8s.io here) are watched as optional: empty, synced.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest
from kubernetes_asyncio import client
from realparts.clusterplay import create_gpu_node
from realparts.scripted import ScriptedLoad, deployment
from test_controller_kube import leading

from autoscaler.api.plan import ScaleModel
from autoscaler.live.controller import Controller, ControllerSettings
from autoscaler.live.kube.actuator import ActuatorConfig
from autoscaler.live.kube.watches import AUTOSCALERS, RESOURCE_SLICES, WATCHES, WORKLOADS, by_role, stamped

pytest_plugins = ("realparts.kube",)


def _sts(name: str) -> dict:
    labels = {"app": name}
    return {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": name},
            "spec": {"replicas": 0, "serviceName": name, "selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels},
                                  "spec": {"containers": [{"name": "srv", "image": "x"}]}}}}


@pytest.mark.asyncio
async def test_watches_follow_discovery_and_stamp_kind(api: client.ApiClient) -> None:
    ns = f"watch-{uuid.uuid4().hex[:6]}"
    await client.CoreV1Api(api).create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    await client.AppsV1Api(api).create_namespaced_stateful_set(ns, _sts("llm"))
    await client.AutoscalingV1Api(api).create_namespaced_horizontal_pod_autoscaler(ns, {
        "apiVersion": "autoscaling/v1", "kind": "HorizontalPodAutoscaler", "metadata": {"name": "llm"},
        "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "llm"},
                 "minReplicas": 1, "maxReplicas": 3}})
    ctl = Controller(api, ControllerSettings(namespace=ns, lease_namespace=ns, http_port=0))
    hpa = next(w for w in WATCHES if w.kind == "HorizontalPodAutoscaler")
    assert ctl.watched[hpa].path == f"/apis/autoscaling/v1/namespaces/{ns}/horizontalpodautoscalers"
    await ctl.discover()
    assert ctl.watched[hpa].path == f"/apis/autoscaling/v2beta2/namespaces/{ns}/horizontalpodautoscalers"
    assert ctl.watched[hpa] in ctl.informers
    tasks = [asyncio.create_task(i.run()) for i in ctl.informers]
    try:
        for _ in range(200):
            if all(i.synced for i in ctl.informers):
                break
            await asyncio.sleep(0.05)
        assert all(i.synced for i in ctl.informers)
        got = by_role({w: inf.items() for w, inf in ctl.watched.items()})
        assert [(o["kind"], o["apiVersion"], o["metadata"]["name"]) for o in got[WORKLOADS]] == [
            ("StatefulSet", "apps/v1", "llm")]
        assert [(o["kind"], o["apiVersion"]) for o in got[AUTOSCALERS]] == [
            ("HorizontalPodAutoscaler", "autoscaling/v2beta2")]
        assert got[RESOURCE_SLICES] == []  # resource.k8s.io is not served here: optional, empty
        # the first read of the caches goes through build_view with every input
        ctl.view()
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await client.CoreV1Api(api).delete_namespace(ns)


def test_stamped_sets_kind_and_api_version_without_copying_stamped_objects() -> None:
    stamp = stamped("Rollout", "argoproj.io/v1alpha1")
    obj = {"metadata": {"name": "x"}}
    out = stamp(obj)
    assert out["kind"] == "Rollout" and out["apiVersion"] == "argoproj.io/v1alpha1" and "kind" not in obj
    assert stamp(out) is out


@pytest.mark.asyncio
@pytest.mark.parametrize("mode", ["hands-off", "advise"])
async def test_the_controller_leaves_a_workload_an_hpa_scales_alone(api: client.ApiClient, mode: str) -> None:
    """End to end through the controller's own informers (discovery: autoscaling/v2beta2 here): a model an HPA
    targets is planned (its load asks for more replicas) but its /scale is never written; in advise mode the
    exporter publishes what slotwise would have set. The model beside it, with no HPA, is scaled."""
    suffix = uuid.uuid4().hex[:6]
    ns = f"watch-hpa-{suffix}"
    await client.CoreV1Api(api).create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    apps = client.AppsV1Api(api)
    ann = {"slotwise.io/slo-latency-ms": "500", "slotwise.io/service-time-ms": "100",
           "slotwise.io/max-replicas": "4", "slotwise.io/slot-kinds": "whole"}
    for name in ("hpa-model", "free-model"):
        await apps.create_namespaced_deployment(ns, deployment(name, ann, {"limits": {"nvidia.com/gpu": "1"}}))
    await client.CustomObjectsApi(api).create_namespaced_custom_object("autoscaling", "v2beta2", ns,
                                                                       "horizontalpodautoscalers", {
        "apiVersion": "autoscaling/v2beta2", "kind": "HorizontalPodAutoscaler", "metadata": {"name": "hpa-model"},
        "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "hpa-model"},
                 "minReplicas": 1, "maxReplicas": 4}})
    settings = ControllerSettings(namespace=ns, lease_namespace=ns, lease_name=f"slotwise-{suffix}",
                                  identity=f"test-{suffix}", tick_s=1.0, http_port=0,
                                  actuator=ActuatorConfig(coexistence=mode))
    load = {f"{ns}/hpa-model": 25.0, f"{ns}/free-model": 25.0}  # ~2.5 busy replicas each: a scale-up
    ctl = Controller(api, settings, metrics_source=ScriptedLoad(load))
    node = f"{ns}-l4"
    await create_gpu_node(api, node, "NVIDIA-L4", 8,
                          {"nvidia.com/gpu": "8", "cpu": "64", "memory": "256Gi", "pods": "110"})
    try:
        await ctl.discover()
        async with leading(ctl):
            result = await ctl.tick()
            text = _exposition(ctl)  # while leading: a follower advises nothing
    finally:
        await client.CoreV1Api(api).delete_node(node)
    planned = {a.model: a.replicas for a in result.plan.of_type(ScaleModel)}
    assert planned.get(f"{ns}/hpa-model", 1) > 1 and planned.get(f"{ns}/free-model", 1) > 1, result.plan.describe()
    assert (await apps.read_namespaced_deployment_scale("hpa-model", ns)).spec.replicas == 1
    assert (await apps.read_namespaced_deployment_scale("free-model", ns)).spec.replicas == planned[f"{ns}/free-model"]
    assert result.view.models[f"{ns}/hpa-model"].autoscaled_by == f"HorizontalPodAutoscaler {ns}/hpa-model"
    advised = [line for line in text.splitlines()
               if line.startswith("slotwise_advised_replicas{") and f'namespace="{ns}"' in line]
    if mode == "advise":
        assert len(advised) == 1 and 'name="hpa-model"' in advised[0], advised
        assert float(advised[0].rsplit(" ", 1)[1]) == planned[f"{ns}/hpa-model"]
    else:
        assert advised == []
    assert not [line for line in _exposition(ctl).splitlines()
                if line.startswith("slotwise_advised_replicas{") and f'namespace="{ns}"' in line]  # lease released


def _exposition(ctl: Controller) -> str:
    from prometheus_client import generate_latest

    return generate_latest(ctl.exporter.registry).decode()


@pytest.mark.asyncio
async def test_one_discovery_points_the_kueue_watch_and_the_writers_at_what_is_served(api: client.ApiClient) -> None:
    from realparts.kueue import kueue_installed

    ctl = Controller(api, ControllerSettings(namespace="default", http_port=0))
    async with kueue_installed(api):
        apis = await ctl.discover()
    assert ctl.training[-1].path == "/apis/kueue.x-k8s.io/v1beta2/workloads" and ctl.training[-1] in ctl.informers
    assert ctl.lender.apis is apis and ctl.actuator.dra.apis is apis


@pytest.mark.asyncio
async def test_a_failed_discovery_leaves_every_watch_on_a_version_served_wherever_its_group_is(
        api: client.ApiClient, monkeypatch: pytest.MonkeyPatch) -> None:
    """Review finding: with discovery failed, its assumptions (autoscaling v2) sent the HPA watch -- which must
    sync -- to a path a 1.20-1.22 server does not serve: the controller never became ready. Now a failed discovery
    is asked again a few times, then every watch keeps its fallback (HPAs: autoscaling/v1), and the DRA actuation
    asks again on its first use instead of keeping "DRA not served"."""
    import autoscaler.live.controller as controller_module
    from autoscaler.live.kube.discovery import ASSUMED
    from autoscaler.live.kube.dra_act import DraActuation

    asked = []

    async def unreachable(api_client: object) -> object:
        asked.append(api_client)
        return ASSUMED  # what discover() answers when the server cannot be asked

    monkeypatch.setattr(controller_module, "discover", unreachable)
    ctl = Controller(api, ControllerSettings(namespace="ns", http_port=0))
    ctl.discovery_retry_s = (0.0, 0.0)
    assert await ctl.discover() is ASSUMED and len(asked) == 3
    paths = {w.kind: inf.path for w, inf in ctl.watched.items()}
    assert paths["HorizontalPodAutoscaler"] == "/apis/autoscaling/v1/namespaces/ns/horizontalpodautoscalers"
    assert paths["ResourceSlice"] == "/apis/resource.k8s.io/v1/resourceslices"
    dra = DraActuation(api, ASSUMED)
    assert await dra.version() is None and dra.apis.discovered  # asked the real server (1.20: no DRA)
