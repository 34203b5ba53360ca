"""Any scalable workload as a model (issue 17 item 2), against the REAL kube-apiserver 1.20.2 (``realparts.kube``).

StatefulSets are built in. LeaderWorkerSet (``leaderworkerset.x-k8s.io/v1``) and Argo Rollout
(``argoproj.io/v1alpha1``) are the upstream APIs served as CRDs with their upstream schemas' shape and ``/scale``
subresources (``tests/realparts/lws_crds.yaml``, ``rollout_crds.yaml``; not the add-ons' controllers): the
:class:`~realparts.clusterplay.ClusterPlay` plays their controllers (pods per replica or per group, labelled as
upstream labels them), the scheduler and the kubelet. Each test reads the cluster back from the server, builds the
view with :func:`build_view` (the objects stamped with kind/apiVersion, as the controller's informers stamp them),
and acts with :class:`KubeActuator`: the ``/scale`` it writes is the server's, as are the Events and the status
annotation.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from kubernetes_asyncio import client
from realparts.clusterplay import ClusterPlay, create_gpu_node
from realparts.crds import crds_installed

from autoscaler.api.plan import Plan, Reason, RemoveReplica, ScaleModel, UpdateStatus
from autoscaler.live.kube.actuator import ActuatorConfig, KubeActuator
from autoscaler.live.kube.discovery import ARGO_ROLLOUTS, LEADERWORKERSET, discover
from autoscaler.live.kube.objects import POD_DELETION_COST, STATUS_ANNOTATION, ClusterView
from autoscaler.live.kube.translate import build_view
from autoscaler.live.kube.watches import stamped
from autoscaler.live.kube.workloads import LEADERWORKERSET_KIND, ROLLOUT, STATEFULSET, WorkloadKind

pytest_plugins = ("realparts.kube",)

aio = pytest.mark.asyncio
H100 = "NVIDIA-H100-80GB-HBM3"
ANNOTATIONS = {"slotwise.io/slo-latency-ms": "500", "slotwise.io/gpus-per-replica": "8"}


@pytest_asyncio.fixture
async def ns(api: client.ApiClient) -> str:
    name = f"slotwise-wl-{uuid.uuid4().hex[:8]}"
    core = client.CoreV1Api(api)
    await core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    await core.create_namespaced_service_account(name, {"metadata": {"name": "default"}})
    return name  # no controller-manager to finish a namespace delete: left, as the other tests do


@contextlib.asynccontextmanager
async def gpu_nodes(api: client.ApiClient, prefix: str, n: int) -> AsyncIterator[None]:
    for i in range(n):
        await create_gpu_node(api, f"{prefix}-{i}", H100, 8, {"nvidia.com/gpu": "8", "cpu": "96", "pods": "110"})
    try:
        yield
    finally:
        for i in range(n):
            with contextlib.suppress(Exception):
                await client.CoreV1Api(api).delete_node(f"{prefix}-{i}")


def template(app: str) -> dict[str, Any]:
    return {"metadata": {"labels": {"app": app}},
            "spec": {"nodeSelector": {"nvidia.com/gpu.product": H100},
                     "containers": [{"name": "vllm", "image": "registry.invalid/vllm:test",
                                     "resources": {"limits": {"nvidia.com/gpu": "8"}}}]}}


async def read_view(api: client.ApiClient, ns: str, prefix: str, kind: WorkloadKind) -> ClusterView:
    """The cluster as the controller's informers would hand it over: the workloads stamped with kind/apiVersion."""
    apis = await discover(api)
    version = apis.pick(kind.api)
    assert version is not None, f"{kind.kind} not served"
    if kind is STATEFULSET:
        got = await client.AppsV1Api(api).list_namespaced_stateful_set(ns)
        items = [api.sanitize_for_serialization(x) for x in got.items]
    else:
        got = await client.CustomObjectsApi(api).list_namespaced_custom_object(kind.group, version, ns, kind.resource)
        items = list(got["items"])
    stamp = stamped(kind.kind, kind.api_version(version))
    pods = [api.sanitize_for_serialization(p) for p in (await client.CoreV1Api(api).list_namespaced_pod(ns)).items]
    nodes = [api.sanitize_for_serialization(n) for n in (await client.CoreV1Api(api).list_node()).items
             if n.metadata.name.startswith(prefix)]
    return build_view([], pods, nodes, workloads=[stamp(o) for o in items], now=time.time())


