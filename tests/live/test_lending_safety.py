"""Issue 16, the lending actuator's failure modes, against a REAL kube-apiserver 1.20.2 + etcd (``realparts.kube``;
the fault proxy where a fault is injected), plus the pure rules they rest on.

- **write gate** (mode 2): no lending write once the gate closes, mid-tick too; ``LeadershipLost`` reaches the
  caller (never swallowed as an action's error);
- **state from an earlier term** (mode 1): a replica that started a reclaim, lost the Lease and regained it after
  the other replica finished that reclaim and lent the node AGAIN, evicts nothing there: the eviction re-reads the
  node first; ``new_term()`` forgets the old term's reclaims and adopts what the cluster says is in flight;
- **lending switched off** (mode 7): a fresh controller with lending off and a node still lent (label, taint,
  training on it) reclaims it: unlabelled, the training evicted, the taint lifted;
- **Kueue** (mode 8): the version the server prefers (v1beta2) is found by discovery and spoken; the Workloads a
  reclaim deactivated carry slotwise's mark (a new term adopts the reclaim from it), and only those are
  reactivated once capacity is lent again and their reclaim is over;
- **a PodDisruptionBudget blocking a reclaim** (mode 10): the refusal is told from plain throttling (429 without a
  budget, through the fault proxy, waits for its ``Retry-After``); a reclaim past its deadline raises a Warning
  Event once and the in-flight age gauge the alert reads; the opt-in force deletes the protected pod only past
  deadline + ``force_after_s``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import uuid
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import pytest
import pytest_asyncio
from aiohttp import web
from kubernetes_asyncio import client
from kubernetes_asyncio.client.rest import ApiException
from realparts.faultproxy import FaultProxy, SeenRequest
from realparts.kueue import kueue_installed

from autoscaler.api.plan import LendGpus, ReclaimGpus
from autoscaler.live.exporter import ControllerMetrics
from autoscaler.live.kube.lending import LendingActuator, discover_kueue_version, kueue_workloads_path
from autoscaler.live.kube.lending_rules import (
    DEACTIVATED_FOR_ANNOTATION,
    DEACTIVATED_LABEL,
    ORIGINAL_LIMIT_ANNOTATION,
    eviction_refusal,
    kueue_version,
    lent_node_patch,
    retry_after_s,
)
from autoscaler.live.kube.objects import (
    LENT_LABEL,
    LENT_SINCE_ANNOTATION,
    LENT_TAINT_KEY,
    PREEMPTIBLE_LABEL,
    ClusterView,
)
from autoscaler.live.kube.term import LeadershipLost, WriteGate
from autoscaler.live.kube.translate import build_view
from sharing.lending import LendingPolicy

if TYPE_CHECKING:
    from realparts.kube import KubeApiserver

pytest_plugins = ("realparts.kube",)

aio = pytest.mark.asyncio
MERGE = "application/merge-patch+json"
H100 = "NVIDIA-H100-80GB-HBM3"
PRE = {PREEMPTIBLE_LABEL: "true"}
T0 = 1_714_564_800.0  # 2024-05-01T12:00:00Z
PDB_REFUSAL = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 429, "reason": "TooManyRequests",
               "message": "Cannot evict pod as it would violate the pod's disruption budget.",
               "details": {"causes": [{"reason": "DisruptionBudget",
                                       "message": "The disruption budget guard needs 1 healthy pods, has 1"}]}}
THROTTLED = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 429, "reason": "TooManyRequests",
             "message": "Too many requests, please try again later.", "details": {"retryAfterSeconds": 7}}


# -- pure -------------------------------------------------------------------------------------------------------------


def test_a_disruption_budget_refusal_is_told_from_throttling_and_retry_after_is_read() -> None:
    assert eviction_refusal(json.dumps(PDB_REFUSAL)) == "disruption-budget"
    assert eviction_refusal({"message": "Cannot evict pod as it would violate the pod's disruption budget."}) \
        == "disruption-budget"  # a server without the cause: the message says it
    assert eviction_refusal(json.dumps(THROTTLED)) == "too-many-requests"
    assert eviction_refusal(None) == eviction_refusal(b"not json") == "too-many-requests"
    assert retry_after_s({"Retry-After": "7"}) == 7.0
    assert retry_after_s({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}, json.dumps(THROTTLED)) == 7.0
    assert retry_after_s({}, json.dumps(PDB_REFUSAL)) is None
    assert retry_after_s({"Retry-After": "-3"}) is None


def test_kueue_version_prefers_v1beta2() -> None:
    assert kueue_version(["v1beta1", "v1beta2"]) == "v1beta2"
    assert kueue_version(["v1beta1"]) == "v1beta1"
    assert kueue_version(["v1alpha1"]) is None and kueue_version([]) is None


# -- the real apiserver: helpers --------------------------------------------------------------------------------------


class Clock:
    def __init__(self, t: float = T0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


@pytest_asyncio.fixture
async def nodes(api: client.ApiClient) -> AsyncIterator[list[str]]:
    """Node names a test made; deleted afterwards (nodes are cluster-wide: other tests must not see ours)."""
    made: list[str] = []
    yield made
    for name in made:
        with contextlib.suppress(ApiException):
            await client.CoreV1Api(api).delete_node(name)


@pytest_asyncio.fixture
async def ns(api: client.ApiClient) -> AsyncIterator[str]:
    """A namespace of the test's own; its pods deleted afterwards (no namespace controller runs to do it, and
    other tests' views list the pods of every namespace)."""
    name = f"lend-safe-{uuid.uuid4().hex[:8]}"
    core = client.CoreV1Api(api)
    await core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    await core.create_namespaced_service_account(name, {"metadata": {"name": "default"}})
    yield name
    for pod in (await core.list_namespaced_pod(name)).items:
        with contextlib.suppress(ApiException):
            await core.delete_namespaced_pod(pod.metadata.name, name, grace_period_seconds=0)


