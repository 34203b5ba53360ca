"""GPU nodes as the Kubernetes API shows them -> what the inventory holds, and which of it a pod takes: pure.

- :func:`out_of_service` says why a GPU node offers nothing now although its labels say GPUs: NotReady (its
  ``Ready`` condition not True), or the device plugin stopped advertising them (allocatable 0 where capacity
  is not).
- :func:`read_gpu_node` reads a node's GPUs from GPU Feature Discovery's labels and the device plugin's capacity:
  kind (``nvidia.com/gpu.product``), count, time-slicing replicas, MIG strategy and per-profile instance counts
  (:class:`GpuNode`); :func:`node_spec` gives just the :class:`~sharing.slots.NodeSpec`.
- MIG layouts are not visible in the API, only counts per profile: :func:`lay_out` rebuilds them as a mig-parted
  ``devices: all`` config lays them out (:func:`sharing.mig_layout.lay_out_mig_node`); :func:`mig_layout` shows
  the result for one node.
- :func:`host_quantities` reads a Node's ``status.allocatable`` CPU and memory (the host capacity its slots may
  use; :class:`~sharing.slots.NodeSpec` ``cpu_millis`` / ``host_memory_gib``), :func:`pod_host_requests` a pod's
  CPU and memory requests as the scheduler counts them; :func:`cpu_millis` and :func:`memory_gib` parse
  Kubernetes quantities ("500m", "2", "16Gi", "1G") and name the field they came from when one is not.
- :func:`pod_gpu_requests` reads what GPU resources a pod asks for, as the scheduler counts them, and
  :func:`find_slot` which free device or instance of a laid-out node such a request takes (the first that fits:
  the device plugin does not say which it picked).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from decimal import Decimal
from typing import Any

from autoscaler.live.kube.fields import condition, metadata, parse_count
from autoscaler.live.kube.objects import (
    GPU_COUNT,
    GPU_REPLICAS,
    GPU_RESOURCE,
    MIG_CONFIG,
    MIG_RESOURCE_PREFIX,
    MIG_STRATEGY,
)
from sharing.catalog import Catalog, GpuModel, load_catalog
from sharing.mig_layout import gpus_needed, instances_per_gpu, lay_out_mig_node
from sharing.render import GPU_PRODUCT
from sharing.slots import Inventory, NodeSpec, Slot

NVIDIA_LABEL_PREFIX = "nvidia.com/"
_MIG_OFF_CONFIGS = frozenset({"", "all-disabled"})
_SINGLE_MIG = re.compile(r"-MIG-(?P<profile>[^-]+)$", re.IGNORECASE)


# -- host CPU and memory: Kubernetes quantities -----------------------------------------------------------------
# resource.Quantity's suffixes (k8s.io/apimachinery/pkg/api/resource): binary, decimal SI, or a decimal exponent.
_QUANTITY = re.compile(r"^([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
                       r"(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E|[eE][+-]?[0-9]+)?$")
_BINARY = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_GIB = Decimal(2**30)
_MAX_QUANTITY = Decimal(2**63 - 1)  # resource.Quantity's int64 range: larger is no host's CPU or memory


def quantity_value(value: Any, field_name: str) -> Decimal:
    """A Kubernetes quantity ("500m", "2", "16Gi", "1G", "1e3", or a plain number) exactly; ValueError naming
    ``field_name`` when it is not one or is negative."""
    if isinstance(value, bool) or value is None:
        raise ValueError(f"{field_name}: {value!r} is not a Kubernetes quantity")
    text = str(value).strip()
    m = _QUANTITY.match(text)
    if m is None:
        raise ValueError(f"{field_name}: {value!r} is not a Kubernetes quantity (e.g. '500m', '2', '16Gi', '1G')")
    suffix = m[2] or ""
    try:  # Overflow / InvalidOperation (an exponent past the decimal context) are ArithmeticErrors
        number = Decimal(m[1])
        if suffix in _BINARY:
            number *= Decimal(1024) ** _BINARY[suffix]
        elif suffix in _DECIMAL:
            number = number.scaleb(_DECIMAL[suffix])
        else:  # a decimal exponent, "e3"
            number = number.scaleb(int(suffix[1:]))
    except (ArithmeticError, ValueError):
        raise ValueError(f"{field_name}: {value!r} is out of range for a Kubernetes quantity") from None
    if not number.is_finite() or number > _MAX_QUANTITY:
        raise ValueError(f"{field_name}: {value!r} is out of range for a Kubernetes quantity")
    if number < 0:
        raise ValueError(f"{field_name}: {value!r} is negative")
    return number


def cpu_millis(value: Any, field_name: str) -> int:
    """CPU in millicores, rounded up as Kubernetes does (``MilliValue``): "500m" -> 500, "2" -> 2000."""
    return int((quantity_value(value, field_name) * 1000).to_integral_value(rounding="ROUND_CEILING"))


def memory_gib(value: Any, field_name: str) -> float:
    """Memory in GiB: "16Gi" -> 16.0, "1G" -> 0.931..., "1073741824" -> 1.0."""
    return float(quantity_value(value, field_name) / _GIB)


def host_quantities(resources: Mapping[str, Any], where: str) -> tuple[int | None, float | None]:
    """(cpu millis, memory GiB) of a resource map (a Node's allocatable, a container's requests); None for what it
    does not give. ValueError naming ``where.cpu`` / ``where.memory`` on a malformed quantity."""
    cpu = resources.get("cpu")
    mem = resources.get("memory")
    return (None if cpu is None else cpu_millis(cpu, f"{where}.cpu"),
            None if mem is None else memory_gib(mem, f"{where}.memory"))


def pod_host_requests(pod_spec: Mapping[str, Any], where: str = "spec") -> tuple[int, float]:
    """(CPU millis, memory GiB) a pod asks for, as the scheduler counts it: per container its ``requests`` (else
    its ``limits``, which a missing request defaults to), summed, plus every restartable (sidecar, ``restartPolicy:
    Always``) init container's; the larger of that and any one plain init container's with the sidecars started
    before it (init containers run one by one, sidecars keep running: the scheduler's rule, KEP-753); plus the pod's
    ``overhead``. ValueError naming the field on a malformed quantity."""
    def one(c: Mapping[str, Any], at: str) -> tuple[int, float]:
        res = c.get("resources") or {}
        req, lim = res.get("requests") or {}, res.get("limits") or {}
        cpu = req.get("cpu", lim.get("cpu"))
        mem = req.get("memory", lim.get("memory"))
        return (0 if cpu is None else cpu_millis(cpu, f"{at}.resources.{'requests' if 'cpu' in req else 'limits'}.cpu"),
                0.0 if mem is None else memory_gib(
                    mem, f"{at}.resources.{'requests' if 'memory' in req else 'limits'}.memory"))

    cpu, mem = 0, 0.0
    for i, c in enumerate(pod_spec.get("containers") or ()):
        a, b = one(c, f"{where}.containers[{i}]")
        cpu, mem = cpu + a, mem + b
    side_cpu, side_mem, init_cpu, init_mem = 0, 0.0, 0, 0.0
    for i, c in enumerate(pod_spec.get("initContainers") or ()):
        a, b = one(c, f"{where}.initContainers[{i}]")
        if c.get("restartPolicy") == "Always":
            side_cpu, side_mem = side_cpu + a, side_mem + b
            init_cpu, init_mem = max(init_cpu, side_cpu), max(init_mem, side_mem)
        else:
            init_cpu, init_mem = max(init_cpu, side_cpu + a), max(init_mem, side_mem + b)
    cpu, mem = max(cpu + side_cpu, init_cpu), max(mem + side_mem, init_mem)
    oc, om = host_quantities(pod_spec.get("overhead") or {}, f"{where}.overhead")
    return cpu + (oc or 0), mem + (om or 0.0)


def with_allocatable(spec: NodeSpec, node: Mapping[str, Any], problems: list[str]) -> NodeSpec:
    """``spec`` with the Node's ``status.allocatable`` CPU and memory as its host capacity (what the kubelet admits
    pods against; the translation then holds what pods without a GPU slot request there). A malformed quantity is
    a problem line and leaves that node's host resources not accounted."""
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    try:
        cpu, mem = host_quantities(allocatable, f"node {spec.name}: status.allocatable")
    except ValueError as e:
        problems.append(f"{e}; its host CPU/memory are not accounted")
        return spec
    if cpu is None and mem is None:
        return spec
    return replace(spec, cpu_millis=cpu, host_memory_gib=mem)