async def scale_of(api: client.ApiClient, kind: WorkloadKind, ns: str, name: str) -> int:
    got = await client.CustomObjectsApi(api).get_namespaced_custom_object_scale(
        kind.group, kind.versions[0], ns, kind.resource, name)
    return int(got["spec"]["replicas"])


async def events_of(api: client.ApiClient, ns: str, name: str) -> list[dict]:
    got = await client.CoreV1Api(api).list_namespaced_event(ns, field_selector=f"involvedObject.name={name}")
    return [api.sanitize_for_serialization(e) for e in got.items]


async def settle(play: ClusterPlay, steps: int = 3) -> None:
    for _ in range(steps):
        await play.step()


@aio
async def test_a_leaderworkerset_model_scales_by_groups(api: client.ApiClient, ns: str) -> None:
    prefix = f"lws-{uuid.uuid4().hex[:6]}"
    async with crds_installed(api, "lws_crds.yaml"), gpu_nodes(api, prefix, 6):
        assert (await discover(api)).pick(LEADERWORKERSET) == "v1"
        objs = client.CustomObjectsApi(api)
        created = await objs.create_namespaced_custom_object(
            "leaderworkerset.x-k8s.io", "v1", ns, "leaderworkersets",
            {"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
             "metadata": {"name": "big", "annotations": ANNOTATIONS},
             "spec": {"replicas": 2, "leaderWorkerTemplate": {"size": 2, "workerTemplate": template("big")}}})
        assert created["spec"]["leaderWorkerTemplate"]["restartPolicy"] == "RecreateGroupOnPodRestart"  # defaulted
        play = ClusterPlay(api, ns, node_prefix=prefix, workloads=True)
        await settle(play)

        v = await read_view(api, ns, prefix, LEADERWORKERSET_KIND)
        key = f"{ns}/big"
        m = v.models[key]
        assert (m.kind, m.api_version, m.resource, m.group_size, m.replicas) == (
            "LeaderWorkerSet", "leaderworkerset.x-k8s.io/v1", "leaderworkersets", 2, 2)
        obs = v.snapshot.models[key]
        assert obs.spec is not None and obs.spec.pods_per_replica == 2 and obs.spec.gpus_per_replica == 8
        # two groups of two pods: two replicas, each the leader's slot plus its worker's
        assert [(r.replica_id, r.ready, len(r.group_slots)) for r in obs.replicas] == [
            (f"{ns}/big-0", True, 1), (f"{ns}/big-1", True, 1)]
        assert all(r.slot is not None and r.slot.node != r.group_slots[0].node for r in obs.replicas)

        # the plan says 3 groups: the LWS's /scale is 3, and the controller makes a third group
        act = KubeActuator(api, ActuatorConfig())
        r = await act.apply(Plan(0.0, [ScaleModel(key, 3, 2, Reason.FORECAST)]), v)
        assert r.applied == [f"scale {key}: 2 -> 3 (forecast)"] and not r.errors
        assert await scale_of(api, LEADERWORKERSET_KIND, ns, "big") == 3
        at_two = v
        await settle(play)
        v = await read_view(api, ns, prefix, LEADERWORKERSET_KIND)
        assert [(r.replica_id, r.ready) for r in v.snapshot.models[key].replicas] == [
            (f"{ns}/big-0", True), (f"{ns}/big-1", True), (f"{ns}/big-2", True)]
        status = (await objs.get_namespaced_custom_object_scale("leaderworkerset.x-k8s.io", "v1", ns,
                                                                "leaderworkersets", "big"))["status"]
        assert status["replicas"] == 3 and "worker-index=0" in status["selector"]

        # one pod of a group not Ready: the group is not Ready, the others are
        await client.CoreV1Api(api).patch_namespaced_pod_status("big-2-1", ns, {"status": {"conditions": [
            {"type": "Ready", "status": "False", "lastTransitionTime": "2024-05-01T12:00:00Z"}]}})
        v = await read_view(api, ns, prefix, LEADERWORKERSET_KIND)
        assert [r.ready for r in v.snapshot.models[key].replicas] == [True, True, False]

        # a plan made from the view that read 2 groups, while /scale says 3 now: never lowers it
        r = await act.apply(Plan(1.0, [ScaleModel(key, 1, 2, Reason.FORECAST)]), at_two)
        assert r.why(f"scale {key}") == ["stale-view"] and await scale_of(api, LEADERWORKERSET_KIND, ns, "big") == 3

        # scale-down: LWS removes the highest group whatever the plan named, so nothing is marked
        plan = Plan(2.0, [RemoveReplica(key, f"{ns}/big-0"), ScaleModel(key, 2, 3, Reason.FORECAST)])
        r = await act.apply(plan, v)
        assert not r.errors and r.why(f"drain {key}") == ["by-index"]
        assert await scale_of(api, LEADERWORKERSET_KIND, ns, "big") == 2
        pods = (await client.CoreV1Api(api).list_namespaced_pod(ns)).items
        assert not any(POD_DELETION_COST in (p.metadata.annotations or {}) for p in pods)
        await settle(play)
        v = await read_view(api, ns, prefix, LEADERWORKERSET_KIND)
        assert [r.replica_id for r in v.snapshot.models[key].replicas] == [f"{ns}/big-0", f"{ns}/big-1"]

        # the status annotation and the Event are on the LeaderWorkerSet
        r = await act.apply(Plan(3.0, [UpdateStatus(key, 2, 2, Reason.FORECAST, message="two groups")]), v)
        assert not r.errors and r.events == 1
        got = await objs.get_namespaced_custom_object("leaderworkerset.x-k8s.io", "v1", ns, "leaderworkersets", "big")
        assert json.loads(got["metadata"]["annotations"][STATUS_ANNOTATION])["desired"] == 2
        [ev] = await events_of(api, ns, "big")
        assert ev["involvedObject"] == {"kind": "LeaderWorkerSet", "apiVersion": "leaderworkerset.x-k8s.io/v1",
                                        "name": "big", "namespace": ns, "uid": created["metadata"]["uid"]}


