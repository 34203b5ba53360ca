"""Kubernetes objects (plain JSON dicts, as the API serves them) -> :class:`ClusterView`: a pure translation.

No I/O and no clock (``now`` is an argument): the informers hand over their caches, :func:`build_view` returns
the decision core's :class:`~autoscaler.api.snapshot.ClusterSnapshot` plus what acting on it needs. Anything that
cannot be understood becomes one line in ``ClusterView.problems`` and affects only the object concerned.

What is read, and how (the details the tests pin down):

- **Managed models** are Deployments annotated ``slotwise.io/slo-latency-ms``; key ``"<ns>/<name>"``, which is
  also the ``ModelSpec.name`` (so packer anti-affinity and inventory model names are the snapshot's keys).
  Bad annotations give ``spec=None`` and a :class:`SpecError` naming the key, for that model only. A model
  whose template asks for a MIG profile but whose annotations give no ``gpu-memory-gib`` keeps the spec as
  parsed: nothing is inferred from the template.
- **Pods** belong to a model when in its namespace and matched by its ``spec.selector`` (matchLabels and
  matchExpressions); ownerReferences are not needed. A pod two managed selectors match goes to the first
  model by key (a problem line). Succeeded/Failed pods are ignored everywhere. A replica's slot is None when
  its pod is pending, on a node outside the inventory, asks for no GPU, or its slot cannot be allocated
  (the last with a problem line); it is still counted.
- **GPU nodes** carry ``nvidia.com/gpu.product`` (GPU Feature Discovery) or GPU capacity. Cordoned nodes and
  nodes whose GPU the catalog does not know are left out of the inventory (the packer must not place there);
  every GPU node still gets a :class:`NodeInfo`.
- **MIG layouts** are not visible in the API, only counts per profile (``nvidia.com/mig-<profile>``
  capacity, mixed strategy; or the single strategy's overloaded ``nvidia.com/gpu``). They are rebuilt as a
  mig-parted ``devices: all`` config lays them out: profiles largest first, instances spread round-robin over
  the node's MIG GPUs, each GPU at a legal layout of what it got (:func:`distribute_mig_instances`); what
  fits nowhere is a problem line. On a node with both, the MIG GPUs are taken to be the first indices and
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
"""

from __future__ import annotations

import copy
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any

from autoscaler.api.snapshot import ClusterSnapshot, ModelObservation, Replica, TrainingWorkload
from autoscaler.api.spec import ModelSpec, SpecError, is_managed, parse_annotations
from autoscaler.live.kube.objects import (
    GPU_COUNT,
    GPU_PRODUCT,
    GPU_REPLICAS,
    GPU_RESOURCE,
    LAST_CHECKPOINT_ANNOTATION,
    LENT_LABEL,
    LENT_SINCE_ANNOTATION,
    MIG_CONFIG,
    MIG_RESOURCE_PREFIX,
    MIG_STRATEGY,
    PREEMPTIBLE_LABEL,
    ClusterView,
    ManagedModel,
    NodeInfo,
    PodRef,
    TrainingRef,
    has_lent_taint,
)
from sharing.catalog import Catalog, GpuModel, MigProfile, load_catalog
from sharing.lending import LENT_MODEL, LendingPolicy, lent_owner
from sharing.slots import Inventory, NodeSpec, Slot, SlotKind

# Inventory model name of a GPU pod that is no managed model's replica. ":" cannot occur in a namespace or a
# Deployment name, so these never collide with a model key.
UNMANAGED_MODEL_PREFIX = "pod:"
NVIDIA_LABEL_PREFIX = "nvidia.com/"
DEFAULT_GRACE_S = 30.0  # Kubernetes' default terminationGracePeriodSeconds
_TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})
_MIG_OFF_CONFIGS = frozenset({"", "all-disabled"})
_SINGLE_MIG = re.compile(r"-MIG-(?P<profile>[^-]+)$", re.IGNORECASE)
_JOB_NAME_LABELS = ("batch.kubernetes.io/job-name", "job-name")


# -- small readers -------------------------------------------------------------------------------------------
def parse_time(value: Any) -> float | None:
    """RFC 3339 (``2024-05-01T12:00:00Z``, optionally with fractional seconds or an offset) -> epoch seconds."""
    if not isinstance(value, str) or not value:
        return None
    try:
        dt = datetime.fromisoformat(value)
    except ValueError:
        return None
    if dt.tzinfo is None:  # the API always says Z; a naive time is read as UTC, never as local time
        dt = dt.replace(tzinfo=UTC)
    return dt.timestamp()


