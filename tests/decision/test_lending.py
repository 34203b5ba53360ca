"""Lending idle reserved GPUs to training: the pure plan (sharing/lending.py) and the decision core's lend stage
(autoscaler/decision/lend.py, called from autoscaler/decision/core.py).

Unit tests pin each rule (warm buffer, hysteresis, whole-node preference, whole_nodes_only, min_lend_s, preemption
order, forecast-driven and shortfall reclaims, holding on stale metrics); hypothesis properties check the
invariants over random inventories, lent sets, needs and training workloads: a lend never names a GPU holding an
inference allocation or already lent, the warm buffer is never lent, reclaims name only lent GPUs, and no GPU is
lent and reclaimed in one tick.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autoscaler.api.plan import LendGpus, PlaceReplica, Reason, ReclaimGpus, Shortfall
from autoscaler.api.snapshot import (
    ClusterSnapshot,
    MetricsWindow,
    ModelMetrics,
    ModelObservation,
    Replica,
    TrainingWorkload,
)
from autoscaler.api.spec import ModelSpec, slot_request
from autoscaler.decision.config import CoreConfig
from autoscaler.decision.core import decide
from autoscaler.decision.state import LendState, fresh_state
from autoscaler.estimation.capacity import min_replicas_for_slo, profile_from_spec, quantize_up
from autoscaler.policies.base import PolicyContext, PolicyResult, ScalingBehavior
from sharing.lending import (
    LENT_MODEL,
    Borrower,
    LendingPolicy,
    NeedRequest,
    ReclaimReason,
    allocate_lent,
    attribute,
    lent_owner,
    plan_lending,
    preemption_order,
    release_lent,
)
from sharing.packer import CostAwarePacker, FirstFitPacker
from sharing.slots import AllocationError, Inventory, NodeSpec, Slot, SlotRequest

PACKER = CostAwarePacker()
ON = LendingPolicy(enabled=True, min_lend_s=600.0, hysteresis_gpus=1.0, warm_buffer_gpus=1.0,
                   warm_buffer_fraction=0.0)

SHORTFALL, FORECAST, HYSTERESIS, DISABLED = ReclaimReason  # (the members, in their order)


def inv_of(*nodes: tuple[str, str, int] | tuple[str, str, int, bool]) -> Inventory:
    return Inventory.from_nodes([NodeSpec(n[0], n[1], n[2], *(n[3:] or (False,))) for n in nodes])


def whole_req(model: str = "m", gpus: int = 1) -> SlotRequest:
    return SlotRequest(model=model, memory_gib=None, gpus=gpus, kinds=("whole",))


def use(inv: Inventory, node: str, *devs: int, owner: str = "inf") -> None:
    """Put an inference replica on each of ``devs`` (whole GPUs)."""
    for d in devs:
        inv.allocate(Slot.whole(node, d, inv.gpu_of(node)), f"{owner}-{node}-{d}", model=owner)


def lend_all(inv: Inventory, keys: list[tuple[str, int]], since: float = 0.0) -> dict[tuple[str, int], float]:
    for node, dev in keys:
        allocate_lent(inv, node, dev)
    return {k: since for k in keys}


def lent_keys(plan) -> set[tuple[str, int]]:  # type: ignore[no-untyped-def]
    return {(b.node, d) for b in plan.lend for d in b.devices}


def reclaimed(plan, reason: str | None = None) -> set[tuple[str, int]]:  # type: ignore[no-untyped-def]
    return {(b.node, d) for b in plan.reclaim for d in b.devices if reason is None or b.reason == reason}


# ------------------------------------------------------------------------------------------- inventory helpers


def test_lent_gpus_are_whole_slots_of_the_lent_model_and_come_back() -> None:
    inv = inv_of(("n0", "H100-80GB", 2))
    allocate_lent(inv, "n0", 1)
    d = inv.device("n0", 1)
    assert d.whole_owner == lent_owner("n0", 1) and inv.model_of(lent_owner("n0", 1)) == LENT_MODEL
    # the packer cannot place inference there
    assert FirstFitPacker().place(inv, whole_req(gpus=2)) is None
    with pytest.raises(AllocationError):
        allocate_lent(inv, "n0", 1)
    release_lent(inv, "n0", 1)
    assert inv.device("n0", 1).idle
    with pytest.raises(KeyError):
        release_lent(inv, "n0", 1)


# ------------------------------------------------------------------------------------------------- the buffer


def test_warm_buffer_is_never_lent_and_scales_with_inference() -> None:
    assert LendingPolicy(warm_buffer_gpus=1.0, warm_buffer_fraction=0.02).buffer_gpus(10) == 1
    assert LendingPolicy(warm_buffer_gpus=1.0, warm_buffer_fraction=0.02).buffer_gpus(400) == 8
    assert LendingPolicy(warm_buffer_gpus=1.5, warm_buffer_fraction=0.0).buffer_gpus(0) == 2  # whole GPUs, up

    inv = inv_of(("n0", "H100-80GB", 4))
    plan = plan_lending(inv, {}, ON, 0.0, packer=PACKER)
    assert plan.buffer == {"H100-80GB": 1}
    assert len(lent_keys(plan)) == 3  # 4 idle, one kept

    # 40 inference GPUs at 10 %: 4 kept idle, per GPU kind (an idle L4 is no buffer for an H100 model)
    inv = inv_of(*[(f"h{i}", "H100-80GB", 8) for i in range(6)], ("l0", "L4", 8))
    for i in range(5):
        use(inv, f"h{i}", *range(8))
    policy = LendingPolicy(enabled=True, warm_buffer_gpus=1.0, warm_buffer_fraction=0.1, hysteresis_gpus=0.0)
    plan = plan_lending(inv, {}, policy, 0.0, packer=PACKER)
    assert plan.buffer == {"H100-80GB": 4, "L4-24GB": 1}
    lent = lent_keys(plan)
    assert sum(1 for k in lent if k[0] == "h5") == 4 and sum(1 for k in lent if k[0] == "l0") == 7


def test_buffer_is_kept_on_fragments_so_whole_nodes_stay_lendable() -> None:
    # a: 1 idle GPU among busy ones; b: a whole idle node. The buffer GPU is a's, b is lent whole.
    inv = inv_of(("a", "H100-80GB", 4), ("b", "H100-80GB", 4))
    use(inv, "a", 0, 1, 2)
    plan = plan_lending(inv, {}, ON, 0.0, packer=PACKER, whole_nodes_only=True)
    assert lent_keys(plan) == {("b", i) for i in range(4)}


# ---------------------------------------------------------------------------------------------- hysteresis


def test_lends_only_when_the_surplus_exceeds_the_hysteresis() -> None:
    policy = LendingPolicy(enabled=True, hysteresis_gpus=2.0, warm_buffer_gpus=1.0, warm_buffer_fraction=0.0)
    inv = inv_of(("n0", "H100-80GB", 8))
    use(inv, "n0", 0, 1, 2, 3, 4)  # 3 idle: buffer 1, surplus 2 -- not above the band
    assert not plan_lending(inv, {}, policy, 0.0, packer=PACKER).lend
    inv = inv_of(("n0", "H100-80GB", 8))
    use(inv, "n0", 0, 1, 2, 3)  # 4 idle: surplus 3 > 2: all of it is lent
    plan = plan_lending(inv, {}, policy, 0.0, packer=PACKER)
    assert len(lent_keys(plan)) == 3 and plan.surplus == {"H100-80GB": 3}


def test_buffer_short_reclaims_voluntarily_only_after_min_lend_s() -> None:
    # Lent 3 of 4; then inference took the buffer GPU: the buffer is short by one.
    inv = inv_of(("n0", "H100-80GB", 4))
    lent = lend_all(inv, [("n0", 1), ("n0", 2), ("n0", 3)], since=0.0)
    use(inv, "n0", 0)
    early = plan_lending(inv, lent, ON, ON.min_lend_s - 1.0, packer=PACKER)
    assert not early.reclaim and not early.lend and early.surplus == {"H100-80GB": -1}
    late = plan_lending(inv, lent, ON, ON.min_lend_s, packer=PACKER)
    assert reclaimed(late, HYSTERESIS) and len(reclaimed(late)) == 1
    assert not late.lend
    # within the band (surplus 0..hysteresis) nothing moves either way
    inv2 = inv_of(("n0", "H100-80GB", 4))
    lent2 = lend_all(inv2, [("n0", 2), ("n0", 3)])
    use(inv2, "n0", 0)
    steady = plan_lending(inv2, lent2, ON, 10_000.0, packer=PACKER)
    assert not steady.lend and not steady.reclaim and steady.surplus == {"H100-80GB": 0}


# ------------------------------------------------------------------------------------------- block shapes


def test_prefers_whole_idle_nodes_then_nodes_with_most_idle_gpus() -> None:
    inv = inv_of(("a", "H100-80GB", 4), ("b", "H100-80GB", 4), ("c", "H100-80GB", 4), ("d", "H100-80GB", 4))
    use(inv, "a", 0, 1)  # a: 2 idle (one becomes the buffer)
    use(inv, "c", 1)  # c: 3 idle, non-contiguous run 0 | 2,3
    lent = lend_all(inv, [("d", 0), ("d", 1)])  # d: 2 lent + 2 idle = wholly lent once its idle ones go
    plan = plan_lending(inv, lent, ON, 0.0, packer=PACKER)
    order = [(b.node, b.devices) for b in plan.lend]
    # whole nodes first (b idle, d completed), the bigger first; then c's runs, longest first; a's last GPU
    assert order == [("b", (0, 1, 2, 3)), ("d", (2, 3)), ("c", (2, 3)), ("c", (0,)), ("a", (3,))]


def test_min_block_skips_short_runs() -> None:
    policy = LendingPolicy(enabled=True, min_block_gpus=2.0, warm_buffer_gpus=0.0, warm_buffer_fraction=0.0,
                           hysteresis_gpus=0.0)
    inv = inv_of(("a", "H100-80GB", 4))
    use(inv, "a", 1)
    plan = plan_lending(inv, {}, policy, 0.0, packer=PACKER)
    assert [(b.node, b.devices) for b in plan.lend] == [("a", (2, 3))]


def test_whole_nodes_only_lends_and_reclaims_whole_nodes() -> None:
    inv = inv_of(("a", "H100-80GB", 4), ("b", "H100-80GB", 4), ("c", "H100-80GB", 4))
    use(inv, "a", 0)  # a has inference: never lent in pods mode
    plan = plan_lending(inv, {}, ON, 0.0, packer=PACKER, whole_nodes_only=True)
    assert lent_keys(plan) == {("b", i) for i in range(4)} | {("c", i) for i in range(4)}
    # the same cluster per GPU lends a's idle GPUs too (less the buffer)
    assert {k[0] for k in lent_keys(plan_lending(inv, {}, ON, 0.0, packer=PACKER))} == {"a", "b", "c"}

    # b and c lent; a replica needs one GPU more than a can hold: pods mode takes back all of b
    inv = inv_of(("a", "H100-80GB", 4), ("b", "H100-80GB", 4), ("c", "H100-80GB", 4))
    use(inv, "a", 0, 1, 2, 3)
    lent = lend_all(inv, [(n, i) for n in "bc" for i in range(4)], since=100.0)
    need = [NeedRequest(whole_req(), FORECAST)]
    whole = plan_lending(inv, lent, ON, 150.0, packer=PACKER, need=need, whole_nodes_only=True)
    nodes = {b.node for b in whole.reclaim}
    assert len(nodes) == 1 and len(reclaimed(whole)) == 4
    assert {b.reason for b in whole.reclaim} == {FORECAST}
    # per GPU: the need plus the buffer (the trial keeps it free), nothing more
    per_gpu = plan_lending(inv, lent, ON, 150.0, packer=PACKER, need=need)
    assert len(reclaimed(per_gpu, FORECAST)) == 1


# ------------------------------------------------------------------------------------- urgent vs voluntary


def test_forecast_and_shortfall_reclaims_ignore_min_lend_s() -> None:
    inv = inv_of(("a", "H100-80GB", 4))
    lent = lend_all(inv, [("a", 1), ("a", 2), ("a", 3)], since=100.0)
    use(inv, "a", 0)
    need = [NeedRequest(whole_req("s"), SHORTFALL), NeedRequest(whole_req("f"), FORECAST)]
    plan = plan_lending(inv, lent, ON, 101.0, packer=PACKER, need=need)  # lent one second ago
    assert len(reclaimed(plan, SHORTFALL)) == 1 and len(reclaimed(plan, FORECAST)) == 1
    assert plan.needed and set(plan.needed) == reclaimed(plan, SHORTFALL) | reclaimed(plan, FORECAST)
    # the buffer is short as well (no GPU idle); the third lent GPU is young: it stays
    assert len(reclaimed(plan)) == 2 and not plan.lend


def test_trial_uses_unlent_capacity_before_lent_gpus() -> None:
    inv = inv_of(("a", "H100-80GB", 8))
    lent = lend_all(inv, [("a", 4), ("a", 5), ("a", 6), ("a", 7)])
    # 4 unlent idle GPUs: one is the buffer, so 3 replicas fit without a reclaim, the 4th takes a lent GPU
    plan3 = plan_lending(inv, lent, ON, 1.0, packer=PACKER, need=[NeedRequest(whole_req(), FORECAST)] * 3)
    assert not plan3.reclaim
    plan4 = plan_lending(inv, lent, ON, 1.0, packer=PACKER, need=[NeedRequest(whole_req(), FORECAST)] * 4)
    assert len(reclaimed(plan4, FORECAST)) == 1
    # and a need that fits nowhere (the buffer stays out of the trial) is counted, not invented onto GPUs
    plan9 = plan_lending(inv, lent, ON, 1.0, packer=PACKER, need=[NeedRequest(whole_req(), FORECAST)] * 9)
    assert plan9.unplaced == 2 and len(reclaimed(plan9, FORECAST)) == 4


def test_urgent_reclaim_takes_the_cheapest_lent_gpus() -> None:
    inv = inv_of(("a", "H100-80GB", 4), ("b", "H100-80GB", 4), ("c", "H100-80GB", 2))
    use(inv, "a", 0, 1, 2, 3)
    lent = lend_all(inv, [("b", i) for i in range(4)] + [("c", 0), ("c", 1)], since=0.0)
    now = 1000.0
    jobs = [
        Borrower("big-loss", 1, devices=(("b", 0),), started_at=0.0),
        Borrower("late", 1, devices=(("b", 2),), grace_s=ON.max_reclaim_s * 2, started_at=990.0),
        Borrower("small-loss", 1, devices=(("b", 3),), started_at=990.0),
        Borrower("c-job", 2, devices=(("c", 0), ("c", 1)), started_at=500.0),
    ]
    policy = LendingPolicy(enabled=True, warm_buffer_gpus=0.0, warm_buffer_fraction=0.0)

    def taken(n: int) -> list[tuple[str, int]]:
        plan = plan_lending(inv, lent, policy, now, packer=PACKER, borrowers=jobs,
                            need=[NeedRequest(whole_req(), FORECAST)] * n)
        return sorted(plan.needed)

    # b1: nobody trains there; then the least work lost (small-loss before c-job's 2 x 500 s and big-loss's
    # 1000 s); the workload that would stop late comes last
    assert taken(1) == [("b", 1)]
    assert taken(2) == [("b", 1), ("b", 3)]
    assert taken(3) == [("b", 0), ("b", 1), ("b", 3)]
    assert taken(4) == [("b", 0), ("b", 1), ("b", 2), ("b", 3)]


def test_need_that_cannot_use_lent_gpus_reclaims_nothing() -> None:
    inv = inv_of(("a", "A100-80GB", 2, True), ("l", "L4", 4))
    use(inv, "a", 0, 1)
    lent = lend_all(inv, [("l", i) for i in range(4)])
    mig_only = SlotRequest("m", 10.0, compute_fraction=1 / 7, kinds=("mig",))
    plan = plan_lending(inv, lent, ON, 10.0, packer=PACKER, need=[NeedRequest(mig_only, FORECAST)])
    assert not plan.reclaim and plan.unplaced == 1


def test_reclaims_in_flight_are_not_asked_again_and_used_first() -> None:
    inv = inv_of(("a", "H100-80GB", 4))
    use(inv, "a", 0)
    lent = lend_all(inv, [("a", 1), ("a", 2), ("a", 3)])
    need = [NeedRequest(whole_req(), FORECAST)]
    plan = plan_lending(inv, lent, ON, 10.0, packer=PACKER, need=need, reclaiming=[("a", 3)])
    # the GPU already coming back takes the need; the buffer counts it... and nothing else is reclaimed
    assert plan.needed == {("a", 3): FORECAST}
    assert not plan.reclaim and not plan.lend


def test_disabled_reclaims_everything_lent() -> None:
    inv = inv_of(("a", "H100-80GB", 4))
    lent = lend_all(inv, [("a", 2), ("a", 3)])
    plan = plan_lending(inv, lent, LendingPolicy(enabled=False), 0.0, packer=PACKER,
                        borrowers=[Borrower("ns/job", 2, devices=(("a", 2), ("a", 3)))])
    assert [(b.node, b.devices, b.workloads, b.reason) for b in plan.reclaim] == [("a", (2, 3), ("ns/job",), DISABLED)]


def test_hold_lends_nothing_new_but_still_reclaims() -> None:
    inv = inv_of(("a", "H100-80GB", 4), ("b", "H100-80GB", 4))
    assert not plan_lending(inv, {}, ON, 0.0, packer=PACKER, hold=True).lend
    lent = lend_all(inv, [("b", i) for i in range(4)])
    use(inv, "a", 0, 1, 2, 3)
    plan = plan_lending(inv, lent, ON, 0.0, packer=PACKER, hold=True, need=[NeedRequest(whole_req(), FORECAST)])
    assert len(reclaimed(plan, FORECAST)) == 1 and not plan.lend


# ----------------------------------------------------------------------------------------- preemption order


def test_preemption_order_loses_least_work_then_smallest() -> None:
    now = 1000.0
    a = Borrower("a", 4, started_at=0.0, last_checkpoint_at=900.0)  # 4 x 100 = 400 GPU-s at risk
    b = Borrower("b", 1, started_at=500.0)  # no checkpoint: 1 x 500
    c = Borrower("c", 2, started_at=800.0, last_checkpoint_at=900.0)  # 2 x 100 = 200
    d = Borrower("d", 1, started_at=800.0, last_checkpoint_at=800.0)  # 1 x 200 = 200, smaller than c
    assert [x.name for x in preemption_order([a, b, c, d], now)] == ["d", "c", "a", "b"]
    assert Borrower("e", 3).work_at_risk(now) == 0.0


def test_voluntary_reclaim_takes_the_cheapest_gpus() -> None:
    inv = inv_of(("a", "H100-80GB", 8))
    lent = lend_all(inv, [("a", i) for i in range(2, 8)])
    use(inv, "a", 0, 1)  # no idle GPU left: the buffer is short by one
    now = 5000.0
    fresh = Borrower("ns/fresh", 2, devices=(("a", 2), ("a", 3)), started_at=0.0, last_checkpoint_at=4990.0)
    stale = Borrower("ns/stale", 1, devices=(("a", 4),), started_at=0.0, last_checkpoint_at=1000.0)
    plan = plan_lending(inv, lent, ON, now, packer=PACKER, borrowers=[fresh, stale])
    # a lent GPU nobody runs on costs nothing
    assert reclaimed(plan, HYSTERESIS) <= {("a", 5), ("a", 6), ("a", 7)} and len(reclaimed(plan)) == 1
    assert plan.reclaim[0].workloads == ()
    # all lent GPUs busy: the least work lost goes (fresh: 2 GPUs x 10 s), never the stale checkpoint
    busy = [fresh, stale, Borrower("ns/x", 3, devices=(("a", 5), ("a", 6), ("a", 7)), started_at=4000.0)]
    plan = plan_lending(inv, lent, ON, now, packer=PACKER, borrowers=busy)
    (block,) = plan.reclaim
    assert block.workloads == ("ns/fresh",) and block.reason == HYSTERESIS
    # a workload whose grace exceeds the reclaim deadline breaks the contract: its GPUs go first
    rogue = Borrower("ns/rogue", 1, devices=(("a", 4),), grace_s=ON.max_reclaim_s + 1, started_at=0.0)
    plan = plan_lending(inv, lent, ON, now, packer=PACKER, borrowers=[fresh, rogue, busy[2]])
    assert plan.reclaim[0].workloads == ("ns/rogue",)


def test_reclaim_names_every_workload_on_its_gpus_in_preemption_order() -> None:
    inv = inv_of(("a", "H100-80GB", 4))
    use(inv, "a", 0)
    lent = lend_all(inv, [("a", 1), ("a", 2), ("a", 3)])
    jobs = [Borrower("big", 3, nodes=("a",), started_at=0.0), Borrower("small", 1, devices=(("a", 1),),
                                                                      started_at=900.0)]
    need = [NeedRequest(whole_req(gpus=3), FORECAST)]
    plan = plan_lending(inv, lent, ON, 1000.0, packer=PACKER, need=need, borrowers=jobs)
    assert reclaimed(plan, FORECAST) == {("a", 1), ("a", 2), ("a", 3)}
    assert plan.reclaim[0].workloads == ("small", "big")


def test_attribute_spreads_node_level_workloads_over_lent_gpus() -> None:
    lent = [("a", 0), ("a", 1), ("a", 2), ("b", 0)]
    on = attribute([Borrower("x", 2, nodes=("a",)), Borrower("y", 1, nodes=("a", "c")),
                    Borrower("z", 1, devices=(("a", 3), ("b", 0)))], lent)
    assert [b.name for b in on[("a", 0)]] == ["x"] and [b.name for b in on[("a", 1)]] == ["x"]
    assert [b.name for b in on[("a", 2)]] == ["y"] and [b.name for b in on[("b", 0)]] == ["z"]
    assert ("a", 3) not in on  # not lent: not ours


# ---------------------------------------------------------------------------------- hypothesis properties

KINDS = ("H100-80GB", "A100-80GB", "L4")


@st.composite
def cluster_states(draw: st.DrawFn) -> tuple:
    nodes = []
    for i in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(KINDS))
        mig = kind != "L4" and draw(st.booleans())
        nodes.append(NodeSpec(f"n{i}", kind, draw(st.integers(1, 8)), mig))
    inv = Inventory.from_nodes(nodes)
    packer = FirstFitPacker()
    shapes = st.one_of(
        st.builds(lambda g: SlotRequest("w", None, gpus=g, kinds=("whole",)), st.integers(1, 2)),
        st.builds(lambda m, c: SlotRequest("p", float(m), compute_fraction=c), st.integers(5, 40),
                  st.sampled_from((0.1, 0.25, 0.5, 1.0))),
    )
    for n, req in enumerate(draw(st.lists(shapes, max_size=10))):
        slot = packer.place(inv, req)
        if slot is not None:
            inv.allocate(slot, f"{req.model}-{n}")
    idle = sorted(k for k, d in inv.devices.items() if d.idle)
    # often everything idle is lent (then the buffer is short and voluntary reclaims happen)
    lent_list = (idle if draw(st.booleans()) else draw(st.lists(st.sampled_from(idle), unique=True))) if idle else []
    lent = {k: float(draw(st.integers(0, 2000))) for k in lent_list}
    for node, dev in lent_list:
        allocate_lent(inv, node, dev)
    need = draw(st.lists(st.builds(NeedRequest, shapes, st.sampled_from((SHORTFALL, FORECAST))), max_size=8))
    borrowers = []
    for j, k in enumerate(lent_list):
        if draw(st.booleans()):
            borrowers.append(Borrower(f"job{j}", 1, devices=(k,), grace_s=float(draw(st.integers(10, 300))),
                                      started_at=0.0, last_checkpoint_at=float(draw(st.integers(0, 2000)))))
    policy = LendingPolicy(
        enabled=True,
        warm_buffer_gpus=float(draw(st.integers(0, 3))),
        warm_buffer_fraction=draw(st.sampled_from((0.0, 0.1, 0.5))),
        hysteresis_gpus=float(draw(st.integers(0, 3))),
        min_lend_s=float(draw(st.sampled_from((0, 600, 5000)))),
        min_block_gpus=float(draw(st.integers(1, 3))),
    )
    reclaiming = draw(st.lists(st.sampled_from(lent_list), unique=True)) if lent_list else []
    return inv, lent, need, borrowers, policy, reclaiming


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(state=cluster_states(), whole=st.booleans(), hold=st.booleans(), now=st.integers(0, 6000))
def test_plan_invariants(state: tuple, whole: bool, hold: bool, now: int) -> None:
    inv, lent, need, borrowers, policy, reclaiming = state
    before = inv.copy()
    plan = plan_lending(inv, lent, policy, float(now), packer=PACKER, need=need, borrowers=borrowers,
                        whole_nodes_only=whole, hold=hold, reclaiming=reclaiming)
    assert inv == before  # pure: the trial works on a copy
    lends = [(b.node, d) for b in plan.lend for d in b.devices]
    reclaims = [(b.node, d) for b in plan.reclaim for d in b.devices]
    assert len(set(lends)) == len(lends) and len(set(reclaims)) == len(reclaims)
    # a lend names only idle GPUs (no inference allocation, no MIG instance) that are not lent already
    for k in lends:
        assert inv.device(*k).idle and k not in lent
    # reclaims name only lent GPUs, never one whose reclaim is in flight; never lent and reclaimed at once
    assert set(reclaims) <= set(lent) and not set(reclaims) & set(reclaiming)
    assert not set(lends) & set(reclaims)
    if hold:
        assert not lends
    # voluntary reclaims wait for min_lend_s
    for b in plan.reclaim:
        if b.reason == HYSTERESIS:
            assert all(now - lent[(b.node, d)] >= policy.min_lend_s - 1e-9 for d in b.devices)
    # the warm buffer (of what was idle) stays idle and unlent, per GPU kind
    for kind, buf in plan.buffer.items():
        idle = [k for k, d in inv.devices.items() if d.gpu_model == kind and d.idle and k not in lent]
        left = [k for k in idle if k not in set(lends)]
        assert len(left) >= min(buf, len(idle))
    # blocks are long enough; in pods mode whole nodes are lent and reclaimed
    for b in plan.lend:
        assert len(b.devices) >= policy.min_block
        if whole:
            node_lent = {d for (n, d) in lent if n == b.node}
            assert node_lent | set(b.devices) == set(range(inv.nodes[b.node].gpu_count))
    if whole:
        gone = set(reclaims) | set(reclaiming)
        for n in {b.node for b in plan.reclaim}:
            assert {k for k in lent if k[0] == n} <= gone
    # reclaims name workloads only from their GPUs, each in preemption order
    for b in plan.reclaim:
        on = {x.name for x in borrowers if set(x.devices) & {(b.node, d) for d in b.devices}}
        assert set(b.workloads) == on
        rank = {x.name: i for i, x in enumerate(preemption_order(borrowers, float(now)))}
        assert [rank[w] for w in b.workloads] == sorted(rank[w] for w in b.workloads)
    # the lends can be applied: every block is legal on the inventory
    after = inv.copy()
    for node, dev in lends:
        allocate_lent(after, node, dev)


# ------------------------------------------------------------------------------------ the decision core stage

STEP = 10.0
WHOLE = ModelSpec(name="w", slo_latency_ms=1000, max_replicas=50, cold_start_s=60.0)  # whole GPUs, 10 req/s each


@dataclass
class HoldPolicy:
    """Keeps the current count (so only the lend stage's own sizing matters); forecasts like slotwise."""

    wants: dict[str, int] = field(default_factory=dict)
    tick_s: float = 10.0
    name: str = "hold"
    instant_start: bool = False
    uses_forecast: bool = True
    learns: bool = False
    behavior: ScalingBehavior | None = None

    def initial_state(self, spec: ModelSpec, replicas: int) -> int:
        return 0

    def decide(self, ctx: PolicyContext) -> PolicyResult:
        return PolicyResult(self.wants.get(ctx.spec.name, ctx.current_replicas), ctx.state, Reason.REACTIVE)


@dataclass
class RampForecaster:
    """A forecaster that sees a ramp coming: ``low`` req/s within ``near_s``, ``high`` further out (the shape
    of a forecast whose load grows after the policy's own lead time but within the reclaim horizon)."""

    low: float
    high: float
    near_s: float
    levels: tuple[float, ...] = (0.5, 0.9, 0.99)
    step_s: float = 60.0
    calls: int = 0
    failed: dict[str, Exception] = field(default_factory=dict)  # (FleetForecaster's: none fails here)

    def has_history(self, name: str) -> bool:
        return True

    def warm_start(self, history: object, step_s: float) -> None:
        pass

    def sync(self, names: object, priors: object) -> None:
        pass

    def observe(self, now: float, metrics: object, signal: object = None) -> bool:
        return False

    def quantiles(self, name: str, now: float, lead_s: float) -> np.ndarray:
        self.calls += 1
        return np.full(len(self.levels), self.low if lead_s <= self.near_s else self.high)

    def lead_quantiles(self, name: str, now: float, lead_s: float,
                       from_s: float) -> tuple[np.ndarray, np.ndarray | None]:
        return self.quantiles(name, now, lead_s), None  # (no ready window: a scale-up is sized as before)


def window(names: list[str], now: float, rate: float = 1.0, stale: bool = False) -> MetricsWindow:
    return MetricsWindow(now=now, step_s=STEP, models={
        m: ModelMetrics(rate=np.full(30, rate), in_flight=np.full(30, rate * 0.1), stale=stale) for m in names})


def one_replica(inv: Inventory, spec: ModelSpec = WHOLE) -> ModelObservation:
    slot = Slot.whole("a", 0, inv.gpu_of("a"))
    inv.allocate(slot, f"{spec.name}-old0")
    return ModelObservation(spec.name, spec, 1, (Replica(f"{spec.name}-old0", slot, True, 0.0),))


def tick(snap: ClusterSnapshot, state, config: CoreConfig, rate: float = 1.0, stale: bool = False):  # type: ignore[no-untyped-def]
    d = decide(snap, window(list(snap.models), snap.now, rate, stale), state, config)
    return d.plan


def test_forecast_growing_over_the_reclaim_horizon_reclaims_before_the_load_arrives() -> None:
    inv = inv_of(("a", "H100-80GB", 4), ("b", "H100-80GB", 4))
    obs = one_replica(inv)
    lent = lend_all(inv, [("b", i) for i in range(4)], since=990.0)  # lent 10 s ago: young
    policy = HoldPolicy()
    # the policy's lead time is 60 + 10 s; the reclaim horizon 120 s more
    ramp = RampForecaster(low=2.0, high=45.0, near_s=100.0)
    config = CoreConfig(policy=policy, lending=ON)
    state = fresh_state(forecaster=ramp)  # type: ignore[arg-type]
    snap = ClusterSnapshot(now=1000.0, models={"w": obs}, inventory=inv, lent=lent)
    plan = tick(snap, state, config)
    assert not plan.of_type(PlaceReplica)  # the load now is low: the policy adds nothing
    need = min_replicas_for_slo(quantize_up(45.0), profile_from_spec(WHOLE), WHOLE.max_replicas)
    # a holds the replica, the buffer GPU and two more; the rest of the need lands on b's lent GPUs
    expected = need - 1 - 2
    assert expected >= 1
    reclaims = plan.of_type(ReclaimGpus)
    assert sum(len(r.devices) for r in reclaims) == expected
    assert {r.reason for r in reclaims} == {FORECAST} and {r.node for r in reclaims} == {"b"}
    assert all(r.deadline_s == ON.max_reclaim_s for r in reclaims)
    assert not plan.of_type(LendGpus)

    # the next tick the same GPUs are still lent (the reclaim is under way): not asked again
    again = tick(ClusterSnapshot(now=1010.0, models={"w": obs}, inventory=inv, lent=lent), state, config)
    assert not again.of_type(ReclaimGpus)
    # ... unless still lent after the deadline: then asked again
    late = tick(ClusterSnapshot(now=1000.0 + ON.max_reclaim_s + 1, models={"w": obs}, inventory=inv, lent=lent),
                state, config)
    assert sum(len(r.devices) for r in late.of_type(ReclaimGpus)) == expected

    # without the ramp the same cluster reclaims nothing
    flat = RampForecaster(low=2.0, high=2.0, near_s=100.0)
    calm = tick(snap, fresh_state(forecaster=flat), config)  # type: ignore[arg-type]
    assert not calm.of_type(ReclaimGpus)


def test_shortfall_reclaims_lent_gpus_now() -> None:
    inv = inv_of(("a", "H100-80GB", 2), ("b", "H100-80GB", 2))
    obs = one_replica(inv)
    lent = lend_all(inv, [("b", 0), ("b", 1)], since=999.0)
    config = CoreConfig(policy=HoldPolicy(wants={"w": 3}), lending=ON)
    snap = ClusterSnapshot(now=1000.0, models={"w": obs}, inventory=inv, lent=lent)
    plan = tick(snap, fresh_state(forecaster=RampForecaster(2.0, 2.0, 100.0)), config)  # type: ignore[arg-type]
    (short,) = plan.of_type(Shortfall)
    assert short.missing == 1
    # never onto lent GPUs
    assert all(p.slot.node == "a" for p in plan.of_type(PlaceReplica))
    reclaims = plan.of_type(ReclaimGpus)
    assert sum(len(r.devices) for r in reclaims if r.reason == SHORTFALL) == 1


def test_stale_metrics_hold_lending() -> None:
    def run(stale: bool) -> list:
        inv = inv_of(("a", "H100-80GB", 4), ("b", "H100-80GB", 4))
        snap = ClusterSnapshot(now=1000.0, models={"w": one_replica(inv)}, inventory=inv)
        config = CoreConfig(policy=HoldPolicy(), lending=ON)
        plan = tick(snap, fresh_state(forecaster=RampForecaster(2.0, 2.0, 100.0)), config, stale=stale)  # type: ignore[arg-type]
        return plan.of_type(LendGpus)

    assert run(stale=False)
    assert not run(stale=True)


def test_a_model_whose_need_cannot_be_read_holds_new_lending_only(monkeypatch: pytest.MonkeyPatch) -> None:
    # The lend stage works out every model's need over the reclaim horizon; one model's raising there stopped the
    # whole tick (every model's decision with it). Now its need is a guess: nothing new is lent, the plan stands.
    from autoscaler.decision import lend

    def run() -> object:
        inv = inv_of(("a", "H100-80GB", 4), ("b", "H100-80GB", 4))
        models = {"w": one_replica(inv), "v": ModelObservation("v", WHOLE.with_(name="v"), 0)}
        snap = ClusterSnapshot(now=1000.0, models=models, inventory=inv)
        config = CoreConfig(policy=HoldPolicy(wants={"v": 1}), lending=ON)
        return tick(snap, fresh_state(forecaster=RampForecaster(2.0, 2.0, 100.0)), config)  # type: ignore[arg-type]

    healthy = run()
    assert healthy.of_type(LendGpus)  # (what the failure takes away)
    need_soon = lend.need_soon

    def failing(obs, *args, **kwargs):  # type: ignore[no-untyped-def]
        if obs.name == "w":
            raise ValueError("math domain error")
        return need_soon(obs, *args, **kwargs)

    monkeypatch.setattr(lend, "need_soon", failing)
    plan = run()
    assert not plan.of_type(LendGpus)
    assert "w" in plan.stage_failures["lend"] and "ValueError" in plan.stage_failures["lend"]
    models = [a for a in plan.actions if not isinstance(a, (LendGpus, ReclaimGpus))]
    assert models == [a for a in healthy.actions if not isinstance(a, (LendGpus, ReclaimGpus))]
    assert any(isinstance(a, PlaceReplica) and a.model == "v" for a in models)


def test_no_forecast_means_no_lending() -> None:
    inv = inv_of(("a", "H100-80GB", 4))
    snap = ClusterSnapshot(now=1000.0, models={"w": one_replica(inv)}, inventory=inv)
    reactive = HoldPolicy(uses_forecast=False)
    plan = tick(snap, fresh_state(), CoreConfig(policy=reactive, lending=ON))
    assert not plan.of_type(LendGpus)


def test_lending_off_or_absent_changes_nothing() -> None:
    def actions(lending: LendingPolicy | None) -> list:
        inv = inv_of(("a", "H100-80GB", 4), ("b", "H100-80GB", 4))
        snap = ClusterSnapshot(now=1000.0, models={"w": one_replica(inv)}, inventory=inv)
        state = fresh_state(forecaster=RampForecaster(2.0, 2.0, 100.0))  # type: ignore[arg-type]
        d = decide(snap, window(["w"], 1000.0), state, CoreConfig(policy=HoldPolicy(wants={"w": 2}), lending=lending))
        assert d.state.lending is None
        return [type(a).__name__ + repr(a) for a in d.plan.actions]

    assert actions(None) == actions(LendingPolicy(enabled=False))


def test_disabled_with_gpus_still_lent_reclaims_them() -> None:
    inv = inv_of(("a", "H100-80GB", 4))
    obs = one_replica(inv)
    lent = lend_all(inv, [("a", 3)])
    snap = ClusterSnapshot(now=1000.0, models={"w": obs}, inventory=inv, lent=lent, training=(
        TrainingWorkload("ns/t", "Pod", 1, nodes=("a",), running=True),))
    plan = tick(snap, fresh_state(), CoreConfig(policy=HoldPolicy(uses_forecast=False), lending=LendingPolicy()))
    (r,) = plan.of_type(ReclaimGpus)
    assert (r.node, r.devices, r.workloads, r.reason) == ("a", (3,), ("ns/t",), DISABLED)


def test_need_soon_is_computed_once_per_model_decision() -> None:
    inv = inv_of(("a", "H100-80GB", 8))
    obs = one_replica(inv)
    ramp = RampForecaster(2.0, 2.0, 100.0)
    policy = HoldPolicy(tick_s=30.0)
    config = CoreConfig(policy=policy, lending=ON)
    state = fresh_state(forecaster=ramp)  # type: ignore[arg-type]
    counts = []
    for now in (0.0, 10.0, 20.0, 30.0):
        before = ramp.calls
        tick(ClusterSnapshot(now=now, models={"w": obs}, inventory=inv), state, config)
        counts.append(ramp.calls - before)
    # each decision: the policy's forecast and the lend stage's; in between, neither
    assert counts == [2, 0, 0, 2]
    assert isinstance(state.lending, LendState) and state.lending.need["w"].replicas >= 1


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lent_mask=st.lists(st.booleans(), min_size=8, max_size=8), want=st.integers(0, 8),
       high=st.sampled_from((2.0, 30.0, 80.0)))