@aio
async def test_a_statefulset_model_scales(api: client.ApiClient, ns: str) -> None:
    prefix = f"sts-{uuid.uuid4().hex[:6]}"
    async with gpu_nodes(api, prefix, 3):
        sts = await client.AppsV1Api(api).create_namespaced_stateful_set(ns, {
            "apiVersion": "apps/v1", "kind": "StatefulSet",
            "metadata": {"name": "db-llm", "annotations": ANNOTATIONS},
            "spec": {"replicas": 1, "serviceName": "db-llm", "selector": {"matchLabels": {"app": "db-llm"}},
                     "template": template("db-llm")}})
        play = ClusterPlay(api, ns, node_prefix=prefix, workloads=True)
        await settle(play)
        v = await read_view(api, ns, prefix, STATEFULSET)
        key = f"{ns}/db-llm"
        assert (v.models[key].kind, v.models[key].resource, v.models[key].group_size) == ("StatefulSet",
                                                                                          "statefulsets", 1)
        assert [(r.replica_id, r.ready) for r in v.snapshot.models[key].replicas] == [(f"{ns}/db-llm-0", True)]

        act = KubeActuator(api, ActuatorConfig())
        r = await act.apply(Plan(0.0, [ScaleModel(key, 3, 1, Reason.FORECAST)]), v)
        assert r.applied == [f"scale {key}: 1 -> 3 (forecast)"] and not r.errors
        assert (await client.AppsV1Api(api).read_namespaced_stateful_set_scale("db-llm", ns)).spec.replicas == 3
        await settle(play)
        v = await read_view(api, ns, prefix, STATEFULSET)
        assert [r.replica_id for r in v.snapshot.models[key].replicas] == [f"{ns}/db-llm-{i}" for i in range(3)]

        # a StatefulSet removes its highest ordinal: the replica the plan named is not marked
        plan = Plan(1.0, [RemoveReplica(key, f"{ns}/db-llm-0"), ScaleModel(key, 2, 3, Reason.FORECAST)])
        r = await act.apply(plan, v)
        assert not r.errors and r.why(f"drain {key}") == ["by-index"]
        assert (await client.AppsV1Api(api).read_namespaced_stateful_set_scale("db-llm", ns)).spec.replicas == 2
        pod0 = await client.CoreV1Api(api).read_namespaced_pod("db-llm-0", ns)
        assert POD_DELETION_COST not in (pod0.metadata.annotations or {})

        r = await act.apply(Plan(2.0, [UpdateStatus(key, 2, 2, Reason.FORECAST, message="m")]), v)
        assert not r.errors
        got = await client.AppsV1Api(api).read_namespaced_stateful_set("db-llm", ns)
        assert json.loads(got.metadata.annotations[STATUS_ANNOTATION])["desired"] == 2
        [ev] = await events_of(api, ns, "db-llm")
        assert ev["involvedObject"]["kind"] == "StatefulSet" and ev["involvedObject"]["uid"] == sts.metadata.uid


