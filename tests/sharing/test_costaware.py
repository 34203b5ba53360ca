"""CostAwarePacker: cheapest slot across kinds, tie-breaks, MIG start choice, anti-affinity, memory."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autoscaler.benchmarks.mig.bounds import lower_bound, mig_layouts
from sharing.catalog import load_catalog
from sharing.packer import (
    CostAwarePacker,
    _spread_broken,
    consolidate,
    decreasing_order,
    future_slots,
    place_batch,
    slot_cost,
)
from sharing.slots import AllocationError, Inventory, NodeSpec, Slot, SlotKind, SlotRequest

CAT = load_catalog()
CA = CostAwarePacker()


def _req(model: str, mem: float, kinds: tuple[str, ...] = ("mig",)) -> SlotRequest:
    return SlotRequest(model, mem, 0.1, kinds=kinds)


def test_cheapest_kind_wins() -> None:
    inv = Inventory.from_nodes([NodeSpec("h", "H100-80GB", 1, True), NodeSpec("a", "A100-40GB", 1, True)])
    slot = CA.place(inv, _req("m", 20.0))
    # A100-40GB 3g.20gb = 0.5 x $1.50 = $0.75/h beats H100 1g.20gb = 0.25 x $3.50 = $0.875/h.
    assert slot is not None and slot.gpu_model == "A100-40GB" and slot.profile == "3g"
    assert slot_cost(slot, CAT.get("A100-40GB")) == pytest.approx(0.75)
    # With the A100 made expensive the H100 slice wins.
    cat = CAT.with_prices({"A100-40GB": 3.0})
    inv2 = Inventory.from_nodes([NodeSpec("h", "H100-80GB", 1, True), NodeSpec("a", "A100-40GB", 1, True)], cat)
    slot2 = CA.place(inv2, _req("m", 20.0))
    assert slot2 is not None and slot2.gpu_model == "H100-80GB" and slot2.profile == "1g.2mem"


def test_3g_prefers_start_4() -> None:
    gpu = CAT.get("H100-80GB")
    assert future_slots(gpu, 0b11110000, 3, (("3g", 1),)) == 10  # 3g@4: four 1g left (slices 0-3)
    assert future_slots(gpu, 0b00001111, 3, (("3g", 1),)) == 7  # 3g@0: three (slice 7 unusable by 1g)
    inv = Inventory.from_nodes([NodeSpec("h", "H100-80GB", 1, True)])
    slot = CA.place(inv, _req("m", 35.0))
    assert slot is not None and (slot.profile, slot.start) == ("3g", 4)


def test_prefers_used_device_over_opening_one() -> None:
    inv = Inventory.from_nodes([NodeSpec("h", "H100-80GB", 4, True)])
    inv.allocate(Slot.mig("h", 2, CAT.get("H100-80GB"), "3g", 4), "x-1")
    slot = CA.place(inv, _req("y", 35.0))
    assert slot is not None and slot.devices == (2,) and slot.start == 0


def test_anti_affinity_spreads_devices_then_nodes() -> None:
    inv = Inventory.from_nodes([NodeSpec("h", "H100-80GB", 2, True)])
    a = CA.place(inv, _req("m", 8.0))
    assert a is not None
    inv.allocate(a, "m-1")
    b = CA.place(inv, _req("m", 8.0))
    assert b is not None and b.devices != a.devices  # first-fit would stack them on one GPU
    inv2 = Inventory.from_nodes([NodeSpec("n0", "H100-80GB", 2, True), NodeSpec("n1", "H100-80GB", 2, True)])
    inv2.allocate(Slot.mig("n0", 0, CAT.get("H100-80GB"), "1g", 0), "m-1", model="m")
    c = CA.place(inv2, _req("m", 8.0))
    assert c is not None and c.node == "n1"


def test_anti_affinity_falls_back_when_infeasible() -> None:
    inv = Inventory.from_nodes([NodeSpec("h", "H100-80GB", 1, True)])
    inv.allocate(Slot.mig("h", 0, CAT.get("H100-80GB"), "1g", 0), "m-1")
    slot = CA.place(inv, _req("m", 8.0))
    assert slot is not None and slot.devices == (0,)


def test_model_of_explicit_and_from_name() -> None:
    inv = Inventory.from_nodes([NodeSpec("h", "H100-80GB", 1, True)])
    g = CAT.get("H100-80GB")
    inv.allocate(Slot.mig("h", 0, g, "1g", 0), "llama-7b-3")
    inv.allocate(Slot.mig("h", 0, g, "1g", 1), "weird", model="enc")
    assert inv.model_of("llama-7b-3") == "llama-7b" and inv.model_of("weird") == "enc"
    assert inv.copy().model_of("weird") == "enc"
    with pytest.raises(AllocationError):
        inv.allocate(Slot.mig("h", 0, g, "1g", 2), "weird", model="other")
    inv.release(Slot.mig("h", 0, g, "1g", 1), "weird")
    assert inv.model_of("weird") == "weird"  # forgotten with its last slot


def test_whole_and_share_requests() -> None:
    inv = Inventory.from_nodes([NodeSpec("t", "T4-16GB", 2), NodeSpec("l", "L4-24GB", 2)])
    s = CA.place(inv, SlotRequest("m", 6.0, 0.2, kinds=("share",)))
    assert s is not None and s.kind is SlotKind.SHARE and s.gpu_model == "T4-16GB"
    w = CA.place(inv, SlotRequest("w", None, gpus=2))
    assert w is not None and w.kind is SlotKind.WHOLE and len(w.devices) == 2
    assert CA.place(inv, SlotRequest("big", 30.0, 0.2, kinds=("share",))) is None


def test_bounds_small_exact() -> None:
    assert len(mig_layouts(CAT.get("A30-24GB"))) >= 3
    nodes = [NodeSpec("h", "H100-80GB", 8, True)]
    reqs = [_req("a", 15.0)] * 10 + [_req("b", 35.0)] * 5
    b = lower_bound(nodes, reqs)
    assert b.optimal and b.gpu_bound == 5
    lp = lower_bound(nodes, reqs, exact=False)
    assert lp.lower_bound <= b.value + 1e-9
    with pytest.raises(ValueError):
        lower_bound(nodes, [SlotRequest("s", 4.0, 0.1, kinds=("share",))])


MIG_KINDS = ("H100-80GB", "A100-40GB", "H200-141GB", "A30-24GB")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    kinds=st.lists(st.sampled_from(MIG_KINDS), min_size=1, max_size=3),
    reqs=st.lists(
        st.tuples(st.sampled_from(["a", "b", "c", "d"]), st.sampled_from([2.0, 5.0, 9.0, 18.0, 35.0, 70.0])),
        max_size=25,
    ),
)
def test_property_cost_aware_is_legal_and_spreads(kinds: list[str], reqs: list[tuple[str, float]]) -> None:
    nodes = [NodeSpec(f"n{i}", k, 2, True) for i, k in enumerate(kinds)]
    inv = Inventory.from_nodes(nodes)
    for i, (model, mem) in enumerate(reqs):
        req = _req(model, mem)
        slot = CA.place(inv, req)
        if slot is None:
            continue
        assert inv.fits(slot)
        used = {(s.node, s.devices[0]) for o, s in inv.allocations() if inv.model_of(o) == model}
        used_nodes = {n for n, _ in used}
        # Anti-affinity held when feasible: if some legal slot would spread, the chosen one does.
        others = [c for _, c in CA.candidates(inv, req)]
        if len(used) == 1 and any((c.node, c.devices[0]) not in used for c in others):
            assert (slot.node, slot.devices[0]) not in used
        if len(used_nodes) == 1 and len(nodes) > 1 and any(c.node not in used_nodes for c in others):
            assert slot.node not in used_nodes
        inv.allocate(slot, f"{model}-{i}")
    for d in inv.devices.values():
        gpu = d.gpu
        mask = 0
        for key, start in d.instances():
            p = gpu.profiles[key]
            assert start in p.placements  # only catalog-legal profiles and placements
            r = ((1 << p.mem_slices) - 1) << start
            assert not mask & r  # no overlapping MIG ranges
            mask |= r
        for _, s in d.entries:
            assert s.memory_gib <= gpu.profiles[s.profile].memory_gib + 1e-9  # type: ignore[index]
        assert sum(gpu.profiles[k].memory_gib for k, _ in d.instances()) <= gpu.memory_gib + 1e-6


# -- objective knob, reservation, first-fit-decreasing, consolidation, anti-affinity bound --------
GP = CostAwarePacker(objective="gpus")


def test_objective_gpus_prefers_open_device_and_densest_kind() -> None:
    with pytest.raises(ValueError):
        CostAwarePacker(objective="speed")
    assert CA.objective == "cost"  # the default ranking is unchanged
    # A used H100 beside an idle A100: cost opens the A100 (3g.20gb, $0.75/h); gpus stays put.
    inv = Inventory.from_nodes([NodeSpec("h", "H100-80GB", 1, True), NodeSpec("a", "A100-40GB", 1, True)])
    inv.allocate(Slot.mig("h", 0, CAT.get("H100-80GB"), "1g", 0), "x-1")
    c, g = CA.place(inv, _req("m", 20.0)), GP.place(inv, _req("m", 20.0))
    assert c is not None and c.gpu_model == "A100-40GB"
    assert g is not None and g.gpu_model == "H100-80GB"
    # Opening a device: the kind where the replica takes the smallest share of a GPU (H200 1g.18gb).
    inv2 = Inventory.from_nodes([NodeSpec("h", "H100-80GB", 1, True), NodeSpec("x", "H200-141GB", 1, True)])
    s = GP.place(inv2, _req("m", 15.0))
    assert s is not None and s.gpu_model == "H200-141GB" and s.profile == "1g"


def test_expect_reserves_scarce_big_gpu() -> None:
    nodes = [NodeSpec("h", "H100-80GB", 1, True), NodeSpec("x", "H200-141GB", 1, True)]
    small, big = _req("small", 15.0), _req("big", 98.0)  # only an H200 7g holds 98 GiB
    p = CostAwarePacker(objective="gpus")
    p.expect([small, big])
    inv = Inventory.from_nodes(nodes)
    s = p.place(inv, small)
    assert s is not None and s.gpu_model == "H100-80GB"  # without expect it takes the H200 (above)
    inv.allocate(s, "small-1")
    b = p.place(inv, big)
    assert b is not None and b.gpu_model == "H200-141GB"
    # Once the big replica is placed nothing is reserved any more.
    inv.allocate(b, "big-1")
    p.expect(None)
    assert p._expected is None


def test_place_batch_decreasing_keeps_result_order() -> None:
    nodes = [NodeSpec("h", "H100-80GB", 1, True), NodeSpec("x", "H200-141GB", 1, True)]
    reqs = [_req("small", 15.0), _req("big", 98.0)]
    inv = Inventory.from_nodes(nodes)
    plain = place_batch(GP, inv, reqs)
    assert plain[1] is None  # the small one took the H200 first
    inv = Inventory.from_nodes(nodes)
    out = place_batch(GP, inv, reqs, decreasing=True)
    assert out[0] is not None and out[1] is not None and out[1].gpu_model == "H200-141GB"
    assert decreasing_order(reqs) == [1, 0]


def test_consolidate_empties_a_device_without_breaking_spread() -> None:
    g = CAT.get("H100-80GB")
    inv = Inventory.from_nodes([NodeSpec("h", "H100-80GB", 3, True)])
    inv.allocate(Slot.mig("h", 0, g, "3g", 4), "a-1", model="a")
    inv.allocate(Slot.mig("h", 1, g, "3g", 4), "a-2", model="a")
    inv.allocate(Slot.mig("h", 2, g, "1g", 0), "b-1", model="b")
    reqs = {"a-1": _req("a", 35.0), "a-2": _req("a", 35.0), "b-1": _req("b", 8.0)}
    before = inv.copy()
    out, moves = consolidate(inv, CostAwarePacker(objective="gpus"), reqs)
    assert inv == before  # the input is not changed
    assert moves == 1 and sum(1 for d in out.devices.values() if d.entries) == 2
    devs = {s.devices[0] for o, s in out.allocations() if out.model_of(o) == "a"}
    assert len(devs) == 2  # a's two replicas stay on two devices


def test_anti_affinity_bound() -> None:
    one = [NodeSpec("h", "H100-80GB", 1, True)]
    two = [NodeSpec("h", "H100-80GB", 2, True)]
    reqs = [_req("m", 8.0)] * 2
    assert lower_bound(one, reqs).gpu_bound == 1
    assert lower_bound(one, reqs, anti_affinity=True).lower_bound == float("inf")  # no spread exists
    assert lower_bound(two, reqs, anti_affinity=True).gpu_bound == 2
    # Several nodes: spread over nodes, not only devices.
    nodes = [NodeSpec("n0", "H100-80GB", 2, True), NodeSpec("n1", "H100-80GB", 2, True)]
    b = lower_bound(nodes, [_req("m", 35.0)] * 3, anti_affinity=True)
    assert b.optimal and b.gpu_bound == 2
    # A model that fits on one node only spreads over that node's devices.
    mixed = [NodeSpec("a", "A100-40GB", 2, True), NodeSpec("x", "H200-141GB", 2, True)]
    assert lower_bound(mixed, [_req("big", 70.0)] * 2, anti_affinity=True).gpu_bound == 2


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    reqs=st.lists(
        st.tuples(st.sampled_from(["a", "b", "c"]), st.sampled_from([5.0, 9.0, 18.0, 35.0])), min_size=1, max_size=12
    ),
    nodes=st.integers(1, 2),
)
def test_property_anti_affinity_bound_is_tighter_and_reached(reqs: list[tuple[str, float]], nodes: int) -> None:
    cluster = [NodeSpec(f"n{i}", "H100-80GB", 2, True) for i in range(nodes)]
    rs = [_req(m, mem) for m, mem in reqs]
    plain, aa = lower_bound(cluster, rs), lower_bound(cluster, rs, anti_affinity=True)
    assert aa.lower_bound >= plain.lower_bound - 1e-9
    # Any packing that keeps the spread uses at least the anti-affinity bound.
    inv = Inventory.from_nodes(cluster)
    for i, r in enumerate(rs):
        s = CA.place(inv, r)
        if s is None:
            return
        inv.allocate(s, f"{r.model}-{i}")
    if not any(_spread_broken(inv, m) for m in {r.model for r in rs}):
        assert sum(1 for d in inv.devices.values() if d.entries) >= aa.gpu_bound
