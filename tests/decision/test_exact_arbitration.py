"""The in-order arbitration path places its batch again exactly on small MIG clusters when that saves a GPU
(autoscaler/decision/arbitration/exact.py, issue 19): fewer GPUs, the same replicas, team limits kept, and the
packer's placement untouched when the exact one saves nothing or is not allowed."""

from __future__ import annotations

import itertools

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autoscaler.decision.arbitration import ArbitrationPolicy, ArbitrationState, Ask, TeamQuota, arbitrate
from autoscaler.decision.config import CoreConfig, build_core
from autoscaler.policies import make_policy
from sharing.packer import CostAwarePacker
from sharing.slots import Inventory, NodeSpec, SlotRequest
from tests.decision.test_arbitration import NOW, PROFILE

SIZES = st.sampled_from([10.0, 20.0, 40.0])


def mig_request(model: str, memory_gib: float) -> SlotRequest:
    return SlotRequest(model, memory_gib, 0.1, 1, ("mig",))


def ask(model: str, memory_gib: float, n: int, team: str = "t", order: int = 0, speed=None) -> Ask:  # type: ignore[no-untyped-def]
    return Ask(model, team, 0, mig_request(model, memory_gib), float(n), 0, 100, 0.0, PROFILE, 0.95, order=order,
               speed=speed)


def run(asks: list[Ask], budget_s: float, gpus: int = 4, policy: ArbitrationPolicy | None = None):
    inv = Inventory.from_nodes([NodeSpec("n0", "H100-80GB", gpus, True)])
    names = itertools.count()
    team_of = {a.model: a.team for a in asks}
    result = arbitrate(asks, inv, CostAwarePacker(prefer_open_nodes=True), policy or ArbitrationPolicy(), NOW,
                       team_of=team_of, held={}, views=lambda: ({}, []), freeing=[], state=ArbitrationState(),
                       name_replica=lambda m: f"{m}-{next(names)}", exact_budget_s=budget_s)
    return inv, result


def placed_counts(result) -> dict[str, int]:
    return {m: len(v) for m, v in result.placed.items()}


def test_exact_batch_saves_the_gpu_the_packer_opens() -> None:
    # Four 20 GiB and two 40 GiB replicas on H100s: one at a time the packer spreads them over 3 GPUs; the batch
    # fits on 2 (per GPU: 4g.40gb + 2g.20gb ... laid out by the MILP at legal starts).
    asks = [ask("a", 20.0, 4, order=0), ask("b", 40.0, 2, order=1)]
    greedy_inv, greedy = run(asks, 0.0)
    exact_inv, exact = run(asks, 2.0)
    assert greedy_inv.gpus_in_use() == 3
    assert exact_inv.gpus_in_use() == 2
    assert placed_counts(exact) == placed_counts(greedy) == {"a": 4, "b": 2}
    assert not exact.shortfalls
    # The result names exactly the inventory's allocations, each once, under the ids the tick handed out.
    owners = {o for o, _ in exact_inv.allocations()}
    assert owners == {o for v in exact.placed.values() for o, _ in v}
    for model, replicas in exact.placed.items():
        for owner, slot in replicas:
            assert exact_inv.model_of(owner) == model
            assert slot.memory_gib >= {"a": 20.0, "b": 40.0}[model]
    # Anti-affinity as the packer keeps it: no model with all its replicas on one device.
    for model in ("a", "b"):
        assert len({s.devices for _, s in exact.placed[model]}) > 1


def test_a_tick_whose_exact_step_hit_its_safety_cut_says_so() -> None:
    # The exact solve is bounded by its work limit; the wall clock is only a safety cut, and a tick where it fired
    # counts it (Plan.exact_budget_exceeded, slotwise_exact_budget_exceeded_total): its plan is the machine's, not
    # the snapshot's alone. The packer's placement stands.
    asks = [ask("a", 20.0, 4, order=0), ask("b", 40.0, 2, order=1)]
    greedy_inv, greedy = run(asks, 0.0)  # (the exact step off: nothing tried, nothing cut)
    assert greedy.exact_budget_exceeded == 0
    cut_inv, cut = run(asks, 1e-9)
    assert cut.exact_budget_exceeded == 1 and cut_inv == greedy_inv
    _, exact = run(asks, 30.0)
    assert exact.exact_budget_exceeded == 0


