"""MIG layout search: which instances, at which legal starts, a GPU (or a node's MIG GPUs) can hold.

:mod:`sharing.slots` says whether one instance may be created where it is asked for; this module searches for
whole layouts: one GPU holding a given multiset of profiles (:func:`fit_layout`), a node's per-profile instance
counts spread over its MIG GPUs as mig-parted lays out a ``devices: all`` config
(:func:`distribute_mig_instances`, :func:`lay_out_mig_node`), and the sizes that follow from it (how many
instances of one profile an empty GPU holds, how few GPUs a set of counts fits on).

The live adapters use it to rebuild the layout of a node, since the Kubernetes API only shows instance counts
per profile. Pure geometry over the catalog: no I/O, no Kubernetes objects.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from functools import lru_cache

from sharing.catalog import Catalog, GpuModel, MigProfile
from sharing.slots import Inventory, NodeSpec


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


def lay_out_mig_node(inventory: Inventory, node: str, mig_gpus: int, counts: Mapping[str, int]) -> dict[str, int]:
    """Lay out a MIG-enabled node of ``inventory``: GPUs ``0 .. mig_gpus-1`` get ``counts``
    (:func:`distribute_mig_instances`), the rest are switched to plain GPUs. Returns profile -> instances that
    fit nowhere."""
    for i in range(mig_gpus, inventory.nodes[node].gpu_count):
        inventory.set_mig_mode(node, i, False)
    _, dropped = distribute_mig_instances(inventory, node, range(mig_gpus), counts)
    return dropped


def instances_per_gpu(gpu: GpuModel, profile: MigProfile, catalog: Catalog) -> int:
    """How many instances of ``profile`` one empty GPU holds when filled at first free legal starts."""
    inv = Inventory.from_nodes([NodeSpec("_", gpu.name, 1, mig_enabled=True)], catalog)
    return max(1, len(distribute_mig_instances(inv, "_", range(1), {profile.key: profile.max_count})[0]))


def gpus_needed(gpu: GpuModel, counts: Mapping[str, int], catalog: Catalog) -> int:
    """The fewest GPUs of this kind the instance counts (profile key -> instances) fit on: from the compute
    lower bound up; the total count when nothing smaller fits."""
    total = sum(counts.values())
    need = sum(gpu.profiles[k].compute_slices * n for k, n in counts.items())
    for m in range(max(1, math.ceil(need / gpu.compute_slices_total)), total + 1):
        inv = Inventory.from_nodes([NodeSpec("_", gpu.name, m, mig_enabled=True)], catalog)
        if not distribute_mig_instances(inv, "_", range(m), counts)[1]:
            return m
    return total
