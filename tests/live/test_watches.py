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

from autoscaler.live.controller import Controller, ControllerSettings
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