@aio
async def test_a_statefulset_with_an_ordinal_gap_loses_only_the_replicas_planned(api: client.ApiClient,
                                                                                ns: str) -> None:
    """Issue 30: pods 0, 1, 3, 4 of a 5-replica StatefulSet (pod 2 deleted by hand, not yet recreated); the plan
    takes one replica off (4 -> 3, the highest ordinal, pod 4). ``spec.replicas = 3`` would have the controller
    delete ordinals 3 AND 4 -- two running replicas for a plan of one. slotwise writes 4: only pod 4 goes (and the
    controller recreates pod 2)."""
    prefix = f"stsgap-{uuid.uuid4().hex[:6]}"
    async with gpu_nodes(api, prefix, 5):
        await client.AppsV1Api(api).create_namespaced_stateful_set(ns, {
            "apiVersion": "apps/v1", "kind": "StatefulSet",
            "metadata": {"name": "gap-llm", "annotations": ANNOTATIONS},
            "spec": {"replicas": 5, "serviceName": "gap-llm", "selector": {"matchLabels": {"app": "gap-llm"}},
                     "template": template("gap-llm")}})
        play = ClusterPlay(api, ns, node_prefix=prefix, workloads=True)
        await settle(play)
        await client.CoreV1Api(api).delete_namespaced_pod("gap-llm-2", ns, grace_period_seconds=0)
        v = await read_view(api, ns, prefix, STATEFULSET)
        key = f"{ns}/gap-llm"
        running = [r.replica_id for r in v.snapshot.models[key].replicas]
        assert running == [f"{ns}/gap-llm-{i}" for i in (0, 1, 3, 4)]
        assert v.models[key].replicas == 5

        act = KubeActuator(api, ActuatorConfig())
        plan = Plan(1.0, [RemoveReplica(key, f"{ns}/gap-llm-4"), ScaleModel(key, 3, 4, Reason.FORECAST)])
        r = await act.apply(plan, v)
        assert not r.errors, r
        assert (await client.AppsV1Api(api).read_namespaced_stateful_set_scale("gap-llm", ns)).spec.replicas == 4
        (line,) = r.applied
        assert line.startswith(f"scale {key}: 4 -> 3 (forecast): wrote 4, not 3: StatefulSet ordinal gap"), line
        await settle(play)
        names = sorted(p.metadata.name for p in (await client.CoreV1Api(api).list_namespaced_pod(ns)).items)
        assert names == [f"gap-llm-{i}" for i in range(4)]  # of the running ones only pod 4 went; 2 is back

        # a pod the selector matches that is no ordinal of the set: which pods a scale-down takes is unknown, so
        # the scale-down holds (reported) rather than guess
        stray = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "stray", "labels": {"app": "gap-llm"}},
                 "spec": {**template("gap-llm")["spec"], "automountServiceAccountToken": False}}
        await client.CoreV1Api(api).create_namespaced_pod(ns, stray)
        v = await read_view(api, ns, prefix, STATEFULSET)
        assert f"{ns}/stray" in [r.replica_id for r in v.snapshot.models[key].replicas]
        r = await act.apply(Plan(2.0, [ScaleModel(key, 3, 5, Reason.FORECAST)]), v)
        assert not r.errors and r.why(f"scale {key}") == ["ordinal-unknown"], r
        assert (await client.AppsV1Api(api).read_namespaced_stateful_set_scale("gap-llm", ns)).spec.replicas == 4


