"""The fast ``CostAwarePacker.place`` against ``_reference_place`` (every candidate on every device, then the
filters and the least key): the same slot, always, including ties; and the Inventory's indexes that the fast
path reads (device groups, the model -> devices counts) always equal a recount from scratch."""

from __future__ import annotations

import contextlib
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sharing.catalog import load_catalog
from sharing.cluster import nodes_from_spec
from sharing.fragmentation import TargetWorkload, WorkloadShapes
from sharing.packer import CostAwarePacker, _reference_place, _scan_model_counts
from sharing.slots import AllocationError, Inventory, NodeSpec, Slot, SlotRequest, model_from_owner

CAT = load_catalog()
# Equal prices per GPU for two kinds of equal geometry make exact cost ties across kinds and nodes.
TIED = CAT.with_prices({"A100-80GB": 3.5, "H100-80GB": 3.5})
KINDS = ("H100-80GB", "A100-40GB", "A100-80GB", "A30-24GB", "H200-141GB", "L4-24GB")
MODELS = ("a", "b", "c", "d")
SLOW = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

requests = st.builds(
    SlotRequest,
    model=st.sampled_from(MODELS),
    memory_gib=st.one_of(
        st.none(), st.sampled_from([1.0, 4.0, 6.0, 8.0, 10.0, 20.0, 23.0, 24.0, 35.0, 40.0, 79.0, 80.0, 141.0])
    ),
    compute_fraction=st.sampled_from([0.1, 0.125, 1 / 7, 0.25, 2 / 7, 3 / 7, 0.5, 1.0]),
    gpus=st.sampled_from([1, 1, 1, 1, 2, 3]),
    kinds=st.sampled_from(
        [("whole", "mig", "share"), ("share",), ("mig",), ("whole",), ("mig", "share"), ("whole", "share")]
    ),
    gpu_models=st.sampled_from([(), (), (), ("H100-80GB",), ("A100-40GB", "L4-24GB"), ("NVIDIA-H100-80GB-HBM3",),
                                ("no-such-gpu",)]),
)


@st.composite
def inventories(draw) -> Inventory:
    nodes = []
    for i in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from(KINDS))
        mig = CAT.get(kind).mig_capable and draw(st.booleans())
        nodes.append(NodeSpec(f"n{i}", kind, draw(st.integers(0, 4)), mig))
    inv = Inventory.from_nodes(
        nodes,
        draw(st.sampled_from([CAT, TIED])),
        share_reserve_gib=draw(st.sampled_from([0.0, 0.5, 1.0])),
        max_compute_oversubscription=draw(st.sampled_from([1.0, 1.5, 2.0])),
    )
    for d in list(inv.devices.values()):  # a few devices in the other MIG mode than their node
        if d.gpu.mig_capable and draw(st.integers(0, 5)) == 0:
            inv.set_mig_mode(d.node, d.index, not d.mig_enabled)
    return inv


@st.composite
def packers(draw) -> CostAwarePacker:
    p = CostAwarePacker(
        anti_affinity=draw(st.booleans()),
        objective=draw(st.sampled_from(["cost", "gpus"])),
        prefer_open_nodes=draw(st.booleans()),
        node_anti_affinity=draw(st.booleans()),
    )
    if draw(st.integers(0, 3)) == 0:
        p.expect(draw(st.lists(requests, max_size=12)))
    if draw(st.integers(0, 2)) == 0:  # a target workload: the gap plan and fragmentation rank slots too
        p.target_workload(workload_of(draw(st.lists(requests, min_size=1, max_size=12))))
    return p


def workload_of(reqs: list[SlotRequest]) -> WorkloadShapes:
    work = TargetWorkload(half_life=1e6)
    for r in reqs:
        work.observe_request(r)
    return work.shapes()


def check_index(inv: Inventory, names: set[str]) -> None:
    """The indexes equal what a scan of the devices and allocations says."""
    keys = list(inv.devices)
    assert [inv.position(*k) for k in keys] == sorted(inv.position(*k) for k in keys)
    groups: dict[str, dict] = {}
    for k in keys:
        d = inv.devices[k]
        groups.setdefault(d.gpu_model, {}).setdefault(d.signature, []).append(inv.position(*k))
        assert inv.device_at(inv.position(*k)) is d
    for kind in {d.gpu_model for d in inv.devices.values()}:
        assert {s: list(m) for s, m in inv.device_groups(kind).items()} == groups.get(kind, {})
    allocs: dict[str, int] = {}
    for owner, _ in inv.allocations():
        m = inv.model_of(owner)
        allocs[m] = allocs.get(m, 0) + 1
    for m in names | set(allocs) | set(MODELS):
        assert dict(inv.model_device_counts(m)) == _scan_model_counts(inv, m), m
        assert inv.model_allocation_count(m) == allocs.get(m, 0), m


def same_choice(packer: CostAwarePacker, inv: Inventory, req: SlotRequest):
    before = inv.copy()
    fast = packer.place(inv, req)
    ref = _reference_place(packer, inv, req)
    assert fast == ref, (req, fast, ref)
    assert inv == before  # place is pure
    return fast


