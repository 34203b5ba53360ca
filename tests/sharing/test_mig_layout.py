"""MIG layout search (sharing.mig_layout): one GPU's layout, a node's counts spread over its MIG GPUs, and the
sizes that follow. Every layout it returns must pass sharing.render.check_layout, and it must find one
whenever one exists (checked exhaustively on small multisets)."""

from __future__ import annotations

import itertools
from collections import Counter

import pytest

from sharing.catalog import GpuModel, load_catalog
from sharing.mig_layout import distribute_mig_instances, fit_layout, gpus_needed, instances_per_gpu, lay_out_mig_node
from sharing.render import LayoutError, check_layout
from sharing.slots import Inventory, NodeSpec

CAT = load_catalog()
H100 = CAT.get("H100-80GB")
A30 = CAT.get("A30-24GB")


def mig_inventory(n: int, kind: str = "H100-80GB") -> Inventory:
    return Inventory.from_nodes([NodeSpec("m", kind, n, mig_enabled=True)], CAT)


def _some_layout_exists(gpu: GpuModel, keys: tuple[str, ...]) -> bool:
    """Brute force: any assignment of legal starts that check_layout accepts."""
    for starts in itertools.product(*(gpu.profiles[k].placements for k in keys)):
        try:
            check_layout(gpu, list(zip(keys, starts, strict=True)))
        except LayoutError:
            continue
        return True
    return False


def test_fit_layout_finds_a_legal_layout_where_first_free_start_fails() -> None:
    lay = fit_layout(H100, ("3g", "2g", "1g", "1g"))
    assert lay is not None and check_layout(H100, lay) == list(lay)
    assert fit_layout(H100, ("7g", "1g")) is None
    assert fit_layout(H100, ("3g",) * 3) is None
    assert check_layout(A30, fit_layout(A30, ("2g", "1g", "1g"))) is not None


def test_fit_layout_is_sorted_by_start_and_ignores_key_order() -> None:
    lay = fit_layout(H100, ("1g", "3g", "1g", "2g"))
    assert lay == fit_layout(H100, ("3g", "2g", "1g", "1g"))
    assert [s for _, s in lay] == sorted(s for _, s in lay)
    assert fit_layout(H100, ()) == ()


@pytest.mark.parametrize("gpu", [H100, A30], ids=lambda g: g.name)
def test_fit_layout_finds_a_layout_exactly_when_one_exists(gpu: GpuModel) -> None:
    for size in range(1, 4 + 1):
        for keys in itertools.combinations_with_replacement(sorted(gpu.profiles), size):
            lay = fit_layout(gpu, keys)
            assert (lay is not None) == _some_layout_exists(gpu, keys), keys
            if lay is not None:
                assert check_layout(gpu, lay) == list(lay)
                assert Counter(k for k, _ in lay) == Counter(keys)


def test_distribute_gives_every_gpu_the_same_balanced_layout() -> None:
    # mig-parted's all-balanced on 8 x H100: 1 x 3g, 1 x 2g, 2 x 1g per GPU.
    inv = mig_inventory(8)
    created, dropped = distribute_mig_instances(inv, "m", range(8), {"3g": 8, "2g": 8, "1g": 16})
    assert dropped == {} and len(created) == 32
    layouts = {inv.mig_layout("m", i) for i in range(8)}
    assert len(layouts) == 1
    (lay,) = layouts
    assert Counter(k for k, _ in lay) == Counter({"3g": 1, "2g": 1, "1g": 2})
    assert check_layout(H100, lay) == list(lay)


def test_distribute_spreads_round_robin_and_reports_what_fits_nowhere() -> None:
    inv = mig_inventory(2)
    created, dropped = distribute_mig_instances(inv, "m", range(2), {"1g": 3})
    assert sorted(d for d, _, _ in created) == [0, 0, 1]
    inv = mig_inventory(2)
    created, dropped = distribute_mig_instances(inv, "m", [1], {"7g": 2, "1g": 1})
    assert created == [(1, "7g", 0)] and dropped == {"7g": 1, "1g": 1}
    assert inv.mig_layout("m", 0) == ()


def test_lay_out_mig_node_turns_the_rest_plain() -> None:
    inv = mig_inventory(3)
    dropped = lay_out_mig_node(inv, "m", 2, {"7g": 3})
    assert dropped == {"7g": 1}
    assert [inv.device("m", i).mig_enabled for i in range(3)] == [True, True, False]
    assert [inv.mig_layout("m", i) for i in range(2)] == [(("7g", 0),), (("7g", 0),)]


def test_instances_per_gpu() -> None:
    assert [instances_per_gpu(H100, H100.profiles[k], CAT) for k in ("1g", "1g.2mem", "2g", "3g", "4g", "7g")] == [
        7, 4, 3, 2, 1, 1]
    assert instances_per_gpu(A30, A30.profiles["2g"], CAT) == 2


def test_gpus_needed_is_the_fewest_gpus_the_counts_fit_on() -> None:
    assert gpus_needed(H100, {"3g": 4}, CAT) == 2
    assert gpus_needed(H100, {"7g": 2, "1g": 3}, CAT) == 3  # a 7g fills its GPU: the 1g's need a third
    assert gpus_needed(H100, {"4g": 1, "3g": 3}, CAT) == 2  # the compute bound, reached
    assert gpus_needed(H100, {"3g": 2, "1g": 2}, CAT) == 2  # compute says 2 (8 > 7 slices)
    assert gpus_needed(A30, {"1g": 4}, CAT) == 1
