"""Gang placement of a replica that is a group of pods (``sharing.packer.place_group``, issue 17 item 2): all of the
group's slots or none, legal together, and the inventory left as it was."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sharing.cluster import nodes_from_spec
from sharing.packer import CostAwarePacker, FirstFitPacker, allocate_group, fits_group, place_group, release_held
from sharing.slots import Inventory, SlotRequest

CLUSTERS = st.sampled_from(["16xH100-80GB", "8xH100-80GB:mig,4xL4", "12xA100-80GB:gpn=4", "2xL4,16xH100-80GB:mig"])
REQUESTS = st.one_of(
    st.builds(lambda g: SlotRequest("g", memory_gib=None, gpus=g, kinds=("whole",)), st.integers(1, 4)),
    st.builds(lambda m: SlotRequest("g", memory_gib=m, compute_fraction=0.25), st.sampled_from([10.0, 20.0, 40.0])),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cluster=CLUSTERS, req=REQUESTS, pods=st.integers(1, 5), before=st.integers(0, 6),
       first_fit=st.booleans())
def test_a_group_is_placed_whole_or_not_at_all(cluster: str, req: SlotRequest, pods: int, before: int,
                                                first_fit: bool) -> None:
    packer = FirstFitPacker() if first_fit else CostAwarePacker()
    inv = Inventory.from_nodes(nodes_from_spec(cluster))
    other = SlotRequest("o", memory_gib=None, gpus=1, kinds=("whole",))
    for k in range(before):  # some GPUs already taken
        s = packer.place(inv, other)
        if s is not None:
            inv.allocate(s, f"o-{k}")
    snapshot = inv.copy()
    slots = place_group(packer, inv, req, pods)
    assert inv == snapshot  # pure: nothing allocated on the caller's inventory
    if slots is None:
        return
    assert len(slots) == pods and len(set(slots)) == pods
    assert fits_group(inv, slots)
    trial = inv.copy()
    allocate_group(trial, slots, "g-1", model="g")  # all of them, together, under one owner
    assert len(trial.slots_of("g-1")) == pods
    for s in slots:
        release_held(trial, s, "g-1")
    assert trial == inv  # removing the group frees every slot
    if pods == 1:
        assert slots == (packer.place(inv, req),)  # one pod: exactly the packer's own choice


def test_a_group_too_big_for_the_cluster_takes_nothing() -> None:
    inv = Inventory.from_nodes(nodes_from_spec("16xH100-80GB"))
    req = SlotRequest("g", memory_gib=None, gpus=8, kinds=("whole",))
    assert place_group(CostAwarePacker(), inv, req, 2) is not None
    assert place_group(CostAwarePacker(), inv, req, 3) is None
    assert inv.gpus_in_use() == 0


def test_allocate_group_is_all_or_none() -> None:
    inv = Inventory.from_nodes(nodes_from_spec("8xH100-80GB"))
    gpu = inv.gpu_of("h100-80gb-0")
    from sharing.slots import AllocationError, Slot

    inv.allocate(Slot.whole("h100-80gb-0", 3, gpu), "x-1")
    try:
        allocate_group(inv, (Slot.whole("h100-80gb-0", 0, gpu), Slot.whole("h100-80gb-0", 3, gpu)), "g-1")
    except AllocationError:
        pass
    else:
        raise AssertionError("the second slot is taken: the group must not be allocated")
    assert inv.slots_of("g-1") == []
