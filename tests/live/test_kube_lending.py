"""Lending GPUs to preemptible training in Kubernetes (``autoscaler.live.kube.lending`` and the lent state in
``translate``), against a REAL kube-apiserver 1.20.2 + etcd (``realparts.kube``), plus the pure parts.

Pods mode: a node is lent (label, taint, lent-since; idempotent), never with an inference pod on it, never in
part; a reclaim takes the label off, evicts the training pods through the Eviction API (a PodDisruptionBudget's 429
proves it is the Eviction API and not a delete), refuses the inference pod the plan wrongly names, and lifts the
taint only once the training pod is gone -- the test plays the kubelet, deleting an evicted pod after its grace;
the duration from the decision is recorded. A restarted actuator adopts a reclaim in flight. Kueue mode: minimal
Kueue CRDs (``tests/realparts/kueue_crds.yaml``) are installed; the inference ClusterQueue's lendingLimit follows
the plan, Workloads are deactivated in the plan's order on a reclaim, and the reclaim ends when their pods are
gone (the test plays Kueue). Dry run changes nothing. ``translate`` reads lent GPUs as ``LENT_MODEL``, never free.

Properties (hypothesis): only pods labelled preemptible are ever evicted and every named other pod is reported;
the eviction grace never exceeds the deadline nor the pod's own; the Kueue lendingLimit never counts a GPU being
reclaimed; a lent GPU never holds an inference replica and is never free in the inventory.
"""

from __future__ import annotations

import contextlib
import json
import math
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import pytest
import pytest_asyncio
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kubernetes_asyncio import client
from kubernetes_asyncio.client.rest import ApiException

from autoscaler.api.plan import LendGpus, ReclaimGpus
from autoscaler.live.exporter import ControllerMetrics, gpu_slots
from autoscaler.live.kube.discovery import ASSUMED, POLICY, ServedApis
from autoscaler.live.kube.lending import LendingActuator, Phase, workloads_path
from autoscaler.live.kube.lending_rules import (
    ORIGINAL_LIMIT_ANNOTATION,
    eviction_grace,
    eviction_order,
    inference_pods,
    lending_limit,
    lent_node_patch,
    parse_rfc3339,
    quantity_count,
    recorded_limits,
    released_node_patch,
    remember_original,
    restore_lending_limit,
    rfc3339_precise,
    set_lending_limit,
)
from autoscaler.live.kube.objects import (
    LENT_LABEL,
    LENT_SINCE_ANNOTATION,
    LENT_TAINT_KEY,
    PREEMPTIBLE_LABEL,
    RECLAIM_REASON_ANNOTATION,
    RECLAIM_SINCE_ANNOTATION,
    ClusterView,
    TrainingRef,
)
from autoscaler.live.kube.translate import UNMANAGED_MODEL_PREFIX, build_view
from sharing.catalog import load_catalog
from sharing.lending import LENT_MODEL, LendingPolicy, lent_owner

if TYPE_CHECKING:
    from realparts.kube import KubeApiserver

from realparts.kueue import kueue_installed

pytest_plugins = ("realparts.kube", "realparts.helm")

aio = pytest.mark.asyncio
MERGE = "application/merge-patch+json"
H100 = "NVIDIA-H100-80GB-HBM3"
PRE = {PREEMPTIBLE_LABEL: "true"}
CAT = load_catalog()
T0 = 1_714_564_800.0  # 2024-05-01T12:00:00Z


# -- objects as the API serves them (pure tests) ----------------------------------------------------------------------


def node_obj(name: str, gpus: int = 2, *, labels: dict | None = None, annotations: dict | None = None,
             taints: list | None = None, rv: str = "1") -> dict:
    meta: dict[str, Any] = {"name": name, "resourceVersion": rv,
                            "labels": {"nvidia.com/gpu.product": H100, "nvidia.com/gpu.count": str(gpus),
                                       **(labels or {})},
                            "annotations": dict(annotations or {})}
    cap = {"nvidia.com/gpu": str(gpus), "cpu": "64", "memory": "512Gi", "pods": "110"}
    return {"kind": "Node", "apiVersion": "v1", "metadata": meta, "spec": {"taints": list(taints or [])},
            "status": {"capacity": cap, "allocatable": cap}}


def lent_node(name: str, gpus: int = 2, since: str = "2024-05-01T11:00:00Z", *, labelled: bool = True) -> dict:
    return node_obj(name, gpus, labels={LENT_LABEL: "true"} if labelled else {},
                    annotations={LENT_SINCE_ANNOTATION: since},
                    taints=[{"key": LENT_TAINT_KEY, "value": "true", "effect": "NoSchedule"}])


def pod_obj(name: str, node: str | None, *, ns: str = "ml", labels: dict | None = None, gpus: int = 1,
            grace: int | None = None, deleting: bool = False, owner: dict | None = None, phase: str = "Running",
            created: str = "2024-05-01T11:30:00Z") -> dict:
    meta: dict[str, Any] = {"name": name, "namespace": ns, "uid": f"uid-{name}", "labels": dict(labels or {}),
                            "creationTimestamp": created, "resourceVersion": "7"}
    if deleting:
        meta["deletionTimestamp"] = "2024-05-01T12:00:00Z"
    if owner:
        meta["ownerReferences"] = [owner]
    spec: dict[str, Any] = {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}
                                            if gpus else {}}]}
    if node:
        spec["nodeName"] = node
    if grace is not None:
        spec["terminationGracePeriodSeconds"] = grace
    return {"kind": "Pod", "apiVersion": "v1", "metadata": meta, "spec": spec,
            "status": {"phase": phase, "startTime": created}}


def deployment_obj(name: str, ns: str = "ml") -> dict:
    labels = {"app": name}
    return {"kind": "Deployment", "apiVersion": "apps/v1",
            "metadata": {"name": name, "namespace": ns, "annotations": {"slotwise.io/slo-latency-ms": "500"}},
            "spec": {"replicas": 1, "selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels}, "spec": {"containers": [
                         {"name": "s", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}}}


# -- pure: translate ---------------------------------------------------------------------------------------------------


def test_translate_pods_mode_lent_node_is_lent_model_never_free_and_borrowers_count_once() -> None:
    nodes = [lent_node("lent-1", 4), node_obj("gpu-2", 2)]
    pods = [pod_obj("train-a", "lent-1", labels=PRE, gpus=2),  # a borrower: covered by the lent allocation
            pod_obj("train-b", "lent-1", labels=PRE, gpus=1),
            pod_obj("chat-0", "gpu-2", labels={"app": "chat"})]
    v = build_view([deployment_obj("chat")], pods, nodes, now=T0)
    inv = v.snapshot.inventory
    since = parse_rfc3339("2024-05-01T11:00:00Z")
    assert dict(v.snapshot.lent) == {("lent-1", d): since for d in range(4)}
    for d in range(4):
        (owner,) = {o for o, _ in inv.device("lent-1", d).entries}
        assert owner == lent_owner("lent-1", d) and inv.model_of(owner) == LENT_MODEL
    # the training pods are not allocated a second time (no pod:... owner on the lent node)
    assert not [o for o, _ in inv.allocations() if o.startswith(("ml/train", UNMANAGED_MODEL_PREFIX))]
    # nothing lent is used or free: gpu-2 has its replica and one free GPU, lent-1's four are lent
    assert gpu_slots(inv) == {"H100-80GB": (1.0, 1.0)}
    assert {n: [p.key for p in info.pods] for n, info in v.nodes.items()} == {
        "lent-1": ["ml/train-a", "ml/train-b"], "gpu-2": ["ml/chat-0"]}
    assert v.nodes["lent-1"].lent and not v.nodes["lent-1"].reclaiming
    assert {w.name: w.nodes for w in v.snapshot.training} == {"ml/train-a": ("lent-1",), "ml/train-b": ("lent-1",)}
    assert v.training["ml/train-a"] == TrainingRef("ml/train-a", "Pod", "ml", "uid-train-a", ("ml/train-a",), ())


