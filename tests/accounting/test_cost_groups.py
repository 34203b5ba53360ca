"""Cost attribution of replicas that are pod groups (issue 17, item 2): a LeaderWorkerSet replica holds every pod's
slot, so its GPU-equivalents (and its nodes, for idle reserved) are all of them."""

from __future__ import annotations

from autoscaler.accounting.cost import idle_reserved, inference_nodes, usage
from autoscaler.api.snapshot import ClusterSnapshot, ModelObservation, Replica
from autoscaler.api.spec import ModelSpec
from sharing.cluster import nodes_from_spec
from sharing.slots import Inventory, Slot


def test_a_group_replica_holds_all_its_pods_gpus_on_all_its_nodes() -> None:
    inv = Inventory.from_nodes(nodes_from_spec("16xH100-80GB"))
    gpu = inv.gpu_of("h100-80gb-0")
    leader, worker = Slot.whole("h100-80gb-0", (0, 1), gpu), Slot.whole("h100-80gb-1", (0, 1), gpu)
    for s in (leader, worker):
        inv.allocate(s, "lws-1", model="lws")
    spec = ModelSpec(name="lws", slo_latency_ms=1000, gpus_per_replica=2, pods_per_replica=2, team="t")
    obs = ModelObservation("lws", spec, 1, (Replica("lws-1", leader, True, 0.0, group_slots=(worker,)),))
    snap = ClusterSnapshot(now=0.0, models={"lws": obs}, inventory=inv)
    (row,) = usage(snap)
    assert row.gpus == 4.0 and row.team == "t"
    assert inference_nodes(snap) == {"h100-80gb-0", "h100-80gb-1"}
    assert idle_reserved(snap) == {"H100-80GB": 12.0}  # 6 free GPUs on each node the group uses
