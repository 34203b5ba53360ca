"""The actuator's safety rails (issue 16), against a REAL kube-apiserver 1.20.2 + etcd (``realparts.kube``), most
through the fault proxy (``realparts.faultproxy``) so every request that reached the server can be counted:

- the write gate: once it closes, not one more write; :class:`LeadershipLost` leaves ``apply`` (failure mode 2);
- a stale cache: with watches held while another client scales 1 -> 6, a plan 1 -> 3 from the frozen cache never
  lowers the live 6 (failure mode 3);
- a 429's ``Retry-After`` is waited for and the write retried (failure mode 10, "everywhere");
- the MIG gate only writes to a node that is still in the state it remembers, and a new leadership term forgets
  the old term's relayouts (failure modes 1 and 7);
- status and Events under steady noisy load: bounded writes per model and hour (failure mode 12);
- ``--dry-run`` is read-only; report mode writes status and Events only (security).

The pure rules (when a status is worth writing, the number-free Event text) are tested without a server first.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import pytest_asyncio
from hypothesis import given
from hypothesis import strategies as st
from kubernetes_asyncio import client
from kubernetes_asyncio.client import ApiClient
from realparts.faultproxy import FaultProxy
from test_kube_actuator import view_of

from autoscaler.api.plan import (
    Plan,
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
from autoscaler.live.controller import read_view
from autoscaler.live.kube.actuator import ActuationReport, ActuatorConfig, KubeActuator
from autoscaler.live.kube.informer import Informer
from autoscaler.live.kube.mig_gate import OWNER_LABEL, MigGate, NodeRead, Op, Phase, Relayout, decide
from autoscaler.live.kube.objects import (
    MIG_CONFIG,
    MIG_CONFIG_STATE,
    POD_DELETION_COST,
    STATUS_ANNOTATION,
    ClusterView,
    ManagedModel,
    NodeInfo,
)
from autoscaler.live.kube.term import LeadershipLost, WriteGate
from autoscaler.live.kube.writes import scale_outcome, stable_text, status_change, status_payload
from sharing.catalog import load_catalog
from sharing.render import GPU_PRODUCT, mig_parted_config
from sharing.slots import Inventory

pytest_plugins = ("realparts.kube",)

aio = pytest.mark.asyncio
MERGE = "application/merge-patch+json"
H100 = "NVIDIA-H100-80GB-HBM3"
MIG_1G = "nvidia.com/mig-1g.10gb"
T0 = 1_700_000_000.0


# -- pure rules ---------------------------------------------------------------------------------------------------


def _status(desired: int = 3, rps: float = 30.0, latency: float = 180.0, reason: Reason = Reason.FORECAST,
            current: int = 3) -> UpdateStatus:
    return UpdateStatus("ns/m", desired, current, reason, forecast_rps=rps,
                        message=f"q0.95 forecast {rps:.2f}, observed {rps * 0.97:.2f} req/s (0.00 short): {desired}",
                        predicted_latency_ms=latency, slo_latency_ms=250.0)


def _json(a: UpdateStatus, now: float) -> str:
    return json.dumps(status_payload(a, dry_run=False, now=now))


def test_stable_text_takes_the_numbers_out() -> None:
    assert stable_text("q0.95 forecast 12.31, observed 11.80 req/s (0.51 short): 3") == \
        stable_text("q0.95 forecast 12.87, observed 12.02 req/s (0.85 short): 4")
    assert stable_text("desired 3 replica(s): forecast") != stable_text("desired 3 replica(s): panic")


def test_status_change_material_noise_and_refresh() -> None:
    old = _json(_status(), T0)

    def change(a: UpdateStatus, now: float = T0 + 10) -> str | None:
        return status_change(old, status_payload(a, dry_run=False, now=now), now=now, refresh_s=300.0, ratio=0.2)

    assert change(_status()) is None  # the same words and numbers: never rewritten
    assert change(_status(rps=31.5, latency=185.0)) is None  # noise, recent: not now
    assert change(_status(rps=31.5), now=T0 + 301) == "refresh"  # noise, old: at most every refresh_s
    assert change(_status(desired=4)) == "desired"
    assert change(_status(current=2)) == "current"
    assert change(_status(reason=Reason.PANIC)) == "reason"
    assert change(_status(rps=45.0)) == "forecastRps"  # a forecast moved by half: material
    assert change(_status(latency=260.0)) == "predictedLatencyMs"
    assert status_change(None, status_payload(_status(), dry_run=False, now=T0), now=T0, refresh_s=300.0,
                         ratio=0.2) == "new"
    assert status_change(old, status_payload(_status(), dry_run=True, now=T0), now=T0, refresh_s=300.0,
                         ratio=0.2) == "dryRun"


@given(st.floats(0.1, 1e4), st.floats(-0.19, 0.19), st.floats(0.0, 299.0))
def test_noise_within_the_ratio_is_never_written_before_the_refresh(rps: float, noise: float, after: float) -> None:
    old = _json(_status(rps=rps, latency=100.0), T0)
    new = status_payload(_status(rps=rps * (1 + noise), latency=100.0 * (1 + noise)), dry_run=False, now=T0 + after)
    assert status_change(old, new, now=T0 + after, refresh_s=300.0, ratio=0.2) is None


@given(st.integers(0, 50), st.integers(0, 50), st.integers(0, 50), st.booleans())
def test_a_scale_write_never_lowers_the_live_value_unless_planned_from_it(live: int, target: int,
                                                                         planned_from: int, decrease: bool) -> None:
    outcome = scale_outcome(live, target, planned_from, decrease=decrease)
    if outcome == "write" and target < live:
        # a decrease only from the count the rails decided on, and only when the plan was one
        assert planned_from == live and decrease
    assert (outcome == "unchanged") == (target == live)
    assert outcome != "stale-view" or (target < live and (live != planned_from or not decrease))


def test_an_adopted_relayout_never_uncordons_a_node_the_mig_manager_is_repartitioning() -> None:
    """Adopted from a cache that had not seen the earlier leader's relabel (phase UNCORDON: "nothing changed yet"),
    but the node as just read names our config with the MIG manager still at work: wait for it, as after a relabel;
    uncordon once it reports success (found in review)."""
    job = Relayout("n1", "cfg-b", {}, {}, phase=Phase.UNCORDON, we_cordoned=True, owner="cfg-b", recovered=True)
    labels = {OWNER_LABEL: "cfg-b", MIG_CONFIG: "cfg-b"}
    pending = NodeRead("n1", {**labels, MIG_CONFIG_STATE: "pending"}, True)
    assert decide(job, pending, {}, 0.0, 600.0).op is Op.WAIT
    assert decide(job, NodeRead("n1", {**labels, MIG_CONFIG_STATE: "failed"}, True), {}, 0.0, 600.0).op is Op.FAIL
    assert decide(job, NodeRead("n1", {**labels, MIG_CONFIG_STATE: "success"}, True), {}, 0.0, 600.0).op is Op.UNCORDON
    untouched = NodeRead("n1", {OWNER_LABEL: "cfg-b", MIG_CONFIG: "cfg-a", MIG_CONFIG_STATE: "success"}, True)
    assert decide(job, untouched, {}, 0.0, 600.0).op is Op.UNCORDON  # nothing was relabelled: undo the cordon


def test_mig_gate_new_term_forgets_the_old_terms_relayouts() -> None:
    gate = MigGate()
    gate.jobs["n1"] = Relayout("n1", "cfg-b", {}, {}, phase=Phase.WAIT_FREE, we_cordoned=True, owner="cfg-b")
    gate.finished["n2"] = Relayout("n2", "cfg-c", {}, {}, phase=Phase.FAILED)
    gate.new_term()
    assert gate.jobs == {} and gate.finished == {}
    # the next tick adopts what the labels say, as after a restart
    nodes = {"n1": NodeInfo("n1", {OWNER_LABEL: "cfg-x", MIG_CONFIG: "cfg-a"}, True)}
    gate.recover(ClusterView(ClusterSnapshot(0.0, {}, Inventory.from_nodes([])), {}, nodes), 0.0)
    assert {n: (j.config_name, j.phase, j.recovered) for n, j in gate.jobs.items()} == {
        "n1": ("cfg-x", Phase.UNCORDON, True)}


# -- the real apiserver, through the fault proxy --------------------------------------------------------------------


@pytest_asyncio.fixture
async def proxy(kube_apiserver: Any) -> AsyncIterator[FaultProxy]:
    async with FaultProxy(kube_apiserver.url, ca_file=kube_apiserver.ca_file) as p:
        yield p


@pytest_asyncio.fixture
async def proxied(proxy: FaultProxy, kube_apiserver: Any) -> AsyncIterator[ApiClient]:
    async with ApiClient(proxy.client_configuration(kube_apiserver.token)) as api:
        yield api


@pytest_asyncio.fixture
async def ns(api: ApiClient) -> str:
    name = f"slotwise-safe-{uuid.uuid4().hex[:8]}"
    core = client.CoreV1Api(api)
    await core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    await core.create_namespaced_service_account(name, {"metadata": {"name": "default"}})
    return name


_NODES: list[str] = []


@pytest_asyncio.fixture(autouse=True)
async def _delete_nodes(kube_apiserver: Any) -> AsyncIterator[None]:
    yield
    if _NODES:
        async with kube_apiserver.api_client() as api:
            for name in _NODES:
                with contextlib.suppress(client.ApiException):
                    await client.CoreV1Api(api).delete_node(name)
        _NODES.clear()


def writes(proxy: FaultProxy, since: int = 0) -> list[tuple[str, str]]:
    """(method, path) of every request that would change the cluster, from request ``since`` on."""
    return [(r.method, r.path) for r in proxy.requests[since:] if r.method not in ("GET", "HEAD", "OPTIONS")]


async def make_model(api: ApiClient, ns: str, name: str, replicas: int = 1) -> ManagedModel:
    labels = {"app": name}
    resources = {"limits": {"nvidia.com/gpu": "1"}}
    dep = await client.AppsV1Api(api).create_namespaced_deployment(ns, {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "labels": labels, "annotations": {"slotwise.io/slo-latency-ms": "250"}},
        "spec": {"replicas": replicas, "selector": {"matchLabels": labels},
                 "template": {"metadata": {"labels": labels},
                              "spec": {"containers": [{"name": "server", "image": "registry.invalid/vllm:test",
                                                       "resources": resources}]}}},
    })
    return ManagedModel(key=f"{ns}/{name}", namespace=ns, name=name, uid=dep.metadata.uid, replicas=replicas,
                        container="server", resources=resources)


async def make_pod(api: ApiClient, ns: str, name: str, labels: dict[str, str], node: str = "node-x",
                   resource: str = "nvidia.com/gpu") -> None:
    await client.CoreV1Api(api).create_namespaced_pod(ns, {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels},
        "spec": {"nodeName": node, "automountServiceAccountToken": False,
                 "containers": [{"name": "server", "image": "registry.invalid/vllm:test",
                                 "resources": {"limits": {resource: "1"}}}]},
    })


async def make_node(api: ApiClient, labels: dict[str, str], unschedulable: bool = False) -> str:
    name = f"gpu-{uuid.uuid4().hex[:6]}"
    _NODES.append(name)
    labels = {GPU_PRODUCT: H100, "nvidia.com/mig.capable": "true", "nvidia.com/mig.strategy": "mixed", **labels}
    await client.CoreV1Api(api).create_node({"apiVersion": "v1", "kind": "Node",
                                             "metadata": {"name": name, "labels": labels},
                                             "spec": {"unschedulable": unschedulable}})
    return name


async def node_info(api: ApiClient, name: str) -> NodeInfo:
    node = await client.CoreV1Api(api).read_node(name)
    return NodeInfo(name, dict(node.metadata.labels or {}), bool(node.spec.unschedulable), {})


def layout(node: str, name: str) -> SetMigLayout:
    gpu = load_catalog().get(H100)
    config = mig_parted_config(name, gpu, {0: [("3g.40gb", 0), ("3g.40gb", 4)]}, device_filter=gpu.pci_ids[0])
    return SetMigLayout(node, name, config, {0: (("3g.40gb", 0), ("3g.40gb", 4))}, (0,), {})


def closing_gate(allowed: int) -> tuple[WriteGate, list[str]]:
    """A gate that lets ``allowed`` writes through, then closes (the Lease lost mid-tick); the checks it saw."""
    checks: list[str] = []

    def leading() -> bool:
        checks.append("check")
        return len(checks) <= allowed

    return WriteGate(leading=leading), checks


async def scale_of(api: ApiClient, m: ManagedModel) -> int:
    return (await client.AppsV1Api(api).read_namespaced_deployment_scale(m.name, m.namespace)).spec.replicas


# -- failure mode 2: the write gate ---------------------------------------------------------------------------------


@aio
async def test_no_write_after_the_gate_closes(api: ApiClient, proxied: ApiClient, proxy: FaultProxy,
                                              ns: str) -> None:
    """Leadership ends after the 2nd write of a tick: the 3rd is not made, nor anything after it, and the tick
    ends with LeadershipLost (not an action error the loop would step over)."""
    ms = [await make_model(api, ns, f"llm-{i}", replicas=1) for i in range(4)]
    plan = Plan(0.0, [ScaleModel(m.key, 2, 1, Reason.FORECAST) for m in ms]
                + [UpdateStatus(m.key, 2, 1, Reason.FORECAST) for m in ms]
                + [Shortfall(m.key, 1, "no free GPU slot fits the replica") for m in ms])
    act = KubeActuator(proxied, ActuatorConfig(), clock=lambda: T0)
    gate, _ = closing_gate(allowed=2)
    mark = len(proxy.requests)
    with pytest.raises(LeadershipLost):
        await act.apply(plan, view_of(ms), gate=gate)
    assert len(writes(proxy, mark)) == 2, writes(proxy, mark)
    assert [await scale_of(api, m) for m in ms] == [2, 2, 1, 1]
    # nothing more comes from this actuator while the gate stays closed, whatever the plan
    mark = len(proxy.requests)
    with pytest.raises(LeadershipLost):
        await act.apply(plan, view_of(ms), gate=closing_gate(allowed=0)[0])
    assert writes(proxy, mark) == []


@aio
async def test_the_gate_is_checked_before_every_kind_of_write(api: ApiClient, proxied: ApiClient, proxy: FaultProxy,
                                                             ns: str) -> None:
    """Every write of a rich tick (ConfigMap, template, pod-deletion-cost, scale, Events, status, the MIG gate's
    cordon) passes a gate check first: with N allowed, exactly N requests change the cluster, for every N."""
    ms = [await make_model(api, ns, f"llm-k{i}", replicas=2) for i in range(2)]
    for m in ms:
        await make_pod(api, ns, f"{m.name}-0", {"app": m.name})
    node = await make_node(api, {MIG_CONFIG: "all-1g.10gb", MIG_CONFIG_STATE: "success"})

    def plan(i: int) -> Plan:
        return Plan(0.0, [SetTimeSlicing({"nvidia.com/gpu": 2 + i}), layout(node, f"cfg-{i}")]
                    + [a for m in ms for a in (
                        SetSlotTemplate(m.key, {"limits": {MIG_1G: str(1 + i)}}, {}),
                        RemoveReplica(m.key, f"{ns}/{m.name}-0"),
                        ScaleModel(m.key, 1, 2, Reason.FORECAST),
                        Shortfall(m.key, 1 + i, "no free GPU slot fits the replica"),
                        UpdateStatus(m.key, 1, 2, Reason.FORECAST, forecast_rps=float(i)))])

    for allowed in (0, 1, 3, 5, 8):
        for m in ms:  # back to the start: two replicas, no deletion cost
            await client.AppsV1Api(api).patch_namespaced_deployment_scale(m.name, ns, {"spec": {"replicas": 2}},
                                                                           _content_type=MERGE)
        act = KubeActuator(proxied, ActuatorConfig(mig_relayout=True, time_slicing_configmap=f"{ns}/ts-{allowed}",
                                                   mig_parted_configmap=f"{ns}/mig"), clock=lambda: T0)
        gate, checks = closing_gate(allowed)
        mark = len(proxy.requests)
        with pytest.raises(LeadershipLost):
            await act.apply(plan(allowed), view_of(ms, {node: await node_info(api, node)}), gate=gate)
        assert len(writes(proxy, mark)) == allowed, (allowed, writes(proxy, mark))
        assert len(checks) == allowed + 1  # the refused check was the last thing it did


@aio
async def test_retry_after_of_a_429_is_waited_for(api: ApiClient, kube_apiserver: Any, ns: str) -> None:
    """The server throttles the scale write (429, ``Retry-After: 1``): the actuator waits that long and writes
    again, instead of failing the action (and, with it, the tick's scale-up)."""

    class Throttling(FaultProxy):
        def _answer(self, seen: Any, status: int, body: Any, *, content_type: str | None = None,
                    newline: bool = False) -> Any:
            response = super()._answer(seen, status, body, content_type=content_type, newline=newline)
            if status == 429:
                response.headers["Retry-After"] = "1"
            return response

    m = await make_model(api, ns, "llm-429", replicas=1)
    async with Throttling(kube_apiserver.url, ca_file=kube_apiserver.ca_file) as proxy, \
            ApiClient(proxy.client_configuration(kube_apiserver.token)) as proxied:
        act = KubeActuator(proxied, ActuatorConfig())  # Retry-After up to retry_after_max_s (2 s) is waited
        loop = asyncio.get_running_loop()
        times: list[float] = []

        async def throttle_the_write(what: str, key: str) -> None:
            times.append(loop.time())
            if len(times) == 1:
                proxy.fail_next(1, status=429)  # the write right after this read

        act.before_write = throttle_the_write
        r = await act.apply(Plan(0.0, [ScaleModel(m.key, 3, 1, Reason.PANIC)]), view_of([m]))
        assert not r.errors, r.errors
        assert r.applied == [f"scale {m.key}: 1 -> 3 (panic)"]
        assert [s.status for s in proxy.requests if s.method == "PUT"] == [429, 200]
        assert times[1] - times[0] >= 1.0  # the server's Retry-After was honoured
        # an Event too (its first request is the write itself)
        proxy.fail_next(1, status=429)
        r = await act.apply(Plan(0.0, [Shortfall(m.key, 1, "no free GPU slot fits the replica")]), view_of([m]))
        assert not r.errors and r.events == 1, r.errors
        assert [s.status for s in proxy.requests if s.method == "POST"] == [429, 201]
    assert await scale_of(api, m) == 3


# -- failure mode 3: a stale cache ---------------------------------------------------------------------------------


async def eventually(predicate: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    async def wait() -> None:
        while not predicate():
            await asyncio.sleep(0.02)

    try:
        await asyncio.wait_for(wait(), timeout)
    except TimeoutError:
        raise AssertionError(f"timed out waiting for {what}") from None


@aio
async def test_a_frozen_cache_never_turns_a_scale_up_into_a_scale_down(api: ApiClient, proxied: ApiClient,
                                                                       proxy: FaultProxy, ns: str) -> None:
    """Watches held; another client scales the Deployment 1 -> 6. The cache still says 1 (and synced), the plan
    made from it is 1 -> 3 -- written, it would halve the fleet past every scale-down rail. The actuator sees the
    Scale it reads is not what the plan started from and does not lower it."""
    m = await make_model(api, ns, "llm-stale", replicas=1)
    await make_pod(api, ns, "llm-stale-0", {"app": "llm-stale"})
    informers = [Informer(proxied, f"/apis/apps/v1/namespaces/{ns}/deployments", name="deployments"),
                 Informer(proxied, f"/api/v1/namespaces/{ns}/pods", name="pods"),
                 Informer(proxied, "/api/v1/nodes", name="nodes")]
    tasks = [asyncio.create_task(i.run()) for i in informers]
    try:
        for inf in informers:
            assert await inf.wait_synced(10.0)
        # every watch open first: pause_watches cuts open watches, and one still being set up would slip through
        await eventually(lambda: proxy.open_watches == 3, "the informers' watches")
        proxy.pause_watches()
        await eventually(lambda: proxy.held_watches >= 3, "the informers to try to watch again")
        await client.AppsV1Api(api).patch_namespaced_deployment_scale(m.name, ns, {"spec": {"replicas": 6}},
                                                                       _content_type=MERGE)
        deployments, pods, nodes = informers
        view = read_view(deployments.items(), pods.items(), nodes.items(), now=T0)
        assert deployments.synced and view.models[m.key].replicas == 1  # the cache: frozen at 1
        current = view.snapshot.models[m.key].active_replicas
        assert current == 1
        plan = Plan(T0, [RemoveReplica(m.key, f"{ns}/llm-stale-0"), ScaleModel(m.key, 3, current, Reason.FORECAST)])
        r = await KubeActuator(proxied, ActuatorConfig()).apply(plan, view)
        assert await scale_of(api, m) == 6, "the live 6 replicas were lowered by a plan made from a stale 1"
        assert r.why(f"scale {m.key}") == ["stale-view"] and not r.errors
        pod = await client.CoreV1Api(api).read_namespaced_pod("llm-stale-0", ns)
        assert POD_DELETION_COST not in (pod.metadata.annotations or {})
        # a plan above the live value still goes through: it lowers nothing
        r = await KubeActuator(proxied, ActuatorConfig()).apply(
            Plan(T0, [ScaleModel(m.key, 8, current, Reason.PANIC)]), view)
        assert await scale_of(api, m) == 8 and r.applied == [f"scale {m.key}: 1 -> 8 (panic)"]
    finally:
        proxy.resume_watches()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


# -- failure modes 1 and 7: the MIG gate ---------------------------------------------------------------------------


@aio
async def test_a_relayout_from_an_earlier_term_never_relabels_a_node_someone_else_owns(api: ApiClient,
                                                                                       ns: str) -> None:
    """Replica A cordons a node for cfg-b and waits for a pod to leave; it loses the Lease. Replica B, leading,
    adopts the half-done relayout (uncordons) and starts its own to cfg-c. A leads again with its old job in
    memory and the node now free: it must not relabel (or uncordon) a node that says it is B's."""
    core = client.CoreV1Api(api)
    node = await make_node(api, {MIG_CONFIG: "all-1g.10gb", MIG_CONFIG_STATE: "success"})
    await make_pod(api, ns, "busy", {}, node=node, resource=MIG_1G)
    config = ActuatorConfig(mig_relayout=True, mig_parted_configmap=f"{ns}/mig-parted")
    a = KubeActuator(api, config, clock=lambda: T0)
    busy = NodeInfo(node, {}, False, {MIG_1G: 1})

    async def tick(act: KubeActuator, action: SetMigLayout, pods: dict[str, int]) -> ActuationReport:
        info = await node_info(api, node)
        info = NodeInfo(node, info.labels, info.unschedulable, pods)
        return await act.apply(Plan(T0, [action]), view_of([], {node: info}))

    await tick(a, layout(node, "cfg-b"), busy.gpu_pods)  # A: cordon
    await tick(a, layout(node, "cfg-b"), busy.gpu_pods)  # A: waits for the pod
    assert (await core.read_node(node)).metadata.labels[OWNER_LABEL] == "cfg-b"

    b = KubeActuator(api, config, clock=lambda: T0 + 30)
    await tick(b, layout(node, "cfg-c"), busy.gpu_pods)  # B adopts A's cordon and rolls it back
    assert not (await core.read_node(node)).spec.unschedulable
    await tick(b, layout(node, "cfg-c"), busy.gpu_pods)  # B: its own cordon
    assert (await core.read_node(node)).metadata.labels[OWNER_LABEL] == "cfg-c"

    await core.delete_namespaced_pod("busy", ns, grace_period_seconds=0)
    r = await tick(a, layout(node, "cfg-b"), {})  # A again, its old job in memory, the node free
    n = await core.read_node(node)
    assert n.metadata.labels[MIG_CONFIG] == "all-1g.10gb", f"relabeled by a stale job: {r.applied}"
    assert n.spec.unschedulable and n.metadata.labels[OWNER_LABEL] == "cfg-c"  # B's cordon left alone
    assert not any(line.endswith(("relabel", "uncordon")) or "relabel" in line for line in r.applied), r.applied


@aio
async def test_a_retargeted_relayout_is_adopted_as_the_config_it_applied(api: ApiClient, ns: str) -> None:
    """A relayout retargeted while it waited (cfg-b -> cfg-c), then relabeled to cfg-c; the process ends (or loses
    the Lease). Whoever adopts the node must wait for the MIG manager's answer about cfg-c, not uncordon a node
    whose GPUs are being re-partitioned (the owner label still named cfg-b)."""
    core = client.CoreV1Api(api)
    node = await make_node(api, {MIG_CONFIG: "all-1g.10gb", MIG_CONFIG_STATE: "success"})
    config = ActuatorConfig(mig_relayout=True, mig_parted_configmap=f"{ns}/mig-parted")
    act = KubeActuator(api, config, clock=lambda: T0)

    async def tick(a: KubeActuator, action: SetMigLayout | None, pods: dict[str, int]) -> ActuationReport:
        info = await node_info(api, node)
        view = view_of([], {node: NodeInfo(node, info.labels, info.unschedulable, pods)})
        return await a.apply(Plan(T0, [action] if action else []), view)

    await tick(act, layout(node, "cfg-b"), {MIG_1G: 1})  # cordon for cfg-b; a pod still there
    r = await tick(act, layout(node, "cfg-c"), {MIG_1G: 1})  # the plan changed its mind: retarget
    assert any("retargeted" in line for line in r.applied), r.applied
    r = await tick(act, layout(node, "cfg-c"), {})  # free: relabel to cfg-c
    assert f"mig-layout {node}: relabel {MIG_CONFIG}=cfg-c" in r.applied
    restarted = KubeActuator(api, config, clock=lambda: T0 + 60)
    r = await tick(restarted, None, {})
    n = await core.read_node(node)
    assert n.spec.unschedulable, "uncordoned while the MIG manager re-partitions the GPUs"
    assert restarted.gate.jobs[node].phase is Phase.WAIT_SUCCESS and not r.errors
    await core.patch_node(node, {"metadata": {"labels": {MIG_CONFIG_STATE: "success"}}}, _content_type=MERGE)
    await tick(restarted, None, {})
    n = await core.read_node(node)
    assert not n.spec.unschedulable and OWNER_LABEL not in n.metadata.labels


@aio
async def test_a_new_term_adopts_what_the_node_says(api: ApiClient, ns: str) -> None:
    """After ``new_term`` the actuator acts on the node's labels, not its memory: a relayout it started before is
    forgotten and the node's own state (relabeled, waiting for the MIG manager) is adopted and finished."""
    core = client.CoreV1Api(api)
    node = await make_node(api, {MIG_CONFIG: "all-1g.10gb", MIG_CONFIG_STATE: "success"})
    act = KubeActuator(api, ActuatorConfig(mig_relayout=True, mig_parted_configmap=f"{ns}/mig-parted"),
                       clock=lambda: T0)
    pods = {MIG_1G: 1}
    info = await node_info(api, node)
    await act.apply(Plan(T0, [layout(node, "cfg-b")]), view_of([], {node: NodeInfo(node, info.labels, False, pods)}))
    assert act.gate.in_flight == [node]
    # meanwhile (another leader's term) the node went through a relayout to cfg-c that is waiting for success
    await core.patch_node(node, {"metadata": {"labels": {OWNER_LABEL: "cfg-c", MIG_CONFIG: "cfg-c",
                                                         MIG_CONFIG_STATE: "success"}}}, _content_type=MERGE)
    act.new_term()
    assert act.gate.jobs == {}
    r = await act.apply(Plan(T0, []), view_of([], {node: await node_info(api, node)}))
    assert not r.errors, r.errors
    n = await core.read_node(node)
    assert not n.spec.unschedulable and OWNER_LABEL not in n.metadata.labels
    assert n.metadata.labels[MIG_CONFIG] == "cfg-c"


@aio
async def test_switched_off_an_adopted_relayout_is_finished(api: ApiClient, proxied: ApiClient, proxy: FaultProxy,
                                                            ns: str) -> None:
    """MIG re-layout off, a node left cordoned by a relayout waiting for the MIG manager: once the manager says
    success the node is uncordoned (finished); the only writes are the node patch and its Event, so the chart
    must keep nodes get/patch and events create/patch with re-layout off."""
    core = client.CoreV1Api(api)
    node = await make_node(api, {MIG_CONFIG: "cfg-b", MIG_CONFIG_STATE: "pending", OWNER_LABEL: "cfg-b"},
                           unschedulable=True)
    act = KubeActuator(proxied, ActuatorConfig(mig_relayout=False, mig_parted_configmap=f"{ns}/mig-parted"),
                       clock=lambda: T0)
    r = await act.apply(Plan(T0, [layout(node, "cfg-z")]), view_of([], {node: await node_info(api, node)}))
    assert r.why(f"mig-layout {node}") == ["gate-disabled"] and (await core.read_node(node)).spec.unschedulable
    await core.patch_node(node, {"metadata": {"labels": {MIG_CONFIG_STATE: "success"}}}, _content_type=MERGE)
    mark = len(proxy.requests)
    r = await act.apply(Plan(T0 + 10, []), view_of([], {node: await node_info(api, node)}))
    assert not r.errors, r.errors
    n = await core.read_node(node)
    assert not n.spec.unschedulable and OWNER_LABEL not in n.metadata.labels
    kinds = sorted({(method, "events" if "/events" in path else path) for method, path in writes(proxy, mark)})
    assert kinds == [("PATCH", f"/api/v1/nodes/{node}"), ("POST", "events")], writes(proxy, mark)


# -- security: dry run is read-only ---------------------------------------------------------------------------------


def _rich_plan(m: ManagedModel, ns: str, node: str) -> Plan:
    return Plan(0.0, [
        SetTimeSlicing({"nvidia.com/gpu": 4}),
        layout(node, "cfg-b"),
        SetSlotTemplate(m.key, {"limits": {MIG_1G: "1"}}, {}),
        RemoveReplica(m.key, f"{ns}/{m.name}-0", preempted_by=f"{ns}/other", message="preempted for other"),
        ScaleModel(m.key, 1, 2, Reason.PREEMPTED),
        Shortfall(m.key, 1, "no free GPU slot fits the replica"),
        UpdateStatus(m.key, 1, 2, Reason.PREEMPTED),
    ])


@aio
async def test_dry_run_makes_no_request_that_changes_anything(api: ApiClient, proxied: ApiClient,
                                                              proxy: FaultProxy, ns: str) -> None:
    m = await make_model(api, ns, "llm-dry", replicas=2)
    await make_pod(api, ns, "llm-dry-0", {"app": "llm-dry"})
    node = await make_node(api, {MIG_CONFIG: "cfg-a", MIG_CONFIG_STATE: "success"})
    leftover = await make_node(api, {MIG_CONFIG: "cfg-a", OWNER_LABEL: "cfg-b"}, unschedulable=True)
    act = KubeActuator(proxied, ActuatorConfig(dry_run=True, mig_relayout=True, time_slicing_configmap=f"{ns}/ts",
                                               mig_parted_configmap=f"{ns}/mig"))
    mark = len(proxy.requests)
    nodes = {n: await node_info(api, n) for n in (node, leftover)}
    r = await act.apply(_rich_plan(m, ns, node), view_of([m], nodes))
    assert not r.errors, r.errors
    assert writes(proxy, mark) == [], "a dry run wrote to the cluster"
    assert r.why(f"status {m.key}") == ["dry-run"] and r.events == 0


@aio
async def test_report_mode_writes_only_status_and_events(api: ApiClient, proxied: ApiClient, proxy: FaultProxy,
                                                         ns: str) -> None:
    m = await make_model(api, ns, "llm-rep", replicas=2)
    await make_pod(api, ns, "llm-rep-0", {"app": "llm-rep"})
    node = await make_node(api, {MIG_CONFIG: "cfg-a", MIG_CONFIG_STATE: "success"})
    act = KubeActuator(proxied, ActuatorConfig(report_only=True, mig_relayout=True,
                                               time_slicing_configmap=f"{ns}/ts", mig_parted_configmap=f"{ns}/mig"))
    mark = len(proxy.requests)
    r = await act.apply(_rich_plan(m, ns, node), view_of([m], {node: await node_info(api, node)}))
    assert not r.errors, r.errors
    kinds = sorted({(method, "events" if "/events" in path else path) for method, path in writes(proxy, mark)})
    assert kinds == [("PATCH", f"/apis/apps/v1/namespaces/{ns}/deployments/{m.name}"), ("POST", "events")]
    status = json.loads((await client.AppsV1Api(api).read_namespaced_deployment(m.name, ns))
                        .metadata.annotations[STATUS_ANNOTATION])
    assert status["dryRun"] is True and await scale_of(api, m) == 2
    assert r.why(f"scale {m.key}") == ["report-only"]


# -- failure mode 12: status and Event churn ------------------------------------------------------------------------


def noisy_decision(key: str, i: int, rng_values: list[float]) -> UpdateStatus:
    """The slotwise policy's status under a steady load with ~5% noise: the same replicas and reason, the
    forecast, the predicted latency and the numbers in the message moving every decision."""
    noise = rng_values[i % len(rng_values)]
    rps = 40.0 * (1 + noise)
    return UpdateStatus(key, 4, 4, Reason.FORECAST, forecast_rps=rps,
                        message=f"q0.95 forecast {rps:.2f}, observed {rps * 0.98:.2f} req/s "
                                f"({max(0.0, rps - 39.0):.2f} short): 4",
                        predicted_latency_ms=200.0 * (1 + noise / 2), slo_latency_ms=250.0)


@aio
async def test_steady_noisy_load_writes_status_and_events_rarely(api: ApiClient, proxied: ApiClient,
                                                                 proxy: FaultProxy, ns: str) -> None:
    """60 decisions in 10 minutes under steady noisy load (the issue's measurement: 60 status PATCHes and 60
    distinct Events): at most one write per status_refresh_s plus the first, and one Event."""
    ms = [await make_model(api, ns, f"llm-n{i}", replicas=4) for i in range(2)]
    now = [T0]
    act = KubeActuator(proxied, ActuatorConfig(), clock=lambda: now[0])
    noise = [0.05 * math.sin(1.7 * k) for k in range(97)]
    mark = len(proxy.requests)
    for i in range(60):
        now[0] = T0 + 10.0 * i
        r = await act.apply(Plan(now[0], [noisy_decision(m.key, i + 7 * j, noise) for j, m in enumerate(ms)]),
                            view_of(ms))
        assert not r.errors, r.errors
    done = writes(proxy, mark)
    for m in ms:
        status = [w for w in done if w == ("PATCH", f"/apis/apps/v1/namespaces/{ns}/deployments/{m.name}")]
        # the first, then at most one per 300 s of the 600 s: 3
        assert 1 <= len(status) <= 3, len(status)
    events = [w for w in done if "/events" in w[1]]
    assert len(events) == len(ms)  # one Event per model: the decision did not change
    assert len({e["message"] for e in await _events(api, ns)}) == len(ms)


@aio
async def test_a_lasting_shortfall_writes_its_event_rarely_and_a_new_cause_at_once(api: ApiClient,
                                                                                  proxied: ApiClient,
                                                                                  proxy: FaultProxy,
                                                                                  ns: str) -> None:
    """Issue 30: a model short of replicas for 10 minutes (60 decisions, the missing count moving 1..3) wrote an
    Event on every decision -- 60 writes (a new Event per count, bumped every tick). Now one Event, written on the
    first decision and bumped at most every status_refresh_s (its count carries the decisions between); a
    different cause is written on the decision that brings it, and so is the old one when it comes back."""
    m = await make_model(api, ns, "llm-short", replicas=2)
    now = [T0]
    act = KubeActuator(proxied, ActuatorConfig(), clock=lambda: now[0])
    unplaceable = "no free GPU slot fits the replica"

    async def decide(*shortfalls: Shortfall) -> list[tuple[str, str]]:
        mark = len(proxy.requests)
        r = await act.apply(Plan(now[0], list(shortfalls)), view_of([m]))
        assert not r.errors, r.errors
        return [w for w in writes(proxy, mark) if "/events" in w[1]]

    events = []
    for i in range(60):
        now[0] = T0 + 10.0 * i
        events += await decide(Shortfall(m.key, 1 + i % 3, unplaceable))
    assert 1 <= len(events) <= 3, events  # the first, then at most one per 300 s of the 600 s
    [event] = [e for e in await _events(api, ns) if e["involvedObject"]["name"] == m.name]
    assert event["reason"] == "Unplaceable" and 1 < event["count"] <= 60, event["count"]
    # another cause: its own Event at once; while both last, neither is written again before the refresh
    now[0] += 10
    borrowing = Shortfall(m.key, 2, "team at its borrowing limit", ShortfallCause.BORROWING_LIMIT)
    assert len(await decide(borrowing)) == 1
    now[0] += 10
    assert len(await decide(Shortfall(m.key, 1, unplaceable))) == 1  # came back after a decision without it
    now[0] += 10
    assert len(await decide(Shortfall(m.key, 1, unplaceable), borrowing)) == 1  # borrowing's back, the other lasts
    now[0] += 10
    assert await decide(Shortfall(m.key, 2, unplaceable), borrowing) == []
    assert sorted(e["reason"] for e in await _events(api, ns)) == ["BorrowingLimit", "Unplaceable"]


async def _events(api: ApiClient, ns: str) -> list[dict]:
    got = await client.CoreV1Api(api).list_namespaced_event(ns)
    return [api.sanitize_for_serialization(e) for e in got.items]


@aio
async def test_a_material_change_is_written_at_once(api: ApiClient, ns: str) -> None:
    """Bounded churn must not delay what matters: a new desired count is written (and told in an Event) on the
    decision that makes it; flapping between two counts aggregates into one Event object."""
    m = await make_model(api, ns, "llm-flap", replicas=3)
    now = [T0]
    act = KubeActuator(api, ActuatorConfig(), clock=lambda: now[0])
    for i, desired in enumerate([3, 4, 3, 4]):
        now[0] = T0 + 10.0 * i
        r = await act.apply(Plan(now[0], [UpdateStatus(m.key, desired, 3, Reason.FORECAST, forecast_rps=30.0 + i,
                                                       message=f"q0.95 forecast {30.0 + i:.2f}: {desired}")]),
                            view_of([m]))
        assert r.applied == [line for line in r.applied if line.startswith("status")] and len(r.applied) == 1
        status = json.loads((await client.AppsV1Api(api).read_namespaced_deployment(m.name, ns))
                            .metadata.annotations[STATUS_ANNOTATION])
        assert status["desired"] == desired
    [event] = [e for e in await _events(api, ns) if e["involvedObject"]["name"] == m.name]
    assert event["count"] == 4 and event["message"].startswith("desired 4 replica(s)")