@SLOW
@given(inv=inventories(), packer=packers(), data=st.data())
def test_fast_place_chooses_what_the_reference_chooses(inv: Inventory, packer: CostAwarePacker, data) -> None:
    names: set[str] = set()
    seq = 0
    older: Inventory | None = None  # a copy's source, changed behind the copy's back
    for _ in range(data.draw(st.integers(5, 30))):
        op = data.draw(st.sampled_from(["place"] * 6 + ["release", "release", "pin", "destroy", "mode", "copy",
                                                        "reuse"]))
        if op == "place":
            req = data.draw(requests)
            slot = same_choice(packer, inv, req)
            if slot is None:
                continue
            seq += 1
            style = data.draw(st.integers(0, 3))
            if style == 0:
                inv.allocate(slot, f"{req.model}-{seq}")
            elif style == 1:
                inv.allocate(slot, f"{req.model}/{seq}")
            elif style == 2:  # an owner named after another model, serving this one
                inv.allocate(slot, f"{data.draw(st.sampled_from(MODELS))}-{seq}", model=req.model)
            else:
                inv.allocate(slot, f"r{seq}", model=req.model)
            names.add(f"r{seq}")
        elif op == "release":
            allocs = list(inv.allocations())
            if allocs:
                owner, slot = data.draw(st.sampled_from(allocs))
                inv.release(slot, owner)
        elif op == "reuse":
            # A second slot for an owner: with an explicit model its first slot's model changes with it
            # (and changes back when the explicitly counted slot goes).
            allocs = list(inv.allocations())
            if not allocs:
                continue
            owner, _ = data.draw(st.sampled_from(allocs))
            req = data.draw(requests)
            slot = same_choice(packer, inv, req)
            if slot is None:
                continue
            model = data.draw(st.sampled_from([None, req.model, inv.model_of(owner)]))
            try:
                inv.allocate(slot, owner, model=model)
            except AllocationError:
                continue
            names.add(model_from_owner(owner))
            if data.draw(st.booleans()):
                inv.release(slot, owner)
        elif op == "pin":
            migs = [d for d in inv.devices.values() if d.mig_enabled]
            if migs:
                d = data.draw(st.sampled_from(migs))
                p = data.draw(st.sampled_from(d.gpu.profiles_by_size()))
                start = data.draw(st.sampled_from(p.placements))
                with contextlib.suppress(AllocationError):  # an illegal instance is refused and changes nothing
                    inv.create_mig_instance(d.node, d.index, p.key, start)
        elif op == "destroy":
            pinned = [(d, i) for d in inv.devices.values() for i in d.pinned if not d.occupants(i)]
            if pinned:
                d, (key, start) = data.draw(st.sampled_from(pinned))
                inv.destroy_mig_instance(d.node, d.index, key, start)
        elif op == "mode":
            idle = [d for d in inv.devices.values() if d.idle and d.gpu.mig_capable]
            if idle:
                d = data.draw(st.sampled_from(idle))
                inv.set_mig_mode(d.node, d.index, not d.mig_enabled)
        else:  # continue on a copy; the source keeps changing and must not leak into it
            older, inv = inv, inv.copy()
        if older is not None and data.draw(st.booleans()):
            allocs = list(older.allocations())
            if allocs:
                owner, slot = allocs[0]
                older.release(slot, owner)
            elif (slot := CostAwarePacker().place(older, data.draw(requests))) is not None:
                older.allocate(slot, "z-0")
            check_index(older, names)
        check_index(inv, names)
    same_choice(packer, inv, data.draw(requests))


@pytest.mark.parametrize("objective", ["cost", "gpus"])
def test_fast_place_matches_the_reference_on_a_filling_mixed_cluster(objective: str) -> None:
    """A mid-size heterogeneous cluster filled and churned by a realistic mix (the decision core's)."""
    rng = random.Random(7)
    inv = Inventory.from_nodes(nodes_from_spec("8xH100-80GB:mig,4xH100-80GB:mig,8xH100-80GB,8xA100-80GB:mig,"
                                               "4xA100-40GB:mig,8xL4,2xH200-141GB"))
    # Interleaved node kinds: several nodes per kind, so ties across nodes are broken by inventory order.
    inv = Inventory.from_nodes(
        [NodeSpec(f"{n.name}-{k}", n.gpu_model, 4, n.mig_enabled) for k in range(3) for n in inv.nodes.values()]
    )
    shapes = [
        SlotRequest("x", None, 1.0, gpus=1, kinds=("whole",)),
        SlotRequest("x", None, 1.0, gpus=2, kinds=("whole",)),
        SlotRequest("x", 40.0, 3 / 7),
        SlotRequest("x", 20.0, 2 / 7, kinds=("mig",)),
        SlotRequest("x", 20.0, 2 / 7),
        SlotRequest("x", 4.0, 0.1, kinds=("share",)),
        SlotRequest("x", 8.0, 0.125, kinds=("mig", "share")),
        SlotRequest("x", 100.0, 0.5),
    ]
    packer = CostAwarePacker(objective=objective)
    expected = [SlotRequest(f"m{i}", s.memory_gib, s.compute_fraction, s.gpus, s.kinds)
                for i, s in enumerate(shapes * 3)]
    for step in range(700):
        if step == 350:
            packer.expect(expected * 2)
        if rng.random() < 0.3 and (allocs := list(inv.allocations())):
            owner, slot = allocs[rng.randrange(len(allocs))]
            inv.release(slot, owner)
            continue
        i = rng.randrange(len(expected))
        req = expected[i]
        work = inv.copy() if rng.random() < 0.2 else inv  # placing on a copy, as the decision core does
        slot = same_choice(packer, work, req)
        if slot is not None:
            work.allocate(slot, f"{req.model}-{step}")
    check_index(inv, set())


