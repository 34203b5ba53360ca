"""GPU nodes as NVIDIA's DRA driver publishes them (``resource.k8s.io`` ResourceSlices) -> the same
:class:`~autoscaler.live.kube.gpu_nodes.GpuNode` the device-plugin reader gives, and which device a pod's
ResourceClaims hold: pure.

What the driver publishes (NVIDIA/k8s-dra-driver-gpu, ``cmd/gpu-kubelet-plugin``; driver name ``gpu.nvidia.com``,
one pool per node named after it, ``spec.nodeName`` set):

- a **whole GPU** is device ``gpu-<minor>`` (``deviceinfo.go`` ``GpuInfo.CanonicalName``/``GetDevice``) with
  attributes ``type: gpu``, ``uuid``, ``productName`` (NVML's name, e.g. ``NVIDIA A100-SXM4-80GB``), ``brand``,
  ``architecture``, ... and capacity ``memory`` (bytes);
- a **static MIG device** (a MIG instance that exists; the GPU itself is then not published) is
  ``gpu-<minor>-mig-<giProfileId>-<start>-<size>`` (``MigDeviceInfo.CanonicalName``) with ``type: mig``,
  ``parentUUID``, ``profile`` (``3g.40gb``), ``productName`` (the parent's) and capacities ``memory``,
  ``multiprocessors``, ... plus ``memorySlice<i>: 1`` for each memory slice it occupies: its placement;
- with the driver's **DynamicMIG** gate (KEP 4815, partitionable devices; ``partitions.go``, ``mig.go``) every
  possible MIG placement is published as ``gpu-<minor>-mig-<profile>-<giProfileId>-<start>``, each consuming
  counters ``memory-slice-<i>`` (and one per capacity) from the GPU's counter set ``gpu-<minor>-counter-set``
  (``spec.sharedCounters``); the whole GPU consumes all of them. The instance is created when a claim is
  allocated: the node's MIG layout is free to choose and there is nothing to relabel (``DraNode.dynamic_mig``).

API shapes (``k8s.io/api/resource/v1`` ``types.go``): ``ResourceSlice.spec`` {``driver``, ``pool`` {``name``,
``generation``, ``resourceSliceCount``}, ``nodeName``, ``devices[]`` {``name``, ``attributes`` {name: {``string`` |
``int`` | ``bool`` | ``version``}}, ``capacity`` {name: {``value``}}, ``consumesCounters[]``,
``allowMultipleAllocations``}, ``sharedCounters[]``}. ``v1beta2`` is the same; ``v1beta1`` wraps each device's
fields in ``basic:``. Only the newest generation of a pool counts; a pool with fewer slices of it than
``resourceSliceCount`` is incomplete (being rewritten) and its node is left out this read, as the scheduler does.

On a node the GPUs are indexed as the device-plugin reader indexes them: MIG GPUs first (static or dynamic), then
plain ones, each by minor; so one cluster read either way gives the same inventory. ``NodeSpec.labels`` gets
GPU Feature Discovery's ``nvidia.com/gpu.product`` spelling of ``productName`` (spaces as ``-``) where the node
has no such label, so that a slot template's GPU product reads the same on both kinds of nodes (the actuator turns
it into a claim selector on DRA nodes, :mod:`~autoscaler.live.kube.dra_claims`).

**Which devices are capacity** (issue 30, :mod:`~autoscaler.live.kube.dra_classes`): a device with a
``NoSchedule``/``NoExecute`` taint (``devices[].taints``, or a DeviceTaintRule's), or one the DeviceClass slotwise's
claims name for it does not select (``gpu.nvidia.com`` for whole GPUs and shares, ``mig.nvidia.com`` for MIG
devices; a selector it cannot evaluate selects none), is :attr:`DraDevice.unusable`: it stays in the node's
inventory (pods holding it keep their slot), and :func:`hold_unusable` takes what is free of it, so nothing new is
placed there.

**Which device a pod holds** is exact here (unlike the device plugin's): a pod's ``spec.resourceClaims`` name
ResourceClaims (``resourceClaimName``), or ``status.resourceClaimStatuses`` does for claims made from a template;
a claim's ``status.reservedFor`` names the pods using it too. Each allocated claim's
``status.allocation.devices.results[]`` says {``driver``, ``pool``, ``device``} (and ``consumedCapacity`` for a
share of a device with ``allowMultipleAllocations``, KEP 5075); results of other drivers are ignored.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from autoscaler.live.kube.dra_classes import (
    DeviceClassCheck,
    Taint,
    blocking,
    device_class_checks,
    device_taints,
    taint_rules,
)
from autoscaler.live.kube.fields import metadata
from autoscaler.live.kube.gpu_nodes import NVIDIA_LABEL_PREFIX, GpuNode
from sharing.catalog import Catalog
from sharing.render import GPU_PRODUCT
from sharing.slots import Inventory, NodeSpec, Slot

DRIVER = "gpu.nvidia.com"  # the GPU kubelet plugin's driver name (and its whole-GPU DeviceClass)
GPU_CLASS = "gpu.nvidia.com"  # DeviceClass: whole GPUs (the chart's deviceclass-gpu.yaml)
MIG_CLASS = "mig.nvidia.com"  # DeviceClass: MIG devices
_GIB = 1024**3

_GPU_NAME = re.compile(r"^gpu-(?P<minor>\d+)$")
_MIG_NAME = re.compile(r"^gpu-(?P<minor>\d+)-mig-(?P<rest>.+)$")
_TRAILING_INTS = re.compile(r"-(\d+)-(\d+)$")
_MEM_SLICE_CAP = re.compile(r"^memorySlice(\d+)$")
_MEM_SLICE_COUNTER = re.compile(r"^memory-slice-(\d+)$")
_QUANTITY = re.compile(r"^([0-9.]+)([a-zA-Z]*)$")
_SUFFIX = {"": 1, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30,
           "Ti": 2**40, "Pi": 2**50, "m": 1e-3}


def quantity(value: Any) -> float | None:
    """A Kubernetes quantity ("80Gi", "85899345920", "1") -> a number; None when not one."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int | float):
        return float(value)
    m = _QUANTITY.match(str(value).strip())
    if m is None or m[2] not in _SUFFIX:
        return None
    try:
        return float(m[1]) * _SUFFIX[m[2]]
    except ValueError:
        return None


