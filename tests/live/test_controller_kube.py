"""The live controller against a REAL kube-apiserver + etcd: observe, decide, act, report.

The cluster moves because :class:`realparts.clusterplay.ClusterPlay` plays the components a bare apiserver lacks
(ReplicaSet controller, scheduler, kubelet, NVIDIA's MIG manager) through the real API. Model load comes from
:class:`ScriptedLoad`, a metrics port that returns the windows a test chooses -- the Kubernetes side is what is
under test here; tests/live/test_controller_e2e.py reads the load from a real Prometheus instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from kubernetes_asyncio import client
from realparts.clusterplay import ClusterPlay, create_gpu_node
from realparts.scripted import ScriptedLoad
from realparts.scripted import deployment as _deployment

from autoscaler.api.plan import ScaleModel, SetMigLayout
from autoscaler.live.controller import Controller, ControllerSettings
from autoscaler.live.kube.actuator import ActuatorConfig
from autoscaler.live.kube.objects import STATUS_ANNOTATION

pytest_plugins = ("realparts.kube",)
pytestmark = pytest.mark.asyncio


@pytest_asyncio.fixture
async def cluster(api: client.ApiClient) -> AsyncIterator[dict]:
    """A namespace with three models (one with a bad annotation) and GPU nodes of its own (one MIG, one L4)."""
    suffix = uuid.uuid4().hex[:6]
    ns = f"ctl-{suffix}"
    core = client.CoreV1Api(api)
    for n in (ns, "gpu-operator"):
        try:
            await core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": n}})
        except client.ApiException as e:
            if e.status != 409:
                raise
    l4 = f"{suffix}-l4"
    h100 = f"{suffix}-h100"
    await create_gpu_node(api, l4, "NVIDIA-L4", 4,
                          {"nvidia.com/gpu": "4", "cpu": "32", "memory": "128Gi", "pods": "110"})
    await create_gpu_node(api, h100, "NVIDIA-H100-80GB-HBM3", 1,
                          {"nvidia.com/mig-1g.10gb": "1", "cpu": "32", "memory": "128Gi", "pods": "110"},
                          {"nvidia.com/mig.capable": "true", "nvidia.com/mig.strategy": "mixed",
                           "nvidia.com/mig.config": "custom-1g", "nvidia.com/mig.config.state": "success"})
    apps = client.AppsV1Api(api)
    base = {"slotwise.io/slo-latency-ms": "500", "slotwise.io/service-time-ms": "100",
            "slotwise.io/cold-start-seconds": "10", "slotwise.io/max-replicas": "4"}
    await apps.create_namespaced_deployment(ns, _deployment(
        "chat", {**base, "slotwise.io/slot-kinds": "whole", "slotwise.io/expected-rps": "20"},
        {"limits": {"nvidia.com/gpu": "1"}}))
    # embed starts at zero replicas with no GPU in its template: its first placement chooses the slot (a MIG
    # 2g.20gb instance the H100 does not have yet: a re-layout)
    await apps.create_namespaced_deployment(ns, _deployment(
        "embed", {**base, "slotwise.io/gpu-memory-gib": "15", "slotwise.io/gpu-compute-share": "0.25",
                  "slotwise.io/slot-kinds": "mig", "slotwise.io/expected-rps": "2", "slotwise.io/min-replicas": "0"},
        None, replicas=0))
    await apps.create_namespaced_deployment(ns, _deployment(
        "broken", {"slotwise.io/slo-latency-ms": "fast"}, {"limits": {"nvidia.com/gpu": "1"}}))
    play = ClusterPlay(api, ns, node_prefix=suffix)
    await play.ensure_service_account()
    for _ in range(3):
        await play.step()
    yield {"ns": ns, "l4": l4, "h100": h100, "play": play, "suffix": suffix}
    # Nodes are cluster-wide: left behind, they would take the next test's placements (and MIG re-layouts).
    for name in (l4, h100):
        await core.delete_node(name)


def _settings(ns: str, suffix: str, **actuator: object) -> ControllerSettings:
    return ControllerSettings(
        namespace=ns, lease_namespace=ns, lease_name=f"slotwise-{suffix}", identity=f"test-{suffix}",
        tick_s=1.0, http_port=0, actuator=ActuatorConfig(**actuator),
    )


async def _synced(controller: Controller) -> None:
    tasks = [asyncio.create_task(i.run()) for i in controller.informers]
    controller._test_tasks = tasks  # type: ignore[attr-defined]
    for inf in controller.informers:
        assert await inf.wait_synced(20.0), f"informer {inf.name} did not sync: {inf.stats.last_error}"


async def _stop(controller: Controller) -> None:
    for t in getattr(controller, "_test_tasks", []):
        t.cancel()
    await asyncio.gather(*getattr(controller, "_test_tasks", []), return_exceptions=True)


async def _lead(controller: Controller) -> asyncio.Task:
    task = asyncio.create_task(controller.elector.run())
    await asyncio.wait_for(controller.elector.wait_leader(), timeout=20)
    return task


@contextlib.asynccontextmanager
async def leading(controller: Controller) -> AsyncIterator[None]:
    """The controller's caches synced and its Lease held for the block; both stopped after it."""
    await _synced(controller)
    elector = await _lead(controller)
    try:
        yield
    finally:
        elector.cancel()
        await asyncio.gather(elector, return_exceptions=True)
        await _stop(controller)


