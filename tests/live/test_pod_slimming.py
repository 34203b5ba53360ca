"""The pods informer's ``transform`` (:func:`autoscaler.live.kube.pods.slim_pod`): what it drops changes no view.

The cache keeps only the fields the readers of cached pods use; every view built from slimmed pods must equal
the view built from the pods as served (whatever else they carry: env, volumes, managedFields, probes, the
last-applied annotation ...). Plus one test against the real apiserver that the informer applies the transform
to listed and to watched objects.
"""

from __future__ import annotations

import asyncio
import copy
import random
import uuid
from typing import Any

import pytest
from kubernetes_asyncio import client
from test_kube_translate import _cluster, deployment, gpu_node, mig_node, pod, view

from autoscaler.live.kube.informer import Informer
from autoscaler.live.kube.pods import slim_pod
from sharing.lending import LendingPolicy

pytest_plugins = ("realparts.kube",)


def fatten(p: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    """The pod as a real apiserver serves it: everything slim_pod must drop, and nothing a reader needs."""
    p = copy.deepcopy(p)
    meta = p["metadata"]
    meta["generateName"] = meta["name"][:-1]
    meta["managedFields"] = [{"manager": "kube-controller-manager", "operation": "Update", "apiVersion": "v1",
                              "fieldsType": "FieldsV1", "fieldsV1": {"f:metadata": {"f:labels": {}}}}]
    meta.setdefault("annotations", {})["kubectl.kubernetes.io/last-applied-configuration"] = '{"env": "SECRET"}'
    meta["resourceVersion"] = str(rng.randrange(1, 10**6))
    spec = p["spec"]
    spec["volumes"] = [{"name": "token", "secret": {"secretName": "hf-token"}}]
    spec["serviceAccountName"] = "default"
    spec["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists"}]
    for c in spec.get("containers") or ():
        c["env"] = [{"name": "HF_TOKEN", "value": "hf_secret"}]
        c["command"] = ["python", "-m", "vllm.entrypoints.openai.api_server"]
        c["volumeMounts"] = [{"name": "token", "mountPath": "/var/run/secrets"}]
        c["readinessProbe"] = {"httpGet": {"path": "/health", "port": 8000}}
    spec["initContainers"] = [{"name": "fetch", "image": "busybox", "env": [{"name": "X", "value": "y"}],
                               "resources": {"limits": {"cpu": "1"}}}]
    status = p["status"]
    if "startTime" in status:  # started a little after it was created, as real pods do
        status["startTime"] = status["startTime"].replace(":00Z", ":30Z")
    status["hostIP"] = "10.0.0.1"
    status["podIP"] = f"10.1.{rng.randrange(256)}.{rng.randrange(256)}"
    status["containerStatuses"] = [{"name": "server", "ready": True, "restartCount": 0, "image": "x"}]
    return p