# -- what a pod asks for -------------------------------------------------------------------------------------
def is_gpu_resource(name: str) -> bool:
    """``nvidia.com/gpu`` (a whole GPU, a time-sliced replica, or the single strategy's MIG device) or a
    mixed-strategy MIG profile ``nvidia.com/mig-<profile>``."""
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
        n = parse_count(limits[name] if name in limits else requests[name])
        if n:
            out[name] = n
    return out


# -- what a node offers --------------------------------------------------------------------------------------
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
    # The exact MIG layout per MIG GPU (index -> (profile key, start) instances) where the API publishes it (DRA
    # ResourceSlices, autoscaler/live/kube/dra.py); None: only counts are known and lay_out rebuilds a layout.
    layout: dict[int, tuple[tuple[str, int], ...]] | None = None


def _capacity(node: Mapping[str, Any]) -> Mapping[str, Any]:
    status = node.get("status") or {}
    return status.get("capacity") or status.get("allocatable") or {}


def is_gpu_node(node: Mapping[str, Any]) -> bool:
    """GFD labelled it, or the device plugin advertises GPUs on it."""
    if GPU_PRODUCT in (metadata(node).get("labels") or {}):
        return True
    return any(is_gpu_resource(k) and (parse_count(v) or 0) > 0 for k, v in _capacity(node).items())


