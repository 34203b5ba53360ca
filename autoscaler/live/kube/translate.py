"""Kubernetes objects (plain JSON dicts, as the API serves them) -> :class:`ClusterView`: a pure translation.

No I/O and no clock (``now`` is an argument): the informers hand over their caches, :func:`build_view` returns
the decision core's :class:`~autoscaler.api.snapshot.ClusterSnapshot` plus what acting on it needs. Anything that
cannot be understood becomes one line in ``ClusterView.problems`` and affects only the object concerned.

Kept as one module although long: it is one pass over the caches whose steps share its indexes (nodes by name,
live pods, slots held, nodes out of service), in an order that matters (the inventory is laid out before pods take
slots, lent GPUs and unusable DRA devices are held after them); the readers of each kind of object already live in
their own modules (``gpu_nodes``, ``dra``, ``workloads``, ``training``, ``routing``, ``host``).

What is read, and how (the details the tests pin down):

- **Managed models** are Deployments -- and the ``workloads`` of other kinds: StatefulSets, LeaderWorkerSets, Argo
  Rollouts (:mod:`~autoscaler.live.kube.workloads`) -- annotated ``slotwise.io/slo-latency-ms``; key
  ``"<ns>/<name>"``, which is also the ``ModelSpec.name`` (so packer anti-affinity and inventory model names are the
  snapshot's keys). A LeaderWorkerSet's replica is a group of pods: one :class:`Replica` per group (the leader's
  slot, the workers' in ``group_slots``, Ready only when every pod is) and ``pods_per_replica`` = its group size.
  Bad annotations give ``spec=None`` and a :class:`SpecError` naming the key, for that model only. A model
  whose template asks for a MIG profile but whose annotations give no ``gpu-memory-gib`` keeps the spec as
  parsed: nothing is inferred from the template.
- **Pods** belong to a model when in its namespace and matched by its ``spec.selector`` (matchLabels and
  matchExpressions); ownerReferences are not needed. A pod two managed selectors match goes to the first
  model by key (a problem line). Succeeded/Failed pods are ignored everywhere. A replica's slot is None when
  its pod is pending, on a node outside the inventory, asks for no GPU, or its slot cannot be allocated
  (the last with a problem line); it is still counted.
- **Scope**: the inventory is built from every pod and node given, cluster-wide, whatever the models' scope: a
  GPU that another namespace's pod holds is taken (the packer must not place on it, the MIG gate must not
  re-partition under it). Only the *models* are scoped: with ``namespace`` set, Deployments of other namespaces
  are not models (and their pods are nobody's replicas; they hold GPUs as ``pod:<ns>/<name>`` like any other).
- **GPU nodes** carry ``nvidia.com/gpu.product`` (GPU Feature Discovery) or GPU capacity. Cordoned nodes, nodes
  whose GPU the catalog does not know, and nodes out of service (NotReady, or the device plugin advertises none
  of their GPUs: :func:`~autoscaler.live.kube.gpu_nodes.out_of_service`) are left out of the inventory (the
  packer must not place there); every GPU node still gets a :class:`NodeInfo` (``out_of_service`` says why).
  A replica on a node out of service is no capacity: it is observed as draining (not active, not ready), and its
  model's :attr:`ManagedModel.unavailable_replicas` counts it (the ReplicaSet still does, until it is evicted).
- **MIG layouts** are not visible in the API, only counts per profile (``nvidia.com/mig-<profile>``
  capacity, mixed strategy; or the single strategy's overloaded ``nvidia.com/gpu``). They are rebuilt as a
  mig-parted ``devices: all`` config lays them out: profiles largest first, instances spread round-robin over
  the node's MIG GPUs, each GPU at a legal layout of what it got (:func:`sharing.mig_layout.distribute_mig_instances`);
  what fits nowhere is a problem line. On a node with both, the MIG GPUs are taken to be the first indices and
  the plain (``nvidia.com/gpu``) ones the rest. Starts are legal but not necessarily the driver's.
- **Which device a pod holds** is not visible either (the device plugin decides): pods are allocated oldest
  first, each on the first free device or instance that fits, so the result is deterministic. Pods of
  other workloads (training, unmanaged Deployments) are allocated too, under the model name
  ``pod:<ns>/<name>`` (:data:`UNMANAGED_MODEL_PREFIX`), so the packer sees their GPUs as taken.
- **Time-sliced GPUs** (``nvidia.com/gpu.replicas`` > 1, or ``nvidia.com/mig-<profile>.replicas`` > 1 for a MIG
  profile) hold shares: memory = the model's ``gpu-memory-gib``, else an equal part of what the reserve leaves
  (``(memory - share_reserve_gib) / replicas``); compute = one replica's time slice (``1 / replicas`` of the
  GPU or instance), which can never over-subscribe since the device plugin hands out at most ``replicas``.
- **Lent GPUs** (``ClusterSnapshot.lent``, allocated whole to ``lent_owner(node, dev)`` under ``LENT_MODEL``, so
  the packer never places inference there and never counts them free). *Pods mode* lends whole nodes: a node
  labelled ``slotwise.io/lent=true``, or still tainted ``slotwise.io/lent`` while a reclaim is in flight, has every
  GPU lent since its ``slotwise.io/lent-since`` annotation. Pods labelled ``slotwise.io/preemptible=true`` on it
  are the borrowers: not allocated themselves (the lent allocation covers the node). Any other pod there keeps
  its GPU, which is then not lent (a problem line). *Kueue mode* (``lending.mode == "kueue"``) has no per-node
  state: the inference ClusterQueue's ``lendingLimit`` caps how many GPUs training may borrow, and kube-scheduler
  puts the training pods wherever GPUs are free. So what is lent is what training holds: every whole
  ``nvidia.com/gpu`` a pod of a preemptible training workload (its Job, Workload, or the pod itself) holds is lent
  on that node, since the workload started (Kueue: admitted). The count the core sees is then exactly the GPUs
  the cohort borrows now, and a reclaim names the nodes and workloads that hold them. MIG instances and
  time-sliced shares of training pods stay the pods' own in both modes (lending is by whole GPUs).
- **Training workloads** come with a :class:`TrainingRef` each (``ClusterView.training``): their live pods and the
  Kueue Workloads that admit them, which the lending actuator evicts or deactivates on a reclaim.

The readers live beside this module, one idea each: :mod:`~autoscaler.live.kube.fields` (single fields),
:mod:`~autoscaler.live.kube.selector` (label selectors), :mod:`~autoscaler.live.kube.gpu_nodes` (what a GPU node
offers, what a pod asks for and which slot it takes), :mod:`~autoscaler.live.kube.pods` (live pods),
:mod:`~autoscaler.live.kube.training` (training workloads); the MIG layout search is
:mod:`sharing.mig_layout`. :func:`build_view` runs them in order, one named step each.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from autoscaler.api.snapshot import ClusterSnapshot, ModelObservation, Replica, TrainingWorkload
from autoscaler.api.spec import ModelSpec, SpecError, is_managed, parse_annotations
from autoscaler.live.kube.autoscalers import mark_autoscaled
from autoscaler.live.kube.dra import (
    DraInventory,
    DraNode,
    dra_slot,
    hold_unusable,
    index_claims,
    pod_devices,
    read_slices,
)
from autoscaler.live.kube.dra_claims import template_claims, with_claimed_resources
from autoscaler.live.kube.fields import condition, grace_s, metadata, parse_count, parse_time
from autoscaler.live.kube.gpu_nodes import GpuNode, find_slot, is_gpu_node, lay_out, out_of_service, read_gpu_node
from autoscaler.live.kube.host import hold_host, node_with_host, slot_with_host, spec_with_host
from autoscaler.live.kube.objects import (
    LENT_LABEL,
    LENT_SINCE_ANNOTATION,
    PREEMPTIBLE_LABEL,
    ClusterView,
    ManagedModel,
    NodeInfo,
    PodRef,
    TrainingRef,
    has_lent_taint,
    object_key,
)
from autoscaler.live.kube.pods import LivePod, live_pods
from autoscaler.live.kube.routing import model_service, with_routing
from autoscaler.live.kube.selector import Selector, SelectorError
from autoscaler.live.kube.training import read_training
from autoscaler.live.kube.workloads import (
    DEPLOYMENT,
    KINDS,
    ROLLOUT,
    WorkloadKind,
    group_pods,
    kind_of,
    leader_key,
    workload_ref,
)
from sharing.catalog import Catalog, load_catalog
from sharing.lending import LENT_MODEL, LendingPolicy, lent_owner
from sharing.slots import Inventory, Slot, SlotKind

# Inventory model name of a GPU pod that is no managed model's replica. ":" cannot occur in a namespace or a
# Deployment name, so these never collide with a model key.
UNMANAGED_MODEL_PREFIX = "pod:"


def build_view(
    deployments: Iterable[dict],
    pods: Iterable[dict],
    nodes: Iterable[dict],
    training: Iterable[dict] = (),
    *,
    now: float,
    catalog: Catalog | None = None,
    share_reserve_gib: float = 1.0,
    lending: LendingPolicy | None = None,
    namespace: str | None = None,
    workloads: Iterable[dict] = (),
    autoscalers: Iterable[dict] = (),
    resource_slices: Iterable[dict] = (),
    resource_claims: Iterable[dict] = (),
    resource_claim_templates: Iterable[dict] = (),
    endpoint_slices: Iterable[dict] | None = None,
    device_classes: Iterable[dict] | None = None,
    device_taint_rules: Iterable[dict] = (),
) -> ClusterView:
    """One read of the caches -> the decision core's snapshot, the managed models, GPU node info, problems.

    Pure and deterministic: the same objects (in any order) give the same view. ``lending`` (the controller's
    lending settings) only matters in Kueue mode, where the GPUs training pods hold are what is lent (module
    docstring, "Lent GPUs"); nodes lent in pods mode are read from their label/taint whatever the settings.
    ``namespace`` (the controller's scope; None: all) limits which Deployments are models; ``pods`` and ``nodes``
    must be the whole cluster's, so that the inventory sees every GPU in use. Problem lines come in the order of
    the steps below.

    Issue 17's inputs (each object as served, with ``kind`` and ``apiVersion`` set): ``workloads``, the scalable
    workloads other than Deployments (StatefulSets, LeaderWorkerSets, Argo Rollouts) that may be models;
    ``autoscalers``, the HorizontalPodAutoscalers and KEDA ScaledObjects (a model they target is not scaled by
    slotwise); ``resource_slices`` and ``resource_claims`` (``resource.k8s.io``), the GPUs a DRA driver publishes
    and which of them pods hold; ``resource_claim_templates``, what a model whose pods claim their GPU asks for.
    ``endpoint_slices`` (issue 18): the controller's activator EndpointSlices; None when the activator is not
    enabled (every ``via_activator`` None), else a model with a Service goes through the activator when its slice
    is there with endpoints (:mod:`~autoscaler.live.kube.routing`). ``device_classes`` (issue 30): the served
    DeviceClasses; None: not read (only device taints keep devices out, :func:`~autoscaler.live.kube.dra.
    read_slices`); ``device_taint_rules``, the DeviceTaintRules (alpha) that taint devices beside their slices.
    """
    cat = catalog if catalog is not None else load_catalog()
    problems: list[str] = []

    node_objs, gpu_nodes, down = _read_nodes(nodes, cat, problems, resource_slices, device_classes,
                                             device_taint_rules)
    inventory = Inventory.from_nodes([g.spec for g in gpu_nodes.values()], cat, share_reserve_gib)
    for gn in gpu_nodes.values():
        lay_out(inventory, gn, problems)

    live = live_pods(pods, now)
    models = _read_models(deployments, live, problems, namespace, workloads)
    models.models.update(mark_autoscaled(models.models, autoscalers, problems))  # an HPA/KEDA scales these
    models.models.update(with_claimed_resources(models.models, resource_claim_templates, problems))  # DRA: claims
    _count_unavailable(models, down)
    workloads, training_refs = read_training(training, live, cat, problems)

    lent_nodes = _lent_nodes(node_objs, now, problems)
    kueue = lending is not None and lending.mode == "kueue"
    lent: dict[tuple[str, int], float] = {}
    slots = _allocate_pods(inventory, live, gpu_nodes, lent_nodes, models,
                           _borrowers(workloads, training_refs) if kueue else {}, lent, problems, resource_claims)
    for name, since in sorted(lent_nodes.items()):
        gn = gpu_nodes.get(name)
        if gn is not None:
            _allocate_lent(inventory, gn, since, lent, problems)
    for gn in gpu_nodes.values():
        if isinstance(gn, DraNode):
            hold_unusable(inventory, gn)  # tainted / unselected devices: what pods do not hold is nobody's
    hold_host(inventory, live, slots, problems)  # what pods without a slot request on the nodes (host.py)

    observations = with_routing(_observations(models, slots, down), models.models, endpoint_slices)
    snapshot = ClusterSnapshot(now=now, models=observations, inventory=inventory,
                               training=workloads, lent=dict(sorted(lent.items())))
    return ClusterView(snapshot=snapshot, models=models.models,
                       nodes=_node_infos(node_objs, live, models.owner_of, down),
                       problems=problems, training=training_refs)


# -- nodes ---------------------------------------------------------------------------------------------------
def _read_nodes(
    nodes: Iterable[Mapping[str, Any]], catalog: Catalog, problems: list[str],
    resource_slices: Iterable[Mapping[str, Any]] = (),
    device_classes: Iterable[Mapping[str, Any]] | None = None,
    device_taint_rules: Iterable[Mapping[str, Any]] = (),
) -> tuple[dict[str, Mapping[str, Any]], dict[str, GpuNode], dict[str, str]]:
    """Every GPU node by name (each gets a NodeInfo), those that go into the inventory (schedulable, in service,
    with a GPU the catalog knows), and those out of service with why. By name, so the inventory's order does not
    depend on the informer's.

    A node the NVIDIA DRA driver's ResourceSlices name is read from them (:func:`~autoscaler.live.kube.dra.
    read_slices`: a :class:`~autoscaler.live.kube.dra.DraNode`), whatever its labels say; every other node from
    the device plugin's labels and capacity. One inventory either way."""
    nodes = sorted(nodes, key=lambda n: str(metadata(n).get("name")))
    slices = list(resource_slices)
    labels = {str(metadata(n).get("name")): metadata(n).get("labels") or {} for n in nodes}
    dra = read_slices(slices, catalog, labels, device_classes, device_taint_rules) if slices else DraInventory()
    problems.extend(dra.problems)
    problems.extend(f"node {name}: DRA ResourceSlices name it, but no such Node is listed; left out"
                    for name in sorted(set(dra.nodes) - set(labels)))
    node_objs: dict[str, Mapping[str, Any]] = {}
    gpu_nodes: dict[str, GpuNode] = {}
    down: dict[str, str] = {}
    for node in nodes:
        name = str(metadata(node).get("name"))
        on_dra = dra.named(name)
        if not on_dra and not is_gpu_node(node):
            continue
        node_objs[name] = node
        why = out_of_service(node)
        if why is not None:
            down[name] = why  # no capacity now, and its replicas are none either
        # a DRA pool being republished (fewer slices than it says): no new placement there this read, but its pods
        # are not lost (the driver rewrites its slices; a transient read must not look like a node going away)
        republishing = dra.incomplete.get(name)
        if republishing is not None:
            problems.append(f"node {name}: {republishing}; left out of the inventory this read")
        got: GpuNode | str | None = dra.nodes.get(name) if on_dra else read_gpu_node(node, catalog)
        if got is None:
            continue  # named by slices that could not be read: the problem line says why
        if isinstance(got, str):
            problems.append(got)
            continue
        # the host capacity its slots may use: the Node's allocatable CPU/memory (device-plugin and DRA nodes alike)
        got = node_with_host(got, node)
        problems.extend(got.problems)
        if not (node.get("spec") or {}).get("unschedulable") and why is None and republishing is None:
            gpu_nodes[name] = got
    return node_objs, gpu_nodes, down


def _node_infos(node_objs: Mapping[str, Mapping[str, Any]], live: Sequence[LivePod],
                owner_of: Mapping[str, str], down: Mapping[str, str]) -> dict[str, NodeInfo]:
    by_node: dict[str, list[LivePod]] = {n: [] for n in node_objs}
    for p in live:
        if p.node in by_node:
            by_node[p.node].append(p)
    out = {}
    for name, obj in node_objs.items():
        meta, spec = metadata(obj), obj.get("spec") or {}
        gpu_pods: dict[str, int] = {}
        refs = []
        for p in sorted(by_node[name], key=lambda p: p.key):
            for res in p.gpus:
                gpu_pods[res] = gpu_pods.get(res, 0) + 1
            pmeta = metadata(p.obj)
            refs.append(PodRef(
                key=p.key,
                uid=str(pmeta.get("uid") or ""),
                labels=dict(p.labels),
                grace_s=grace_s(p.obj.get("spec") or {}),
                deleting=pmeta.get("deletionTimestamp") is not None,
                model=owner_of.get(p.key),
                gpus=dict(p.gpus),
            ))
        out[name] = NodeInfo(
            name=name,
            labels=dict(meta.get("labels") or {}),
            unschedulable=bool(spec.get("unschedulable")),
            gpu_pods=dict(sorted(gpu_pods.items())),
            annotations=dict(meta.get("annotations") or {}),
            taints=tuple(dict(t) for t in spec.get("taints") or () if isinstance(t, Mapping)),
            pods=tuple(refs),
            out_of_service=down.get(name),
        )
    return out


# -- managed models and their pods ---------------------------------------------------------------------------
@dataclass
class _Models:
    """The managed models of one view by key (in key order), and which live pods are whose."""

    models: dict[str, ManagedModel] = field(default_factory=dict)
    specs: dict[str, ModelSpec | None] = field(default_factory=dict)
    errors: dict[str, SpecError] = field(default_factory=dict)
    members: dict[str, list[LivePod]] = field(default_factory=dict)  # model key -> its pods
    owner_of: dict[str, str] = field(default_factory=dict)  # pod key -> model key
    kinds: dict[str, WorkloadKind] = field(default_factory=dict)  # model key -> its workload kind


def _managed_model(obj: Mapping[str, Any], key: str, kind: WorkloadKind = DEPLOYMENT,
                   template: Mapping[str, Any] | None = None) -> ManagedModel:
    """``template``: the pod template when it is not the object's own (a Rollout's ``workloadRef``)."""
    meta = metadata(obj)
    spec = obj.get("spec") or {}
    tmpl = template if template is not None else kind.template(obj)
    pod_spec = tmpl.get("spec") or {}
    containers = pod_spec.get("containers") or [{}]
    first = containers[0]
    replicas = parse_count(spec.get("replicas"))
    return ManagedModel(
        key=key,
        namespace=str(meta.get("namespace") or ""),
        name=str(meta.get("name")),
        uid=str(meta.get("uid") or ""),
        replicas=1 if replicas is None else replicas,
        container=str(first.get("name") or ""),
        resources=copy.deepcopy(dict(first.get("resources") or {})),  # never an alias into the informer cache
        node_selector=dict(pod_spec.get("nodeSelector") or {}),
        annotations=dict(meta.get("annotations") or {}),
        service=model_service(meta),
        kind=kind.kind,
        api_version=str(obj.get("apiVersion") or kind.api_version()),
        resource=kind.resource,
        group_size=kind.group_size(obj),
        claim_templates=template_claims(pod_spec),
    )


def _workload_objects(deployments: Iterable[Mapping[str, Any]], workloads: Iterable[Mapping[str, Any]],
                      namespace: str | None, problems: list[str]
                      ) -> tuple[list[tuple[str, WorkloadKind, Mapping[str, Any]]], dict[str, Mapping[str, Any]]]:
    """The managed workloads in key order (a key two kinds share goes to the first of :data:`KINDS`, with a
    problem line), and every Deployment by key (a Rollout's ``workloadRef`` may name one)."""
    deps = list(deployments)
    by_key = {object_key(d): d for d in deps}
    found: list[tuple[str, int, WorkloadKind, Mapping[str, Any]]] = []
    for kind, obj in [*((DEPLOYMENT, d) for d in deps), *((kind_of(w), w) for w in workloads)]:
        meta = metadata(obj)
        if not is_managed(meta.get("annotations") or {}) or (namespace is not None
                                                              and meta.get("namespace") != namespace):
            continue
        if kind is None:
            problems.append(f"{obj.get('kind')} {object_key(obj)} ({obj.get('apiVersion')}): not a workload kind "
                            "slotwise scales; not a model")
            continue
        found.append((object_key(obj), KINDS.index(kind), kind, obj))
    found.sort(key=lambda f: (f[0], f[1]))
    out: list[tuple[str, WorkloadKind, Mapping[str, Any]]] = []
    for key, _, kind, obj in found:
        if out and out[-1][0] == key:
            problems.append(f"{kind.kind.lower()} {key}: a {out[-1][1].kind} of the same name is the model; "
                            "not a model")
            continue
        out.append((key, kind, obj))
    return out, by_key


def _read_models(deployments: Iterable[Mapping[str, Any]], live: Sequence[LivePod], problems: list[str],
                 namespace: str | None = None, workloads: Iterable[Mapping[str, Any]] = ()) -> _Models:
    """Managed workloads (annotated; in ``namespace`` when one is given): the Deployments and ``workloads`` (other
    kinds, :mod:`~autoscaler.live.kube.workloads`), their specs, and their pods: those in the workload's namespace
    that its selector matches (a pod two selectors match goes to the first model by key). A LeaderWorkerSet's
    spec gets ``pods_per_replica`` = its group size."""
    # Index pods by namespace and by (namespace, label, value), so that a selector looks at few candidates.
    by_ns: dict[str, list[LivePod]] = {}
    by_label: dict[tuple[str, str, str], list[LivePod]] = {}
    for p in live:
        by_ns.setdefault(p.namespace, []).append(p)
        for k, v in p.labels.items():
            by_label.setdefault((p.namespace, k, v), []).append(p)

    managed, deps = _workload_objects(deployments, workloads, namespace, problems)
    out = _Models()
    for key, kind, obj in managed:
        meta = metadata(obj)
        ns = str(meta.get("namespace") or "")
        selector = kind.selector(obj)
        template = None
        ref = workload_ref(obj) if kind is ROLLOUT else None
        if ref is not None:
            # the Rollout runs the referenced Deployment's template (and its selector, when it has none itself)
            target = deps.get(f"{ns}/{ref[1]}") if ref[0] == "Deployment" else None
            if target is None:
                problems.append(f"rollout {key}: workloadRef {ref[0]} {ns}/{ref[1]} not seen; its template is "
                                "not read")
            template = DEPLOYMENT.template(target) if target is not None else {}
            if selector is None and target is not None:
                selector = (target.get("spec") or {}).get("selector")
        out.models[key] = _managed_model(obj, key, kind, template)
        out.kinds[key] = kind
        try:
            # The spec's name is the model key: the core names slot requests, and so inventory models, by it.
            spec = parse_annotations(key, meta.get("annotations") or {}, namespace=ns)
            size = out.models[key].group_size
            out.specs[key] = replace(spec, pods_per_replica=size) if size != spec.pods_per_replica else spec
            out.specs[key] = spec_with_host(out.specs[key], kind, obj, template, key, problems)
        except SpecError as e:
            out.specs[key] = None
            out.errors[key] = SpecError(key, e.problems)  # parse_annotations would name it "<ns>/<ns>/<name>"
        mine: list[LivePod] = []
        out.members[key] = mine
        try:
            sel = Selector.compile(selector)
        except SelectorError as e:
            problems.append(f"{kind.kind.lower()} {key}: selector {e}; no pods counted")
            continue
        if sel.match_labels:
            candidates = min((by_label.get((ns, k, v), []) for k, v in sel.match_labels), key=len)
        else:
            candidates = by_ns.get(ns, [])
        for p in candidates:
            if not sel.matches(p.labels):
                continue
            first = out.owner_of.get(p.key)
            if first is not None:
                what = "deployments" if kind is DEPLOYMENT and out.kinds[first] is DEPLOYMENT else "models"
                problems.append(f"pod {p.key}: selected by {what} {first} and {key}; counted for {first}")
                continue
            out.owner_of[p.key] = key
            mine.append(p)
    return out


def _groups(models: _Models, key: str) -> list[tuple[str, LivePod | None, list[LivePod]]]:
    """A model's replicas as (replica id, leader pod, other pods): one pod each (its own leader), or a
    LeaderWorkerSet's groups (id: the leader pod's key, ``<lws>-<group index>`` while the leader is not there;
    pods without a group index label are no replica)."""
    members = sorted(models.members[key], key=lambda p: p.key)
    if not models.kinds[key].grouped:
        return [(p.key, p, []) for p in members]
    mm = models.models[key]
    pods = {p.key: p for p in members}
    return [(g.leader or leader_key(mm.namespace, mm.name, g.index), pods[g.leader] if g.leader else None,
             [pods[k] for k in g.workers])
            for g in group_pods([(p.key, p.labels) for p in members]).values()]


def _count_unavailable(models: _Models, down: Mapping[str, str]) -> None:
    """Each model's replicas with a pod on a node out of service that is not being deleted: the controller (a
    ReplicaSet, StatefulSet, LeaderWorkerSet) still counts them in the workload's replicas, but they are no
    capacity. A LeaderWorkerSet group counts once, however many of its pods are there."""
    if not down:
        return
    for key in models.members:
        n = sum(1 for _, leader, others in _groups(models, key)
                if any(p.node in down and metadata(p.obj).get("deletionTimestamp") is None
                       for p in ([leader] if leader else []) + others))
        if n:
            models.models[key] = replace(models.models[key], unavailable_replicas=n)


def _observations(models: _Models, slots: Mapping[str, Slot], down: Mapping[str, str]) -> dict[str, ModelObservation]:
    """One :class:`Replica` per pod, or per LeaderWorkerSet group: ``slot`` the leader's, ``group_slots`` the other
    pods' (those known), Ready only with all ``group_size`` pods there and Ready, ``started_at`` the group's first
    pod's creation -- so a cold start runs from the group's start until its LAST pod is Ready, and a worker
    recreated under a leader that stays is no new replica -- draining when any of its pods is being deleted or is
    on a node out of service."""
    observations: dict[str, ModelObservation] = {}
    for key, model in models.models.items():
        replicas = []
        for rid, leader, others in _groups(models, key):
            pods = ([leader] if leader is not None else []) + others
            lost = any(p.node in down for p in pods)  # on a node out of service: no capacity, whatever it said
            replicas.append(Replica(
                replica_id=rid,
                slot=slots.get(leader.key) if leader is not None else None,
                ready=(leader is not None and len(pods) >= model.group_size and not lost
                       and all(_is_ready(p) for p in pods)),
                started_at=min(p.created for p in pods),
                # any pod going: LWS recreates or removes the whole group (RecreateGroupOnPodRestart, scale-down)
                draining=lost or any(metadata(p.obj).get("deletionTimestamp") is not None for p in pods),
                group_slots=tuple(s for p in others if (s := slots.get(p.key)) is not None),
            ))
        observations[key] = ModelObservation(
            name=key,
            spec=models.specs[key],
            desired_replicas=model.replicas,
            replicas=tuple(replicas),
            spec_error=models.errors.get(key),
            scaled_by=model.autoscaled_by,
            removal_by_index=not models.kinds[key].deletion_cost,  # a StatefulSet, a LeaderWorkerSet
        )
    return observations


def _is_ready(p: LivePod) -> bool:
    ready = condition(p.obj, "Ready")
    return bool(ready and ready.get("status") == "True")


# -- lent GPUs -----------------------------------------------------------------------------------------------
def _lent_nodes(node_objs: Mapping[str, Mapping[str, Any]], now: float, problems: list[str]) -> dict[str, float]:
    """Pods mode: node -> lent since, for every node with the lent label, or with the lent taint while a reclaim is
    in flight (its training pods still hold the GPUs; the taint keeps inference off until the last one left)."""
    lent_nodes: dict[str, float] = {}
    for name, obj in node_objs.items():
        labels = metadata(obj).get("labels") or {}
        if labels.get(LENT_LABEL) != "true" and not has_lent_taint((obj.get("spec") or {}).get("taints")):
            continue
        raw = (metadata(obj).get("annotations") or {}).get(LENT_SINCE_ANNOTATION)
        since = parse_time(raw)
        if since is None:
            # unknown: taken as lent just now, so that only a need (not the surplus going) reclaims it early
            problems.append(f"node {name}: lent without a valid {LENT_SINCE_ANNOTATION} ({raw!r}); taken as now")
            since = now
        lent_nodes[name] = since
    return lent_nodes


def _borrowers(workloads: Sequence[TrainingWorkload], refs: Mapping[str, TrainingRef]) -> dict[str, float | None]:
    """Kueue mode: training pod key -> when its workload started (None: unknown)."""
    borrower: dict[str, float | None] = {}
    for w in workloads:
        for k in refs[w.name].pods:
            borrower.setdefault(k, w.started_at)
    return borrower


def _allocate_lent(inventory: Inventory, gn: GpuNode, since: float, lent: dict[tuple[str, int], float],
                   problems: list[str]) -> None:
    """Give every GPU of a lent node to its lent owner: a whole slot on a plain GPU, every instance on a MIG GPU.

    A GPU that something else still holds (an inference replica that was there before the taint, a pod that does
    not carry the preemptible label) cannot be lent: it stays that pod's, not in ``lent``, with a problem line.
    """
    node = gn.spec.name
    for dev in range(gn.spec.gpu_count):
        d = inventory.device(node, dev)
        owner = lent_owner(node, dev)
        if d.entries:
            holders = sorted({o for o, _ in d.entries})
            problems.append(f"node {node}: lent, but GPU {dev} is held by {', '.join(holders)}; not counted as lent")
            continue
        if d.idle:
            inventory.allocate(Slot.whole(node, dev, gn.gpu), owner, LENT_MODEL)
        else:  # MIG instances that exist (pinned) and are free: each one is the lent owner's
            for key, start in d.instances():
                inventory.allocate(Slot.mig(node, dev, gn.gpu, key, start), owner, LENT_MODEL)
        lent[(node, dev)] = since


# -- pods -> slots -------------------------------------------------------------------------------------------
def _allocate_pods(
    inventory: Inventory,
    live: Sequence[LivePod],
    gpu_nodes: Mapping[str, GpuNode],
    lent_nodes: Mapping[str, float],
    models: _Models,
    borrowers: Mapping[str, float | None],
    lent: dict[tuple[str, int], float],
    problems: list[str],
    resource_claims: Iterable[Mapping[str, Any]] = (),
) -> dict[str, Slot]:
    """Allocate every GPU pod on an inventory node, oldest first (``live``'s order); pod key -> its slot.

    On a DRA node (:class:`~autoscaler.live.kube.dra.DraNode`) the pod's allocated ResourceClaims say exactly which
    device it holds (:func:`~autoscaler.live.kube.dra.pod_devices`): that slot is allocated, not the first free.

    Training pods on a lent node (pods mode) are borrowers: the node's lent allocation (:func:`_allocate_lent`,
    after this) covers its GPUs, so they are not allocated a second time. ``borrowers`` (Kueue mode only, else
    empty): the whole GPUs those training pods hold are lent, into ``lent``, since their workload started.
    """
    slots: dict[str, Slot] = {}
    claims = index_claims(resource_claims) if any(isinstance(g, DraNode) for g in gpu_nodes.values()) else None
    for p in live:
        if p.node is None:
            continue
        gn = gpu_nodes.get(p.node)
        if gn is None or not (p.gpus or isinstance(gn, DraNode)):
            continue  # cordoned, unknown GPU, or not a GPU node: outside the inventory; or no GPU asked for
        if p.node in lent_nodes and p.labels.get(PREEMPTIBLE_LABEL) == "true":
            # a borrower on a lent node: the node's lent allocation holds its GPUs. Only pods that carry the
            # label themselves: those are the ones a reclaim may evict, so only they may stand for lent GPUs.
            continue
        model = models.owner_of.get(p.key)
        if isinstance(gn, DraNode):
            assert claims is not None
            held = pod_devices(p.obj, claims)
            if not held:
                if p.gpus:  # no device plugin on a DRA node: these resources are nobody's
                    problems.append(f"pod {p.key} on {p.node}: asks for {sorted(p.gpus)} on a DRA node; "
                                    "no slot recorded")
                continue
            got = dra_slot(gn, held)
        elif len(p.gpus) > 1:
            problems.append(f"pod {p.key}: asks for several GPU resources {sorted(p.gpus)}; no slot recorded")
            continue
        else:
            ((resource, n),) = p.gpus.items()
            spec = models.specs.get(model) if model is not None else None
            got = find_slot(inventory, gn, resource, n, spec.gpu_memory_gib if spec is not None else None)
        if isinstance(got, str):
            problems.append(f"pod {p.key} on {p.node}: {got}; no slot recorded")
            continue
        if p.key in borrowers and model is None and got.kind is SlotKind.WHOLE:
            # Kueue mode: whole GPUs a training pod holds are lent (what the inference ClusterQueue lends);
            # MIG instances and time-sliced shares stay the pod's own (Kueue lends GPU counts, not slices)
            started = borrowers[p.key]
            for dev in got.devices:
                inventory.allocate(Slot.whole(p.node, dev, gn.gpu), lent_owner(p.node, dev), LENT_MODEL)
                lent[(p.node, dev)] = started if started is not None else p.created
            continue
        hosted = slot_with_host(inventory, got, p, problems)  # with the pod's host CPU/memory requests
        try:
            inventory.allocate(hosted, p.key, model if model is not None else UNMANAGED_MODEL_PREFIX + p.key)
        except ValueError as e:
            problems.append(f"pod {p.key} on {p.node}: {e}; no slot recorded")
            continue
        slots[p.key] = hosted
    return slots
