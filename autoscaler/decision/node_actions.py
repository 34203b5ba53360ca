"""Node-level actions a tick's placements imply: MIG re-layouts and the device plugin's time-slicing config.

Pure functions of two inventories -- the snapshot's (what the nodes have now) and the decision's (after this
tick's placements) -- so the live controller and the tests share them. The packer creates MIG instances on
demand at legal placements; on a real node such an instance exists only after NVIDIA's MIG manager
re-partitions the GPU, which is what a :class:`~autoscaler.api.plan.SetMigLayout` asks for (applied by the
actuator behind its safety gate). mig-parted is told counts per profile, not starts, and it re-creates every
instance of a GPU whose config changed, so a GPU counts as changed when its per-profile counts change.
"""

from __future__ import annotations

import hashlib
import json
import re

from autoscaler.api.plan import SetMigLayout, SetTimeSlicing
from sharing.render import layouts_from_inventory, mig_devices, mig_parted_config
from sharing.slots import Inventory, SlotKind

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


def time_slicing_action(inv: Inventory, current: dict[str, int]) -> SetTimeSlicing | None:
    """The config to write when the inventory needs more shares than ``current`` advertises (never fewer:
    lowering the count under running pods would strand them; it is raised only)."""
    wanted = dict(current)
    for res, n in time_slicing_replicas(inv).items():
        if n > 1 and n > wanted.get(res, 1):
            wanted[res] = n
    return None if wanted == current else SetTimeSlicing(wanted)