def test_translate_reclaim_in_flight_stays_lent_and_a_stranger_keeps_its_gpu() -> None:
    # the label is off (reclaim started), the taint still on: still lent until the actuator lifts the taint
    nodes = [lent_node("n1", 2, labelled=False)]
    pods = [pod_obj("chat-0", "n1", labels={"app": "chat"}),  # an inference replica there by mistake
            pod_obj("train", "n1", labels=PRE)]
    v = build_view([deployment_obj("chat")], pods, nodes, now=T0)
    assert v.nodes["n1"].reclaiming
    assert list(v.snapshot.lent) == [("n1", 1)]  # GPU 0 is the replica's, never lent
    inv = v.snapshot.inventory
    assert inv.model_of(next(o for o, _ in inv.device("n1", 0).entries)) == "ml/chat"
    assert any("GPU 0 is held by ml/chat-0" in p for p in v.problems)
    # a lent node without a readable lent-since: lent, since now, said once
    bad = node_obj("n2", 1, labels={LENT_LABEL: "true"}, annotations={LENT_SINCE_ANNOTATION: "yesterday"})
    v2 = build_view([], [], [bad], now=T0)
    assert dict(v2.snapshot.lent) == {("n2", 0): T0}
    assert any("lent-since" in p and "n2" in p for p in v2.problems)


def test_translate_kueue_mode_lends_what_training_pods_hold() -> None:
    pre = dict(PRE)
    job = {"kind": "Job", "apiVersion": "batch/v1",
           "metadata": {"name": "pretrain", "namespace": "train", "uid": "job-uid", "labels": pre},
           "spec": {"parallelism": 2, "template": {"spec": {"terminationGracePeriodSeconds": 60, "containers": [
               {"name": "t", "resources": {"limits": {"nvidia.com/gpu": "2"}}}]}}},
           "status": {"active": 2, "startTime": "2024-05-01T11:10:00Z"}}
    owner = {"apiVersion": "batch/v1", "kind": "Job", "name": "pretrain", "uid": "job-uid"}
    workload = {"kind": "Workload", "apiVersion": "kueue.x-k8s.io/v1beta1",
                "metadata": {"name": "job-pretrain-1a2b", "namespace": "train", "labels": pre,
                             "ownerReferences": [owner]},
                "spec": {"podSets": [{"name": "main", "count": 2}]}}
    pods = [pod_obj(f"pretrain-{i}", f"gpu-{i}", ns="train", gpus=2, owner=owner) for i in range(2)]  # no label
    mig = {"nvidia.com/mig.strategy": "mixed", "nvidia.com/mig.config": "all-3g", "nvidia.com/mig.capable": "true"}
    mig_node = node_obj("mig-1", 1, labels=mig)
    mig_node["status"]["capacity"] = mig_node["status"]["allocatable"] = {"nvidia.com/mig-3g.40gb": "2"}
    mig_pod = pod_obj("small", "mig-1", ns="train", labels=pre, gpus=0)
    mig_pod["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/mig-3g.40gb": "1"}}
    nodes = [node_obj("gpu-0", 4), node_obj("gpu-1", 2), mig_node]
    kueue = LendingPolicy(enabled=True, mode="kueue")
    v = build_view([], [*pods, mig_pod], nodes, [job, workload], now=T0, lending=kueue)
    started = parse_rfc3339("2024-05-01T11:10:00Z")
    assert dict(v.snapshot.lent) == {("gpu-0", 0): started, ("gpu-0", 1): started,
                                     ("gpu-1", 0): started, ("gpu-1", 1): started}
    inv = v.snapshot.inventory
    assert {inv.model_of(o) for n in ("gpu-0", "gpu-1") for d in range(2)
            for o, _ in inv.device(n, d).entries} == {LENT_MODEL}
    assert inv.device("gpu-0", 2).idle and inv.device("gpu-0", 3).idle  # the rest stays free
    assert inv.model_of("train/small") == "pod:train/small"  # a MIG slice is not lent: Kueue lends GPUs
    ref = v.training["train/pretrain"]
    assert ref.pods == ("train/pretrain-0", "train/pretrain-1") and ref.workloads == ("train/job-pretrain-1a2b",)
    # pods mode (or no settings): the same training pods are just pods holding GPUs, nothing is lent
    plain = build_view([], [*pods, mig_pod], nodes, [job, workload], now=T0)
    assert not plain.snapshot.lent and plain.snapshot.inventory.model_of("train/pretrain-0") == "pod:train/pretrain-0"


@st.composite
def clusters(draw: st.DrawFn) -> tuple[list[dict], list[dict]]:
    n_nodes = draw(st.integers(1, 4))
    nodes, pods = [], []
    for i in range(n_nodes):
        gpus = draw(st.integers(1, 4))
        state = draw(st.sampled_from(["plain", "lent", "reclaiming"]))
        name = f"n{i}"
        nodes.append(node_obj(name, gpus) if state == "plain" else lent_node(name, gpus, labelled=state == "lent"))
        for j in range(draw(st.integers(0, gpus + 1))):
            kind = draw(st.sampled_from(["chat", "train", "other"]))
            labels = {"app": "chat"} if kind == "chat" else PRE if kind == "train" else {}
            minute = draw(st.integers(0, 59))
            pods.append(pod_obj(f"{kind}-{i}-{j}", name, labels=labels, gpus=draw(st.integers(1, 2)),
                                created=f"2024-05-01T11:{minute:02d}:00Z"))
    return nodes, pods


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters())
def test_property_a_lent_gpu_never_holds_inference_and_is_never_free(cluster: tuple[list[dict], list[dict]]) -> None:
    nodes, pods = cluster
    v = build_view([deployment_obj("chat")], pods, nodes, now=T0)
    inv = v.snapshot.inventory
    for (node, dev) in v.snapshot.lent:
        entries = inv.device(node, dev).entries
        assert entries, "a lent GPU must be allocated (never free)"
        assert {inv.model_of(o) for o, _ in entries} == {LENT_MODEL}
        assert v.nodes[node].lent or v.nodes[node].reclaiming
    for obs in v.snapshot.models.values():
        for r in obs.replicas:
            if r.slot is not None:
                assert not {(r.slot.node, d) for d in r.slot.devices} & set(v.snapshot.lent)
    # a borrower on a lent node is never allocated itself (no double count); used + free + lent = every GPU
    for owner, slot in inv.allocations():
        if owner.startswith("ml/train"):
            assert not (v.nodes[slot.node].lent or v.nodes[slot.node].reclaiming), owner
    (used, free), = gpu_slots(inv).values()
    assert math.isclose(used + free + len(v.snapshot.lent), inv.gpus_total)


# -- pure: the actuator's decisions -----------------------------------------------------------------------------------