def test_a_whole_gpu_beats_an_equal_share_on_the_same_node() -> None:
    """Equal keys: a whole slot and a full-size share on the node's GPU 0 (no reserve). The reference
    generates the node's whole slot first, so it wins the tie; the fast path must agree."""
    inv = Inventory.from_nodes([NodeSpec("n", "L4-24GB", 2)], share_reserve_gib=0.0)
    req = SlotRequest("m", 24.0, 1.0, kinds=("whole", "share"))
    slot = same_choice(CostAwarePacker(), inv, req)
    assert slot is not None and slot.kind == "whole" and slot.devices == (1,)


def test_whole_gpus_on_the_models_node_pass_the_device_spread() -> None:
    """The model's one replica sits on GPU 0; a whole slot on the same node takes other (idle) GPUs, so
    the off-device filter keeps it, and it beats the share (best fit)."""
    inv = Inventory.from_nodes([NodeSpec("n", "H100-80GB", 3)])
    gpu = CAT.get("H100-80GB")
    inv.allocate(Slot.share("n", 0, gpu, 10.0, 0.1), "m-1")
    slot = same_choice(CostAwarePacker(), inv, SlotRequest("m", 79.0, 1.0, kinds=("whole", "share")))
    assert slot is not None and slot.kind == "whole" and slot.devices == (2,)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), anti_affinity=st.booleans(), learned=st.booleans())
def test_the_host_tables_choice_is_the_references_on_a_large_host_accounted_cluster(
        seed: int, anti_affinity: bool, learned: bool) -> None:
    # From 32 nodes of a kind a whole slot's node, and a large device group's member, are read off the kind's host
    # table (arrays, kept per node as devices and host holdings change); they must choose what the reference's loop
    # chooses, through places, releases, pods without a GPU holding host resources, and copies.
    rng = random.Random(seed)
    nodes = [NodeSpec(f"n{i:02d}", rng.choice(("H100-80GB", "A100-80GB")), rng.choice((2, 4, 8)),
                      cpu_millis=rng.choice((16_000, 32_000, 64_000)), host_memory_gib=rng.choice((128.0, 256.0)))
             for i in range(rng.randint(40, 70))]
    inv = Inventory.from_nodes(nodes, CAT)
    packer = CostAwarePacker(anti_affinity=anti_affinity)
    if learned:  # with a target workload every group's members are ranked off the tables (fragmentation per node)
        packer.target_workload(workload_of(
            [SlotRequest("w", None, gpus=g, kinds=("whole",), cpu_millis=c, host_memory_gib=8.0)
             for g, c in ((1, 4_000), (2, 8_000), (8, 32_000))]
            + [SlotRequest("s", m, f, kinds=("share",), cpu_millis=1_000) for m, f in ((10.0, 0.25), (40.0, 0.5))]))
    held: list[tuple[str, str]] = []
    cpu_only: list[tuple[str, int, float]] = []
    for step in range(120):
        op = rng.random()
        if op < 0.15 and held:
            owner, _ = held.pop(rng.randrange(len(held)))
            for slot in inv.slots_of(owner):
                inv.release(slot, owner)
        elif op < 0.25:
            node = rng.choice(nodes).name
            cpu, mem = rng.choice((500, 2_000, 8_000)), rng.choice((1.0, 8.0, 32.0))
            if inv.host_fits(node, cpu, mem):
                inv.hold_host(node, cpu, mem)
                cpu_only.append((node, cpu, mem))
        elif op < 0.3 and cpu_only:
            inv.unhold_host(*cpu_only.pop(rng.randrange(len(cpu_only))))
        elif op < 0.33:
            inv = inv.copy()
        else:
            host = {"cpu_millis": rng.choice((1_000, 4_000, 12_000)), "host_memory_gib": rng.choice((4.0, 16.0, 64.0))}
            if rng.random() < 0.5:
                req = SlotRequest(rng.choice(MODELS), None, gpus=rng.choice((1, 1, 2, 4)), kinds=("whole",), **host)
            else:  # a time-slice share: the device groups' members (one per node of a group) off the table too
                req = SlotRequest(rng.choice(MODELS), rng.choice((10.0, 20.0, 40.0)), rng.choice((0.25, 0.5)),
                                  kinds=("share",), **host)
            slot = same_choice(packer, inv, req)
            if slot is not None:
                owner = f"{req.model}/r{step}"
                inv.allocate(slot, owner)
                held.append((owner, req.model))