def test_asks_with_a_slot_speed_are_placed_exactly_too() -> None:
    # The slotwise policy always sets a slot speed (what a replica on that slot is worth): the exact step runs for
    # it, and saves the GPU when every slot is worth one replica.
    asks = [ask("a", 20.0, 4, order=0, speed=lambda s: 1.0), ask("b", 40.0, 2, order=1, speed=lambda s: 1.0)]
    greedy_inv, _ = run(asks, 0.0)
    exact_inv, exact = run(asks, 2.0)
    assert (greedy_inv.gpus_in_use(), exact_inv.gpus_in_use()) == (3, 2) and not exact.shortfalls


def unit_of(slot) -> float:  # type: ignore[no-untyped-def]
    """A speed that depends on where the slice sits: the MILP, which knows no speeds, may pick a slower one."""
    return 1.0 if (slot.start or 0) % 4 == 0 else 0.6


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(SIZES, st.integers(1, 3)), min_size=1, max_size=3), st.integers(2, 4))
def test_the_exact_placement_never_gives_a_model_less_capacity(spec: list[tuple[float, int]], gpus: int) -> None:
    asks = [ask(f"m{i}", mem, n, order=i, speed=unit_of) for i, (mem, n) in enumerate(spec)]
    _, greedy = run(asks, 0.0, gpus)
    _, exact = run(asks, 0.3, gpus)
    for a in asks:
        had = sum(unit_of(s) for _, s in greedy.placed.get(a.model, []))
        got = sum(unit_of(s) for _, s in exact.placed.get(a.model, []))
        assert got >= min(had, a.wanted) - 1e-9


def test_a_batch_the_packer_cannot_fit_is_placed_exactly() -> None:
    # Seven 10 GiB and two 40 GiB replicas on 2 H100s: one at a time the packer spreads the small ones so that the
    # second 40 GiB finds no 4-slice run left; the MILP lays both GPUs out as 3g.40gb + 4 x 1g.10gb.
    asks = [ask("a", 10.0, 4, order=0), ask("b", 10.0, 3, order=1), ask("c", 40.0, 2, order=2)]
    _, greedy = run(asks, 0.0, gpus=2)
    inv, exact = run(asks, 2.0, gpus=2)
    assert [(s.model, s.missing) for s in greedy.shortfalls] == [("c", 1)]
    assert not exact.shortfalls
    assert placed_counts(exact) == {"a": 4, "b": 3, "c": 2}
    assert {o for o, _ in inv.allocations()} == {o for v in exact.placed.values() for o, _ in v}
    for model in ("a", "b", "c"):
        assert len({s.devices for _, s in exact.placed[model]}) > 1


def test_a_team_limit_the_exact_slots_would_pass_keeps_the_packers_placement() -> None:
    # Four 40 GiB and two 20 GiB replicas on 4 H100s: the exact placement saves a GPU but charges more
    # GPU-equivalents (larger slices) than the packer's slots; at a limit of exactly what those charge it is refused.
    asks = [ask("a", 40.0, 4, order=0), ask("b", 20.0, 2, order=1)]
    greedy_inv, greedy = run(asks, 0.0)
    free_inv, free = run(asks, 2.0)
    charged = greedy.team_gpus["t"]
    assert free_inv.gpus_in_use() < greedy_inv.gpus_in_use() and free.team_gpus["t"] > charged + 1e-9
    policy = ArbitrationPolicy(teams=(TeamQuota("t", guaranteed_gpus=charged, borrowing_limit_gpus=0.0),))
    inv, result = run(asks, 2.0, policy=policy)
    assert placed_counts(result) == {"a": 4, "b": 2} and not result.shortfalls
    assert result.team_gpus["t"] <= charged + 1e-9
    assert inv.gpus_in_use() == greedy_inv.gpus_in_use()