def test_statefulset_scale_down_replicas_for_gaps_and_ordinals_start() -> None:
    """The pure rule behind it: keep the ``keep`` lowest ordinals of the replicas there, remove the rest."""
    from autoscaler.live.kube.workloads import ordinals_start, statefulset_replicas_keeping

    pods = ["s-0", "s-1", "s-3", "s-4"]
    assert statefulset_replicas_keeping("s", 0, pods, 3) == 4  # pod 4 goes, not 3 and 4
    assert statefulset_replicas_keeping("s", 0, pods, 2) == 3  # 3 and 4 go
    assert statefulset_replicas_keeping("s", 0, ["s-0", "s-1", "s-2"], 2) == 2  # no gap: the plan's count
    assert statefulset_replicas_keeping("s", 0, pods, 4) == 5  # nothing running planned away: none goes
    # spec.ordinals.start (1.26+): pods 10, 11, 13 of start 10; keep 2 -> ordinals [10, 13) stay
    assert ordinals_start({"spec": {"ordinals": {"start": 10}}}) == 10 and ordinals_start({"spec": {}}) == 0
    assert statefulset_replicas_keeping("s", 10, ["s-10", "s-11", "s-13"], 2) == 3
    assert statefulset_replicas_keeping("s", 0, ["s-0", "other-1"], 1) is None  # an ordinal unknown: hold


@aio
async def test_an_argo_rollout_scales_via_its_scale_subresource(api: client.ApiClient, ns: str) -> None:
    prefix = f"ro-{uuid.uuid4().hex[:6]}"
    async with crds_installed(api, "rollout_crds.yaml"), gpu_nodes(api, prefix, 4):
        assert (await discover(api)).pick(ARGO_ROLLOUTS) == "v1alpha1"
        objs = client.CustomObjectsApi(api)
        await objs.create_namespaced_custom_object("argoproj.io", "v1alpha1", ns, "rollouts", {
            "apiVersion": "argoproj.io/v1alpha1", "kind": "Rollout",
            "metadata": {"name": "canary-llm", "annotations": ANNOTATIONS},
            "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "canary-llm"}},
                     "template": template("canary-llm"),
                     "strategy": {"canary": {"steps": [{"setWeight": 20}, {"pause": {}}]}}}})
        play = ClusterPlay(api, ns, node_prefix=prefix, workloads=True)
        await settle(play)
        v = await read_view(api, ns, prefix, ROLLOUT)
        key = f"{ns}/canary-llm"
        assert (v.models[key].kind, v.models[key].api_version) == ("Rollout", "argoproj.io/v1alpha1")
        obs = v.snapshot.models[key]
        assert len(obs.replicas) == 2 and all(r.ready for r in obs.replicas)

        act = KubeActuator(api, ActuatorConfig())
        r = await act.apply(Plan(0.0, [ScaleModel(key, 4, 2, Reason.FORECAST)]), v)
        assert r.applied == [f"scale {key}: 2 -> 4 (forecast)"] and not r.errors
        assert await scale_of(api, ROLLOUT, ns, "canary-llm") == 4
        await settle(play)
        v = await read_view(api, ns, prefix, ROLLOUT)
        replicas = v.snapshot.models[key].replicas
        assert len(replicas) == 4

        # ReplicaSets run a Rollout's pods: the named replica is marked to go first
        victim = replicas[0].replica_id
        r = await act.apply(Plan(1.0, [RemoveReplica(key, victim), ScaleModel(key, 3, 4, Reason.FORECAST)]), v)
        assert not r.errors and await scale_of(api, ROLLOUT, ns, "canary-llm") == 3
        pod = await client.CoreV1Api(api).read_namespaced_pod(victim.split("/")[1], ns)
        assert pod.metadata.annotations[POD_DELETION_COST] == "-1000"


