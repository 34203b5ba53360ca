"""Packers: choose a slot for a request: plain first-fit, and cost-aware with anti-affinity.

The seam: a packer is anything with a ``name`` and a *pure* ``place(inv, req)`` that returns a
legal slot (``inv.fits(slot)``) or None and never changes ``inv``; callers allocate. So packers can
be compared on copies of one inventory, and a smarter one (fragmentation-aware, re-layout with few
moves) drops in without touching callers. :func:`place_batch` is the common loop.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Protocol

from sharing.catalog import GpuModel, MigProfile
from sharing.slots import DeviceState, Inventory, NodeSpec, Slot, SlotKind, SlotRequest


class Packer(Protocol):
    name: str

    def place(self, inv: Inventory, req: SlotRequest) -> Slot | None: ...


def place_batch(
    packer: Packer, inv: Inventory, reqs: Sequence[SlotRequest], owners: Sequence[str] | None = None
) -> list[Slot | None]:
    """Place and allocate ``reqs`` on ``inv`` in order; None where a request did not fit.

    ``owners`` names each allocation; by default ``"<model>/<i>"`` (i the request's position),
    suffixed ``.1``, ``.2``, ... when the inventory already has that owner, so repeated batches on
    one inventory never collide.
    """
    if owners is not None and len(owners) != len(reqs):
        raise ValueError(f"{len(owners)} owners for {len(reqs)} requests")
    used = {o for o, _ in inv.allocations()} if owners is None else set()
    out: list[Slot | None] = []
    for i, req in enumerate(reqs):
        slot = packer.place(inv, req)
        if slot is not None:
            if owners is not None:
                owner = owners[i]
            else:
                owner = base = f"{req.model}/{i}"
                n = 0
                while owner in used:
                    n += 1
                    owner = f"{base}.{n}"
                used.add(owner)
            inv.allocate(slot, owner)
        out.append(slot)
    return out


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
    each free legal placement, else (share-only on a MIG GPU) a new shared instance. Each candidate is
    confirmed by the Inventory, the one authority on legality."""
    mem = req.memory_gib
    assert mem is not None
    # Any slot of ``mem`` GiB needs at least that much free memory: a cheap first cut that skips full
    # devices without building candidate slots.
    if d.whole_owner is not None or inv.free_memory_of(d) < mem:
        return
    share_ok = "share" in req.kinds
    if not d.mig_enabled:
        if share_ok:
            slot = Slot.share(d.node, d.index, gpu, mem, req.compute_fraction)
            if inv.fits(slot):
                yield slot
        return
    if share_ok:
        for inst, u in d.usage.items():
            if inst is not None and not u.exclusive and inv.share_room_gib(d, inst) >= mem:
                slot = Slot.share(d.node, d.index, gpu, mem, req.compute_fraction, *inst)
                if inv.fits(slot):
                    yield slot
    if "mig" in req.kinds:
        for p in gpu.profiles_by_size():
            if p.memory_gib < mem or gpu.compute_fraction(p) < req.compute_fraction:
                continue
            for start in p.placements:
                if _instance_free(d, p, start):
                    slot = Slot.mig(d.node, d.index, gpu, p.key, start)
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
                    slot = Slot.share(d.node, d.index, gpu, mem, req.compute_fraction, p.key, start)
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
            if len(idle) >= req.gpus:
                return Slot.whole(node.name, idle[: req.gpus], gpu)
        return None


# -- cost-aware packing ------------------------------------------------------------------------
_COST_DIGITS = 9  # costs equal to 1e-9 $/h are ties, so float noise never outranks the tie-breaks


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
    3. **no newly opened device** (a device with nothing on it and no MIG instance costs a
       whole GPU of capacity the moment anything lands there);
    4. **best fit**: least free memory left on the device (consolidation is what keeps GPU count
       down; measured: ranking the two below first cost GPUs in ``mig-bench``);
    5. **fewest future slots lost** on the device (:func:`future_slots` before minus after), which
       is what picks ``3g@4`` over ``3g@0``;
    6. **fewest replicas of the same model** on the device (soft spreading), then inventory order.

    Idle devices of one node (same kind and MIG mode) are interchangeable, so only the first is
    scored: this keeps a placement at O(used devices + nodes), not O(devices).
    """

    name = "cost-aware"

    def __init__(self, anti_affinity: bool = True) -> None:
        self.anti_affinity = anti_affinity

    def place(self, inv: Inventory, req: SlotRequest) -> Slot | None:
        same = self._model_counts(inv, req.model)
        cands = list(self.candidates(inv, req, same))
        if not cands:
            return None
        if self.anti_affinity and same:
            cands = self._spread_filter(inv, req, cands, same)
        return min(cands, key=lambda c: c[0])[1]

    # -- candidates ---------------------------------------------------------------------------
    def candidates(
        self, inv: Inventory, req: SlotRequest, same_model: dict[tuple[str, int], int] | None = None
    ) -> Iterator[tuple[tuple, Slot]]:
        """Every legal slot for ``req`` with its ranking key (lower is better, before anti-affinity).

        ``same_model``: replicas of ``req.model`` per (node, device), computed here if not given.
        """
        if same_model is None:
            same_model = self._model_counts(inv, req.model)
        order = 0
        for node, gpu in eligible_nodes(inv, req):
            if "whole" in req.kinds:
                slot = self._whole(inv, node, gpu, req)
                if slot is not None:
                    key = (round(slot_cost(slot, gpu), _COST_DIGITS), 1, 0.0, 0, 0, order, 0, -1)
                    yield key, slot
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
                    yield self._key(inv, gpu, d, slot, same_model, order), slot
            order += 1

    def _key(
        self, inv: Inventory, gpu: GpuModel, d: DeviceState, slot: Slot, same: dict[tuple[str, int], int], order: int
    ) -> tuple:
        loss = 0
        if slot.instance is not None and slot.instance not in d.instances():
            before = future_slots(gpu, *_layout_state(d))
            loss = before - future_slots(gpu, *_layout_state(d, slot.instance))
        free_after = inv.free_memory_of(d) - (
            gpu.profiles[slot.profile].memory_gib if slot.kind is SlotKind.MIG else slot.memory_gib  # type: ignore[index]
        )
        return (
            round(slot_cost(slot, gpu), _COST_DIGITS),
            1 if d.idle else 0,
            round(free_after, 6),
            loss,
            same.get((d.node, d.index), 0),
            order,
            d.index,
            -1 if slot.start is None else slot.start,
        )

    @staticmethod
    def _whole(inv: Inventory, node: NodeSpec, gpu: GpuModel, req: SlotRequest) -> Slot | None:
        if req.memory_gib is not None and gpu.memory_gib * req.gpus < req.memory_gib:
            return None
        idle = [i for i in range(node.gpu_count) if inv.device(node.name, i).idle]
        if len(idle) < req.gpus:
            return None
        # Highest indices: partial slots fill a node's low indices first, so whole GPUs taken from
        # the top keep the two apart and leave the low idle devices for partial slots.
        return Slot.whole(node.name, idle[-req.gpus :], gpu)

    # -- anti-affinity ------------------------------------------------------------------------
    @staticmethod
    def _model_counts(inv: Inventory, model: str) -> dict[tuple[str, int], int]:
        out: dict[tuple[str, int], int] = {}
        for owner, s in inv.allocations():
            if inv.model_of(owner) == model:
                for i in s.devices:
                    out[(s.node, i)] = out.get((s.node, i), 0) + 1
        return out

    @staticmethod
    def _spread_filter(
        inv: Inventory, req: SlotRequest, cands: list[tuple[tuple, Slot]], used: dict[tuple[str, int], int]
    ) -> list[tuple[tuple, Slot]]:
        """Keep the candidates that spread the model, if any do (anti-affinity "when feasible")."""
        nodes = {n for n, _ in used}
        many_nodes = sum(1 for _ in eligible_nodes(inv, req)) > 1
        if many_nodes and len(nodes) == 1:
            off_node = [c for c in cands if c[1].node not in nodes]
            if off_node:
                return off_node
        if len(used) == 1:
            off_dev = [c for c in cands if not any((c[1].node, i) in used for i in c[1].devices)]
            if off_dev:
                return off_dev
        return cands