async def _events(api: client.ApiClient, ns: str, name: str) -> list:
    got = await client.CoreV1Api(api).list_namespaced_event(ns, field_selector=f"involvedObject.name={name}")
    return got.items


async def _until(predicate, timeout: float = 20.0, every: float = 0.2):
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        got = await predicate()
        if got:
            return got
        if asyncio.get_running_loop().time() > deadline:
            return got
        await asyncio.sleep(every)


async def test_controller_scales_reports_and_isolates_a_bad_annotation(api: client.ApiClient, cluster: dict) -> None:
    ns, play = cluster["ns"], cluster["play"]
    apps = client.AppsV1Api(api)
    ctl = Controller(api, _settings(ns, cluster["suffix"]),
                     metrics_source=ScriptedLoad({f"{ns}/chat": 20.0, f"{ns}/embed": 2.0}))
    async with leading(ctl):
        result = await ctl.tick()
        scales = {a.model: a for a in result.plan.of_type(ScaleModel)}
        assert f"{ns}/chat" in scales, result.plan.describe()
        wanted = scales[f"{ns}/chat"].replicas
        assert wanted > 1
        # the Deployment's scale is what the plan says
        dep = await apps.read_namespaced_deployment("chat", ns)
        assert dep.spec.replicas == wanted
        status = json.loads(dep.metadata.annotations[STATUS_ANNOTATION])
        assert status["desired"] == wanted and status["sloLatencyMs"] == 500
        assert status["dryRun"] is False
        # the bad model: a Warning Event with the exact problem, its scale untouched; the others proceed
        events = await _until(lambda: _events(api, ns, "broken"))
        warning = [e for e in events if e.type == "Warning"]
        assert warning and "slotwise.io/slo-latency-ms='fast'" in warning[0].message, [e.message for e in events]
        assert (await apps.read_namespaced_deployment("broken", ns)).spec.replicas == 1
        assert await _events(api, ns, "chat")
        # the cluster follows (pods, bound, ready); the next tick sees the replicas and does not scale again
        for _ in range(3):
            await play.step()
        await asyncio.sleep(1.0)  # let the informers see the pods
        again = await ctl.tick()
        assert not [a for a in again.plan.of_type(ScaleModel) if a.model == f"{ns}/chat" and a.replicas > wanted]
        assert ctl.pods.items(), "the pod informer saw no pods"


async def test_report_mode_changes_nothing_but_reports(api: client.ApiClient, cluster: dict) -> None:
    ns = cluster["ns"]
    apps = client.AppsV1Api(api)
    before = {d.metadata.name: (d.spec.replicas, d.spec.template.to_dict())
              for d in (await apps.list_namespaced_deployment(ns)).items}
    ctl = Controller(api, _settings(ns, cluster["suffix"], report_only=True),
                     metrics_source=ScriptedLoad({f"{ns}/chat": 30.0, f"{ns}/embed": 2.0}))
    async with leading(ctl):
        result = await ctl.tick()
        assert result.plan.of_type(ScaleModel), result.plan.describe()
        assert result.report is not None and any(why == "report-only" for _, why in result.report.skipped)
        after = {d.metadata.name: (d.spec.replicas, d.spec.template.to_dict())
                 for d in (await apps.list_namespaced_deployment(ns)).items}
        assert after == before
        dep = await apps.read_namespaced_deployment("chat", ns)
        assert json.loads(dep.metadata.annotations[STATUS_ANNOTATION])["dryRun"] is True
        events = await _until(lambda: _events(api, ns, "chat"))
        assert any(e.reason.startswith("DryRun") for e in events), [e.reason for e in events]