@aio
async def test_a_leaderworkerset_scale_write_retries_a_conflict_and_stops_at_a_closed_gate(
        api: client.ApiClient, ns: str) -> None:
    """The safety rules hold for a CRD's /scale as for a Deployment's: a write that loses a race (409) re-reads and
    retries; a deposed leader writes nothing."""
    from autoscaler.live.kube.term import LeadershipLost, WriteGate

    async with crds_installed(api, "lws_crds.yaml"):
        objs = client.CustomObjectsApi(api)
        await objs.create_namespaced_custom_object(
            "leaderworkerset.x-k8s.io", "v1", ns, "leaderworkersets",
            {"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
             "metadata": {"name": "race", "annotations": ANNOTATIONS},
             "spec": {"replicas": 1, "leaderWorkerTemplate": {"size": 2, "workerTemplate": template("race")}}})
        v = await read_view(api, ns, "no-nodes-", LEADERWORKERSET_KIND)
        key = f"{ns}/race"
        act = KubeActuator(api, ActuatorConfig())
        calls: list[str] = []

        async def other_writer(what: str, _key: str) -> None:
            calls.append(what)
            if len(calls) == 1:  # between the actuator's read of /scale and its write: the object moves on
                await objs.patch_namespaced_custom_object(
                    "leaderworkerset.x-k8s.io", "v1", ns, "leaderworkersets", "race",
                    {"metadata": {"annotations": {"other-writer": "yes"}}},
                    _content_type="application/merge-patch+json")

        act.before_write = other_writer
        r = await act.apply(Plan(0.0, [ScaleModel(key, 2, 1, Reason.FORECAST)]), v)
        assert not r.errors and r.conflicts_retried == 1 and calls == ["scale", "scale"]
        assert await scale_of(api, LEADERWORKERSET_KIND, ns, "race") == 2

        act.before_write = None
        closed = WriteGate(leading=lambda: False)
        with pytest.raises(LeadershipLost):
            await act.apply(Plan(1.0, [ScaleModel(key, 3, 1, Reason.FORECAST)]),
                            await read_view(api, ns, "no-nodes-", LEADERWORKERSET_KIND), closed)
        assert await scale_of(api, LEADERWORKERSET_KIND, ns, "race") == 2


@aio
async def test_a_slot_template_change_reaches_every_template_of_a_leaderworkerset(api: client.ApiClient,
                                                                                  ns: str) -> None:
    """SetSlotTemplate on an LWS (issue 17): the leader's and the workers' templates both get the new slot (one
    JSON patch on the LWS itself, through the generic object API), so every pod of a group holds the same slot."""
    from autoscaler.api.plan import SetSlotTemplate

    prefix = f"lwst-{uuid.uuid4().hex[:6]}"
    leader = template("tmpl")
    leader["spec"]["containers"][0]["name"] = "leader"
    async with crds_installed(api, "lws_crds.yaml"), gpu_nodes(api, prefix, 1):
        objs = client.CustomObjectsApi(api)
        await objs.create_namespaced_custom_object(
            "leaderworkerset.x-k8s.io", "v1", ns, "leaderworkersets",
            {"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
             "metadata": {"name": "tmpl", "annotations": ANNOTATIONS},
             "spec": {"replicas": 0, "leaderWorkerTemplate": {"size": 2, "leaderTemplate": leader,
                                                              "workerTemplate": template("tmpl")}}})
        v = await read_view(api, ns, prefix, LEADERWORKERSET_KIND)
        key = f"{ns}/tmpl"
        change = SetSlotTemplate(key, {"limits": {"nvidia.com/mig-3g.40gb": "1"}}, {"nvidia.com/gpu.product": H100})
        r = await KubeActuator(api, ActuatorConfig()).apply(Plan(0.0, [change]), v)
        assert not r.errors and len(r.applied) == 1, r
        got = await objs.get_namespaced_custom_object("leaderworkerset.x-k8s.io", "v1", ns, "leaderworkersets", "tmpl")
        lwt = got["spec"]["leaderWorkerTemplate"]
        for which in ("leaderTemplate", "workerTemplate"):
            limits = lwt[which]["spec"]["containers"][0]["resources"]["limits"]
            assert limits == {"nvidia.com/mig-3g.40gb": "1"}, (which, limits)
        # the same change again: nothing to write
        v = await read_view(api, ns, prefix, LEADERWORKERSET_KIND)
        again = await KubeActuator(api, ActuatorConfig()).apply(Plan(0.0, [change]), v)
        assert not again.applied and [why for _, why in again.skipped] == ["unchanged"], again


