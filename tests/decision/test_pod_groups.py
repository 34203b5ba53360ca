"""Replicas that are pod groups (issue 17, item 2: a LeaderWorkerSet replica is ``pods_per_replica`` pods, each with
the model's slot, placed together): the decision core places a group whole or not at all, frees all of it when it
removes it, and counts all of it against a team's GPUs."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_model_isolation import Wants

from autoscaler.api.plan import PlaceReplica, Plan, RemoveReplica, Shortfall, ShortfallCause
from autoscaler.api.snapshot import ClusterSnapshot, MetricsWindow, ModelMetrics, ModelObservation, Replica
from autoscaler.api.spec import ModelSpec, slot_request
from autoscaler.decision.arbitration import ArbitrationPolicy, TeamQuota
from autoscaler.decision.config import CoreConfig
from autoscaler.decision.core import decide
from autoscaler.decision.state import fresh_state
from sharing.cluster import nodes_from_spec
from sharing.packer import CostAwarePacker, allocate_group, place_group
from sharing.slots import Inventory, Slot


def window(names: list[str], now: float = 100.0) -> MetricsWindow:
    return MetricsWindow(now=now, step_s=10.0, models={
        m: ModelMetrics(rate=np.full(30, 5.0), in_flight=np.full(30, 0.5)) for m in names})


def group_spec(name: str, pods: int, gpus: int = 1, **kw: object) -> ModelSpec:
    return ModelSpec(name=name, slo_latency_ms=1000, gpus_per_replica=gpus, pods_per_replica=pods, max_replicas=50,
                     **kw)  # type: ignore[arg-type]


def existing(inv: Inventory, spec: ModelSpec, n: int, ready: bool = True, start: int = 0) -> tuple[Replica, ...]:
    """``n`` group replicas of ``spec`` allocated on ``inv`` (every pod's slot under the replica's id)."""
    out = []
    for k in range(start, start + n):
        slots = place_group(CostAwarePacker(), inv, slot_request(spec), spec.pods_per_replica)
        assert slots is not None
        rid = f"{spec.name}-old{k}"
        allocate_group(inv, slots, rid, model=spec.name)
        out.append(Replica(rid, slots[0], ready=ready, started_at=0.0, group_slots=slots[1:]))
    return tuple(out)


def decide_on(models: list[tuple[ModelSpec, tuple[Replica, ...]]], wants: dict[str, int], inv: Inventory,
              arbitration: ArbitrationPolicy | None = None):  # type: ignore[no-untyped-def]
    snap = ClusterSnapshot(now=100.0, inventory=inv, models={
        s.name: ModelObservation(s.name, s, len(r), r) for s, r in models})
    config = CoreConfig(policy=Wants(wants))  # type: ignore[arg-type]
    if arbitration is not None:
        config = CoreConfig(policy=Wants(wants), arbitration=arbitration)  # type: ignore[arg-type]
    return decide(snap, window([s.name for s, _ in models]), fresh_state(), config)


def owners_of(inv: Inventory, model: str) -> dict[str, list[Slot]]:
    out: dict[str, list[Slot]] = {}
    for owner, slot in inv.allocations():
        if inv.model_of(owner) == model:
            out.setdefault(owner, []).append(slot)
    return out


def groups_of(plan: Plan, model: str) -> list[PlaceReplica]:
    return [a for a in plan.of_type(PlaceReplica) if a.model == model]


# ------------------------------------------------------------------------------------------------ placement


# A cluster spec of 1-3 GPU kinds, 1-16 GPUs each, in nodes of 2, 4 or 8 GPUs.
CLUSTERS = st.lists(st.tuples(st.sampled_from(["H100-80GB", "A100-80GB", "L4"]), st.integers(1, 16),
                              st.sampled_from([2, 4, 8])), min_size=1, max_size=3, unique_by=lambda t: t[0]).map(
    lambda parts: ",".join(f"{n}x{k}:gpn={g}" for k, n, g in parts))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cluster=CLUSTERS, pods=st.integers(2, 4), gpus=st.integers(1, 2), want=st.integers(1, 6),
       other=st.integers(0, 4), busy=st.integers(0, 2))
def test_a_group_is_placed_whole_or_not_at_all(cluster: str, pods: int, gpus: int, want: int,
                                                other: int, busy: int) -> None:
    inv = Inventory.from_nodes(nodes_from_spec(cluster))
    g = group_spec("g", pods, gpus)
    solo = ModelSpec(name="s", slo_latency_ms=1000, max_replicas=50)
    running: tuple[Replica, ...] = ()
    for _ in range(busy):
        if place_group(CostAwarePacker(), inv, slot_request(g), pods) is None:
            break
        running += existing(inv, g, 1, start=len(running))
    d = decide_on([(g, running), (solo, ())], {"g": len(running) + want, "s": other}, inv)
    after = d.inventory if d.inventory is not None else inv
    placed = groups_of(d.plan, "g")
    for a in placed:
        assert len(a.slots) == pods and len(set(a.slots)) == pods  # every pod's slot, distinct
        assert all(s.kind.value == "whole" and len(s.devices) == gpus for s in a.slots)
        assert sorted(after.slots_of(a.replica_id), key=Slot.sort_key) == sorted(a.slots, key=Slot.sort_key)
    # The inventory after the decision never holds a partial group: every owner of the group model holds k slots.
    for owner, slots in owners_of(after, "g").items():
        assert len(slots) == pods, owner
    missing = sum(a.missing for a in d.plan.of_type(Shortfall) if a.model == "g")
    assert len(placed) + missing == want or len(placed) == want
    assert all(not a.group_slots for a in d.plan.of_type(PlaceReplica) if a.model == "s")  # one-pod: no group


def test_a_group_spans_nodes_only_when_one_node_cannot_hold_it() -> None:
    inv = Inventory.from_nodes(nodes_from_spec("24xH100-80GB"))  # 3 nodes of 8 GPUs
    two_by_four = group_spec("g", pods=2, gpus=4)
    d = decide_on([(two_by_four, ())], {"g": 1}, inv)
    (a,) = groups_of(d.plan, "g")
    assert len({s.node for s in a.slots}) == 1  # 2 x 4 GPUs: one node holds the whole group
    big = group_spec("b", pods=3, gpus=8)
    d = decide_on([(big, ())], {"b": 1}, Inventory.from_nodes(nodes_from_spec("24xH100-80GB")))
    (a,) = groups_of(d.plan, "b")
    assert len({s.node for s in a.slots}) == 3  # 3 x 8 GPUs: a node each


def test_a_group_that_does_not_fit_whole_places_nothing() -> None:
    inv = Inventory.from_nodes(nodes_from_spec("16xH100-80GB"))  # 16 GPUs
    g = group_spec("g", pods=3, gpus=8)  # 24 GPUs a replica
    d = decide_on([(g, ())], {"g": 1}, inv)
    assert groups_of(d.plan, "g") == []
    (sf,) = [a for a in d.plan.of_type(Shortfall) if a.model == "g"]
    assert sf.missing == 1 and sf.cause is ShortfallCause.UNPLACEABLE
    after = d.inventory if d.inventory is not None else inv
    assert after.gpus_in_use() == 0  # not one pod of it was placed


def test_two_groups_place_four_slots_and_serve_as_two_replicas() -> None:
    inv = Inventory.from_nodes(nodes_from_spec("32xH100-80GB"))
    g = group_spec("g", pods=2, gpus=8)
    d = decide_on([(g, ())], {"g": 2}, inv)
    placed = groups_of(d.plan, "g")
    assert len(placed) == 2 and sum(len(a.slots) for a in placed) == 4
    (scale,) = [a for a in d.plan.actions if getattr(a, "model", "") == "g" and type(a).__name__ == "ScaleModel"]
    assert scale.replicas == 2  # sizing is in replicas: one group serves as one replica
    assert d.inventory is not None and d.inventory.gpus_in_use() == 32


# ------------------------------------------------------------------------------------------------ removal


def test_removing_a_group_frees_all_its_slots_for_the_next_ask() -> None:
    # Two groups of 2 x 8 GPUs hold all four nodes and one is scaled down; a one-pod model asks for two replicas of
    # 8 GPUs: they fit only on the capacity of *both* pods of the removed group being freed, so both are granted on
    # the drain (none refused). (A scale-down to one group, not to zero: a serving model is never scaled to zero,
    # autoscaler/decision/zero.py.)
    inv = Inventory.from_nodes(nodes_from_spec("32xH100-80GB"))
    old = group_spec("old", pods=2, gpus=8)
    new = group_spec("new", pods=1, gpus=8)
    running = existing(inv, old, 2)
    d = decide_on([(old, running), (new, ())], {"old": 1, "new": 2}, inv)
    assert len(d.plan.of_type(RemoveReplica)) == 1  # one group (both its pods) leaves
    waits = [a for a in d.plan.of_type(Shortfall) if a.model == "new"]
    assert {a.cause for a in waits} == {ShortfallCause.PREEMPTING}  # waiting for the draining replica's two pods
    assert sum(a.missing for a in waits) == 2
    assert groups_of(d.plan, "new") == []


def test_a_group_victim_frees_all_its_pods_and_counts_all_its_gpus() -> None:
    # A high-priority one-pod model misses its SLO; the only capacity is held by a low-priority group of 2 x 8 GPUs
    # on a 2-node cluster: preempting the group frees 16 GPUs, and the victim team's usage falls by 16.
    inv = Inventory.from_nodes(nodes_from_spec("16xH100-80GB"))
    low = group_spec("low", pods=2, gpus=8, team="b", priority=0, min_replicas=0)
    high = ModelSpec(name="high", slo_latency_ms=200, service_time_ms=150, gpus_per_replica=8, team="a",
                     priority=10, max_replicas=4)
    running = existing(inv, low, 1)
    policy = ArbitrationPolicy(teams=(TeamQuota("a", 0.0), TeamQuota("b", 0.0)), min_runtime_s=0.0)
    d = decide_on([(low, running), (high, ())], {"high": 2}, inv, policy)
    removed = [a for a in d.plan.of_type(RemoveReplica) if a.preempted_by == "high"]
    assert [a.replica_id for a in removed] == ["low-old0"]
    # Both of "high"'s replicas wait on the one group's two pods: one preemption freed 16 GPUs.
    waits = [a for a in d.plan.of_type(Shortfall) if a.model == "high" and a.cause is ShortfallCause.PREEMPTING]
    assert sum(a.missing for a in waits) == 2
