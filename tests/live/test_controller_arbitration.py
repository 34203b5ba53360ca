"""Priorities and preemption in the live controller, against a REAL kube-apiserver + etcd.

Two models share a node with two whole L4 GPUs: ``low`` (team ml, priority 0) holds both; ``high`` (team search,
priority 10) starts at zero replicas and its load needs one. The controller (the real informers, decision core with
arbitration, actuator and exporter) must preempt one replica of ``low`` -- scale its Deployment down with THAT pod
marked for deletion and a Warning Event ``Preempted`` on it -- and, once the GPU is free, scale ``high`` up onto
it; ``low``, still wanting its second replica, must not take the GPU back (no flapping). Run twice: without
guarantees (a ``priority`` preemption) and with search guaranteed the GPU ml borrows (a ``guarantee`` reclaim).

The cluster moves through :class:`realparts.clusterplay.ClusterPlay` (ReplicaSet controller honouring the
pod-deletion-cost, scheduler, kubelet); load comes from the same scripted metrics port as
``tests/live/test_controller_kube.py``.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from kubernetes_asyncio import client
from realparts.clusterplay import ClusterPlay, create_gpu_node
from test_controller_kube import ScriptedLoad, _deployment, _events, leading

from autoscaler.api.plan import RemoveReplica, ScaleModel, Shortfall, ShortfallCause
from autoscaler.decision.arbitration import ArbitrationPolicy, TeamQuota
from autoscaler.live.controller import Controller, ControllerSettings
from autoscaler.live.kube.objects import POD_DELETION_COST

pytest_plugins = ("realparts.kube",)
pytestmark = pytest.mark.asyncio

BASE = {"slotwise.io/slo-latency-ms": "500", "slotwise.io/service-time-ms": "100",
        "slotwise.io/cold-start-seconds": "10", "slotwise.io/slot-kinds": "whole"}


@pytest_asyncio.fixture
async def contested(api: client.ApiClient) -> AsyncIterator[dict]:
    """The namespace, its two-GPU node, ``low`` running on both GPUs and ``high`` at zero replicas."""
    suffix = uuid.uuid4().hex[:6]
    ns = f"arb-{suffix}"
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    await core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    node = f"{suffix}-l4"
    await create_gpu_node(api, node, "NVIDIA-L4", 2,
                          {"nvidia.com/gpu": "2", "cpu": "32", "memory": "128Gi", "pods": "110"})
    gpu = {"limits": {"nvidia.com/gpu": "1"}}
    await apps.create_namespaced_deployment(ns, _deployment(
        "low", {**BASE, "slotwise.io/team": "ml", "slotwise.io/priority": "0", "slotwise.io/min-replicas": "1",
                "slotwise.io/max-replicas": "2"}, gpu, replicas=2))
    await apps.create_namespaced_deployment(ns, _deployment(
        "high", {**BASE, "slotwise.io/team": "search", "slotwise.io/priority": "10",
                 "slotwise.io/min-replicas": "0", "slotwise.io/max-replicas": "1"}, gpu, replicas=0))
    play = ClusterPlay(api, ns, node_prefix=suffix)
    await play.ensure_service_account()
    for _ in range(3):
        await play.step()
    pods = await play.pods()
    assert len(pods) == 2 and all(p["spec"].get("nodeName") == node for p in pods), play.log
    try:
        yield {"ns": ns, "node": node, "play": play, "suffix": suffix}
    finally:
        await core.delete_node(node)  # cluster-wide: left behind, it would take other tests' placements


def _settings(ns: str, suffix: str, teams: tuple[TeamQuota, ...]) -> ControllerSettings:
    return ControllerSettings(
        namespace=ns, lease_namespace=ns, lease_name=f"slotwise-{suffix}", identity=f"test-{suffix}",
        tick_s=1.0, http_port=0, policy_knobs={"tick_s": 0.5},  # every tick decides (the default is 10 s)
        # min_runtime_s 0: the test's replicas are seconds old; a priority preemption would wait for them
        arbitration=ArbitrationPolicy(teams=teams, min_runtime_s=0.0),
    )


# Without guarantees it is a `priority` preemption (high's SLO miss beats low's priority); with search guaranteed
# one GPU and ml borrowing beyond its guarantee of one, search reclaims its guarantee (`guarantee`).
QUOTAS = {
    "priority": (TeamQuota("search", 0.0, 1.0), TeamQuota("ml", 0.0, 2.0)),
    "guarantee": (TeamQuota("search", 1.0, 0.0), TeamQuota("ml", 1.0, 1.0)),
}


@pytest.mark.parametrize("why", sorted(QUOTAS))
async def test_a_high_priority_model_preempts_a_low_priority_one(api: client.ApiClient, contested: dict,
                                                                 why: str) -> None:
    ns, node, play = contested["ns"], contested["node"], contested["play"]
    low, high = f"{ns}/low", f"{ns}/high"
    apps = client.AppsV1Api(api)
    # low's load needs its two replicas (it would miss its SLO on one); high's needs one
    load = ScriptedLoad({low: 12.0, high: 5.0})
    ctl = Controller(api, _settings(ns, contested["suffix"], QUOTAS[why]), metrics_source=load)
    low_pods = {p["metadata"]["name"] for p in await play.pods()}
    preemptions: list[RemoveReplica] = []
    plans: list[list[str]] = []
    applied: list[str] = []
    async with leading(ctl):
        high_scaled = False
        for _ in range(30):
            result = await ctl.tick()
            plans.append(result.plan.describe())
            assert result.report is not None and not result.report.errors, result.report.errors
            applied += result.report.applied
            preemptions += [a for a in result.plan.of_type(RemoveReplica) if a.preempted_by]
            if any(a.model == high and a.replicas >= 1 for a in result.plan.of_type(ScaleModel)):
                high_scaled = True
            if high_scaled and (await apps.read_namespaced_deployment("high", ns)).spec.replicas == 1:
                pods = {p["metadata"]["name"]: p for p in await play.pods()}
                if any(name.startswith("high-") and p["spec"].get("nodeName") == node for name, p in pods.items()):
                    break
            await play.step()
            await asyncio.sleep(0.5)  # the informers see the pods and scales
        assert preemptions, "nothing was preempted:\n" + "\n".join("\n".join(p) for p in plans[:4])

        # one replica of low preempted for high, by priority; the victim was one of low's running pods
        victims = {a.replica_id for a in preemptions}
        assert len(victims) == 1, plans[:4]
        (victim,) = victims
        first = preemptions[0]
        assert (first.model, first.preempted_by, first.reason) == (low, high, why)
        assert victim.split("/")[-1] in low_pods
        # low's Deployment scaled 2 -> 1 and the ReplicaSet removed THAT pod (the deletion cost marked it)
        assert f"scale {low}: 2 -> 1 (preempted) 1 replica(s) preempted for {high}" in applied, applied
        assert any(line.startswith(f"drain {low}/{victim} preempted") and line.endswith(f"{POD_DELETION_COST}=-1000")
                   for line in applied), applied
        assert (await apps.read_namespaced_deployment("low", ns)).spec.replicas == 1
        names = {p["metadata"]["name"] for p in await play.pods()}
        assert victim.split("/")[-1] not in names and len(names & low_pods) == 1, (names, play.log)
        assert f"delete pod {victim.split('/')[-1]}" in play.log
        # a Warning Event Preempted on low, with the core's message naming the preemptor
        events = [e for e in await _events(api, ns, "low") if e.reason == "Preempted"]
        assert [(e.type, e.message) for e in events] == [("Warning", first.message)], events
        assert high in first.message

        # high scaled up and its pod runs on the freed GPU
        assert high_scaled, "\n".join("\n".join(p) for p in plans)
        assert (await apps.read_namespaced_deployment("high", ns)).spec.replicas == 1
        pods = {p["metadata"]["name"]: p for p in await play.pods()}
        assert [n for n, p in pods.items() if n.startswith("high-") and p["spec"].get("nodeName") == node], play.log
        # while it waited, high's shortfall said why: capacity being freed for it
        waited = [line for plan in plans for line in plan if line.startswith(f"shortfall {high}:")]
        assert waited and all(f" {ShortfallCause.PREEMPTING}: " in line for line in waited[:1]), waited

        # no flapping: low, still short of its second replica, takes nothing back from high
        for _ in range(3):
            result = await ctl.tick()
            assert not [a for a in result.plan.of_type(RemoveReplica) if a.preempted_by], result.plan.describe()
            assert not [a for a in result.plan.of_type(Shortfall) if a.model == high], result.plan.describe()
            await play.step()
            await asyncio.sleep(0.3)
        assert (await apps.read_namespaced_deployment("high", ns)).spec.replicas == 1

        # the exporter: the preemption under the victim's team, team GPUs held vs guaranteed
        get = ctl.exporter.registry.get_sample_value
        assert get("slotwise_preemptions_total", {"team": "ml", "model": low, "reason": why}) == 1
        assert get("slotwise_preemptions_total", {"team": "search", "model": high, "reason": why}) == 0
        assert get("slotwise_team_gpus", {"team": "search", "kind": "held"}) == 1.0
        assert get("slotwise_team_gpus", {"team": "ml", "kind": "held"}) == 1.0
        search, ml = QUOTAS[why]
        assert get("slotwise_team_gpus", {"team": "ml", "kind": "limit"}) == ml.limit_gpus == 2.0
        assert get("slotwise_team_gpus", {"team": "search", "kind": "guaranteed"}) == search.guaranteed_gpus
