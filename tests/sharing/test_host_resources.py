"""Host CPU and memory beside the GPUs (issue 19 item 1): the Inventory accounts them per node as hard capacity, and
the cost-aware packer breaks ties by the GPU capacity a placement strands for want of them, with the fast path
still choosing exactly what its reference chooses."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sharing.catalog import load_catalog
from sharing.cluster import ClusterSpecError, nodes_from_spec
from sharing.host_resources import HostPerGpu, learn_per_gpu, stranded, stranding_delta
from sharing.packer import CostAwarePacker, FirstFitPacker, _reference_place
from sharing.slots import AllocationError, Inventory, NodeSpec, Slot, SlotRequest

CAT = load_catalog()
KINDS = ("H100-80GB", "A100-40GB", "L4-24GB")
SLOW = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])

requests = st.builds(
    SlotRequest,
    model=st.sampled_from(("a", "b", "c")),
    memory_gib=st.one_of(st.none(), st.sampled_from([4.0, 10.0, 20.0, 40.0, 80.0])),
    compute_fraction=st.sampled_from([0.125, 0.25, 3 / 7, 0.5, 1.0]),
    gpus=st.sampled_from([1, 1, 1, 2]),
    kinds=st.sampled_from([("whole", "mig", "share"), ("share",), ("mig",), ("whole",)]),
    cpu_millis=st.sampled_from([0, 0, 500, 2000, 8000, 30000]),
    host_memory_gib=st.sampled_from([0.0, 0.0, 1.5, 16.0, 100.0]),
)


@st.composite
def inventories(draw) -> Inventory:
    nodes = []
    for i in range(draw(st.integers(1, 5))):
        kind = draw(st.sampled_from(KINDS))
        mig = CAT.get(kind).mig_capable and draw(st.booleans())
        cpu = draw(st.sampled_from([None, 4000, 16000, 64000]))
        mem = draw(st.sampled_from([None, 32.0, 256.0]))
        nodes.append(NodeSpec(f"n{i}", kind, draw(st.integers(1, 4)), mig, cpu_millis=cpu, host_memory_gib=mem))
    return Inventory.from_nodes(nodes, share_reserve_gib=draw(st.sampled_from([0.0, 1.0])))


def recount(inv: Inventory) -> dict[str, tuple[int, float]]:
    out: dict[str, tuple[int, float]] = {n: inv.host_held(n) for n in inv.nodes}
    for _, s in inv.allocations():
        c, m = out.get(s.node, (0, 0.0))
        out[s.node] = (c + s.cpu_millis, m + s.host_memory_gib)
    return out


def check_host(inv: Inventory) -> None:
    """Per node: what the Inventory says is held is a recount of its slots, and never beyond the node's capacity."""
    counted = recount(inv)
    for name, spec in inv.nodes.items():
        c, m = inv.host_used(name)
        rc, rm = counted.get(name, (0, 0.0))
        assert c == rc and math.isclose(m, rm, abs_tol=1e-6), name
        if spec.cpu_millis is not None:
            assert c <= spec.cpu_millis
        if spec.host_memory_gib is not None:
            assert m <= spec.host_memory_gib + 1e-9


@st.composite
def packers(draw) -> CostAwarePacker:
    p = CostAwarePacker(anti_affinity=draw(st.booleans()), objective=draw(st.sampled_from(["cost", "gpus"])),
                        prefer_open_nodes=draw(st.booleans()), node_anti_affinity=draw(st.booleans()),
                        host_aware=draw(st.booleans()))
    if draw(st.integers(0, 2)) == 0:
        p.expect(draw(st.lists(requests, max_size=8)))
    return p


