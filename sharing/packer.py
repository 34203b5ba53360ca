"""Packers: choose a slot for a request. The first version is plain first-fit.

The seam: a packer is anything with a ``name`` and a *pure* ``place(inv, req)`` that returns a
legal slot (``inv.fits(slot)``) or None and never changes ``inv``; callers allocate. So packers can
be compared on copies of one inventory, and a smarter one (fragmentation-aware, re-layout with few
moves) drops in without touching callers. :func:`place_batch` is the common loop.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Protocol

from sharing.catalog import GpuModel, MigProfile
from sharing.slots import DeviceState, Inventory, NodeSpec, Slot, SlotRequest


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
        mem = req.memory_gib
        assert mem is not None
        # Any slot of ``mem`` GiB needs at least that much free memory: a cheap first cut that
        # skips full devices without building candidate slots.
        if d.whole_owner is not None or inv.free_memory_of(d) < mem:
            return None
        share_ok = "share" in req.kinds
        if not d.mig_enabled:
            if not share_ok:
                return None
            return self._confirm(inv, Slot.share(d.node, d.index, gpu, mem, req.compute_fraction))
        if share_ok:
            for inst, u in d.usage.items():
                if inst is not None and not u.exclusive and inv.share_room_gib(d, inst) >= mem:
                    slot = Slot.share(d.node, d.index, gpu, mem, req.compute_fraction, *inst)
                    if inv.fits(slot):
                        return slot
        if "mig" in req.kinds:
            for p in gpu.profiles_by_size():
                if p.memory_gib < mem or gpu.compute_fraction(p) < req.compute_fraction:
                    continue
                for start in p.placements:
                    if self._instance_free(d, p, start):
                        return self._confirm(inv, Slot.mig(d.node, d.index, gpu, p.key, start))
        elif share_ok:
            need = mem + inv.share_reserve_gib
            for p in gpu.profiles_by_size():
                if p.memory_gib < need or gpu.compute_fraction(p) * inv.max_compute_oversubscription < (
                    req.compute_fraction
                ):
                    continue
                for start in p.placements:
                    if self._instance_free(d, p, start):
                        slot = Slot.share(d.node, d.index, gpu, mem, req.compute_fraction, p.key, start)
                        return self._confirm(inv, slot)
        return None

    @staticmethod
    def _instance_free(d: DeviceState, p: MigProfile, start: int) -> bool:
        """An empty instance exists at (p, start), or one can be created there."""
        inst = (p.key, start)
        if inst in d.instances():
            return inst not in d.usage
        return d.can_create(p, start)

    @staticmethod
    def _confirm(inv: Inventory, slot: Slot) -> Slot | None:
        # The Inventory is the one authority on legality; the shortcuts above only pick candidates.
        return slot if inv.fits(slot) else None

    def _whole(self, inv: Inventory, req: SlotRequest) -> Slot | None:
        for node, gpu in eligible_nodes(inv, req):
            if req.memory_gib is not None and gpu.memory_gib * req.gpus < req.memory_gib:
                continue
            idle = [i for i in range(node.gpu_count) if inv.device(node.name, i).idle]
            if len(idle) >= req.gpus:
                return Slot.whole(node.name, idle[: req.gpus], gpu)
        return None
