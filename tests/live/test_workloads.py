"""Workload kinds (``autoscaler.live.kube.workloads``) and how the translation reads them: StatefulSets, Argo
Rollouts and LeaderWorkerSets as models, a LeaderWorkerSet replica being a group of pods. Pure: dicts shaped as the
API serves them (``tests/live/test_kube_translate.py``'s builders). Against the real apiserver:
``test_workloads_kube.py``."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from test_kube_translate import NS, T0_EPOCH, at, deployment, gpu_node, pod, view

from autoscaler.estimation.cold_start import ReadyTracker
from autoscaler.live.kube.discovery import ARGO_ROLLOUTS, LEADERWORKERSET, ServedApis
from autoscaler.live.kube.workloads import (
    DEPLOYMENT,
    LEADERWORKERSET_KIND,
    LWS_GROUP_INDEX_LABEL,
    LWS_NAME_LABEL,
    LWS_WORKER_INDEX_LABEL,
    ROLLOUT,
    STATEFULSET,
    by_name,
    group_pods,
    kind_of,
    workload_ref,
)


def statefulset(name: str, replicas: int = 2, **kw: Any) -> dict:
    obj = deployment(name, replicas=replicas, **kw)
    obj["kind"] = "StatefulSet"
    obj["spec"]["serviceName"] = name
    return obj


def rollout(name: str, replicas: int = 2, **kw: Any) -> dict:
    obj = deployment(name, replicas=replicas, **kw)
    obj["kind"], obj["apiVersion"] = "Rollout", "argoproj.io/v1alpha1"
    obj["spec"]["strategy"] = {"canary": {"steps": [{"setWeight": 20}]}}
    return obj


def lws(name: str, replicas: int = 2, size: int = 4, *, leader: bool = False, ns: str = NS,
        annotations: dict[str, str] | None = None) -> dict:
    template = {"metadata": {"labels": {"app": name}},
                "spec": {"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
                         "containers": [{"name": "vllm", "image": "vllm/vllm-openai:v0.11.0",
                                         "resources": {"limits": {"nvidia.com/gpu": "8"}}}]}}
    lwt: dict[str, Any] = {"size": size, "workerTemplate": template}
    if leader:
        lead = copy.deepcopy(template)
        lead["spec"]["containers"][0]["name"] = "vllm-leader"
        lwt["leaderTemplate"] = lead
    return {"kind": "LeaderWorkerSet", "apiVersion": "leaderworkerset.x-k8s.io/v1",
            "metadata": {"name": name, "namespace": ns, "uid": f"uid-{name}",
                         "annotations": {"slotwise.io/slo-latency-ms": "500", "slotwise.io/gpus-per-replica": "8",
                                         **(annotations or {})}},
            "spec": {"replicas": replicas, "leaderWorkerTemplate": lwt, "startupPolicy": "LeaderCreated"}}


def lws_pod(set_name: str, group: int, worker: int, node: str, *, ready: bool = True, created: str = at(0),
            deleting: bool = False) -> dict:
    name = f"{set_name}-{group}" if worker == 0 else f"{set_name}-{group}-{worker}"
    return pod(name, node=node, gpus={"nvidia.com/gpu": "8"}, ready=ready, created=created, deleting=deleting,
               labels={LWS_NAME_LABEL: set_name, LWS_GROUP_INDEX_LABEL: str(group),
                       LWS_WORKER_INDEX_LABEL: str(worker)})


NODES = [gpu_node(f"gpu-{i}") for i in range(8)]
WIDE = [gpu_node(f"gpu-{i}") for i in range(16)]


# -- the kinds ----------------------------------------------------------------------------------------------------
def test_kinds_paths_templates_and_selectors() -> None:
    assert LEADERWORKERSET_KIND.api == LEADERWORKERSET and ROLLOUT.api == ARGO_ROLLOUTS
    assert STATEFULSET.scale_path("v1", "ml", "db") == "/apis/apps/v1/namespaces/ml/statefulsets/db/scale"
    assert LEADERWORKERSET_KIND.scale_path("v1", "ml", "big") == (
        "/apis/leaderworkerset.x-k8s.io/v1/namespaces/ml/leaderworkersets/big/scale")
    assert ServedApis({"argoproj.io": ("v1alpha1",)}).pick(ROLLOUT.api) == "v1alpha1"
    obj = lws("big", leader=True)
    paths = [p for p, _ in LEADERWORKERSET_KIND.templates(obj)]
    assert paths == ["/spec/leaderWorkerTemplate/workerTemplate", "/spec/leaderWorkerTemplate/leaderTemplate"]
    assert LEADERWORKERSET_KIND.template(obj)["spec"]["containers"][0]["name"] == "vllm"  # the workers'
    assert LEADERWORKERSET_KIND.containers(obj, "vllm") == [("/spec/leaderWorkerTemplate/workerTemplate", 0),
                                                            ("/spec/leaderWorkerTemplate/leaderTemplate", 0)]
    assert STATEFULSET.containers(statefulset("s"), "sidecar") == [("/spec/template", 1)]
    assert STATEFULSET.containers(statefulset("s"), "nope") == []
    assert LEADERWORKERSET_KIND.selector(obj) == {"matchLabels": {LWS_NAME_LABEL: "big"}}
    assert LEADERWORKERSET_KIND.group_size(obj) == 4 and STATEFULSET.group_size(statefulset("s")) == 1
    del obj["spec"]["leaderWorkerTemplate"]["size"]
    assert LEADERWORKERSET_KIND.group_size(obj) == 1  # the upstream default
    assert kind_of(obj) is LEADERWORKERSET_KIND and kind_of(rollout("r")) is ROLLOUT
    assert kind_of({"kind": "StatefulSet", "apiVersion": "apps/v1"}) is STATEFULSET
    assert kind_of({"kind": "Rollout", "apiVersion": "other.io/v1"}) is None
    assert kind_of({}, DEPLOYMENT) is DEPLOYMENT
    assert by_name("LeaderWorkerSet", "leaderworkerset.x-k8s.io/v1") is LEADERWORKERSET_KIND
    # pods mode of removal: only ReplicaSets honour pod-deletion-cost
    assert DEPLOYMENT.deletion_cost and ROLLOUT.deletion_cost
    assert not STATEFULSET.deletion_cost and not LEADERWORKERSET_KIND.deletion_cost
    ref = rollout("r")
    ref["spec"]["workloadRef"] = {"apiVersion": "apps/v1", "kind": "Deployment", "name": "base"}
    assert workload_ref(ref) == ("Deployment", "base") and workload_ref(rollout("r")) is None


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 4)), unique=True, max_size=20))
def test_group_pods_puts_every_labelled_pod_in_exactly_one_group(pods: list[tuple[int, int]]) -> None:
    labelled = [(f"ml/s-{g}-{w}", {LWS_GROUP_INDEX_LABEL: str(g), LWS_WORKER_INDEX_LABEL: str(w)}) for g, w in pods]
    groups = group_pods([*labelled, ("ml/stray", {})])
    seen = [k for g in groups.values() for k in ((g.leader,) if g.leader else ()) + g.workers]
    assert sorted(seen) == sorted(k for k, _ in labelled)
    for idx, g in groups.items():
        assert (g.leader is not None) == ((int(idx), 0) in pods)
    assert list(groups) == sorted(groups, key=int)


# -- translation --------------------------------------------------------------------------------------------------
def test_a_statefulset_and_a_rollout_are_models_like_a_deployment() -> None:
    sts, ro = statefulset("db-llm", replicas=2), rollout("canary-llm", replicas=3)
    pods = [pod("db-llm-0", "db-llm", node="gpu-0"), pod("db-llm-1", "db-llm", node="gpu-0", ready=False),
            pod("canary-llm-7f-abc", "canary-llm", node="gpu-1")]
    v = view([deployment("plain")], pods, NODES, workloads=[sts, ro])
    assert sorted(v.models) == ["ml/canary-llm", "ml/db-llm", "ml/plain"]
    m = v.models["ml/db-llm"]
    assert (m.kind, m.api_version, m.resource, m.group_size, m.replicas) == ("StatefulSet", "apps/v1",
                                                                              "statefulsets", 1, 2)
    assert (v.models["ml/canary-llm"].kind, v.models["ml/canary-llm"].resource) == ("Rollout", "rollouts")
    assert v.models["ml/plain"].kind == "Deployment"
    obs = v.snapshot.models["ml/db-llm"]
    assert [(r.replica_id, r.ready) for r in obs.replicas] == [("ml/db-llm-0", True), ("ml/db-llm-1", False)]
    assert obs.spec is not None and obs.spec.pods_per_replica == 1
    assert all(r.slot is not None for r in obs.replicas)
    assert len(v.snapshot.models["ml/canary-llm"].replicas) == 1 and not v.problems


def test_a_rollout_with_a_workload_ref_reads_the_deployments_template() -> None:
    base = deployment("base", managed=False, replicas=0,
                      resources={"limits": {"nvidia.com/mig-3g.40gb": "1"}})
    ro = rollout("ref-llm", replicas=2)
    del ro["spec"]["template"], ro["spec"]["selector"]
    ro["spec"]["workloadRef"] = {"apiVersion": "apps/v1", "kind": "Deployment", "name": "base"}
    v = view([base], [pod("base-x", "base", node="gpu-0")], NODES, workloads=[ro])
    m = v.models["ml/ref-llm"]
    assert m.container == "server" and m.resources == {"limits": {"nvidia.com/mig-3g.40gb": "1"}}
    assert [r.replica_id for r in v.snapshot.models["ml/ref-llm"].replicas] == ["ml/base-x"]  # its selector too
    v = view([], [], NODES, workloads=[ro])
    assert any("workloadRef Deployment ml/base not seen" in p for p in v.problems)
    assert v.models["ml/ref-llm"].container == ""


def test_a_name_two_kinds_share_is_one_model_and_unknown_kinds_are_none() -> None:
    odd = {**statefulset("x"), "kind": "CloneSet", "apiVersion": "apps.kruise.io/v1alpha1"}
    v = view([deployment("same")], [], NODES, workloads=[statefulset("same"), odd])
    assert list(v.models) == ["ml/same"] and v.models["ml/same"].kind == "Deployment"
    assert any("statefulset ml/same: a Deployment of the same name is the model" in p for p in v.problems)
    assert any("CloneSet ml/x" in p and "not a workload kind" in p for p in v.problems)
    # scope: other namespaces' workloads are no models
    assert not view([], [], NODES, workloads=[statefulset("s", ns="other")], namespace=NS).models


def test_a_leaderworkerset_replica_is_a_group() -> None:
    obj = lws("big", replicas=2, size=4)
    pods = [lws_pod("big", 0, w, f"gpu-{w}") for w in range(4)]  # group 0: all Ready
    pods += [lws_pod("big", 1, w, f"gpu-{4 + w}", ready=w != 2) for w in range(4)]  # group 1: one not Ready
    v = view([], pods, NODES, workloads=[obj])
    m = v.models["ml/big"]
    assert (m.kind, m.resource, m.group_size, m.replicas) == ("LeaderWorkerSet", "leaderworkersets", 4, 2)
    obs = v.snapshot.models["ml/big"]
    assert obs.spec is not None and obs.spec.pods_per_replica == 4 and obs.spec.gpus_per_replica == 8
    assert obs.desired_replicas == 2
    assert [(r.replica_id, r.ready) for r in obs.replicas] == [("ml/big-0", True), ("ml/big-1", False)]
    g0 = obs.replicas[0]
    assert g0.slot is not None and g0.slot.node == "gpu-0"
    assert [s.node for s in g0.group_slots] == ["gpu-1", "gpu-2", "gpu-3"]
    assert not v.problems


def test_a_group_missing_a_pod_or_its_leader_is_not_ready() -> None:
    obj = lws("big", replicas=2, size=3)
    pods = [lws_pod("big", 0, 0, "gpu-0"), lws_pod("big", 0, 1, "gpu-1")]  # worker 2 not created yet
    pods += [lws_pod("big", 1, 1, "gpu-2"), lws_pod("big", 1, 2, "gpu-3")]  # the leader is gone
    obs = view([], pods, NODES, workloads=[obj]).snapshot.models["ml/big"]
    assert [(r.replica_id, r.ready, r.slot is None, len(r.group_slots)) for r in obs.replicas] == [
        ("ml/big-0", False, False, 1), ("ml/big-1", False, True, 2)]


def test_a_group_with_a_pod_on_a_lost_node_is_draining_and_counted_unavailable() -> None:
    obj = lws("big", replicas=2, size=2)
    down = gpu_node("gpu-3")
    down["status"]["conditions"] = [{"type": "Ready", "status": "False"}]
    pods = [lws_pod("big", 0, 0, "gpu-0"), lws_pod("big", 0, 1, "gpu-1"),
            lws_pod("big", 1, 0, "gpu-2"), lws_pod("big", 1, 1, "gpu-3")]
    v = view([], pods, [*NODES[:3], down], workloads=[obj])
    assert [(r.ready, r.draining) for r in v.snapshot.models["ml/big"].replicas] == [(True, False), (False, True)]
    assert v.models["ml/big"].unavailable_replicas == 1  # one group, not one pod per group member
    pods[0] = lws_pod("big", 0, 0, "gpu-0", deleting=True)
    assert v.snapshot.models["ml/big"].replicas[0].draining is False
    assert view([], pods, NODES, workloads=[obj]).snapshot.models["ml/big"].replicas[0].draining


def test_a_groups_cold_start_runs_until_its_last_pod_is_ready() -> None:
    """The ReadyTracker measures a group from its first pod's creation to the tick its last pod is Ready."""
    obj = lws("big", replicas=1, size=3)
    tracker = ReadyTracker()

    def tick(minute: int, pods: list[dict]) -> list[float]:
        v = view([], pods, NODES, workloads=[obj])
        return tracker.update(v.snapshot.models["ml/big"], T0_EPOCH + minute * 60)

    leader = lws_pod("big", 0, 0, "gpu-0", created=at(0), ready=False)
    assert tick(1, [leader]) == []
    ready_leader = lws_pod("big", 0, 0, "gpu-0", created=at(0))
    w1 = lws_pod("big", 0, 1, "gpu-1", created=at(1), ready=False)
    w2 = lws_pod("big", 0, 2, "gpu-2", created=at(2))
    assert tick(3, [ready_leader, lws_pod("big", 0, 1, "gpu-1", created=at(1)), ]) == []  # worker 2 missing
    assert tick(4, [ready_leader, w1, w2]) == []  # worker 1 not Ready
    assert tick(7, [ready_leader, lws_pod("big", 0, 1, "gpu-1", created=at(1)), w2]) == [420.0]
    # a worker recreated under the same leader: not a new cold start
    assert tick(8, [ready_leader, lws_pod("big", 0, 1, "gpu-1", created=at(8), ready=False), w2]) == []
    assert tick(9, [ready_leader, lws_pod("big", 0, 1, "gpu-1", created=at(8)), w2]) == []