async def make_node(api: client.ApiClient, made: list[str], name: str, gpus: int = 1) -> str:
    core = client.CoreV1Api(api)
    made.append(name)
    labels = {"nvidia.com/gpu.product": H100, "nvidia.com/gpu.count": str(gpus)}
    await core.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}})
    cap = {"nvidia.com/gpu": str(gpus), "cpu": "64", "memory": "512Gi", "pods": "110"}
    await core.patch_node_status(name, {"status": {"capacity": cap, "allocatable": cap}}, _content_type=MERGE)
    return name


async def make_pod(api: client.ApiClient, ns: str, name: str, node: str, *, labels: dict | None = None,
                   grace: int = 30, gpus: int = 1, owner: dict | None = None) -> None:
    meta: dict[str, Any] = {"name": name, "labels": labels or {}}
    if owner:
        meta["ownerReferences"] = [owner]
    core = client.CoreV1Api(api)
    await core.create_namespaced_pod(ns, {
        "apiVersion": "v1", "kind": "Pod", "metadata": meta,
        "spec": {"nodeName": node, "automountServiceAccountToken": False, "terminationGracePeriodSeconds": grace,
                 "tolerations": [{"key": LENT_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}],
                 "containers": [{"name": "c", "image": "registry.invalid/train:test",
                                 "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]}})
    # the kubelet's part: Running (a Pending pod may be evicted whatever its PodDisruptionBudget says)
    await core.patch_namespaced_pod_status(name, ns, {"status": {"phase": "Running"}}, _content_type=MERGE)


async def live_view(api: client.ApiClient, made: list[str], now: float, lending: LendingPolicy | None = None,
                    training: list[dict] | None = None) -> ClusterView:
    """What the informers would hand build_view: the server's lists, as plain dicts (this test's nodes only)."""
    core, s = client.CoreV1Api(api), api.sanitize_for_serialization
    listed = [n for n in s(await core.list_node())["items"] if n["metadata"]["name"] in made]
    pods = s(await core.list_pod_for_all_namespaces())["items"]
    return build_view([], pods, listed, training or [], now=now, lending=lending)


async def read_node(api: client.ApiClient, name: str) -> dict:
    return api.sanitize_for_serialization(await client.CoreV1Api(api).read_node(name))


async def read_pod(api: client.ApiClient, ns: str, name: str) -> dict | None:
    try:
        return api.sanitize_for_serialization(await client.CoreV1Api(api).read_namespaced_pod(name, ns))
    except ApiException as e:
        if e.status == 404:
            return None
        raise


def lent_state(node: dict) -> tuple[bool, bool]:
    """(label, taint)."""
    taints = (node.get("spec") or {}).get("taints") or []
    return ((node["metadata"].get("labels") or {}).get(LENT_LABEL) == "true",
            any(t["key"] == LENT_TAINT_KEY for t in taints))


class Gate:
    """A WriteGate whose leadership the test switches; counts the checks that passed."""

    def __init__(self, open_for: int | None = None) -> None:
        self.open_for = open_for  # checks allowed before leadership is lost (None: leading throughout)
        self.passed = 0

    def leading(self) -> bool:
        return self.open_for is None or self.passed < self.open_for

    def gate(self) -> WriteGate:
        outer = self

        class Counting(WriteGate):
            def check(self, what: str) -> None:
                super().check(what)
                outer.passed += 1

        return Counting(self.leading)


# -- mode 2: the write gate -------------------------------------------------------------------------------------------


@aio
async def test_no_lending_write_once_the_gate_closes_and_leadership_lost_reaches_the_caller(
        api: client.ApiClient, ns: str, nodes: list[str]) -> None:
    sfx = uuid.uuid4().hex[:6]
    n1 = await make_node(api, nodes, f"gate-{sfx}", 2)
    clock = Clock()
    act = LendingActuator(api, LendingPolicy(enabled=True, max_reclaim_s=30), clock=clock)
    closed = Gate(open_for=0)
    with pytest.raises(LeadershipLost):
        await act.apply([LendGpus(n1, (0, 1), "H100-80GB")], await live_view(api, nodes, clock()), gate=closed.gate())
    assert lent_state(await read_node(api, n1)) == (False, False), "a deposed leader lent a node"
    await act.apply([LendGpus(n1, (0, 1), "H100-80GB")], await live_view(api, nodes, clock()))
    for name in ("ta", "tb"):
        await make_pod(api, ns, name, n1, labels=PRE, grace=20)
    # leadership ends after the first write of the reclaim (the unlabel): no eviction follows
    mid = Gate(open_for=1)
    clock.t += 1
    with pytest.raises(LeadershipLost):
        await act.apply([ReclaimGpus(n1, (0, 1), (f"{ns}/ta", f"{ns}/tb"), "forecast", 30)],
                        await live_view(api, nodes, clock()), gate=mid.gate())
    assert mid.passed == 1 and lent_state(await read_node(api, n1)) == (False, True)
    for name in ("ta", "tb"):
        assert not (await read_pod(api, ns, name))["metadata"].get("deletionTimestamp"), f"{name} evicted"


# -- mode 1: state from an earlier term -------------------------------------------------------------------------------


async def _reclaim_then_the_other_replica_lends_again(api: client.ApiClient, ns: str, nodes: list[str],
                                                      clock: Clock) -> tuple[LendingActuator, str, str]:
    """Replica A lends a node and starts reclaiming it (the training pod evicted, still terminating); A loses the
    Lease; replica B adopts the reclaim, finishes it and lends the node again on purpose; new training lands.
    Returns (A, the node, a second node B left mid-reclaim)."""
    sfx = uuid.uuid4().hex[:6]
    node = await make_node(api, nodes, f"term-{sfx}")
    other = await make_node(api, nodes, f"term2-{sfx}")
    policy = LendingPolicy(enabled=True, max_reclaim_s=30)
    a = LendingActuator(api, policy, clock=clock)
    await a.apply([LendGpus(node, (0,), "H100-80GB")], await live_view(api, nodes, clock()))
    await make_pod(api, ns, "train-1", node, labels=PRE, grace=20)
    clock.t += 1
    r = await a.apply([ReclaimGpus(node, (0,), (f"{ns}/train-1",), "forecast", 30)],
                      await live_view(api, nodes, clock()))
    assert r.evicted == [f"{ns}/train-1"] and node in a.reclaims  # in flight: the pod is terminating
    # A loses the Lease. B (a fresh process) adopts the reclaim; the kubelet ends train-1; B releases the node ...
    b = LendingActuator(api, policy, clock=clock)
    clock.t += 5
    await b.apply([], await live_view(api, nodes, clock()))
    await client.CoreV1Api(api).delete_namespaced_pod("train-1", ns, grace_period_seconds=0)
    r = await b.apply([], await live_view(api, nodes, clock()))
    assert len(r.reclaims_done) == 1 and lent_state(await read_node(api, node)) == (False, False)
    # ... and lends it again, on purpose: new training runs there. B also lends the other node and starts reclaiming
    # it before losing the Lease in turn (its unlabel done, its pod terminating).
    clock.t += 60
    r = await b.apply([LendGpus(node, (0,), "H100-80GB"), LendGpus(other, (0,), "H100-80GB")],
                      await live_view(api, nodes, clock()))
    assert r.lends == 2 and lent_state(await read_node(api, node)) == (True, True)
    await make_pod(api, ns, "train-2", node, labels=PRE, grace=20)
    await make_pod(api, ns, "train-3", other, labels=PRE, grace=20)
    clock.t += 1
    r = await b.apply([ReclaimGpus(other, (0,), (f"{ns}/train-3",), "shortfall", 30)],
                      await live_view(api, nodes, clock()))
    assert r.evicted == [f"{ns}/train-3"]
    return a, node, other


@aio
async def test_a_regained_leader_does_not_evict_from_a_node_lent_again_meanwhile(api: client.ApiClient, ns: str,
                                                                                nodes: list[str]) -> None:
    clock = Clock()
    a, node, _ = await _reclaim_then_the_other_replica_lends_again(api, ns, nodes, clock)
    # A leads again and ticks with what it remembers (no new_term): the eviction re-reads the node first
    clock.t += 5
    r = await a.apply([], await live_view(api, nodes, clock()))
    pod = await read_pod(api, ns, "train-2")
    assert pod is not None and not pod["metadata"].get("deletionTimestamp"), \
        "the old term's reclaim evicted training from a node lent again on purpose"
    assert lent_state(await read_node(api, node)) == (True, True), "the lend of the other term was undone"
    assert not r.evicted and r.why(f"reclaim {node}") == ["lent-again"] and node not in a.reclaims


@aio
async def test_new_term_forgets_the_old_reclaims_and_adopts_what_the_cluster_says(api: client.ApiClient, ns: str,
                                                                                 nodes: list[str]) -> None:
    clock = Clock()
    a, node, other = await _reclaim_then_the_other_replica_lends_again(api, ns, nodes, clock)
    assert set(a.reclaims) == {node}
    a.new_term()  # the controller calls it when leadership is gained
    assert not a.reclaims
    clock.t += 5
    r = await a.apply([], await live_view(api, nodes, clock()))
    assert not r.errors, r.errors
    assert not (await read_pod(api, ns, "train-2"))["metadata"].get("deletionTimestamp")
    assert lent_state(await read_node(api, node)) == (True, True)
    # the other node's reclaim (B's, in flight) is adopted from its taint and annotations, and finished
    assert set(a.reclaims) == {other} and a.reclaims[other].recovered and a.reclaims[other].reason == "shortfall"
    await client.CoreV1Api(api).delete_namespaced_pod("train-3", ns, grace_period_seconds=0)
    r = await a.apply([], await live_view(api, nodes, clock()))
    assert [d.node for d in r.reclaims_done] == [other] and lent_state(await read_node(api, other)) == (False, False)


# -- mode 10: a reclaim blocked by a PodDisruptionBudget ---------------------------------------------------------------


async def _events(api: client.ApiClient, ns: str, reason: str) -> list[Any]:
    got = await client.CoreV1Api(api).list_namespaced_event(ns)
    return [e for e in got.items if e.reason == reason]


@aio
async def test_a_reclaim_blocked_by_a_disruption_budget_escalates_and_force_is_opt_in(
        api: client.ApiClient, ns: str, nodes: list[str]) -> None:
    node = await make_node(api, nodes, f"pdb-{uuid.uuid4().hex[:6]}")
    clock = Clock()
    policy = LendingPolicy(enabled=True, max_reclaim_s=30)
    act = LendingActuator(api, policy, clock=clock)
    metrics = ControllerMetrics(reclaim_deadline_s=30)
    gauge = "slotwise_reclaim_in_flight_age_seconds"
    await act.apply([LendGpus(node, (0,), "H100-80GB")], await live_view(api, nodes, clock()))
    await make_pod(api, ns, "train-g", node, labels={**PRE, "app": "guarded"}, grace=5)
    # a real PodDisruptionBudget (policy/v1beta1: the 1.20 server) that refuses every eviction of the pod
    await client.CustomObjectsApi(api).create_namespaced_custom_object("policy", "v1beta1", ns,
                                                                       "poddisruptionbudgets", {
        "apiVersion": "policy/v1beta1", "kind": "PodDisruptionBudget", "metadata": {"name": "guard"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "guarded"}}}})
    key = f"{ns}/train-g"
    clock.t += 1
    decided = clock.t
    action = ReclaimGpus(node, (0,), (key,), "shortfall", 30)
    ticks = []
    for step in (0, 10, 25, 30, 35):  # 0, 10, 35, 65, 100 s after the decision
        clock.t += step
        r = await act.apply([action], await live_view(api, nodes, clock()))
        metrics.record_lending(r)
        ticks.append((clock.t - decided, r, metrics.registry.get_sample_value(gauge)))
        assert not r.errors and not r.evicted, r.errors
    # past the deadline the reclaim said so, once: a Warning Event on the pod its budget protects
    (event,) = await _events(api, ns, "ReclaimOverdue")
    assert event.type == "Warning" and event.involved_object.name == "train-g" and "disruption" in event.message.lower()
    assert [waited for waited, r, _ in ticks if r.overdue] == [35.0]
    # the refusal is a disruption budget's, each tick; the in-flight age is what the alert reads
    assert all(r.blocked == [(key, "disruption-budget")] for _, r, _ in ticks)
    assert ticks[0][1].why(f"evict {key}") == ["disruption-budget"]
    assert [age for _, _, age in ticks] == [0.0, 10.0, 35.0, 65.0, 100.0]
    assert metrics.registry.get_sample_value("slotwise_reclaim_evictions_refused_total",
                                             {"reason": "disruption-budget"}) == 5
    # no force unless asked: the pod is still there, untouched, 70 s past the deadline
    assert not (await read_pod(api, ns, "train-g"))["metadata"].get("deletionTimestamp")
    # the operator opts in: 80 s after the deadline, the pod is deleted (its grace, capped) despite its budget
    act.policy = dataclasses.replace(policy, force_after_s=80.0)
    clock.t += 5  # 105 s: deadline + 75 s, not yet
    r = await act.apply([action], await live_view(api, nodes, clock()))
    assert not r.forced and not (await read_pod(api, ns, "train-g"))["metadata"].get("deletionTimestamp")
    clock.t += 10  # 115 s: past deadline + 80 s
    r = await act.apply([action], await live_view(api, nodes, clock()))
    assert r.forced == [key] and not r.errors, r.errors
    pod = await read_pod(api, ns, "train-g")
    assert pod["metadata"]["deletionTimestamp"] and pod["metadata"]["deletionGracePeriodSeconds"] == 5
    assert len(await _events(api, ns, "ReclaimForced")) == 1
    await client.CoreV1Api(api).delete_namespaced_pod("train-g", ns, grace_period_seconds=0)  # the kubelet
    r = await act.apply([], await live_view(api, nodes, clock()))
    (done,) = r.reclaims_done
    assert done.late and done.seconds == clock.t - decided and lent_state(await read_node(api, node)) == (False, False)
    metrics.record_lending(r)
    assert metrics.registry.get_sample_value(gauge) == 0.0 and r.in_flight == 0


class ThrottlingProxy(FaultProxy):
    """The fault proxy, answering the next ``throttle`` eviction requests with a plain 429 (the server's throttling,
    no disruption budget) carrying ``Retry-After: 7``."""

    throttle = 0

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        if self.throttle and request.method == "POST" and request.path.endswith("/eviction"):
            self.throttle -= 1
            seen = SeenRequest(request.method, request.path, dict(request.query), status=429, fault="throttled")
            self.requests.append(seen)
            return web.Response(status=429, body=json.dumps(THROTTLED).encode(),
                                headers={"Content-Type": "application/json", "Retry-After": "7"})
        return await super()._handle(request)


@aio
async def test_a_throttled_eviction_is_no_disruption_budget_and_waits_for_its_retry_after(
        kube_apiserver: KubeApiserver, api: client.ApiClient, ns: str, nodes: list[str]) -> None:
    node = await make_node(api, nodes, f"throttle-{uuid.uuid4().hex[:6]}")
    await make_pod(api, ns, "train", node, labels=PRE, grace=0)
    await client.CoreV1Api(api).patch_node(node, lent_node_patch(await read_node(api, node), T0), _content_type=MERGE)
    clock = Clock()
    async with ThrottlingProxy(kube_apiserver.url, ca_file=kube_apiserver.ca_file) as proxy, \
            client.ApiClient(proxy.client_configuration(kube_apiserver.token)) as via:
        act = LendingActuator(via, LendingPolicy(enabled=True, max_reclaim_s=60), clock=clock)
        proxy.throttle = 1
        action = ReclaimGpus(node, (0,), (f"{ns}/train",), "forecast", 60)
        r = await act.apply([action], await live_view(api, nodes, clock()))
        assert r.why(f"evict {ns}/train") == ["too-many-requests"], "throttling taken for a disruption budget"
        assert r.blocked == [(f"{ns}/train", "too-many-requests")] and not r.evicted
        evictions = [q for q in proxy.requests if q.path.endswith("/eviction")]
        # 3 s later: within the 7 s the server asked for, not a single request is made
        clock.t += 3
        before = len(proxy.requests)
        r = await act.apply([action], await live_view(api, nodes, clock()))
        assert [q for q in proxy.requests[before:] if q.method != "GET"] == [], "asked again before Retry-After"
        assert len([q for q in proxy.requests if q.path.endswith("/eviction")]) == len(evictions) == 1
        assert "retry-after" in r.why("reclaim") and r.in_flight == 1 and r.in_flight_age_s == 3.0
        clock.t += 5  # 8 s: the wait is over
        r = await act.apply([action], await live_view(api, nodes, clock()))
        assert r.evicted == [f"{ns}/train"] and not r.errors, r.errors


# -- mode 7: lending switched off, after a restart ---------------------------------------------------------------------


@aio
async def test_a_fresh_controller_with_lending_off_reclaims_a_node_still_lent(api: client.ApiClient, ns: str,
                                                                              nodes: list[str]) -> None:
    from autoscaler.live.controller import Controller, ControllerSettings

    sfx = uuid.uuid4().hex[:6]
    node = await make_node(api, nodes, f"off-{sfx}", 2)
    # lent by an earlier run (label, taint, lent-since, as the actuator writes them); training runs there
    await client.CoreV1Api(api).patch_node(node, lent_node_patch(await read_node(api, node), T0), _content_type=MERGE)
    await make_pod(api, ns, "train", node, labels=PRE, grace=0, gpus=2)
    settings = ControllerSettings(namespace=ns, lease_namespace=ns, lease_name=f"slotwise-{sfx}",
                                  identity=f"test-{sfx}", tick_s=1.0, http_port=0,
                                  lending=LendingPolicy(enabled=False, mode="pods", max_reclaim_s=30))
    ctl = Controller(api, settings)
    tasks = [asyncio.create_task(i.run()) for i in ctl.informers]
    elector = asyncio.create_task(ctl.elector.run())
    try:
        for inf in ctl.informers:
            assert await inf.wait_synced(20.0), inf.name
        await asyncio.wait_for(ctl.elector.wait_leader(), timeout=20)
        assert (ctl.view()).nodes[node].lent
        for _ in range(20):
            await ctl.tick()
            if lent_state(await read_node(api, node)) == (False, False):
                break
            await asyncio.sleep(0.3)
        assert lent_state(await read_node(api, node)) == (False, False), "lending is off, the node stays lent"
        assert await read_pod(api, ns, "train") is None, "the training on the node was not evicted"
        assert LENT_SINCE_ANNOTATION not in ((await read_node(api, node))["metadata"].get("annotations") or {})
    finally:
        elector.cancel()
        for t in tasks:
            t.cancel()
        await asyncio.gather(elector, *tasks, return_exceptions=True)


# -- mode 8: Kueue, v1beta2 and reactivation ---------------------------------------------------------------------------


@pytest_asyncio.fixture
async def kueue_crds(api: client.ApiClient) -> AsyncIterator[None]:
    """The minimal Kueue CRDs (v1beta1 and v1beta2 served), Established and in discovery; removed afterwards."""
    async with kueue_installed(api):
        for _ in range(200):  # discovery follows the CRDs a moment later
            if await discover_kueue_version(api) == "v1beta2":
                break
            await asyncio.sleep(0.05)
        yield


@aio
async def test_kueue_speaks_v1beta2_and_reactivates_only_what_it_deactivated(api: client.ApiClient, ns: str,
                                                                            nodes: list[str],
                                                                            kueue_crds: None) -> None:
    custom, batch, core = client.CustomObjectsApi(api), client.BatchV1Api(api), client.CoreV1Api(api)
    g, v = "kueue.x-k8s.io", "v1beta2"
    assert await discover_kueue_version(api) == "v1beta2"
    assert await kueue_workloads_path(api) == "/apis/kueue.x-k8s.io/v1beta2/workloads"
    sfx = uuid.uuid4().hex[:6]
    cq = f"inference-{sfx}"
    await custom.create_cluster_custom_object(g, v, "clusterqueues", {
        "apiVersion": f"{g}/{v}", "kind": "ClusterQueue", "metadata": {"name": cq},
        "spec": {"cohortName": "gpus", "resourceGroups": [{"coveredResources": ["nvidia.com/gpu"], "flavors": [
            {"name": "h100", "resources": [{"name": "nvidia.com/gpu", "nominalQuota": 4, "lendingLimit": 0}]}]}]}})
    n1, n2 = await make_node(api, nodes, f"kq1-{sfx}", 2), await make_node(api, nodes, f"kq2-{sfx}", 2)
    # two Jobs admitted through Kueue on n1: ja's Workload active; jb's Workload deactivated by its owner (not us)
    for name in ("ja", "jb"):
        job = await batch.create_namespaced_job(ns, {
            "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "labels": PRE},
            "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [
                {"name": "t", "image": "registry.invalid/t", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}}})
        owner = {"apiVersion": "batch/v1", "kind": "Job", "name": name, "uid": job.metadata.uid, "controller": True}
        await custom.create_namespaced_custom_object(g, v, ns, "workloads", {
            "apiVersion": f"{g}/{v}", "kind": "Workload",
            "metadata": {"name": f"job-{name}", "labels": PRE, "ownerReferences": [owner]},
            "spec": {"active": name == "ja", "queueName": "training", "podSets": [{"name": "main", "count": 1}]}})
        await make_pod(api, ns, f"{name}-0", n1, labels={**PRE, "job-name": name}, owner=owner)

    async def training() -> list[dict]:
        s = api.sanitize_for_serialization
        return [*s(await batch.list_namespaced_job(ns))["items"],
                *(await custom.list_namespaced_custom_object(g, v, ns, "workloads"))["items"]]

    async def workload(name: str) -> dict:
        return await custom.get_namespaced_custom_object(g, v, ns, "workloads", f"job-{name}")

    policy = LendingPolicy(enabled=True, mode="kueue", max_reclaim_s=60, kueue_cluster_queue=cq, kueue_flavor="h100")
    clock = Clock()
    act = LendingActuator(api, policy, clock=clock)

    async def view() -> ClusterView:
        return await live_view(api, nodes, clock(), policy, await training())

    # the reclaim deactivates ja's Workload, marked as slotwise's doing (in v1beta2: the managed fields say so)
    r = await act.apply([ReclaimGpus(n1, (0, 1), (f"{ns}/ja", f"{ns}/jb"), "shortfall", 60)], await view())
    assert r.deactivated == [f"{ns}/job-ja"] and not r.errors, r.errors
    wa = await workload("ja")
    assert wa["spec"]["active"] is False and wa["metadata"]["labels"][DEACTIVATED_LABEL] == "reclaim"
    assert wa["metadata"]["annotations"][DEACTIVATED_FOR_ANNOTATION] == f"{n1} (shortfall)"
    assert {f["apiVersion"] for f in wa["metadata"]["managedFields"] if f["manager"] == "slotwise"} == {f"{g}/{v}"}
    # a new term (leadership lost and regained): the reclaim in flight is adopted from the Workloads' marks. Capacity
    # is lent again while it is in flight (ja's pod still there): n1's GPUs count as coming back in the
    # lendingLimit, and nothing is reactivated yet
    act.new_term()
    clock.t += 5
    r = await act.apply([LendGpus(n2, (0, 1), "H100-80GB")], await view())
    assert set(act.reclaims) == {n1} and act.reclaims[n1].recovered and act.reclaims[n1].reason == "shortfall"
    assert r.lends == 1 and not r.reactivated and (await workload("ja"))["spec"]["active"] is False
    cq_now = await custom.get_cluster_custom_object(g, v, "clusterqueues", cq)
    assert cq_now["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0]["lendingLimit"] == "2"
    # Kueue (played) stops the deactivated Workloads' pods; the reclaim ends
    for name in ("ja", "jb"):
        await core.delete_namespaced_pod(f"{name}-0", ns, grace_period_seconds=0)
    clock.t += 5
    r = await act.apply([], await view())
    (done,) = r.reclaims_done
    assert done.seconds == 10.0 and not act.reclaims  # from the deactivation, read back from its mark
    # capacity lent again, the reclaim over: ja goes back to Kueue's queue, unmarked; jb (not ours) stays off
    clock.t += 60
    r = await act.apply([LendGpus(n1, (0, 1), "H100-80GB")], await view())
    assert not r.errors, r.errors
    wa, wb = await workload("ja"), await workload("jb")
    assert wa["spec"]["active"] is True, "a Workload slotwise deactivated was never reactivated"
    assert DEACTIVATED_LABEL not in (wa["metadata"].get("labels") or {})
    assert DEACTIVATED_FOR_ANNOTATION not in (wa["metadata"].get("annotations") or {})
    assert wb["spec"]["active"] is False, "a Workload someone else deactivated was reactivated"
    assert r.reactivated == [f"{ns}/job-ja"]
    # the lendingLimit was written in v1beta2 too, the ClusterQueue's v1beta2 fields kept
    got = await custom.get_cluster_custom_object(g, v, "clusterqueues", cq)
    assert got["spec"]["cohortName"] == "gpus"
    assert got["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0]["lendingLimit"] == "2"
    # a deposed leader (the gate closed) does not raise the lendingLimit
    with pytest.raises(LeadershipLost):
        await act.apply([LendGpus(n1, (0, 1), "H100-80GB"), LendGpus(n2, (0, 1), "H100-80GB")], await view(),
                        gate=Gate(open_for=0).gate())
    got = await custom.get_cluster_custom_object(g, v, "clusterqueues", cq)
    assert got["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0]["lendingLimit"] == "2"


@aio
async def test_kueue_lending_switched_off_rolls_back_the_limit_and_the_workloads_it_deactivated(
        api: client.ApiClient, ns: str, nodes: list[str], kueue_crds: None) -> None:
    """Mode 7, Kueue: lending off after a restart, nothing lent any more (the reclaims are over): the inference
    ClusterQueue's lendingLimit goes back to the operator's own (recorded by the earlier run's first change; issue
    30: it was set to 0) and the Workloads slotwise deactivated go back to Kueue; one deactivated by someone else
    stays as it is."""
    custom = client.CustomObjectsApi(api)
    g, v = "kueue.x-k8s.io", "v1beta2"
    cq = f"inference-{uuid.uuid4().hex[:6]}"
    # the earlier run lent 2 GPUs; the operator had lent 1 before it
    record = {ORIGINAL_LIMIT_ANNOTATION: json.dumps({"h100/nvidia.com/gpu": 1})}
    await custom.create_cluster_custom_object(g, v, "clusterqueues", {
        "apiVersion": f"{g}/{v}", "kind": "ClusterQueue", "metadata": {"name": cq, "annotations": record},
        "spec": {"resourceGroups": [{"coveredResources": ["nvidia.com/gpu"], "flavors": [
            {"name": "h100", "resources": [{"name": "nvidia.com/gpu", "nominalQuota": 4, "lendingLimit": 2}]}]}]}})
    await make_node(api, nodes, f"off-kq-{uuid.uuid4().hex[:6]}", 2)
    # what an earlier run left: "ours" deactivated for a reclaim that finished (its pods gone), with slotwise's
    # mark as that run wrote it; "theirs" deactivated by its owner
    marked = {"labels": {DEACTIVATED_LABEL: "reclaim"},
              "annotations": {DEACTIVATED_FOR_ANNOTATION: "gone-node (shortfall)",
                              "slotwise.io/deactivated-since": "2024-05-01T11:00:00.000000Z"}}
    for name, meta in (("ours", marked), ("theirs", {})):
        await custom.create_namespaced_custom_object(g, v, ns, "workloads", {
            "apiVersion": f"{g}/{v}", "kind": "Workload", "metadata": {"name": name, **meta},
            "spec": {"active": False, "queueName": "training", "podSets": [{"name": "main", "count": 1}]}})
    policy = LendingPolicy(enabled=False, mode="kueue", kueue_cluster_queue=cq, kueue_flavor="h100")
    clock = Clock()
    act = LendingActuator(api, policy, clock=clock)
    view = await live_view(api, nodes, clock(), policy)
    assert not view.snapshot.lent
    r = await act.apply([], view)
    assert not r.errors, r.errors
    ours = await custom.get_namespaced_custom_object(g, v, ns, "workloads", "ours")
    assert ours["spec"]["active"] is True, "lending is off and the Workload it deactivated stays deactivated"
    assert DEACTIVATED_LABEL not in (ours["metadata"].get("labels") or {})
    assert (await custom.get_namespaced_custom_object(g, v, ns, "workloads", "theirs"))["spec"]["active"] is False
    got = await custom.get_cluster_custom_object(g, v, "clusterqueues", cq)
    assert got["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0]["lendingLimit"] == 1
    assert ORIGINAL_LIMIT_ANNOTATION not in (got["metadata"].get("annotations") or {})
    # done once: the controller need not call apply for it any more
    assert not act.cleanup_due
    r = await act.apply([], await live_view(api, nodes, clock(), policy))
    assert not r.applied and not r.errors


@aio
@pytest.mark.parametrize("original", [None, 3], ids=["unset", "three"])
async def test_kueue_rollback_restores_the_operators_lending_limit_in_a_new_process(
        api: client.ApiClient, ns: str, nodes: list[str], kueue_crds: None, original: int | None) -> None:
    """Issue 30: the operator's ClusterQueue had its own lendingLimit (or none: the whole nominalQuota may be
    lent). slotwise lends (it writes the limit), then a NEW process -- a restart, or the other replica leading --
    runs with lending off: the rollback gives back exactly the operator's value (unset stays unset), not 0, and
    leaves no mark behind; a later process with lending off changes nothing (the operator owns the limit again)."""
    custom = client.CustomObjectsApi(api)
    g, v = "kueue.x-k8s.io", "v1beta2"
    cq = f"inference-{uuid.uuid4().hex[:6]}"
    resource: dict[str, Any] = {"name": "nvidia.com/gpu", "nominalQuota": 4}
    if original is not None:
        resource["lendingLimit"] = original
    await custom.create_cluster_custom_object(g, v, "clusterqueues", {
        "apiVersion": f"{g}/{v}", "kind": "ClusterQueue", "metadata": {"name": cq},
        "spec": {"resourceGroups": [{"coveredResources": ["nvidia.com/gpu"],
                                     "flavors": [{"name": "h100", "resources": [resource]}]}]}})
    node = await make_node(api, nodes, f"orig-kq-{uuid.uuid4().hex[:6]}", 2)

    async def limit() -> tuple[dict, dict]:
        got = await custom.get_cluster_custom_object(g, v, "clusterqueues", cq)
        return got["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0], got["metadata"]

    on = LendingPolicy(enabled=True, mode="kueue", kueue_cluster_queue=cq, kueue_flavor="h100")
    clock = Clock()
    r = await LendingActuator(api, on, clock=clock).apply([LendGpus(node, (0, 1), "H100-80GB")],
                                                          await live_view(api, nodes, clock(), on))
    assert r.lends == 1 and not r.errors, r.errors
    assert (await limit())[0]["lendingLimit"] == "2"
    # a new process with lending off; the training is gone (nothing lent any more)
    off = dataclasses.replace(on, enabled=False)
    clock.t += 60
    fresh = LendingActuator(api, off, clock=clock)
    r = await fresh.apply([], await live_view(api, nodes, clock(), off))
    assert not r.errors, r.errors
    res, meta = await limit()
    assert res.get("lendingLimit") == original, f"rolled back to {res.get('lendingLimit')!r}, not the operator's"
    assert not [k for k in (meta.get("annotations") or {}) if k.startswith("slotwise.io/")], meta.get("annotations")
    assert not fresh.cleanup_due
    # the operator changes it later; the next process with lending off leaves it alone
    res["lendingLimit"] = 1
    await custom.patch_cluster_custom_object(g, v, "clusterqueues", cq, {"spec": {"resourceGroups": [
        {"coveredResources": ["nvidia.com/gpu"], "flavors": [{"name": "h100", "resources": [res]}]}]}},
        _content_type=MERGE)
    r = await LendingActuator(api, off, clock=clock).apply([], await live_view(api, nodes, clock(), off))
    assert not r.errors and not [line for line in r.applied if line.startswith("lending-limit")], r.applied
    assert (await limit())[0]["lendingLimit"] == 1


@pytest.mark.asyncio
async def test_kueue_discovery_against_an_unreachable_apiserver_falls_back_to_v1beta1() -> None:
    """The controller discovers the Workload version at start, before its informers retry anything: an apiserver
    that refuses connections must not crash it (found in review), it watches v1beta1 and the informer retries."""
    from kubernetes_asyncio.client import ApiClient, Configuration
    from realparts.kube import free_port

    async with ApiClient(Configuration(host=f"http://127.0.0.1:{free_port()}")) as api:
        assert await kueue_workloads_path(api) == "/apis/kueue.x-k8s.io/v1beta1/workloads"
