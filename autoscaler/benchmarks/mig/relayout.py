"""Re-layout: from the current placement to one that meets a new demand, with the fewest moves.

A *move* relocates a running replica (surge: the new copy starts before the old one stops, so the
model never loses a replica). Placing a new replica or removing a surplus one is not a move. The
order of preference, cheapest first:

1. **keep** every running replica whose slot still satisfies its model's request; its slot, and
   the MIG instance under it, are never touched;
2. **remove** surplus replicas, choosing those whose departure empties a device or a range
   (fewest other occupants), keeping the model spread over two devices, newest first;
3. **place** new replicas with the packer (cost-aware by default), as one batch: on a small cluster
   the batch is placed exactly (:func:`sharing.mig_exact.place_batch_exact`, the per-device MILP
   within ``exact_budget_s``, with every kept replica fixed where it is) when that is no worse than
   the packer's one-by-one placement, which stands otherwise. MIG instances are created on
   free memory-slice ranges only (the Inventory refuses overlaps), so neighbours keep running —
   the partial re-configuration NVIDIA's maintainers confirm works (k8s-device-plugin #992);
   an empty pinned instance in the way is destroyed (nothing runs in it);
4. only then **move** replicas, at most ``max_moves`` per call: a replica whose slot no longer
   satisfies its request (say the memory grew) is re-placed; and for a replica that still fits
   nowhere, the device option needing the fewest evictions is found (the occupants of one MIG
   range, or the smallest set of time-slice shares), the evicted replicas are re-placed elsewhere
   first, and the new replica takes the freed range. Options whose evictees cannot all be
   re-placed are skipped.

Models absent from the demand are left as they are (a demand of 0 removes a model). A replica
needing a move beyond the budget stays where it is, reported as ``stale`` (it still serves, so it
counts toward its model's replicas); the next call continues.

Pure: ``current`` is never changed; the result carries the new Inventory.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from sharing.mig_exact import DEFAULT_BUDGET_S, BatchOutcome, place_batch_exact
from sharing.packer import CostAwarePacker, Packer
from sharing.slots import AllocationError, Inventory, Slot, SlotKind, SlotRequest

_SEQ = re.compile(r"-(\d+)$")
_MAX_OPTIONS = 64  # eviction options tried per unplaced replica: bounds the work of one call


@dataclass(frozen=True)
class ModelDemand:
    replicas: int
    request: SlotRequest

    def __post_init__(self) -> None:
        if self.replicas < 0:
            raise ValueError(f"{self.request.model}: replicas must be >= 0, got {self.replicas}")


@dataclass(frozen=True)
class Move:
    owner: str
    model: str
    source: Slot
    target: Slot


@dataclass(frozen=True)
class MigChange:
    node: str
    device: int
    profile: str
    start: int


@dataclass(frozen=True)
class RelayoutResult:
    inventory: Inventory
    kept: tuple[tuple[str, Slot], ...]
    placed: tuple[tuple[str, Slot], ...]
    removed: tuple[tuple[str, Slot], ...]
    moved: tuple[Move, ...]
    mig_created: tuple[MigChange, ...]
    mig_destroyed: tuple[MigChange, ...]
    unplaced: Mapping[str, int] = field(default_factory=dict)
    stale: tuple[tuple[str, Slot], ...] = ()

    @property
    def moves(self) -> int:
        return len(self.moved)

    def summary(self) -> dict[str, int]:
        return {
            "kept": len(self.kept),
            "placed": len(self.placed),
            "removed": len(self.removed),
            "moved": len(self.moved),
            "mig_created": len(self.mig_created),
            "mig_destroyed": len(self.mig_destroyed),
            "unplaced": sum(self.unplaced.values()),
            "stale": len(self.stale),
        }


def satisfies(slot: Slot, req: SlotRequest, inv: Inventory) -> bool:
    """Whether a running replica's slot still meets its (possibly changed) request."""
    if slot.kind.value not in req.kinds:
        return False
    if req.gpu_models:
        allowed = {inv.catalog.resolve(m) for m in req.gpu_models if m in inv.catalog}
        if slot.gpu_model not in allowed:
            return False
    if req.memory_gib is None or req.gpus > 1:
        if slot.kind is not SlotKind.WHOLE or len(slot.devices) != req.gpus:
            return False
        return req.memory_gib is None or slot.memory_gib >= req.memory_gib - 1e-9
    return slot.memory_gib >= req.memory_gib - 1e-9 and slot.compute_fraction >= req.compute_fraction - 1e-9