@settings(max_examples=40, deadline=None)
@given(size=st.integers(1, 4), members=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 3), st.booleans()),
                                                unique_by=lambda t: (t[0], t[1]), max_size=16))
def test_every_lws_pod_is_in_exactly_one_group_and_a_group_is_ready_only_whole(
        size: int, members: list[tuple[int, int, bool]]) -> None:
    members = [(g, w, ok) for g, w, ok in members if w < size]
    pods = [lws_pod("big", g, w, f"gpu-{g * 4 + w}", ready=ok) for g, w, ok in members]  # one 8-GPU node each
    obs = view([], pods, WIDE, workloads=[lws("big", replicas=4, size=size)]).snapshot.models["ml/big"]
    groups = {g for g, _, _ in members}
    assert [r.replica_id for r in obs.replicas] == [f"{NS}/big-{g}" for g in sorted(groups)]
    for r in obs.replicas:
        g = int(r.replica_id.rsplit("-", 1)[1])
        mine = [(w, ok) for gg, w, ok in members if gg == g]
        whole = len(mine) == size and all(ok for _, ok in mine)
        assert r.ready == whole
        has_leader = any(w == 0 for w, _ in mine)
        assert (r.slot is not None) == has_leader
        assert len(r.group_slots) == len(mine) - (1 if has_leader else 0)  # every worker's slot, none twice


def test_statefulsets_and_leaderworkersets_remove_by_index_deployments_and_rollouts_do_not() -> None:
    """A StatefulSet / LeaderWorkerSet scale-down takes its highest ordinals / group indices whatever the pods'
    pod-deletion-cost says: the observation says so (``removal_by_index``), so the decision names those replicas;
    a ReplicaSet (Deployment, Rollout) removes the pods slotwise marks."""
    pods = [pod("db-llm-0", "db-llm", node="gpu-0"), pod("plain-x", "plain", node="gpu-1")]
    pods += [lws_pod("big", 0, w, f"gpu-{2 + w}") for w in range(4)]
    v = view([deployment("plain")], pods, NODES,
             workloads=[statefulset("db-llm"), rollout("canary-llm"), lws("big", replicas=1)])
    flags = {k: o.removal_by_index for k, o in v.snapshot.models.items()}
    assert flags == {"ml/plain": False, "ml/canary-llm": False, "ml/db-llm": True, "ml/big": True}
    assert [r.replica_id for r in v.snapshot.models["ml/big"].replicas] == ["ml/big-0"]  # the leader: its index
