"""Node-level actions implied by a tick's placements: MIG re-layouts, the time-slicing config, slot templates."""

from __future__ import annotations

from autoscaler.api.plan import PlaceReplica, Plan, SetSlotTemplate
from autoscaler.api.snapshot import ClusterSnapshot, ModelObservation, Replica, SlotTemplate
from autoscaler.api.spec import ModelSpec
from autoscaler.decision.node_actions import (
    NodeActionState,
    gpu_resources,
    mig_layout_actions,
    node_actions,
    template_actions,
    time_slicing_action,
    time_slicing_replicas,
)
from sharing.catalog import load_catalog
from sharing.render import GPU_PRODUCT, check_layout
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


def test_node_actions_remember_the_time_slicing_config_they_planned() -> None:
    inv = Inventory.from_nodes([NodeSpec("ts", "L4", 1)])
    after = inv.copy()
    for k in range(2):
        after.allocate(Slot.share("ts", 0, load_catalog().get("L4"), 6.0, 0.3), f"m-{k}", model="m")
    snap = ClusterSnapshot(0.0, {}, inv)
    state = NodeActionState()
    (ts,) = node_actions(snap, Plan(0.0), after, state)
    assert ts.replicas == {"nvidia.com/gpu": 2} and state.time_slicing == {"nvidia.com/gpu": 2}
    assert node_actions(snap, Plan(0.0), after, state) == []  # planned once
    assert node_actions(snap, Plan(0.0), None, state) == []  # nothing placed: nothing to plan


# -- slot templates ---------------------------------------------------------------------------------------------
H100, L4 = load_catalog().get("H100-80GB"), load_catalog().get("L4")
H100_LABEL = "NVIDIA-H100-80GB-HBM3"


def _cluster() -> Inventory:
    return Inventory.from_nodes([NodeSpec("mig", "H100-80GB", 1, mig_enabled=True, labels={GPU_PRODUCT: H100_LABEL}),
                                 NodeSpec("l4", "L4", 2, labels={GPU_PRODUCT: "NVIDIA-L4"})])


def _snapshot(template: SlotTemplate | None, running: int = 0) -> ClusterSnapshot:
    spec = ModelSpec(name="m", slot_kinds=("mig", "whole"), gpu_memory_gib=15.0, gpu_compute_share=0.25)
    reps = tuple(Replica(f"r{k}", None, ready=True, started_at=0.0) for k in range(running))
    templates = {} if template is None else {"m": template}
    return ClusterSnapshot(0.0, {"m": ModelObservation("m", spec, running, reps)}, _cluster(), templates=templates)


def _placements(*slots: Slot) -> Plan:
    return Plan(0.0, [PlaceReplica("m", f"m-{k}", s) for k, s in enumerate(slots)])


MIG_2G = Slot.mig("mig", 0, H100, "2g", 0)


def test_a_first_placement_sets_the_template_keeping_the_other_selectors() -> None:
    snap = _snapshot(SlotTemplate({}, {"team": "search"}))
    (action,) = template_actions(_placements(MIG_2G), snap)
    assert action == SetSlotTemplate("m", {"requests": {"nvidia.com/mig-2g.20gb": "1"},
                                           "limits": {"nvidia.com/mig-2g.20gb": "1"}},
                                     {"team": "search", GPU_PRODUCT: H100_LABEL})


def test_the_shape_most_placements_chose_wins_ties_the_first() -> None:
    whole = [Slot.whole("l4", i, L4) for i in range(2)]
    (action,) = template_actions(_placements(MIG_2G, *whole), _snapshot(SlotTemplate()))
    assert action.resources["limits"] == {"nvidia.com/gpu": "1"} and action.node_selector == {GPU_PRODUCT: "NVIDIA-L4"}
    (tie,) = template_actions(_placements(MIG_2G, whole[0]), _snapshot(SlotTemplate()))
    assert tie.resources["limits"] == {"nvidia.com/mig-2g.20gb": "1"}


def test_no_template_action_for_a_running_model_the_same_template_or_an_unknown_one() -> None:
    running = SlotTemplate({"limits": {"nvidia.com/gpu": "1"}}, {})
    assert template_actions(_placements(MIG_2G), _snapshot(running, running=1)) == []  # re-slotting rolls every pod
    (action,) = template_actions(_placements(MIG_2G), _snapshot(SlotTemplate()))
    same = SlotTemplate(action.resources, action.node_selector)
    assert template_actions(_placements(MIG_2G), _snapshot(same)) == []
    assert template_actions(_placements(MIG_2G), _snapshot(None)) == []  # no template known: not ours to set
    # a running model that asks for no GPU gets one
    assert template_actions(_placements(MIG_2G), _snapshot(SlotTemplate(), running=1))


def test_gpu_resources_reads_the_nvidia_part_of_a_container() -> None:
    got = gpu_resources({"requests": {"cpu": "2", "nvidia.com/gpu": 1}, "limits": {"memory": "1Gi"}})
    assert got == {"requests": {"nvidia.com/gpu": "1"}}
