"""Node-level actions implied by a tick's placements: MIG re-layouts and the time-slicing config."""

from __future__ import annotations

from autoscaler.decision.node_actions import mig_layout_actions, time_slicing_action, time_slicing_replicas
from sharing.catalog import load_catalog
from sharing.render import check_layout
from sharing.slots import Inventory, NodeSpec, Slot


def _mig_node() -> Inventory:
    inv = Inventory.from_nodes([NodeSpec("gpu-a", "H100-80GB", 2, mig_enabled=True), NodeSpec("plain", "L4", 1)])
    inv.create_mig_instance("gpu-a", 0, "3g", 0)
    inv.create_mig_instance("gpu-a", 1, "3g", 0)
    return inv


def test_no_action_when_placements_use_existing_instances() -> None:
    before = _mig_node()
    after = before.copy()
    gpu = load_catalog().get("H100-80GB")
    after.allocate(Slot.mig("gpu-a", 0, gpu, "3g", 0), "m-1", model="m")
    after.allocate(Slot.whole("plain", 0, load_catalog().get("L4")), "w-1", model="w")
    assert mig_layout_actions(before, after) == []


def test_new_instance_asks_for_a_relayout_of_that_gpu_only() -> None:
    before = _mig_node()
    before.allocate(Slot.mig("gpu-a", 1, load_catalog().get("H100-80GB"), "3g", 0), "busy-1", model="b")
    after = before.copy()
    gpu = load_catalog().get("H100-80GB")
    after.allocate(Slot.mig("gpu-a", 0, gpu, "3g", 4), "m-1", model="m")  # a second 3g on GPU 0
    (action,) = mig_layout_actions(before, after)
    assert action.node == "gpu-a"
    assert action.changed == (0,)
    # GPU 1 does not change: its one 3g instance (and the pod on it) survives the re-layout
    assert action.busy == {"nvidia.com/mig-3g.40gb": 1}
    assert action.config_name.startswith("slotwise-gpu-a-")
    entries = action.config["mig-configs"][action.config_name]
    assert {e["mig-devices"]["3g.40gb"] for e in entries} == {1, 2}
    for layout in action.layouts.values():
        check_layout(gpu, list(layout or ()))  # every wanted layout is legal
    # the same layout always gets the same name; a different one a different name
    again = mig_layout_actions(before, after)[0]
    assert again.config_name == action.config_name
    other = before.copy()
    other.allocate(Slot.mig("gpu-a", 0, gpu, "1g", 4), "m-2", model="m")
    assert mig_layout_actions(before, other)[0].config_name != action.config_name


def test_time_slicing_counts_the_most_shares_per_device_and_only_rises() -> None:
    inv = Inventory.from_nodes([NodeSpec("ts", "L4", 2)])
    l4 = load_catalog().get("L4")
    for k in range(3):
        inv.allocate(Slot.share("ts", 0, l4, 6.0, 0.3), f"m-{k}", model="m")
    inv.allocate(Slot.share("ts", 1, l4, 6.0, 0.3), "n-0", model="n")
    assert time_slicing_replicas(inv) == {"nvidia.com/gpu": 3}
    assert time_slicing_action(inv, {}).replicas == {"nvidia.com/gpu": 3}
    assert time_slicing_action(inv, {"nvidia.com/gpu": 3}) is None
    assert time_slicing_action(inv, {"nvidia.com/gpu": 4}) is None  # never lowered under running pods
