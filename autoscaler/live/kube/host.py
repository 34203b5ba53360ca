"""Host CPU and memory in the live view (issue 19 item 1): what a model's pods, and every other pod, request on a
GPU node, so the packer never plans a replica where the node's CPU or memory is gone. Pure.

- A Node's ``status.allocatable`` CPU/memory is its host capacity (``NodeSpec.cpu_millis`` / ``host_memory_gib``,
  :func:`~autoscaler.live.kube.gpu_nodes.with_allocatable`).
- A model's spec gets the CPU/memory one pod of its template requests (:func:`spec_with_host`): its slot requests
  carry them, and its observed replicas' slots carry their pod's (:func:`slot_with_host`).
- Every other live pod on such a node (CPU-only pods, other workloads, borrowers under a lent allocation) holds its
  requests there (:func:`hold_host`), so slots get only what is left. The snapshot already lists every pod of the
  cluster (the inventory must see every GPU in use), so this costs one pass over them.

Its own module, beside ``translate.py`` (which calls it), to keep that one under the size where a module must say
why it is one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from autoscaler.api.spec import ModelSpec
from autoscaler.live.kube.gpu_nodes import GpuNode, pod_host_requests, with_allocatable
from autoscaler.live.kube.pods import LivePod
from autoscaler.live.kube.workloads import WorkloadKind
from sharing.slots import AllocationError, Inventory, Slot


def node_with_host(gn: GpuNode, node: Mapping[str, Any]) -> GpuNode:
    """The GPU node (device-plugin or DRA) with its Node's allocatable CPU/memory as the host capacity of its slots
    (a malformed quantity: a problem line in ``gn.problems``, and not accounted)."""
    return replace(gn, spec=with_allocatable(gn.spec, node, gn.problems))


def spec_with_host(spec: ModelSpec, kind: WorkloadKind, obj: Mapping[str, Any], template: Mapping[str, Any] | None,
                   key: str, problems: list[str]) -> ModelSpec:
    """The spec with the host CPU/memory one pod of its template requests (what the packer needs room for beside
    the GPU); a malformed quantity is a problem line naming the field, and the model's host requests are 0."""
    tmpl = template if template is not None else kind.template(obj)
    try:
        cpu, mem = pod_host_requests(tmpl.get("spec") or {}, "spec.template.spec")
    except ValueError as e:
        problems.append(f"{kind.kind.lower()} {key}: {e}; its host CPU/memory are not accounted")
        return spec
    if (cpu, mem) == (spec.cpu_millis, spec.host_memory_gib):
        return spec
    return replace(spec, cpu_millis=cpu, host_memory_gib=mem)


def pod_host(p: LivePod, problems: list[str]) -> tuple[int, float]:
    """The pod's (CPU millis, memory GiB) requests; (0, 0) and a problem line when one does not parse."""
    try:
        return pod_host_requests(p.obj.get("spec") or {})
    except ValueError as e:
        problems.append(f"pod {p.key}: {e}; its host CPU/memory are not accounted")
        return 0, 0.0


def slot_with_host(inventory: Inventory, got: Slot, p: LivePod, problems: list[str]) -> Slot:
    """The slot a pod holds, carrying its host requests where its node declares host capacity; without them (and a
    problem line) when they no longer fit there but the GPU does: the GPU is held all the same, and a node whose
    allocatable shrank under its pods must not look free."""
    if not inventory.nodes[got.node].host_accounted:
        return got
    hosted = got.with_host(*pod_host(p, problems))
    if hosted is not got and not inventory.fits(hosted) and inventory.fits(got):
        problems.append(f"pod {p.key} on {got.node}: {inventory.why_not(hosted)}; its GPU slot recorded without "
                        "its host CPU/memory")
        return got
    return hosted


def hold_host(inventory: Inventory, live: Sequence[LivePod], slots: Mapping[str, Slot], problems: list[str]) -> None:
    """What pods without a slot request on inventory nodes that declare host capacity: held there
    (:meth:`~sharing.slots.Inventory.hold_host`; past the capacity, a problem line)."""
    if not inventory.host_accounted:
        return
    for p in live:
        if p.node is None or p.key in slots or p.node not in inventory.nodes:
            continue
        if not inventory.nodes[p.node].host_accounted:
            continue
        cpu, mem = pod_host(p, problems)
        if cpu or mem:
            try:
                inventory.hold_host(p.node, cpu, mem)
            except AllocationError as e:
                problems.append(f"pod {p.key} on {p.node}: {e}; its host CPU/memory are not held")
