"""Slots and Inventory: hard legality rules, accounting, copies."""

from __future__ import annotations

import time

import pytest

from sharing.catalog import load_catalog
from sharing.slots import AllocationError, Inventory, NodeSpec, Slot, SlotKind, SlotRequest

CAT = load_catalog()
H100 = CAT.get("H100-80GB")
A30 = CAT.get("A30")
T4 = CAT.get("T4")


def inv_of(*nodes: NodeSpec, reserve: float = 1.0, oversub: float = 1.0) -> Inventory:
    return Inventory.from_nodes(list(nodes), share_reserve_gib=reserve, max_compute_oversubscription=oversub)


def mig_node(name: str = "m", n: int = 2, kind: str = "H100-80GB") -> NodeSpec:
    return NodeSpec(name, kind, n, mig_enabled=True)


def test_describe_and_gpu_fraction():
    s = Slot.mig("node-3", 1, H100, "3g", 4)
    assert s.describe() == "node-3/gpu1 mig 3g.40gb@4"
    assert s.gpu_fraction == pytest.approx(3 / 7) and s.memory_gib == 40.0
    w = Slot.whole("node-3", (0, 1), H100)
    assert w.describe() == "node-3/gpu0,1 whole 2xH100-80GB"
    assert w.gpu_fraction == 2.0 and w.memory_gib == 160.0
    sh = Slot.share("t", 0, T4, 4.0, 0.25)
    assert sh.gpu_fraction == 0.25 and "share 4GiB" in sh.describe()
    inner = Slot.share("node-3", 1, H100, 4.0, 0.1, "3g", 4)
    assert "in 3g.40gb@4" in inner.describe() and inner.gpu_fraction == 0.1


def test_malformed_slots_fail_at_construction():
    with pytest.raises(ValueError):
        Slot("n", (), SlotKind.WHOLE, "H100-80GB", None, None, 80.0, 1.0)
    with pytest.raises(ValueError):
        Slot("n", (0, 1), SlotKind.MIG, "H100-80GB", "3g", 0, 40.0, 3 / 7)
    with pytest.raises(ValueError):
        Slot("n", (0,), SlotKind.MIG, "H100-80GB", None, None, 40.0, 3 / 7)
    with pytest.raises(ValueError):
        Slot("n", (0,), SlotKind.SHARE, "H100-80GB", "3g", None, 4.0, 0.1)
    with pytest.raises(ValueError):
        Slot("n", (0,), SlotKind.SHARE, "H100-80GB", None, None, 0.0, 0.1)
    with pytest.raises(ValueError):
        SlotRequest("m", 4.0, kinds=("spot",))
    with pytest.raises(ValueError):
        SlotRequest("m", -1.0)


def test_nodespec_canonicalised_and_mig_on_plain_gpu_rejected():
    inv = inv_of(NodeSpec("a", "NVIDIA-H100-80GB-HBM3", 1))
    assert inv.nodes["a"].gpu_model == "H100-80GB"
    with pytest.raises(ValueError, match="MIG"):
        inv_of(NodeSpec("t", "T4", 1, mig_enabled=True))
    with pytest.raises(ValueError, match="duplicate"):
        inv_of(NodeSpec("a", "T4", 1), NodeSpec("a", "T4", 1))


def test_time_slice_memory_is_hard():
    inv = inv_of(NodeSpec("t", "T4", 1), reserve=1.0)
    inv.allocate(Slot.share("t", 0, T4, 10.0, 0.5), "a")
    inv.allocate(Slot.share("t", 0, T4, 5.0, 0.5), "b")  # 10 + 5 + 1 reserve = 16: exactly full
    before = inv.copy()
    with pytest.raises(AllocationError, match="memory over-commit"):
        inv.allocate(Slot.share("t", 0, T4, 0.5, 0.0001), "c")
    assert inv == before  # a failed allocate changes nothing
    assert inv.device_free_memory_gib("t", 0) == 0.0


def test_compute_oversubscription_setting():
    strict = inv_of(NodeSpec("t", "T4", 1))
    strict.allocate(Slot.share("t", 0, T4, 2.0, 0.6), "a")
    with pytest.raises(AllocationError, match="compute"):
        strict.allocate(Slot.share("t", 0, T4, 2.0, 0.6), "b")
    loose = inv_of(NodeSpec("t", "T4", 1), oversub=1.5)
    loose.allocate(Slot.share("t", 0, T4, 2.0, 0.6), "a")
    loose.allocate(Slot.share("t", 0, T4, 2.0, 0.6), "b")


