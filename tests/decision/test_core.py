"""The pure decision core (autoscaler/decision/core.py): snapshot + metrics + state -> plan.

Policies are forced with a tiny fake that returns whatever count the test sets, so each test controls
exactly what the rails, the packer and the action emission see.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import numpy as np
import pytest

from autoscaler.api.plan import (
    PlaceReplica,
    Plan,
    Reason,
    RemoveReplica,
    ScaleModel,
    Shortfall,
    ShortfallCause,
    UpdateStatus,
)
from autoscaler.api.snapshot import ClusterSnapshot, MetricsWindow, ModelMetrics, ModelObservation, Replica
from autoscaler.api.spec import ModelSpec, SpecError, SpecProblem, slot_request
from autoscaler.decision.config import CoreConfig
from autoscaler.decision.core import decide
from autoscaler.decision.state import fresh_state
from autoscaler.policies import make_policy
from autoscaler.policies.base import PolicyContext, PolicyResult, ScalingBehavior
from sharing.cluster import nodes_from_spec
from sharing.packer import FirstFitPacker
from sharing.slots import Inventory, Slot, SlotKind

STEP = 10.0
SLICE = ModelSpec(name="a", slo_latency_ms=1000, gpu_memory_gib=20, gpu_compute_share=0.25, max_replicas=50)
WHOLE = ModelSpec(name="w", slo_latency_ms=1000, max_replicas=50)  # no memory figure: whole GPUs


@dataclass
class FakePolicy:
    """Returns ``wants[model]`` (default: the current count); records every context it is asked about."""

    wants: dict[str, int] = field(default_factory=dict)
    tick_s: float = 10.0
    reason: Reason = Reason.REACTIVE
    name: str = "fake"
    instant_start: bool = False
    uses_forecast: bool = False
    learns: bool = False
    behavior: ScalingBehavior | None = None
    calls: list[tuple[float, str]] = field(default_factory=list)

    def initial_state(self, spec: ModelSpec, replicas: int) -> int:
        return 0

    def decide(self, ctx: PolicyContext) -> PolicyResult:
        self.calls.append((ctx.now, ctx.spec.name))
        want = self.wants.get(ctx.spec.name, ctx.current_replicas)
        return PolicyResult(want, ctx.state + 1, self.reason, f"fake wants {want}")


def inventory(spec: str = "8xH100-80GB:mig") -> Inventory:
    return Inventory.from_nodes(nodes_from_spec(spec))


def metrics(names: list[str], rate: float = 5.0, n: int = 30, stale: bool = False, now: float = 0.0) -> MetricsWindow:
    return MetricsWindow(
        now=now,
        step_s=STEP,
        models={m: ModelMetrics(rate=np.full(n, rate), in_flight=np.full(n, rate * 0.1), stale=stale) for m in names},
    )


def place_existing(inv: Inventory, spec: ModelSpec, started: list[tuple[float, bool]]) -> tuple[Replica, ...]:
    """Allocate replicas of ``spec`` on ``inv`` (first fit), with (started_at, ready) each."""
    packer = FirstFitPacker()
    out = []
    for n, (t, ready) in enumerate(started):
        slot = packer.place(inv, slot_request(spec))
        assert slot is not None
        rid = f"{spec.name}-old{n}"
        inv.allocate(slot, rid)
        out.append(Replica(rid, slot, ready=ready, started_at=t))
    return tuple(out)


def obs(spec: ModelSpec, replicas: tuple[Replica, ...] = ()) -> ModelObservation:
    return ModelObservation(spec.name, spec, desired_replicas=len(replicas), replicas=replicas)


def run(
    models: list[ModelObservation],
    policy: object,
    inv: Inventory | None = None,
    now: float = 100.0,
    window: MetricsWindow | None = None,
    state=None,  # type: ignore[no-untyped-def]
) -> tuple[Plan, object]:
    snap = ClusterSnapshot(now=now, models={o.name: o for o in models}, inventory=inv or inventory())
    win = window or metrics([o.name for o in models], now=now)
    d = decide(snap, win, state if state is not None else fresh_state(), CoreConfig(policy=policy))  # type: ignore[arg-type]
    return d.plan, d.state


def of_model(plan: Plan, kind: type, model: str) -> list:
    return [a for a in plan.of_type(kind) if a.model == model]


# ------------------------------------------------------------------------------------------------ scale up


def test_scale_up_places_legal_slots_and_says_why() -> None:
    inv = inventory()
    plan, _ = run([obs(SLICE)], FakePolicy({"a": 5}), inv)
    places = of_model(plan, PlaceReplica, "a")
    assert len(places) == 5
    assert len({p.replica_id for p in places}) == 5
    scratch = inv.copy()
    for p in places:
        assert isinstance(p.slot, Slot)
        assert p.slot.memory_gib >= 20 and p.slot.kind.value in SLICE.slot_kinds
        assert scratch.fits(p.slot), scratch.why_not(p.slot)
        scratch.allocate(p.slot, p.replica_id)  # raises if two placements collide
    (scale,) = of_model(plan, ScaleModel, "a")
    assert (scale.replicas, scale.previous, scale.reason) == (5, 0, Reason.REACTIVE)
    assert "fake wants 5" in scale.detail
    (status,) = of_model(plan, UpdateStatus, "a")
    assert status.desired == 5 and status.condition_ok
    assert not plan.of_type(Shortfall) and not plan.of_type(RemoveReplica)


def test_scale_up_avoids_slots_already_taken() -> None:
    inv = inventory("2xH100-80GB")
    existing = place_existing(inv, WHOLE, [(0.0, True)])
    plan, _ = run([obs(WHOLE, existing)], FakePolicy({"w": 2}), inv)
    (p,) = of_model(plan, PlaceReplica, "w")
    assert p.slot.kind is SlotKind.WHOLE
    assert p.slot.devices != existing[0].slot.devices or p.slot.node != existing[0].slot.node
    assert inv.fits(p.slot)
    (scale,) = plan.of_type(ScaleModel)
    assert (scale.replicas, scale.previous) == (2, 1)


def test_decide_does_not_mutate_the_snapshot_inventory() -> None:
    inv = inventory()
    existing = place_existing(inv, SLICE, [(0.0, True)])
    before = inv.copy()
    allocations_before = sorted((o, s.sort_key()) for o, s in inv.allocations())
    plan, _ = run([obs(SLICE, existing), obs(WHOLE)], FakePolicy({"a": 6, "w": 3}), inv)
    assert len(plan.of_type(PlaceReplica)) == 8
    assert inv == before
    assert sorted((o, s.sort_key()) for o, s in inv.allocations()) == allocations_before


def test_decide_does_not_mutate_the_metrics_or_observations() -> None:
    window = metrics(["a"], rate=3.0)
    rate_before = window.models["a"].rate.copy()
    inv = inventory()
    o = obs(SLICE, place_existing(inv, SLICE, [(0.0, True), (5.0, False)]))
    o_before = copy.deepcopy(o)
    run([o], make_policy("slotwise"), inv, window=window)
    np.testing.assert_array_equal(window.models["a"].rate, rate_before)
    assert o == o_before


def test_replica_ids_are_unique_across_ticks() -> None:
    policy = FakePolicy({"a": 2})
    plan1, state = run([obs(SLICE)], policy, now=0.0)
    policy.wants["a"] = 4
    inv = inventory()
    reps = tuple(Replica(p.replica_id, p.slot, ready=False, started_at=0.0) for p in plan1.of_type(PlaceReplica))
    for r in reps:
        inv.allocate(r.slot, r.replica_id)
    plan2, _ = run([obs(SLICE, reps)], policy, inv, now=10.0, state=state)
    ids = [p.replica_id for p in plan1.of_type(PlaceReplica) + plan2.of_type(PlaceReplica)]
    assert len(ids) == 4 and len(set(ids)) == 4


# ---------------------------------------------------------------------------------------------- scale down


def test_scale_down_removes_not_ready_replicas_first_newest_first() -> None:
    inv = inventory()
    reps = place_existing(inv, SLICE, [(0.0, True), (10.0, True), (20.0, False), (30.0, False)])
    plan, _ = run([obs(SLICE, reps)], FakePolicy({"a": 3}), inv)
    assert [r.replica_id for r in plan.of_type(RemoveReplica)] == ["a-old3"]  # not ready, newest

    plan, _ = run([obs(SLICE, reps)], FakePolicy({"a": 2}), inv)
    assert {r.replica_id for r in plan.of_type(RemoveReplica)} == {"a-old2", "a-old3"}

    plan, _ = run([obs(SLICE, reps)], FakePolicy({"a": 1}), inv)
    removed = [r.replica_id for r in plan.of_type(RemoveReplica)]
    assert set(removed) == {"a-old1", "a-old2", "a-old3"}  # then the newest ready one
    (scale,) = plan.of_type(ScaleModel)
    assert (scale.replicas, scale.previous) == (1, 4)
    assert not plan.of_type(PlaceReplica)


def test_scale_down_never_picks_a_draining_replica() -> None:
    inv = inventory()
    reps = list(place_existing(inv, SLICE, [(0.0, True), (10.0, True), (20.0, True)]))
    reps[2] = Replica(reps[2].replica_id, reps[2].slot, ready=True, started_at=20.0, draining=True)
    o = obs(SLICE, tuple(reps))
    assert o.active_replicas == 2
    plan, _ = run([o], FakePolicy({"a": 1}), inv)
    assert [r.replica_id for r in plan.of_type(RemoveReplica)] == ["a-old1"]
    (scale,) = plan.of_type(ScaleModel)
    assert (scale.replicas, scale.previous) == (1, 2)


def test_no_change_no_scale_action() -> None:
    inv = inventory()
    reps = place_existing(inv, SLICE, [(0.0, True), (10.0, True)])
    plan, _ = run([obs(SLICE, reps)], FakePolicy({"a": 2}), inv)
    assert not plan.of_type(ScaleModel) and not plan.of_type(PlaceReplica) and not plan.of_type(RemoveReplica)


# ----------------------------------------------------------------------------------------------- shortfall


def test_unplaceable_demand_is_a_shortfall_and_only_what_fits_is_counted() -> None:
    inv = inventory("3xH100-80GB")
    plan, _ = run([obs(WHOLE)], FakePolicy({"w": 7}), inv)
    assert len(plan.of_type(PlaceReplica)) == 3
    (short,) = plan.of_type(Shortfall)
    assert short.model == "w" and short.missing == 4 and short.reason
    (scale,) = plan.of_type(ScaleModel)
    assert (scale.replicas, scale.previous, scale.reason) == (3, 0, Reason.UNPLACEABLE)
    assert "4 replica(s) unplaceable" in scale.detail
    (status,) = plan.of_type(UpdateStatus)
    assert status.reason is Reason.UNPLACEABLE and status.desired == 3


def test_nothing_fits_gives_no_scale_action_but_a_shortfall() -> None:
    inv = inventory("1xH100-80GB")
    reps = place_existing(inv, WHOLE, [(0.0, True)])
    plan, _ = run([obs(WHOLE, reps)], FakePolicy({"w": 3}), inv)
    assert not plan.of_type(PlaceReplica)
    (short,) = plan.of_type(Shortfall)
    assert short.missing == 2
    assert not plan.of_type(ScaleModel)  # 1 -> 1: nothing to scale
    (status,) = plan.of_type(UpdateStatus)
    assert status.reason is Reason.UNPLACEABLE


def test_two_equal_models_share_the_last_gpus() -> None:
    """Same priority, same load: each next GPU goes to the one that would miss its SLO worst, so they split."""
    inv = inventory("4xH100-80GB")
    w2 = WHOLE.with_(name="w2")
    plan, _ = run([obs(WHOLE), obs(w2)], FakePolicy({"w": 3, "w2": 3}), inv)
    assert len(of_model(plan, PlaceReplica, "w")) == 2
    assert len(of_model(plan, PlaceReplica, "w2")) == 2
    assert [(s.missing, s.cause) for s in plan.of_type(Shortfall)] == [(1, ShortfallCause.UNPLACEABLE)] * 2
    scratch = inv.copy()
    for p in plan.of_type(PlaceReplica):
        scratch.allocate(p.slot, p.replica_id)


def test_a_small_model_still_fits_after_a_large_one_failed() -> None:
    inv = inventory("1xH100-80GB:mig")
    big = WHOLE.with_(name="big", gpus_per_replica=2)
    small = SLICE.with_(name="small")
    plan, _ = run([obs(big), obs(small)], FakePolicy({"big": 1, "small": 2}), inv)
    assert [s.model for s in plan.of_type(Shortfall)] == ["big"]
    assert len(of_model(plan, PlaceReplica, "small")) == 2


# -------------------------------------------------------------------------------------------- invalid spec


def test_invalid_spec_gets_a_status_and_no_scale_while_others_proceed() -> None:
    err = SpecError("default/bad", [SpecProblem("slotwise.io/slo-percentile", "100", "must be < 100")])
    inv = inventory()
    bad_reps = place_existing(inv, WHOLE.with_(name="bad"), [(0.0, True), (1.0, True)])
    bad = ModelObservation("bad", None, desired_replicas=2, replicas=bad_reps, spec_error=err)
    policy = FakePolicy({"bad": 0, "a": 2})
    plan, state = run([bad, obs(SLICE)], policy, inv)
    (status,) = of_model(plan, UpdateStatus, "bad")
    assert status.condition_ok is False
    assert status.reason is Reason.INVALID_SPEC
    assert "slo-percentile" in status.message and "100" in status.message
    assert (status.desired, status.current) == (2, 2)
    for kind in (ScaleModel, PlaceReplica, RemoveReplica, Shortfall):
        assert not of_model(plan, kind, "bad")
    assert all(name != "bad" for _, name in policy.calls)
    assert "bad" not in state.models  # type: ignore[attr-defined]
    assert len(of_model(plan, PlaceReplica, "a")) == 2
    assert of_model(plan, ScaleModel, "a")[0].replicas == 2


def test_invalid_spec_status_is_not_repeated_every_tick() -> None:
    """The status/Event for a bad spec is news once; repeating it every tick spams Events."""
    err = SpecError("default/bad", [SpecProblem("slotwise.io/team", "", "must be a non-empty name")])
    bad = ModelObservation("bad", None, desired_replicas=0, spec_error=err)
    policy = FakePolicy()
    plan1, state = run([bad], policy, now=0.0)
    assert len(plan1.of_type(UpdateStatus)) == 1
    plan2, _ = run([bad], policy, now=10.0, state=state)
    assert plan2.of_type(UpdateStatus) == [], "the invalid-spec status is re-emitted on every tick"


def test_model_that_turns_invalid_is_frozen_and_reported_once() -> None:
    err = SpecError("default/a", [SpecProblem("slotwise.io/concurrency", "0", "must be >= 1")])
    policy = FakePolicy({"a": 1})
    _, state = run([obs(SLICE)], policy, now=0.0)
    turned = ModelObservation("a", None, desired_replicas=1, spec_error=err)
    plan, state = run([turned], policy, now=10.0, state=state)
    (s,) = plan.of_type(UpdateStatus)
    assert s.condition_ok is False and s.reason is Reason.INVALID_SPEC
    plan, _ = run([turned], policy, now=20.0, state=state)
    assert not plan.of_type(UpdateStatus)


# ---------------------------------------------------------------------------------------- stale metrics


@pytest.mark.parametrize("wants", [0, 1, 2])
def test_stale_metrics_hold_replicas(wants: int) -> None:
    inv = inventory()
    reps = place_existing(inv, SLICE, [(0.0, True), (1.0, True), (2.0, False)])
    policy = FakePolicy({"a": wants})
    plan, _ = run([obs(SLICE, reps)], policy, inv, window=metrics(["a"], stale=True))
    assert not plan.of_type(RemoveReplica) and not plan.of_type(ScaleModel)
    assert policy.calls == []  # the rails hold without asking the policy
    (status,) = plan.of_type(UpdateStatus)
    assert status.reason is Reason.METRICS_STALE and status.desired == 3


def test_missing_metrics_count_as_stale() -> None:
    inv = inventory()
    reps = place_existing(inv, SLICE, [(0.0, True), (1.0, True)])
    plan, _ = run([obs(SLICE, reps)], FakePolicy({"a": 0}), inv, window=MetricsWindow(now=100.0, step_s=STEP))
    assert not plan.of_type(RemoveReplica)
    assert plan.of_type(UpdateStatus)[0].reason is Reason.METRICS_STALE


def test_stale_metrics_still_raise_to_the_floor() -> None:
    spec = SLICE.with_(min_replicas=4)
    inv = inventory()
    reps = place_existing(inv, spec, [(0.0, True)])
    plan, _ = run([obs(spec, reps)], FakePolicy({"a": 0}), inv, window=metrics(["a"], stale=True))
    assert len(plan.of_type(PlaceReplica)) == 3
    (scale,) = plan.of_type(ScaleModel)
    assert scale.replicas == 4 and scale.reason is Reason.METRICS_STALE


def test_bounds_clamp_and_say_so() -> None:
    spec = SLICE.with_(max_replicas=3)
    plan, _ = run([obs(spec)], FakePolicy({"a": 10}), inventory())
    (scale,) = plan.of_type(ScaleModel)
    assert scale.replicas == 3 and scale.reason is Reason.BOUNDS and "10" in scale.detail
    assert len(plan.of_type(PlaceReplica)) == 3


# -------------------------------------------------------------------------------------------------- ticks


def test_model_is_redecided_only_after_the_policy_tick() -> None:
    policy = FakePolicy({"a": 1}, tick_s=30.0)
    plan, state = run([obs(SLICE)], policy, now=0.0)
    assert len(plan.of_type(PlaceReplica)) == 1
    inv = inventory()
    reps = place_existing(inv, SLICE, [(0.0, False)])
    policy.wants["a"] = 3
    for now in (10.0, 20.0, 29.0):
        plan, state = run([obs(SLICE, reps)], policy, inv, now=now, state=state)
        assert plan.actions == [], f"decided again at t={now}, before the 30 s tick"
    assert [t for t, _ in policy.calls] == [0.0]
    plan, state = run([obs(SLICE, reps)], policy, inv, now=30.0, state=state)
    assert len(plan.of_type(PlaceReplica)) == 2
    assert [t for t, _ in policy.calls] == [0.0, 30.0]


def test_policy_state_is_threaded_between_decisions() -> None:
    policy = FakePolicy({"a": 1})
    state = None
    for k in range(3):
        _, state = run([obs(SLICE)], policy, now=10.0 * k, state=state)
    assert state.models["a"].policy_state == 3  # type: ignore[attr-defined]


# ------------------------------------------------------------------------------------------ determinism


def _scenario(policy_name: str) -> list[list]:
    policy = make_policy(policy_name)
    state = fresh_state()
    out = []
    rates = [1.0, 4.0, 30.0, 80.0, 20.0, 2.0]
    for k, r in enumerate(rates):
        now = 10.0 * k
        inv = inventory()
        window = MetricsWindow(
            now=now,
            step_s=STEP,
            models={
                "a": ModelMetrics(rate=np.linspace(r / 2, r, 20), in_flight=np.full(20, r * 0.2)),
                "w": ModelMetrics(rate=np.full(20, r / 4), in_flight=np.full(20, r * 0.05)),
            },
        )
        snap = ClusterSnapshot(now=now, models={"a": obs(SLICE), "w": obs(WHOLE)}, inventory=inv)
        d = decide(snap, window, state, CoreConfig(policy=policy))
        state = d.state
        out.append(list(d.plan.actions))
    return out


@pytest.mark.parametrize("name", ["slotwise", "hpa", "kpa"])
def test_same_inputs_same_plan(name: str) -> None:
    first, second = _scenario(name), _scenario(name)
    assert first == second
    assert any(first), "the scenario should produce some actions"


def test_plan_describe_covers_every_action() -> None:
    inv = inventory("2xH100-80GB")
    reps = place_existing(inv, WHOLE, [(0.0, True)])
    plan, _ = run([obs(WHOLE, reps)], FakePolicy({"w": 4}), inv)
    lines = plan.describe()
    assert len(lines) == len(plan.actions)
    assert any(line.startswith("place w/") for line in lines)
    assert any(line.startswith("shortfall w: 2") for line in lines)


# ------------------------------------------------------------------------------- every decision has a reason


def test_every_decision_is_recorded_with_its_reason_also_when_nothing_changes() -> None:
    inv = inventory()
    reps = place_existing(inv, SLICE, [(0.0, True), (10.0, True)])
    plan, _ = run([obs(SLICE, reps), obs(WHOLE)], FakePolicy({"a": 2, "w": 1}, reason=Reason.STABLE), inv)
    assert not of_model(plan, ScaleModel, "a")  # unchanged: no scale action...
    assert plan.decisions == {"a": Reason.STABLE, "w": Reason.STABLE}  # ...but a decision, with its reason
    stale = metrics(["a"], stale=True, now=100.0)
    plan, _ = run([obs(SLICE, reps)], FakePolicy({"a": 1}), inv, window=stale)
    assert plan.decisions == {"a": Reason.METRICS_STALE}


def test_an_unattainable_slo_is_sized_at_the_knee_with_a_warning_status() -> None:
    # 2 s of prefill per request against a 500 ms TTFT SLO: no count helps, so slotwise does not buy max replicas.
    spec = ModelSpec(name="slow", slo_latency_ms=500, slo_metric="ttft", service_time_ms=2500.0,
                     prefill_ms_per_1k_tokens=2000.0, concurrency=8, max_replicas=40)
    inv = inventory("64xH100-80GB")
    reps = place_existing(inv, spec, [(0.0, True)])
    plan, _ = run([obs(spec, reps)], make_policy("slotwise"), inv, window=metrics(["slow"], rate=20.0, now=100.0))
    assert plan.decisions["slow"] is Reason.SLO_UNATTAINABLE
    (status,) = of_model(plan, UpdateStatus, "slow")
    assert status.reason is Reason.SLO_UNATTAINABLE and not status.condition_ok
    assert "vs SLO 0.5 s" in status.message and "sized at the knee" in status.message
    assert status.desired < spec.max_replicas
    from autoscaler.live.kube.writes import status_event

    assert status_event(status)[:2] == ("Warning", "SloUnattainable")
