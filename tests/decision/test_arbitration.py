"""Arbitration among models when GPUs run out (autoscaler/decision/arbitration/): quotas, priorities, SLO damage,
preemption and its reasons. Unit cases for each rule, and properties over random clusters and asks."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autoscaler.api.plan import GRANTS, PreemptionReason, ShortfallCause
from autoscaler.api.spec import ModelSpec
from autoscaler.decision.arbitration import (
    ArbitrationPolicy,
    ArbitrationState,
    Ask,
    Candidate,
    ModelLoad,
    TeamQuota,
    arbitrate,
    held_by_team,
)
from autoscaler.estimation.capacity import min_replicas_for_slo, profile_from_spec
from sharing.lending import LENT_MODEL, lent_owner, lent_slot
from sharing.packer import CostAwarePacker
from sharing.slots import Inventory, NodeSpec, Slot, SlotRequest

NOW = 10_000.0
SPEC = ModelSpec(name="m", slo_latency_ms=1000, slo_percentile=95, service_time_ms=200)
PROFILE = profile_from_spec(SPEC)
WHOLE = SlotRequest("x", None, 1.0, 1, ("whole",))


def need(rate: float) -> int:
    return min_replicas_for_slo(rate, PROFILE)


class World:
    """A cluster with running replicas of several models, and the arbitration inputs built from it."""

    def __init__(self, gpus: int = 4, policy: ArbitrationPolicy | None = None) -> None:
        self.inv = Inventory.from_nodes([NodeSpec("n0", "H100-80GB", gpus, False)])
        self.policy = policy or ArbitrationPolicy()
        self.teams: dict[str, str] = {}
        self.priority: dict[str, int] = {}
        self.replicas: dict[str, list[tuple[str, Slot, float]]] = {}
        self.rate: dict[str, float] = {}
        self.floor: dict[str, int] = {}
        self.seq = itertools.count()
        self.draining: list[tuple[str, Slot]] = []

    def model(self, name: str, team: str = "t", priority: int = 0, rate: float = 0.0, floor: int = 0) -> None:
        self.teams[name], self.priority[name], self.rate[name], self.floor[name] = team, priority, rate, floor
        self.replicas.setdefault(name, [])

    def run(self, name: str, n: int, started_at: float = 0.0, req: SlotRequest = WHOLE) -> None:
        packer = CostAwarePacker()
        for _ in range(n):
            slot = packer.place(self.inv, SlotRequest(name, req.memory_gib, req.compute_fraction, req.gpus, req.kinds))
            assert slot is not None
            rid = f"{name}-{next(self.seq)}"
            self.inv.allocate(slot, rid, model=name)
            self.replicas[name].append((rid, slot, started_at))

    def drain(self, name: str) -> None:
        rid, slot, _ = self.replicas[name].pop()
        self.draining.append((rid, slot))

    def ask(self, name: str, wanted: int, req: SlotRequest = WHOLE, order: int = 0) -> Ask:
        current = len(self.replicas[name])
        rate = self.rate[name]
        return Ask(name, self.teams[name], self.priority[name],
                   SlotRequest(name, req.memory_gib, req.compute_fraction, req.gpus, req.kinds), float(wanted),
                   current, 100, rate, PROFILE, 0.95, order=order, expected_rps=rate)

    def arbitrate(self, *asks: Ask, state: ArbitrationState | None = None):
        loads = {m: ModelLoad(self.rate[m], PROFILE, 0.95, len(self.replicas[m]), self.floor[m], self.rate[m])
                 for m in self.teams}
        candidates = [Candidate(m, self.teams[m], self.priority[m], rid, slot, t)
                      for m, reps in self.replicas.items() for rid, slot, t in reps]
        names = itertools.count()
        return arbitrate(list(asks), self.inv, CostAwarePacker(), self.policy, NOW, team_of=self.teams,
                         held=held_by_team(candidates), views=lambda: (loads, list(candidates)),
                         freeing=list(self.draining), state=state or ArbitrationState(),
                         name_replica=lambda m: f"{m}-new{next(names)}")


def causes(result) -> dict[str, list[ShortfallCause]]:
    out: dict[str, list[ShortfallCause]] = {}
    for s in result.shortfalls:
        out.setdefault(s.model, []).append(s.cause)
    return out


# ----------------------------------------------------------------------------------------------- free capacity


def test_a_model_that_would_miss_its_slo_gets_free_gpus_before_headroom_of_a_higher_priority() -> None:
    w = World(gpus=1)
    w.model("top", priority=100, rate=1.0)
    w.model("low", priority=0, rate=4 * need(4.0))  # far below what it needs
    w.run("top", need(1.0))
    w.run("low", 0)
    w.inv = Inventory.from_nodes([NodeSpec("n0", "H100-80GB", 1 + need(1.0), False)])
    w.replicas["top"] = []
    w.run("top", need(1.0))
    r = w.arbitrate(w.ask("top", 1, order=0), w.ask("low", 1, order=1))
    assert [m for m in r.placed] == ["low"]
    assert causes(r)["top"] == [ShortfallCause.UNPLACEABLE]


def test_equal_models_split_the_last_gpus_by_slo_damage() -> None:
    w = World(gpus=4)
    w.model("a", rate=3.0)
    w.model("b", rate=3.0)
    r = w.arbitrate(w.ask("a", need(3.0), order=0), w.ask("b", need(3.0), order=1))
    assert len(r.placed["a"]) == len(r.placed["b"]) == 2


def test_between_equal_teams_the_one_that_borrowed_less_lately_goes_first() -> None:
    for lately, winner in ((("a", 5000.0), ("b", 100.0)), "y"), ((("a", 100.0), ("b", 5000.0)), "x"):
        w = World(gpus=1)
        w.model("x", team="a", rate=3.0)
        w.model("y", team="b", rate=3.0)
        state = ArbitrationState(borrowed=dict(lately), at=NOW)
        r = w.arbitrate(w.ask("x", 1, order=0), w.ask("y", 1, order=1), state=state)
        assert list(r.placed) == [winner]


def test_borrowing_is_remembered_and_forgotten_with_the_half_life() -> None:
    policy = ArbitrationPolicy(teams=(TeamQuota("a", 1.0),), fairness_half_life_s=600.0)
    w = World(gpus=4, policy=policy)
    w.model("x", team="a", rate=3.0)
    w.run("x", 3)  # 2 GPUs above the guarantee
    state = ArbitrationState()
    w.arbitrate(state=state)
    assert state.borrowed == {}  # the first look only sets the clock
    state.at = NOW - 600.0
    w.arbitrate(state=state)
    assert state.borrowed["a"] == pytest.approx(2.0 * 600.0)
    state.at = NOW - 600.0
    w.replicas["x"] = w.replicas["x"][:1]  # back inside its guarantee: the memory halves every 600 s
    w.arbitrate(state=state)
    assert state.borrowed["a"] == pytest.approx(600.0)


def test_a_team_inside_its_guarantee_is_served_first_and_a_team_never_passes_its_limit() -> None:
    policy = ArbitrationPolicy(teams=(TeamQuota("g", guaranteed_gpus=2), TeamQuota("b", 0.0, 1.0)))
    w = World(gpus=4, policy=policy)
    w.model("big", team="b", priority=100, rate=50.0)
    w.model("small", team="g", priority=0, rate=50.0)
    r = w.arbitrate(w.ask("big", 4, order=0), w.ask("small", 4, order=1))
    assert len(r.placed["small"]) == 3 and len(r.placed["big"]) == 1  # 2 guaranteed, then the shared GPU by damage
    big = [s for s in r.shortfalls if s.model == "big"]
    assert [s.cause for s in big] == [ShortfallCause.BORROWING_LIMIT] and big[0].missing == 3
    assert r.team_gpus["b"] == pytest.approx(1.0)


def test_partition_mode_caps_each_team_at_its_scaled_share() -> None:
    policy = ArbitrationPolicy(mode="partition", teams=(TeamQuota("a", 1.0), TeamQuota("b", 1.0)))
    w = World(gpus=4, policy=policy)
    w.model("x", team="a", rate=50.0)
    w.model("y", team="b", rate=1.0)
    r = w.arbitrate(w.ask("x", 4), w.ask("y", 1))
    assert len(r.placed["x"]) == 2  # 4 GPUs x 1/2
    assert causes(r)["x"] == [ShortfallCause.BORROWING_LIMIT]
    assert not r.preemptions


# ------------------------------------------------------------------------------------------------- preemption


def test_a_higher_priority_model_that_would_miss_preempts_the_least_harmful_lower_priority_replica() -> None:
    w = World(gpus=3)
    w.model("top", priority=100, rate=2 * need(1.0) + 5.0)
    w.model("low", priority=10, rate=1.0)
    w.model("mid", priority=50, rate=30.0)
    w.run("low", 2)  # one of them spare: it meets its SLO with one
    w.run("mid", 1)
    r = w.arbitrate(w.ask("top", 1))
    (p,) = r.preemptions
    assert (p.model, p.preempted_by, p.reason) == ("low", "top", PreemptionReason.PRIORITY)
    assert "priority 100 > 10" in p.message and "top" in p.message
    assert causes(r)["top"] == [ShortfallCause.PREEMPTING]
    assert not r.placed  # it starts once the victim has drained


def test_no_preemption_for_headroom_nor_below_a_floor_nor_of_young_replicas() -> None:
    w = World(gpus=2)
    w.model("top", priority=100, rate=0.5)
    w.model("low", priority=0, rate=1.0, floor=0)
    w.run("top", need(0.5))
    w.run("low", 2 - need(0.5))
    assert causes(w.arbitrate(w.ask("top", 1)))["top"] == [ShortfallCause.HEADROOM]
    w.rate["top"] = 40.0  # now it misses
    w.floor["low"] = len(w.replicas["low"])
    assert causes(w.arbitrate(w.ask("top", 1)))["top"] == [ShortfallCause.UNPLACEABLE]
    w.floor["low"] = 0
    w.replicas["low"] = [(rid, slot, NOW - 10.0) for rid, slot, _ in w.replicas["low"]]
    assert causes(w.arbitrate(w.ask("top", 1)))["top"] == [ShortfallCause.MIN_RUNTIME]


def test_a_team_inside_its_guarantee_reclaims_from_a_borrower_of_any_priority() -> None:
    policy = ArbitrationPolicy(teams=(TeamQuota("g", 2.0), TeamQuota("b", 1.0)))
    w = World(gpus=4, policy=policy)
    w.model("mine", team="g", priority=0, rate=40.0)
    w.model("theirs", team="b", priority=100, rate=1.0)
    w.run("theirs", 4, started_at=NOW)  # young: a guarantee reclaim does not wait for the minimum runtime
    r = w.arbitrate(w.ask("mine", 3))
    assert [p.reason for p in r.preemptions] == [PreemptionReason.GUARANTEE] * 2
    assert {p.model for p in r.preemptions} == {"theirs"}
    assert causes(r)["mine"] == [ShortfallCause.PREEMPTING] * 2 + [ShortfallCause.UNPLACEABLE]


def test_lent_gpus_are_reclaimed_before_any_inference_is_preempted() -> None:
    w = World(gpus=2)
    w.model("top", priority=100, rate=40.0)
    w.model("low", priority=0, rate=0.1)
    w.run("low", 1)
    ((_, idle),) = [k for k, d in w.inv.devices.items() if d.idle]
    w.inv.allocate(lent_slot(w.inv, "n0", idle), lent_owner("n0", idle), model=LENT_MODEL)
    r = w.arbitrate(w.ask("top", 1))
    assert not r.preemptions
    assert causes(r)["top"] == [ShortfallCause.RECLAIMING]


def test_capacity_already_draining_is_waited_for_not_preempted_again() -> None:
    w = World(gpus=2)
    w.model("top", priority=100, rate=40.0)
    w.model("low", priority=0, rate=0.1)
    w.run("low", 2)
    w.drain("low")
    r = w.arbitrate(w.ask("top", 1))
    assert not r.preemptions
    assert causes(r)["top"] == [ShortfallCause.PREEMPTING]


def test_room_a_tick_preempts_of_a_team_counts_against_its_limit_no_more() -> None:
    # The example hypothesis found: team a (guarantee 0, borrowing limit 1) holds three 2g MIG slices (6/7 GPU)
    # and asks for a fourth; team b's higher-priority model needs a whole GPU and preempts a's slice on GPU 1.
    # a's new slice on GPU 0 keeps it at 6/7: the preempted replica drains and no longer counts, like any
    # replica being removed. 6/7 held + 2/7 placed > 1 only counts the drained slice twice.
    mig = SlotRequest("x", 20.0, 2 / 7, 1, ("mig", "share"))

    def world() -> World:
        policy = ArbitrationPolicy(teams=(TeamQuota("a", 0.0, 1.0),), min_runtime_s=0.0, max_preemptions_per_tick=1)
        w = World(gpus=2, policy=policy)
        w.inv = Inventory.from_nodes([NodeSpec("n0", "H100-80GB", 2, True)])
        w.model("small", team="a", rate=0.0)
        w.model("other", team="a", rate=0.0)
        w.model("whole", team="b", priority=10, rate=1.0)
        w.run("small", 2, req=mig)
        w.run("other", 1, req=mig)
        assert sorted(s.devices for _, s, _ in w.replicas["small"]) == [(0,), (1,)]  # GPU 1 holds one slice
        return w

    w = world()
    r = w.arbitrate(w.ask("small", 1, mig, order=0), w.ask("whole", 1, order=1))
    (p,) = r.preemptions
    assert (p.model, p.preempted_by, p.reason) == ("small", "whole", PreemptionReason.PRIORITY)
    ((_, placed),) = r.placed["small"]
    assert placed.devices == (0,) and placed.gpu_fraction == pytest.approx(2 / 7)
    assert r.team_gpus["a"] == pytest.approx(6 / 7)  # 6/7 - 2/7 preempted + 2/7 placed
    assert causes(r)["whole"] == [ShortfallCause.PREEMPTING]
    # a slice more would pass the limit: refused, however much room the tick frees
    w = world()
    r = w.arbitrate(w.ask("small", 2, mig, order=0), w.ask("whole", 1, order=1))
    assert len(r.placed["small"]) == 1 and causes(r)["small"] == [ShortfallCause.BORROWING_LIMIT]
    assert r.team_gpus["a"] == pytest.approx(6 / 7)


def test_the_priority_baseline_preempts_for_headroom_too() -> None:
    w = World(gpus=2, policy=ArbitrationPolicy(mode="priority"))
    w.model("top", priority=100, rate=0.1)
    w.model("low", priority=0, rate=0.1)
    w.run("top", 1)
    w.run("low", 1)
    r = w.arbitrate(w.ask("top", 1))
    assert [p.model for p in r.preemptions] == ["low"]


def test_a_model_that_misses_only_at_its_forecast_tail_takes_only_spare_replicas() -> None:
    w = World(gpus=3)
    w.model("top", priority=100, rate=40.0)
    w.model("low", priority=0, rate=30.0)
    w.run("top", 1)
    w.run("low", 2)  # both needed by low at its expected load
    ask = w.ask("top", 1)
    ask.expected_rps = 0.01  # it expects nearly nothing: only the tail of its forecast needs a replica
    r = w.arbitrate(ask)
    assert not r.preemptions and causes(r)["top"] == [ShortfallCause.HEADROOM]


def test_settings_are_validated_with_the_key_named() -> None:
    with pytest.raises(ValueError, match="mode"):
        ArbitrationPolicy(mode="fair")
    with pytest.raises(ValueError, match=r"teams\[1\]: unknown key\(s\) guaranteed"):
        ArbitrationPolicy.from_mapping({}, [{"name": "a"}, {"name": "b", "guaranteed": 1}])
    with pytest.raises(ValueError, match="guaranteed_gpus"):
        ArbitrationPolicy.from_mapping({}, [{"name": "a", "guaranteed_gpus": -1}])
    with pytest.raises(ValueError, match="listed twice"):
        ArbitrationPolicy.from_mapping({}, [{"name": "a"}, {"name": "a"}])
    with pytest.raises(ValueError, match="unknown key"):
        ArbitrationPolicy.from_mapping({"preempt": True})
    p = ArbitrationPolicy.from_mapping({"mode": "priority"}, [{"name": "a", "guaranteed_gpus": 2}])
    assert p.quota("a").limit_gpus == math.inf and p.quota("zz").guaranteed_gpus == 0.0


# ------------------------------------------------------------------------------------------------- properties

REQS = [WHOLE, SlotRequest("x", 20.0, 2 / 7, 1, ("mig", "share")), SlotRequest("x", 8.0, 0.125, 1, ("share",))]


@st.composite
def worlds(draw):
    teams = ("a", "b", "c")
    quotas = tuple(TeamQuota(t, draw(st.sampled_from([0.0, 1.0, 2.0])),
                             draw(st.sampled_from([None, 0.0, 1.0, 3.0]))) for t in teams)
    policy = ArbitrationPolicy(mode=draw(st.sampled_from(["slo", "priority", "partition"])), teams=quotas,
                               min_runtime_s=draw(st.sampled_from([0.0, 300.0])),
                               max_preemptions_per_tick=draw(st.integers(0, 4)))
    w = World(gpus=draw(st.integers(1, 4)), policy=policy)
    w.inv = Inventory.from_nodes([NodeSpec("n0", "H100-80GB", len(w.inv.devices), True)])
    asks = []
    for i in range(draw(st.integers(1, 5))):
        name = f"m{i}"
        req = draw(st.sampled_from(REQS))
        w.model(name, team=draw(st.sampled_from(teams)), priority=draw(st.sampled_from([0, 10, 100])),
                rate=draw(st.sampled_from([0.0, 1.0, 10.0, 60.0])), floor=draw(st.integers(0, 1)))
        for _ in range(draw(st.integers(0, 3))):
            slot = CostAwarePacker().place(w.inv, SlotRequest(name, req.memory_gib, req.compute_fraction,
                                                              req.gpus, req.kinds))
            if slot is not None:
                rid = f"{name}-{next(w.seq)}"
                w.inv.allocate(slot, rid, model=name)
                w.replicas[name].append((rid, slot, draw(st.sampled_from([0.0, NOW]))))
        if draw(st.booleans()):
            asks.append(w.ask(name, draw(st.integers(1, 4)), req, order=i))
    return w, asks


def limit_of(policy: ArbitrationPolicy, q: TeamQuota, gpus: int) -> float:
    """The most a team may hold: its guarantee + borrowing limit; in partition mode its guarantee scaled to the
    cluster."""
    if policy.mode != "partition":
        return q.limit_gpus
    total = sum(t.guaranteed_gpus for t in policy.teams)
    return q.guaranteed_gpus * gpus / total if total > 0 else 0.0


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(worlds())
def test_arbitration_invariants(case) -> None:
    w, asks = case
    held_before = {t: 0.0 for t in ("a", "b", "c")}
    for m, reps in w.replicas.items():
        held_before[w.teams[m]] += sum(s.gpu_fraction for _, s, _ in reps)
    r = w.arbitrate(*asks)
    policy = w.policy
    # every shortfall and preemption says why
    assert all(s.cause and s.reason for s in r.shortfalls)
    assert all(p.preempted_by and p.reason and p.message for p in r.preemptions)
    assert len(r.preemptions) <= policy.max_preemptions_per_tick
    prio = w.priority
    by_model: dict[str, int] = {}
    for p in r.preemptions:
        by_model[p.model] = by_model.get(p.model, 0) + 1
        assert p.model != p.preempted_by
        if p.reason == PreemptionReason.PRIORITY:
            assert prio[p.model] < prio[p.preempted_by]  # never an equal or higher priority for priority
        else:
            assert w.teams[p.model] != w.teams[p.preempted_by]
    assert policy.mode != "partition" or not r.preemptions
    for m, n in by_model.items():
        assert len(w.replicas[m]) - n >= w.floor[m]  # never below a model's floor
    # a victim's team is never taken below its guarantee
    lost = {t: 0.0 for t in held_before}
    for p in r.preemptions:
        slot = next(s for rid, s, _ in w.replicas[p.model] if rid == p.replica_id)
        lost[w.teams[p.model]] += slot.gpu_fraction
    for q in policy.teams:
        if lost[q.name] > 0:  # what it holds after the tick (placements and grants included)
            assert r.team_gpus[q.name] >= q.guaranteed_gpus - 1e-9
    # placements fit (the inventory accepted them) and no team passes its limit through them. A team's holding
    # after the tick is what it held, less what this tick preempts of it (a preempted replica drains: like any
    # replica being removed it no longer counts, autoscaler/decision/core.py `_arbitrate`), plus what it is placed
    # -- a team may take, for one model, room freed by preempting another of its replicas (the regression test
    # below) -- and plus the slots granted to it on capacity being freed (counted in ``team_gpus``).
    gained = {t: 0.0 for t in held_before}
    for m, placed in r.placed.items():
        gained[w.teams[m]] += sum(s.gpu_fraction for _, s in placed)
    granted = {t: sum(s.missing for s in r.shortfalls if s.team == t and s.cause in GRANTS) for t in held_before}
    for q in policy.teams:
        after = held_before[q.name] - lost[q.name] + gained[q.name]
        assert r.team_gpus[q.name] >= after - 1e-9  # grants only add to what it holds
        if gained[q.name] > 0 or granted[q.name] > 0:
            assert r.team_gpus[q.name] <= limit_of(policy, q, len(w.inv.devices)) + 1e-9
    # what was asked is accounted for: placed + granted-waiting + refused covers every ask
    for a in asks:
        got = len(r.placed.get(a.model, ())) + sum(s.missing for s in r.shortfalls if s.model == a.model)
        assert got >= min(int(a.wanted), a.max_new)
        waiting = sum(s.missing for s in r.shortfalls if s.model == a.model and s.cause in GRANTS)
        assert waiting <= int(a.wanted)