def test_whole_gpu_must_be_free():
    inv = inv_of(NodeSpec("t", "T4", 2), mig_node("m", 1))
    inv.allocate(Slot.share("t", 0, T4, 2.0, 0.1), "a")
    with pytest.raises(AllocationError, match="not free"):
        inv.allocate(Slot.whole("t", 0, T4), "w")
    with pytest.raises(AllocationError, match="not free"):
        inv.allocate(Slot.whole("t", (1, 0), T4), "w")
    inv.allocate(Slot.whole("t", 1, T4), "w")
    with pytest.raises(AllocationError, match="held whole"):
        inv.allocate(Slot.share("t", 1, T4, 1.0, 0.1), "x")
    # A MIG-mode GPU with no instance can be taken whole; one with an instance cannot.
    inv.allocate(Slot.mig("m", 0, H100, "1g", 0), "small")
    with pytest.raises(AllocationError, match="not free"):
        inv.allocate(Slot.whole("m", 0, H100), "w2")
    inv.release(Slot.mig("m", 0, H100, "1g", 0), "small")
    inv.allocate(Slot.whole("m", 0, H100), "w2")
    with pytest.raises(AllocationError, match="held whole"):
        inv.allocate(Slot.mig("m", 0, H100, "1g", 0), "small")


def test_mig_overlap_and_placement_rules():
    inv = inv_of(mig_node())
    inv.allocate(Slot.mig("m", 0, H100, "3g", 0), "a")
    for bad, match in [
        (Slot.mig("m", 0, H100, "4g", 0), "overlaps"),
        (Slot.mig("m", 0, H100, "2g", 2), "overlaps"),
        (Slot.mig("m", 0, H100, "3g", 0), "overlaps|already used"),
        (Slot.mig("m", 0, H100, "3g", 2), "not a legal placement"),
        (Slot.mig("m", 0, H100, "1g", 7), "not a legal placement"),
    ]:
        with pytest.raises(AllocationError, match=match):
            inv.allocate(bad, "b")
    inv.allocate(Slot.mig("m", 0, H100, "3g", 4), "b")
    assert inv.mig_layout("m", 0) == (("3g", 0), ("3g", 4))
    assert inv.device_free_memory_gib("m", 0) == 0.0


def test_mig_profile_must_exist_on_the_model_and_match_catalog_numbers():
    inv = inv_of(mig_node("a", 1, "A30"), mig_node("h", 1))
    with pytest.raises(AllocationError, match="no MIG profile"):
        inv.allocate(Slot("a", (0,), SlotKind.MIG, "A30-24GB", "3g", 0, 12.0, 0.5), "x")
    with pytest.raises(AllocationError, match="gives"):
        inv.allocate(Slot("h", (0,), SlotKind.MIG, "H100-80GB", "3g", 0, 45.0, 3 / 7), "x")
    with pytest.raises(AllocationError, match="compute"):
        inv.allocate(Slot("h", (0,), SlotKind.MIG, "H100-80GB", "3g", 0, 40.0, 0.5), "x")
    with pytest.raises(AllocationError, match="has H100-80GB GPUs"):
        inv.allocate(Slot.mig("h", 0, A30, "1g", 0), "x")
    inv.allocate(Slot.mig("a", 0, A30, "2g", 2), "x")
    assert inv.mig_layout("a", 0) == (("2g", 2),)


def test_mig_max_count():
    inv = inv_of(mig_node())
    inv.allocate(Slot.mig("m", 0, H100, "1g+me", 0), "a")
    with pytest.raises(AllocationError, match="at most 1"):
        inv.allocate(Slot.mig("m", 0, H100, "1g+me", 1), "b")


def test_mode_mismatch():
    inv = inv_of(NodeSpec("p", "H100-80GB", 1), mig_node("m", 1))
    with pytest.raises(AllocationError, match="not in MIG mode"):
        inv.allocate(Slot.mig("p", 0, H100, "1g", 0), "a")
    with pytest.raises(AllocationError, match="MIG mode"):
        inv.allocate(Slot.share("m", 0, H100, 4.0, 0.1), "a")
    with pytest.raises(AllocationError, match="unknown node"):
        inv.allocate(Slot.whole("zz", 0, H100), "a")
    with pytest.raises(AllocationError, match="no GPU 3"):
        inv.allocate(Slot.whole("p", 3, H100), "a")


def test_shares_inside_a_mig_instance():
    inv = inv_of(mig_node("m", 1), reserve=1.0)
    inv.allocate(Slot.share("m", 0, H100, 4.0, 0.05, "1g", 0), "a")
    inv.allocate(Slot.share("m", 0, H100, 5.0, 0.05, "1g", 0), "b")  # 4 + 5 + 1 = 10 GiB
    with pytest.raises(AllocationError, match="over-commit"):
        inv.allocate(Slot.share("m", 0, H100, 0.5, 0.01, "1g", 0), "c")
    with pytest.raises(AllocationError, match="already used"):
        inv.allocate(Slot.mig("m", 0, H100, "1g", 0), "c")
    # Compute inside an instance is capped at the instance's share of the GPU (1/7).
    with pytest.raises(AllocationError, match="compute"):
        inv.allocate(Slot.share("m", 0, H100, 1.0, 0.2, "1g", 1), "c")
    inv.allocate(Slot.mig("m", 0, H100, "2g", 2), "exclusive")
    with pytest.raises(AllocationError, match="exclusively"):
        inv.allocate(Slot.share("m", 0, H100, 1.0, 0.01, "2g", 2), "c")
    assert inv.mig_layout("m", 0) == (("1g", 0), ("2g", 2))


