"""The Kubernetes actuator and the MIG safety gate, against a REAL kube-apiserver 1.20.2 + etcd (``realparts.kube``).

Each test builds its ClusterView by hand (ManagedModel / NodeInfo over an empty ClusterSnapshot), applies plans with
:class:`KubeActuator` and reads the results back from the server: scale subresource, pod template, ConfigMaps,
status annotation, Events, Node cordon/labels. Conflicts are made real by changing the object between the
actuator's read and its write (the ``before_write`` seam). The MIG manager is played by a small task that watches
the node's ``nvidia.com/mig.config`` label and answers with ``nvidia.com/mig.config.state``. There is no
scheduler or kubelet: pods are created with ``spec.nodeName`` and deleted with grace 0.
The pure pieces (gate transitions, merges, status/event rendering) are tested without a server at the top.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import pytest
import pytest_asyncio
import yaml
from kubernetes_asyncio import client
from kubernetes_asyncio.client.rest import ApiException

from autoscaler.api.plan import (
    PlaceReplica,
    Plan,
    PreemptionReason,
    Reason,
    RemoveReplica,
    ScaleModel,
    SetMigLayout,
    SetSlotTemplate,
    SetTimeSlicing,
    Shortfall,
    ShortfallCause,
    UpdateStatus,
)
from autoscaler.api.snapshot import ClusterSnapshot
from autoscaler.api.spec import SpecError, parse_annotations
from autoscaler.live.kube.actuator import ActuationReport, ActuatorConfig, KubeActuator
from autoscaler.live.kube.mig_gate import (
    OWNER_LABEL,
    MigGate,
    NodeRead,
    Op,
    Phase,
    Relayout,
    blocking_pods,
    decide,
)
from autoscaler.live.kube.objects import (
    MIG_CONFIG,
    MIG_CONFIG_STATE,
    POD_DELETION_COST,
    STATUS_ANNOTATION,
    ClusterView,
    ManagedModel,
    NodeInfo,
)
from autoscaler.live.kube.writes import (
    merge_mig_configs,
    merged_node_selector,
    merged_resources,
    same_status,
    shortfall_event,
    status_event,
    status_payload,
)
from sharing.catalog import load_catalog
from sharing.render import GPU_PRODUCT, mig_parted_config, time_slicing_config, to_yaml
from sharing.slots import Inventory, Slot, SlotKind

pytest_plugins = ("realparts.kube",)

aio = pytest.mark.asyncio
MERGE = "application/merge-patch+json"
H100 = "NVIDIA-H100-80GB-HBM3"
MIG_1G = "nvidia.com/mig-1g.10gb"
MIG_3G = "nvidia.com/mig-3g.40gb"


# -- pure pieces --------------------------------------------------------------------------------------------------


def test_merged_resources_drop_the_old_gpu_kind_and_keep_cpu() -> None:
    old = {"limits": {"nvidia.com/gpu": "1", "cpu": "2"}, "requests": {"nvidia.com/gpu": "1", "memory": "8Gi"}}
    new = {"limits": {MIG_3G: 1}, "requests": {MIG_3G: "1"}}
    assert merged_resources(old, new) == {"limits": {"cpu": "2", MIG_3G: "1"},
                                          "requests": {"memory": "8Gi", MIG_3G: "1"}}
    assert merged_resources({"limits": {MIG_3G: "1"}}, {"limits": {MIG_3G: 1}}) == {"limits": {MIG_3G: "1"}}
    assert merged_node_selector({GPU_PRODUCT: "NVIDIA-A100-SXM4-80GB", "zone": "a"}, {GPU_PRODUCT: H100}) == {
        "zone": "a", GPU_PRODUCT: H100}


def test_blocking_pods_counts_only_gpu_resources_over_what_may_stay() -> None:
    assert blocking_pods({MIG_1G: 2, "cpu": 9}, {MIG_1G: 2}) == {}
    assert blocking_pods({MIG_1G: 3, "nvidia.com/gpu": 1}, {MIG_1G: 2}) == {
        MIG_1G: (3, 2), "nvidia.com/gpu": (1, 0)}


def _job(phase: Phase, since: float = 0.0, busy: dict[str, int] | None = None) -> Relayout:
    return Relayout("n1", "cfg-b", {}, busy or {}, (0,), phase=phase, phase_since=since)


def _node(config: str, state: str | None, unschedulable: bool = True) -> NodeRead:
    labels = {MIG_CONFIG: config}
    if state is not None:
        labels[MIG_CONFIG_STATE] = state
    return NodeRead("n1", labels, unschedulable)


def test_gate_transitions() -> None:
    assert decide(_job(Phase.CORDON), _node("cfg-a", "success", False), {}, 0, 600).op is Op.CORDON
    assert decide(_job(Phase.CORDON), None, {}, 0, 600).op is Op.GONE
    # pods on a changing instance hold the relayout; within busy they may stay
    assert decide(_job(Phase.WAIT_FREE), _node("cfg-a", "success"), {MIG_1G: 1}, 10, 600).op is Op.WAIT
    assert decide(_job(Phase.WAIT_FREE, busy={MIG_1G: 1}), _node("cfg-a", "success"), {MIG_1G: 1}, 10, 600).op \
        is Op.APPLY
    timed_out = decide(_job(Phase.WAIT_FREE), _node("cfg-a", "success"), {MIG_1G: 1}, 601, 600)
    assert timed_out.op is Op.FAIL and "mig-1g.10gb: 1 pod(s)" in timed_out.why
    # after the relabel: our own "pending" until the MIG manager answers
    assert decide(_job(Phase.WAIT_SUCCESS), _node("cfg-b", "pending"), {}, 5, 600).op is Op.WAIT
    assert decide(_job(Phase.WAIT_SUCCESS), _node("cfg-b", "success"), {}, 5, 600).op is Op.UNCORDON
    assert decide(_job(Phase.WAIT_SUCCESS), _node("cfg-b", "failed"), {}, 5, 600).op is Op.FAIL
    assert decide(_job(Phase.WAIT_SUCCESS), _node("cfg-b", "pending"), {}, 601, 600).op is Op.FAIL
    hijacked = decide(_job(Phase.WAIT_SUCCESS), _node("cfg-c", "success"), {}, 5, 600)
    assert hijacked.op is Op.FAIL and "cfg-c" in hijacked.why


def _layout(node: str, name: str = "cfg-b") -> SetMigLayout:
    gpu = load_catalog().get(H100)
    config = mig_parted_config(name, gpu, {0: [("3g.40gb", 0), ("3g.40gb", 4)]}, device_filter=gpu.pci_ids[0])
    return SetMigLayout(node, name, config, {0: (("3g.40gb", 0), ("3g.40gb", 4))}, (0,), {})


def test_gate_admits_at_most_max_nodes_and_ignores_repeats() -> None:
    gate = MigGate(max_nodes=1)
    report = ActuationReport()
    gate.submit(_layout("n1"), 0.0, report)
    gate.submit(_layout("n1"), 1.0, report)  # the same relayout again (the planner re-emits it every tick)
    gate.submit(_layout("n2"), 1.0, report)
    assert gate.in_flight == ["n1"]
    assert report.skipped == [("mig-layout n1: GPUs [0] -> cfg-b", "in-flight"),
                              ("mig-layout n2: GPUs [0] -> cfg-b", "rate-limit")]


def test_gate_recovers_relayouts_left_by_a_previous_process() -> None:
    nodes = {
        "relabeled": NodeInfo("relabeled", {OWNER_LABEL: "cfg-b", MIG_CONFIG: "cfg-b"}, True),
        "not-yet": NodeInfo("not-yet", {OWNER_LABEL: "cfg-b", MIG_CONFIG: "cfg-a"}, True),
        "admin": NodeInfo("admin", {MIG_CONFIG: "cfg-a"}, True),
    }
    gate = MigGate(max_nodes=2)
    gate.recover(ClusterView(ClusterSnapshot(0.0, {}, Inventory.from_nodes([])), {}, nodes), 0.0)
    assert {n: (j.phase, j.we_cordoned) for n, j in gate.jobs.items()} == {
        "relabeled": (Phase.WAIT_SUCCESS, True), "not-yet": (Phase.UNCORDON, True)}


def test_merge_mig_configs_keeps_other_entries() -> None:
    mine = _layout("n1").config
    other = {"version": "v1", "mig-configs": {"other-node": [{"devices": "all", "mig-enabled": False}]}}
    text, changed = merge_mig_configs(to_yaml(other), mine)
    assert changed
    assert yaml.safe_load(text)["mig-configs"] == {**other["mig-configs"], **mine["mig-configs"]}
    assert merge_mig_configs(text, mine) == (text, False)


def test_status_payload_and_event_rendering() -> None:
    a = UpdateStatus("ns/m", 3, 2, Reason.FORECAST, forecast_rps=12.5, message="sized for p95",
                     predicted_latency_ms=float("nan"), slo_latency_ms=250.0)
    p = status_payload(a, dry_run=False, now=0.0)
    assert p == {"desired": 3, "current": 2, "reason": "forecast", "forecastRps": 12.5, "predictedLatencyMs": None,
                 "sloLatencyMs": 250.0, "message": "sized for p95", "conditionOk": True, "dryRun": False,
                 "updated": "1970-01-01T00:00:00Z"}
    assert same_status(json.dumps({**p, "updated": "2030-01-01T00:00:00Z"}), p)
    assert not same_status(json.dumps({**p, "desired": 4}), p)
    assert status_event(a) == ("Normal", "Scaled", "desired 3 replica(s), 2 ready: forecast; sized for p95")
    stale = UpdateStatus("ns/m", 2, 2, Reason.METRICS_STALE)
    assert status_event(stale)[:2] == ("Warning", "MetricsStale")
    # the model's shortfall this tick, by cause, only when there is one
    short = status_payload(a, dry_run=False, now=0.0, shortfall={ShortfallCause.PREEMPTING: 2, "headroom": 1})
    assert short == {**p, "shortfall": {"preempting": 2, "headroom": 1}}
    assert not same_status(json.dumps(p), short)


def test_shortfall_events_say_the_cause() -> None:
    def ev(cause: ShortfallCause, within: bool = False) -> tuple[str, str, str]:
        return shortfall_event(Shortfall("ns/m", 2, "the words", cause, "search", within))

    assert ev(ShortfallCause.UNPLACEABLE) == ("Warning", "Unplaceable",
                                              "2 replica(s) cannot be placed (unplaceable): the words")
    assert ev(ShortfallCause.BORROWING_LIMIT) == ("Warning", "BorrowingLimit",
                                                  "2 replica(s) not placed (borrowing_limit): the words")
    assert ev(ShortfallCause.OUTRANKED, within=True) == (
        "Warning", "Outranked", "2 replica(s) not placed (outranked, within the team's guarantee): the words")
    assert ev(ShortfallCause.MIN_RUNTIME)[:2] == ("Warning", "MinRuntime")
    assert ev(ShortfallCause.HEADROOM)[:2] == ("Normal", "Headroom")
    # grants in progress: Normal, and never "the guarantee refused"
    assert ev(ShortfallCause.PREEMPTING, within=True) == (
        "Normal", "Preempting", "2 replica(s) waiting for capacity being freed (preempting): the words")
    assert ev(ShortfallCause.RECLAIMING)[:2] == ("Normal", "Reclaiming")
    # every cause the core has maps to its own Event reason
    assert len({ev(c)[1] for c in ShortfallCause}) == len(ShortfallCause)


# -- against the real apiserver ------------------------------------------------------------------------------------


@pytest_asyncio.fixture
async def ns(api: client.ApiClient) -> str:
    name = f"slotwise-act-{uuid.uuid4().hex[:8]}"
    core = client.CoreV1Api(api)
    await core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    # no controller-manager makes the "default" ServiceAccount, and pod admission looks it up (pods opt out of
    # the token, which nothing would create either)
    await core.create_namespaced_service_account(name, {"metadata": {"name": "default"}})
    return name  # no controller-manager: a deleted namespace would sit in Terminating forever, so it is left


def _deployment(name: str, replicas: int, resources: dict, node_selector: dict | None) -> dict:
    labels = {"app": name}
    pod_spec: dict[str, Any] = {
        "containers": [{"name": "server", "image": "registry.invalid/vllm:test", "resources": resources,
                        "env": [{"name": "MODEL", "value": name}]}],
    }
    if node_selector:
        pod_spec["nodeSelector"] = node_selector
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": labels, "annotations": {"slotwise.io/slo-latency-ms": "250"}},
        "spec": {"replicas": replicas, "selector": {"matchLabels": labels},
                 "template": {"metadata": {"labels": labels}, "spec": pod_spec}},
    }


async def make_model(api: client.ApiClient, ns: str, name: str, replicas: int = 1,
                     resources: dict | None = None, node_selector: dict | None = None) -> ManagedModel:
    resources = resources or {"limits": {"nvidia.com/gpu": "1", "cpu": "2"}}
    dep = await client.AppsV1Api(api).create_namespaced_deployment(
        ns, _deployment(name, replicas, resources, node_selector))
    return ManagedModel(key=f"{ns}/{name}", namespace=ns, name=name, uid=dep.metadata.uid, replicas=replicas,
                        container="server", resources=resources, node_selector=node_selector or {})


def view_of(models: list[ManagedModel], nodes: dict[str, NodeInfo] | None = None) -> ClusterView:
    return ClusterView(ClusterSnapshot(0.0, {}, Inventory.from_nodes([])), {m.key: m for m in models}, nodes or {})


async def read_dep(api: client.ApiClient, m: ManagedModel) -> dict:
    return api.sanitize_for_serialization(await client.AppsV1Api(api).read_namespaced_deployment(m.name, m.namespace))


async def events_of(api: client.ApiClient, namespace: str, name: str) -> list[dict]:
    got = await client.CoreV1Api(api).list_namespaced_event(namespace, field_selector=f"involvedObject.name={name}")
    return [api.sanitize_for_serialization(e) for e in got.items]


async def make_pod(api: client.ApiClient, ns: str, name: str, node: str, resource: str,
                   labels: dict | None = None) -> None:
    await client.CoreV1Api(api).create_namespaced_pod(ns, {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels or {}},
        "spec": {"nodeName": node, "automountServiceAccountToken": False,
                 "containers": [{"name": "server", "image": "registry.invalid/vllm:test",
                                 "resources": {"limits": {resource: "1"}}}]},
    })


@aio
async def test_scale_up_then_down_marks_the_removed_pods(api: client.ApiClient, ns: str) -> None:
    m = await make_model(api, ns, "llm-a", replicas=1)
    act = KubeActuator(api, ActuatorConfig())
    r = await act.apply(Plan(0.0, [ScaleModel(m.key, 3, 1, Reason.FORECAST)]), view_of([m]))
    assert r.applied == [f"scale {m.key}: 1 -> 3 (forecast)"] and not r.errors
    assert (await client.AppsV1Api(api).read_namespaced_deployment_scale(m.name, ns)).spec.replicas == 3

    for i in range(3):
        await make_pod(api, ns, f"llm-a-{i}", "node-x", "nvidia.com/gpu", {"app": "llm-a"})
    plan = Plan(1.0, [RemoveReplica(m.key, f"{ns}/llm-a-1"), RemoveReplica(m.key, f"{ns}/llm-a-gone"),
                      ScaleModel(m.key, 1, 3, Reason.FORECAST)])
    r = await act.apply(plan, view_of([dataclasses.replace(m, replicas=3)]))  # the view has seen the scale-up
    assert not r.errors
    assert (await client.AppsV1Api(api).read_namespaced_deployment_scale(m.name, ns)).spec.replicas == 1
    costs = {}
    for i in range(3):
        pod = await client.CoreV1Api(api).read_namespaced_pod(f"llm-a-{i}", ns)
        costs[pod.metadata.name] = (pod.metadata.annotations or {}).get(POD_DELETION_COST)
    assert costs == {"llm-a-0": None, "llm-a-1": "-1000", "llm-a-2": None}
    assert (f"drain {m.key}/{ns}/llm-a-gone", "gone") in r.skipped


@aio
async def test_second_apply_writes_nothing(api: client.ApiClient, ns: str) -> None:
    m = await make_model(api, ns, "llm-b", replicas=1)
    act = KubeActuator(api, ActuatorConfig(time_slicing_configmap=f"{ns}/ts"))
    plan = Plan(0.0, [
        SetTimeSlicing({"nvidia.com/gpu": 4}),
        SetSlotTemplate(m.key, {"limits": {MIG_3G: "1"}}, {GPU_PRODUCT: H100}),
        ScaleModel(m.key, 2, 1, Reason.FORECAST),
        UpdateStatus(m.key, 2, 1, Reason.FORECAST, forecast_rps=3.0),
    ])
    first = await act.apply(plan, view_of([m]))
    assert len(first.applied) == 4 and not first.errors and first.events == 1
    rv = (await read_dep(api, m))["metadata"]["resourceVersion"]
    cm_rv = (await client.CoreV1Api(api).read_namespaced_config_map("ts", ns)).metadata.resource_version
    act.clock = lambda: 1e9  # a later tick: the status' "updated" time would differ, the status does not
    second = await act.apply(plan, view_of([m]))
    assert second.applied == [] and second.events == 0 and not second.errors
    assert [why for _, why in second.skipped] == ["unchanged"] * 4
    assert (await read_dep(api, m))["metadata"]["resourceVersion"] == rv
    assert (await client.CoreV1Api(api).read_namespaced_config_map("ts", ns)).metadata.resource_version == cm_rv


@aio
async def test_conflicts_are_retried_against_the_server(api: client.ApiClient, ns: str) -> None:
    m = await make_model(api, ns, "llm-c", replicas=1)
    apps = client.AppsV1Api(api)
    act = KubeActuator(api, ActuatorConfig())
    calls: list[str] = []

    async def other_writer(what: str, key: str) -> None:
        calls.append(what)
        if len(calls) in (1, 3):  # the first write of the scale and of the template each lose a race
            await apps.patch_namespaced_deployment(
                m.name, ns, {"metadata": {"annotations": {f"other-writer-{len(calls)}": "yes"}}}, _content_type=MERGE)

    act.before_write = other_writer
    plan = Plan(0.0, [SetSlotTemplate(m.key, {"limits": {MIG_3G: "1"}}, {}), ScaleModel(m.key, 4, 1, Reason.PANIC)])
    r = await act.apply(plan, view_of([m]))
    assert not r.errors, r.errors
    assert calls == ["template", "template", "scale", "scale"]
    assert r.conflicts_retried == 2
    dep = await read_dep(api, m)
    assert dep["spec"]["replicas"] == 4
    assert dep["spec"]["template"]["spec"]["containers"][0]["resources"] == {"limits": {"cpu": "2", MIG_3G: "1"}}
    assert {"other-writer-1", "other-writer-3"} <= set(dep["metadata"]["annotations"])  # theirs survived ours


@aio
async def test_conflict_retries_run_out_and_other_actions_go_on(api: client.ApiClient, ns: str) -> None:
    hot = await make_model(api, ns, "llm-hot", replicas=1)
    calm = await make_model(api, ns, "llm-calm", replicas=1)
    apps = client.AppsV1Api(api)
    act = KubeActuator(api, ActuatorConfig(conflict_retries=2))

    async def always_first(what: str, key: str) -> None:
        if key == hot.key:
            await apps.patch_namespaced_deployment(
                hot.name, ns, {"metadata": {"annotations": {"bump": uuid.uuid4().hex}}}, _content_type=MERGE)

    act.before_write = always_first
    plan = Plan(0.0, [ScaleModel(hot.key, 3, 1, Reason.PANIC), ScaleModel(calm.key, 2, 1, Reason.FORECAST)])
    r = await act.apply(plan, view_of([hot, calm]))
    assert r.conflicts_retried == 2
    assert len(r.errors) == 1 and r.errors[0].startswith(f"scale {hot.key}") and "409 Conflict" in r.errors[0]
    assert r.applied == [f"scale {calm.key}: 1 -> 2 (forecast)"]
    assert (await apps.read_namespaced_deployment_scale(hot.name, ns)).spec.replicas == 1


@aio
async def test_rate_limits_per_tick(api: client.ApiClient, ns: str) -> None:
    done = await make_model(api, ns, "llm-done", replicas=2)
    ms = [await make_model(api, ns, f"llm-r{i}", replicas=1) for i in range(3)]
    act = KubeActuator(api, ActuatorConfig(max_scale_actions_per_tick=2, max_template_changes_per_tick=1))
    plan = Plan(0.0, [ScaleModel(done.key, 2, 2, Reason.STABLE)]  # already so: costs no budget
                + [ScaleModel(m.key, 5, 1, Reason.FORECAST) for m in ms]
                + [SetSlotTemplate(m.key, {"limits": {MIG_1G: "1"}}, {}) for m in ms[:2]])
    r = await act.apply(plan, view_of([done, *ms]))
    assert [why for _, why in r.skipped] == ["rate-limit", "unchanged", "rate-limit"]
    replicas = [(await client.AppsV1Api(api).read_namespaced_deployment_scale(m.name, ns)).spec.replicas for m in ms]
    assert replicas == [5, 5, 1]
    limits = [(await read_dep(api, m))["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
              for m in ms[:2]]
    assert limits == [{"cpu": "2", MIG_1G: "1"}, {"cpu": "2", "nvidia.com/gpu": "1"}]


@aio
async def test_template_change_replaces_the_gpu_resource(api: client.ApiClient, ns: str) -> None:
    m = await make_model(api, ns, "llm-t", resources={"limits": {"nvidia.com/gpu": "1", "cpu": "4"},
                                                     "requests": {"nvidia.com/gpu": "1", "memory": "16Gi"}},
                         node_selector={GPU_PRODUCT: "NVIDIA-A100-SXM4-80GB", "pool": "inference"})
    act = KubeActuator(api, ActuatorConfig())
    wanted = {"limits": {MIG_3G: "1"}, "requests": {MIG_3G: "1"}}
    r = await act.apply(Plan(0.0, [SetSlotTemplate(m.key, wanted, {GPU_PRODUCT: H100})]), view_of([m]))
    assert r.applied and not r.errors
    spec = (await read_dep(api, m))["spec"]["template"]["spec"]
    assert spec["containers"][0]["resources"] == {"limits": {"cpu": "4", MIG_3G: "1"},
                                                  "requests": {"memory": "16Gi", MIG_3G: "1"}}
    assert spec["nodeSelector"] == {"pool": "inference", GPU_PRODUCT: H100}
    assert spec["containers"][0]["env"] == [{"name": "MODEL", "value": "llm-t"}]  # the rest of the container stays
    # and back to a whole GPU: the MIG resource goes
    r = await act.apply(Plan(1.0, [SetSlotTemplate(m.key, {"limits": {"nvidia.com/gpu": "1"}}, {})]), view_of([m]))
    spec = (await read_dep(api, m))["spec"]["template"]["spec"]
    assert spec["containers"][0]["resources"] == {"limits": {"cpu": "4", "nvidia.com/gpu": "1"},
                                                  "requests": {"memory": "16Gi"}}
    assert spec["nodeSelector"] == {"pool": "inference"}


@aio
async def test_time_slicing_configmap_create_update_unchanged(api: client.ApiClient, ns: str) -> None:
    core = client.CoreV1Api(api)
    act = KubeActuator(api, ActuatorConfig(time_slicing_configmap=f"{ns}/time-slicing-config"))
    r = await act.apply(Plan(0.0, [SetTimeSlicing({"nvidia.com/gpu": 4})]), view_of([]))
    assert r.applied == [f"time-slicing {{'nvidia.com/gpu': 4}}: created {ns}/time-slicing-config"]
    cm = await core.read_namespaced_config_map("time-slicing-config", ns)
    assert yaml.safe_load(cm.data["any"]) == time_slicing_config({"nvidia.com/gpu": 4})
    # someone else's key in the same ConfigMap survives our update
    await core.patch_namespaced_config_map("time-slicing-config", ns, {"data": {"a100": "x"}}, _content_type=MERGE)
    r = await act.apply(Plan(1.0, [SetTimeSlicing({"nvidia.com/gpu": 2, MIG_1G: 3})]), view_of([]))
    assert r.applied and r.applied[0].endswith("updated " + f"{ns}/time-slicing-config")
    cm = await core.read_namespaced_config_map("time-slicing-config", ns)
    assert yaml.safe_load(cm.data["any"]) == time_slicing_config({"nvidia.com/gpu": 2, MIG_1G: 3})
    assert cm.data["a100"] == "x"
    r = await act.apply(Plan(2.0, [SetTimeSlicing({"nvidia.com/gpu": 2, MIG_1G: 3})]), view_of([]))
    assert r.applied == [] and r.why("time-slicing") == ["unchanged"]
    assert (await core.read_namespaced_config_map("time-slicing-config", ns)).metadata.resource_version \
        == cm.metadata.resource_version


@aio
async def test_status_annotation_and_events(api: client.ApiClient, ns: str) -> None:
    ok = await make_model(api, ns, "llm-ok")
    bad = await make_model(api, ns, "llm-bad")
    try:
        parse_annotations(bad.name, {"slotwise.io/slo-latency-ms": "fast", "slotwise.io/min-replicas": "-1"},
                          namespace=ns)
        raise AssertionError("the annotations should be invalid")
    except SpecError as e:
        problem = str(e)
    act = KubeActuator(api, ActuatorConfig(), clock=lambda: 1_700_000_000.0)
    plan = Plan(0.0, [
        UpdateStatus(ok.key, 3, 2, Reason.FORECAST, forecast_rps=41.5, message="sized for the p95 forecast",
                     predicted_latency_ms=180.0, slo_latency_ms=250.0),
        UpdateStatus(bad.key, 1, 1, Reason.INVALID_SPEC, message=problem, condition_ok=False),
    ])
    r = await act.apply(plan, view_of([ok, bad]))
    assert not r.errors and r.events == 2
    status = json.loads((await read_dep(api, ok))["metadata"]["annotations"][STATUS_ANNOTATION])
    assert status == {"desired": 3, "current": 2, "reason": "forecast", "forecastRps": 41.5,
                      "predictedLatencyMs": 180.0, "sloLatencyMs": 250.0, "message": "sized for the p95 forecast",
                      "conditionOk": True, "dryRun": False, "updated": "2023-11-14T22:13:20Z"}
    [ev] = await events_of(api, ns, ok.name)
    assert (ev["type"], ev["reason"], ev["count"]) == ("Normal", "Scaled", 1)
    assert ev["involvedObject"] == {"kind": "Deployment", "apiVersion": "apps/v1", "name": ok.name,
                                    "namespace": ns, "uid": ok.uid}
    assert ev["source"] == {"component": "slotwise"}
    [ev] = await events_of(api, ns, bad.name)
    assert (ev["type"], ev["reason"], ev["message"]) == ("Warning", "InvalidAnnotation", problem)
    assert json.loads((await read_dep(api, bad))["metadata"]["annotations"][STATUS_ANNOTATION])["conditionOk"] is False

    # a shortfall that lasts (issue 30): its Event is written on the first decision; the next ones are held (no
    # request; another missing count is the same number-free text) until status_refresh_s after that write, then
    # one bump carries every decision in its count and the latest message
    act.clock = lambda: 1_700_000_060.0
    r = await act.apply(Plan(1.0, [Shortfall(ok.key, 2, "no free GPU slot fits the replica")]), view_of([ok]))
    assert r.applied == [f"shortfall {ok.key}: 2 replica(s) unplaceable: no free GPU slot fits the replica"]
    r = await act.apply(Plan(1.0, [Shortfall(ok.key, 3, "no free GPU slot fits the replica")]), view_of([ok]))
    assert (r.applied, r.events) == ([], 0)
    assert r.skipped == [(f"shortfall {ok.key}: 3 replica(s) unplaceable: no free GPU slot fits the replica",
                          "event-held")]
    act.clock = lambda: 1_700_000_360.0
    r = await act.apply(Plan(2.0, [Shortfall(ok.key, 3, "no free GPU slot fits the replica")]), view_of([ok]))
    assert r.events == 1
    unplaceable = sorted((e["message"], e["count"], e["type"], e["lastTimestamp"])
                         for e in await events_of(api, ns, ok.name) if e["reason"] == "Unplaceable")
    assert [u[:3] for u in unplaceable] == [
        ("3 replica(s) cannot be placed (unplaceable): no free GPU slot fits the replica", 3, "Warning")]
    assert unplaceable[0][3].startswith("2023-11-14T22:19:20")

    # at most max_events_per_tick Events per apply
    act.config.max_events_per_tick = 1
    r = await act.apply(Plan(3.0, [Shortfall(ok.key, 7, "x"), Shortfall(bad.key, 7, "x")]), view_of([ok, bad]))
    assert r.events == 1 and r.skipped == [(f"event Warning Unplaceable Deployment {ns}/{bad.name}", "rate-limit")]


@aio
async def test_report_mode_writes_only_status_and_events(api: client.ApiClient, ns: str) -> None:
    m = await make_model(api, ns, "llm-d", replicas=1)
    node = await make_node(api, f"dry-{uuid.uuid4().hex[:6]}", {MIG_CONFIG: "cfg-a", MIG_CONFIG_STATE: "success"})
    act = KubeActuator(api, ActuatorConfig(report_only=True, mig_relayout=True,
                                           time_slicing_configmap=f"{ns}/ts", mig_parted_configmap=f"{ns}/mig"))
    before = await read_dep(api, m)
    slot = Slot(node, (0,), SlotKind.WHOLE, "H100-80GB", None, None, 80.0, 1.0)
    plan = Plan(0.0, [
        SetTimeSlicing({"nvidia.com/gpu": 4}),
        _layout(node),
        SetSlotTemplate(m.key, {"limits": {MIG_3G: "1"}}, {GPU_PRODUCT: H100}),
        PlaceReplica(m.key, f"{m.key}-1", slot),
        ScaleModel(m.key, 2, 1, Reason.FORECAST),
        Shortfall(m.key, 1, "no free GPU slot fits the replica"),
        UpdateStatus(m.key, 2, 1, Reason.FORECAST),
    ])
    r = await act.apply(plan, view_of([m], {node: await node_info(api, node)}))
    assert not r.errors
    assert [why for _, why in r.skipped] == ["report-only"] * 4 + ["scheduler-placed"]
    after = await read_dep(api, m)
    assert after["spec"] == before["spec"]
    assert json.loads(after["metadata"]["annotations"][STATUS_ANNOTATION])["dryRun"] is True
    assert sorted(e["reason"] for e in await events_of(api, ns, m.name)) == ["DryRunScaled", "DryRunUnplaceable"]
    with pytest.raises(ApiException) as err:
        await client.CoreV1Api(api).read_namespaced_config_map("ts", ns)
    assert err.value.status == 404
    n = await client.CoreV1Api(api).read_node(node)
    assert not n.spec.unschedulable and n.metadata.labels[MIG_CONFIG] == "cfg-a"


@aio
async def test_deleted_deployment_is_gone_and_errors_stay_per_action(api: client.ApiClient, ns: str) -> None:
    live = await make_model(api, ns, "llm-live")
    ghost = ManagedModel(key=f"{ns}/llm-ghost", namespace=ns, name="llm-ghost", uid="x", replicas=1,
                         container="server")
    act = KubeActuator(api, ActuatorConfig(time_slicing_configmap=f"no-such-ns-{uuid.uuid4().hex[:6]}/ts"))
    plan = Plan(0.0, [
        SetTimeSlicing({"nvidia.com/gpu": 2}),
        ScaleModel(ghost.key, 2, 1, Reason.FORECAST),
        UpdateStatus(ghost.key, 2, 1, Reason.FORECAST),
        ScaleModel(live.key, 2, 1, Reason.FORECAST),
        ScaleModel(f"{ns}/not-in-view", 2, 1, Reason.FORECAST),
    ])
    r = await act.apply(plan, view_of([live, ghost]))
    assert len(r.errors) == 1 and r.errors[0].startswith("time-slicing") and "404 Not Found" in r.errors[0]
    assert [why for _, why in r.skipped] == ["gone", "gone", "gone"]
    assert r.applied == [f"scale {live.key}: 1 -> 2 (forecast)"]


# -- the MIG gate against real Node objects ------------------------------------------------------------------------


_CREATED_NODES: list[str] = []


@pytest_asyncio.fixture(autouse=True)
async def _delete_created_nodes(kube_apiserver) -> AsyncIterator[None]:
    """Nodes are cluster-wide: delete this test's, so later tests' controllers do not place on them."""
    yield
    if _CREATED_NODES:
        async with kube_apiserver.api_client() as api:
            for name in _CREATED_NODES:
                with contextlib.suppress(client.ApiException):
                    await client.CoreV1Api(api).delete_node(name)
        _CREATED_NODES.clear()


async def make_node(api: client.ApiClient, name: str, labels: dict[str, str], unschedulable: bool = False,
                    capacity: dict[str, str] | None = None) -> str:
    core = client.CoreV1Api(api)
    _CREATED_NODES.append(name)
    labels = {GPU_PRODUCT: H100, "nvidia.com/mig.capable": "true", "nvidia.com/mig.strategy": "mixed", **labels}
    await core.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels},
                            "spec": {"unschedulable": unschedulable}})
    capacity = capacity or {MIG_1G: "7", "cpu": "64", "memory": "512Gi", "pods": "110"}
    await core.patch_node_status(name, {"status": {"capacity": capacity, "allocatable": capacity}},
                                 _content_type=MERGE)
    return name


async def node_info(api: client.ApiClient, name: str) -> NodeInfo:
    """What translate.build_view would say about the node: labels, cordon, pods per GPU resource."""
    core = client.CoreV1Api(api)
    node = await core.read_node(name)
    pods = await core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={name}")
    gpu_pods: Counter[str] = Counter()
    for pod in pods.items:
        used = {res for c in pod.spec.containers for res in {**((c.resources and c.resources.limits) or {}),
                                                             **((c.resources and c.resources.requests) or {})}
                if res.startswith("nvidia.com/")}
        gpu_pods.update(used)
    return NodeInfo(name, dict(node.metadata.labels or {}), bool(node.spec.unschedulable), dict(gpu_pods))


@dataclass(frozen=True)
class Seen:
    unschedulable: bool
    config: str | None
    state: str | None
    pods: int


class FakeMigManager:
    """Plays NVIDIA's MIG manager on one node: when ``nvidia.com/mig.config`` names a new config it waits for
    ``notice`` (a manager slow to pick the change up), sets ``nvidia.com/mig.config.state=pending``, waits for
    ``release`` (the "reconfiguration"), then sets ``outcome``. Records what it saw of the node on every poll."""

    def __init__(self, api: client.ApiClient, node: str, outcome: str = "success") -> None:
        self.core = client.CoreV1Api(api)
        self.node, self.outcome = node, outcome
        self.notice = asyncio.Event()
        self.release = asyncio.Event()
        self.seen: list[Seen] = []
        self.applied: list[str] = []

    async def _state(self, value: str) -> None:
        await self.core.patch_node(self.node, {"metadata": {"labels": {MIG_CONFIG_STATE: value}}},
                                   _content_type=MERGE)

    async def run(self) -> None:
        current = None
        while True:
            node = await self.core.read_node(self.node)
            pods = await self.core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={self.node}")
            labels = node.metadata.labels or {}
            self.seen.append(Seen(bool(node.spec.unschedulable), labels.get(MIG_CONFIG), labels.get(MIG_CONFIG_STATE),
                                  len(pods.items)))
            wanted = labels.get(MIG_CONFIG)
            if current is None:
                current = wanted
            elif wanted != current and self.notice.is_set():
                await self._state("pending")
                await self.release.wait()
                await self._state(self.outcome)
                self.applied.append(wanted or "")
                current = wanted
            await asyncio.sleep(0.02)

    async def saw(self, predicate: Callable[[Seen], bool], timeout: float = 10.0) -> None:
        # what the manager sees from NOW on: counted before yielding (inside wait_for's task it was counted only
        # once that task ran, by when the manager could have seen the change and blocked on `release`: a flake
        # under load)
        start = len(self.seen)

        async def wait() -> None:
            while not any(predicate(s) for s in self.seen[start:]):
                await asyncio.sleep(0.01)
        await asyncio.wait_for(wait(), timeout)


@pytest_asyncio.fixture
async def started() -> AsyncIterator[list[asyncio.Task]]:
    tasks: list[asyncio.Task] = []
    yield tasks
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


@aio
async def test_mig_gate_full_sequence(api: client.ApiClient, ns: str, started: list[asyncio.Task]) -> None:
    core = client.CoreV1Api(api)
    node = await make_node(api, f"gpu-{uuid.uuid4().hex[:6]}", {MIG_CONFIG: "all-1g.10gb", MIG_CONFIG_STATE: "success"})
    await make_pod(api, ns, "on-changing-instance", node, MIG_1G)
    other = {"version": "v1", "mig-configs": {"all-disabled": [{"devices": "all", "mig-enabled": False}]}}
    await core.create_namespaced_config_map(ns, {"metadata": {"name": "mig-parted"},
                                                 "data": {"config.yaml": to_yaml(other)}})
    manager = FakeMigManager(api, node)
    started.append(asyncio.create_task(manager.run()))
    now = [1000.0]
    act = KubeActuator(api, ActuatorConfig(mig_relayout=True, mig_parted_configmap=f"{ns}/mig-parted"),
                       clock=lambda: now[0])
    action = _layout(node, "slotwise-h100-2x3g")

    async def tick() -> ActuationReport:
        now[0] += 10
        report = await act.apply(Plan(now[0], [action]), view_of([], {node: await node_info(api, node)}))
        assert not report.errors, report.errors
        return report

    r = await tick()  # 1: cordon
    assert f"mig-layout {node}: cordon" in r.applied
    n = await core.read_node(node)
    assert n.spec.unschedulable and n.metadata.labels[OWNER_LABEL] == "slotwise-h100-2x3g"
    await manager.saw(lambda s: s.unschedulable and s.config == "all-1g.10gb")

    r = await tick()  # 2: a pod still uses a 1g.10gb instance, which goes away: wait
    assert r.why(f"mig-layout {node}") == ["in-flight"]
    assert any("waiting for pods to leave" in p and MIG_1G in p for p in r.pending)
    assert (await core.read_node(node)).metadata.labels[MIG_CONFIG] == "all-1g.10gb"

    await core.delete_namespaced_pod("on-changing-instance", ns, grace_period_seconds=0)
    r = await tick()  # 3: free: the mig-parted entry, then the label (with our "pending")
    assert f"mig-layout {node}: relabel {MIG_CONFIG}=slotwise-h100-2x3g" in r.applied
    doc = yaml.safe_load((await core.read_namespaced_config_map("mig-parted", ns)).data["config.yaml"])
    assert doc["mig-configs"] == {**other["mig-configs"], **action.config["mig-configs"]}
    await manager.saw(lambda s: s.config == "slotwise-h100-2x3g")

    # 4: the MIG manager has not even noticed: the state label must not still say the OLD "success" (our relabel
    # set "pending" in the same patch), so the gate keeps waiting
    await manager.saw(lambda s: s.config == "slotwise-h100-2x3g")
    r = await tick()
    assert (await core.read_node(node)).spec.unschedulable
    assert act.gate.in_flight == [node] and any("state 'pending'" in p for p in r.pending)

    manager.notice.set()
    await manager.saw(lambda s: s.state == "pending")
    manager.release.set()
    await manager.saw(lambda s: s.state == "success" and s.config == "slotwise-h100-2x3g")
    r = await tick()  # 5: success -> uncordon
    assert f"mig-layout {node}: uncordon" in r.applied
    n = await core.read_node(node)
    assert not n.spec.unschedulable and OWNER_LABEL not in n.metadata.labels
    assert act.gate.in_flight == [] and manager.applied == ["slotwise-h100-2x3g"]
    await manager.saw(lambda s: not s.unschedulable)

    # the order the node went through, as the MIG manager saw it on every poll
    relabeled = [s for s in manager.seen if s.config == "slotwise-h100-2x3g"]
    assert relabeled and all(s.pods == 0 for s in relabeled)  # relabel only after the pod was gone
    assert all(s.unschedulable or s.state == "success" for s in relabeled)  # cordoned until success
    first = manager.seen.index(relabeled[0])
    assert manager.seen[first - 1].unschedulable  # cordoned before the relabel
    reasons = [(e["type"], e["reason"]) for e in await events_of(api, "default", node)]
    assert reasons.count(("Normal", "MigRelayoutStarted")) == 1 and ("Normal", "MigRelayoutDone") in reasons

    r = await tick()  # the planner's view catches up later: the same action again is already applied
    assert r.why(f"mig-layout {node}") == ["unchanged"] and not (await core.read_node(node)).spec.unschedulable


@aio
async def test_mig_gate_failure_uncordons_and_warns(api: client.ApiClient, ns: str,
                                                    started: list[asyncio.Task]) -> None:
    core = client.CoreV1Api(api)
    node = await make_node(api, f"gpu-{uuid.uuid4().hex[:6]}", {MIG_CONFIG: "all-1g.10gb", MIG_CONFIG_STATE: "success"})
    manager = FakeMigManager(api, node, outcome="failed")
    manager.notice.set()
    manager.release.set()
    started.append(asyncio.create_task(manager.run()))
    now = [0.0]
    act = KubeActuator(api, ActuatorConfig(mig_relayout=True, mig_parted_configmap=f"{ns}/mig-parted"),
                       clock=lambda: now[0])
    action = _layout(node, "slotwise-h100-bad")

    async def tick() -> ActuationReport:
        now[0] += 10
        return await act.apply(Plan(now[0], [action]), view_of([], {node: await node_info(api, node)}))

    await tick()  # cordon
    await tick()  # no pods: relabel
    await manager.saw(lambda s: s.state == "failed")
    r = await tick()
    assert len(r.errors) == 1 and "state=failed" in r.errors[0] and r.errors[0].endswith("uncordoned")
    n = await core.read_node(node)
    assert not n.spec.unschedulable and OWNER_LABEL not in n.metadata.labels
    warnings = [e for e in await events_of(api, "default", node) if e["type"] == "Warning"]
    assert [e["reason"] for e in warnings] == ["MigRelayoutFailed"]
    assert "slotwise-h100-bad" in warnings[0]["message"]
    assert warnings[0]["involvedObject"]["kind"] == "Node" and warnings[0]["involvedObject"]["uid"] == n.metadata.uid
    r = await tick()  # the planner asks again at once: not before the retry delay (no cordon loops)
    assert r.why(f"mig-layout {node}") == ["backoff"] and not (await core.read_node(node)).spec.unschedulable


@aio
async def test_mig_gate_leaves_an_admin_cordon_and_times_out(api: client.ApiClient, ns: str) -> None:
    core = client.CoreV1Api(api)
    node = await make_node(api, f"gpu-{uuid.uuid4().hex[:6]}", {MIG_CONFIG: "all-1g.10gb", MIG_CONFIG_STATE: "success"},
                           unschedulable=True)
    now = [0.0]
    act = KubeActuator(api, ActuatorConfig(mig_relayout=True, mig_parted_configmap=f"{ns}/mig-parted",
                                           mig_timeout_s=60.0), clock=lambda: now[0])
    action = _layout(node, "slotwise-h100-slow")
    for t in (0.0, 10.0, 20.0, 100.0):  # cordon (already: the admin's), relabel, wait, then no MIG manager: time out
        now[0] = t
        r = await act.apply(Plan(t, [action]), view_of([], {node: await node_info(api, node)}))
    assert r.errors and "no nvidia.com/mig.config.state=success after 90s" in r.errors[0]
    n = await core.read_node(node)
    assert n.spec.unschedulable and OWNER_LABEL not in n.metadata.labels  # the admin's cordon stays


@aio
async def test_mig_gate_disabled_by_default_and_restart_recovery(api: client.ApiClient, ns: str) -> None:
    core = client.CoreV1Api(api)
    plain = await make_node(api, f"gpu-{uuid.uuid4().hex[:6]}",
                            {MIG_CONFIG: "all-1g.10gb", MIG_CONFIG_STATE: "success"})
    # what a controller that died mid-relayout leaves behind: its cordon and owner label
    done = await make_node(api, f"gpu-{uuid.uuid4().hex[:6]}", {MIG_CONFIG: "cfg-b", MIG_CONFIG_STATE: "success",
                                                                 OWNER_LABEL: "cfg-b"}, unschedulable=True)
    early = await make_node(api, f"gpu-{uuid.uuid4().hex[:6]}", {MIG_CONFIG: "cfg-a", MIG_CONFIG_STATE: "success",
                                                                  OWNER_LABEL: "cfg-b"}, unschedulable=True)
    assert ActuatorConfig().mig_relayout is False
    act = KubeActuator(api, ActuatorConfig(max_nodes_relayout=2, mig_parted_configmap=f"{ns}/mig-parted"))
    nodes = {n: await node_info(api, n) for n in (plain, done, early)}
    r = await act.apply(Plan(0.0, [_layout(plain)]), view_of([], nodes))
    assert r.why(f"mig-layout {plain}") == ["gate-disabled"] and not r.errors
    assert not (await core.read_node(plain)).spec.unschedulable
    assert (await core.read_node(plain)).metadata.labels[MIG_CONFIG] == "all-1g.10gb"
    for n in (done, early):  # the restarted controller finishes what the old one left: uncordon
        got = await core.read_node(n)
        assert not got.spec.unschedulable and OWNER_LABEL not in got.metadata.labels
    assert (await core.read_node(early)).metadata.labels[MIG_CONFIG] == "cfg-a"
    with pytest.raises(ApiException):
        await core.read_namespaced_config_map("mig-parted", ns)


@aio
async def test_a_preemption_scales_the_victim_down_marks_its_replica_and_warns(api: client.ApiClient,
                                                                                ns: str) -> None:
    """A preemption is a scale-down of the victim that removes THE preempted replica (pod-deletion-cost) and
    leaves a Warning Event ``Preempted`` with the core's message on the victim Deployment; the preemptor's
    shortfall Event and status say the cause."""
    victim = await make_model(api, ns, "llm-low", replicas=3)
    winner = await make_model(api, ns, "llm-high", replicas=1)
    for i in range(3):
        await make_pod(api, ns, f"llm-low-{i}", "node-x", "nvidia.com/gpu", {"app": "llm-low"})
    message = f"replica {ns}/llm-low-1 preempted for {winner.key} (priority 10 > 0): it would miss its SLO"
    plan = Plan(0.0, [
        RemoveReplica(victim.key, f"{ns}/llm-low-1", preempted_by=winner.key, reason=PreemptionReason.PRIORITY,
                      message=message),
        ScaleModel(victim.key, 2, 3, Reason.PREEMPTED, f"1 replica preempted for {winner.key}"),
        UpdateStatus(victim.key, 2, 3, Reason.PREEMPTED, message=f"1 replica preempted for {winner.key}"),
        Shortfall(winner.key, 1, "lower-priority replicas are draining for it", ShortfallCause.PREEMPTING,
                  "search", True),
        UpdateStatus(winner.key, 2, 1, Reason.FORECAST, forecast_rps=30.0),
    ])
    act = KubeActuator(api, ActuatorConfig(), clock=lambda: 1_700_000_000.0)
    r = await act.apply(plan, view_of([victim, winner]))
    assert not r.errors, r.errors
    assert (await client.AppsV1Api(api).read_namespaced_deployment_scale(victim.name, ns)).spec.replicas == 2
    costs = {}
    for i in range(3):
        pod = await client.CoreV1Api(api).read_namespaced_pod(f"llm-low-{i}", ns)
        costs[pod.metadata.name] = (pod.metadata.annotations or {}).get(POD_DELETION_COST)
    assert costs == {"llm-low-0": None, "llm-low-1": "-1000", "llm-low-2": None}
    assert any(line.startswith(f"drain {victim.key}/{ns}/llm-low-1 preempted (priority) for "
                               f"{winner.key}: {POD_DELETION_COST}") for line in r.applied), r.applied
    preempted = [e for e in await events_of(api, ns, victim.name) if e["reason"] == "Preempted"]
    assert [(e["type"], e["message"], e["count"]) for e in preempted] == [("Warning", message, 1)]
    assert preempted[0]["involvedObject"]["uid"] == victim.uid
    victim_status = json.loads((await read_dep(api, victim))["metadata"]["annotations"][STATUS_ANNOTATION])
    assert victim_status["reason"] == "preempted" and "shortfall" not in victim_status
    # the preemptor: an Event naming the cause (Normal: capacity is being freed for it) and the status' shortfall
    [waiting] = [e for e in await events_of(api, ns, winner.name) if e["reason"] == "Preempting"]
    assert waiting["type"] == "Normal"
    assert waiting["message"] == "1 replica(s) waiting for capacity being freed (preempting): lower-priority " \
                                 "replicas are draining for it"
    status = json.loads((await read_dep(api, winner))["metadata"]["annotations"][STATUS_ANNOTATION])
    assert status["shortfall"] == {"preempting": 1}

    # planned again while the scale-down is done already: no second scale write, no second Event
    again = await act.apply(plan, view_of([victim, winner]))
    assert not again.errors and again.why(f"scale {victim.key}") == ["unchanged"]
    assert [e["count"] for e in await events_of(api, ns, victim.name) if e["reason"] == "Preempted"] == [1]


@aio
async def test_a_preemption_in_report_mode_only_reports(api: client.ApiClient, ns: str) -> None:
    victim = await make_model(api, ns, "llm-dry", replicas=2)
    await make_pod(api, ns, "llm-dry-0", "node-x", "nvidia.com/gpu", {"app": "llm-dry"})
    plan = Plan(0.0, [
        RemoveReplica(victim.key, f"{ns}/llm-dry-0", preempted_by=f"{ns}/other", reason=PreemptionReason.GUARANTEE,
                      message="preempted: team search reclaims its guarantee"),
        ScaleModel(victim.key, 1, 2, Reason.PREEMPTED),
    ])
    r = await KubeActuator(api, ActuatorConfig(report_only=True)).apply(plan, view_of([victim]))
    assert not r.errors and r.why(f"scale {victim.key}") == ["report-only"]
    assert (await client.AppsV1Api(api).read_namespaced_deployment_scale(victim.name, ns)).spec.replicas == 2
    pod = await client.CoreV1Api(api).read_namespaced_pod("llm-dry-0", ns)
    assert POD_DELETION_COST not in (pod.metadata.annotations or {})
    [ev] = [e for e in await events_of(api, ns, victim.name) if e["reason"].endswith("Preempted")]
    assert (ev["type"], ev["reason"], ev["message"]) == ("Warning", "DryRunPreempted",
                                                         "preempted: team search reclaims its guarantee")


@aio
async def test_a_scale_write_counts_the_replicas_lost_on_a_node_out_of_service(api: client.ApiClient, ns: str) -> None:
    """Issue 16, failure mode 9: one of 3 pods is on a NotReady node. The ReplicaSet still counts it in
    spec.replicas, the plan does not (it is no capacity): to have 3 serving replicas the scale must say 4, and a
    scale-down from 3 serving replicas to 2 is a scale of 3, not 2 (which would also take a healthy pod)."""
    m = await make_model(api, ns, "llm-lost", replicas=3)
    lost = dataclasses.replace(m, replicas=3, unavailable_replicas=1)
    act = KubeActuator(api, ActuatorConfig())
    r = await act.apply(Plan(0.0, [ScaleModel(m.key, 3, 2, Reason.FORECAST)]), view_of([lost]))
    assert not r.errors, r.errors
    assert (await client.AppsV1Api(api).read_namespaced_deployment_scale(m.name, ns)).spec.replicas == 4
    r = await act.apply(Plan(1.0, [ScaleModel(m.key, 2, 3, Reason.FORECAST)]),
                        view_of([dataclasses.replace(lost, replicas=4)]))
    assert not r.errors, r.errors
    assert (await client.AppsV1Api(api).read_namespaced_deployment_scale(m.name, ns)).spec.replicas == 3


@aio
async def test_a_scale_up_planned_on_a_lagging_pods_cache_never_lowers_the_scale(api: client.ApiClient,
                                                                                  ns: str) -> None:
    """Issue 16, failure mode 3 through the pods cache: someone scaled the Deployment to 6 and the Deployments
    cache has seen it, but the pods cache still shows 1 pod, so the rails approved a scale-up 1 -> 3. Writing 3
    would halve the fleet: it is skipped (stale-view), the scale stays 6."""
    m = await make_model(api, ns, "llm-lag", replicas=6)
    act = KubeActuator(api, ActuatorConfig())
    r = await act.apply(Plan(0.0, [ScaleModel(m.key, 3, 1, Reason.FORECAST)]), view_of([m]))
    assert [why for _, why in r.skipped] == ["stale-view"] and not r.applied, (r.applied, r.skipped)
    assert (await client.AppsV1Api(api).read_namespaced_deployment_scale(m.name, ns)).spec.replicas == 6
