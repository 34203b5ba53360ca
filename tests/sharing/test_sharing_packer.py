"""First-fit packer choices, purity, and the cluster spec parser."""

from __future__ import annotations

import pytest

from sharing.catalog import load_catalog
from sharing.cluster import ClusterSpecError, nodes_from_spec
from sharing.packer import FirstFitPacker, Packer, place_batch
from sharing.slots import Inventory, NodeSpec, Slot, SlotKind, SlotRequest

CAT = load_catalog()
H100 = CAT.get("H100-80GB")
T4 = CAT.get("T4")
FF = FirstFitPacker()


def inv_of(*nodes: NodeSpec, reserve: float = 1.0) -> Inventory:
    return Inventory.from_nodes(list(nodes), share_reserve_gib=reserve)


def test_is_a_packer():
    p: Packer = FF
    assert p.name == "first-fit"


def test_whole_request_takes_first_idle_devices_on_one_node():
    inv = inv_of(NodeSpec("a", "H100-80GB", 2), NodeSpec("b", "H100-80GB", 4))
    inv.allocate(Slot.share("a", 0, H100, 1.0, 0.1), "x")
    assert FF.place(inv, SlotRequest("m", None)) == Slot.whole("a", 1, H100)
    assert FF.place(inv, SlotRequest("m", None, gpus=2)) == Slot.whole("b", (0, 1), H100)
    assert FF.place(inv, SlotRequest("m", None, gpus=5)) is None


def test_memory_request_on_mig_takes_smallest_profile_at_first_free_placement():
    inv = inv_of(NodeSpec("m", "H100-80GB", 1, mig_enabled=True))
    assert FF.place(inv, SlotRequest("m", 8.0, 0.1)) == Slot.mig("m", 0, H100, "1g", 0)
    # 15 GiB at little compute: the 1-slice, 2-memory-slice profile, not a 2g.
    assert FF.place(inv, SlotRequest("m", 15.0, 0.1)) == Slot.mig("m", 0, H100, "1g.2mem", 0)
    # Needing 25% of the GPU's compute rules out 1-slice profiles (1/7).
    assert FF.place(inv, SlotRequest("m", 15.0, 0.25)) == Slot.mig("m", 0, H100, "2g", 0)
    inv.allocate(Slot.mig("m", 0, H100, "1g", 0), "a")
    assert FF.place(inv, SlotRequest("m", 15.0, 0.1)) == Slot.mig("m", 0, H100, "1g.2mem", 2)
    assert FF.place(inv, SlotRequest("m", 30.0, 0.3)) == Slot.mig("m", 0, H100, "3g", 4)
    # Default compute 1.0: only the full-GPU instance qualifies, and slice 0 is taken; share not
    # possible in MIG mode without an instance, so the whole-GPU fallback finds nothing either.
    assert FF.place(inv, SlotRequest("m", 30.0)) is None


def test_plain_gpu_gets_a_share_then_falls_back_to_whole():
    inv = inv_of(NodeSpec("h", "H100-80GB", 2))
    assert FF.place(inv, SlotRequest("m", 20.0, 0.3)) == Slot.share("h", 0, H100, 20.0, 0.3)
    # 79.5 GiB + 1 GiB reserve does not fit as a share: a whole GPU serves it.
    assert FF.place(inv, SlotRequest("m", 79.5, 0.3)) == Slot.whole("h", 0, H100)
    assert FF.place(inv, SlotRequest("m", 20.0, 0.3, kinds=("whole",))) == Slot.whole("h", 0, H100)
    assert FF.place(inv, SlotRequest("m", 20.0, 0.3, kinds=("mig",))) is None
    assert FF.place(inv, SlotRequest("m", 200.0, 0.3)) is None


def test_kinds_and_gpu_models_are_respected():
    inv = inv_of(NodeSpec("m", "H100-80GB", 1, mig_enabled=True), NodeSpec("t", "T4", 1))
    assert FF.place(inv, SlotRequest("m", 4.0, 0.1, kinds=("share",))).node == "m"
    assert FF.place(inv, SlotRequest("m", 4.0, 0.1, gpu_models=("Tesla-T4",))) == Slot.share("t", 0, T4, 4.0, 0.1)
    slot = FF.place(inv, SlotRequest("m", 4.0, 0.1, kinds=("mig",)))
    assert slot is not None and slot.kind is SlotKind.MIG


def test_share_only_on_mig_creates_then_joins_a_shared_instance():
    inv = inv_of(NodeSpec("m", "H100-80GB", 1, mig_enabled=True))
    req = SlotRequest("tiny", 3.0, 0.04, kinds=("share",))
    first = FF.place(inv, req)
    assert first == Slot.share("m", 0, H100, 3.0, 0.04, "1g", 0)
    inv.allocate(first, "a")
    # Also when MIG is allowed: joining the existing shared instance comes first.
    second = FF.place(inv, SlotRequest("tiny", 3.0, 0.04))
    assert second == first
    inv.allocate(second, "b")
    third = FF.place(inv, req)  # 3 x 3 + 1 reserve = 10 GiB, 3 x 0.04 < 1/7: still fits the 1g
    assert third == first
    inv.allocate(third, "c")
    assert FF.place(inv, req) == Slot.share("m", 0, H100, 3.0, 0.04, "1g", 1)


