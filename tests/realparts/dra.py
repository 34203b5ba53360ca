"""NVIDIA-DRA-driver-shaped objects for the tests: ResourceSlices as ``gpu.nvidia.com``'s kubelet plugin publishes
them (NVIDIA/k8s-dra-driver-gpu ``cmd/gpu-kubelet-plugin``: ``deviceinfo.go`` for whole GPUs and static MIG devices,
``partitions.go``/``mig.go`` for DynamicMIG's partitionable devices), and ResourceClaims as the scheduler leaves
them allocated (``status.allocation.devices.results[]``, ``status.reservedFor``); ``resource.k8s.io/v1`` shapes,
with :func:`as_v1beta1` for the ``basic:``-wrapped v1beta1 one.

:func:`dra_twin` describes a device-plugin cluster (nodes labelled by GPU Feature Discovery, pods asking for
``nvidia.com/*`` resources) the DRA way: the same GPUs, the MIG layout the translation rebuilt, each pod holding
through a claim exactly the device the translation gave it. The differential tests compare the two.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from sharing.catalog import GpuModel
from sharing.slots import Inventory, Slot, SlotKind

DRIVER = "gpu.nvidia.com"
API = "resource.k8s.io/v1"
GIB = 1024**3
# NVML GPU-instance profile ids (``nvidia-smi mig -lgip``) by layout key; part of the driver's device names
GI_PROFILE_ID = {"1g": 19, "1g+me": 20, "1g.2mem": 15, "2g": 14, "3g": 9, "4g": 5, "7g": 0, "2g+me": 6}


def _product(gpu: GpuModel) -> str:
    return {"A100-80GB": "NVIDIA A100-SXM4-80GB", "A100-40GB": "NVIDIA A100-SXM4-40GB",
            "H100-80GB": "NVIDIA H100 80GB HBM3", "L4-24GB": "NVIDIA L4", "A30-24GB": "NVIDIA A30",
            "H200-141GB": "NVIDIA H200", "T4-16GB": "Tesla T4"}.get(gpu.name, f"NVIDIA {gpu.name}")


def _common(gpu: GpuModel, minor: int) -> dict[str, Any]:
    return {"productName": {"string": _product(gpu)}, "brand": {"string": "Nvidia"},
            "architecture": {"string": "Hopper" if gpu.name.startswith("H") else "Ampere"},
            "cudaComputeCapability": {"version": "9.0.0"}, "driverVersion": {"version": "570.124.6"},
            "cudaDriverVersion": {"version": "12.8.0"}, "pcieBusID": {"string": f"0000:{minor + 0x10:02x}:00.0"}}


def gpu_device(gpu: GpuModel, minor: int, *, counters: bool = False) -> dict[str, Any]:
    """A whole GPU, ``gpu-<minor>`` (with ``counters``: a partitionable one consuming its whole counter set)."""
    dev: dict[str, Any] = {
        "name": f"gpu-{minor}",
        "attributes": {"type": {"string": "gpu"}, "uuid": {"string": f"GPU-{minor:08x}-0000-0000-0000-000000000000"},
                       **_common(gpu, minor)},
        "capacity": {"memory": {"value": f"{int(gpu.memory_gib * 1024)}Mi"}},
    }
    if counters:
        dev["consumesCounters"] = [{"counterSet": f"gpu-{minor}-counter-set", "counters": {
            **{f"memory-slice-{i}": {"value": "1"} for i in range(gpu.mem_slices_total)},
            "multiprocessors": {"value": "132"}}}]
    return dev


def mig_device(gpu: GpuModel, minor: int, key: str, start: int, *, dynamic: bool = False) -> dict[str, Any]:
    """A MIG device: static (it exists; ``gpu-<minor>-mig-<id>-<start>-<size>``, ``memorySlice<i>`` capacities) or
    dynamic (a possible placement; ``gpu-<minor>-mig-<profile>-<id>-<start>``, consuming ``memory-slice-<i>``)."""
    p = gpu.profiles[key]
    pid = GI_PROFILE_ID.get(key, 99)
    attrs = {"type": {"string": "mig"}, "parentUUID": {"string": f"GPU-{minor:08x}-0000-0000-0000-000000000000"},
             "profile": {"string": p.name}, **_common(gpu, minor)}
    cap: dict[str, Any] = {"memory": {"value": f"{int(p.memory_gib * 1024)}Mi"},
                           "multiprocessors": {"value": str(p.compute_slices * 16)}}
    if dynamic:
        pname = p.name.replace(".", "").replace("+", "-")
        return {"name": f"gpu-{minor}-mig-{pname}-{pid}-{start}", "attributes": attrs, "capacity": cap,
                "consumesCounters": [{"counterSet": f"gpu-{minor}-counter-set", "counters": {
                    **{f"memory-slice-{i}": {"value": "1"} for i in range(start, start + p.mem_slices)},
                    "multiprocessors": {"value": str(p.compute_slices * 16)}}}]}
    attrs["uuid"] = {"string": f"MIG-{minor:04x}{start:04x}-0000-0000-0000-000000000000"}
    cap.update({f"memorySlice{i}": {"value": "1"} for i in range(start, start + p.mem_slices)})
    return {"name": f"gpu-{minor}-mig-{pid}-{start}-{p.mem_slices}", "attributes": attrs, "capacity": cap}


def resource_slice(node: str, devices: Sequence[Mapping[str, Any]], *, generation: int = 1, slice_count: int = 1,
                   suffix: str = "", shared_counters: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
    spec: dict[str, Any] = {"driver": DRIVER, "nodeName": node, "devices": [dict(d) for d in devices],
                            "pool": {"name": node, "generation": generation, "resourceSliceCount": slice_count}}
    if shared_counters:
        spec["sharedCounters"] = [dict(c) for c in shared_counters]
    return {"apiVersion": API, "kind": "ResourceSlice",
            "metadata": {"name": f"{node}-{DRIVER}-{suffix or 'x'}"}, "spec": spec}


def node_slice(gpu: GpuModel, node: str, *, plain: int = 0, mig: Mapping[int, Sequence[tuple[str, int]]] | None = None,
               dynamic: int = 0) -> dict[str, Any]:
    """One node's slice: MIG GPUs (minors 0.. with their static instances), then ``dynamic`` partitionable GPUs
    (every placement of every profile), then ``plain`` whole GPUs."""
    devices: list[dict[str, Any]] = []
    minor = 0
    for minor, instances in sorted((mig or {}).items()):
        devices += [mig_device(gpu, minor, k, s) for k, s in instances]
    first = len(mig or {})
    counter_sets = []
    for minor in range(first, first + dynamic):
        devices.append(gpu_device(gpu, minor, counters=True))
        for key, p in sorted(gpu.profiles.items()):
            devices += [mig_device(gpu, minor, key, s, dynamic=True) for s in p.placements
                        if s + p.mem_slices <= gpu.mem_slices_total]
        counter_sets.append({"name": f"gpu-{minor}-counter-set", "counters": {
            **{f"memory-slice-{i}": {"value": "1"} for i in range(gpu.mem_slices_total)},
            "multiprocessors": {"value": "132"}}})
    devices += [gpu_device(gpu, m) for m in range(first + dynamic, first + dynamic + plain)]
    return resource_slice(node, devices, shared_counters=counter_sets)


def as_v1beta1(s: Mapping[str, Any]) -> dict[str, Any]:
    """The same slice as ``resource.k8s.io/v1beta1`` serves it: each device's fields under ``basic:``."""
    out = copy.deepcopy(dict(s))
    out["apiVersion"] = "resource.k8s.io/v1beta1"
    out["spec"]["devices"] = [{"name": d["name"], "basic": {k: v for k, v in d.items() if k != "name"}}
                              for d in out["spec"]["devices"]]
    return out