def test_core_never_places_inference_on_lent_gpus(lent_mask: list[bool], want: int, high: float) -> None:
    inv = inv_of(("a", "H100-80GB", 4), ("b", "H100-80GB", 4))
    keys = [(n, i) for n in "ab" for i in range(4)]
    obs = ModelObservation("w", WHOLE, 0)
    lent = lend_all(inv, [k for k, m in zip(keys, lent_mask, strict=True) if m], since=0.0)
    snap = ClusterSnapshot(now=1000.0, models={"w": obs}, inventory=inv, lent=lent)
    config = CoreConfig(policy=HoldPolicy(wants={"w": want}), lending=ON)
    plan = tick(snap, fresh_state(forecaster=RampForecaster(2.0, high, 100.0)), config)  # type: ignore[arg-type]
    placed = {(p.slot.node, d) for p in plan.of_type(PlaceReplica) for d in p.slot.devices}
    assert not placed & set(lent)
    lends = {(a.node, d) for a in plan.of_type(LendGpus) for d in a.devices}
    reclaims = {(a.node, d) for a in plan.of_type(ReclaimGpus) for d in a.devices}
    assert not lends & placed and not lends & set(lent) and reclaims <= set(lent)
    # requested replicas unplaced only when lent GPUs are being reclaimed for them, or none are left
    for s in plan.of_type(Shortfall):
        assert reclaims or not lent or s.missing > len(lent)
    assert slot_request(WHOLE).memory_gib is None