def test_place_is_pure_and_place_batch_allocates_in_order():
    inv = inv_of(NodeSpec("t", "T4", 1), NodeSpec("h", "H100-80GB", 1, mig_enabled=True))
    before = inv.copy()
    reqs = [
        SlotRequest("a", 10.0, 0.5),
        SlotRequest("b", 10.0, 0.5),
        SlotRequest("c", None),
        SlotRequest("d", 500.0, 0.1),
    ]
    for r in reqs:
        FF.place(inv, r)
    assert inv == before
    out = place_batch(FF, inv, reqs)
    assert out[0] == Slot.share("t", 0, T4, 10.0, 0.5)
    assert out[1] is not None and out[1].node == "h"  # T4 full (10 + 10 + 1 > 16)
    assert out[2] is None and out[3] is None  # the H100 is no longer idle
    assert sorted(o for o, _ in inv.allocations()) == ["a/0", "b/1"]
    place_batch(FF, inv, [SlotRequest("a", 2.0, 0.1)])  # a second batch: default owners do not collide
    assert sorted(o for o, _ in inv.allocations()) == ["a/0", "a/0.1", "b/1"]
    inv2 = before.copy()
    place_batch(FF, inv2, reqs[:1], owners=["rep-1"])
    assert [o for o, _ in inv2.allocations()] == ["rep-1"]
    with pytest.raises(ValueError):
        place_batch(FF, inv2, reqs, owners=["x"])


# -- cluster spec ------------------------------------------------------------------------------


def test_text_spec():
    nodes = nodes_from_spec("4xH100-80GB:mig, 8xA100-40GB,2xL4,20xT4:gpn=4, H100")
    got = [(n.name, n.gpu_model, n.gpu_count, n.mig_enabled) for n in nodes]
    assert got[:3] == [
        ("h100-80gb-0", "H100-80GB", 4, True),
        ("a100-40gb-0", "A100-40GB", 8, False),
        ("l4-24gb-0", "L4-24GB", 2, False),
    ]
    assert [n.gpu_count for n in nodes if n.gpu_model == "T4-16GB"] == [4] * 5
    assert got[-1] == ("h100-80gb-1", "H100-80GB", 1, False)  # numbering continues per kind
    assert nodes[0].labels["nvidia.com/gpu.product"] == "H100-80GB"
    assert [n.gpu_count for n in nodes_from_spec("20xH100")] == [8, 8, 4]
    Inventory.from_nodes(nodes)


@pytest.mark.parametrize(
    ("spec", "token"),
    [
        ("4xH100-80GB:mig,3xMI300X", "MI300X"),
        ("2xT4:mig", "T4"),
        ("2xH100:turbo", "turbo"),
        ("2xH100:gpn=0", "gpn=0"),
        ("0xH100", "0xH100"),
        ("H100,,T4", "empty item"),
        ("", "empty"),
    ],
)
def test_text_spec_errors_name_the_token(spec, token):
    with pytest.raises(ClusterSpecError, match=token):
        nodes_from_spec(spec)


def test_dict_spec():
    nodes = nodes_from_spec(
        [
            {"kind": "H100-80GB", "nodes": 2, "gpus_per_node": 8, "mig": True},
            {"kind": "T4", "gpus": 10, "gpus_per_node": 4, "name": "edge", "labels": {"zone": "a"}},
        ]
    )
    assert [(n.name, n.gpu_count, n.mig_enabled) for n in nodes] == [
        ("h100-80gb-0", 8, True),
        ("h100-80gb-1", 8, True),
        ("edge-0", 4, False),
        ("edge-1", 4, False),
        ("edge-2", 2, False),
    ]
    assert nodes[2].labels["zone"] == "a"
    assert nodes_from_spec({"nodes": [{"kind": "L4"}]})[0].gpu_count == 8


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ([{"nodes": 2}], "kind"),
        ([{"kind": "H100", "nodes": 0}], "nodes"),
        ([{"kind": "H100", "gpus": 2, "nodes": 1}], "either"),
        ([{"kind": "H100", "colour": "red"}], "colour"),
        ([{"kind": "T4", "mig": True}], "MIG"),
        ([{"kind": "Z80"}], "Z80"),
        (["H100"], "mapping"),
        ({"pools": []}, "nodes"),
    ],
)
def test_dict_spec_errors(spec, match):
    with pytest.raises(ClusterSpecError, match=match):
        nodes_from_spec(spec)