def out_of_service(node: Mapping[str, Any]) -> str | None:
    """Why the node's GPUs are no capacity now (None: they are), whatever its labels say.

    - **NotReady**: a ``Ready`` condition whose status is not ``True`` (``False``: the kubelet says so;
      ``Unknown``: the node stopped reporting). Its pods may be dead or unreachable, and the node lifecycle
      controller evicts them later; nothing new is scheduled there. A node with no Ready condition at all (not
      reported yet) is not judged.
    - **GPUs not advertised**: every GPU resource with capacity has allocatable 0 (or none): the device plugin
      stopped or marked its devices unhealthy, so the scheduler places no GPU pod there. A node without an
      ``allocatable`` map at all is not judged.
    """
    ready = condition(node, "Ready")
    if ready is not None and ready.get("status") != "True":
        why = ready.get("reason") or ready.get("message") or ""
        return f"NotReady (Ready={ready.get('status')}{': ' + str(why) if why else ''})"
    status = node.get("status") or {}
    allocatable = status.get("allocatable")
    if not isinstance(allocatable, Mapping):
        return None
    advertised = {k: parse_count(v) or 0 for k, v in (status.get("capacity") or {}).items() if is_gpu_resource(k)}
    advertised = {k: n for k, n in advertised.items() if n > 0}
    if advertised and all(not parse_count(allocatable.get(k)) for k in advertised):
        what = ", ".join(f"{k}={n}" for k, n in sorted(advertised.items()))
        return f"the device plugin advertises no GPUs (allocatable 0, capacity {what})"
    return None