def gfd_product(product_name: str) -> str:
    """GPU Feature Discovery's ``nvidia.com/gpu.product`` value for an NVML product name (spaces as dashes)."""
    return "-".join(product_name.split())


# -- one device, whatever the API version -------------------------------------------------------------------
@dataclass(frozen=True)
class RawDevice:
    """One published device, flattened: attributes as plain values, capacities as numbers."""

    name: str
    attributes: Mapping[str, Any]
    capacity: Mapping[str, float]
    counters: Mapping[str, float]  # consumed counters, all counter sets together
    multiple: bool  # allowMultipleAllocations (consumable capacity, KEP 5075)
    taints: tuple[Taint, ...] = ()  # devices[].taints (KEP 5055)


def _attr_value(v: Any) -> Any:
    if isinstance(v, Mapping):
        for k in ("string", "int", "bool", "version"):
            if k in v:
                return v[k]
        return None
    return v


def _cap_value(v: Any) -> float | None:
    return quantity(v.get("value") if isinstance(v, Mapping) else v)


def raw_device(dev: Mapping[str, Any]) -> RawDevice:
    """A device of ``spec.devices`` (v1, v1beta2, or v1beta1's ``basic:`` wrapper) as a :class:`RawDevice`."""
    body = dev.get("basic") if isinstance(dev.get("basic"), Mapping) else dev
    attrs = {}
    for k, v in (body.get("attributes") or {}).items():
        # qualified names: the driver's own attributes may be given as "gpu.nvidia.com/<name>"
        attrs[str(k).removeprefix(DRIVER + "/")] = _attr_value(v)
    cap = {str(k): c for k, v in (body.get("capacity") or {}).items() if (c := _cap_value(v)) is not None}
    counters: dict[str, float] = {}
    for use in body.get("consumesCounters") or ():
        for k, v in ((use or {}).get("counters") or {}).items():
            c = _cap_value(v)
            if c is not None:
                counters[str(k)] = counters.get(str(k), 0.0) + c
    return RawDevice(str(dev.get("name") or ""), attrs, cap, counters,
                     bool(body.get("allowMultipleAllocations") or dev.get("allowMultipleAllocations")),
                     device_taints(body))