def test_the_packers_placement_stands_when_the_exact_one_saves_nothing() -> None:
    # Two 10 GiB replicas of a model kept on two GPUs (anti-affinity), one 10 GiB of another beside one of them:
    # nothing to save, so the packer's slots stand (the exact placement may lay them out otherwise).
    asks = [ask("a", 10.0, 2, order=0), ask("b", 10.0, 1, order=1)]
    greedy_inv, greedy = run(asks, 0.0)
    exact_inv, exact = run(asks, 2.0)
    assert exact.placed == greedy.placed
    assert exact_inv.gpus_in_use() == greedy_inv.gpus_in_use() == 2


def test_the_shipped_core_has_the_exact_step_on() -> None:
    core = build_core(make_policy("slotwise"))
    assert core.exact_budget_s > 0
    assert build_core(make_policy("slotwise"), exact_budget_s=0.0).exact_budget_s == 0.0
    try:
        CoreConfig(policy=make_policy("slotwise"), exact_budget_s=-1.0)
    except ValueError as e:
        assert "exact_budget_s" in str(e)
    else:
        raise AssertionError("a negative budget was accepted")



@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(SIZES, st.integers(1, 4)), min_size=1, max_size=3), st.integers(1, 4))
def test_exact_never_places_fewer_replicas_nor_uses_more_gpus(spec: list[tuple[float, int]], gpus: int) -> None:
    asks = [ask(f"m{i}", mem, n, order=i) for i, (mem, n) in enumerate(spec)]
    greedy_inv, greedy = run(asks, 0.0, gpus)
    exact_inv, exact = run(asks, 0.3, gpus)
    # Allocations and the result agree, and no device is over-committed (the Inventory checks every allocation).
    assert sum(1 for _ in exact_inv.allocations()) == sum(len(v) for v in exact.placed.values())
    if not greedy.shortfalls:
        assert not exact.shortfalls and placed_counts(exact) == placed_counts(greedy)
        assert exact_inv.gpus_in_use() <= greedy_inv.gpus_in_use()
    else:
        assert sum(placed_counts(exact).values()) >= sum(placed_counts(greedy).values())
        if exact.shortfalls:  # the MILP found no full placement: the ranked path's, exactly as without it
            assert placed_counts(exact) == placed_counts(greedy)


class AnnouncingPacker(CostAwarePacker):
    """Records what the tick announced to the host-aware tie-break."""

    def __init__(self) -> None:
        super().__init__(prefer_open_nodes=True)
        self.announced: list[list[SlotRequest] | None] = []

    def host_workload(self, reqs):  # type: ignore[no-untyped-def]
        self.announced.append(None if reqs is None else list(reqs))
        super().host_workload(reqs)


def test_the_tick_announces_its_asks_to_the_host_tie_break_and_clears_them() -> None:
    inv = Inventory.from_nodes([NodeSpec("n0", "H100-80GB", 4, True, cpu_millis=64_000, host_memory_gib=512.0)])
    packer = AnnouncingPacker()
    asks = [ask("a", 20.0, 2, order=0), ask("b", 40.0, 1, order=1)]
    arbitrate(asks, inv, packer, ArbitrationPolicy(), NOW, team_of={"a": "t", "b": "t"}, held={},
              views=lambda: ({}, []), freeing=[], state=ArbitrationState(),
              name_replica=lambda m: f"{m}-x{len(list(inv.allocations()))}")
    first, last = packer.announced[0], packer.announced[-1]
    assert first is not None and sorted(r.model for r in first) == ["a", "a", "b"]
    assert last is None  # nothing of this tick is left for the next caller
