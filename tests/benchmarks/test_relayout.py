"""Re-layout: keep what fits, remove surplus, place new, bounded moves; never touch kept slots."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autoscaler.benchmarks.mig.relayout import ModelDemand, relayout
from sharing.catalog import load_catalog
from sharing.packer import CostAwarePacker
from sharing.slots import Inventory, NodeSpec, Slot, SlotRequest

CAT = load_catalog()
H100 = CAT.get("H100-80GB")


def _req(model: str, mem: float) -> SlotRequest:
    return SlotRequest(model, mem, 0.1, kinds=("mig",))


def _filled() -> Inventory:
    inv = Inventory.from_nodes([NodeSpec("h", "H100-80GB", 2, True)])
    inv.allocate(Slot.mig("h", 0, H100, "3g", 4), "a-1", model="a")
    inv.allocate(Slot.mig("h", 1, H100, "3g", 4), "a-2", model="a")
    inv.allocate(Slot.mig("h", 0, H100, "1g", 0), "b-1", model="b")
    inv.allocate(Slot.mig("h", 1, H100, "1g", 0), "b-2", model="b")
    inv.allocate(Slot.mig("h", 1, H100, "1g", 1), "b-3", model="b")
    return inv


def test_keep_remove_place() -> None:
    inv = _filled()
    before = inv.copy()
    res = relayout(inv, {"a": ModelDemand(2, _req("a", 35.0)), "b": (1, _req("b", 8.0)), "c": (1, _req("c", 15.0))})
    assert inv == before  # pure
    assert {o for o, _ in res.removed} == {"b-2", "b-3"} or len(res.removed) == 2
    assert res.moves == 0 and not res.unplaced
    assert {o for o, _ in res.placed} == {"c-1"}
    for o, s in res.kept:
        assert s in res.inventory.slots_of(o)
    assert res.mig_created and res.mig_destroyed  # c's instance made, b's instances gone


def test_resize_is_a_move_and_respects_budget() -> None:
    inv = _filled()
    res0 = relayout(inv, {"b": ModelDemand(3, _req("b", 15.0))}, max_moves=0)
    assert res0.moves == 0 and len(res0.stale) == 3
    res = relayout(inv, {"b": ModelDemand(3, _req("b", 15.0))}, max_moves=2)
    assert res.moves == 2 and len(res.stale) == 1
    assert all(m.target.memory_gib >= 15.0 for m in res.moved)


def test_moves_make_room_for_a_big_replica() -> None:
    inv = Inventory.from_nodes([NodeSpec("h", "H100-80GB", 2, True)])
    inv.allocate(Slot.mig("h", 0, H100, "1g", 0), "x-1", model="x")
    inv.allocate(Slot.mig("h", 1, H100, "1g", 0), "y-1", model="y")
    want = {"big": ModelDemand(1, SlotRequest("big", 75.0, 0.1, kinds=("mig",)))}
    assert relayout(inv, want, max_moves=0).unplaced == {"big": 1}
    res = relayout(inv, want, max_moves=1)
    assert res.moves == 1 and not res.unplaced
    placed = res.placed[0][1]
    assert placed.profile == "7g"
    assert all(d.instances() for d in res.inventory.devices.values())


def test_empty_pinned_instance_is_destroyed_without_moves() -> None:
    inv = Inventory.from_nodes([NodeSpec("h", "H100-80GB", 1, True)])
    inv.create_mig_instance("h", 0, "1g", 0)
    res = relayout(inv, {"big": ModelDemand(1, SlotRequest("big", 75.0, 0.1, kinds=("mig",)))}, max_moves=0)
    assert not res.unplaced and res.moves == 0
    assert any(c.profile == "1g" for c in res.mig_destroyed)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    first=st.dictionaries(
        st.sampled_from("abcd"), st.tuples(st.integers(0, 4), st.sampled_from([5.0, 9.0, 18.0, 35.0])), max_size=4
    ),
    second=st.dictionaries(
        st.sampled_from("abcde"),
        st.tuples(st.integers(0, 5), st.sampled_from([5.0, 9.0, 18.0, 35.0, 70.0])),
        max_size=5,
    ),
    max_moves=st.integers(0, 3),
)
def test_property_relayout(first: dict, second: dict, max_moves: int) -> None:
    nodes = [NodeSpec("n0", "H100-80GB", 2, True), NodeSpec("n1", "A100-40GB", 2, True)]
    start = relayout(
        Inventory.from_nodes(nodes), {m: ModelDemand(n, _req(m, mem)) for m, (n, mem) in first.items()}, max_moves=0
    ).inventory
    res = relayout(start, {m: ModelDemand(n, _req(m, mem)) for m, (n, mem) in second.items()}, max_moves=max_moves)
    assert res.moves <= max_moves
    after = dict(((o, s), None) for o, s in res.inventory.allocations())
    for o, s in res.kept:
        assert (o, s) in after  # a kept replica's slot is untouched
        d = res.inventory.device(s.node, s.devices[0])
        assert s.instance is None or s.instance in d.instances()
    for m, (n, _) in second.items():
        live = [o for o, _ in res.inventory.allocations() if res.inventory.model_of(o) == m]
        assert len(live) + res.unplaced.get(m, 0) == n
    for d in res.inventory.devices.values():
        mask = 0
        for key, st_ in d.instances():
            p = d.gpu.profiles[key]
            assert st_ in p.placements
            r = ((1 << p.mem_slices) - 1) << st_
            assert not mask & r
            mask |= r
    CostAwarePacker()  # the default packer is importable alongside