def read_gpu_node(node: Mapping[str, Any], catalog: Catalog) -> GpuNode | str:
    """The node's GPUs (kind, count, MIG and time-slicing), or a problem line when they cannot be known."""
    meta = metadata(node)
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
    replicas = max(1, parse_count(labels.get(GPU_REPLICAS)) or 1)
    label_count = parse_count(labels.get(GPU_COUNT))
    gpu_cap = parse_count(capacity.get(GPU_RESOURCE)) or 0
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
        per_gpu = instances_per_gpu(gpu, p, catalog)
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
        n = parse_count(raw)
        if not n:
            continue
        try:
            p = gpu.profile(pname)
        except KeyError:
            problems.append(f"node {name}: {gpu.name} has no MIG profile {pname!r}; its {n} instance(s) ignored")
            continue
        r = max(1, parse_count(labels.get(f"{MIG_RESOURCE_PREFIX}{pname}.replicas")) or 1)
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
        count = plain_cap + gpus_needed(gpu, mig_counts, catalog)
    else:
        count = plain_cap
    mig_gpus = max(0, count - min(plain_cap, count)) if mig_on else 0
    spec = NodeSpec(name, gpu.name, count, mig_enabled=mig_on and count > 0, labels=nv_labels)
    return GpuNode(spec, gpu, replicas, mig_gpus, mig_counts, mig_replicas, None, problems)


def node_spec(node: Mapping[str, Any], catalog: Catalog) -> NodeSpec | str:
    """The node's :class:`NodeSpec` (labels: its ``nvidia.com/*`` labels), or a problem string.

    A node without GPUs is a problem string too; the translation only asks about GPU nodes. Cordoning is not
    judged here (the node's GPUs are what they are); the translation leaves cordoned nodes out of the inventory.
    """
    if not is_gpu_node(node):
        return f"node {metadata(node).get('name')}: not a GPU node"
    got = read_gpu_node(node, catalog)
    return got if isinstance(got, str) else got.spec


def mig_layout(node: Mapping[str, Any], catalog: Catalog | None = None) -> dict[int, list[tuple[str, int]] | None]:
    """The node's reconstructed MIG layout per GPU (None: MIG off), as the translation assumes it."""
    cat = catalog if catalog is not None else load_catalog()
    got = read_gpu_node(node, cat)
    if isinstance(got, str):
        return {}
    inv = Inventory.from_nodes([got.spec], cat)
    lay_out(inv, got, [])
    return {i: list(inv.mig_layout(got.spec.name, i)) if inv.device(got.spec.name, i).mig_enabled else None
            for i in range(got.spec.gpu_count)}


def lay_out(inv: Inventory, gn: GpuNode, problems: list[str]) -> None:
    """Rebuild the node's MIG layout in ``inv`` (MIG GPUs first, the plain ones after); what fits nowhere is a
    problem line. A node whose layout is published (``gn.layout``, DRA) gets exactly that: its plain GPUs out of
    MIG mode, its instances pinned at their placements (a GPU with none stays in MIG mode, free to lay out)."""
    name = gn.spec.name
    if not gn.spec.mig_enabled:
        return
    if gn.layout is not None:
        for i in range(gn.spec.gpu_count):
            if i not in gn.layout:
                inv.set_mig_mode(name, i, False)
                continue
            for key, start in gn.layout[i]:
                try:
                    inv.create_mig_instance(name, i, key, start)
                except ValueError as e:
                    problems.append(f"node {name}: published MIG device {key}@{start} on GPU {i}: {e}; left out")
        return
    dropped = lay_out_mig_node(inv, name, gn.mig_gpus, gn.mig_counts)
    if dropped:
        what = ", ".join(f"{n} x {gn.gpu.profiles[k].name}" for k, n in sorted(dropped.items()))
        problems.append(
            f"node {name}: MIG capacity does not fit its {gn.mig_gpus} MIG GPU(s) ({gn.gpu.name}); "
            f"left out: {what}"
        )


# -- which slot a pod holds ----------------------------------------------------------------------------------
def find_slot(inv: Inventory, gn: GpuNode, resource: str, n: int, spec_mem: float | None) -> Slot | str:
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