def _seq(owner: str) -> int:
    m = _SEQ.search(owner)
    return int(m.group(1)) if m else -1


def _request_for(slot: Slot, model: str) -> SlotRequest:
    """A request that a replica's current slot answers exactly (for models absent from the demand)."""
    if slot.kind is SlotKind.WHOLE:
        return SlotRequest(model, None, gpus=len(slot.devices), kinds=("whole",), gpu_models=(slot.gpu_model,))
    return SlotRequest(model, slot.memory_gib, slot.compute_fraction, kinds=(slot.kind.value,))


class _State:
    """The working copy and the record of what happened to it."""

    def __init__(self, inv: Inventory, packer: Packer, max_moves: int) -> None:
        self.inv = inv
        self.packer = packer
        self.budget = max_moves
        self.placed: list[tuple[str, Slot]] = []
        self.removed: list[tuple[str, Slot]] = []
        self.moved: list[Move] = []
        self.next_seq: dict[str, int] = {}

    def new_owner(self, model: str) -> str:
        n = self.next_seq.get(model)
        if n is None:
            n = 1 + max((_seq(o) for o, _ in self.inv.allocations() if self.inv.model_of(o) == model), default=0)
        self.next_seq[model] = n + 1
        return f"{model}-{n}"


def _removal_order(inv: Inventory, replicas: list[tuple[str, Slot]], count: int) -> list[tuple[str, Slot]]:
    """``count`` replicas to remove: keep the model on two devices, free whole devices, newest first."""
    left = list(replicas)
    out: list[tuple[str, Slot]] = []
    for _ in range(count):

        def key(e: tuple[str, Slot]) -> tuple:
            owner, s = e
            rest_devs = {(x.node, i) for o, x in left if o != owner for i in x.devices}
            breaks_spread = 1 if len(left) > 2 and len(rest_devs) < 2 else 0
            others = sum(len(inv.device(s.node, i).entries) - 1 for i in s.devices)
            return (breaks_spread, others, -_seq(owner), owner)

        pick = min(left, key=key)
        left.remove(pick)
        out.append(pick)
    return out


def _place(st: _State, req: SlotRequest, owner: str, model: str) -> Slot | None:
    slot = st.packer.place(st.inv, req)
    if slot is None:
        slot = _place_freeing_pinned(st, req)
    if slot is not None:
        st.inv.allocate(slot, owner, model=model)
    return slot


def _place_freeing_pinned(st: _State, req: SlotRequest) -> Slot | None:
    """Destroy empty pinned MIG instances, one device at a time, until ``req`` fits (no moves needed)."""
    for (node, idx), d in st.inv.devices.items():
        empty = [inst for inst in d.pinned if not d.occupants(inst)]
        if not empty:
            continue
        trial = st.inv.copy()
        for prof, start in empty:
            trial.destroy_mig_instance(node, idx, prof, start)
        slot = st.packer.place(trial, req)
        if slot is not None:
            st.inv = trial
            return slot
    return None