def test_release_restores_and_removes_on_demand_instances():
    inv = inv_of(mig_node(), NodeSpec("t", "T4", 1))
    before = inv.copy()
    slots = [
        (Slot.mig("m", 0, H100, "3g", 4), "a"),
        (Slot.share("m", 1, H100, 3.0, 0.1, "1g", 2), "b"),
        (Slot.share("t", 0, T4, 3.0, 0.1), "c"),
    ]
    for s, o in slots:
        inv.allocate(s, o)
    assert inv != before and inv.gpus_in_use() == 3
    for s, o in reversed(slots):
        inv.release(s, o)
    assert inv == before
    assert inv.mig_layout("m", 0) == ()
    with pytest.raises(KeyError):
        inv.release(slots[0][0], "a")


def test_duplicate_owner_slot_rejected():
    inv = inv_of(NodeSpec("t", "T4", 1))
    s = Slot.share("t", 0, T4, 1.0, 0.1)
    inv.allocate(s, "a")
    inv.allocate(s, "b")  # same shape, another owner: fine
    with pytest.raises(AllocationError, match="already allocated"):
        inv.allocate(s, "a")


def test_pinned_instances():
    inv = inv_of(mig_node("m", 1))
    inv.create_mig_instance("m", 0, "3g.40gb", 4)
    assert inv.mig_layout("m", 0) == (("3g", 4),)
    assert inv.gpus_in_use() == 0 and not inv.device("m", 0).idle
    with pytest.raises(AllocationError):
        inv.create_mig_instance("m", 0, "4g", 4)
    with pytest.raises(AllocationError, match="MIG instances"):
        inv.allocate(Slot.whole("m", 0, H100), "w")
    s = Slot.mig("m", 0, H100, "3g", 4)
    inv.allocate(s, "a")
    with pytest.raises(AllocationError, match="in use"):
        inv.destroy_mig_instance("m", 0, "3g", 4)
    inv.release(s, "a")
    assert inv.mig_layout("m", 0) == (("3g", 4),)  # pinned survives release
    inv.destroy_mig_instance("m", 0, "3g", 4)
    assert inv.device("m", 0).idle
    inv.set_mig_mode("m", 0, False)
    inv.allocate(Slot.share("m", 0, H100, 4.0, 0.1), "x")
    with pytest.raises(AllocationError, match="not idle"):
        inv.set_mig_mode("m", 0, True)


def test_accounting_views():
    inv = inv_of(mig_node("m", 1), NodeSpec("t", "T4", 2))
    assert inv.gpus_total == 3 and inv.gpus_in_use() == 0
    assert inv.free_memory_gib() == 80 + 16 + 16
    assert inv.fragmentation() == 0.0
    inv.allocate(Slot.mig("m", 0, H100, "3g", 4), "a")  # 40 GiB left on m/0
    inv.allocate(Slot.share("t", 0, T4, 5.0, 0.25), "b")  # 16 - 5 - 1 = 10 left on t/0
    assert inv.gpus_in_use() == 2
    assert inv.allocated_gpu_fraction() == pytest.approx((3 / 7 + 0.25) / 3)
    assert inv.free_memory_gib() == pytest.approx(40 + 10 + 16)
    # Default reference (a whole GPU): all free memory on partially used GPUs is stranded.
    assert inv.fragmentation() == pytest.approx(50 / 66)
    # A 12 GiB request still fits m/0 (a 3g@0 or 4g@0), not t/0 (10 GiB left).
    assert inv.largest_free_gib("m", 0) == 40.0 and inv.largest_free_gib("t", 0) == 10.0
    assert inv.fragmentation(12.0) == pytest.approx(10 / 66)
    assert sorted(o for o, _ in inv.allocations()) == ["a", "b"]
    assert inv.slots_of("a") == [Slot.mig("m", 0, H100, "3g", 4)]


def test_multi_gpu_whole_slot_reported_once():
    inv = inv_of(NodeSpec("n", "H100-80GB", 8))
    s = Slot.whole("n", (2, 3, 4, 5), H100)
    inv.allocate(s, "big")
    assert list(inv.allocations()) == [("big", s)]
    assert inv.gpus_in_use() == 4 and inv.allocated_gpu_fraction() == 0.5


def test_copy_is_independent_and_cheap():
    nodes = [NodeSpec(f"n{i}", "H100-80GB", 8, mig_enabled=i % 2 == 0) for i in range(250)]
    inv = Inventory.from_nodes(nodes)
    assert inv.gpus_total == 2000
    inv.allocate(Slot.whole("n1", 0, H100), "a")
    c = inv.copy()
    c.allocate(Slot.mig("n0", 0, H100, "1g", 0), "b")
    c.release(Slot.whole("n1", 0, H100), "a")
    assert inv.gpus_in_use() == 1 and inv.mig_layout("n0", 0) == ()
    assert c.mig_layout("n0", 0) == (("1g", 0),)
    t0 = time.perf_counter()
    for _ in range(100):
        inv.copy()
    per_copy = (time.perf_counter() - t0) / 100
    assert per_copy < 0.005  # measured ~0.01 ms; generous for slow CI machines