# -- what a DRA node offers ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class DraDevice:
    """What one published device is in the inventory: a whole GPU or a MIG instance at its placement."""

    name: str
    index: int  # the GPU's index in the inventory
    profile: str | None = None  # MIG profile key; None: the whole GPU
    start: int | None = None
    shareable: bool = False  # allowMultipleAllocations: claims take shares of its consumable capacity
    memory_gib: float | None = None  # its published memory capacity
    # why no new replica may land on it (a NoSchedule/NoExecute taint, a DeviceClass that does not select it);
    # empty: usable. Pods that hold it still hold it (:func:`hold_unusable` takes only what is free)
    unusable: str = ""


@dataclass
class DraNode(GpuNode):
    """A GPU node whose GPUs come from the DRA driver's ResourceSlices: the device-plugin reader's :class:`GpuNode`
    (with the exact MIG layout in ``layout``) plus which device name is which slot."""

    pool: str = ""
    devices: dict[str, DraDevice] = field(default_factory=dict)  # device name -> what it is
    dynamic_mig: bool = False  # some GPU is partitionable (DynamicMIG): instances are made by claims
    product_name: str = ""  # the driver's productName (NVML's name), for claim selectors


@dataclass
class DraInventory:
    """Every node the NVIDIA driver publishes GPUs for, and which pool is whose."""

    nodes: dict[str, DraNode] = field(default_factory=dict)
    pool_node: dict[str, str] = field(default_factory=dict)  # pool name -> node
    incomplete: dict[str, str] = field(default_factory=dict)  # node -> why its slices are not read this time
    problems: list[str] = field(default_factory=list)

    def named(self, node: str) -> bool:
        """The driver's slices name this node (it is a DRA node, read or not)."""
        return node in self.nodes or node in self.incomplete


def _current_slices(slices: Iterable[Mapping[str, Any]], problems: list[str]
                    ) -> tuple[dict[str, list[Mapping[str, Any]]], dict[str, str], dict[str, str]]:
    """The NVIDIA driver's node-local slices of each pool's newest generation: pool -> slices, pool -> node, and
    node -> why its pool is incomplete."""
    by_pool: dict[str, list[Mapping[str, Any]]] = {}
    for s in slices:
        spec = s.get("spec") or {}
        if spec.get("driver") != DRIVER or not spec.get("nodeName"):
            continue  # other drivers; network-attached pools (allNodes / nodeSelector) are no node's GPUs
        pool = str((spec.get("pool") or {}).get("name") or spec.get("nodeName"))
        by_pool.setdefault(pool, []).append(s)
    out: dict[str, list[Mapping[str, Any]]] = {}
    pool_node: dict[str, str] = {}
    incomplete: dict[str, str] = {}
    for pool, group in sorted(by_pool.items()):
        gen = max(int((s["spec"].get("pool") or {}).get("generation") or 0) for s in group)
        newest = sorted((s for s in group if int((s["spec"].get("pool") or {}).get("generation") or 0) == gen),
                        key=lambda s: str(metadata(s).get("name")))
        want = max(int((s["spec"].get("pool") or {}).get("resourceSliceCount") or 1) for s in newest)
        nodes = sorted({str(s["spec"]["nodeName"]) for s in newest})
        if len(nodes) > 1:
            problems.append(f"DRA pool {pool}: slices name several nodes {nodes}; left out")
            continue
        node = nodes[0]
        if len(newest) < want:
            incomplete[node] = f"DRA pool {pool} generation {gen}: {len(newest)} of {want} slices published"
            continue
        out[pool] = newest
        pool_node[pool] = node
    return out, pool_node, incomplete


