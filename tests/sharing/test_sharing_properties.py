"""Property tests: random clusters, random place/allocate/release sequences.

The oracle below re-states the Inventory's rules from catalog facts alone, independently of
``Inventory.why_not``: a device state is valid iff it passes :func:`device_violations`, and a slot
is legal iff it is well-formed for its node (:func:`slot_violations`) and adding it leaves every
device it touches valid. Then for every state reached and every slot tried:

1. memory is never over-committed (time-sliced shares + reserve <= device or instance memory;
   MIG instances within the device);
2. MIG ranges never overlap and every (profile, start) is legal for the GPU model;
3. ``fits``/``allocate`` accept exactly the legal slots (so every illegal one is rejected) and a
   rejected allocate changes nothing;
4. release restores the state (equality with a copy taken before).
"""

from __future__ import annotations

from collections import Counter

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sharing.catalog import GpuModel, load_catalog
from sharing.packer import FirstFitPacker, place_batch
from sharing.slots import AllocationError, DeviceState, Inventory, NodeSpec, Slot, SlotKind, SlotRequest

CAT = load_catalog()
KINDS = ("H100-80GB", "A100-40GB", "A30-24GB", "H200-141GB", "T4-16GB", "L4-24GB")
EPS = 1e-9
FF = FirstFitPacker()


# -- the oracle -------------------------------------------------------------------------------
def device_violations(d: DeviceState, gpu: GpuModel, reserve: float, oversub: float, extra: Slot | None = None):
    entries = [s for _, s in d.entries] + ([extra] if extra is not None else [])
    out: list[str] = []
    if any(s.kind is SlotKind.WHOLE for s in entries) and (len(entries) > 1 or d.pinned):
        out.append("whole slot shares its GPU")
    instances = set(d.pinned) | {(s.profile, s.start) for s in entries if s.profile is not None}
    if not d.mig_enabled:
        if instances:
            out.append("MIG instance on a GPU not in MIG mode")
        shares = [s for s in entries if s.kind is SlotKind.SHARE]
        if shares and sum(s.memory_gib for s in shares) + reserve > gpu.memory_gib + EPS:
            out.append("time-slice memory over-committed")
        if sum(s.compute_fraction for s in shares) > oversub + EPS:
            out.append("compute oversubscribed")
        return out
    if any(s.kind is SlotKind.SHARE and s.profile is None for s in entries):
        out.append("plain share on a MIG-mode GPU")
    used = [False] * gpu.mem_slices_total
    counts: Counter[str] = Counter()
    compute = 0
    inst_mem = 0.0
    for key, start in instances:
        p = gpu.profiles.get(key)
        if p is None:
            out.append(f"profile {key} not on {gpu.name}")
            continue
        if start not in p.placements:
            out.append(f"{key}@{start} not a legal placement")
        for i in range(start, start + p.mem_slices):
            if i >= gpu.mem_slices_total or used[i]:
                out.append(f"{key}@{start} overlaps or runs off the GPU")
                break
            used[i] = True
        counts[key] += 1
        compute += p.compute_slices
        inst_mem += p.memory_gib
        occ = [s for s in entries if (s.profile, s.start) == (key, start)]
        if any(s.kind is SlotKind.MIG for s in occ) and len(occ) > 1:
            out.append(f"{key}@{start} exclusive instance shared")
        shares = [s for s in occ if s.kind is SlotKind.SHARE]
        if shares and sum(s.memory_gib for s in shares) + reserve > p.memory_gib + EPS:
            out.append(f"{key}@{start} memory over-committed")
        if sum(s.compute_fraction for s in shares) > gpu.compute_fraction(p) * oversub + EPS:
            out.append(f"{key}@{start} compute oversubscribed")
    if any(counts[k] > gpu.profiles[k].max_count for k in counts if k in gpu.profiles):
        out.append("profile max count exceeded")
    if compute > gpu.compute_slices_total:
        out.append("compute slices exceeded")
    if inst_mem > gpu.memory_gib + EPS:
        out.append("MIG instances exceed device memory")
    return out