def claim(ns: str, name: str, node: str, devices: Sequence[str], *, pod: Mapping[str, Any] | None = None,
          driver: str = DRIVER, consumed_memory_gib: float | None = None,
          device_class: str = DRIVER) -> dict[str, Any]:
    """An allocated ResourceClaim holding ``devices`` of ``node``'s pool, reserved for ``pod``."""
    results = []
    for i, d in enumerate(devices):
        r: dict[str, Any] = {"request": "gpu" if len(devices) == 1 else f"gpu-{i}", "driver": driver, "pool": node,
                             "device": d}
        if consumed_memory_gib is not None:
            r["consumedCapacity"] = {"memory": f"{int(consumed_memory_gib * 1024)}Mi"}
        results.append(r)
    status: dict[str, Any] = {"allocation": {"devices": {"results": results}, "nodeSelector": {
        "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]}}}
    if pod is not None:
        status["reservedFor"] = [{"resource": "pods", "name": pod["metadata"]["name"],
                                  "uid": pod["metadata"].get("uid", f"uid-{pod['metadata']['name']}")}]
    return {"apiVersion": API, "kind": "ResourceClaim", "metadata": {"name": name, "namespace": ns},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": device_class}}]}},
            "status": status}


def device_name(slot: Slot, gpu: GpuModel) -> list[str]:
    """The driver's names of the devices a slot is on (MIG GPUs have minors equal to their index, see
    :func:`dra_twin`)."""
    if slot.kind is SlotKind.WHOLE:
        return [f"gpu-{i}" for i in slot.devices]
    assert slot.profile is not None and slot.start is not None
    p = gpu.profiles[slot.profile]
    return [f"gpu-{slot.devices[0]}-mig-{GI_PROFILE_ID.get(slot.profile, 99)}-{slot.start}-{p.mem_slices}"]


def _strip_gpu_resources(pod: Mapping[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(dict(pod))
    for c in out.get("spec", {}).get("containers") or ():
        res = c.get("resources") or {}
        for part in ("limits", "requests"):
            if part in res:
                res[part] = {k: v for k, v in res[part].items() if not k.startswith("nvidia.com/")}
    return out


def dra_twin(nodes: Sequence[Mapping[str, Any]], pods: Sequence[Mapping[str, Any]], inventory: Inventory
             ) -> tuple[list[dict], list[dict], list[dict], list[dict]]:
    """The cluster of a device-plugin view, described the DRA way: nodes without GPU Feature Discovery's labels or
    the device plugin's capacities (only ``nvidia.com/gpu.product`` stays off too), one slice per node (the MIG
    layout ``inventory`` holds, MIG GPUs first), the pods without ``nvidia.com/*`` resources, and one claim per
    pod that holds a slot in ``inventory``, reserved for it. Returns (nodes, pods, slices, claims)."""
    out_nodes, slices = [], []
    for n in nodes:
        name = n["metadata"]["name"]
        bare = copy.deepcopy(dict(n))
        bare["metadata"]["labels"] = {k: v for k, v in (n["metadata"].get("labels") or {}).items()
                                      if not k.startswith("nvidia.com/")}
        for part in ("capacity", "allocatable"):
            if part in bare.get("status", {}):
                bare["status"][part] = {k: v for k, v in bare["status"][part].items()
                                        if not k.startswith("nvidia.com/")}
        out_nodes.append(bare)
        if name not in inventory.nodes:
            continue
        spec = inventory.nodes[name]
        gpu = inventory.gpu_of(name)
        devices: list[dict[str, Any]] = []
        for i in range(spec.gpu_count):
            d = inventory.device(name, i)
            if d.mig_enabled:
                devices += [mig_device(gpu, i, k, s) for k, s in d.instances()]
            else:
                devices.append(gpu_device(gpu, i))
        slices.append(resource_slice(name, devices))
    by_key = {f"{p['metadata']['namespace']}/{p['metadata']['name']}": p for p in pods}
    claims = []
    for owner, slot in inventory.allocations():
        p = by_key.get(owner)
        if p is None:
            continue
        gpu = inventory.gpu_of(slot.node)
        claims.append(claim(p["metadata"]["namespace"], f"{p['metadata']['name']}-gpu", slot.node,
                            device_name(slot, gpu), pod=p))
    return out_nodes, [_strip_gpu_resources(p) for p in pods], slices, claims