def _mig_start(d: RawDevice, rest: str) -> int | None:
    """The MIG device's placement start: the memory slices it occupies (static: ``memorySlice<i>`` capacities;
    dynamic: ``memory-slice-<i>`` counters), else the start in its canonical name."""
    slices = [int(m[1]) for k in d.capacity if (m := _MEM_SLICE_CAP.match(k))]
    slices += [int(m[1]) for k in d.counters if (m := _MEM_SLICE_COUNTER.match(k))]
    if slices:
        return min(slices)
    m = _TRAILING_INTS.search(rest)
    if m is None:
        return None
    # static names end "-<start>-<size>" (profile id before them), dynamic ones "-<profileId>-<start>"
    return int(m[2]) if d.counters else int(m[1])


def _read_node(node: str, pool: str, devices: Sequence[RawDevice], labels: Mapping[str, str], catalog: Catalog,
               classes: Mapping[str, DeviceClassCheck] | None = None) -> DraNode | str:
    products = sorted({str(d.attributes["productName"]) for d in devices if d.attributes.get("productName")})
    if not products:
        return f"node {node}: DRA devices of {DRIVER} without a productName attribute; left out"
    try:
        kinds = {catalog.resolve(p) for p in products}
    except KeyError:
        return f"node {node}: unknown GPU product(s) {products} in its DRA devices; left out"
    if len(kinds) > 1:
        return f"node {node}: DRA devices of several GPU kinds {sorted(kinds)}; left out"
    gpu = catalog.get(kinds.pop())
    problems: list[str] = []
    whole: dict[int, RawDevice] = {}
    migs: dict[int, list[tuple[RawDevice, str, int]]] = {}  # parent minor -> (device, profile key, start)
    dynamic: set[int] = set()
    for d in devices:
        kind = d.attributes.get("type")
        if kind == "gpu" and (m := _GPU_NAME.match(d.name)):
            minor = int(m["minor"])
            whole[minor] = d
            if d.counters:
                dynamic.add(minor)
        elif kind == "mig" and (m := _MIG_NAME.match(d.name)):
            minor = int(m["minor"])
            try:
                p = gpu.profile(str(d.attributes.get("profile") or ""))
            except KeyError:
                problems.append(f"node {node}: DRA device {d.name}: {gpu.name} has no MIG profile "
                                f"{d.attributes.get('profile')!r}; ignored")
                continue
            start = _mig_start(d, m["rest"])
            if start is None or start not in p.placements:
                problems.append(f"node {node}: DRA device {d.name}: no legal placement of {p.name} ({start}); ignored")
                continue
            migs.setdefault(minor, []).append((d, p.key, start))
            if d.counters:
                dynamic.add(minor)
        # other types (vfio passthrough, ...) are no inference slots
    if (migs or dynamic) and not gpu.mig_capable:
        return f"node {node}: MIG devices published on {gpu.name}, which does not support MIG; left out"
    mig_minors = sorted(set(migs) | dynamic)
    plain = sorted(set(whole) - set(mig_minors))
    index = {minor: i for i, minor in enumerate([*mig_minors, *plain])}
    out: dict[str, DraDevice] = {}
    layout: dict[int, tuple[tuple[str, int], ...]] = {}
    mig_counts: dict[str, int] = {}
    for minor in mig_minors:
        i = index[minor]
        if minor in whole:  # a partitionable GPU may also be taken whole
            out[whole[minor].name] = _dra_device(whole[minor], i, None, None, classes)
        static = [] if minor in dynamic else sorted({(k, s) for _, k, s in migs.get(minor, [])}, key=lambda x: x[1])
        layout[i] = tuple(static)
        for k, _s in static:
            mig_counts[k] = mig_counts.get(k, 0) + 1
        for d, k, s in migs.get(minor, []):
            out[d.name] = _dra_device(d, index[minor], k, s, classes)
    for minor in plain:
        out[whole[minor].name] = _dra_device(whole[minor], index[minor], None, None, classes)
    count = len(index)
    nv_labels = {k: v for k, v in labels.items() if k.startswith(NVIDIA_LABEL_PREFIX)}
    nv_labels.setdefault(GPU_PRODUCT, gfd_product(products[0]))
    spec = NodeSpec(node, gpu.name, count, mig_enabled=bool(mig_minors), labels=nv_labels)
    return DraNode(spec, gpu, 1, len(mig_minors), mig_counts, {}, None, problems, layout=layout, pool=pool,
                   devices=out, dynamic_mig=bool(dynamic), product_name=products[0])