def test_eviction_order_named_first_others_after_inference_refused() -> None:
    pods = [pod_obj("b", "n", labels=PRE), pod_obj("a", "n", labels=PRE), pod_obj("chat-0", "n", labels={"app": "c"}),
            pod_obj("c", "n", labels=PRE), pod_obj("done", "n", labels=PRE, phase="Succeeded"),
            pod_obj("fake", "n", labels={PREEMPTIBLE_LABEL: "True"})]  # not exactly "true": not preemptible
    order, refused = eviction_order(pods, ["ml/c", "ml/chat-0", "ml/fake", "ml/gone"], {})
    assert [p["metadata"]["name"] for p in order] == ["c", "a", "b"]
    assert refused == ["ml/chat-0", "ml/fake"]
    assert inference_pods(pods) == ["ml/chat-0", "ml/fake"]
    # a Job's pods are found by owner even when the view does not list them yet
    owner = {"kind": "Job", "name": "j", "uid": "u"}
    job_pods = [pod_obj("j-1", "n", labels=PRE, owner=owner), pod_obj("j-2", "n", owner=owner)]
    ref = TrainingRef("ml/j", "Job", "ml", "u")
    order, refused = eviction_order(job_pods, ["ml/j"], {"ml/j": ref})
    assert [p["metadata"]["name"] for p in order] == ["j-1"] and refused == ["ml/j-2"]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["true", "false", "True", None, "yes"]),
                          st.sampled_from(["Running", "Pending", "Succeeded", "Failed"]), st.booleans()),
                max_size=12),
       st.data())
def test_property_only_preemptible_pods_are_ever_evicted(spec: list, data: st.DataObject) -> None:
    pods = [pod_obj(f"p{i}", "n", labels={} if lab is None else {PREEMPTIBLE_LABEL: lab}, phase=phase,
                    deleting=deleting) for i, (lab, phase, deleting) in enumerate(spec)]
    keys = [f"ml/p{i}" for i in range(len(pods))]
    named = data.draw(st.lists(st.sampled_from(keys), unique=True) if keys else st.just([]))
    order, refused = eviction_order(pods, named, {})
    evicted = {p["metadata"]["name"] for p in order}
    live = {p["metadata"]["name"]: p for p in pods if p["status"]["phase"] not in ("Succeeded", "Failed")}
    assert evicted == {n for n, p in live.items() if p["metadata"]["labels"].get(PREEMPTIBLE_LABEL) == "true"}
    assert set(refused) == {k for k in named if k.split("/")[1] in live and k.split("/")[1] not in evicted}
    # named pods come first, in the plan's order
    named_evicted = [k.split("/")[1] for k in named if k.split("/")[1] in evicted]
    assert [p["metadata"]["name"] for p in order][:len(named_evicted)] == named_evicted


@given(st.one_of(st.none(), st.integers(-5, 10_000), st.floats(0, 1e4), st.booleans()),
       st.floats(0.5, 3600))
def test_property_eviction_grace_fits_the_deadline_and_the_pod(grace: Any, deadline: float) -> None:
    g = eviction_grace(grace, deadline)
    assert isinstance(g, int) and 0 <= g <= deadline
    own = grace if isinstance(grace, int | float) and not isinstance(grace, bool) and grace >= 0 else 30
    assert g <= own


@given(st.sets(st.tuples(st.sampled_from("abc"), st.integers(0, 3))),
       st.sets(st.tuples(st.sampled_from("abc"), st.integers(0, 3))),
       st.sets(st.tuples(st.sampled_from("abc"), st.integers(0, 3))))
def test_property_lending_limit_never_counts_a_gpu_being_reclaimed(lent: set, back: set, lend: set) -> None:
    n = lending_limit(lent, back, lend)
    assert n == len((lent | lend) - back) and n <= len(lent) + len(lend)
    assert lending_limit(lent, lent | lend, lend) == 0


def test_set_lending_limit_touches_one_entry_and_caps_at_the_nominal_quota() -> None:
    cq = {"metadata": {"name": "inference"}, "spec": {"resourceGroups": [
        {"coveredResources": ["cpu"], "flavors": [{"name": "default-flavor", "resources": [
            {"name": "cpu", "nominalQuota": "64"}]}]},
        {"coveredResources": ["nvidia.com/gpu"], "flavors": [
            {"name": "spot", "resources": [{"name": "nvidia.com/gpu", "nominalQuota": 4}]},
            {"name": "default-flavor", "resources": [{"name": "nvidia.com/gpu", "nominalQuota": "8"}]}]}]}}
    groups, written, changed = set_lending_limit(cq, "default-flavor", "nvidia.com/gpu", 3)
    assert (written, changed) == (3, True)
    assert groups[1]["flavors"][1]["resources"][0] == {"name": "nvidia.com/gpu", "nominalQuota": "8",
                                                       "lendingLimit": "3"}
    assert "lendingLimit" not in groups[1]["flavors"][0]["resources"][0]
    assert "lendingLimit" not in groups[0]["flavors"][0]["resources"][0]
    cq["spec"]["resourceGroups"] = groups
    assert set_lending_limit(cq, "default-flavor", "nvidia.com/gpu", 3)[2] is False  # idempotent
    assert set_lending_limit(cq, "default-flavor", "nvidia.com/gpu", 20)[1] == 8  # lendingLimit <= nominalQuota
    assert "no flavor 'gold'" in set_lending_limit(cq, "gold", "nvidia.com/gpu", 1)
    assert [quantity_count(q) for q in ("8", 8, "8000m", "1.5", "8Gi", None, True)] == [8, 8, 8, None, None,
                                                                                        None, None]


def test_the_operators_lending_limit_is_recorded_once_and_given_back_exactly() -> None:
    """Issue 30: the record is taken before slotwise's first change only (later changes are slotwise's own values);
    the rollback gives back the value as it was served, or no key at all when it was unset, and takes the record
    off; an entry recorded for another flavor stays."""
    def cq(limit: object, annotations: dict | None = None) -> dict:
        res = {"name": "nvidia.com/gpu", "nominalQuota": 8, **({} if limit is None else {"lendingLimit": limit})}
        return {"metadata": {"name": "inference", "annotations": annotations or {}}, "spec": {"resourceGroups": [
            {"coveredResources": ["nvidia.com/gpu"], "flavors": [{"name": "h100", "resources": [res]}]}]}}

    for original in (None, 3, "3"):
        first = remember_original(cq(original), "h100", "nvidia.com/gpu")
        assert first is not None and recorded_limits({"metadata": {"annotations": first}}) == {
            "h100/nvidia.com/gpu": original}
        later = cq("5", first)  # slotwise's own value since
        assert remember_original(later, "h100", "nvidia.com/gpu") is None
        groups, value, annotations = restore_lending_limit(later, "h100", "nvidia.com/gpu")
        res = groups[0]["flavors"][0]["resources"][0]
        assert value == original and res.get("lendingLimit", None) == original
        assert ("lendingLimit" in res) == (original is not None)
        assert annotations == {ORIGINAL_LIMIT_ANNOTATION: None}
    assert restore_lending_limit(cq("5"), "h100", "nvidia.com/gpu") is None  # never changed by slotwise
    both = cq("5", {ORIGINAL_LIMIT_ANNOTATION: json.dumps({"h100/nvidia.com/gpu": 2, "a100/nvidia.com/gpu": None})})
    assert json.loads(restore_lending_limit(both, "h100", "nvidia.com/gpu")[2][ORIGINAL_LIMIT_ANNOTATION]) == {
        "a100/nvidia.com/gpu": None}
    assert recorded_limits(cq("5", {ORIGINAL_LIMIT_ANNOTATION: "not json"})) == {}


