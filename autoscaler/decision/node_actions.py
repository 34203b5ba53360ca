"""Node-level actions a tick's placements imply: MIG re-layouts, the device plugin's time-slicing config and the
models' pod templates. :func:`node_actions` plans all three (``plan_tick`` calls it after ``decide``, for the
simulator and the live controller alike).

**MIG layouts and time-slicing**: pure functions of two inventories -- the snapshot's (what the nodes have now)
and the decision's (after this tick's placements). The packer creates MIG instances on demand at legal
placements; on a real node such an instance exists only after NVIDIA's MIG manager re-partitions the GPU, which
is what a :class:`~autoscaler.api.plan.SetMigLayout` asks for (applied by the actuator behind its safety gate).
mig-parted is told counts per profile, not starts, and it re-creates every instance of a GPU whose config
changed, so a GPU counts as changed when its per-profile counts change. The time-slicing config is only ever
raised; the config last planned is :class:`NodeActionState`.

**Slot templates**: in Kubernetes all pods of a Deployment share one template, and kube-scheduler -- not
slotwise -- binds each pod to a node. So a :class:`~autoscaler.api.plan.PlaceReplica` becomes real through the
template: its slot's resource request (``nvidia.com/gpu`` or ``nvidia.com/mig-<profile>``, from
:func:`sharing.render.pod_resources`) and a node selector on the GPU product. The template
(:class:`~autoscaler.api.snapshot.SlotTemplate`, in the snapshot) is set when a model has no running replica yet
(its first placement chooses the slot kind) or when it asks for no GPU at all; a running model keeps its
template, because changing it rolls every pod -- re-slotting a running model is a separate, deliberate step.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from autoscaler.api.plan import Action, PlaceReplica, Plan, SetMigLayout, SetSlotTemplate, SetTimeSlicing
from autoscaler.api.snapshot import ClusterSnapshot, SlotTemplate
from autoscaler.api.spec import SpecLimits
from sharing.render import GPU_PRODUCT, layouts_from_inventory, mig_devices, mig_parted_config, pod_resources
from sharing.slots import Inventory, Slot, SlotKind

Layout = tuple[tuple[str, int], ...] | None  # a GPU's MIG instances (profile key, start); None = MIG off


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.-]+", "-", text).strip("-.")[:40] or "node"


def _node_layouts(inv: Inventory, node: str) -> dict[int, Layout]:
    return {i: None if lay is None else tuple(lay) for i, lay in layouts_from_inventory(inv, node).items()}


def _counts(inv: Inventory, node: str, layout: Layout) -> tuple | None:
    if layout is None:
        return None
    gpu = inv.gpu_of(node)
    return tuple(sorted(mig_devices(gpu, layout).items()))


def config_name(node: str, layouts: dict[int, Layout], inv: Inventory) -> str:
    """The mig-parted entry (and ``nvidia.com/mig.config`` value) for ``layouts``: the node's name plus a hash
    of the per-GPU counts, so a new layout always gets a new label value (the MIG manager acts on changes)."""
    counts = {i: _counts(inv, node, lay) for i, lay in sorted(layouts.items())}
    digest = hashlib.sha1(json.dumps(counts, sort_keys=True).encode()).hexdigest()[:8]
    return f"slotwise-{_slug(node)}-{digest}"


def mig_layout_actions(before: Inventory, after: Inventory) -> list[SetMigLayout]:
    """One :class:`SetMigLayout` per node whose GPUs' MIG profile counts differ between the inventories.

    ``busy`` says how many pods per MIG resource may keep running through the change: those the GPUs that do
    NOT change can hold (their instances survive). Pods do not say which GPU they use, so the gate compares
    counts; see docs/kubernetes.md for what that does and does not guarantee.
    """
    actions: list[SetMigLayout] = []
    for node in sorted(after.nodes):
        if node not in before.nodes or not after.nodes[node].mig_enabled:
            continue
        if all(before.device(node, i) is after.device(node, i) for i in range(after.nodes[node].gpu_count)):
            continue  # device states are immutable and shared by copies: the same ones, the same layouts
        old, new = _node_layouts(before, node), _node_layouts(after, node)
        changed = tuple(
            i for i in sorted(new) if _counts(before, node, old.get(i)) != _counts(after, node, new[i])
        )
        if not changed:
            continue
        gpu = after.gpu_of(node)
        busy: dict[str, int] = {}
        for i, lay in new.items():
            if i in changed or lay is None:
                continue
            for key, _start in lay:
                res = gpu.profile(key).resource_name
                busy[res] = busy.get(res, 0) + 1
        name = config_name(node, new, after)
        config = mig_parted_config(name, gpu, {i: (None if lay is None else list(lay)) for i, lay in new.items()})
        actions.append(SetMigLayout(node, name, config, new, changed, busy))
    return actions


def time_slicing_replicas(inv: Inventory) -> dict[str, int]:
    """Shares per GPU (``nvidia.com/gpu``) or per MIG instance (``nvidia.com/mig-<profile>``) the device plugin
    must advertise for the inventory's time-sliced slots: the most any one device or instance holds."""
    most: dict[str, int] = {}
    for (node, _i), d in inv.devices.items():
        per: dict[tuple[str, int] | None, int] = {}
        for _owner, slot in d.entries:
            if slot.kind is SlotKind.SHARE:
                per[slot.instance] = per.get(slot.instance, 0) + 1
        if not per:
            continue
        gpu = inv.gpu_of(node)
        for inst, n in per.items():
            res = "nvidia.com/gpu" if inst is None else gpu.profile(inst[0]).resource_name
            most[res] = max(most.get(res, 0), n)
    return most