def _dra_device(d: RawDevice, index: int, profile: str | None, start: int | None,
                classes: Mapping[str, DeviceClassCheck] | None = None) -> DraDevice:
    mem = d.capacity.get("memory")
    return DraDevice(d.name, index, profile, start, d.multiple, None if mem is None else mem / _GIB,
                     unusable=_unusable(d, MIG_CLASS if profile is not None else GPU_CLASS, classes))


def _unusable(d: RawDevice, device_class: str, classes: Mapping[str, DeviceClassCheck] | None) -> str:
    """Why a claim of slotwise's (class ``device_class``) cannot get this device now; "" when it can.
    ``classes`` None: DeviceClasses not read (the pure callers that pass none), no class check."""
    taints = blocking(d.taints)
    if taints:
        return f"tainted {', '.join(map(str, taints))}"
    if classes is None:
        return ""
    check = classes.get(device_class)
    if check is None:
        return f"no DeviceClass {device_class} (a claim naming it is never allocated)"
    if check.not_understood is not None:
        return f"DeviceClass {device_class}'s selector is not understood"
    if not check.selects(DRIVER, d.attributes):
        return f"not selected by DeviceClass {device_class}"
    return ""


def read_slices(slices: Iterable[Mapping[str, Any]], catalog: Catalog,
                node_labels: Mapping[str, Mapping[str, str]] | None = None,
                device_classes: Iterable[Mapping[str, Any]] | None = None,
                device_taint_rules: Iterable[Mapping[str, Any]] = ()) -> DraInventory:
    """Every node the NVIDIA driver's ResourceSlices name -> its :class:`DraNode` (or a problem line).

    ``node_labels``: each node's labels (its ``nvidia.com/*`` ones go into ``NodeSpec.labels`` as on device-plugin
    nodes). ``device_classes``: the served DeviceClasses; a device the class slotwise's claims name for it
    (:data:`GPU_CLASS`, :data:`MIG_CLASS`) does not select, or a tainted one, is :attr:`DraDevice.unusable`
    (:mod:`~autoscaler.live.kube.dra_classes`). None: not read, only taints count. ``device_taint_rules``: the
    served DeviceTaintRules (alpha), whose taints count as the slices' own."""
    out = DraInventory()
    classes = None if device_classes is None else device_class_checks(device_classes)
    rules = taint_rules(device_taint_rules)
    for name in (GPU_CLASS, MIG_CLASS) if classes is not None else ():
        check = classes.get(name) if classes is not None else None
        if check is not None and check.not_understood is not None:
            out.problems.append(f"DeviceClass {name}: selector {check.not_understood} is not understood (slotwise "
                                "evaluates && of ==/!= on device.driver and attributes); its devices count as "
                                "selected by none")
    pools, pool_node, out.incomplete = _current_slices(slices, out.problems)
    per_node: dict[str, list[tuple[str, RawDevice]]] = {}
    for pool, group in pools.items():
        for s in group:
            for dev in (s.get("spec") or {}).get("devices") or ():
                if isinstance(dev, Mapping):
                    raw = raw_device(dev)
                    ruled = tuple(r.taint for r in rules if r.applies(DRIVER, pool, raw.name, raw.attributes, classes))
                    if ruled:
                        raw = replace(raw, taints=raw.taints + ruled)
                    per_node.setdefault(pool_node[pool], []).append((pool, raw))
    for node in sorted(set(pool_node.values())):
        entries = per_node.get(node, [])
        if not entries:
            continue  # a pool without devices (e.g. only shared counters, or all unhealthy): nothing offered
        pool = sorted({p for p, _ in entries})[0]
        got = _read_node(node, pool, [d for _, d in entries], (node_labels or {}).get(node, {}), catalog, classes)
        if isinstance(got, str):
            out.problems.append(got)
            continue
        out.nodes[node] = got
        out.problems.extend(f"node {node}: DRA device {d.name}: {d.unusable}; takes no new replica"
                            for d in sorted(got.devices.values(), key=lambda d: d.name) if d.unusable)
    out.pool_node = {p: n for p, n in pool_node.items() if n in out.nodes}
    return out