def _eviction_options(inv: Inventory, req: SlotRequest) -> list[tuple[list[tuple[str, Slot]], Slot]]:
    """(evictees, target slot) pairs that would make room for ``req``, fewest evictees first."""
    from sharing.packer import eligible_nodes  # local: keeps this module's import surface small

    mem = req.memory_gib
    out: list[tuple[list[tuple[str, Slot]], Slot]] = []
    if mem is None or req.whole_only:
        for node, gpu in eligible_nodes(inv, req):
            if req.memory_gib is not None and gpu.memory_gib * req.gpus < req.memory_gib:
                continue
            devs = sorted(range(node.gpu_count), key=lambda i: len(inv.device(node.name, i).entries))
            chosen = devs[: req.gpus]
            if len(chosen) < req.gpus or any(inv.device(node.name, i).pinned for i in chosen):
                continue
            ev = {(o, s) for i in chosen for o, s in inv.device(node.name, i).entries}
            out.append((sorted(ev, key=lambda e: e[0]), Slot.whole(node.name, chosen, gpu)))
    else:
        for node, gpu in eligible_nodes(inv, req):
            for idx in range(node.gpu_count):
                d = inv.device(node.name, idx)
                entries = [(o, s) for o, s in d.entries if s.devices[0] == idx or s.kind is not SlotKind.WHOLE]
                if d.whole_owner is not None:
                    continue  # evicting a whole-GPU replica to fit a smaller one is never the cheapest
                if d.mig_enabled and "mig" in req.kinds:
                    for p in gpu.profiles_by_size():
                        if p.memory_gib < mem or gpu.compute_fraction(p) < req.compute_fraction:
                            continue
                        for start in p.placements:
                            r = ((1 << p.mem_slices) - 1) << start
                            ev = []
                            for o, s in entries:
                                q = gpu.profiles[s.profile]  # type: ignore[index]
                                if ((1 << q.mem_slices) - 1) << s.start & r:  # type: ignore[operator]
                                    ev.append((o, s))
                            if ev and not any(inst == (p.key, start) for inst in d.pinned):
                                out.append((ev, Slot.mig(node.name, idx, gpu, p.key, start)))
                elif not d.mig_enabled and "share" in req.kinds:
                    # Largest shares first: the fewest evictions that leave room.
                    room = inv.share_room_gib(d, None)
                    ev = []
                    for o, s in sorted(entries, key=lambda e: -e[1].memory_gib):
                        if room >= mem:
                            break
                        ev.append((o, s))
                        room += s.memory_gib
                    if ev and room >= mem:
                        out.append((ev, Slot.share(node.name, idx, gpu, mem, req.compute_fraction)))
    out.sort(key=lambda e: (len(e[0]), sum(s.memory_gib for _, s in e[0])))
    return out


def _place_by_moving(
    st: _State, req: SlotRequest, owner: str, model: str, requests: Mapping[str, SlotRequest], own_move: int = 0
) -> Slot | None:
    """Make room for one replica by relocating the fewest others (within the move budget).

    ``own_move`` is 1 when the replica itself is being moved, so its own move is budgeted too.
    """
    for evictees, target in _eviction_options(st.inv, req)[:_MAX_OPTIONS]:
        if len(evictees) + own_move > st.budget:
            break  # sorted by size: none further fits the budget
        if any(o == owner for o, _ in evictees):
            continue  # never evict the replica being re-placed to make room for itself
        trial = st.inv.copy()
        for o, s in evictees:
            trial.release(s, o)
        try:
            trial.allocate(target, owner, model=model)
        except AllocationError:
            continue  # e.g. compute slices or a profile count still in the way
        moves: list[Move] = []
        for o, s in evictees:
            m = trial.model_of(o)
            r = requests.get(m) or _request_for(s, m)
            new = st.packer.place(trial, r)
            if new is None:
                break
            trial.allocate(new, o, model=m)
            moves.append(Move(o, m, s, new))
        else:
            st.inv = trial
            st.moved.extend(moves)
            st.budget -= len(moves)
            return target
    return None


def _place_exact(
    st: _State, to_place: list[tuple[str, SlotRequest]], budget_s: float
) -> list[tuple[str, Slot] | None] | None:
    """Step 3 as one exact batch on the working copy: the (owner, slot) placed per entry of ``to_place``, or None
    when the packer's own placement stands (then nothing is changed and step 3 runs one by one, as before)."""
    trial = st.inv.copy()
    outcome: list[BatchOutcome] = []
    owners = [f"{m}/{k}" for k, (m, _) in enumerate(to_place)]  # on the trial copy only; real names below
    slots = place_batch_exact(
        st.packer, trial, [r for _, r in to_place], budget_s, owners, decreasing=False, outcome=outcome
    )
    if outcome[0].used != "exact":
        return None
    out: list[tuple[str, Slot] | None] = []
    for (model, _), slot in zip(to_place, slots, strict=True):
        if slot is None:
            out.append(None)
            continue
        owner = st.new_owner(model)
        st.inv.allocate(slot, owner, model=model)
        st.placed.append((owner, slot))
        out.append((owner, slot))
    return out


