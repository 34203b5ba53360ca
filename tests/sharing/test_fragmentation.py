"""The learned target workload and its CPU/memory-aware fragmentation (sharing/fragmentation.py): the measure's
invariants, the array path against the one-node reference, and the histogram's learning."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from sharing.catalog import Catalog, GpuModel
from sharing.fragmentation import (
    MILLI,
    KindFragmentation,
    KindShapes,
    TargetShape,
    TargetWorkload,
    WorkloadShapes,
    fragmentation_delta,
    shape_key,
)
from sharing.slots import Inventory, NodeSpec, Slot, SlotRequest, free_milli

GPU = GpuModel("g", 1000.0, 0, 0, price_per_hour=1.0)  # 1 GiB per milli, as the FGD replay maps GPUs
OTHER = GpuModel("o", 1000.0, 0, 0, price_per_hour=1.0)
CAT = Catalog([GPU, OTHER])


def shape(gpus: int, milli: int | None, cpu: int, mem: float = 0.0, weight: int = 1, models: tuple = ()):
    return TargetShape(gpus, None if milli is None else float(milli), 1.0 if milli is None else milli / MILLI, cpu,
                       mem, models, weight)


WORK = WorkloadShapes((shape(1, 500, 4000, 8.0, 5), shape(1, 250, 2000, 4.0, 3), shape(2, None, 16000, 64.0, 2),
                       shape(1, None, 8000, 32.0, 4), shape(0, None, 2000, 1.0, 2),
                       shape(1, 700, 1000, 1.0, 1, ("o",))))


def kind(count_memory: bool = False, work: WorkloadShapes = WORK) -> KindShapes:
    return KindShapes(work, GPU, CAT, 1.0, count_memory)


frees = st.lists(st.integers(0, MILLI), min_size=1, max_size=8)


@settings(max_examples=200, deadline=None)
@given(frees, st.integers(0, 64_000), st.floats(0, 512))
def test_resource_aware_measure_is_never_below_the_gpu_only_one(f, cpu, mem) -> None:
    # A shape that stops fitting for CPU or memory moves from "the gaps below its request" to "every free milli".
    for count in (False, True):
        k = kind(count)
        assert k.node_f(f, cpu, mem) >= k.node_f(f, float("inf"), float("inf"))


@given(frees)
def test_with_cpu_and_memory_plentiful_it_is_fgds_gpu_only_measure(f) -> None:
    k = kind(True)
    total = sum(f)
    fgd = k.other * total  # CPU-only shapes and shapes of another kind: every free milli
    for t, num, w in zip(k.t, k.num, k.w, strict=True):
        fits = sum(1 for v in f if v >= t) >= num
        fgd += w * (sum(v for v in f if v < t) if fits else total)
    assert k.node_f(f, 1e9, 1e9) == fgd


def test_a_node_without_cpu_counts_all_its_free_gpus_as_fragmented() -> None:
    k = kind()
    assert k.node_f([1000, 1000], 500, 1e9) == sum(k.w) * 2000 + k.other * 2000
    assert k.node_f([1000, 1000], 64_000, 1e9) == k.other * 2000  # every GPU shape fits: no gap below any


def test_memory_counts_only_when_asked() -> None:
    assert kind(False).node_f([1000, 1000], 64_000, 0.5) == kind(False).node_f([1000, 1000], 64_000, 1e9)
    assert kind(True).node_f([1000, 1000], 64_000, 0.5) > kind(True).node_f([1000, 1000], 64_000, 1e9)


def test_shapes_of_another_kind_count_every_free_milli() -> None:
    k = kind()
    assert 700 not in k.t and k.other == 2 + 1  # the CPU-only shape and the shape that accepts only kind "o"
    assert KindShapes(WORK, OTHER, CAT, 1.0).t.count(700) == 1


def test_a_share_demand_is_the_larger_of_memory_and_compute() -> None:
    s = TargetShape(1, 100.0, 0.5, 0, 0.0, (), 1)
    assert s.demand_milli(GPU) == 500 and TargetShape(1, 600.0, 0.25, 0, 0.0, (), 1).demand_milli(GPU) == 600
    assert TargetShape(2, None, 1.0, 0, 0.0, (), 1).demand_milli(GPU) == MILLI


def _inventory(rng: random.Random, n: int) -> Inventory:
    nodes = [NodeSpec(f"n{i:02d}", "g", rng.choice((1, 2, 4, 8)), cpu_millis=rng.choice((8_000, 32_000, 96_000)),
                      host_memory_gib=rng.choice((64.0, 256.0))) for i in range(n)]
    inv = Inventory.from_nodes(nodes, CAT, share_reserve_gib=0.0, max_compute_oversubscription=1.0)
    for step in range(rng.randint(0, 4 * n)):
        node = rng.choice(nodes)
        i = rng.randrange(node.gpu_count)
        d = inv.device(node.name, i)
        if rng.random() < 0.3 and d.idle:
            slot = Slot.whole(node.name, [i], GPU)
        else:
            slot = Slot.share(node.name, i, GPU, float(rng.choice((100, 250, 500))), 0.1)
        slot = slot.with_host(rng.choice((0, 1000, 4000)), rng.choice((0.0, 4.0)))
        if inv.fits(slot):
            inv.allocate(slot, f"p{step}")
    return inv


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 10_000), st.booleans())
def test_the_array_deltas_are_the_one_node_references(seed: int, count_memory: bool) -> None:
    # The packer ranks by the arrays and its reference by the loop: the same integers for every node and move.
    rng = random.Random(seed)
    inv = _inventory(rng, rng.randint(1, 12))
    k = kind(count_memory)
    table = inv.kind_host_table("g")
    frag = KindFragmentation(k, table)
    for _ in range(3):
        v = rng.choice((MILLI, 750, 500, 250, 0))
        g = rng.choice((0, 100, 250, 500)) if v < MILLI else rng.choice((0, 250, MILLI))
        g = min(g, v)
        r = 1 if g < MILLI else rng.choice((1, 2))
        if g == 0 and rng.random() < 0.5:
            r = 0
        cpu, mem = rng.choice((0, 1000, 8000)), rng.choice((0.0, 4.0, 32.0))
        rows = [i for i, name in enumerate(table.nodes)
                if sum(1 for j in range(inv.nodes[name].gpu_count) if free_milli(inv, inv.device(name, j)) == v) >= r]
        if not rows:
            continue
        got = frag.deltas(rows, v, g, r, cpu, mem)
        for row, d in zip(rows, got.tolist(), strict=True):
            name = table.nodes[row]
            fr = [free_milli(inv, inv.device(name, j)) for j in range(inv.nodes[name].gpu_count)]
            fc, fm = inv.host_free(name)
            assert d == fragmentation_delta(k, fr, fc, fm, v, g, r, cpu, mem)
        # and it follows the inventory as devices change (the table's rows are re-read by version)
        name = rng.choice(table.nodes)
        slot = Slot.share(name, 0, GPU, 100.0, 0.1)
        if inv.fits(slot):
            inv.allocate(slot, f"q{rng.random()}")
            inv.kind_host_table("g")


def test_an_unchanged_node_scores_exactly_zero() -> None:
    rng = random.Random(3)
    inv = _inventory(rng, 6)
    frag = KindFragmentation(kind(), inv.kind_host_table("g"))
    assert (frag.deltas(list(range(6)), MILLI, 0, 0, 0, 0.0) == 0).all()


def test_the_learned_distribution_follows_arrivals() -> None:
    small = shape_key(SlotRequest("a", 100.0, 0.1, kinds=("share",), cpu_millis=1000))
    big = shape_key(SlotRequest("b", None, gpus=4, kinds=("whole",), cpu_millis=32000))
    work = TargetWorkload(prior=[(small, 10.0, 0.0)], half_life=50.0, prior_weight=20.0)
    assert [s.gpus for s in work.shapes().shapes] == [1]
    for _ in range(200):
        work.observe(big, 64.0)
    shapes = work.shapes().shapes
    assert shapes[0].gpus == 4 and shapes[0].memory_gib is None and shapes[0].host_memory_gib == 64.0
    assert shapes[0].weight > 9 * sum(s.weight for s in shapes[1:])  # the prior decays away, kept in the cut


def test_a_shapes_host_memory_is_the_decayed_mean_of_its_arrivals() -> None:
    key = shape_key(SlotRequest("a", None, gpus=1, kinds=("whole",), cpu_millis=1000))
    work = TargetWorkload(half_life=1e9)
    for mem in (10.0, 20.0, 30.0):
        work.observe(key, mem)
    assert abs(work.shapes().shapes[0].host_memory_gib - 20.0) < 1e-6


def test_the_cut_keeps_the_prior_shapes_that_the_top_coverage_would_drop() -> None:
    keys = [(1, None, 1.0, 1000 * i, ()) for i in range(1, 22)]
    prior = [(k, 100.0 if i < 20 else 1.0, 0.0) for i, k in enumerate(keys)]
    kept = {s.cpu_millis for s in TargetWorkload(prior, keep_prior=True).shapes().shapes}
    cut = {s.cpu_millis for s in TargetWorkload(prior, keep_prior=False).shapes().shapes}
    assert kept == {k[3] for k in keys} and cut < kept