async def test_mig_relayout_goes_through_the_safety_gate(api: client.ApiClient, cluster: dict) -> None:
    """embed needs MIG instances the H100 (one 1g.10gb) does not have: the plan asks for a re-layout; the gate
    cordons, waits, relabels, waits for the MIG manager's success, uncordons -- in that order."""
    ns, h100, play = cluster["ns"], cluster["h100"], cluster["play"]
    core = client.CoreV1Api(api)
    ctl = Controller(api, _settings(ns, cluster["suffix"], mig_relayout=True, max_nodes_relayout=1,
                                    mig_parted_configmap="gpu-operator/slotwise-mig-parted-config"),
                     metrics_source=ScriptedLoad({f"{ns}/chat": 1.0, f"{ns}/embed": 40.0}))
    seen: list[tuple[bool, str | None, str | None]] = []
    relayouts: list[SetMigLayout] = []
    notes: list[str] = []
    async with leading(ctl):
        for _ in range(40):
            result = await ctl.tick()
            relayouts += result.plan.of_type(SetMigLayout)
            if result.report is not None:
                notes += [x for x in result.report.applied if x.startswith("mig")]
                notes += [f"{x} ({why})" for x, why in result.report.skipped if x.startswith("mig")]
                notes += list(result.report.errors) + list(getattr(result.report, "pending", []))
            node = await core.read_node(h100)
            labels = node.metadata.labels or {}
            seen.append((bool(node.spec.unschedulable), labels.get("nvidia.com/mig.config"),
                         labels.get("nvidia.com/mig.config.state")))
            await play.step()
            if relayouts and not node.spec.unschedulable and labels.get("nvidia.com/mig.config") != "custom-1g":
                break
            await asyncio.sleep(0.3)
        assert relayouts, "no re-layout was planned"
        target = relayouts[0].config_name
        assert any(s[0] for s in seen), f"never cordoned: {notes[:8]}"
        first_cordon = next(i for i, s in enumerate(seen) if s[0])
        relabel = next(i for i, s in enumerate(seen) if s[1] == target)
        assert first_cordon <= relabel, seen
        success = next(i for i, s in enumerate(seen) if s[1] == target and s[2] == "success")
        assert all(s[0] for s in seen[first_cordon:success]), seen  # cordoned throughout
        assert not seen[-1][0], f"node left cordoned: {seen}"
        cap = (await core.read_node(h100)).status.capacity
        assert int(cap.get("nvidia.com/mig-2g.20gb", "0")) >= 1, cap


async def test_lost_metric_source_holds_replicas(api: client.ApiClient, cluster: dict) -> None:
    """Prometheus unreachable: every model is stale; nothing is scaled, the status says why."""
    from realparts.kube import free_port

    ns = cluster["ns"]
    apps = client.AppsV1Api(api)
    settings = _settings(ns, cluster["suffix"])
    settings.prometheus_url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    ctl = Controller(api, settings)
    async with leading(ctl):
        result = await ctl.tick()
        assert not result.plan.of_type(ScaleModel), result.plan.describe()
        assert ctl.prometheus is not None and ctl.prometheus.last_error
        dep = await apps.read_namespaced_deployment("chat", ns)
        assert dep.spec.replicas == 1
        assert json.loads(dep.metadata.annotations[STATUS_ANNOTATION])["reason"] == "metrics_stale"
        assert b"slotwise_errors_total" in ctl.exporter.exposition()