def relayout(
    current: Inventory,
    demand: Mapping[str, ModelDemand | tuple[int, SlotRequest]],
    packer: Packer | None = None,
    max_moves: int = 4,
    exact_budget_s: float | None = DEFAULT_BUDGET_S,
) -> RelayoutResult:
    """The next placement for ``demand`` (replicas and request per model), fewest moves first.

    ``exact_budget_s``: the time budget of the exact batch placement of step 3 (None: the packer only).
    """
    if max_moves < 0:
        raise ValueError(f"max_moves must be >= 0, got {max_moves}")
    dem = {m: d if isinstance(d, ModelDemand) else ModelDemand(int(d[0]), d[1]) for m, d in demand.items()}
    st = _State(current.copy(), packer if packer is not None else CostAwarePacker(), max_moves)
    by_model = st.inv.allocations_by_model()
    requests = {m: d.request for m, d in dem.items()}
    stale: list[tuple[str, Slot]] = []
    to_place: list[tuple[str, SlotRequest]] = []
    to_replace: list[tuple[str, Slot, SlotRequest]] = []

    # 1-2. Keep what still fits, remove the surplus (no moves).
    for model, d in dem.items():
        running = by_model.get(model, [])
        ok = [(o, s) for o, s in running if satisfies(s, d.request, st.inv)]
        unfit = [(o, s) for o, s in running if not satisfies(s, d.request, st.inv)]
        if len(ok) >= d.replicas:
            drop = _removal_order(st.inv, ok, len(ok) - d.replicas) + unfit
        else:
            need = d.replicas - len(ok)
            unfit.sort(key=lambda e: _seq(e[0]))
            to_replace.extend((o, s, d.request) for o, s in unfit[:need])
            drop = unfit[need:]
            to_place.extend((model, d.request) for _ in range(need - len(unfit[:need])))
        for o, s in drop:
            st.inv.release(s, o)
            st.removed.append((o, s))

    # 3. New replicas on free capacity; larger first, as a batch packer would.
    to_place.sort(key=lambda e: -(e[1].memory_gib or 1e9 * e[1].gpus))
    unplaced: dict[str, int] = {}
    waiting: list[tuple[str, SlotRequest]] = []
    batch = _place_exact(st, to_place, exact_budget_s) if exact_budget_s is not None and to_place else None
    for k, (model, req) in enumerate(to_place):
        if batch is not None and batch[k] is not None:
            continue  # placed by the exact batch (recorded there)
        owner = st.new_owner(model)
        slot = _place(st, req, owner, model)
        if slot is None:
            waiting.append((model, req))
        else:
            st.placed.append((owner, slot))

    # 4a. Re-place replicas whose slot no longer fits their request (each a move, surge first).
    for owner, old, req in to_replace:
        if st.budget <= 0:
            stale.append((owner, old))
            continue
        model = st.inv.model_of(owner)
        new = st.packer.place(st.inv, req) or _place_by_moving(st, req, owner, model, requests, own_move=1)
        if new is None:
            stale.append((owner, old))
            continue
        if new not in st.inv.slots_of(owner):
            st.inv.allocate(new, owner, model=model)
        st.inv.release(old, owner)
        st.moved.append(Move(owner, model, old, new))
        st.budget -= 1

    # 4b. Replicas still waiting: relocate the fewest others to make room.
    for model, req in waiting:
        owner = st.new_owner(model)
        slot = _place_by_moving(st, req, owner, model, requests) if st.budget > 0 else None
        if slot is None:
            unplaced[model] = unplaced.get(model, 0) + 1
        else:
            st.placed.append((owner, slot))

    moved_owners = {m.owner for m in st.moved}
    placed_owners = {o for o, _ in st.placed}
    removed = set(st.removed)
    stale_set = set(stale)
    kept = tuple(
        (o, s)
        for o, s in current.allocations()
        if (o, s) not in removed and o not in moved_owners and o not in placed_owners and (o, s) not in stale_set
    )
    created, destroyed = _mig_diff(current, st.inv)
    return RelayoutResult(
        inventory=st.inv,
        kept=kept,
        placed=tuple(st.placed),
        removed=tuple(st.removed),
        moved=tuple(st.moved),
        mig_created=created,
        mig_destroyed=destroyed,
        unplaced=unplaced,
        stale=tuple(stale),
    )


def _mig_diff(before: Inventory, after: Inventory) -> tuple[tuple[MigChange, ...], tuple[MigChange, ...]]:
    created: list[MigChange] = []
    destroyed: list[MigChange] = []
    for key, d0 in before.devices.items():
        d1 = after.devices[key]
        if d0 is d1:
            continue
        a, b = set(d0.instances()), set(d1.instances())
        created.extend(MigChange(key[0], key[1], p, s) for p, s in sorted(b - a))
        destroyed.extend(MigChange(key[0], key[1], p, s) for p, s in sorted(a - b))
    return tuple(created), tuple(destroyed)