def test_node_patches_are_idempotent_and_keep_other_taints() -> None:
    other = {"key": "gpu", "value": "h100", "effect": "NoSchedule"}
    node = node_obj("n", taints=[other], rv="42")
    patch = lent_node_patch(node, T0)
    assert patch is not None and patch["metadata"]["resourceVersion"] == "42"
    assert patch["spec"]["taints"] == [other, {"key": LENT_TAINT_KEY, "value": "true", "effect": "NoSchedule"}]
    assert patch["metadata"]["annotations"] == {LENT_SINCE_ANNOTATION: "2024-05-01T12:00:00Z"}
    lent = lent_node("n")
    lent["spec"]["taints"].insert(0, other)
    assert lent_node_patch(lent, T0) is None  # already lent: nothing to write
    lent["metadata"]["annotations"][RECLAIM_SINCE_ANNOTATION] = rfc3339_precise(T0 + 0.25)
    release = released_node_patch(lent)
    assert release["spec"]["taints"] == [other]
    assert release["metadata"]["annotations"] == {LENT_SINCE_ANNOTATION: None, RECLAIM_SINCE_ANNOTATION: None}
    assert released_node_patch(node_obj("n", taints=[other])) is None
    assert released_node_patch(lent_node("m"))["spec"]["taints"] is None  # the last taint: the list goes
    assert parse_rfc3339(rfc3339_precise(T0 + 0.25)) == T0 + 0.25


def test_exporter_records_lending_with_a_bucket_at_the_deadline() -> None:
    m = ControllerMetrics(reclaim_deadline_s=75.0)
    get = m.registry.get_sample_value
    assert get("slotwise_reclaim_deadline_seconds") == 75.0
    done = [SimpleNamespace(seconds=74.9, reason="forecast"), SimpleNamespace(seconds=75.1, reason="shortfall")]
    m.record_lending(SimpleNamespace(lends=3, reclaims_started=[("n1", "forecast"), ("n2", "shortfall")],
                                     reclaims_done=done))
    assert get("slotwise_reclaim_duration_seconds_bucket", {"le": "75.0"}) == 1  # exactly at the deadline
    assert get("slotwise_reclaim_duration_seconds_count") == 2
    assert get("slotwise_lends_total") == 3
    assert get("slotwise_reclaims_total", {"reason": "shortfall"}) == 1
    with pytest.raises(ValueError):
        ControllerMetrics(reclaim_deadline_s=0)


# -- the real apiserver ---------------------------------------------------------------------------------------------


_NODES: list[str] = []


@pytest_asyncio.fixture
async def api(kube_apiserver: KubeApiserver) -> AsyncIterator[client.ApiClient]:
    async with kube_apiserver.api_client() as api_client:
        yield api_client
        for name in _NODES:  # nodes are cluster-wide: other tests' controllers must not see ours
            with contextlib.suppress(ApiException):
                await client.CoreV1Api(api_client).delete_node(name)
        _NODES.clear()


@pytest_asyncio.fixture
async def ns(api: client.ApiClient) -> str:
    name = f"slotwise-lend-{uuid.uuid4().hex[:8]}"
    core = client.CoreV1Api(api)
    await core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    await core.create_namespaced_service_account(name, {"metadata": {"name": "default"}})
    return name


async def make_node(api: client.ApiClient, name: str, gpus: int = 2) -> str:
    core = client.CoreV1Api(api)
    _NODES.append(name)
    labels = {"nvidia.com/gpu.product": H100, "nvidia.com/gpu.count": str(gpus)}
    await core.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}})
    cap = {"nvidia.com/gpu": str(gpus), "cpu": "64", "memory": "512Gi", "pods": "110"}
    await core.patch_node_status(name, {"status": {"capacity": cap, "allocatable": cap}}, _content_type=MERGE)
    return name