async def test_controller_lends_an_idle_node_and_reclaims_it_ahead_of_need(api: client.ApiClient) -> None:
    """Pods mode end to end: low load -> the idle whole node is lent (label + taint); training runs there; the load
    rises -> the controller reclaims the node (evicts ONLY the training pod, lifts the taint once it is gone) and
    the model's new replicas land on it."""
    from sharing.lending import LendingPolicy

    suffix = uuid.uuid4().hex[:6]
    ns = f"lend-{suffix}"
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    await core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    busy, idle = f"{suffix}-busy", f"{suffix}-idle"
    for name, gpus in ((busy, 2), (idle, 4)):
        await create_gpu_node(api, name, "NVIDIA-L4", gpus,
                              {"nvidia.com/gpu": str(gpus), "cpu": "32", "memory": "128Gi", "pods": "110"})
    await apps.create_namespaced_deployment(ns, _deployment(
        "chat", {"slotwise.io/slo-latency-ms": "500", "slotwise.io/service-time-ms": "100",
                 "slotwise.io/cold-start-seconds": "10", "slotwise.io/max-replicas": "6",
                 "slotwise.io/slot-kinds": "whole"},
        {"limits": {"nvidia.com/gpu": "1"}}))
    play = ClusterPlay(api, ns, node_prefix=suffix)
    await play.ensure_service_account()
    for _ in range(3):
        await play.step()
    async def ready(key: str) -> int:  # the model's Ready pods (ClusterPlay plays the kubelet that marks them)
        return sum(1 for p in await play.pods()
                   if p["metadata"]["name"].startswith(key.split("/", 1)[1] + "-")
                   and not p["metadata"].get("deletionTimestamp")
                   and any(c["type"] == "Ready" and c["status"] == "True"
                           for c in (p.get("status") or {}).get("conditions") or ()))

    # in-flight as the Ready replicas would hold it: 40 req/s on the 2 replicas the busy node holds is a growing
    # queue, not the steady state of requests shorter than declared that rate x service time would read as
    load = ScriptedLoad({f"{ns}/chat": 1.0}, ready=ready)
    settings = _settings(ns, suffix)
    settings.lending = LendingPolicy(enabled=True, mode="pods", max_reclaim_s=30.0, warm_buffer_gpus=1.0,
                                     warm_buffer_fraction=0.0, min_lend_s=0.0, hysteresis_gpus=0.5)
    ctl = Controller(api, settings, metrics_source=load)

    async def lent() -> bool:
        node = await core.read_node(idle)
        return (node.metadata.labels or {}).get("slotwise.io/lent") == "true"

    try:
        async with leading(ctl):
            for _ in range(10):
                await ctl.tick()
                if await lent():
                    break
                await asyncio.sleep(0.5)
            assert await lent(), "the idle node was not lent"
            taints = (await core.read_node(idle)).spec.taints or []
            assert any(t.key == "slotwise.io/lent" and t.effect == "NoSchedule" for t in taints)
            assert not ((await core.read_node(busy)).metadata.labels or {}).get("slotwise.io/lent")
            # training lands on the lent node (the test plays the training scheduler)
            await core.create_namespaced_pod(ns, {
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "train-0", "labels": {"slotwise.io/preemptible": "true"}},
                "spec": {"nodeName": idle, "automountServiceAccountToken": False,
                         "terminationGracePeriodSeconds": 5,
                         "tolerations": [{"key": "slotwise.io/lent", "operator": "Exists", "effect": "NoSchedule"}],
                         "containers": [{"name": "t", "image": "registry.invalid/train:test",
                                         "resources": {"limits": {"nvidia.com/gpu": "4"}}}]},
            })
            inference_pods = {p["metadata"]["name"] for p in await play.pods() if p["metadata"]["name"] != "train-0"}
            await asyncio.sleep(1.0)
            # the load rises: the node is needed back
            load.rates[f"{ns}/chat"] = 40.0
            reclaimed = False
            for _ in range(40):
                await ctl.tick()
                await play.step()
                node = await core.read_node(idle)
                if not any(t.key == "slotwise.io/lent" for t in (node.spec.taints or [])):
                    reclaimed = True
                    break
                await asyncio.sleep(0.5)
            assert reclaimed, "the lent node was not reclaimed"
            names = {p["metadata"]["name"] for p in await play.pods()}
            assert "train-0" not in names, "the training pod was not evicted"
            assert inference_pods <= names, "an inference pod was removed by the reclaim"
            assert b"slotwise_reclaim_duration_seconds_count 1.0" in ctl.exporter.exposition()
            # the model's new replicas now land on the reclaimed node (the busy node holds 2 of the 6 it needs)
            for _ in range(40):
                await ctl.tick()
                await play.step()
                on_idle = [p for p in await play.pods() if p["spec"].get("nodeName") == idle]
                if on_idle:
                    break
                await asyncio.sleep(0.5)
            node = await core.read_node(idle)
            assert on_idle, (play.log[-10:], node.spec.taints, node.spec.unschedulable, node.status.allocatable,
                             [(p["metadata"]["name"], p["spec"].get("nodeSelector"), p["spec"].get("nodeName"))
                              for p in await play.pods()])
    finally:
        for name in (busy, idle):
            await core.delete_node(name)