def _count(value: Any) -> int | None:
    """A non-negative whole count (an extended-resource quantity or a numeric label); None if not one."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value >= 0 else None
    if isinstance(value, float):
        return int(value) if value >= 0 and value.is_integer() else None
    text = str(value).strip()
    try:
        n = int(text)
    except ValueError:
        # Quantities may come as milli-units ("1000m"); extended resources are whole, so only exact ones count.
        if text.endswith("m") and text[:-1].isdigit() and int(text[:-1]) % 1000 == 0:
            return int(text[:-1]) // 1000
        return None
    return n if n >= 0 else None


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def _key(obj: Mapping[str, Any]) -> str:
    meta = _meta(obj)
    ns = meta.get("namespace")
    return f"{ns}/{meta.get('name')}" if ns else str(meta.get("name"))


def is_gpu_resource(name: str) -> bool:
    return name == GPU_RESOURCE or name.startswith(MIG_RESOURCE_PREFIX)


def pod_gpu_requests(pod_spec: Mapping[str, Any]) -> dict[str, int]:
    """GPU resource -> how many the pod asks for, as the scheduler counts it.

    Per container, ``limits`` (where extended resources must be given) else ``requests``; the pod's effective
    request is the larger of the containers' sum and any one init container's (init containers run one by one).
    """
    total: dict[str, int] = {}
    for c in pod_spec.get("containers") or ():
        for name, n in _container_gpus(c).items():
            total[name] = total.get(name, 0) + n
    for c in pod_spec.get("initContainers") or ():
        for name, n in _container_gpus(c).items():
            total[name] = max(total.get(name, 0), n)
    return {k: v for k, v in total.items() if v > 0}


def _container_gpus(container: Mapping[str, Any]) -> dict[str, int]:
    res = container.get("resources") or {}
    limits = res.get("limits") or {}
    requests = res.get("requests") or {}
    out: dict[str, int] = {}
    for name in (*limits, *requests):
        if name in out or not is_gpu_resource(name):
            continue
        n = _count(limits[name] if name in limits else requests[name])
        if n:
            out[name] = n
    return out


# -- label selectors -----------------------------------------------------------------------------------------
class SelectorError(ValueError):
    """A label selector this module cannot evaluate (unknown operator, malformed expression)."""


@dataclass(frozen=True)
class Selector:
    """A compiled ``metav1.LabelSelector``: ``match_labels`` AND every expression."""

    match_labels: tuple[tuple[str, str], ...]
    expressions: tuple[tuple[str, str, frozenset[str]], ...]  # (key, operator, values)

    @classmethod
    def compile(cls, selector: Mapping[str, Any] | None) -> Selector:
        if not selector or not (selector.get("matchLabels") or selector.get("matchExpressions")):
            # apps/v1 rejects an empty selector on a Deployment; if one ever comes, it selects nothing here
            # rather than every pod of the namespace.
            raise SelectorError("has no selector")
        labels = tuple(sorted((str(k), str(v)) for k, v in (selector.get("matchLabels") or {}).items()))
        exprs = []
        for e in selector.get("matchExpressions") or ():
            key, op = e.get("key"), e.get("operator")
            values = frozenset(str(v) for v in e.get("values") or ())
            if not key:
                raise SelectorError(f"matchExpression {e!r} has no key")
            if op in ("In", "NotIn"):
                if not values:
                    raise SelectorError(f"matchExpression on {key!r}: {op} needs values")
            elif op in ("Exists", "DoesNotExist"):
                if values:
                    raise SelectorError(f"matchExpression on {key!r}: {op} takes no values")
            else:
                raise SelectorError(f"matchExpression on {key!r}: unknown operator {op!r}")
            exprs.append((str(key), str(op), values))
        return cls(labels, tuple(exprs))

    def matches(self, labels: Mapping[str, str]) -> bool:
        for k, v in self.match_labels:
            if labels.get(k) != v:
                return False
        for key, op, values in self.expressions:
            present = key in labels
            if op == "In":
                if not present or labels[key] not in values:
                    return False
            elif op == "NotIn":
                if present and labels[key] in values:
                    return False
            elif op == "Exists":
                if not present:
                    return False
            elif present:  # DoesNotExist
                return False
        return True


def selector_matches(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """Whether a ``LabelSelector`` dict selects ``labels`` (an empty or invalid selector selects nothing)."""
    try:
        return Selector.compile(selector).matches(labels)
    except SelectorError:
        return False


# -- nodes ---------------------------------------------------------------------------------------------------
@dataclass
class GpuNode:
    """What one GPU node offers, read from its labels and capacity (before any pod is placed)."""

    spec: NodeSpec
    gpu: GpuModel
    replicas: int = 1  # time-slicing replicas per plain GPU (1: not shared)
    mig_gpus: int = 0  # GPUs 0 .. mig_gpus-1 are in MIG mode; the rest are plain
    mig_counts: dict[str, int] = field(default_factory=dict)  # profile key -> instances on the node
    mig_replicas: dict[str, int] = field(default_factory=dict)  # profile key -> time-slicing replicas (absent: 1)
    single: str | None = None  # the MIG single strategy's one profile key: nvidia.com/gpu is an instance of it
    problems: list[str] = field(default_factory=list)


def _capacity(node: Mapping[str, Any]) -> Mapping[str, Any]:
    status = node.get("status") or {}
    return status.get("capacity") or status.get("allocatable") or {}


def is_gpu_node(node: Mapping[str, Any]) -> bool:
    """GFD labelled it, or the device plugin advertises GPUs on it."""
    if GPU_PRODUCT in (_meta(node).get("labels") or {}):
        return True
    return any(is_gpu_resource(k) and (_count(v) or 0) > 0 for k, v in _capacity(node).items())


def read_gpu_node(node: Mapping[str, Any], catalog: Catalog) -> GpuNode | str:
    """The node's GPUs (kind, count, MIG and time-slicing), or a problem line when they cannot be known."""
    meta = _meta(node)
    name = str(meta.get("name"))
    labels: Mapping[str, str] = meta.get("labels") or {}
    capacity = _capacity(node)
    product = labels.get(GPU_PRODUCT)
    if not product:
        return f"node {name}: GPUs without a {GPU_PRODUCT} label (is GPU Feature Discovery running?)"
    try:
        gpu = catalog.get(catalog.resolve(product))
    except KeyError:
        return f"node {name}: unknown GPU product {product!r}; left out"
    problems: list[str] = []
    nv_labels = {k: v for k, v in labels.items() if k.startswith(NVIDIA_LABEL_PREFIX)}
    replicas = max(1, _count(labels.get(GPU_REPLICAS)) or 1)
    label_count = _count(labels.get(GPU_COUNT))
    gpu_cap = _count(capacity.get(GPU_RESOURCE)) or 0
    strategy = labels.get(MIG_STRATEGY, "")

    single = _SINGLE_MIG.search(product) if strategy == "single" else None
    if single is not None:
        # Single strategy: nvidia.com/gpu is overloaded to mean one MIG device, gpu.count counts MIG devices,
        # and every GPU of the node has the same layout (GFD README, "MIG 'single' strategy").
        try:
            p = gpu.profile(single["profile"])
        except KeyError:
            return f"node {name}: {gpu.name} has no MIG profile {single['profile']!r} (product {product!r}); left out"
        if not gpu.mig_capable:
            return f"node {name}: {gpu.name} does not support MIG; left out"
        instances = label_count if label_count is not None else gpu_cap // replicas
        per_gpu = _per_gpu(gpu, p, catalog)
        count = math.ceil(instances / per_gpu)
        spec = NodeSpec(name, gpu.name, count, mig_enabled=count > 0, labels=nv_labels)
        return GpuNode(spec, gpu, 1, count, {p.key: instances}, {p.key: replicas} if replicas > 1 else {},
                       p.key, problems)

    mig_counts: dict[str, int] = {}
    mig_replicas: dict[str, int] = {}
    raw_counts = {k[len(MIG_RESOURCE_PREFIX):]: v for k, v in capacity.items() if k.startswith(MIG_RESOURCE_PREFIX)}
    from_capacity = bool(raw_counts)  # capacity counts time-sliced replicas; GFD's count labels count instances
    if not raw_counts:  # no device plugin capacity (yet): GFD's per-profile count labels say the same
        raw_counts = {
            k[len(MIG_RESOURCE_PREFIX):-len(".count")]: v
            for k, v in labels.items()
            if k.startswith(MIG_RESOURCE_PREFIX) and k.endswith(".count")
        }
    for pname, raw in sorted(raw_counts.items()):
        n = _count(raw)
        if not n:
            continue
        try:
            p = gpu.profile(pname)
        except KeyError:
            problems.append(f"node {name}: {gpu.name} has no MIG profile {pname!r}; its {n} instance(s) ignored")
            continue
        r = max(1, _count(labels.get(f"{MIG_RESOURCE_PREFIX}{pname}.replicas")) or 1)
        mig_counts[p.key] = mig_counts.get(p.key, 0) + (n // r if from_capacity else n)
        if r > 1:
            mig_replicas[p.key] = r
    config = labels.get(MIG_CONFIG, "")
    mig_on = bool(mig_counts) or config not in _MIG_OFF_CONFIGS
    if mig_on and not gpu.mig_capable:
        problems.append(f"node {name}: MIG reported on {gpu.name}, which does not support MIG; read as plain GPUs")
        mig_on, mig_counts, mig_replicas = False, {}, {}
    plain_cap = gpu_cap // replicas
    if label_count is not None:
        count = label_count
    elif mig_counts:
        count = plain_cap + _gpus_needed(gpu, mig_counts, catalog)
    else:
        count = plain_cap
    mig_gpus = max(0, count - min(plain_cap, count)) if mig_on else 0
    spec = NodeSpec(name, gpu.name, count, mig_enabled=mig_on and count > 0, labels=nv_labels)
    return GpuNode(spec, gpu, replicas, mig_gpus, mig_counts, mig_replicas, None, problems)


def node_spec(node: Mapping[str, Any], catalog: Catalog) -> NodeSpec | str:
    """The node's :class:`NodeSpec` (labels: its ``nvidia.com/*`` labels), or a problem string.

    A node without GPUs is a problem string too; :func:`build_view` only asks about GPU nodes. Cordoning is
    not judged here (the node's GPUs are what they are); :func:`build_view` leaves cordoned nodes out.
    """
    if not is_gpu_node(node):
        return f"node {_meta(node).get('name')}: not a GPU node"
    got = read_gpu_node(node, catalog)
    return got if isinstance(got, str) else got.spec


def _per_gpu(gpu: GpuModel, p: MigProfile, catalog: Catalog) -> int:
    """How many instances of ``p`` one empty GPU holds when filled at first free legal starts."""
    inv = Inventory.from_nodes([NodeSpec("_", gpu.name, 1, mig_enabled=True)], catalog)
    return max(1, len(distribute_mig_instances(inv, "_", range(1), {p.key: p.max_count})[0]))


def _gpus_needed(gpu: GpuModel, counts: Mapping[str, int], catalog: Catalog) -> int:
    """The fewest MIG GPUs the counts fit on (no gpu.count label to say): from the compute lower bound up."""
    total = sum(counts.values())
    need = sum(gpu.profiles[k].compute_slices * n for k, n in counts.items())
    for m in range(max(1, math.ceil(need / gpu.compute_slices_total)), total + 1):
        inv = Inventory.from_nodes([NodeSpec("_", gpu.name, m, mig_enabled=True)], catalog)
        if not distribute_mig_instances(inv, "_", range(m), counts)[1]:
            return m
    return total


@lru_cache(maxsize=4096)
def fit_layout(gpu: GpuModel, keys: tuple[str, ...]) -> tuple[tuple[str, int], ...] | None:
    """A legal layout of one GPU holding instances of these profile keys, or None when none exists.

    Depth-first over the legal starts, in ascending order, largest profile first. Plain first-free-start
    placement is not enough: on an A100/H100 ``3g@0, 2g@4, 1g@6`` leaves slice 7, where no 1g may start, while
    ``3g@4, 2g@0, 1g@2, 1g@3`` holds mig-parted's ``all-balanced`` GPU.
    """
    profiles = sorted((gpu.profiles[k] for k in keys), key=lambda p: (-p.mem_slices, -p.compute_slices, p.key))
    counts: dict[str, int] = {}
    for p in profiles:
        counts[p.key] = counts.get(p.key, 0) + 1
    if any(n > gpu.profiles[k].max_count for k, n in counts.items()):
        return None
    if sum(p.compute_slices for p in profiles) > gpu.compute_slices_total:
        return None
    if sum(p.mem_slices for p in profiles) > gpu.mem_slices_total:
        return None
    out: list[tuple[str, int]] = []

    def place(i: int, used: int) -> bool:
        if i == len(profiles):
            return True
        p = profiles[i]
        # Instances of one profile are interchangeable: take their starts in increasing order only.
        after = out[-1][1] if i and profiles[i - 1].key == p.key else -1
        for s in p.placements:
            mask = ((1 << p.mem_slices) - 1) << s
            if s > after and s + p.mem_slices <= gpu.mem_slices_total and not used & mask:
                out.append((p.key, s))
                if place(i + 1, used | mask):
                    return True
                out.pop()
        return False

    return tuple(sorted(out, key=lambda ks: ks[1])) if place(0, 0) else None


def distribute_mig_instances(
    inventory: Inventory, node: str, devices: Sequence[int] | range, counts: Mapping[str, int]
) -> tuple[list[tuple[int, str, int]], dict[str, int]]:
    """Create ``counts`` (profile key -> instances) on the (instance-free) ``devices`` of ``node``.

    Spread as mig-parted's ``devices: all`` configs are: profiles largest first (the order
    :func:`sharing.render.mig_devices` lists them), the k-th instance of a profile to the first device,
    round-robin from device ``k``, whose instances still have a legal layout (:func:`fit_layout`); so a
    config giving every GPU the same instances comes back as exactly that. Returns (created
    ``(device, profile, start)``, profile -> instances that fit nowhere).
    """
    gpu = inventory.gpu_of(node)
    devs = list(devices)
    order = sorted(counts, key=lambda k: (-gpu.profiles[k].mem_slices, -gpu.profiles[k].compute_slices, k))
    per_dev: list[tuple[str, ...]] = [() for _ in devs]
    dropped: dict[str, int] = {}
    for key in order:
        for k in range(counts[key]):
            for j in range(len(devs)):
                g = (k + j) % len(devs)
                trial = (*per_dev[g], key)
                if fit_layout(gpu, trial) is not None:
                    per_dev[g] = trial
                    break
            else:
                dropped[key] = dropped.get(key, 0) + 1
    created: list[tuple[int, str, int]] = []
    for g, idx in enumerate(devs):
        for key, start in fit_layout(gpu, per_dev[g]) or ():
            inventory.create_mig_instance(node, idx, key, start)
            created.append((idx, key, start))
    return created, dropped


def mig_layout(node: Mapping[str, Any], catalog: Catalog | None = None) -> dict[int, list[tuple[str, int]] | None]:
    """The node's reconstructed MIG layout per GPU (None: MIG off), as :func:`build_view` assumes it."""
    cat = catalog if catalog is not None else load_catalog()
    got = read_gpu_node(node, cat)
    if isinstance(got, str):
        return {}
    inv = Inventory.from_nodes([got.spec], cat)
    _lay_out(inv, got, [])
    return {i: list(inv.mig_layout(got.spec.name, i)) if inv.device(got.spec.name, i).mig_enabled else None
            for i in range(got.spec.gpu_count)}


def _lay_out(inv: Inventory, gn: GpuNode, problems: list[str]) -> None:
    name = gn.spec.name
    if not gn.spec.mig_enabled:
        return
    for i in range(gn.mig_gpus, gn.spec.gpu_count):
        inv.set_mig_mode(name, i, False)
    _, dropped = distribute_mig_instances(inv, name, range(gn.mig_gpus), gn.mig_counts)
    if dropped:
        what = ", ".join(f"{n} x {gn.gpu.profiles[k].name}" for k, n in sorted(dropped.items()))
        problems.append(
            f"node {name}: MIG capacity does not fit its {gn.mig_gpus} MIG GPU(s) ({gn.gpu.name}); "
            f"left out: {what}"
        )


# -- pods -> slots -------------------------------------------------------------------------------------------
@dataclass
class _Pod:
    obj: Mapping[str, Any]
    key: str
    namespace: str
    labels: Mapping[str, str]
    node: str | None
    gpus: dict[str, int]
    created: float


def _find_slot(inv: Inventory, gn: GpuNode, resource: str, n: int, spec_mem: float | None) -> Slot | str:
    """The slot a pod asking for ``n`` x ``resource`` holds on this node: the first free one that fits."""
    node, gpu = gn.spec.name, gn.gpu
    reserve = inv.share_reserve_gib
    if resource == GPU_RESOURCE and gn.single is None:
        plain = range(gn.mig_gpus, gn.spec.gpu_count)
        if gn.replicas > 1:
            if n != 1:
                return f"asks for {n} time-sliced {resource} (one replica of a shared GPU is the most)"
            mem = spec_mem if spec_mem is not None else (gpu.memory_gib - reserve) / gn.replicas
            for i in plain:
                try:
                    slot = Slot.share(node, i, gpu, mem, 1.0 / gn.replicas)
                except ValueError as e:
                    return str(e)
                if inv.fits(slot):
                    return slot
            return f"no shared GPU on the node has {mem:g} GiB left"
        free = [i for i in plain if inv.device(node, i).idle]
        if len(free) < n:
            return f"asks for {n} whole GPU(s), {len(free)} free on the node"
        return Slot.whole(node, free[:n], gpu)
    if not gn.spec.mig_enabled:
        return f"asks for {resource} on a node without MIG"
    if gn.single is not None:
        key = gn.single
    else:
        try:
            key = gpu.profile(resource).key
        except KeyError:
            return f"asks for {resource}, which {gpu.name} does not offer"
    if n != 1:
        return f"asks for {n} x {resource} (a replica holds one MIG instance)"
    p = gpu.profiles[key]
    r = gn.mig_replicas.get(key, 1)
    mem = spec_mem if spec_mem is not None else (p.memory_gib - reserve) / r
    for i in range(gn.mig_gpus):
        d = inv.device(node, i)
        for inst in d.instances():
            if inst[0] != key:
                continue
            if r == 1:
                if inst not in d.usage:
                    return Slot.mig(node, i, gpu, key, inst[1])
                continue
            try:
                slot = Slot.share(node, i, gpu, mem, gpu.compute_fraction(p) / r, profile=key, start=inst[1])
            except ValueError as e:
                return str(e)
            if inv.fits(slot):
                return slot
    return f"no free {p.name} instance on the node"


# -- training ------------------------------------------------------------------------------------------------
def _kind(obj: Mapping[str, Any]) -> str:
    """The object's kind; list responses omit it on items, so infer it from the shape then."""
    kind = obj.get("kind")
    if kind:
        return str(kind)
    spec = obj.get("spec") or {}
    if "containers" in spec:
        return "Pod"
    if "podSets" in spec:
        return "Workload"
    return "Job"


def _gpu_equivalents(requests: Mapping[str, int], catalog: Catalog) -> float:
    """GPUs a request costs: nvidia.com/gpu counts whole, a MIG instance its profile's share of compute."""
    total = 0.0
    for res, n in requests.items():
        if res == GPU_RESOURCE:
            total += n
            continue
        total += n * _mig_fraction(res, catalog)
    return total


def _mig_fraction(resource: str, catalog: Catalog) -> float:
    """A MIG resource's share of its GPU's compute (the first catalog GPU offering the profile says)."""
    for name in catalog.names():
        g = catalog.get(name)
        if not g.mig_capable:
            continue
        try:
            return g.compute_fraction(g.profile(resource))
        except KeyError:
            continue
    # A profile no catalog GPU has: read "<c>g" as c of a 7-slice GPU's compute.
    m = re.match(r"(\d+)g", resource[len(MIG_RESOURCE_PREFIX):])
    return min(1.0, int(m.group(1)) / 7) if m else 1.0


def _grace(pod_spec: Mapping[str, Any]) -> float:
    g = pod_spec.get("terminationGracePeriodSeconds")
    return float(g) if isinstance(g, int | float) and not isinstance(g, bool) and g >= 0 else DEFAULT_GRACE_S


def _condition(obj: Mapping[str, Any], ctype: str) -> Mapping[str, Any] | None:
    for c in (obj.get("status") or {}).get("conditions") or ():
        if c.get("type") == ctype:
            return c
    return None


def _owner(obj: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    for ref in _meta(obj).get("ownerReferences") or ():
        if ref.get("kind") == kind:
            return ref
    return None


def _training(
    objects: Iterable[Mapping[str, Any]],
    pods: Sequence[_Pod],
    catalog: Catalog,
    problems: list[str],
) -> tuple[tuple[TrainingWorkload, ...], dict[str, TrainingRef]]:
    """The preemptible training workloads, and how to address each (its pods, the Kueue Workloads admitting it)."""
    labelled: dict[tuple[str, str], Mapping[str, Any]] = {}
    for obj in objects:
        if (_meta(obj).get("labels") or {}).get(PREEMPTIBLE_LABEL) == "true":
            labelled[(_kind(obj), _key(obj))] = obj
    for p in pods:
        if p.labels.get(PREEMPTIBLE_LABEL) == "true":
            labelled.setdefault(("Pod", p.key), p.obj)
    jobs = {k for kind, k in labelled if kind == "Job"}
    job_uids = {str(_meta(o).get("uid")) for (kind, _), o in labelled.items() if kind == "Job"}

    # A Job's pods: by ownerReference uid (a real cluster) or the job-name label (set by the Job controller).
    pods_of_job: dict[str, list[_Pod]] = {}
    for p in pods:
        ref = _owner(p.obj, "Job")
        job = None
        if ref is not None:
            job = f"{p.namespace}/{ref.get('name')}"
        else:
            for lbl in _JOB_NAME_LABELS:
                if lbl in p.labels:
                    job = f"{p.namespace}/{p.labels[lbl]}"
                    break
        if job is not None:
            pods_of_job.setdefault(job, []).append(p)
    # Kueue Workloads by the object that owns them (a Job, or a plain pod with Kueue's pod integration): the
    # lending actuator deactivates these when it reclaims the owner.
    workloads_of: dict[tuple[str, str, str], list[str]] = {}
    for (kind, key), obj in labelled.items():
        if kind != "Workload":
            continue
        ns = _meta(obj).get("namespace") or ""
        for ref in _meta(obj).get("ownerReferences") or ():
            workloads_of.setdefault((str(ref.get("kind")), ns, str(ref.get("name"))), []).append(key)

    out: list[TrainingWorkload] = []
    refs: dict[str, TrainingRef] = {}
    for (kind, key), obj in sorted(labelled.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        meta = _meta(obj)
        ns = meta.get("namespace") or ""
        checkpoint_raw = (meta.get("annotations") or {}).get(LAST_CHECKPOINT_ANNOTATION)
        checkpoint = parse_time(checkpoint_raw)
        if checkpoint_raw is not None and checkpoint is None:
            problems.append(f"{kind} {key}: {LAST_CHECKPOINT_ANNOTATION}={checkpoint_raw!r} is not an RFC 3339 time")
        spec = obj.get("spec") or {}
        status = obj.get("status") or {}
        if kind == "Pod":
            ref = _owner(obj, "Job")
            if (ref is not None and (str(ref.get("uid")) in job_uids or f"{ns}/{ref.get('name')}" in jobs)) or any(
                f"{ns}/{(meta.get('labels') or {}).get(lbl)}" in jobs for lbl in _JOB_NAME_LABELS
            ):
                continue  # counted with its Job
            node = spec.get("nodeName")
            refs[key] = TrainingRef(key, "Pod", ns, str(meta.get("uid") or ""), (key,),
                                    tuple(sorted(workloads_of.get(("Pod", ns, str(meta.get("name"))), []))))
            out.append(TrainingWorkload(
                name=key,
                kind="Pod",
                gpus=_gpu_equivalents(pod_gpu_requests(spec), catalog),
                nodes=(node,) if node else (),
                running=status.get("phase") == "Running",
                grace_s=_grace(spec),
                started_at=parse_time(status.get("startTime")) or parse_time(meta.get("creationTimestamp")),
                last_checkpoint_at=checkpoint,
            ))
        elif kind == "Workload":
            ref = _owner(obj, "Job")
            if ref is not None and (str(ref.get("uid")) in job_uids or f"{ns}/{ref.get('name')}" in jobs):
                continue  # the Job says the same, and knows its pods
            gpus = 0.0
            graces = []
            for ps in spec.get("podSets") or ():
                pspec = (ps.get("template") or {}).get("spec") or {}
                count = _count(ps.get("count"))
                gpus += (1 if count is None else count) * _gpu_equivalents(pod_gpu_requests(pspec), catalog)
                graces.append(_grace(pspec))
            admitted = _condition(obj, "Admitted")
            finished = _condition(obj, "Finished")
            running = bool(admitted and admitted.get("status") == "True") and not (
                finished and finished.get("status") == "True"
            )
            job_pods = pods_of_job.get(f"{ns}/{ref.get('name')}", []) if ref is not None else []
            refs[key] = TrainingRef(key, "Workload", ns, str(meta.get("uid") or ""),
                                    tuple(sorted(p.key for p in job_pods)), (key,))
            out.append(TrainingWorkload(
                name=key,
                kind="Workload",
                gpus=gpus,
                nodes=tuple(sorted({p.node for p in job_pods if p.node})),
                running=running,
                grace_s=max(graces, default=DEFAULT_GRACE_S),  # reclaim waits for the slowest pod set
                started_at=parse_time(admitted.get("lastTransitionTime")) if admitted else None,
                last_checkpoint_at=checkpoint,
            ))
        else:  # Job
            pspec = (spec.get("template") or {}).get("spec") or {}
            parallelism = _count(spec.get("parallelism"))
            width = 1 if parallelism is None else parallelism
            job_pods = pods_of_job.get(key, [])
            refs[key] = TrainingRef(key, kind, ns, str(meta.get("uid") or ""), tuple(sorted(p.key for p in job_pods)),
                                    tuple(sorted(workloads_of.get((kind, ns, str(meta.get("name"))), []))))
            out.append(TrainingWorkload(
                name=key,
                kind=kind,
                gpus=width * _gpu_equivalents(pod_gpu_requests(pspec), catalog),
                nodes=tuple(sorted({p.node for p in job_pods if p.node})),
                running=(_count(status.get("active")) or 0) > 0 and not spec.get("suspend", False),
                grace_s=_grace(pspec),
                started_at=parse_time(status.get("startTime")),
                last_checkpoint_at=checkpoint,
            ))
    return tuple(out), refs


# -- the view ------------------------------------------------------------------------------------------------
def _managed_model(dep: Mapping[str, Any], key: str) -> ManagedModel:
    meta = _meta(dep)
    spec = dep.get("spec") or {}
    pod_spec = (spec.get("template") or {}).get("spec") or {}
    containers = pod_spec.get("containers") or [{}]
    first = containers[0]
    replicas = _count(spec.get("replicas"))
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
    )


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
) -> ClusterView:
    """One read of the caches -> the decision core's snapshot, the managed models, GPU node info, problems.

    Pure and deterministic: the same objects (in any order) give the same view. ``lending`` (the controller's
    lending settings) only matters in Kueue mode, where the GPUs training pods hold are what is lent (module
    docstring, "Lent GPUs"); nodes lent in pods mode are read from their label/taint whatever the settings.
    """
    cat = catalog if catalog is not None else load_catalog()
    problems: list[str] = []

    # Nodes: every GPU node gets a NodeInfo; schedulable ones with a known GPU go into the inventory.
    gpu_nodes: dict[str, GpuNode] = {}
    node_objs: dict[str, Mapping[str, Any]] = {}
    for node in sorted(nodes, key=lambda n: str(_meta(n).get("name"))):
        if not is_gpu_node(node):
            continue
        name = str(_meta(node).get("name"))
        node_objs[name] = node
        got = read_gpu_node(node, cat)
        if isinstance(got, str):
            problems.append(got)
            continue
        problems.extend(got.problems)
        if not (node.get("spec") or {}).get("unschedulable"):
            gpu_nodes[name] = got
    inventory = Inventory.from_nodes([g.spec for g in gpu_nodes.values()], cat, share_reserve_gib)
    for gn in gpu_nodes.values():
        _lay_out(inventory, gn, problems)

    # Pods: terminal ones are gone for every purpose here.
    live: list[_Pod] = []
    for pod in pods:
        status = pod.get("status") or {}
        if status.get("phase") in _TERMINAL_PHASES:
            continue
        meta = _meta(pod)
        spec = pod.get("spec") or {}
        live.append(_Pod(
            obj=pod,
            key=_key(pod),
            namespace=str(meta.get("namespace") or ""),
            labels=meta.get("labels") or {},
            node=spec.get("nodeName") or None,
            gpus=pod_gpu_requests(spec),
            # The API always sets creationTimestamp; without one a pod is taken as new, never as long-lived.
            created=parse_time(meta.get("creationTimestamp")) or now,
        ))
    live.sort(key=lambda p: (p.created, p.key))


    # Index pods by namespace and by (namespace, label, value), so that a selector looks at few candidates.
    by_ns: dict[str, list[_Pod]] = {}
    by_label: dict[tuple[str, str, str], list[_Pod]] = {}
    for p in live:
        by_ns.setdefault(p.namespace, []).append(p)
        for k, v in p.labels.items():
            by_label.setdefault((p.namespace, k, v), []).append(p)

    # Managed models and which pods are theirs.
    managed: list[tuple[str, Mapping[str, Any]]] = []
    for dep in deployments:
        if is_managed(_meta(dep).get("annotations") or {}):
            managed.append((_key(dep), dep))
    managed.sort(key=lambda kd: kd[0])
    owner_of: dict[str, str] = {}  # pod key -> model key
    members: dict[str, list[_Pod]] = {}
    specs: dict[str, ModelSpec | None] = {}
    errors: dict[str, SpecError] = {}
    models: dict[str, ManagedModel] = {}
    for key, dep in managed:
        meta = _meta(dep)
        ns = str(meta.get("namespace") or "")
        models[key] = _managed_model(dep, key)
        try:
            # The spec's name is the model key: the core names slot requests, and so inventory models, by it.
            specs[key] = parse_annotations(key, meta.get("annotations") or {}, namespace=ns)
        except SpecError as e:
            specs[key] = None
            errors[key] = SpecError(key, e.problems)  # parse_annotations would name it "<ns>/<ns>/<name>"
        mine: list[_Pod] = []
        members[key] = mine
        try:
            sel = Selector.compile((dep.get("spec") or {}).get("selector"))
        except SelectorError as e:
            problems.append(f"deployment {key}: selector {e}; no pods counted")
            continue
        if sel.match_labels:
            candidates = min(
                (by_label.get((ns, k, v), []) for k, v in sel.match_labels), key=len
            )
        else:
            candidates = by_ns.get(ns, [])
        for p in candidates:
            if not sel.matches(p.labels):
                continue
            first = owner_of.get(p.key)
            if first is not None:
                problems.append(f"pod {p.key}: selected by deployments {first} and {key}; counted for {first}")
                continue
            owner_of[p.key] = key
            mine.append(p)

    workloads, training_refs = _training(training, live, cat, problems)
    # Lent GPUs. Pods mode: every GPU of a node with the lent label, or with the lent taint while a reclaim is in
    # flight (its training pods still hold the GPUs; the taint keeps inference off until the last one left).
    # Training pods on such a node are borrowers: the lent allocation covers the node's GPUs, so they are not
    # allocated a second time. Kueue mode: the GPUs that running training pods hold, wherever they are.
    lent_nodes: dict[str, float] = {}
    for name, obj in node_objs.items():
        labels = _meta(obj).get("labels") or {}
        if labels.get(LENT_LABEL) != "true" and not has_lent_taint((obj.get("spec") or {}).get("taints")):
            continue
        raw = (_meta(obj).get("annotations") or {}).get(LENT_SINCE_ANNOTATION)
        since = parse_time(raw)
        if since is None:
            # unknown: taken as lent just now, so that only a need (not the surplus going) reclaims it early
            problems.append(f"node {name}: lent without a valid {LENT_SINCE_ANNOTATION} ({raw!r}); taken as now")
            since = now
        lent_nodes[name] = since
    borrower: dict[str, float | None] = {}  # training pod key -> when its workload started (None: unknown)
    for w in workloads:
        for k in training_refs[w.name].pods:
            borrower.setdefault(k, w.started_at)
    kueue = lending is not None and lending.mode == "kueue"
    lent: dict[tuple[str, int], float] = {}

    # Allocate every GPU pod on an inventory node, oldest first.
    slots: dict[str, Slot] = {}
    for p in live:
        if not p.gpus or p.node is None:
            continue
        gn = gpu_nodes.get(p.node)
        if gn is None:
            continue  # cordoned, unknown GPU, or not a GPU node: outside the inventory
        if p.node in lent_nodes and p.labels.get(PREEMPTIBLE_LABEL) == "true":
            # a borrower on a lent node: the node's lent allocation below holds its GPUs. Only pods that carry the
            # label themselves: those are the ones a reclaim may evict, so only they may stand for lent GPUs.
            continue
        if len(p.gpus) > 1:
            problems.append(f"pod {p.key}: asks for several GPU resources {sorted(p.gpus)}; no slot recorded")
            continue
        ((resource, n),) = p.gpus.items()
        model = owner_of.get(p.key)
        spec = specs.get(model) if model is not None else None
        got = _find_slot(inventory, gn, resource, n, spec.gpu_memory_gib if spec is not None else None)
        if isinstance(got, str):
            problems.append(f"pod {p.key} on {p.node}: {got}; no slot recorded")
            continue
        if kueue and p.key in borrower and model is None and got.kind is SlotKind.WHOLE:
            # Kueue mode: whole GPUs a training pod holds are lent (what the inference ClusterQueue lends);
            # MIG instances and time-sliced shares stay the pod's own (Kueue lends GPU counts, not slices)
            started = borrower[p.key]
            for dev in got.devices:
                inventory.allocate(Slot.whole(p.node, dev, gn.gpu), lent_owner(p.node, dev), LENT_MODEL)
                lent[(p.node, dev)] = started if started is not None else p.created
            continue
        try:
            inventory.allocate(got, p.key, model if model is not None else UNMANAGED_MODEL_PREFIX + p.key)
        except ValueError as e:
            problems.append(f"pod {p.key} on {p.node}: {e}; no slot recorded")
            continue
        slots[p.key] = got

    for name, since in sorted(lent_nodes.items()):
        gn = gpu_nodes.get(name)
        if gn is not None:
            _allocate_lent(inventory, gn, since, lent, problems)

    node_infos = _node_infos(node_objs, live, owner_of)

    observations: dict[str, ModelObservation] = {}
    for key, _dep in managed:
        replicas = []
        for p in sorted(members[key], key=lambda p: p.key):
            meta = _meta(p.obj)
            ready = _condition(p.obj, "Ready")
            replicas.append(Replica(
                replica_id=p.key,
                slot=slots.get(p.key),
                ready=bool(ready and ready.get("status") == "True"),
                started_at=p.created,
                draining=meta.get("deletionTimestamp") is not None,
            ))
        observations[key] = ModelObservation(
            name=key,
            spec=specs[key],
            desired_replicas=models[key].replicas,
            replicas=tuple(replicas),
            spec_error=errors.get(key),
        )

    snapshot = ClusterSnapshot(now=now, models=observations, inventory=inventory, training=workloads,
                               lent=dict(sorted(lent.items())))
    return ClusterView(snapshot=snapshot, models=models, nodes=node_infos, problems=problems,
                       training=training_refs)


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


def _node_infos(node_objs: Mapping[str, Mapping[str, Any]], live: Sequence[_Pod],
                owner_of: Mapping[str, str]) -> dict[str, NodeInfo]:
    by_node: dict[str, list[_Pod]] = {n: [] for n in node_objs}
    for p in live:
        if p.node in by_node:
            by_node[p.node].append(p)
    out = {}
    for name, obj in node_objs.items():
        meta, spec = _meta(obj), obj.get("spec") or {}
        gpu_pods: dict[str, int] = {}
        refs = []
        for p in sorted(by_node[name], key=lambda p: p.key):
            for res in p.gpus:
                gpu_pods[res] = gpu_pods.get(res, 0) + 1
            pmeta = _meta(p.obj)
            refs.append(PodRef(
                key=p.key,
                uid=str(pmeta.get("uid") or ""),
                labels=dict(p.labels),
                grace_s=_grace(p.obj.get("spec") or {}),
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
        )
    return out