# -- which device a pod holds -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Held:
    """One device a pod's claims hold (NVIDIA driver only)."""

    claim: str  # "<ns>/<name>"
    pool: str
    device: str
    memory_gib: float | None = None  # consumedCapacity memory: a share of the device


@dataclass
class ClaimIndex:
    """The ResourceClaims by key, and which pods (``ns/name`` or uid) their ``reservedFor`` names."""

    claims: dict[str, Mapping[str, Any]] = field(default_factory=dict)
    reserved: dict[str, list[str]] = field(default_factory=dict)  # pod key or uid -> claim keys


def index_claims(claims: Iterable[Mapping[str, Any]]) -> ClaimIndex:
    out = ClaimIndex()
    for c in claims:
        meta = metadata(c)
        ns = str(meta.get("namespace") or "")
        key = f"{ns}/{meta.get('name')}"
        out.claims[key] = c
        for r in (c.get("status") or {}).get("reservedFor") or ():
            if isinstance(r, Mapping) and r.get("resource", "pods") == "pods":
                if r.get("uid"):
                    out.reserved.setdefault(str(r["uid"]), []).append(key)
                elif r.get("name"):
                    out.reserved.setdefault(f"{ns}/{r['name']}", []).append(key)
    return out


def pod_claim_keys(pod: Mapping[str, Any], index: ClaimIndex) -> list[str]:
    """The claims a pod uses: those its spec names, those made for it from templates (its status says which),
    and those whose ``reservedFor`` names it; by key, each once."""
    meta = metadata(pod)
    ns = str(meta.get("namespace") or "")
    keys: list[str] = []
    for ref in (pod.get("spec") or {}).get("resourceClaims") or ():
        if isinstance(ref, Mapping) and ref.get("resourceClaimName"):
            keys.append(f"{ns}/{ref['resourceClaimName']}")
    for st in (pod.get("status") or {}).get("resourceClaimStatuses") or ():
        if isinstance(st, Mapping) and st.get("resourceClaimName"):
            keys.append(f"{ns}/{st['resourceClaimName']}")
    keys += index.reserved.get(str(meta.get("uid") or ""), [])
    keys += index.reserved.get(f"{ns}/{meta.get('name')}", [])
    return list(dict.fromkeys(keys))


def pod_devices(pod: Mapping[str, Any], index: ClaimIndex) -> list[Held]:
    """The NVIDIA devices the pod's allocated claims hold (other drivers' results are not GPUs of ours)."""
    held: list[Held] = []
    for key in pod_claim_keys(pod, index):
        claim = index.claims.get(key)
        if claim is None:
            continue
        alloc = (claim.get("status") or {}).get("allocation") or {}
        for r in (alloc.get("devices") or {}).get("results") or ():
            if not isinstance(r, Mapping) or r.get("driver") != DRIVER:
                continue
            mem = quantity((r.get("consumedCapacity") or {}).get("memory"))
            held.append(Held(key, str(r.get("pool") or ""), str(r.get("device") or ""),
                             None if mem is None else mem / _GIB))
    return held