def time_slicing_action(inv: Inventory, current: dict[str, int],
                        max_replicas: int | None = None) -> SetTimeSlicing | None:
    """The config to write when the inventory needs more shares than ``current`` advertises (never fewer:
    lowering the count under running pods would strand them; it is raised only), and never past ``max_replicas``
    (the operator's ``limits.max_time_slice_replicas``; None: no cap). The config is cluster-wide -- every GPU of
    the resource gets that many replicas -- so no model's placements may raise it beyond what the operator set;
    admission keeps a model's shares within the cap, and this is the last line."""
    wanted = dict(current)
    for res, n in time_slicing_replicas(inv).items():
        if max_replicas is not None:
            n = min(n, max_replicas)
        if n > 1 and n > wanted.get(res, 1):
            wanted[res] = n
    return None if wanted == current else SetTimeSlicing(wanted)


# -- slot templates -------------------------------------------------------------------------------------------
def gpu_resources(resources: Mapping[str, Any]) -> dict[str, dict[str, str]]:
    """The ``nvidia.com/*`` part of a container's resources (requests and limits): a template's GPU resources."""
    out: dict[str, dict[str, str]] = {}
    for part in ("requests", "limits"):
        got = {k: str(v) for k, v in (resources.get(part) or {}).items() if k.startswith("nvidia.com/")}
        if got:
            out[part] = got
    return out


def slot_template(slots: Sequence[Slot], inv: Inventory, node_selector: Mapping[str, str]) -> SlotTemplate:
    """The template for pods placed on ``slots`` (not empty): the slot shape most of them have (ties: the first),
    its resources and ``node_selector`` with that shape's GPU product."""
    shapes: Counter[tuple[str, str | None]] = Counter()
    first: dict[tuple[str, str | None], Slot] = {}
    for slot in slots:
        limits = pod_resources(slot, inv.catalog.get(slot.gpu_model))["limits"]
        node = inv.nodes.get(slot.node)
        shape = (repr(sorted(limits.items())), None if node is None else node.labels.get(GPU_PRODUCT))
        shapes[shape] += 1
        first.setdefault(shape, slot)
    ((shape, _n),) = shapes.most_common(1)
    chosen = first[shape]
    selector = dict(node_selector)
    if shape[1]:
        selector[GPU_PRODUCT] = shape[1]
    return SlotTemplate(pod_resources(chosen, inv.catalog.get(chosen.gpu_model)), selector)


def template_actions(plan: Plan, snapshot: ClusterSnapshot) -> list[SetSlotTemplate]:
    """A :class:`SetSlotTemplate` for each model whose first placements need a slot its template does not ask for."""
    by_model: dict[str, list[Slot]] = {}
    for a in plan.of_type(PlaceReplica):
        by_model.setdefault(a.model, []).extend(a.slots)  # (every pod's slot of a group replica)
    actions: list[SetSlotTemplate] = []
    for model, slots in sorted(by_model.items()):
        current = snapshot.templates.get(model)
        obs = snapshot.models.get(model)
        if current is None or obs is None:
            continue
        if current.resources and obs.active_replicas > 0:
            continue  # running pods: keep their slot kind (see the module docstring)
        wanted = slot_template(slots, snapshot.inventory, current.node_selector)
        if wanted.resources == current.resources and wanted.node_selector == dict(current.node_selector):
            continue
        actions.append(SetSlotTemplate(model, dict(wanted.resources), dict(wanted.node_selector)))
    return actions


# -- all of them ----------------------------------------------------------------------------------------------
@dataclass
class NodeActionState:
    """What node-level planning remembers between ticks: the time-slicing config last planned (shares per
    resource; :func:`time_slicing_action` only raises it)."""

    time_slicing: dict[str, int] = field(default_factory=dict)
    # The cap on the shares per GPU the config may advertise (limits.max_time_slice_replicas); plan_tick passes the
    # configured one, this default is SpecLimits' for callers that do not.
    max_time_slice_replicas: int = SpecLimits().max_time_slice_replicas


def node_actions(
    snapshot: ClusterSnapshot, plan: Plan, after: Inventory | None, state: NodeActionState,
    max_time_slice_replicas: int | None = None,
) -> list[Action]:
    """The node-level actions of a tick whose decision is ``plan``, ``after`` the inventory after its placements
    (None: nothing placed): MIG re-layouts, the time-slicing config (``state`` remembers it; never raised past
    ``max_time_slice_replicas``, else ``state.max_time_slice_replicas``), slot templates."""
    actions: list[Action] = []
    if after is not None:
        actions.extend(mig_layout_actions(snapshot.inventory, after))
        cap = max_time_slice_replicas if max_time_slice_replicas is not None else state.max_time_slice_replicas
        ts = time_slicing_action(after, state.time_slicing, cap)
        if ts is not None:
            actions.append(ts)
            state.time_slicing = dict(ts.replicas)
    actions.extend(template_actions(plan, snapshot))
    return actions