@aio
async def test_a_rollout_with_workload_ref_gets_its_slot_template_in_the_referenced_deployment(
        api: client.ApiClient, ns: str) -> None:
    """Issue 30: a Rollout whose pods come from a Deployment (``workloadRef``) has no template of its own. Argo
    rolls out the referenced Deployment's template ("to perform an update, the change should be made to the Pod
    template field of the Deployment", argo-rollouts docs/migrating.md), so that is where the slot goes; the
    Rollout stays without a template. A reference to another kind (a ReplicaSet) is refused ``no-pod-template``."""
    from autoscaler.api.plan import SetSlotTemplate

    async with crds_installed(api, "rollout_crds.yaml"):
        objs, apps = client.CustomObjectsApi(api), client.AppsV1Api(api)
        await apps.create_namespaced_deployment(ns, {
            "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "base"},
            "spec": {"replicas": 0, "selector": {"matchLabels": {"app": "ref-llm"}}, "template": template("ref-llm")}})
        for name, ref in (("ref-llm", {"apiVersion": "apps/v1", "kind": "Deployment", "name": "base"}),
                          ("rs-llm", {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "base-rs"})):
            await objs.create_namespaced_custom_object("argoproj.io", "v1alpha1", ns, "rollouts", {
                "apiVersion": "argoproj.io/v1alpha1", "kind": "Rollout",
                "metadata": {"name": name, "annotations": ANNOTATIONS},
                "spec": {"replicas": 0, "selector": {"matchLabels": {"app": name}}, "workloadRef": ref}})
        apis = await discover(api)
        rollouts = (await objs.list_namespaced_custom_object("argoproj.io", "v1alpha1", ns, "rollouts"))["items"]
        deps = [api.sanitize_for_serialization(d) for d in (await apps.list_namespaced_deployment(ns)).items]
        stamp = stamped(ROLLOUT.kind, ROLLOUT.api_version(apis.pick(ROLLOUT.api)))
        v = build_view([stamped("Deployment", "apps/v1")(d) for d in deps], [], [],
                       workloads=[stamp(o) for o in rollouts], now=time.time())
        key, rs_key = f"{ns}/ref-llm", f"{ns}/rs-llm"
        assert v.models[key].resources == {"limits": {"nvidia.com/gpu": "8"}}  # read from the Deployment
        limits = {"limits": {"nvidia.com/mig-3g.40gb": "1"}}
        plan = Plan(0.0, [SetSlotTemplate(key, limits, {"nvidia.com/gpu.product": H100}),
                          SetSlotTemplate(rs_key, limits, {"nvidia.com/gpu.product": H100})])
        r = await KubeActuator(api, ActuatorConfig()).apply(plan, v)
        assert not r.errors and r.applied == [f"template {key}: resources {limits} nodeSelector "
                                              f"{{'nvidia.com/gpu.product': '{H100}'}}"], r
        assert r.why(f"template {rs_key}") == ["no-pod-template"], r
        got = api.sanitize_for_serialization(await apps.read_namespaced_deployment("base", ns))
        assert got["spec"]["template"]["spec"]["containers"][0]["resources"] == limits
        rollout = await objs.get_namespaced_custom_object("argoproj.io", "v1alpha1", ns, "rollouts", "ref-llm")
        assert "template" not in rollout["spec"]  # the Rollout itself is left as it is
