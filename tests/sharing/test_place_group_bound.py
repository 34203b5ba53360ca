"""A group that cannot fit is refused before any pod is tried (``sharing.packer.group_may_fit``, issue 17): a
LeaderWorkerSet of hundreds of pods made ``place_group`` try them one by one on every preemption attempt. The bound
is necessary, never sufficient: it refuses no group the pod-by-pod placement would place."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sharing.cluster import nodes_from_spec
from sharing.packer import CostAwarePacker, FirstFitPacker, group_may_fit, place_group
from sharing.slots import Inventory, Slot, SlotRequest


class CountingPacker:
    """A packer that counts the slots asked of it (the per-pod placement place_group does)."""

    def __init__(self) -> None:
        self.inner = CostAwarePacker()
        self.calls = 0

    def place(self, inv: Inventory, req: SlotRequest) -> Slot | None:
        self.calls += 1
        return self.inner.place(inv, req)


WHOLE = SlotRequest("g", memory_gib=None, gpus=1, kinds=("whole",))
MIG = SlotRequest("g", memory_gib=10.0, compute_fraction=0.1, kinds=("mig",))


def test_a_huge_group_of_whole_gpus_is_refused_without_trying_a_pod() -> None:
    inv = Inventory.from_nodes(nodes_from_spec("16xH100-80GB"))
    packer = CountingPacker()
    assert place_group(packer, inv, WHOLE, 800) is None
    assert place_group(packer, inv, SlotRequest("g", memory_gib=None, gpus=8, kinds=("whole",)), 3) is None
    assert packer.calls == 0
    assert place_group(packer, inv, WHOLE, 16) is not None  # exactly the cluster: placed
    assert packer.calls == 16


def test_taken_gpus_count_against_a_group() -> None:
    inv = Inventory.from_nodes(nodes_from_spec("8xH100-80GB"))
    p = CostAwarePacker()
    for k in range(3):
        inv.allocate(p.place(inv, WHOLE), f"o-{k}")  # type: ignore[arg-type]
    packer = CountingPacker()
    assert place_group(packer, inv, WHOLE, 6) is None
    assert packer.calls == 0
    assert place_group(packer, inv, WHOLE, 5) is not None


def test_a_partial_group_is_bounded_by_memory_not_by_gpu_count() -> None:
    inv = Inventory.from_nodes(nodes_from_spec("1xH100-80GB:mig"))
    packer = CountingPacker()
    slots = place_group(packer, inv, MIG, 7)  # seven 1g.10gb instances on one GPU: more pods than GPUs, placed
    assert slots is not None and len(slots) == 7
    packer.calls = 0
    assert place_group(packer, inv, MIG, 9) is None  # 90 GiB asked of 80: refused untried
    assert packer.calls == 0


CLUSTERS = st.sampled_from(["16xH100-80GB", "8xH100-80GB:mig,4xL4", "12xA100-80GB:gpn=4", "2xL4,4xH100-80GB:mig"])
REQUESTS = st.one_of(
    st.builds(lambda g: SlotRequest("g", memory_gib=None, gpus=g, kinds=("whole",)), st.integers(1, 4)),
    st.builds(lambda m, k: SlotRequest("g", memory_gib=m, compute_fraction=0.25, kinds=k),
              st.sampled_from([5.0, 10.0, 20.0, 40.0]),
              st.sampled_from([("whole", "mig", "share"), ("share",), ("mig",), ("mig", "share")])),
)


def _one_by_one(packer: FirstFitPacker | CostAwarePacker, inv: Inventory, req: SlotRequest, pods: int) -> bool:
    """Whether the pods fit placed one after another (place_group's loop, without the bound)."""
    trial = inv.copy()
    seen: list[Slot] = []
    for j in range(pods):
        slot = packer.place(trial, req)
        if slot is None or slot in seen:
            return False
        trial.allocate(slot, f"t#{j}", model="t")
        seen.append(slot)
    return True


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cluster=CLUSTERS, req=REQUESTS, pods=st.integers(2, 40), before=st.integers(0, 10), first_fit=st.booleans())
def test_the_bound_never_refuses_a_group_that_fits(cluster: str, req: SlotRequest, pods: int, before: int,
                                                    first_fit: bool) -> None:
    packer = FirstFitPacker() if first_fit else CostAwarePacker()
    inv = Inventory.from_nodes(nodes_from_spec(cluster))
    other = SlotRequest("o", memory_gib=10.0, compute_fraction=0.25)
    for k in range(before):  # some memory and GPUs already taken
        s = packer.place(inv, other)
        if s is not None:
            inv.allocate(s, f"o-{k}")
    fits = _one_by_one(packer, inv, req, pods)
    if fits:
        assert group_may_fit(inv, req, pods)
    assert (place_group(packer, inv, req, pods) is not None) == fits