def dra_slot(dn: DraNode, held: Sequence[Held]) -> Slot | str:
    """The slot the devices ``held`` are in the inventory: whole GPUs, one MIG instance at its placement, or one
    share (consumed memory) of a device; a problem string otherwise."""
    node, gpu = dn.spec.name, dn.gpu
    devs: list[tuple[Held, DraDevice]] = []
    for h in held:
        d = dn.devices.get(h.device)
        if d is None or (h.pool and h.pool != dn.pool):
            return f"claim {h.claim} holds device {h.pool}/{h.device}, which the node's slices do not publish"
        devs.append((h, d))
    shares = [(h, d) for h, d in devs if h.memory_gib is not None]
    if shares:
        if len(devs) != 1:
            return f"holds {len(devs)} devices, one of them a share (a replica holds one share)"
        ((h, d),) = shares
        assert h.memory_gib is not None
        if d.profile is not None:
            p = gpu.profiles[d.profile]
            return Slot.share(node, d.index, gpu, h.memory_gib,
                              gpu.compute_fraction(p) * h.memory_gib / p.memory_gib, profile=d.profile, start=d.start)
        return Slot.share(node, d.index, gpu, h.memory_gib, h.memory_gib / gpu.memory_gib)
    migs = [d for _, d in devs if d.profile is not None]
    if migs:
        if len(devs) != 1:
            return f"holds {len(devs)} devices, {len(migs)} of them MIG (a replica holds one MIG instance)"
        d = migs[0]
        assert d.start is not None
        return Slot.mig(node, d.index, gpu, d.profile, d.start)
    indices = sorted({d.index for _, d in devs})
    if len(indices) != len(devs):
        return "holds the same GPU twice"
    return Slot.whole(node, indices, gpu)


# -- devices no new replica may take ------------------------------------------------------------------------
UNUSABLE_MODEL = "(dra unusable)"  # the inventory's model for what unusable devices have free: nobody's replicas


def hold_unusable(inv: Inventory, dn: DraNode) -> None:
    """Take what each unusable device of ``dn`` (tainted, or not selected by its DeviceClass) has free, so the
    packer places nothing there; run after the pods are allocated: a pod that holds such a device keeps it (a
    NoSchedule taint leaves running pods alone; NoExecute ones are the eviction's business, not a read's)."""
    for d in sorted(dn.devices.values(), key=lambda d: d.name):
        slot = _free_part(inv, dn, d) if d.unusable else None
        if slot is None:
            continue
        try:
            inv.allocate(slot, f"dra-unusable:{dn.spec.name}/{d.name}", UNUSABLE_MODEL)
        except ValueError:
            continue  # what it would take is already taken (an overlapping MIG placement): unusable either way


def _free_part(inv: Inventory, dn: DraNode, d: DraDevice) -> Slot | None:
    """The slot that covers what device ``d`` still has free: the whole GPU when idle, the rest of a shared one,
    its MIG instance when nobody is in it; None when nothing is free (or it is a partitionable GPU's whole-GPU
    device: the inventory has that GPU in MIG mode, where no whole slot is placed anyway)."""
    node, gpu = dn.spec.name, dn.gpu
    state = inv.device(node, d.index)
    if d.profile is not None:
        assert d.start is not None
        return None if state.occupants((d.profile, d.start)) else Slot.mig(node, d.index, gpu, d.profile, d.start)
    if state.mig_enabled or state.whole_owner is not None:
        return None
    if state.idle:
        return Slot.whole(node, d.index, gpu)
    room = inv.share_room_gib(state)
    used = sum(s.compute_fraction for _, s in state.entries)
    return Slot.share(node, d.index, gpu, room, max(0.0, 1.0 - used)) if room > 0 else None
