"""Host CPU and memory beside the GPUs: the GPU capacity a placement strands on its node (issue 19).

A GPU is only usable by a pod that also gets the CPU and host memory it asks for *on the same node*. FGD (Weng et
al., ATC'23) counts a node's idle GPUs as fragmented for a target shape whose CPU no longer fits there; this is
that idea for the product packer (:class:`sharing.packer.CostAwarePacker`), in the form it can afford per
candidate: the target workload is summarised as host CPU and memory **per GPU**, learned from the requests seen
(what the inventory's slots hold, :meth:`~sharing.slots.Inventory.host_totals`, plus the request being placed and
the asks a caller announced with ``CostAwarePacker.host_workload``, else its ``expect`` demand), and a node's free
GPU capacity beyond what its free CPU / memory can feed at that ratio is *stranded*:

    stranded(node) = max(0, free_gpus - min(free_cpu / cpu_per_gpu, free_mem / mem_per_gpu))

A placement's cost is how much it raises that figure on its node (:func:`stranding_delta`; negative when it uses
GPUs whose CPU was short anyway). The packer uses it as a tie-break only, so without host requests or without
declared host capacity (every delta 0) its choices are exactly what they were.

Its own module, not ``packer.py``: the measure is pure arithmetic over an inventory's per-node host figures,
shared by the packer's fast path, its reference and the FGD replay's ``shipped`` adapter, and ``packer.py`` is
already long. Standard library only, like the rest of ``sharing``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from sharing.slots import Inventory, KindHostTable, SlotRequest

STRANDING_DIGITS = 6  # deltas equal to 1e-6 GPU are ties, so float noise never outranks the next tie-break


@dataclass(frozen=True)
class HostPerGpu:
    """The target workload's host resources per GPU it uses (0 = that resource does not bind)."""

    cpu_millis: float
    memory_gib: float


def learn_per_gpu(inv: Inventory, req: SlotRequest | None = None,
                  asks: Iterable[tuple[SlotRequest, int]] = ()) -> HostPerGpu | None:
    """CPU and memory per GPU over what ``inv`` holds, one pod of ``req`` and ``asks`` ((request, pods) each), or
    None when nothing seen asks for host resources or uses a GPU. Pure: the same inputs give the same ratio."""
    cpu, mem, gpus = inv.host_totals()
    for r, n in (*(() if req is None else ((req, 1),)), *asks):
        cpu, mem, gpus = cpu + n * r.cpu_millis, mem + n * r.host_memory_gib, gpus + n * r.gpu_fraction
    if gpus <= 0 or (cpu <= 0 and mem <= 0):
        return None
    return HostPerGpu(max(cpu, 0) / gpus, max(mem, 0.0) / gpus)


def stranded(free_gpus: float, free_cpu: float, free_mem: float, per: HostPerGpu) -> float:
    """GPUs of ``free_gpus`` that ``free_cpu`` / ``free_mem`` cannot feed at ``per`` (infinite = not declared)."""
    usable = free_gpus
    if per.cpu_millis > 0 and math.isfinite(free_cpu):
        usable = min(usable, max(free_cpu, 0.0) / per.cpu_millis)
    if per.memory_gib > 0 and math.isfinite(free_mem):
        usable = min(usable, max(free_mem, 0.0) / per.memory_gib)
    return max(0.0, free_gpus - usable)


def stranding_delta(inv: Inventory, node: str, gpus: float, cpu_millis: int, host_memory_gib: float,
                    per: HostPerGpu | None, free_gpus: float | None = None) -> float:
    """How much placing a pod that takes ``gpus`` of GPU capacity and these host requests on ``node`` raises its
    stranded GPU capacity (:func:`stranded`), rounded; 0 without ``per`` or on a node that declares no host
    capacity. ``free_gpus``: ``inv.free_gpu_capacity(node)`` when the caller has it."""
    return round(stranding_raw(inv, node, gpus, cpu_millis, host_memory_gib, per, free_gpus), STRANDING_DIGITS)


def stranding_raw(inv: Inventory, node: str, gpus: float, cpu_millis: int, host_memory_gib: float,
                  per: HostPerGpu | None, free_gpus: float | None = None) -> float:
    """:func:`stranding_delta` before its rounding (what a caller adding other costs to it rounds once)."""
    if per is None or not inv.nodes[node].host_accounted:
        return 0.0
    fc, fm = inv.host_free(node)
    g = inv.free_gpu_capacity(node) if free_gpus is None else free_gpus
    before = stranded(g, fc, fm, per)
    after = stranded(max(g - gpus, 0.0), fc - cpu_millis, fm - host_memory_gib, per)
    return after - before


def stranding_deltas(table: KindHostTable, gpus: float, cpu_millis: int, host_memory_gib: float,
                     per: HostPerGpu) -> object:
    """:func:`stranding_delta` for every node of a :class:`~sharing.slots.KindHostTable` at once, NOT rounded (an
    array; 0 where the node declares no host capacity). Within float noise of the rounded scalar: a caller that ranks
    by it re-reads the nodes near its minimum with :func:`stranding_delta` for the exact tie-break."""
    import numpy as np

    g = table.free
    fc = table.cpu_cap - table.cpu_used
    fm = table.mem_cap - table.mem_used
    before = _stranded(g, fc, fm, per)
    after = _stranded(np.maximum(g - gpus, 0.0), fc - cpu_millis, fm - host_memory_gib, per)
    return np.where(table.host_accounted, after - before, 0.0)


def _stranded(free: object, cpu: object, mem: object, per: HostPerGpu) -> object:
    """:func:`stranded` over arrays (``inf``: not declared)."""
    import numpy as np

    usable = free
    if per.cpu_millis > 0:
        usable = np.where(np.isfinite(cpu), np.minimum(usable, np.maximum(cpu, 0.0) / per.cpu_millis), usable)
    if per.memory_gib > 0:
        usable = np.where(np.isfinite(mem), np.minimum(usable, np.maximum(mem, 0.0) / per.memory_gib), usable)
    return np.maximum(0.0, free - usable)