@SLOW
@given(inv=inventories(), packer=packers(), data=st.data())
def test_never_over_commits_host_and_release_restores(inv: Inventory, packer: CostAwarePacker, data) -> None:
    """And the fast path chooses what the reference chooses, with host resources in play."""
    for seq in range(data.draw(st.integers(3, 25))):
        op = data.draw(st.integers(0, 5))
        if op == 4:  # a pod without a GPU slot takes host CPU/memory (refused past capacity, changing nothing)
            node = data.draw(st.sampled_from(sorted(inv.nodes)))
            cpu, mem = data.draw(st.sampled_from([(1000, 0.0), (8000, 8.0), (0, 64.0)]))
            before = inv.copy()
            try:
                inv.hold_host(node, cpu, mem)
            except AllocationError:
                assert inv == before
        elif op == 5 and any(inv.host_held(n) != (0, 0.0) for n in inv.nodes):
            node = next(n for n in sorted(inv.nodes) if inv.host_held(n) != (0, 0.0))
            inv.unhold_host(node, *inv.host_held(node))
            assert inv.host_held(node) == (0, 0.0)
        elif op == 0 and (allocs := list(inv.allocations())):
            owner, slot = data.draw(st.sampled_from(allocs))
            before_used = {n: inv.host_used(n) for n in inv.nodes}
            inv.release(slot, owner)
            after = inv.copy()
            inv.allocate(slot, owner)  # allocating it back is legal: release gave exactly its resources back
            assert {n: inv.host_used(n) for n in inv.nodes} == before_used
            inv = after
        else:
            req = data.draw(requests)
            fast = packer.place(inv, req)
            assert fast == _reference_place(packer, inv, req), req
            if fast is None:
                continue
            assert (fast.cpu_millis, fast.host_memory_gib) == (req.cpu_millis, req.host_memory_gib)
            assert inv.fits(fast)
            inv.allocate(fast, f"{req.model}-{seq}")
        check_host(inv)
        copy = inv.copy()
        assert copy == inv and {n: copy.host_used(n) for n in inv.nodes} == {n: inv.host_used(n) for n in inv.nodes}


@SLOW
@given(inv=inventories(), req=requests)
def test_any_slot_the_inventory_accepts_fits_its_node_host(inv: Inventory, req: SlotRequest) -> None:
    """FirstFit too: partial candidates and whole slots carry the request's host asks and are refused without room."""
    for packer in (FirstFitPacker(), CostAwarePacker()):
        while (slot := packer.place(inv, req)) is not None:
            inv.allocate(slot, f"{req.model}-{len(list(inv.allocations()))}")
            check_host(inv)


def test_fits_refuses_a_slot_whose_node_lacks_cpu_or_memory() -> None:
    gpu = CAT.get("L4-24GB")
    inv = Inventory.from_nodes([NodeSpec("n", "L4-24GB", 2, cpu_millis=4000, host_memory_gib=16.0)])
    inv.allocate(Slot.whole("n", 0, gpu).with_host(3000, 8.0), "a-1")
    assert inv.host_free("n") == (1000, 8.0)
    big_cpu = Slot.whole("n", 1, gpu).with_host(1500, 1.0)
    assert "CPU over-commit on node 'n'" in (inv.why_not(big_cpu) or "")
    with pytest.raises(AllocationError):
        inv.allocate(big_cpu, "b-1")
    assert "host memory" in (inv.why_not(Slot.whole("n", 1, gpu).with_host(100, 9.0)) or "")
    assert inv.fits(Slot.whole("n", 1, gpu).with_host(1000, 8.0))
    assert CostAwarePacker().place(inv, SlotRequest("b", None, cpu_millis=1500)) is None
    # a node that declares nothing is never refused for host resources
    free = Inventory.from_nodes([NodeSpec("n", "L4-24GB", 1)])
    assert free.fits(Slot.whole("n", 0, gpu).with_host(10**9, 1e9)) and not free.host_accounted


def test_without_declared_capacity_the_choice_is_the_one_without_host_requests() -> None:
    """Nodes without host capacity: a request with host asks lands exactly where the same request without them
    does (the slot only carries the asks)."""
    inv = Inventory.from_nodes([NodeSpec(f"n{i}", k, 4, k != "L4-24GB") for i, k in enumerate(KINDS * 2)])
    packer = CostAwarePacker()
    for i, (mem, frac) in enumerate([(10.0, 0.125), (40.0, 3 / 7), (None, 1.0), (20.0, 0.25)] * 5):
        plain = SlotRequest("m", mem, frac)
        hosted = SlotRequest("m", mem, frac, cpu_millis=4000, host_memory_gib=32.0)
        a, b = packer.place(inv, plain), packer.place(inv, hosted)
        assert a is not None and b == a.with_host(4000, 32.0)
        inv.allocate(b, f"m-{i}")
    assert inv.host_totals()[0] == 20 * 4000