def _scenarios() -> list[tuple[str, list, list, list, list, dict]]:
    """(name, deployments, pods, nodes, training objects, build_view keywords): clusters that exercise every reader
    of a pod (replicas, slots, MIG, time-slicing, draining, pending, terminal, training, lent nodes, Kueue)."""
    out = []
    for seed in range(6):
        deps, pods, nodes = _cluster(seed)
        pods += [pod("draining", "w", node="gpu-1", deleting=True), pod("pending", "w", node=None),
                 pod("done", "w", phase="Succeeded"), pod("unready", "g", node="mig-1",
                                                           gpus={"nvidia.com/mig-2g.20gb": "1"}, ready=False)]
        out.append((f"cluster-{seed}", deps, pods, nodes, [], {}))
    pre = {"slotwise.io/preemptible": "true"}
    owner = {"apiVersion": "batch/v1", "kind": "Job", "name": "pretrain", "uid": "job-uid", "controller": True}
    job = {"kind": "Job", "metadata": {"name": "pretrain", "namespace": "train", "uid": "job-uid", "labels": pre},
           "spec": {"parallelism": 2, "template": {"spec": {"containers": [
               {"name": "t", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}},
           "status": {"active": 2, "startTime": "2024-05-01T12:05:00Z"}}
    training_pods = [
        # one found by its job-name label, one by its ownerReference only
        pod(f"pretrain-{i}", ns="train", node="lent-1", labels={**pre, "job-name": "pretrain"} if i else pre,
            owner=owner, grace=120, annotations={"slotwise.io/last-checkpoint": "2024-05-01T11:50:00Z"})
        for i in range(2)
    ] + [pod("scratch", ns="train", node="gpu-1", gpus={"nvidia.com/gpu": "2"}, labels=pre, grace=45,
             annotations={"slotwise.io/last-checkpoint": "2024-05-01T11:40:00Z"})]
    lent = gpu_node("lent-1", count=2, labels={"slotwise.io/lent": "true"})
    lent["metadata"]["annotations"] = {"slotwise.io/lent-since": "2024-05-01T12:00:00Z"}
    lent["spec"]["taints"] = [{"key": "slotwise.io/lent", "value": "true", "effect": "NoSchedule"}]
    nodes = [gpu_node("gpu-1", count=4), lent, mig_node("mig-1", {"3g.40gb": 2}, count=1)]
    deps = [deployment("w"), deployment("g", resources={"limits": {"nvidia.com/mig-3g.40gb": "1"}})]
    pods = [*training_pods, pod("w-0", "w"), pod("g-0", "g", node="mig-1", gpus={"nvidia.com/mig-3g.40gb": "1"})]
    out.append(("training-pods-mode", deps, pods, nodes, [job], {}))
    out.append(("training-kueue-mode", deps, [p for p in pods if p["spec"].get("nodeName") != "lent-1"],
                [nodes[0], nodes[2]], [job], {"lending": LendingPolicy(enabled=True, mode="kueue")}))
    return out


@pytest.mark.parametrize("scenario", _scenarios(), ids=lambda s: s[0])
def test_views_of_slimmed_pods_equal_views_of_full_pods(scenario) -> None:
    _, deps, pods, nodes, training, kw = scenario
    rng = random.Random(11)
    full = [fatten(p, rng) for p in pods]
    a = view(deps, full, nodes, training, **kw)
    b = view(deps, [slim_pod(p) for p in full], nodes, training, **kw)
    assert a.snapshot.models and a.snapshot.inventory.gpus_in_use() > 0  # the scenario has something to compare
    assert b.snapshot == a.snapshot
    assert b.nodes == a.nodes and b.models == a.models and b.training == a.training
    assert b.problems == a.problems


def test_slim_pod_drops_what_no_reader_needs() -> None:
    p = fatten(pod("x", "w", annotations={"slotwise.io/last-checkpoint": "2024-05-01T11:50:00Z"}), random.Random(1))
    s = slim_pod(p)
    text = repr(s)
    for gone in ("hf_secret", "HF_TOKEN", "SECRET", "managedFields", "volumes", "hf-token", "podIP", "command",
                 "readinessProbe", "containerStatuses"):
        assert gone not in text
    assert s["metadata"]["annotations"] == {"slotwise.io/last-checkpoint": "2024-05-01T11:50:00Z"}
    assert s["spec"]["containers"] == [{"name": "server", "resources": p["spec"]["containers"][0]["resources"]}]
    assert s["metadata"]["resourceVersion"] == p["metadata"]["resourceVersion"]
    assert p["spec"]["containers"][0]["env"]  # the input is not modified
    assert slim_pod(s) == s  # idempotent
    assert slim_pod({}) == {}



@pytest.mark.asyncio
async def test_informer_transform_applies_to_listed_and_watched_pods(api: client.ApiClient) -> None:
    core = client.CoreV1Api(api)
    ns = f"slotwise-slim-{uuid.uuid4().hex[:8]}"
    await core.create_namespace({"metadata": {"name": ns}})
    # the ServiceAccount admission plugin wants one; no controller-manager here makes it
    await core.create_namespaced_service_account(ns, {"metadata": {"name": "default"}})

    def body(name: str) -> dict[str, Any]:
        return {"metadata": {"name": name, "annotations": {"slotwise.io/last-checkpoint": "2024-05-01T11:50:00Z",
                                                          "other": "dropped"}},
                "spec": {"automountServiceAccountToken": False,
                         "containers": [{"name": "c", "image": "x", "env": [{"name": "TOKEN", "value": "s3cret"}],
                                         "resources": {"limits": {"cpu": "1"}}}]}}

    await core.create_namespaced_pod(ns, body("listed"))
    inf = Informer(api, f"/api/v1/namespaces/{ns}/pods", transform=slim_pod, watch_timeout_s=30)
    seen: list[dict] = []
    inf.subscribe(lambda kind, obj: seen.append(obj))
    task = asyncio.create_task(inf.run())
    try:
        assert await inf.wait_synced(15)
        await core.create_namespaced_pod(ns, body("watched"))
        for _ in range(750):
            if inf.get(f"{ns}/watched") is not None:
                break
            await asyncio.sleep(0.02)
        for name in ("listed", "watched"):
            cached = inf.get(f"{ns}/{name}")
            assert cached is not None, name
            assert "s3cret" not in repr(cached) and "managedFields" not in cached["metadata"]
            assert cached["metadata"]["annotations"] == {"slotwise.io/last-checkpoint": "2024-05-01T11:50:00Z"}
            assert cached["kind"] == "Pod" and cached["spec"]["containers"][0]["name"] == "c"
        assert seen and all("s3cret" not in repr(o) for o in seen)  # subscribers get the slimmed object too
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