async def make_pod(api: client.ApiClient, ns: str, name: str, node: str, *, labels: dict | None = None,
                   gpus: int = 1, grace: int = 30, owner: dict | None = None) -> dict:
    meta: dict[str, Any] = {"name": name, "labels": labels or {}}
    if owner:
        meta["ownerReferences"] = [owner]
    pod = await client.CoreV1Api(api).create_namespaced_pod(ns, {
        "apiVersion": "v1", "kind": "Pod", "metadata": meta,
        "spec": {"nodeName": node, "automountServiceAccountToken": False, "terminationGracePeriodSeconds": grace,
                 "tolerations": [{"key": LENT_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}],
                 "containers": [{"name": "c", "image": "registry.invalid/train:test",
                                 "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]}})
    # the kubelet's part: Running (a Pending pod may be evicted whatever its PodDisruptionBudget says)
    pod = await client.CoreV1Api(api).patch_namespaced_pod_status(name, ns, {"status": {"phase": "Running"}},
                                                                  _content_type=MERGE)
    return api.sanitize_for_serialization(pod)


async def live_view(api: client.ApiClient, now: float, lending: LendingPolicy | None = None,
                    training: list[dict] | None = None) -> ClusterView:
    """What the informers would hand build_view: the server's lists, as plain dicts."""
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    s = api.sanitize_for_serialization
    nodes = [n for n in s(await core.list_node())["items"] if n["metadata"]["name"] in _NODES]
    pods = s(await core.list_pod_for_all_namespaces())["items"]
    deps = s(await apps.list_deployment_for_all_namespaces())["items"]
    return build_view(deps, pods, nodes, training or [], now=now, lending=lending)


async def read_node(api: client.ApiClient, name: str) -> dict:
    return api.sanitize_for_serialization(await client.CoreV1Api(api).read_node(name))


async def read_pod(api: client.ApiClient, ns: str, name: str) -> dict | None:
    try:
        return api.sanitize_for_serialization(await client.CoreV1Api(api).read_namespaced_pod(name, ns))
    except ApiException as e:
        if e.status == 404:
            return None
        raise


def lent_state(node: dict) -> tuple[bool, bool, bool]:
    """(label, taint, lent-since annotation)."""
    meta = node["metadata"]
    taints = (node.get("spec") or {}).get("taints") or []
    return ((meta.get("labels") or {}).get(LENT_LABEL) == "true",
            any(t["key"] == LENT_TAINT_KEY and t["effect"] == "NoSchedule" for t in taints),
            LENT_SINCE_ANNOTATION in (meta.get("annotations") or {}))


class Clock:
    def __init__(self, t: float = T0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


@aio
async def test_pods_mode_lend_is_whole_node_idempotent_and_never_over_inference(api: client.ApiClient,
                                                                             ns: str) -> None:
    sfx = uuid.uuid4().hex[:6]
    idle, busy = await make_node(api, f"idle-{sfx}"), await make_node(api, f"busy-{sfx}")
    await make_pod(api, ns, "chat-0", busy, labels={"app": "chat"})
    clock = Clock()
    policy = LendingPolicy(enabled=True, mode="pods", max_reclaim_s=60)
    act = LendingActuator(api, policy, clock=clock)
    # dry run first: nothing changes
    dry = LendingActuator(api, policy, dry_run=True, clock=clock)
    view = await live_view(api, clock())
    r = await dry.apply([LendGpus(idle, (0, 1), "H100-80GB")], view)
    assert r.why(f"lend {idle}") == ["dry-run"] and lent_state(await read_node(api, idle)) == (False, False, False)

    r = await act.apply([LendGpus(idle, (0,), "H100-80GB"),  # part of a node: a label cannot split it
                         LendGpus(busy, (0, 1), "H100-80GB"),  # an inference pod there
                         LendGpus(f"nowhere-{sfx}", (0,), "H100-80GB")], view)
    assert r.why(f"lend {idle}") == ["not-whole-node"] and r.why(f"lend {busy}") == ["inference-on-node"]
    assert r.why("lend nowhere") == ["not-in-inventory"] and not r.errors and r.lends == 0
    assert lent_state(await read_node(api, busy)) == (False, False, False)

    r = await act.apply([LendGpus(idle, (0, 1), "H100-80GB", "surplus")], view)
    assert r.applied == [f"lend {idle}/gpu0,1 (H100-80GB) surplus"] and r.lends == 1 and not r.errors
    node = await read_node(api, idle)
    assert lent_state(node) == (True, True, True)
    assert node["metadata"]["annotations"][LENT_SINCE_ANNOTATION] == "2024-05-01T12:00:00Z"
    rv = node["metadata"]["resourceVersion"]
    clock.t += 30
    r = await act.apply([LendGpus(idle, (0, 1), "H100-80GB")], await live_view(api, clock()))
    assert r.why(f"lend {idle}") == ["unchanged"] and r.lends == 0
    assert (await read_node(api, idle))["metadata"]["resourceVersion"] == rv  # not even a no-op write
    # translate: the lent GPUs are LENT_MODEL, not free
    view = await live_view(api, clock())
    assert set(view.snapshot.lent) == {(idle, 0), (idle, 1)}
    assert view.snapshot.lent[(idle, 0)] == T0
    assert all(view.snapshot.inventory.model_of(o) == LENT_MODEL for d in range(2)
               for o, _ in view.snapshot.inventory.device(idle, d).entries)


@aio
async def test_pods_mode_lend_conflict_is_retried_and_keeps_the_other_change(api: client.ApiClient) -> None:
    node = await make_node(api, f"race-{uuid.uuid4().hex[:6]}")
    act = LendingActuator(api, LendingPolicy(enabled=True), clock=Clock())
    core = client.CoreV1Api(api)
    raced = []

    async def meddle(what: str, key: str) -> None:
        if not raced:  # someone else changes the node between our read and our write: a real 409
            raced.append(key)
            await core.patch_node(key, {"metadata": {"labels": {"team": "infra"}},
                                        "spec": {"taints": [{"key": "gpu", "effect": "NoSchedule"}]}},
                                  _content_type=MERGE)

    act.before_write = meddle
    r = await act.apply([LendGpus(node, (0, 1), "H100-80GB")], await live_view(api, T0))
    assert r.conflicts_retried == 1 and r.lends == 1 and not r.errors
    got = await read_node(api, node)
    assert lent_state(got) == (True, True, True) and got["metadata"]["labels"]["team"] == "infra"
    assert {t["key"] for t in got["spec"]["taints"]} == {"gpu", LENT_TAINT_KEY}


@aio
async def test_pods_mode_reclaim_evicts_only_training_and_lifts_the_taint_after(api: client.ApiClient,
                                                                               ns: str) -> None:
    core = client.CoreV1Api(api)
    sfx = uuid.uuid4().hex[:6]
    lent, other = await make_node(api, f"lent-{sfx}", 4), await make_node(api, f"inf-{sfx}")
    clock = Clock()
    policy = LendingPolicy(enabled=True, mode="pods", max_reclaim_s=45)
    act = LendingActuator(api, policy, clock=clock)
    r = await act.apply([LendGpus(lent, (0, 1, 2, 3), "H100-80GB")], await live_view(api, clock()))
    assert r.lends == 1
    # training lands (selects the label, tolerates the taint); a guarded one under a PodDisruptionBudget;
    # an inference replica sits on the lent node by mistake, another on its own node
    await make_pod(api, ns, "train-a", lent, labels={**PRE, "job": "a"}, grace=120, gpus=2)
    await make_pod(api, ns, "train-g", lent, labels={**PRE, "app": "guarded"}, grace=0)
    await make_pod(api, ns, "chat-0", lent, labels={"app": "chat"})
    await make_pod(api, ns, "chat-1", other, labels={"app": "chat"})
    # (the generic client: kubernetes_asyncio no longer has a policy/v1beta1 API class; 1.20 has no policy/v1)
    await client.CustomObjectsApi(api).create_namespaced_custom_object("policy", "v1beta1", ns,
                                                                       "poddisruptionbudgets", {
        "apiVersion": "policy/v1beta1", "kind": "PodDisruptionBudget", "metadata": {"name": "guard"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "guarded"}}}})
    before = {n: (await read_pod(api, ns, n))["metadata"]["resourceVersion"] for n in ("chat-0", "chat-1")}
    view = await live_view(api, clock())
    assert {w.name for w in view.snapshot.training} == {f"{ns}/train-a", f"{ns}/train-g"}
    # GPU 0 is the replica's (the only pod allocated on a lent node); the borrowers are covered by the lent GPUs
    assert set(view.snapshot.lent) == {(lent, 1), (lent, 2), (lent, 3)}

    # the plan (wrongly) names the inference pod too
    clock.t += 5
    decided = clock.t
    view = await live_view(api, clock())
    action = ReclaimGpus(lent, (0, 1, 2, 3), (f"{ns}/chat-0", f"{ns}/train-a", f"{ns}/train-g"), "forecast", 45)
    r = await act.apply([action], view)
    assert not r.errors, r.errors
    assert r.reclaims_started == [(lent, "forecast")]
    assert r.refused == [f"{ns}/chat-0"] and (f"evict {ns}/chat-0 from {lent}", "not-preemptible") in r.skipped
    assert r.evicted == [f"{ns}/train-a"]  # the guarded one: 429 from its PDB, so it really is the Eviction API
    assert r.why(f"evict {ns}/train-g") == ["disruption-budget"]
    node = await read_node(api, lent)
    assert lent_state(node) == (False, True, True), "label off first, taint on until the training is gone"
    assert node["metadata"]["annotations"][RECLAIM_REASON_ANNOTATION] == "forecast"
    assert parse_rfc3339(node["metadata"]["annotations"][RECLAIM_SINCE_ANNOTATION]) == decided
    a = await read_pod(api, ns, "train-a")
    assert a["metadata"]["deletionTimestamp"] and a["metadata"]["deletionGracePeriodSeconds"] == 45  # capped
    assert not (await read_pod(api, ns, "train-g"))["metadata"].get("deletionTimestamp")
    assert act.reclaims[lent].phase is Phase.EVICT and r.pending
    # still lent in the view while the reclaim is in flight: nothing for inference there yet
    assert view.nodes[lent].lent and (await live_view(api, clock())).nodes[lent].reclaiming

    # the budget goes; the next tick evicts the guarded pod (grace 0: gone at once); train-a still terminating
    await client.CustomObjectsApi(api).delete_namespaced_custom_object("policy", "v1beta1", ns,
                                                                       "poddisruptionbudgets", "guard")
    clock.t += 10
    r = await act.apply([action], await live_view(api, clock()))  # the core re-emits it: folded in, not restarted
    assert r.why(f"reclaim {lent}") == ["in-flight"] and r.evicted == [f"{ns}/train-g"] and not r.refused
    assert await read_pod(api, ns, "train-g") is None
    assert lent_state(await read_node(api, lent))[1], "train-a is still there: the taint stays"
    assert not r.reclaims_done

    # the kubelet: train-a ends after its (capped) grace
    clock.t += 20
    await core.delete_namespaced_pod("train-a", ns, grace_period_seconds=0)
    r = await act.apply([], await live_view(api, clock()))
    assert not r.errors and lent_state(await read_node(api, lent)) == (False, False, False)
    (done,) = r.reclaims_done
    assert (done.node, done.reason, done.seconds, done.late) == (lent, "forecast", clock.t - decided, False)
    assert not act.reclaims and RECLAIM_SINCE_ANNOTATION not in (await read_node(api, lent))["metadata"].get(
        "annotations", {})
    # inference was never touched
    for name, rv in before.items():
        pod = await read_pod(api, ns, name)
        assert pod["metadata"]["resourceVersion"] == rv and not pod["metadata"].get("deletionTimestamp")
    view = await live_view(api, clock())
    assert not view.snapshot.lent and view.snapshot.inventory.device(lent, 3).idle
    # metrics
    m = ControllerMetrics(reclaim_deadline_s=45)
    m.record_lending(r)
    assert m.registry.get_sample_value("slotwise_reclaim_duration_seconds_bucket", {"le": "45.0"}) == 1


@aio
async def test_a_restarted_actuator_finishes_a_reclaim_in_flight(api: client.ApiClient, ns: str) -> None:
    node = await make_node(api, f"restart-{uuid.uuid4().hex[:6]}", 1)
    clock = Clock()
    policy = LendingPolicy(enabled=True, max_reclaim_s=30)
    first = LendingActuator(api, policy, clock=clock)
    await first.apply([LendGpus(node, (0,), "H100-80GB")], await live_view(api, clock()))
    await make_pod(api, ns, "train", node, labels=PRE, grace=20)
    clock.t += 1
    decided = clock.t
    r = await first.apply([ReclaimGpus(node, (0,), (f"{ns}/train",), "shortfall", 30)],
                          await live_view(api, clock()))
    assert r.evicted == [f"{ns}/train"]
    assert (await client.PolicyApi(api).get_api_group()).preferred_version.version == "v1beta1"
    assert first.apis is not None and first.apis.pick(POLICY) == "v1beta1"  # what discovery says on 1.20
    # the process dies; the pod goes; a new process sees a node with the taint and no label
    await client.CoreV1Api(api).delete_namespaced_pod("train", ns, grace_period_seconds=0)
    clock.t += 12
    second = LendingActuator(api, policy, clock=clock)
    r = await second.apply([], await live_view(api, clock()))
    (done,) = r.reclaims_done
    assert (done.reason, done.seconds) == ("shortfall", pytest.approx(clock.t - decided, abs=1e-3))
    assert lent_state(await read_node(api, node)) == (False, False, False)
    # a stale cache still showing the taint adopts nothing (the live node is read first)
    stale = await live_view(api, clock())
    object.__setattr__(stale.nodes[node], "taints", ({"key": LENT_TAINT_KEY, "effect": "NoSchedule"},))
    assert stale.nodes[node].reclaiming
    r = await LendingActuator(api, policy, clock=clock).apply([], stale)
    assert not r.reclaims_done and not r.applied and not r.errors


@aio
async def test_the_eviction_speaks_the_policy_version_discovery_handed_over(api: client.ApiClient, ns: str) -> None:
    """The controller discovers once at start and hands the answer over (``apis=``): the lender speaks what it was
    told, asks no discovery of its own, and a new term forgets it and asks the server again (1.20: v1beta1)."""
    node = await make_node(api, f"served-{uuid.uuid4().hex[:6]}", 1)
    clock = Clock()
    policy = LendingPolicy(enabled=True, max_reclaim_s=30)
    # told policy/v1 where the server (1.20) has only v1beta1: the lender believes it, and the server refuses
    told = ServedApis({"policy": ("v1",)})
    act = LendingActuator(api, policy, clock=clock, apis=told)
    await act.apply([LendGpus(node, (0,), "H100-80GB")], await live_view(api, clock()))
    await make_pod(api, ns, "train", node, labels=PRE, grace=5)
    clock.t += 1
    r = await act.apply([ReclaimGpus(node, (0,), (f"{ns}/train",), "shortfall", 30)], await live_view(api, clock()))
    assert not r.evicted and r.errors, "the handed-over versions were not the ones spoken"
    assert act.apis is told
    # a new term: what discovery said is forgotten; the server's own answer is asked and spoken
    act.new_term()
    assert act.apis is None
    clock.t += 1
    r = await act.apply([], await live_view(api, clock()))
    assert r.evicted == [f"{ns}/train"], (r.errors, r.skipped)
    assert act.apis is not None and act.apis.discovered and act.apis.pick(POLICY) == "v1beta1"


def test_the_workloads_path_follows_discovery() -> None:
    assert workloads_path(None) == "/apis/kueue.x-k8s.io/v1beta1/workloads"  # not discovered yet
    assert workloads_path(ASSUMED) == "/apis/kueue.x-k8s.io/v1beta1/workloads"  # discovery failed: no add-ons
    both = ServedApis({"kueue.x-k8s.io": ("v1beta2", "v1beta1")})
    assert workloads_path(both) == "/apis/kueue.x-k8s.io/v1beta2/workloads"
    assert workloads_path(ServedApis({"kueue.x-k8s.io": ("v1beta1",)})) == "/apis/kueue.x-k8s.io/v1beta1/workloads"


@aio
async def test_reclaim_of_a_node_not_lent_is_a_no_op_and_dry_run_writes_nothing(api: client.ApiClient,
                                                                               ns: str) -> None:
    node = await make_node(api, f"plain-{uuid.uuid4().hex[:6]}")
    await make_pod(api, ns, "train", node, labels=PRE)
    act = LendingActuator(api, LendingPolicy(enabled=True), clock=Clock())
    r = await act.apply([ReclaimGpus(node, (0,), (f"{ns}/train",), "forecast", 120)], await live_view(api, T0))
    assert r.why(f"reclaim {node}") == ["not-lent"] and not r.evicted and not act.reclaims
    dry = LendingActuator(api, LendingPolicy(enabled=True), dry_run=True, clock=Clock())
    await LendingActuator(api, LendingPolicy(enabled=True), clock=Clock()).apply(
        [LendGpus(node, (0, 1), "H100-80GB")], await live_view(api, T0))  # (the pod is preemptible: lendable)
    r = await dry.apply([ReclaimGpus(node, (0, 1), (f"{ns}/train",), "forecast", 120)], await live_view(api, T0))
    assert r.why("reclaim") == ["dry-run"] and lent_state(await read_node(api, node)) == (True, True, True)
    assert not (await read_pod(api, ns, "train"))["metadata"].get("deletionTimestamp")


# -- Kueue mode -----------------------------------------------------------------------------------------------------


@pytest_asyncio.fixture
async def kueue_crds(api: client.ApiClient) -> AsyncIterator[None]:
    """The minimal Kueue CRDs, installed and Established; removed afterwards (other tests expect no Kueue)."""
    async with kueue_installed(api):
        yield


@aio
async def test_kueue_mode_sets_the_lending_limit_and_deactivates_in_order(api: client.ApiClient, ns: str,
                                                                          kueue_crds: None) -> None:
    custom, core, batch = client.CustomObjectsApi(api), client.CoreV1Api(api), client.BatchV1Api(api)
    sfx = uuid.uuid4().hex[:6]
    cq_name = f"inference-{sfx}"
    await custom.create_cluster_custom_object("kueue.x-k8s.io", "v1beta1", "clusterqueues", {
        "apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "ClusterQueue", "metadata": {"name": cq_name},
        "spec": {"cohort": "gpus", "namespaceSelector": {}, "resourceGroups": [
            {"coveredResources": ["cpu"], "flavors": [{"name": "default-flavor", "resources": [
                {"name": "cpu", "nominalQuota": "96"}]}]},
            {"coveredResources": ["nvidia.com/gpu"], "flavors": [{"name": "default-flavor", "resources": [
                {"name": "nvidia.com/gpu", "nominalQuota": 8, "lendingLimit": 0}]}]}]}})
    policy = LendingPolicy(enabled=True, mode="kueue", max_reclaim_s=90, kueue_cluster_queue=cq_name)

    async def limit() -> Any:
        cq = await custom.get_cluster_custom_object("kueue.x-k8s.io", "v1beta1", "clusterqueues", cq_name)
        return cq["spec"]["resourceGroups"][1]["flavors"][0]["resources"][0].get("lendingLimit")

    n1, n2 = await make_node(api, f"kq1-{sfx}", 4), await make_node(api, f"kq2-{sfx}", 4)
    # two training Jobs admitted through Kueue: a labelled one whose Workload is labelled too, and one whose
    # Workload carries no label (found by its owner reference at reclaim time)
    jobs, workloads = {}, {}
    for name, labelled_wl in (("ja", True), ("jb", False)):
        job = await batch.create_namespaced_job(ns, {
            "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "labels": PRE},
            "spec": {"suspend": False, "template": {"metadata": {"labels": PRE}, "spec": {
                "restartPolicy": "Never", "containers": [{"name": "t", "image": "registry.invalid/t",
                                                          "resources": {"limits": {"nvidia.com/gpu": "2"}}}]}}}})
        jobs[name] = api.sanitize_for_serialization(job)
        owner = {"apiVersion": "batch/v1", "kind": "Job", "name": name, "uid": job.metadata.uid, "controller": True}
        wl = await custom.create_namespaced_custom_object("kueue.x-k8s.io", "v1beta1", ns, "workloads", {
            "apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "Workload",
            "metadata": {"name": f"job-{name}-{sfx}", "labels": PRE if labelled_wl else {}, "ownerReferences": [owner]},
            "spec": {"queueName": "training", "podSets": [{"name": "main", "count": 1, "template": {"spec": {
                "containers": [{"name": "t", "resources": {"limits": {"nvidia.com/gpu": "2"}}}]}}}]}})
        workloads[name] = wl
        assert wl["spec"]["active"] is True  # the CRD's default
        await make_pod(api, ns, f"{name}-0", n1, labels={**PRE, "job-name": name}, owner=owner, gpus=2)

    async def training() -> list[dict]:
        s = api.sanitize_for_serialization
        listed = await custom.list_namespaced_custom_object("kueue.x-k8s.io", "v1beta1", ns, "workloads")
        return [*s(await batch.list_namespaced_job(ns))["items"],
                *[w for w in listed["items"] if (w["metadata"].get("labels") or {}).get(PREEMPTIBLE_LABEL)]]

    clock = Clock()
    act = LendingActuator(api, policy, clock=clock)
    view = await live_view(api, clock(), policy, await training())
    assert len(view.snapshot.lent) == 4 and {n for n, _ in view.snapshot.lent} == {n1}  # what training holds
    # dry run: nothing
    r = await LendingActuator(api, policy, dry_run=True, clock=clock).apply([LendGpus(n2, (0, 1), "H100-80GB")],
                                                                          view)
    assert r.why(f"lend {n2}") == ["dry-run"] and await limit() == 0
    # lend 2 more: the limit is what is lent (4) plus the new ones
    r = await act.apply([LendGpus(n2, (0, 1), "H100-80GB", "surplus")], view)
    assert not r.errors, r.errors
    assert await limit() == "6" and r.lends == 1
    r = await act.apply([LendGpus(n2, (0, 1), "H100-80GB")], view)  # again: unchanged, no write
    assert r.lends == 0 and any(why == "unchanged" for _, why in r.skipped)

    # reclaim n1: jb first, then ja (the plan's preemption order)
    clock.t += 3
    decided = clock.t
    view = await live_view(api, clock(), policy, await training())
    r = await act.apply([ReclaimGpus(n1, (0, 1, 2, 3), (f"{ns}/jb", f"{ns}/ja"), "forecast", 90)], view)
    assert not r.errors, r.errors
    assert await limit() == "0", "n1's 4 GPUs come back, n2's 2 were never used: the limit is what stays lent"
    assert r.deactivated == [f"{ns}/job-jb-{sfx}", f"{ns}/job-ja-{sfx}"]
    for name in ("ja", "jb"):
        wl = await custom.get_namespaced_custom_object("kueue.x-k8s.io", "v1beta1", ns, "workloads",
                                                       f"job-{name}-{sfx}")
        assert wl["spec"]["active"] is False
    assert r.pending and not r.reclaims_done and not r.evicted  # Kueue removes the pods, not us
    # Kueue (played here) evicts the deactivated workloads: their pods go
    clock.t += 40
    for name in ("ja", "jb"):
        await core.delete_namespaced_pod(f"{name}-0", ns, grace_period_seconds=0)
    r = await act.apply([], await live_view(api, clock(), policy, await training()))
    (done,) = r.reclaims_done
    assert (done.node, done.seconds, done.late) == (n1, clock.t - decided, False)
    assert not act.reclaims
    # the ClusterQueue lost nothing else
    cq = await custom.get_cluster_custom_object("kueue.x-k8s.io", "v1beta1", "clusterqueues", cq_name)
    assert cq["spec"]["cohort"] == "gpus"
    assert cq["spec"]["resourceGroups"][0]["flavors"][0]["resources"] == [{"name": "cpu", "nominalQuota": "96"}]
    # a ClusterQueue that does not exist is an error for the lends, nothing else breaks
    missing = LendingActuator(api, LendingPolicy(enabled=True, mode="kueue", kueue_cluster_queue="nope"),
                              clock=clock)
    r = await missing.apply([LendGpus(n2, (0,), "H100-80GB")], await live_view(api, clock(), policy))
    assert r.errors and "ClusterQueue nope" in r.errors[0] and r.why(f"lend {n2}") == ["error"]


# -- the chart's RBAC: enough for lending in both modes, and nothing without it ---------------------------------------

CHART = Path(__file__).resolve().parents[2] / "charts" / "slotwise"


def _cluster_role(helm: Any, *args: str) -> dict:
    done = helm.run("template", "rel", str(CHART), "--namespace", "slotwise-system", *args, check=True)
    (role,) = [d for d in yaml.safe_load_all(done.stdout) if d and d["kind"] == "ClusterRole"]
    return role


def _grants(role: dict) -> set[tuple[str, str, str]]:
    return {(g, r, v) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"]
            for v in rule["verbs"]}


def test_chart_rbac_grants_lending_writes_only_with_lending_on(helm: Any) -> None:
    lending_writes = {("", "pods/eviction", "create"), ("kueue.x-k8s.io", "clusterqueues", "patch"),
                      ("kueue.x-k8s.io", "workloads", "patch"), ("", "nodes", "patch")}
    # (rbac.cleanup off: the clean-up verbs a switched-off feature keeps are granted by default, issue 16)
    assert not _grants(_cluster_role(helm, "--set", "rbac.cleanup=false")) & lending_writes
    dry = _grants(_cluster_role(helm, "--set", "config.lending.enabled=true", "--set", "config.actuator.dry_run=true"))
    assert not dry & lending_writes
    pods = _grants(_cluster_role(helm, "--set", "config.lending.enabled=true"))
    assert {("", "pods/eviction", "create"), ("", "nodes", "get"), ("", "nodes", "patch"), ("", "pods", "get")} <= pods
    assert not {g for g in pods if g[1] == "clusterqueues"} and ("kueue.x-k8s.io", "workloads", "patch") not in pods
    kueue_role = _cluster_role(helm, "-f", str(CHART / "ci" / "lending-values.yaml"), "--set", "rbac.cleanup=false")
    kueue = _grants(kueue_role)
    assert {("", "pods/eviction", "create"), ("kueue.x-k8s.io", "workloads", "patch"),
            ("kueue.x-k8s.io", "clusterqueues", "patch")} <= kueue
    assert ("", "nodes", "patch") not in kueue
    (cq_rule,) = [r for r in kueue_role["rules"] if "clusterqueues" in r["resources"]]
    assert cq_rule["resourceNames"] == ["inference-gpus"] and set(cq_rule["verbs"]) == {"get", "patch"}


@pytest_asyncio.fixture
async def as_chart_role(kube_apiserver: KubeApiserver, api: client.ApiClient, helm: Any) -> AsyncIterator[Any]:
    """make(*helm args) -> an API client acting as a user bound to the ClusterRole the chart renders for them."""
    rbac = client.RbacAuthorizationV1Api(api)
    made: list[tuple[str, client.ApiClient]] = []

    async def make(*args: str) -> client.ApiClient:
        name = f"slotwise-lending-{uuid.uuid4().hex[:6]}"
        role = _cluster_role(helm, *args)
        role["metadata"] = {"name": name}
        await rbac.create_cluster_role(role)
        await rbac.create_cluster_role_binding({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
            "subjects": [{"kind": "User", "name": name, "apiGroup": "rbac.authorization.k8s.io"}]})
        user = client.ApiClient(configuration=kube_apiserver.client_configuration(), header_name="Impersonate-User",
                                header_value=name)
        made.append((name, user))
        return user

    yield make
    for name, user in made:
        await user.close()
        with contextlib.suppress(ApiException):
            await rbac.delete_cluster_role_binding(name)
        with contextlib.suppress(ApiException):
            await rbac.delete_cluster_role(name)


@aio
async def test_chart_rbac_is_enough_for_pods_mode_lending(api: client.ApiClient, ns: str, as_chart_role: Any) -> None:
    user = await as_chart_role("--set", "config.lending.enabled=true")
    node = await make_node(api, f"rbac-{uuid.uuid4().hex[:6]}", 1)
    clock = Clock()
    act = LendingActuator(user, LendingPolicy(enabled=True, max_reclaim_s=30), clock=clock)
    r = await act.apply([LendGpus(node, (0,), "H100-80GB")], await live_view(api, clock()))
    assert r.lends == 1 and not r.errors, r.errors
    await make_pod(api, ns, "train", node, labels=PRE, grace=10)
    clock.t += 1
    r = await act.apply([ReclaimGpus(node, (0,), (f"{ns}/train",), "forecast", 30)], await live_view(api, clock()))
    assert r.evicted == [f"{ns}/train"] and not r.errors, r.errors
    await client.CoreV1Api(api).delete_namespaced_pod("train", ns, grace_period_seconds=0)
    r = await act.apply([], await live_view(api, clock()))
    assert len(r.reclaims_done) == 1 and not r.errors, r.errors
    # the read-only role of the default chart cannot lend: the chart's least privilege is real
    plain = await as_chart_role("--set", "rbac.cleanup=false")
    r = await LendingActuator(plain, LendingPolicy(enabled=True), clock=clock).apply(
        [LendGpus(node, (0,), "H100-80GB")], await live_view(api, clock()))
    assert r.errors and "403" in r.errors[0]
    assert lent_state(await read_node(api, node)) == (False, False, False)


@aio
async def test_chart_rbac_is_enough_for_kueue_mode_lending(api: client.ApiClient, ns: str, as_chart_role: Any,
                                                           kueue_crds: None) -> None:
    custom, batch = client.CustomObjectsApi(api), client.BatchV1Api(api)
    cq = f"inference-{uuid.uuid4().hex[:6]}"
    user = await as_chart_role("-f", str(CHART / "ci" / "lending-values.yaml"),
                               "--set", f"config.lending.kueue_cluster_queue={cq}")
    await custom.create_cluster_custom_object("kueue.x-k8s.io", "v1beta1", "clusterqueues", {
        "apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "ClusterQueue", "metadata": {"name": cq},
        "spec": {"resourceGroups": [{"coveredResources": ["nvidia.com/gpu"], "flavors": [
            {"name": "h100", "resources": [{"name": "nvidia.com/gpu", "nominalQuota": 4}]}]}]}})
    node = await make_node(api, f"rbac-kq-{uuid.uuid4().hex[:6]}", 2)
    job = await batch.create_namespaced_job(ns, {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j", "labels": PRE},
        "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [
            {"name": "t", "image": "registry.invalid/t", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}}})
    owner = {"apiVersion": "batch/v1", "kind": "Job", "name": "j", "uid": job.metadata.uid}
    await custom.create_namespaced_custom_object("kueue.x-k8s.io", "v1beta1", ns, "workloads", {
        "apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "Workload",  # unlabelled: found by listing (RBAC list)
        "metadata": {"name": "job-j-0", "ownerReferences": [owner]},
        "spec": {"podSets": [{"name": "main", "count": 1}]}})
    await make_pod(api, ns, "j-0", node, labels=PRE, owner=owner)
    policy = LendingPolicy(enabled=True, mode="kueue", max_reclaim_s=90, kueue_cluster_queue=cq, kueue_flavor="h100")
    jobs = api.sanitize_for_serialization(await batch.list_namespaced_job(ns))["items"]
    clock = Clock()
    act = LendingActuator(user, policy, clock=clock)
    r = await act.apply([LendGpus(node, (1,), "H100-80GB")], await live_view(api, clock(), policy, jobs))
    assert r.lends == 1 and not r.errors, r.errors
    r = await act.apply([ReclaimGpus(node, (0, 1), (f"{ns}/j",), "shortfall", 90)],
                        await live_view(api, clock(), policy, jobs))
    assert r.deactivated == [f"{ns}/job-j-0"] and not r.errors, r.errors
    await client.CoreV1Api(api).delete_namespaced_pod("j-0", ns, grace_period_seconds=0)
    r = await act.apply([], await live_view(api, clock(), policy, jobs))
    assert len(r.reclaims_done) == 1 and not r.errors, r.errors