def test_the_tie_break_avoids_stranding_gpus_on_a_cpu_short_node() -> None:
    """Two equal GPU nodes, one with little CPU: a CPU-light pod goes to the CPU-short node, where its GPU was
    stranded anyway, and keeps the CPU-rich node's GPUs usable (FGD's idea); without the tie-break, inventory order
    picks the first node."""
    gpu = CAT.get("L4-24GB")
    nodes = [NodeSpec("rich", "L4-24GB", 4, cpu_millis=64000), NodeSpec("short", "L4-24GB", 4, cpu_millis=8000),
             NodeSpec("held", "L4-24GB", 4, cpu_millis=64000)]
    inv = Inventory.from_nodes(nodes)
    for i in range(4):  # the workload seen: 16 CPUs per GPU
        inv.allocate(Slot.whole("held", i, gpu).with_host(16000, 0.0), f"w-{i}")
    req = SlotRequest("light", None, cpu_millis=1000)
    assert CostAwarePacker().place(inv, req).node == "short"  # type: ignore[union-attr]
    assert CostAwarePacker(host_aware=False).place(inv, req).node == "rich"  # type: ignore[union-attr]
    # a CPU-heavy pod goes where the CPU is (it does not fit "short" at all)
    heavy = SlotRequest("heavy", None, cpu_millis=16000)
    assert CostAwarePacker().place(inv, heavy).node == "rich"  # type: ignore[union-attr]
    assert _reference_place(CostAwarePacker(), inv, req).node == "short"  # type: ignore[union-attr]


def test_stranded_and_learned_ratio() -> None:
    per = HostPerGpu(cpu_millis=8000.0, memory_gib=0.0)
    assert stranded(4.0, 16000.0, math.inf, per) == 2.0  # CPU feeds two of four free GPUs
    assert stranded(1.0, 16000.0, math.inf, per) == 0.0
    inv = Inventory.from_nodes([NodeSpec("n", "L4-24GB", 2, cpu_millis=16000)])
    assert learn_per_gpu(inv) is None  # nothing seen asks for host resources
    got = learn_per_gpu(inv, SlotRequest("m", None, cpu_millis=4000), [(SlotRequest("x", 12.0, 0.5,
                                                                                  cpu_millis=1000), 2)])
    assert got == HostPerGpu(6000 / 2.0, 0.0)
    assert stranding_delta(inv, "n", 1.0, 4000, 0.0, None) == 0.0
    # taking one GPU and 4 CPUs at 8 CPUs/GPU: before 2 free GPUs fed by 16 CPUs (0 stranded), after 1 GPU, 12 CPUs
    assert stranding_delta(inv, "n", 1.0, 4000, 0.0, per) == 0.0
    assert stranding_delta(inv, "n", 1.0, 12000, 0.0, per) == 0.5


def test_bad_host_values_are_refused() -> None:
    with pytest.raises(ValueError, match="cpu_millis"):
        SlotRequest("m", None, cpu_millis=-1)
    with pytest.raises(ValueError, match="host_memory_gib"):
        NodeSpec("n", "L4-24GB", 1, host_memory_gib=float("nan"))


def test_cluster_specs_may_declare_host_capacity() -> None:
    (a, b) = nodes_from_spec("16xH100:cpu=96:mem=1024")
    assert (a.cpu_millis, a.host_memory_gib) == (96000, 1024.0) == (b.cpu_millis, b.host_memory_gib)
    (c,) = nodes_from_spec([{"kind": "L4", "gpus": 4, "cpu": 7.5, "memory_gib": "64"}])
    assert (c.cpu_millis, c.host_memory_gib) == (7500, 64.0)
    (d,) = nodes_from_spec("2xL4")
    assert (d.cpu_millis, d.host_memory_gib) == (None, None) and not d.host_accounted
    for bad in ("2xL4:cpu=abc", "2xL4:mem=-1"):
        with pytest.raises(ClusterSpecError, match="must be a number"):
            nodes_from_spec(bad)
    with pytest.raises(ClusterSpecError, match="cpu"):
        nodes_from_spec([{"kind": "L4", "cpu": True}])


def test_the_asks_announced_change_the_learned_ratio_only() -> None:
    """host_workload: the tick's asks weigh in the CPU per GPU (a CPU-heavy demand makes the CPU-short node's GPUs
    count as stranded), and reserve nothing."""
    nodes = [NodeSpec("rich", "L4-24GB", 2, cpu_millis=64000), NodeSpec("short", "L4-24GB", 2, cpu_millis=4000)]
    inv = Inventory.from_nodes(nodes)
    light = SlotRequest("light", None, cpu_millis=500)
    plain = CostAwarePacker()
    assert plain.place(inv, light).node == "rich"  # type: ignore[union-attr]  # ratio 500m/GPU: nothing stranded
    told = CostAwarePacker()
    told.host_workload([SlotRequest("heavy", None, cpu_millis=16000)] * 3 + [light])
    assert told.place(inv, light).node == "short"  # type: ignore[union-attr]
    assert told.place(inv, light) == _reference_place(told, inv, light)
    told.host_workload(None)
    assert told.place(inv, light).node == "rich"  # type: ignore[union-attr]