def slot_violations(inv: Inventory, slot: Slot) -> list[str]:
    node = inv.nodes.get(slot.node)
    if node is None:
        return ["unknown node"]
    if slot.gpu_model not in CAT or CAT.get(slot.gpu_model).name != node.gpu_model:
        return ["wrong GPU model"]
    gpu = CAT.get(node.gpu_model)
    if any(not 0 <= i < node.gpu_count for i in slot.devices) or len(set(slot.devices)) != len(slot.devices):
        return ["bad devices"]
    n = len(slot.devices)
    if slot.kind is SlotKind.WHOLE and (
        abs(slot.memory_gib - n * gpu.memory_gib) > EPS or abs(slot.compute_fraction - n) > EPS
    ):
        return ["whole slot numbers"]
    if slot.kind is SlotKind.MIG:
        p = gpu.profiles.get(slot.profile or "")
        if p is None:
            return ["no such profile"]
        if abs(slot.memory_gib - p.memory_gib) > EPS or abs(slot.compute_fraction - gpu.compute_fraction(p)) > EPS:
            return ["MIG slot numbers"]
    if slot.kind is SlotKind.SHARE and slot.profile is not None and slot.profile not in gpu.profiles:
        return ["no such profile"]
    return []


def legal(inv: Inventory, slot: Slot) -> bool:
    if slot_violations(inv, slot):
        return False
    gpu = CAT.get(slot.gpu_model)
    return all(
        not device_violations(
            inv.device(slot.node, i), gpu, inv.share_reserve_gib, inv.max_compute_oversubscription, slot
        )
        for i in slot.devices
    )


def assert_valid(inv: Inventory) -> None:
    for d in inv.devices.values():
        v = device_violations(d, CAT.get(d.gpu_model), inv.share_reserve_gib, inv.max_compute_oversubscription)
        assert not v, (d, v)
    assert 0.0 <= inv.fragmentation() <= 1.0
    assert 0.0 <= inv.allocated_gpu_fraction() <= inv.max_compute_oversubscription + EPS
    assert inv.free_memory_gib() >= 0.0


# -- strategies -------------------------------------------------------------------------------
@st.composite
def clusters(draw) -> Inventory:
    nodes = []
    for i in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(KINDS))
        mig = CAT.get(kind).mig_capable and draw(st.booleans())
        nodes.append(NodeSpec(f"n{i}", kind, draw(st.integers(1, 3)), mig))
    return Inventory.from_nodes(
        nodes,
        share_reserve_gib=draw(st.sampled_from([0.0, 0.5, 1.0])),
        max_compute_oversubscription=draw(st.sampled_from([1.0, 1.5])),
    )


requests = st.builds(
    SlotRequest,
    model=st.just("m"),
    memory_gib=st.one_of(st.none(), st.sampled_from([1.0, 3.0, 5.0, 9.0, 12.0, 20.0, 35.0, 60.0, 79.5])),
    compute_fraction=st.sampled_from([0.05, 0.1, 0.14, 0.3, 0.5, 1.0]),
    gpus=st.sampled_from([1, 1, 1, 2]),
    kinds=st.sampled_from([("whole", "mig", "share"), ("share",), ("mig",), ("whole",), ("mig", "share")]),
)


def raw_slot(data, inv: Inventory) -> Slot:
    """Any well-formed slot, often illegal: bad nodes, devices, profiles, starts and numbers."""
    names = [*inv.nodes, "ghost"]
    node = data.draw(st.sampled_from(names))
    spec = inv.nodes.get(node)
    model = spec.gpu_model if spec is not None and data.draw(st.integers(0, 9)) else data.draw(st.sampled_from(KINDS))
    gpu = CAT.get(model)
    kind = data.draw(st.sampled_from(list(SlotKind)))
    dev = data.draw(st.integers(0, 3))
    right = data.draw(st.integers(0, 4)) > 0  # mostly the catalog's numbers, sometimes not
    if kind is SlotKind.WHOLE:
        devs = tuple(data.draw(st.lists(st.integers(0, 3), min_size=1, max_size=3)))
        mem = gpu.memory_gib * len(devs) if right else data.draw(st.sampled_from([1.0, 16.0, 80.0]))
        return Slot(node, devs, kind, model, None, None, mem, float(len(devs)) if right else 0.5)
    keys = sorted({k for g in KINDS for k in CAT.get(g).profiles})
    own = sorted(gpu.profiles) if gpu.profiles and data.draw(st.integers(0, 4)) else keys
    profile = data.draw(st.sampled_from(own))
    start = data.draw(st.integers(0, 7))
    if kind is SlotKind.MIG:
        p = gpu.profiles.get(profile)
        if right and p is not None:
            return Slot(node, (dev,), kind, model, profile, start, p.memory_gib, gpu.compute_fraction(p))
        return Slot(node, (dev,), kind, model, profile, start, data.draw(st.sampled_from([5.0, 10.0, 40.0])), 0.3)
    mem = data.draw(st.sampled_from([0.5, 2.0, 4.0, 8.0, 15.0, 30.0, 80.0]))
    if spec is not None and dev < spec.gpu_count and data.draw(st.booleans()):
        # Aim at the boundary, where an off-by-the-reserve bug would show.
        delta = data.draw(st.sampled_from([-0.25, 0.0, 0.25, inv.share_reserve_gib]))
        mem = max(0.1, inv.largest_free_gib(node, dev) + delta)
    comp = data.draw(st.sampled_from([0.02, 0.1, 0.2, 0.5, 1.0]))
    if data.draw(st.booleans()):
        return Slot(node, (dev,), kind, model, None, None, mem, comp)
    return Slot(node, (dev,), kind, model, profile, start, mem, comp)


FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# -- properties -------------------------------------------------------------------------------
@settings(FAST, max_examples=200)
@given(inv=clusters(), data=st.data())
def test_random_operation_sequences_keep_the_rules(inv: Inventory, data) -> None:
    n_owner = 0
    for _ in range(data.draw(st.integers(5, 30))):
        op = data.draw(st.sampled_from(["place", "place", "raw", "raw", "release", "pin"]))
        before = inv.copy()
        if op == "place":
            slot = FF.place(inv, data.draw(requests))
            assert inv == before  # place is pure
            if slot is None:
                continue
            assert legal(inv, slot), slot
        elif op == "raw":
            slot = raw_slot(data, inv)
        elif op == "release":
            allocs = list(inv.allocations())
            if not allocs:
                continue
            owner, slot = data.draw(st.sampled_from(allocs))
            inv.release(slot, owner)
            assert_valid(inv)
            after = inv.copy()
            inv.allocate(slot, owner)  # (4) the other way round: re-allocating restores it
            assert inv == before
            inv.release(slot, owner)
            assert inv == after
            continue
        else:  # pin a MIG instance ahead of demand; the same rules apply to it
            migs = [d for d in inv.devices.values() if d.mig_enabled]
            if not migs:
                continue
            d = data.draw(st.sampled_from(migs))
            gpu = CAT.get(d.gpu_model)
            p = data.draw(st.sampled_from(gpu.profiles_by_size(include_media=True)))
            start = data.draw(st.sampled_from(p.placements))
            try:
                inv.create_mig_instance(d.node, d.index, p.key, start)
            except AllocationError:
                assert inv == before
            assert_valid(inv)
            continue
        expect = legal(inv, slot)
        assert inv.fits(slot) == expect, (slot, inv.why_not(slot))  # (3) exactly the legal ones
        n_owner += 1
        owner = f"o{n_owner}"
        try:
            inv.allocate(slot, owner)
        except AllocationError:
            assert not expect
            assert inv == before  # a rejected allocate changes nothing
            continue
        assert expect
        assert_valid(inv)  # (1) and (2)
        inv.release(slot, owner)
        assert inv == before  # (4)
        inv.allocate(slot, owner)
    assert_valid(inv)


@FAST
@given(inv=clusters(), reqs=st.lists(requests, max_size=25))
def test_place_batch_only_makes_legal_allocations(inv: Inventory, reqs) -> None:
    empty = inv.copy()
    slots = place_batch(FF, inv, reqs)
    assert_valid(inv)
    placed = [(f"{r.model}/{i}", s) for i, (r, s) in enumerate(zip(reqs, slots, strict=True)) if s is not None]
    assert sorted(placed, key=lambda x: x[0]) == sorted(inv.allocations(), key=lambda x: x[0])
    for owner, s in reversed(placed):
        inv.release(s, owner)
    assert inv == empty
    assert inv.gpus_in_use() == 0 and inv.fragmentation() == 0.0


@FAST
@given(inv=clusters(), reqs=st.lists(requests, max_size=15), data=st.data())
def test_copies_are_independent(inv: Inventory, reqs, data) -> None:

    place_batch(FF, inv, reqs)
    snapshot = inv.copy()
    frozen = list(inv.allocations())
    c = inv.copy()
    place_batch(FF, c, [data.draw(requests) for _ in range(5)])
    for owner, s in list(c.allocations())[:3]:
        c.release(s, owner)
    assert inv == snapshot and list(inv.allocations()) == frozen
