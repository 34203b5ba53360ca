"""Packers: choose a slot for a request: plain first-fit, and cost-aware with anti-affinity.

One module: the fast ``CostAwarePacker.place`` must choose exactly what its reference (``_reference_place``,
built on the candidate generators first-fit uses too) chooses, so the ranking, its fast path and its reference
stay side by side and a change to one is made to all.

The seam: a packer is anything with a ``name`` and a *pure* ``place(inv, req)`` that returns a
legal slot (``inv.fits(slot)``) or None and never changes ``inv``; callers allocate. So packers can
be compared on copies of one inventory, and a smarter one (fragmentation-aware, re-layout with few
moves) drops in without touching callers. :func:`place_batch` is the common loop (optionally
largest first), and :func:`consolidate` a planning pass that empties devices after a batch.
:func:`place_group` places a replica that is a group of pods (a LeaderWorkerSet replica: one slot of the request per
pod) through any packer, all of its slots or none, on a copy of the inventory.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from typing import Protocol

from sharing.catalog import GpuModel, MigProfile
from sharing.fragmentation import (
    MILLI,
    KindFragmentation,
    KindShapes,
    WorkloadShapes,
    allowed_kind,
    fragmentation_delta,
)
from sharing.host_resources import STRANDING_DIGITS, HostPerGpu, learn_per_gpu, stranding_deltas, stranding_raw
from sharing.slots import (
    DeviceSignature,
    DeviceState,
    Inventory,
    KindHostTable,
    NodeSpec,
    Slot,
    SlotKind,
    SlotRequest,
    free_milli,
    milli_after,
)


class Packer(Protocol):
    name: str

    def place(self, inv: Inventory, req: SlotRequest) -> Slot | None: ...


def decreasing_order(reqs: Sequence[SlotRequest]) -> list[int]:
    """Indices of ``reqs``, largest first (GPUs, then memory; whole-GPU asks first), stable.

    First-fit-decreasing: the big replicas that only a few GPUs can hold are placed while those
    GPUs are still free, and the small ones fill the gaps they leave.
    """
    return sorted(
        range(len(reqs)),
        key=lambda i: (-reqs[i].gpus, -(reqs[i].memory_gib if reqs[i].memory_gib is not None else float("inf"))),
    )


def place_batch(
    packer: Packer,
    inv: Inventory,
    reqs: Sequence[SlotRequest],
    owners: Sequence[str] | None = None,
    *,
    decreasing: bool = False,
) -> list[Slot | None]:
    """Place and allocate ``reqs`` on ``inv`` in order; None where a request did not fit.

    ``owners`` names each allocation; by default ``"<model>/<i>"`` (i the request's position),
    suffixed ``.1``, ``.2``, ... when the inventory already has that owner, so repeated batches on
    one inventory never collide. ``decreasing`` places in :func:`decreasing_order` instead (the
    result is still in the order of ``reqs``).
    """
    if owners is not None and len(owners) != len(reqs):
        raise ValueError(f"{len(owners)} owners for {len(reqs)} requests")
    used = {o for o, _ in inv.allocations()} if owners is None else set()
    out: list[Slot | None] = [None] * len(reqs)
    for i in decreasing_order(reqs) if decreasing else range(len(reqs)):
        req = reqs[i]
        slot = packer.place(inv, req)
        if slot is not None:
            inv.allocate(slot, owners[i] if owners is not None else batch_owner(req, i, used))
        out[i] = slot
    return out


def batch_owner(req: SlotRequest, i: int, used: set[str]) -> str:
    """The default owner of a batch's ``i``-th request: ``"<model>/<i>"``, suffixed ``.1``, ``.2``, ... past the
    owners in ``used`` (the inventory's), which it joins -- so repeated batches on one inventory never collide."""
    owner = base = f"{req.model}/{i}"
    n = 0
    while owner in used:
        n += 1
        owner = f"{base}.{n}"
    used.add(owner)
    return owner


# -- replicas that are pod groups (a LeaderWorkerSet replica: a leader and its workers) -------------------------
# The trial model a group's pods are held under while the rest of the group is placed: not the model's own name, so
# the packer's anti-affinity keeps the group's pods together (it spreads a model's *replicas*, and a pod of the
# group being placed is not another replica) while still spreading the group away from the model's other replicas.
_GROUP_TRIAL = "(group of {model})"


def place_group(packer: Packer, inv: Inventory, req: SlotRequest, pods: int) -> tuple[Slot, ...] | None:
    """Slots for one replica made of ``pods`` pods, each needing a slot of ``req``: all of them or None (gang
    placement). Pure, like :meth:`Packer.place`: the pods are placed one after another on a copy of ``inv``, so
    they share a node while it has room and go to other nodes where it has not. The slots are distinct (a group
    whose pods would take identical time-slice shares of one GPU is not placeable: one owner cannot hold one slot
    twice). ``pods`` 1 is exactly ``packer.place`` (its slot alone), without a copy.

    A group that cannot fit is refused before any pod is tried (:func:`group_may_fit`): one pass over the devices,
    where trying a group of hundreds of pods one by one took a fifth of a second to fail, and preemption asks
    dozens of times a tick (issue 17)."""
    if pods <= 1:
        slot = packer.place(inv, req)
        return None if slot is None else (slot,)
    if not group_may_fit(inv, req, pods):
        return None
    trial = inv.copy()
    model = _GROUP_TRIAL.format(model=req.model)
    slots: list[Slot] = []
    for j in range(pods):
        slot = packer.place(trial, req)
        if slot is None or slot in slots:
            return None
        trial.allocate(slot, f"{model}#{j}", model=model)
        slots.append(slot)
    return tuple(slots)


def group_may_fit(inv: Inventory, req: SlotRequest, pods: int) -> bool:
    """A necessary condition for ``pods`` slots of ``req`` to fit ``inv`` together, from totals alone (False: no
    placement exists; True: one may). A request of whole GPUs needs ``req.gpus`` devices with nothing on them per
    pod; any other needs its ``memory_gib`` per pod out of the memory the devices could still give out
    (:meth:`Inventory.free_memory_gib`: every slot takes at least its request's memory from it)."""
    if req.whole_only:
        need = pods * req.gpus
        return need <= inv.gpus_total and need <= sum(1 for d in inv.devices.values() if not d.entries)
    mem = pods * (req.memory_gib or 0.0)
    return mem <= inv.free_memory_gib() * (1 + 1e-9) + 1e-9  # float sums: never refuse a group that fits exactly


def group_fraction(slots: Sequence[Slot]) -> float:
    """GPU-equivalents a replica on ``slots`` holds: every pod's slot (one slot: exactly its ``gpu_fraction``)."""
    if len(slots) == 1:
        return slots[0].gpu_fraction
    return sum(s.gpu_fraction for s in slots)


def allocate_group(inv: Inventory, slots: Sequence[Slot], owner: str, model: str | None = None) -> None:
    """Allocate every slot of a group replica to ``owner``, all or none (a slot that does not fit releases the ones
    allocated before it and raises, as :meth:`Inventory.allocate` does)."""
    done: list[Slot] = []
    try:
        for s in slots:
            inv.allocate(s, owner, model=model)
            done.append(s)
    except ValueError:
        for s in reversed(done):
            inv.release(s, owner)
        raise


def fits_group(inv: Inventory, slots: Sequence[Slot]) -> bool:
    """Every slot of ``slots`` fits ``inv`` together (one slot: exactly ``inv.fits``); ``inv`` is not changed."""
    if len(slots) == 1:
        return inv.fits(slots[0])
    trial = inv.copy()
    try:
        allocate_group(trial, slots, "(fits)")
    except ValueError:
        return False
    return True


def release_held(inv: Inventory, slot: Slot, owner: str) -> None:
    """Release ``slot`` from ``owner``, or, when ``owner`` does not hold it, from the one owner that holds exactly
    that slot (a group replica's pods may be held under the pods' own names, as a live cluster names them, or all
    under the replica's id, as the simulator does); KeyError when nobody holds it."""
    d = inv.device(slot.node, slot.devices[0])
    if (owner, slot) not in d.entries:
        holders = [o for o, s in d.entries if s == slot]
        if not holders:
            raise KeyError(f"{slot.describe()} is not allocated to {owner!r}")
        owner = holders[0]
    inv.release(slot, owner)


def eligible_nodes(inv: Inventory, req: SlotRequest) -> Iterator[tuple[NodeSpec, GpuModel]]:
    """Nodes (in inventory order) whose GPU kind the request accepts.

    A kind name the catalog does not know matches no node (the request is then unplaceable and
    reported as a shortfall) rather than raising inside a controller tick.
    """
    allowed = {inv.catalog.resolve(m) for m in req.gpu_models if m in inv.catalog} if req.gpu_models else None
    for node in inv.nodes.values():
        if node.gpu_count and (allowed is None or node.gpu_model in allowed):
            yield node, inv.catalog.get(node.gpu_model)


def _instance_free(d: DeviceState, p: MigProfile, start: int) -> bool:
    """An empty instance exists at (p, start), or one can be created there."""
    inst = (p.key, start)
    if inst in d.instances():
        return inst not in d.usage
    return d.can_create(p, start)


def partial_candidates(inv: Inventory, gpu: GpuModel, d: DeviceState, req: SlotRequest) -> Iterator[Slot]:
    """Every legal partial slot (time-slice share or MIG instance) for ``req`` on device ``d``, in
    first-fit's order: join a shared instance with room, else the smallest MIG profile that fits at
    each free legal placement, else (share-only on a MIG GPU) a new shared instance. Each candidate carries the
    request's host CPU/memory and is confirmed by the Inventory, the one authority on legality (a node without
    room for those host requests gives none)."""
    mem = req.memory_gib
    host = (req.cpu_millis, req.host_memory_gib)
    assert mem is not None
    # Any slot of ``mem`` GiB needs at least that much free memory: a cheap first cut that skips full
    # devices without building candidate slots.
    if d.whole_owner is not None or inv.free_memory_of(d) < mem:
        return
    share_ok = "share" in req.kinds
    if not d.mig_enabled:
        if share_ok:
            slot = Slot.share(d.node, d.index, gpu, mem, req.compute_fraction).with_host(*host)
            if inv.fits(slot):
                yield slot
        return
    if share_ok:
        for inst, u in d.usage.items():
            if inst is not None and not u.exclusive and inv.share_room_gib(d, inst) >= mem:
                slot = Slot.share(d.node, d.index, gpu, mem, req.compute_fraction, *inst).with_host(*host)
                if inv.fits(slot):
                    yield slot
    if "mig" in req.kinds:
        for p in gpu.profiles_by_size():
            if p.memory_gib < mem or gpu.compute_fraction(p) < req.compute_fraction:
                continue
            for start in p.placements:
                if _instance_free(d, p, start):
                    slot = Slot.mig(d.node, d.index, gpu, p.key, start).with_host(*host)
                    if inv.fits(slot):
                        yield slot
    elif share_ok:
        need = mem + inv.share_reserve_gib
        for p in gpu.profiles_by_size():
            if p.memory_gib < need or gpu.compute_fraction(p) * inv.max_compute_oversubscription < (
                req.compute_fraction
            ):
                continue
            for start in p.placements:
                if _instance_free(d, p, start):
                    slot = Slot.share(d.node, d.index, gpu, mem, req.compute_fraction, p.key, start).with_host(*host)
                    if inv.fits(slot):
                        yield slot


class FirstFitPacker:
    """Scan nodes and devices in inventory order; take the first slot that fits.

    - Whole-GPU requests (no memory figure, several GPUs, or only "whole" allowed): the first node
      with enough idle devices (no allocation, no MIG instance), lowest indices.
    - Memory requests, per device in order:
      * MIG mode: join a shared instance with room (if "share" allowed); else the smallest profile
        (by memory, then compute; ``+me`` profiles are kept for media work) with enough memory and
        compute, at its first free legal placement (instances are created on demand); if only
        "share" is allowed, a new shared instance of the smallest profile that fits.
      * no MIG: a time-slice share if memory + reserve and compute fit.
    - If no device gave a partial slot and "whole" is allowed, a whole GPU with enough memory.
    """

    name = "first-fit"

    def place(self, inv: Inventory, req: SlotRequest) -> Slot | None:
        if req.whole_only:
            return self._whole(inv, req) if "whole" in req.kinds else None
        for node, gpu in eligible_nodes(inv, req):
            for idx in range(node.gpu_count):
                slot = self._partial(inv, gpu, inv.device(node.name, idx), req)
                if slot is not None:
                    return slot
        return self._whole(inv, req) if "whole" in req.kinds else None

    def _partial(self, inv: Inventory, gpu: GpuModel, d: DeviceState, req: SlotRequest) -> Slot | None:
        return next(partial_candidates(inv, gpu, d, req), None)

    def _whole(self, inv: Inventory, req: SlotRequest) -> Slot | None:
        for node, gpu in eligible_nodes(inv, req):
            if req.memory_gib is not None and gpu.memory_gib * req.gpus < req.memory_gib:
                continue
            idle = [i for i in range(node.gpu_count) if inv.device(node.name, i).idle]
            if len(idle) >= req.gpus and inv.host_fits(node.name, req.cpu_millis, req.host_memory_gib):
                return Slot.whole(node.name, idle[: req.gpus], gpu).with_host(req.cpu_millis, req.host_memory_gib)
        return None


# -- cost-aware packing ------------------------------------------------------------------------
_COST_DIGITS = 9  # costs equal to 1e-9 $/h are ties, so float noise never outranks the tie-breaks
# From this many nodes of a kind, a whole slot's best node is read off the kind's host table (arrays) rather than by a
# loop over the nodes; and how far above the arrays' (unrounded) least stranding delta a node is still ranked by its
# exact delta (the rounding is to 1e-6: ten times that covers it and the float noise).
_TABLE_NODES = 32
_NEAR = 1e-5
# The fragmentation a placement adds for the target workload (sharing/fragmentation.py), in expected GPUs, is weighed
# at this share of the GPUs it strands for want of host CPU/memory (both key 6).
DEFAULT_FRAGMENTATION_WEIGHT = 0.3


def charged_fraction(slot: Slot, gpu: GpuModel) -> float:
    """The share of one GPU a slot makes unusable for others, what :class:`CostAwarePacker` charges.

    ``slot.gpu_fraction`` (compute) for whole slots; for MIG slots the larger of the compute share
    and the memory-slice share, because a MIG GPU runs out of whichever is scarcer (a 3g takes 3/7
    of the compute but half the memory slices, so two 3g fill the GPU); for time-slice shares the
    larger of the compute share and the memory share, memory being the hard limit there.
    """
    if slot.kind is SlotKind.WHOLE:
        return slot.gpu_fraction
    if slot.kind is SlotKind.MIG:
        p = gpu.profiles[slot.profile]  # type: ignore[index]
        return max(slot.compute_fraction, p.mem_slices / gpu.mem_slices_total)
    return max(slot.compute_fraction, slot.memory_gib / gpu.memory_gib)


def slot_cost(slot: Slot, gpu: GpuModel) -> float:
    """USD per hour a slot costs: :func:`charged_fraction` x the GPU kind's ``price_per_hour``."""
    return charged_fraction(slot, gpu) * gpu.price_per_hour


_FUTURE_CACHE: dict[tuple, int] = {}


def future_slots(gpu: GpuModel, mask: int, compute_used: int, counts: tuple[tuple[str, int], ...]) -> int:
    """How many new instances could still be created on a MIG GPU, summed over (non-media) profiles.

    Each profile is counted alone (greedy over its placements, which is optimal for aligned
    ranges), so the figure says how many future requests of each size the layout still admits:
    a 3g at start 4 leaves 1g x4 + 1g.2mem x2 + 2g x2 + 3g + 4g = 10, at start 0 only 7.
    """
    key = (gpu.name, gpu.mem_slices_total, mask, compute_used, counts)
    hit = _FUTURE_CACHE.get(key)
    if hit is not None:
        return hit
    have = dict(counts)
    total = 0
    for p in gpu.profiles_by_size():
        m, c, n = mask, compute_used, have.get(p.key, 0)
        for start in p.placements:
            r = ((1 << p.mem_slices) - 1) << start
            if n >= p.max_count or c + p.compute_slices > gpu.compute_slices_total:
                break
            if start + p.mem_slices <= gpu.mem_slices_total and not m & r:
                m |= r
                c += p.compute_slices
                n += 1
                total += 1
    if len(_FUTURE_CACHE) > 100_000:  # layouts are few; the bound only guards odd geometries
        _FUTURE_CACHE.clear()
    _FUTURE_CACHE[key] = total
    return total


def _layout_state(d: DeviceState, extra: tuple[str, int] | None = None) -> tuple[int, int, tuple[tuple[str, int], ...]]:
    gpu = d.gpu
    insts = list(d.instances())
    if extra is not None and extra not in insts:
        insts.append(extra)
    mask = compute = 0
    counts: dict[str, int] = {}
    for key, start in insts:
        p = gpu.profiles[key]
        mask |= ((1 << p.mem_slices) - 1) << start
        compute += p.compute_slices
        counts[key] = counts.get(key, 0) + 1
    return mask, compute, tuple(sorted(counts.items()))


def _count_by_model(reqs: Sequence[SlotRequest], keep: Callable[[SlotRequest, SlotRequest], SlotRequest]
                    ) -> dict[str, tuple[SlotRequest, int]]:
    """Per model: the request ``keep(kept so far, next)`` chooses among its requests, and how many it has."""
    out: dict[str, tuple[SlotRequest, int]] = {}
    for r in reqs:
        prev = out.get(r.model)
        out[r.model] = (r, 1) if prev is None else (keep(prev[0], r), prev[1] + 1)
    return out


class CostAwarePacker:
    """The cheapest legal slot across GPU kinds, spread for anti-affinity, placement-aware for MIG.

    Every candidate slot on every eligible device is built (partial slots as in
    :class:`FirstFitPacker`: joining a shared instance, a new or empty MIG instance at each legal
    start, a time-slice share; plus whole GPUs) and confirmed with ``inv.fits``, so memory is
    never over-committed: the Inventory stays the one authority. Among them, in order:

    1. **anti-affinity** (a filter, applied only when something passes it): once a model has a
       replica, the next goes to another node if the request's GPU kinds span several nodes and
       all its replicas sit on one, else to another device if they all sit on one device;
    2. **cost**: :func:`slot_cost` (charged share of the GPU x its price), so with the default
       prices a 20 GiB replica takes an A100-40GB 3g.20gb ($0.75/h) over an H100-80GB 1g.20gb
       ($0.88/h) or an H200 1g.35gb ($1.13/h);
       With a target workload (:meth:`target_workload`), next: **the gap plan's loss** for a time-slice share
       (:mod:`sharing.gap_plan`: a share should leave a gap the planned mix fills; measured ahead of best fit), and
       for a whole slot the constrained capacity it crowds out (:meth:`displaced`);
    3. **no newly opened device** (a device with nothing on it and no MIG instance costs a
       whole GPU of capacity the moment anything lands there);
    4. **best fit**: least free memory left on the device (consolidation is what keeps GPU count
       down; measured: ranking the two below first cost GPUs in ``mig-bench``);
    5. **fewest future slots lost** on the device (:func:`future_slots` before minus after), which
       is what picks ``3g@4`` over ``3g@0``;
    6. **least GPU capacity stranded for want of host CPU/memory** on the node (``host_aware``, on by default;
       :func:`sharing.host_resources.stranding_delta` at the CPU and memory per GPU learned from the slots held,
       the request and the announced demand): only where nodes declare host capacity and requests host
       resources, else 0 for every candidate; with a target workload plus the fragmentation the placement adds for
       it (:meth:`placement_cost`) and, for partial slots, the constrained capacity it crowds out;
    7. **fewest replicas of the same model** on the device (soft spreading), then inventory order.

    Host CPU and memory are hard: a slot carries its request's ``cpu_millis`` / ``host_memory_gib`` and no slot
    goes to a node without room for them (:meth:`Inventory.fits`).

    ``objective="gpus"`` (opt-in) ranks for the fewest GPUs instead: no newly opened device
    first, then the smallest charged share of a GPU, best fit, future slots lost, and cost only as
    the tie-break (anti-affinity stays a filter). On one GPU kind the two agree; on mixed clusters
    cost picks cheap A100 slices that need more GPUs. :meth:`expect` (opt-in) keeps scarce big GPUs
    idle for pending replicas that only they can hold.

    :meth:`candidates` lists every slot on every device (idle devices of one node, same kind and MIG
    mode, are interchangeable, so only the first is scored). :meth:`place` chooses exactly the slot
    that list's filtered minimum is (:func:`_reference_place`), without building it: devices in the
    same state (:class:`~sharing.slots.DeviceSignature`) are one group, each group's best slot per
    request shape is cached, and only a group's first device not excluded by anti-affinity (plus the
    model's own devices) is ranked, so a placement costs O(device states + the model's replicas),
    about 0.1-0.2 ms at 2,000 GPUs instead of 12-15 ms.
    """

    name = "cost-aware"

    def __init__(self, anti_affinity: bool = True, objective: str = "cost", prefer_open_nodes: bool = False,
                 node_anti_affinity: bool = True, host_aware: bool = True,
                 fragmentation_weight: float = DEFAULT_FRAGMENTATION_WEIGHT) -> None:
        if objective not in ("cost", "gpus"):
            raise ValueError(f"objective must be 'cost' or 'gpus', got {objective!r}")
        if not fragmentation_weight >= 0:
            raise ValueError(f"fragmentation_weight must be >= 0, got {fragmentation_weight!r}")
        self.anti_affinity = anti_affinity
        self.objective = objective
        # Opt-in (lending whole nodes, issue 8): rank a slot on a node with nothing on it after every slot on a
        # node that already holds something (ahead of cost; behind expect's reservation, which keeps scarce GPUs
        # for replicas that fit nowhere else), so idle nodes stay whole and lendable.
        self.prefer_open_nodes = prefer_open_nodes
        # Opt-in False (lending whole nodes): anti-affinity spreads over devices only, never asks for another node.
        self.node_anti_affinity = node_anti_affinity
        # The host-resource tie-break (key 6 above); False ranks as before host resources existed (still hard).
        self.host_aware = host_aware
        # The target workload's fragmentation (:meth:`target_workload`), weighed in the host key at this weight.
        self.fragmentation_weight = fragmentation_weight
        self._workload: WorkloadShapes | None = None
        self._workload_version = 0  # part of the group memo's key: the gap plan ranks partial slots
        self._scarcity: tuple[tuple, dict[str, float]] | None = None
        self._kind_shapes: dict[str, KindShapes] = {}
        self._kind_frag: dict[str, KindFragmentation] = {}
        self._expected: dict[str, tuple[SlotRequest, int]] | None = None
        self._host_asks: dict[str, tuple[SlotRequest, int]] | None = None
        self._fit_cache: dict[tuple, dict[str, float]] = {}
        self._memo: dict[tuple, dict] = {}  # request shape -> DeviceSignature -> best slot (place)
        self._whole_heads: dict[tuple, tuple] = {}

    def expect(self, reqs: Sequence[SlotRequest] | None) -> None:
        """Opt-in reservation: tell the packer the whole demand it is about to place (None clears).

        Replicas still to come (expected per model minus those the inventory already holds) that
        fit on one GPU kind only (e.g. a 98 GiB replica on a cluster where only H200s hold that)
        reserve enough idle GPUs of that kind; other requests then avoid *opening* those GPUs
        (a preference ranked first, never a filter, so nothing becomes unplaceable). Without it a
        small replica arriving first takes the cheapest or densest slice on the scarce big GPU,
        and the big replica arriving later finds none left. Reserved GPU counts come from the
        demand's own size mix: the share of a GPU each exclusive replica needs, summed.
        """
        if reqs is None:
            self._expected = None
            return
        # per model its largest request (what must fit) and its count
        self._expected = _count_by_model(
            reqs, lambda prev, r: r if (r.memory_gib or 0.0) > (prev.memory_gib or 0.0) else prev)

    def host_workload(self, reqs: Sequence[SlotRequest] | None) -> None:
        """Tell the packer the asks it is about to place (None clears), for the host-resource tie-break only: the
        CPU and memory per GPU it weighs are learned from the slots the inventory holds, the request being placed
        and these asks not yet held (per model, ``count - held``). Unlike :meth:`expect` nothing is reserved.
        Without it (and without :meth:`expect`) the ratio is the slots' and the request's."""
        if reqs is None:
            self._host_asks = None
            return
        self._host_asks = _count_by_model(reqs, lambda prev, r: r)  # per model its last request and its count

    def target_workload(self, shapes: WorkloadShapes | None) -> None:
        """Tell the packer the workload it should keep room for (None clears): the shapes expected, with their weights
        (:class:`~sharing.fragmentation.TargetWorkload` learns them from arrivals). The host key (6 in the ranking)
        then also counts the fragmentation a placement adds for them (:mod:`sharing.fragmentation`) -- on every
        cluster, host capacity declared or not."""
        new = shapes if shapes is not None and shapes.shapes and self.fragmentation_weight > 0 else None
        if new == self._workload:  # the same workload again (a steady fleet's ticks): keep what was derived from it
            return
        self._workload = new
        self._workload_version += 1
        self._kind_shapes = {}
        self._kind_frag = {}

    def kind_shapes(self, inv: Inventory, kind: str) -> KindShapes | None:
        """The target workload as GPU kind ``kind`` sees it, or None without one."""
        if self._workload is None:
            return None
        hit = self._kind_shapes.get(kind)
        if hit is None or hit.catalog is not inv.catalog:
            hit = self._kind_shapes[kind] = KindShapes(self._workload, inv.catalog.get(kind), inv.catalog,
                                                       self.fragmentation_weight)
        return hit

    def kind_fragmentation(self, inv: Inventory, kind: str) -> KindFragmentation | None:
        """The kind's per-node fragmentation over ``inv`` (kept per node as the inventory changes), or None."""
        ks = self.kind_shapes(inv, kind)
        if ks is None:
            return None
        table = inv.kind_host_table(kind)
        hit = self._kind_frag.get(kind)
        if hit is None or hit.table is not table or hit.kind is not ks:
            hit = self._kind_frag[kind] = KindFragmentation(ks, table)
        return hit

    def kind_scarcity(self, inv: Inventory) -> dict[str, float]:
        """Per GPU kind, rho_k: the share of its GPUs that target shapes accepting only some kinds will claim (their
        GPU demand, scaled so the workload's whole demand is the cluster's GPUs, spread over the GPUs of the kinds
        each accepts). Shapes that accept every kind add nothing. Empty without a target workload."""
        if self._workload is None:
            return {}
        counts = inv.kind_gpu_counts()
        key = (self._workload_version, id(inv.catalog), counts)
        if self._scarcity is not None and self._scarcity[0] == key:
            return self._scarcity[1]
        gpus = dict(counts)
        cat = inv.catalog
        shapes = [s for s in self._workload.shapes if s.gpus > 0]
        dem = [s.weight * s.gpus * (1.0 if s.memory_gib is None else s.compute_fraction) for s in shapes]
        total_dem = sum(dem)
        rho = dict.fromkeys(gpus, 0.0)
        all_gpus = sum(gpus.values())
        for s, d in zip(shapes, dem, strict=True):
            accepts = [k for k in gpus if allowed_kind(s, cat.get(k), cat)]
            acc = sum(gpus[k] for k in accepts)
            if len(accepts) == len(gpus) or acc <= 0 or total_dem <= 0:
                continue
            for k in accepts:
                rho[k] += d / total_dem * all_gpus / acc
        self._scarcity = (key, rho)
        return rho

    def displaced(self, inv: Inventory, gpu_models: tuple[str, ...], kind: str, taken: float) -> float:
        """GPUs of constrained target shapes a placement taking ``taken`` GPUs of ``kind`` is expected to crowd out:
        ``taken`` x clip(rho_kind - the least rho of the kinds the request accepts, 0, 1) (:meth:`kind_scarcity`). 0
        without a target workload, or on the least scarce kind the request may use."""
        rho = self.kind_scarcity(inv)
        if not rho:
            return 0.0
        if gpu_models:
            allowed = {inv.catalog.resolve(m) for m in gpu_models if m in inv.catalog}
            base = min((rho[k] for k in rho if k in allowed), default=0.0)
        else:
            base = min(rho.values())
        return taken * min(max(rho.get(kind, 0.0) - base, 0.0), 1.0)

    def placement_cost(self, inv: Inventory, node: str, taken: float, cpu_millis: int, host_memory_gib: float,
                       per: HostPerGpu | None, move: tuple[int, int, int] | None) -> float:
        """Key 6 of the ranking for one placement: the GPU capacity it strands for want of host CPU/memory
        (:func:`~sharing.host_resources.stranded` at ``per``, 0 without) plus the fragmentation it adds for the target
        workload (``move`` = (free milli of the devices taken from, milli taken from each, devices); dF x the kind's
        scale), rounded to :data:`~sharing.host_resources.STRANDING_DIGITS`. The scalar the array paths agree with."""
        raw = stranding_raw(inv, node, taken, cpu_millis, host_memory_gib, per)
        spec = inv.nodes[node]
        ks = self.kind_shapes(inv, spec.gpu_model) if move is not None and spec.gpu_count else None
        if ks is not None:
            fc, fm = inv.host_free(node)
            frees = [free_milli(inv, inv.device(node, i)) for i in range(spec.gpu_count)]
            raw = raw + fragmentation_delta(ks, frees, fc, fm, *move, cpu_millis, host_memory_gib) * ks.scale
        return round(raw, STRANDING_DIGITS)

    def hold_node(self, inv: Inventory, cpu_millis: int, host_memory_gib: float) -> str | None:
        """Where a pod without a GPU slot (a CPU-only pod) should hold its host CPU/memory, or None when no node has
        room: the least key-6 cost (GPU capacity stranded at the ratio learned from the slots held, plus fragmentation
        added for the target workload, its devices unchanged), then the least free GPU capacity, then inventory order
        (a node without GPUs strands nothing and has none free). Pure, like :meth:`place`."""
        import numpy as np

        # (cost, free GPU capacity, node order, name): a node without GPUs strands nothing and has none free
        best: tuple[float, float, int, str] | None = None
        for i, n in enumerate(inv.nodes.values()):
            if not n.gpu_count and inv.host_fits(n.name, cpu_millis, host_memory_gib):
                best = (0.0, 0.0, i, n.name)
                break
        per = learn_per_gpu(inv) if self.host_aware and inv.host_accounted else None
        view = _HostView(self, inv, cpu_millis, host_memory_gib, per)
        for kind in inv.kind_node_counts():
            table = inv.kind_host_table(kind)
            rows = np.flatnonzero(table.host_fits(cpu_millis, host_memory_gib))
            if rows.size == 0:
                continue
            raw = view.costs(table, rows, 0.0, (0, 0, 0))
            if raw is None:  # nothing to weigh: the first node with room
                order = np.argsort(table.ordinal[rows], kind="stable")
                cost = np.zeros(rows.size)
                free = np.zeros(rows.size)
            else:
                cost = np.round(raw, STRANDING_DIGITS)
                free = table.free[rows]
                order = np.lexsort((table.ordinal[rows], free, cost))
            j = int(rows[order[0]])
            k = (float(cost[order[0]]), float(free[order[0]]), int(table.ordinal[j]), table.nodes[j])
            if best is None or k < best:
                best = k
        return None if best is None else best[3]

    def place(self, inv: Inventory, req: SlotRequest) -> Slot | None:
        """The best legal slot for ``req`` (the ranking above), or None; ``inv`` is not changed.

        Chooses exactly what :func:`_reference_place` (every candidate on every device, then the
        filters and the minimum) chooses, but scores one device per group of devices in the same state
        (:meth:`Inventory.device_groups`): within a group every device offers the same slots with the
        same ranking key up to (same-model replicas, inventory order), so the group's best device is its
        first one that is not excluded, and each group's best slot is cached per request shape. The
        model's replicas per device come from the Inventory's index, not a scan of the allocations.
        """
        if req.whole_only and "whole" not in req.kinds:
            return None
        if req.gpu_models:
            allowed = {inv.catalog.resolve(m) for m in req.gpu_models if m in inv.catalog}
            kinds = [k for k in inv.kind_node_counts() if k in allowed]
        else:
            kinds = list(inv.kind_node_counts())
        host = self._host_view(inv, req)
        same = inv.model_device_counts(req.model)
        used: dict[int, int] = {}  # position -> replicas of the model there
        used_by_sig: dict[DeviceSignature, list[int]] = {}
        for (node, idx), n in same.items():
            p = inv.position(node, idx)
            used[p] = n
            used_by_sig.setdefault(inv.device_at(p).signature, []).append(p)
        # Anti-affinity (as _spread_filter): off the model's node if it has one node of several, else off
        # its device if it has one device.
        spread = self.anti_affinity and bool(same)
        lo = hi = -1  # the positions of the node to leave, when leaving a node is asked for
        if spread and self.node_anti_affinity:
            nodes = {n for n, _ in same}
            counts = inv.kind_node_counts()
            if len(nodes) == 1 and sum(counts[k] for k in kinds) > 1:
                (node,) = nodes
                lo = inv.position(node, 0)
                hi = lo + inv.nodes[node].gpu_count
        off_node = lo >= 0
        open_nodes: set[int] | None = None  # node ordinals holding something (prefer_open_nodes)
        if self.prefer_open_nodes:
            open_nodes = {inv.node_ordinal(p) for kind in kinds for sig, members in inv.device_groups(kind).items()
                          if not sig.idle for p in members}
        # Candidates: (key, position, template slot or None for whole GPUs, kind, opens a device, GPUs).
        # The key is the reference key with (node order, GPU index) replaced by the position (same
        # order), plus a last element that puts a whole slot before a partial slot with an equal key, as
        # the reference generates them.
        cands: list[tuple[tuple, int, Slot | None, str, bool, int]] = []
        if not req.whole_only:
            self._group_candidates(inv, req, kinds, used, used_by_sig, (lo, hi), open_nodes, cands, host)
        if "whole" in req.kinds:
            only_best = not same and open_nodes is None and self._expected is None
            heads = {k: self._whole_head(inv, req, k) for k in kinds} if host is not None and only_best else None
            for kind in kinds if heads is None else sorted(kinds, key=lambda k: (heads[k] is None, heads[k] or ())):
                if host is None:
                    self._whole_candidates(inv, req, kind, lo, hi, cands, open_nodes)
                    continue
                if heads is not None and cands:
                    # No filter or prefix will reorder the candidates, so a kind whose whole-slot key before the
                    # host cost is already beaten cannot rank first: its nodes need not be scored.
                    head = heads[kind]
                    if head is None or head > min(c[0] for c in cands)[:len(head)]:
                        continue
                self._whole_candidates_host(inv, req, kind, cands, host, only_best=only_best)
        if not cands:
            return None
        if open_nodes is not None:
            cands = [((0 if inv.node_ordinal(c[1]) in open_nodes else 1, *c[0]), *c[1:]) for c in cands]
        if spread:
            kept = [c for c in cands if not lo <= c[1] < hi] if off_node else []
            if kept:
                cands = kept
            elif len(same) == 1:
                kept = [c for c in cands if c[2] is None or c[1] not in used]  # whole slots take idle GPUs
                if kept:
                    cands = kept
        if self._expected is not None:
            cands = self._reserve_fast(inv, req, cands)
        best = min(cands, key=lambda c: c[0])
        d, t = inv.device_at(best[1]), best[2]
        if t is None:
            return self._whole(inv, inv.nodes[d.node], inv.catalog.get(best[3]), req)
        return Slot(d.node, (d.index,), t.kind, t.gpu_model, t.profile, t.start, t.memory_gib, t.compute_fraction,
                    req.cpu_millis, req.host_memory_gib)

    def _host_view(self, inv: Inventory, req: SlotRequest) -> _HostView | None:
        """What host resources change for this placement: None when nothing does (no node declares host capacity,
        or the request asks none and there is no learned ratio to weigh), so the ranking is the one without them."""
        if not inv.host_accounted and self._workload is None:
            return None
        per = learn_per_gpu(inv, req, self._expected_asks(inv)) if self.host_aware and inv.host_accounted else None
        if per is None and not req.asks_host and self._workload is None:
            return None
        return _HostView(self, inv, req.cpu_millis, req.host_memory_gib, per)

    def _expected_asks(self, inv: Inventory) -> list[tuple[SlotRequest, int]]:
        """The announced asks (:meth:`host_workload`, else :meth:`expect`'s demand) not yet held: part of the
        workload the host ratio is learned from."""
        asks = self._host_asks if self._host_asks is not None else self._expected
        if asks is None:
            return []
        return [(r, n - inv.model_allocation_count(m)) for m, (r, n) in asks.items()
                if n > inv.model_allocation_count(m)]

    # -- the fast path's pieces -------------------------------------------------------------------
    def _group_candidates(self, inv: Inventory, req: SlotRequest, kinds: list[str], used: dict[int, int],
                          used_by_sig: dict[DeviceSignature, list[int]], leave: tuple[int, int],
                          open_nodes: set[int] | None,
                          cands: list[tuple[tuple, int, Slot | None, str, bool, int]],
                          host: _HostView | None = None) -> None:
        """Add the partial-slot candidates of :meth:`place`: per group of devices in the same state, its best
        slot (cached per request shape) on the devices that may rank first -- the group's first device, or
        with replicas of the model its first device without one, its first off the node to leave
        (``leave``: positions [lo, hi), or (-1, -1)), the model's own devices, and with ``open_nodes`` the
        first devices on nodes that hold something. With ``host``, every member is looked at instead
        (:meth:`_host_members`): host room and the stranding tie-break are per node, not per device state."""
        lo, hi = leave
        off_node = lo >= 0
        memo = self._group_memo(inv, req)
        # The group's best slot is a property of the device state alone: found without the host requests, which
        # are checked per member (the template's node is only the group's first device's).
        bare = replace(req, cpu_millis=0, host_memory_gib=0.0) if req.asks_host else req
        pending: list[tuple[tuple, int, Slot, DeviceSignature, Sequence[int], str]] = []  # host: groups to scan
        for kind in kinds:
            for sig, members in inv.device_groups(kind).items():
                hit = memo.get(sig, _MISSING)
                if hit is _MISSING:
                    hit = memo[sig] = self._group_best(inv, bare, inv.device_at(members[0]))
                if hit is None:
                    continue
                head, start, tmpl = hit
                if host is not None:
                    pending.append((head, start, tmpl, sig, members, kind))
                    continue
                reps: list[int] = []
                if not used:
                    reps.append(members[0])
                else:
                    for p in members:
                        if p not in used:
                            reps.append(p)
                            break
                    if off_node:
                        for p in members:
                            if not lo <= p < hi:
                                if p not in reps:
                                    reps.append(p)
                                break
                    reps.extend(used_by_sig.get(sig, ()))
                if open_nodes and sig.idle:
                    for p in members:
                        if inv.node_ordinal(p) in open_nodes and p not in used and not lo <= p < hi:
                            if p not in reps:
                                reps.append(p)
                            break
                    for p in members:
                        if inv.node_ordinal(p) in open_nodes and p not in used:
                            if p not in reps:
                                reps.append(p)
                            break
                for p in reps:
                    cands.append(((*head, 0.0, used.get(p, 0), p, start, 1), p, tmpl, kind, sig.idle, 1))
        if host is not None:
            # Without filters or prefixes (no replica of the model, no open-node preference, no reservation) a group
            # whose head is beaten by a candidate found in a better group can never rank first: scan the groups by
            # head, and stop after the first head level that gave a candidate.
            lazy = not used and open_nodes is None and self._expected is None
            if lazy:
                pending.sort(key=lambda g: g[0])
            level: tuple | None = None
            for head, start, tmpl, sig, members, kind in pending:
                if lazy and level is not None and head != level:
                    break
                taken = charged_fraction(tmpl, sig.gpu)
                move = _share_move(inv, inv.device_at(members[0]), tmpl)
                found = self._host_members(inv, members, used, leave, open_nodes, sig.idle, host, taken, move)
                # a partial slot's crowding out of constrained shapes weighs with its host cost (as in _key)
                crowd = round(self.displaced(inv, req.gpu_models, kind, taken), _COST_DIGITS)
                for p, strand in found:
                    cands.append(((*head, strand + crowd, used.get(p, 0), p, start, 1), p, tmpl, kind, sig.idle, 1))
                if found and level is None:
                    level = head

    @staticmethod
    def _host_members(inv: Inventory, members: Sequence[int], used: dict[int, int], leave: tuple[int, int],
                      open_nodes: set[int] | None, idle: bool, host: _HostView,
                      taken: float, move: tuple[int, int, int] | None) -> list[tuple[int, float]]:
        """The members of one device group that may rank first, with their stranding delta, when host resources
        count: per class of member the filters tell apart (on the node to leave, holding the model, on a node
        that holds something), its least (stranding, same-model replicas, position) among the members whose node
        has room for the request's host CPU/memory -- what the reference's minimum over every device picks."""
        lo, hi = leave
        best: dict[tuple[bool, bool, bool], tuple[float, int, int]] = {}
        # With no class to tell apart, a node's first member beats its others (same stranding, lower position).
        one_class = not used and lo < 0 and (open_nodes is None or not idle)
        if one_class and len(members) >= host.table_nodes:
            return CostAwarePacker._best_member(inv, members, host, taken, move)
        prev = -1
        for p in members:
            if one_class:
                nd = inv.node_ordinal(p)
                if nd == prev:
                    continue
                prev = nd
            node = inv.node_at(p)
            if not host.fits(node):
                continue
            cls = (lo <= p < hi, p in used, open_nodes is not None and idle and inv.node_ordinal(p) in open_nodes)
            k = (host.delta(node, taken, move), used.get(p, 0), p)
            if cls not in best or k < best[cls]:
                best[cls] = k
        return [(p, strand) for strand, _, p in best.values()]

    @staticmethod
    def _best_member(inv: Inventory, members: Sequence[int], host: _HostView, taken: float,
                     move: tuple[int, int, int] | None) -> list[tuple[int, float]]:
        """:meth:`_host_members` with one class of member, on a large group: the least (stranding delta, position)
        among the members whose node has room for the request's host CPU/memory, read off the kind's host table as
        :meth:`_best_whole_node` does (the same exact rounding for near ties)."""
        import numpy as np

        table = inv.kind_host_table(inv.nodes[inv.node_at(members[0])].gpu_model)
        pos = np.asarray(members)
        rows = table.pos_rows[pos]
        ok = table.host_fits(host.cpu, host.mem)[rows]
        if not ok.any():
            return []
        pos, rows = pos[ok], rows[ok]
        approx = host.costs(table, rows, taken, move)
        if approx is None:
            return [(int(pos[0]), 0.0)]
        j, strand = _least_rounded(approx)  # (the first of equals: members are in position order)
        return [(int(pos[j]), strand)]

    def _group_memo(self, inv: Inventory, req: SlotRequest) -> dict:
        """Per request shape and inventory rules: DeviceSignature -> the group's best partial slot."""
        ck = (req.memory_gib, req.compute_fraction, req.kinds, inv.share_reserve_gib,
              inv.max_compute_oversubscription, self.objective, self._workload_version,
              req.gpu_models if self._workload is not None else ())
        memo = self._memo.get(ck)
        if memo is None:
            if len(self._memo) > 2_000:
                self._memo.clear()
            memo = self._memo[ck] = {}
        elif len(memo) > 20_000:  # signatures are few; the bound only guards very long runs
            memo.clear()
        return memo

    def _group_best(self, inv: Inventory, req: SlotRequest, d: DeviceState) -> tuple | None:
        """(key head, start, slot) of the best partial slot on ``d`` by the reference ranking, or None.

        The head is the reference key less (stranding, same-model replicas, node order, GPU index, start); these
        are the same for every candidate on one device, so the device's best slot is its first one
        with the least (head, start), as in the reference's ``min``.
        """
        best: tuple | None = None
        for slot in partial_candidates(inv, d.gpu, d, req):
            key = self._key(inv, d.gpu, d, slot, {}, 0, host=False, gpu_models=req.gpu_models)
            hk = (key[:-5], key[-1])
            if best is None or hk < best[0]:
                best = (hk, slot)
        return None if best is None else (best[0][0], best[0][1], best[1])

    def _whole_candidates(
        self, inv: Inventory, req: SlotRequest, kind: str, lo: int, hi: int, cands: list,
        open_nodes: set[int] | None = None,
    ) -> None:
        """The first node of ``kind`` with ``req.gpus`` idle GPUs, and the first such node outside
        positions ``[lo, hi)`` (the node anti-affinity leaves), as whole-slot candidates."""
        groups = inv.device_groups(kind)
        idle = [members for sig, members in groups.items() if sig.idle]
        if not idle:
            return
        gpu = inv.device_at(idle[0][0]).gpu
        if req.memory_gib is not None and gpu.memory_gib * req.gpus < req.memory_gib:
            return
        wk = ("whole", req.gpus, self.objective)
        head = self._whole_heads.get((gpu.name, wk))
        if head is None or head[0] is not gpu:
            slot = Slot.whole("-", tuple(range(req.gpus)), gpu)
            rank = self._rank(round(slot_cost(slot, gpu), _COST_DIGITS), 1, slot.gpu_fraction, 0.0, 0, 0)
            head = (gpu, rank)
            self._whole_heads[(gpu.name, wk)] = head
        rank = head[1]
        need = req.gpus
        first = -1
        cur, n = -1, 0
        # With open_nodes: also the first such node that holds something, and the first off [lo, hi) that does.
        want_open = open_nodes is not None
        want_open_off = want_open and lo >= 0
        done_off = False
        added: set[int] = set()
        for p in idle[0] if len(idle) == 1 else heapq.merge(*idle):
            nd = inv.node_ordinal(p)
            if nd != cur:
                cur, n = nd, 0
            n += 1
            if n == need:
                p0 = p - inv.device_at(p).index  # the node's GPU 0
                new = []
                if first < 0:
                    first = p0
                    new.append(p0)
                if not done_off and (lo < 0 or p0 != lo):
                    new.append(p0)
                    done_off = True
                if want_open and nd in open_nodes:  # type: ignore[operator]
                    new.append(p0)
                    want_open = False
                if want_open_off and nd in open_nodes and p0 != lo:  # type: ignore[operator]
                    new.append(p0)
                    want_open_off = False
                for q in new:
                    if q not in added:
                        added.add(q)
                        cands.append(((*rank, q, -1, 0), q, None, kind, True, need))
                if done_off and not want_open and not want_open_off:
                    return

    def _whole_head(self, inv: Inventory, req: SlotRequest, kind: str) -> tuple | None:
        """The key of a whole slot of ``req`` on ``kind`` less its host cost and same-model count (what every node of
        the kind shares), or None when the kind's GPUs cannot hold it."""
        gpu = inv.catalog.get(kind)
        if req.memory_gib is not None and gpu.memory_gib * req.gpus < req.memory_gib:
            return None
        cost = round(slot_cost(Slot.whole("-", tuple(range(req.gpus)), gpu), gpu), _COST_DIGITS)
        planned = round(self.displaced(inv, req.gpu_models, kind, float(req.gpus)), _COST_DIGITS)
        return self._rank(cost, 1, float(req.gpus), 0.0, 0, 0, 0.0, planned)[:-2]

    def _whole_candidates_host(self, inv: Inventory, req: SlotRequest, kind: str, cands: list,
                               host: _HostView, only_best: bool = False) -> None:
        """Whole-slot candidates when host resources count: every node of ``kind`` with ``req.gpus`` idle GPUs and
        room for the request's host CPU/memory, each ranked with its stranding delta (the reference's set).
        ``only_best`` (no filter or prefix will tell the nodes apart): only the least (stranding, node)."""
        nodes = inv.kind_nodes(kind)
        if not nodes:
            return
        gpu = inv.gpu_of(nodes[0])
        if req.memory_gib is not None and gpu.memory_gib * req.gpus < req.memory_gib:
            return
        cost = round(slot_cost(Slot.whole("-", tuple(range(req.gpus)), gpu), gpu), _COST_DIGITS)
        taken = float(req.gpus)
        move = (MILLI, MILLI, req.gpus)
        planned = round(self.displaced(inv, req.gpu_models, kind, taken), _COST_DIGITS)
        if only_best and len(nodes) >= host.table_nodes:
            hit = self._best_whole_node(inv, req, kind, host, taken)
            if hit is not None:
                self._add_whole(inv, kind, cands, cost, taken, hit[0], hit[1], req.gpus, planned)
            return
        best: tuple[float, str] | None = None
        for node in nodes:
            if inv.idle_gpus(node) >= req.gpus and host.fits(node):
                strand = host.delta(node, taken, move)
                if only_best:
                    if best is None or strand < best[0]:  # nodes come in order: the first of equals stays
                        best = (strand, node)
                    continue
                self._add_whole(inv, kind, cands, cost, taken, strand, node, req.gpus, planned)
        if best is not None:
            self._add_whole(inv, kind, cands, cost, taken, best[0], best[1], req.gpus, planned)

    @staticmethod
    def _best_whole_node(inv: Inventory, req: SlotRequest, kind: str, host: _HostView,
                         taken: float) -> tuple[float, str] | None:
        """The least (stranding delta, node order) among the nodes of ``kind`` with ``req.gpus`` idle GPUs and room
        for the request's host CPU/memory: what the loop of :meth:`_whole_candidates_host` picks with ``only_best``,
        read off the kind's :class:`~sharing.slots.KindHostTable` (kept per node as devices change) in a few array
        operations. The array deltas are the scalar's operations on the same numbers, unrounded; the nodes within
        float noise of their minimum get the scalar's rounding (once per distinct value), so the answer is the
        loop's."""
        import numpy as np

        table = inv.kind_host_table(kind)
        ok = (table.idle >= req.gpus) & table.host_fits(req.cpu_millis, req.host_memory_gib)
        rows = np.flatnonzero(ok)
        if rows.size == 0:
            return None
        approx = host.costs(table, rows, taken, (MILLI, MILLI, req.gpus))
        if approx is None:
            return 0.0, table.nodes[int(rows[0])]
        j, strand = _least_rounded(approx)  # (the first of equals: rows are in node order)
        return strand, table.nodes[int(rows[j])]

    def _add_whole(self, inv: Inventory, kind: str, cands: list, cost: float, taken: float, strand: float,
                   node: str, gpus: int, planned: float = 0.0) -> None:
        rank = self._rank(cost, 1, taken, 0.0, 0, 0, strand, planned)
        q = inv.position(node, 0)
        cands.append(((*rank, q, -1, 0), q, None, kind, True, gpus))

    def _reserve_fast(self, inv: Inventory, req: SlotRequest, cands: list) -> list:
        """:meth:`_reserve` on the fast path's candidates (held replicas from the Inventory's index)."""
        need = self._reserved_need(inv, req, inv.model_allocation_count)
        if not need:
            return cands
        mine = self._fit_kinds(inv, req)
        idle: dict[str, int] = {}
        for k in inv.kind_node_counts():
            idle[k] = sum(len(members) for sig, members in inv.device_groups(k).items() if sig.idle)
        out = []
        for c in cands:
            k = c[3]
            taken = c[4] and len(mine) > 1 and idle.get(k, 0) - c[5] < math.ceil(need.get(k, 0.0) - 1e-9)
            out.append(((1 if taken else 0, *c[0]), *c[1:]))
        return out

    # -- reservation ----------------------------------------------------------------------------
    def _reserved_need(self, inv: Inventory, req: SlotRequest, held: Callable[[str], int]) -> dict[str, float]:
        """Per GPU kind, the GPUs the expected replicas not yet placed will need there (only models that
        fit one kind alone count: the others can go elsewhere). ``held(model)``: replicas placed."""
        assert self._expected is not None
        need: dict[str, float] = {}
        for m, (r, n) in self._expected.items():
            left = n - held(m) - (1 if m == req.model else 0)  # this one is being placed now
            if left <= 0:
                continue
            kinds = self._fit_kinds(inv, r)
            if len(kinds) == 1:
                ((k, share),) = kinds.items()
                need[k] = need.get(k, 0.0) + left * share
        return need

    def _fit_kinds(self, inv: Inventory, req: SlotRequest) -> dict[str, float]:
        """GPU kinds that can hold one replica of ``req``, each with the least share of a GPU it takes."""
        # Cached per request and cluster shape: this runs for every expected model on every place.
        ck = (req, tuple((n.name, n.gpu_model, n.gpu_count, n.mig_enabled) for n in inv.nodes.values()))
        hit = self._fit_cache.get(ck)
        if hit is not None:
            return hit
        out: dict[str, float] = {}
        for node, gpu in eligible_nodes(inv, req):
            if gpu.name in out:
                continue
            mem = req.memory_gib
            if node.mig_enabled and gpu.mig_capable and "mig" in req.kinds and mem is not None and req.gpus == 1:
                for p in gpu.profiles_by_size():
                    if p.memory_gib >= mem and gpu.compute_fraction(p) >= req.compute_fraction:
                        out[gpu.name] = max(gpu.compute_fraction(p), p.mem_slices / gpu.mem_slices_total)
                        break
            if gpu.name not in out and "whole" in req.kinds and (mem is None or gpu.memory_gib * req.gpus >= mem):
                out[gpu.name] = float(req.gpus)
        if len(self._fit_cache) > 10_000:
            self._fit_cache.clear()
        self._fit_cache[ck] = out
        return out

    def _reserve(self, inv: Inventory, req: SlotRequest, cands: list[tuple[tuple, Slot]]) -> list[tuple[tuple, Slot]]:
        held: dict[str, int] = {}
        for owner, _ in inv.allocations():
            m = inv.model_of(owner)
            held[m] = held.get(m, 0) + 1
        need = self._reserved_need(inv, req, lambda m: held.get(m, 0))
        if not need:
            return cands
        mine = self._fit_kinds(inv, req)
        idle: dict[str, int] = {}
        for d in inv.devices.values():
            if d.idle:
                idle[d.gpu.name] = idle.get(d.gpu.name, 0) + 1
        out = []
        for key, slot in cands:
            k = inv.gpu_of(slot.node).name
            opens = any(inv.device(slot.node, i).idle for i in slot.devices)
            taken = opens and len(mine) > 1 and idle.get(k, 0) - len(slot.devices) < math.ceil(need.get(k, 0.0) - 1e-9)
            out.append(((1 if taken else 0, *key), slot))
        return out

    # -- candidates ---------------------------------------------------------------------------
    def candidates(
        self, inv: Inventory, req: SlotRequest, same_model: dict[tuple[str, int], int] | None = None
    ) -> Iterator[tuple[tuple, Slot]]:
        """Every legal slot for ``req`` with its ranking key (lower is better, before anti-affinity).

        ``same_model``: replicas of ``req.model`` per (node, device), computed here if not given.
        """
        if same_model is None:
            same_model = self._model_counts(inv, req.model)
        host = self._host_view(inv, req)
        per = host.per if host is not None else None
        order = 0
        for node, gpu in eligible_nodes(inv, req):
            if "whole" in req.kinds:
                slot = self._whole(inv, node, gpu, req)
                if slot is not None:
                    strand = self.placement_cost(inv, node.name, slot.gpu_fraction, req.cpu_millis,
                                                 req.host_memory_gib, per, (MILLI, MILLI, req.gpus))
                    key = self._rank(round(slot_cost(slot, gpu), _COST_DIGITS), 1, slot.gpu_fraction, 0.0, 0, 0,
                                     strand, round(self.displaced(inv, req.gpu_models, gpu.name, slot.gpu_fraction),
                                                   _COST_DIGITS))
                    yield (*key, order, 0, -1), slot
            if req.whole_only:
                order += 1
                continue
            seen_idle: set[bool] = set()
            for idx in range(node.gpu_count):
                d = inv.device(node.name, idx)
                if d.idle:
                    # Interchangeable with the node's other idle devices of the same mode.
                    if d.mig_enabled in seen_idle:
                        continue
                    seen_idle.add(d.mig_enabled)
                for slot in partial_candidates(inv, gpu, d, req):
                    yield self._key(inv, gpu, d, slot, same_model, order, per, gpu_models=req.gpu_models), slot
            order += 1

    def _key(
        self, inv: Inventory, gpu: GpuModel, d: DeviceState, slot: Slot, same: dict[tuple[str, int], int], order: int,
        per: HostPerGpu | None = None, host: bool = True, gpu_models: tuple[str, ...] = (),
    ) -> tuple:
        loss = 0
        if slot.instance is not None and slot.instance not in d.instances():
            before = future_slots(gpu, *_layout_state(d))
            loss = before - future_slots(gpu, *_layout_state(d, slot.instance))
        free_after = inv.free_memory_of(d) - (
            gpu.profiles[slot.profile].memory_gib if slot.kind is SlotKind.MIG else slot.memory_gib  # type: ignore[index]
        )
        move = _share_move(inv, d, slot) if self._workload is not None else None  # only fragmentation reads it
        planned = crowd = 0.0
        if self._workload is not None:
            # A partial slot's planned loss ranks ahead of best fit; the constrained shapes it crowds out weigh with
            # its host cost (key 6), where a whole slot's rank them first (measured, docs/sharing.md).
            if move is not None:
                planned = round(self.kind_shapes(inv, gpu.name).plan.loss(move[0], move[1]), _COST_DIGITS)  # type: ignore[union-attr]
            crowd = round(self.displaced(inv, gpu_models, gpu.name, charged_fraction(slot, gpu)), _COST_DIGITS)
        rank = self._rank(
            round(slot_cost(slot, gpu), _COST_DIGITS),
            1 if d.idle else 0,
            round(charged_fraction(slot, gpu), _COST_DIGITS),
            round(free_after, 6),
            loss,
            same.get((d.node, d.index), 0),
            self.placement_cost(inv, d.node, charged_fraction(slot, gpu), slot.cpu_millis, slot.host_memory_gib, per,
                                move) + crowd if host else 0.0,
            planned,
        )
        return (*rank, order, d.index, -1 if slot.start is None else slot.start)

    def _rank(self, cost: float, opens: int, fraction: float, free_after: float, loss: int, same: int,
              strand: float = 0.0, planned: float = 0.0) -> tuple:
        """The ranking key's head for the packer's objective.

        "cost": cost, opening a device, best fit, future slots lost, GPUs stranded for want of host CPU/memory,
        same-model replicas.
        "gpus" (fewest GPUs, for consolidation): opening a device first, then the smallest share of
        a GPU (on a new device that picks the kind holding the most such replicas per GPU), best
        fit, future slots lost, and cost, stranding and same-model replicas as the tie-breaks.
        """
        if self.objective == "gpus":
            return (opens, fraction, planned, free_after, loss, cost, strand, same)
        return (cost, planned, opens, free_after, loss, strand, same)

    @staticmethod
    def _whole(inv: Inventory, node: NodeSpec, gpu: GpuModel, req: SlotRequest) -> Slot | None:
        if req.memory_gib is not None and gpu.memory_gib * req.gpus < req.memory_gib:
            return None
        idle = [i for i in range(node.gpu_count) if inv.device(node.name, i).idle]
        if len(idle) < req.gpus or not inv.host_fits(node.name, req.cpu_millis, req.host_memory_gib):
            return None
        # Highest indices: partial slots fill a node's low indices first, so whole GPUs taken from
        # the top keep the two apart and leave the low idle devices for partial slots.
        return Slot.whole(node.name, idle[-req.gpus :], gpu).with_host(req.cpu_millis, req.host_memory_gib)

    # -- anti-affinity ------------------------------------------------------------------------
    @staticmethod
    def _model_counts(inv: Inventory, model: str) -> dict[tuple[str, int], int]:
        """Replicas of ``model`` per (node, device), from the Inventory's index."""
        return dict(inv.model_device_counts(model))

    @staticmethod
    def _spread_filter(
        inv: Inventory, req: SlotRequest, cands: list[tuple[tuple, Slot]], used: dict[tuple[str, int], int],
        node_level: bool = True,
    ) -> list[tuple[tuple, Slot]]:
        """Keep the candidates that spread the model, if any do (anti-affinity "when feasible")."""
        nodes = {n for n, _ in used}
        many_nodes = node_level and sum(1 for _ in eligible_nodes(inv, req)) > 1
        if many_nodes and len(nodes) == 1:
            off_node = [c for c in cands if c[1].node not in nodes]
            if off_node:
                return off_node
        if len(used) == 1:
            off_dev = [c for c in cands if not any((c[1].node, i) in used for i in c[1].devices)]
            if off_dev:
                return off_dev
        return cands


_MISSING = object()


def _least_rounded(approx: object) -> tuple[int, float]:
    """The index and value of the least of ``approx`` (unrounded stranding deltas) once rounded as the scalar
    :func:`~sharing.host_resources.stranding_delta` rounds (the first of equals): only the entries within float noise
    of the minimum are rounded, once per distinct value."""
    import numpy as np

    a = np.asarray(approx)
    near = np.flatnonzero(a <= a.min() + _NEAR)
    if near.size == 1:
        return int(near[0]), round(float(a[near[0]]), STRANDING_DIGITS)
    values, which = np.unique(a[near], return_inverse=True)
    exact = np.array([round(v, STRANDING_DIGITS) for v in values.tolist()])[which]
    j = int(np.argmin(exact))
    return int(near[j]), float(exact[j])


def _share_move(inv: Inventory, d: DeviceState, slot: Slot) -> tuple[int, int, int] | None:
    """The fragmentation move of a partial slot on ``d``: a time-slice share on a GPU without MIG takes its free milli
    down to what is left after it; a MIG slot has no move (MIG layouts are weighed by ``future_slots``)."""
    if slot.kind is not SlotKind.SHARE or d.mig_enabled:
        return None
    v = free_milli(inv, d)
    return v, v - milli_after(inv, d, slot.memory_gib), 1


class _HostView:
    """One placement's host resources and fragmentation: the request's CPU/memory, the learned ratio (``per``, None:
    no stranding), and per node, computed once, whether the request fits there and its key-6 cost
    (:meth:`CostAwarePacker.placement_cost`). Without a target workload, nodes in the same host state (free GPU
    capacity, free CPU, free memory) share one cost."""

    __slots__ = ("_by_state", "_deltas", "_fits", "cpu", "inv", "mem", "packer", "per", "table_nodes")

    def __init__(self, packer: CostAwarePacker, inv: Inventory, cpu_millis: int, host_memory_gib: float,
                 per: HostPerGpu | None) -> None:
        self.packer = packer
        self.inv, self.per = inv, per
        self.cpu, self.mem = cpu_millis, host_memory_gib
        # From how many nodes the array path pays (the scalar fragmentation is a loop over shapes and devices).
        self.table_nodes = 2 if packer._workload is not None else _TABLE_NODES
        self._fits: dict[str, bool] = {}
        self._deltas: dict[tuple[str, float], float] = {}
        self._by_state: dict[tuple, float] = {}

    def fits(self, node: str) -> bool:
        hit = self._fits.get(node)
        if hit is None:
            hit = self._fits[node] = self.inv.host_fits(node, self.cpu, self.mem)
        return hit

    def delta(self, node: str, taken: float, move: tuple[int, int, int] | None) -> float:
        """:meth:`CostAwarePacker.placement_cost` of taking ``taken`` GPUs (fragmentation: ``move``) and the request's
        host resources on ``node``."""
        frag = self.packer._workload is not None and move is not None
        if self.per is None and not frag:
            return 0.0
        hit = self._deltas.get((node, taken, move))
        if hit is None:
            inv = self.inv
            if frag:
                hit = self.packer.placement_cost(inv, node, taken, self.cpu, self.mem, self.per, move)
            elif not inv.nodes[node].host_accounted:
                hit = 0.0
            else:
                free = inv.free_gpu_capacity(node)
                state = (free, *inv.host_free(node), taken)
                hit = self._by_state.get(state)
                if hit is None:
                    hit = self._by_state[state] = self.packer.placement_cost(inv, node, taken, self.cpu, self.mem,
                                                                             self.per, None)
            self._deltas[(node, taken, move)] = hit
        return hit

    def costs(self, table: KindHostTable, rows: object, taken: float, move: tuple[int, int, int] | None) -> object:
        """:meth:`delta` for rows ``rows`` of a kind's host table at once, NOT rounded (within float noise of the
        rounded scalar: :func:`_least_rounded` ranks by it), or None when every cost is 0."""
        import numpy as np

        kf = self.packer.kind_fragmentation(self.inv, self.inv.nodes[table.nodes[0]].gpu_model) if move else None
        if self.per is None and kf is None:
            return None
        raw = (stranding_deltas(table, taken, self.cpu, self.mem, self.per)[rows] if self.per is not None
               else np.zeros(len(rows)))
        if kf is not None:
            raw = raw + kf.deltas(rows, *move, self.cpu, self.mem) * kf.kind.scale
        return raw


def _scan_model_counts(inv: Inventory, model: str) -> dict[tuple[str, int], int]:
    """Replicas of ``model`` per (node, device) by a scan of every allocation (the reference)."""
    out: dict[tuple[str, int], int] = {}
    for owner, s in inv.allocations():
        if inv.model_of(owner) == model:
            for i in s.devices:
                out[(s.node, i)] = out.get((s.node, i), 0) + 1
    return out


def _reference_place(packer: CostAwarePacker, inv: Inventory, req: SlotRequest) -> Slot | None:
    """What :meth:`CostAwarePacker.place` chooses, the straightforward way: every candidate slot on
    every eligible device (:meth:`CostAwarePacker.candidates`), the anti-affinity filter, the
    reservation, then the least key. Slow (O(devices x slots) per placement); kept as the
    specification that the fast path is tested against."""
    same = _scan_model_counts(inv, req.model)
    cands = list(packer.candidates(inv, req, same))
    if not cands:
        return None
    if packer.anti_affinity and same:
        cands = packer._spread_filter(inv, req, cands, same, packer.node_anti_affinity)
    if packer.prefer_open_nodes:
        opened = {d.node for d in inv.devices.values() if not d.idle}
        cands = [((0 if c[1].node in opened else 1, *c[0]), c[1]) for c in cands]
    if packer._expected is not None:  # the reservation ranks first, ahead of open nodes (see expect)
        cands = packer._reserve(inv, req, cands)
    return min(cands, key=lambda c: c[0])[1]


def _spread_broken(inv: Inventory, model: str) -> bool:
    """The model has >= 2 replicas all on one device, or all on one node of a multi-node cluster."""
    reps = inv.allocations_by_model().get(model, [])
    if len(reps) < 2:
        return False
    devs = {(s.node, i) for _, s in reps for i in s.devices}
    nodes = {s.node for _, s in reps}
    multi_node = sum(1 for n in inv.nodes.values() if n.gpu_count) > 1
    return len(devs) < 2 or (multi_node and len(nodes) < 2)


def consolidate(inv: Inventory, packer: CostAwarePacker, requests: dict[str, SlotRequest]) -> tuple[Inventory, int]:
    """Empty devices by re-placing their replicas on other in-use devices; returns (inventory, moves).

    A planning pass for a batch placed greedily: the greedy order opens a device for a replica
    (often one anti-affinity pushed off a full device) that, with everything placed, fits in the
    gaps others left. One sweep, emptiest device first; a device is emptied only if all its
    replicas fit elsewhere (packer ranking, spread filter) and no model loses its spread. The
    input is not changed. ``requests`` maps each owner to the request it was placed for.
    """
    moves = 0

    def load(d: DeviceState) -> float:
        return sum(s.memory_gib for _, s in d.entries)

    for key in [k for k, d in sorted(inv.devices.items(), key=lambda kd: load(kd[1])) if d.entries]:
        d = inv.devices[key]
        if not d.entries or any(s.kind is not SlotKind.MIG for _, s in d.entries):
            continue
        trial = inv.copy()
        entries = sorted(d.entries, key=lambda e: -e[1].memory_gib)
        models = {o: inv.model_of(o) for o, _ in entries}
        for owner, slot in entries:
            trial.release(slot, owner)
        ok = True
        for owner, _ in entries:
            req = requests[owner]
            same = packer._model_counts(trial, req.model)
            cands = [
                c
                for c in packer.candidates(trial, req, same)
                if all(not trial.device(c[1].node, i).idle and (c[1].node, i) != key for i in c[1].devices)
            ]
            if not cands:
                ok = False
                break
            if packer.anti_affinity and same:
                cands = packer._spread_filter(trial, req, cands, same)
            trial.allocate(min(cands, key=lambda c: c[0])[1], owner, model=models[owner])
        if ok and packer.anti_affinity:
            ok = not any(_spread_broken(trial, m) and not _spread_broken(inv, m) for m in set(models.values()))
        if ok:
            inv = trial
            moves += len(entries)
    return inv, moves
