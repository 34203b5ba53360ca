"""The decision core: a pure function (snapshot, metrics window, controller state) -> (plan, state).

One code path for the simulator, the benchmarks and the live controller. No I/O, no clock
(time is ``snapshot.now``), no Kubernetes. Each tick it runs the stages

    per due model: forecast -> size (the policy, inside its behaviour and rails: autoscaler/decision/scaledown.py,
                   which also chooses the replicas a scale-down removes)
    all asks together: arbitrate + pack (autoscaler/decision/arbitration/) -> lend (when ``CoreConfig.lending`` is
    enabled)

and emits typed actions (:mod:`autoscaler.api.plan`). Packing works on a copy of the snapshot's inventory,
so only replicas that can actually be placed are counted as capacity; the rest is a :class:`Shortfall`
with a cause, never a silent Pending pod. When the asks do not all fit, arbitration decides who gets the GPUs
(team guarantees, priority, SLO damage) and whom to preempt, with a reason for each.

One model cannot stop or reconfigure the others: before anything is decided every spec is held against the
operator's caps and team bindings (:func:`autoscaler.decision.admission.admit`; a model over one is treated as
invalid), and an exception while one model is sized or its actions are emitted fails that model only -- it gets a
status with a false condition naming the error (an Event), keeps its replicas, and the others proceed. The stages
that see the whole fleet at once confine a failure the same way: the forecast (a model whose samples cannot be
folded in holds; autoscaler/decision/forecast_stage.py), arbitration (a model whose ask makes it raise holds, the
others are arbitrated without it: :func:`_arbitration_stage`), lending (a model whose need cannot be worked out is a
guess, so nothing new is lent; a failed lend stage drops only its own actions). Each is named in
``Plan.stage_failures``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from autoscaler.api.plan import (
    GRANTS,
    PlaceReplica,
    Plan,
    Reason,
    RemoveReplica,
    ScaleModel,
    Shortfall,
    UpdateStatus,
)
from autoscaler.api.snapshot import STALE_METRICS, ClusterSnapshot, MetricsWindow, ModelMetrics, ModelObservation
from autoscaler.api.spec import ModelSpec, slot_request
from autoscaler.decision import scaledown, zero
from autoscaler.decision.admission import admit
from autoscaler.decision.arbitration import (
    ArbitrationResult,
    Ask,
    Candidate,
    LazyMapping,
    ModelLoad,
    arbitrate,
)
from autoscaler.decision.config import CoreConfig
from autoscaler.decision.forecast_stage import forecast_of, forecast_stage
from autoscaler.decision.lend import lend_stage
from autoscaler.decision.state import ControllerState, ModelState, SizedLoad
from autoscaler.estimation.capacity import ServiceProfile, predicted_latency_s, profile_from_spec
from autoscaler.estimation.forecast import FleetForecaster
from autoscaler.estimation.idle_times import IdleTimes, fleet_pool, merge_into
from autoscaler.estimation.model_learning import ModelLearning
from autoscaler.estimation.work import WorkInputs, offered_rate, offered_rates, work_unit
from autoscaler.policies.base import PolicyContext
from autoscaler.policies.keepalive import histogram_range_s
from sharing.slots import Inventory, Slot


@dataclass
class Decision:
    plan: Plan
    state: ControllerState
    # The inventory after this tick's placements (None: nothing placed). plan_tick (decision/tick.py) diffs it
    # against the snapshot's to plan MIG re-layouts and the time-slicing config.
    inventory: Inventory | None = None


@dataclass
class _Sized:
    """One due model's sizing, before arbitration decides what of it is placed."""

    obs: ModelObservation
    ms: ModelState
    ctx: PolicyContext
    learning: ModelLearning | None
    target: int
    reason: Reason
    detail: str


def decide(snapshot: ClusterSnapshot, metrics: MetricsWindow, state: ControllerState, config: CoreConfig) -> Decision:
    plan = Plan(now=snapshot.now)
    snapshot = admit(snapshot, config.limits, config.arbitration)  # over a cap or a team binding: invalid
    forecaster, unforecast = (forecast_stage(snapshot, metrics, state, config, plan) if config.policy.uses_forecast
                              else (None, {}))
    sized, removals = _size_models(snapshot, metrics, state, config, forecaster, plan, unforecast)

    inventory: Inventory | None = None  # copied only when something is to be placed: most ticks place nothing
    outcome = ArbitrationResult()
    room = _room(snapshot.inventory, config)
    asks = [_ask(s, i, room) for i, s in enumerate(sized) if s.target > s.obs.active_replicas]
    if asks:
        outcome, inventory, refused = _arbitration_stage(asks, snapshot, metrics, removals, state, config, plan)
        plan.exact_budget_exceeded = outcome.exact_budget_exceeded
        if refused:  # their asks could not be arbitrated: they hold (reported), the others' outcome stands
            for s in sized:
                if s.obs.name in refused:
                    _report_failed(s.obs, refused[s.obs.name], state, plan)
            sized = [s for s in sized if s.obs.name not in refused]
    for name in _finish_all(snapshot, state, sized, removals, outcome, plan, config):
        if inventory is not None:  # a model that failed places nothing: its slots go back
            for rid, slot in outcome.placed.get(name, ()):
                for s in (slot, *outcome.group_slots.get(rid, ())):
                    inventory.release(s, rid)

    lending = config.lending
    if lending is not None and (lending.enabled or snapshot.lent):
        # (disabled with GPUs still lent: they are reclaimed)
        after = inventory if inventory is not None else snapshot.inventory
        try:
            plan.actions.extend(lend_stage(snapshot, metrics, plan, after, state, config, forecaster))
        except Exception as e:
            # Lending is the last stage: the models' actions stand, nothing is lent or reclaimed this tick (what is
            # lent stays lent, and is looked at again on the next tick).
            plan.stage_failures["lend"] = f"{type(e).__name__}: {e}"[:300]
    return Decision(plan=plan, state=state, inventory=inventory)


def _size_models(
    snapshot: ClusterSnapshot, metrics: MetricsWindow, state: ControllerState, config: CoreConfig,
    forecaster: FleetForecaster | None, plan: Plan, unforecast: Mapping[str, Exception] | None = None,
) -> tuple[list[_Sized], dict[str, list[RemoveReplica]]]:
    """Every due model sized (its policy inside its behaviour and rails), and the replicas its scale-down removes;
    invalid specs reported on ``plan``.

    In three passes, so that the step that costs the same numpy calls for every model runs once for the fleet:
    each due model learns from its window (:func:`_learn`); the windows' offered work is read together
    (:func:`autoscaler.estimation.work.offered_rates`); each model is sized (:func:`_decide`). What is reported
    keeps the snapshot's order of models."""
    entries: list[tuple[ModelObservation, ModelState | None, _Learned | Exception | None]] = []
    for name, obs in snapshot.models.items():
        if obs.spec is None:
            entries.append((obs, None, None))
            continue
        try:  # (free unless it raises) one model's failure is that model's only
            ms = _model_state(obs, obs.spec, state, config)
            if snapshot.now < ms.next_decision_at and not zero.needs_activation(obs, metrics.models.get(name)):
                continue  # (a model whose decision failed stays reported until one succeeds)
            if unforecast and name in unforecast:
                e = unforecast[name]  # its samples could not be forecast: it holds, the others proceed
                raise RuntimeError(f"its load could not be forecast ({type(e).__name__}: {e})")
            entries.append((obs, ms, _learn(obs, obs.spec, ms, metrics, config, snapshot.now)))
        except Exception as e:
            entries.append((obs, None, e))
    work = iter(_offered_rates([x.work for _, _, x in entries if isinstance(x, _Learned) and x.work is not None]))

    sized: list[_Sized] = []
    removals: dict[str, list[RemoveReplica]] = {}
    per_node: dict[str, int] | None = None  # allocations per node (consolidate_removals), computed lazily
    for obs, ms, learned in entries:
        if learned is None:
            _report_invalid(obs, state, plan)
            continue
        try:
            if isinstance(learned, Exception):
                raise learned
            assert ms is not None and obs.spec is not None
            work_rate = next(work) if learned.work is not None else None
            if isinstance(work_rate, Exception):
                raise work_rate
            s = _decide(obs, obs.spec, ms, learned, work_rate, config, forecaster, snapshot.now, state)
            current = obs.active_replicas
            route = zero.routing(obs, obs.spec, s.target, s.detail)
            if s.target < current:
                if config.consolidate_removals and per_node is None:
                    per_node = scaledown.node_load(snapshot)  # once per tick: the snapshot's, not changed within it
                removal = scaledown.removals(obs, current - s.target, per_node)
        except Exception as e:  # any error: this model holds, the others proceed
            _report_failed(obs, e, state, plan)
            continue
        if s.target < current:
            removals[obs.name] = removal
        if route is not None:  # (before the model's ScaleModel, which _finish appends later)
            plan.actions.append(route)
        state.invalid.pop(obs.name, None)
        sized.append(s)
    return sized, removals


def _offered_rates(rows: list[WorkInputs]) -> list[np.ndarray | Exception]:
    """The offered work of each row, in order: read together for the fleet; should that raise (one model's window
    the batch cannot take), read model by model, so only the model whose read raises fails (its exception in its
    place)."""
    try:
        return list(offered_rates(rows))
    except Exception:
        pass
    out: list[np.ndarray | Exception] = []
    for r in rows:
        try:
            out.append(offered_rate(r.metrics, r.ready, r.learner, r.unit, r.arrival_scv, r.budget_s))
        except Exception as e:
            out.append(e)
    return out


def _report_invalid(obs: ModelObservation, state: ControllerState, plan: Plan) -> None:
    """Invalid annotations affect this model only: say so, touch nothing. Each distinct problem is reported once
    (an Event per tick would be noise)."""
    message = str(obs.spec_error)
    if state.invalid.get(obs.name) != message:
        plan.actions.append(UpdateStatus(obs.name, obs.desired_replicas, obs.active_replicas, Reason.INVALID_SPEC,
                                         message=message, condition_ok=False))
        state.invalid[obs.name] = message


def _report_failed(obs: ModelObservation, error: Exception, state: ControllerState, plan: Plan) -> None:
    """A model whose decision raised: the error on its status (condition false, so a Warning Event), once per
    distinct message; nothing else is planned for it, so it keeps its replicas."""
    text = f"{type(error).__name__}: {error}"
    message = (f"model {obs.name}: the decision failed ({text[:300]}); its replicas are left as they are, the "
               "other models proceed")
    if state.invalid.get(obs.name) != message:
        plan.actions.append(UpdateStatus(obs.name, obs.desired_replicas, obs.active_replicas,
                                         Reason.DECISION_FAILED, message=message, condition_ok=False))
        state.invalid[obs.name] = message


def _room(inventory: Inventory, config: CoreConfig) -> int:
    """The most replicas of any one model the cluster could ever hold: every GPU cut into the most slots it can
    have (seven MIG instances, each time-sliced into at most ``limits.max_time_slice_replicas`` shares). No model
    asks for more, so a model's placement work is bounded by the cluster, not by its max-replicas."""
    return inventory.gpus_total * 7 * config.limits.max_time_slice_replicas


def _model_state(obs: ModelObservation, spec: ModelSpec, state: ControllerState, config: CoreConfig) -> ModelState:
    """The model's state, created on first sight (a measured profile, else the spec's prior)."""
    ms = state.models.get(obs.name)
    if ms is None:
        policy = config.policy
        prior = state.profiles.get(obs.name) or profile_from_spec(spec)
        ms = ModelState(
            policy_state=policy.initial_state(spec, obs.active_replicas),
            capacity=prior,
            learning=ModelLearning.start(spec, prior, policy.tick_s) if policy.learns else None,
        )
        state.models[obs.name] = ms
    return ms


@dataclass
class _Learned:
    """A due model after it learned from this tick's window: what sizing it reads from that."""

    metrics: ModelMetrics
    step_s: float  # the metrics window's sample step
    cold_start_s: float  # the lead time's cold start: learned, else declared
    profile: ServiceProfile
    work: WorkInputs | None  # the offered work's inputs (None: the policy does not learn, or stale metrics)


def _learn(obs: ModelObservation, spec: ModelSpec, ms: ModelState, metrics: MetricsWindow, config: CoreConfig,
           now: float) -> _Learned:
    """A due model learns from the window (cold start, service scale, decode, sizing quantile)."""
    policy = config.policy
    ms.next_decision_at = now + policy.tick_s - 1e-9
    m = metrics.models.get(obs.name, STALE_METRICS)
    learning = ms.learning
    cold_start_s = spec.cold_start_s
    if learning is not None:
        learning.observe(obs, m, now, policy.tick_s, metrics.step_s)
        cold_start_s = learning.cold_start.lead_s
    profile = ms.profile()
    work = None
    if learning is not None:
        ms.work_unit = unit = work_unit(learning.capacity, profile.mean_s)
        if not m.stale:
            work = WorkInputs(m, obs.ready_replicas, learning.capacity, unit, ms.arrival_scv, profile.median_budget_s)
    return _Learned(m, metrics.step_s, cold_start_s, profile, work)


def _decide(obs: ModelObservation, spec: ModelSpec, ms: ModelState, learned: _Learned, work_rate: np.ndarray | None,
            config: CoreConfig, forecaster: FleetForecaster | None, now: float,
            state: ControllerState | None = None) -> _Sized:
    """One due model's decision after :func:`_learn`: forecast, run the policy through its behaviour and rails
    (:func:`autoscaler.decision.scaledown.normalize`), and scale to and from zero."""
    policy = config.policy
    m, cold_start_s, profile, learning = learned.metrics, learned.cold_start_s, learned.profile, ms.learning
    ctx = PolicyContext(
        now=now,
        spec=spec,
        current_replicas=obs.active_replicas,
        ready_replicas=obs.ready_replicas,
        metrics=m,
        metrics_step_s=learned.step_s,
        forecast=(None if m.stale or forecaster is None
                  else forecast_of(forecaster, obs.name, cold_start_s, now, config)),
        capacity=profile,
        state=ms.policy_state,
        sizing_quantile=None if learning is None else learning.quantile.quantile,
        burn=0.0 if learning is None else learning.quantile.burn,
        work_rate=work_rate,
    )
    scaled = scaledown.normalize(policy, ctx, ms.scale_down, config.kv_saturation)
    ms.policy_state, ms.scale_down = scaled.state, scaled.scale_down
    if scaled.arrival_scv is not None:
        ms.arrival_scv = scaled.arrival_scv
    ms.sized = SizedLoad(ctx.forecast, ctx.sizing_quantile or config.upper_quantile, m.rate, learned.step_s)
    desired, reason, detail = scaled.desired, scaled.reason, scaled.detail
    if spec.min_replicas == 0:
        lead_s = cold_start_s + policy.tick_s + config.metric_lag_s
        idle, prior = _idle_times(obs.name, spec, ms, state, config)
        zero.observe(idle, m, learned.step_s, now, lead_s)
        desired, reason, detail = zero.apply(obs, spec, m, desired, reason, detail, idle, now, lead_s,
                                             ctx.forecast, prior, config.zero)
    return _Sized(obs, ms, ctx, learning, desired, reason, detail)


def _idle_times(name: str, spec: ModelSpec, ms: ModelState, state: ControllerState | None,
                config: CoreConfig) -> tuple[IdleTimes, IdleTimes | None]:
    """The model's idle times (first sight: the warm start from history, else empty) and the fleet prior."""
    prior = None
    if state is not None and config.zero.fleet_prior:
        prior = state.idle_prior
        if prior is None:
            prior = state.idle_prior = fleet_pool(half_life_s=config.zero.half_life_s)
    idle = ms.idle
    if idle is None:
        idle = state.idle_history.pop(name, None) if state is not None else None
        if idle is None:
            idle = IdleTimes(range_s=histogram_range_s(spec), half_life_s=config.zero.half_life_s)
        elif prior is not None:
            merge_into(prior, idle)
        idle.pool = prior
        ms.idle = idle
    idle.rebin(histogram_range_s(spec))  # (a changed keep-alive-seconds or policy; free otherwise)
    return idle, prior


def _ask(s: _Sized, order: int, room: int) -> Ask:
    spec = s.obs.spec
    assert spec is not None
    current = s.obs.active_replicas
    learning = s.learning
    return Ask(
        model=s.obs.name, team=spec.team, priority=spec.priority, request=slot_request(spec),
        # The policy sized in replicas of the kind it was sized for; a replica the packer puts on a slower kind
        # (the cheaper or the only one free) counts for its speed, and more are placed until the capacity asked
        # for is there (within max replicas).
        wanted=float(min(s.target - current, room)), current=current,
        max_new=max(0, min(spec.max_replicas - current, room)),
        load_rps=s.ms.sized.tail_rps if s.ms.sized else 0.0, profile=s.ctx.capacity,
        slo_target=spec.slo_percentile / 100.0, order=order,
        expected_rps=s.ms.sized.expected_rps if s.ms.sized else None,
        speed=None if learning is None else learning.relative_speed,
        pods=spec.pods_per_replica,
    )


def _arbitration_stage(asks: list[Ask], snapshot: ClusterSnapshot, metrics: MetricsWindow,
                       removals: dict[str, list[RemoveReplica]], state: ControllerState, config: CoreConfig,
                       plan: Plan) -> tuple[ArbitrationResult, Inventory, dict[str, Exception]]:
    """Arbitration of the fleet's asks, on a copy of the snapshot's inventory: the outcome, the inventory after it,
    and the models whose asks it could not take (each with its error).

    Arbitration sees every ask at once, so one model's ask that makes it raise would stop every model's scale-up.
    When it raises, each ask is tried alone (on throwaway copies) to find the ones that raise by themselves; those
    models hold, and the others are arbitrated again as if they had not asked. Should the rest still raise together,
    none of them is placed this tick (each holds, reported) -- placements are never made from a half-run arbitration.
    The extra runs happen only on a failure: a tick that raises nothing costs one copy of the small arbitration
    state."""
    arb = state.arbitration
    saved = (dict(arb.borrowed), arb.at, state.replica_seq)

    def restore() -> None:
        arb.borrowed, arb.at, state.replica_seq = dict(saved[0]), saved[1], saved[2]

    inventory = snapshot.inventory.copy()
    try:
        return _arbitrate(asks, snapshot, metrics, inventory, removals, state, config), inventory, {}
    except Exception as e:
        first = e
    failed: dict[str, Exception] = {}
    for ask in asks:
        restore()
        try:
            _arbitrate([ask], snapshot, metrics, snapshot.inventory.copy(), removals, state, config)
        except Exception as e:
            failed[ask.model] = e
    restore()
    rest = [a for a in asks if a.model not in failed]
    inventory = snapshot.inventory.copy()
    outcome = ArbitrationResult()
    if rest:
        try:
            outcome = _arbitrate(rest, snapshot, metrics, inventory, removals, state, config)
        except Exception as e:  # only together: none of them is placed this tick
            restore()
            inventory = snapshot.inventory.copy()
            failed.update((a.model, e) for a in rest)
    error = next(iter(failed.values()), first)
    plan.stage_failures["arbitration"] = (f"{type(error).__name__}: {error}; models held: "
                                          f"{', '.join(sorted(failed))}")[:300]
    return outcome, inventory, failed


def _arbitrate(asks: list[Ask], snapshot: ClusterSnapshot, metrics: MetricsWindow, inventory: Inventory,
               removals: dict[str, list[RemoveReplica]], state: ControllerState,
               config: CoreConfig) -> ArbitrationResult:
    """The views arbitration needs: teams, GPUs held per team, what is being freed; the damage inputs and the
    replicas that may be preempted only if it asks (when the asks do not all fit).

    A model whose metrics are stale or partial is never a preemption victim: its load reads as 0 or as part of
    itself, so it would look spare -- and a preemption is a scale-down, which no missing data may cause. Nor is a
    model another autoscaler scales (``ModelObservation.scaled_by``): slotwise does not write its count."""
    team_of: dict[str, str] = {}
    held: dict[str, float] = {}
    freeing: list[tuple[str, Slot]] = []
    valid = []
    for name, obs in snapshot.models.items():
        spec = obs.spec
        if spec is None:
            continue
        valid.append((name, obs, spec))
        team_of[name] = spec.team
        removed = {r.replica_id for r in removals.get(name, ())}
        for r in obs.replicas:
            if r.slot is None:
                continue
            if r.draining or r.replica_id in removed:  # (a group replica frees every pod's slot)
                freeing.append((r.replica_id, r.slot))
                freeing.extend((r.replica_id, s) for s in r.group_slots)
            else:
                held[spec.team] = held.get(spec.team, 0.0) + r.slot.gpu_fraction
                for s in r.group_slots:
                    held[spec.team] += s.gpu_fraction

    def load_of(name: str) -> ModelLoad:
        obs = snapshot.models[name]
        spec = obs.spec
        assert spec is not None
        ms = state.models.get(name)
        sized = ms.sized if ms is not None else None
        return ModelLoad(sized.tail_rps if sized else 0.0, ms.capacity if ms else None, spec.slo_percentile / 100.0,
                         obs.active_replicas, spec.min_replicas, sized.expected_rps if sized else None)

    def views() -> tuple[Mapping[str, ModelLoad], list[Candidate]]:
        candidates: list[Candidate] = []
        for name, obs, spec in valid:
            m = metrics.models.get(name, STALE_METRICS)
            if m.stale or m.partial_reason() is not None:
                continue  # unobserved (in part): its load is unknown, none of its replicas is spare
            if obs.scaled_by is not None:
                continue  # an HPA/KEDA owns its count: a preemption would be a scale-down nobody writes
            removed = {r.replica_id for r in removals.get(name, ())}
            replicas = obs.replicas
            if obs.removal_by_index:
                # A StatefulSet / LeaderWorkerSet removes its highest index whatever slotwise names: any other
                # victim's slot would never free (the preemptor waits on it, and the next tick preempts again), so
                # the one candidate is the replica the scale-down would take -- the next after this tick's own
                # removals, named the same way -- and only when its id has an index (else which goes is unknown).
                order = scaledown.choose_removals(obs, len(removed) + 1)
                nxt = order[-1] if len(order) > len(removed) else None
                replicas = tuple(r for r in obs.replicas if nxt is not None and r.replica_id == nxt
                                 and scaledown.replica_index(nxt) is not None)
            candidates.extend(Candidate(name, spec.team, spec.priority, r.replica_id, r.slot, r.started_at,
                                        r.group_slots)
                              for r in replicas
                              if r.slot is not None and not r.draining and r.replica_id not in removed)
        return LazyMapping(load_of), candidates

    def name_replica(model: str) -> str:
        state.replica_seq += 1
        return f"{model}-{state.replica_seq}"

    return arbitrate(asks, inventory, config.packer, config.arbitration, snapshot.now, team_of=team_of,
                     held=held, views=views, freeing=freeing, state=state.arbitration, name_replica=name_replica,
                     exact_budget_s=config.exact_budget_s)


def _finish_all(snapshot: ClusterSnapshot, state: ControllerState, sized: list[_Sized],
                removals: dict[str, list[RemoveReplica]], outcome: ArbitrationResult, plan: Plan,
                config: CoreConfig) -> list[str]:
    """The actions of every due model, and of the models preempted for them that did not decide this tick; the
    models whose actions failed (reported, nothing else planned for them)."""
    preempted: dict[str, list[RemoveReplica]] = {}
    for r in outcome.preemptions:
        preempted.setdefault(r.model, []).append(r)
    shortfalls: dict[str, list[Shortfall]] = {}
    for sf in outcome.shortfalls:
        shortfalls.setdefault(sf.model, []).append(sf)
    due = set()
    failed: list[str] = []
    for s in sized:
        name = s.obs.name
        due.add(name)
        mark = len(plan.actions)
        try:
            _finish(s, plan, outcome.placed.get(name, ()), shortfalls.get(name, ()),
                    removals.get(name, []) + preempted.get(name, []), config, outcome.group_slots)
        except Exception as e:  # this model's actions are dropped; the others' stand
            del plan.actions[mark:]
            plan.decisions.pop(name, None)
            _report_failed(s.obs, e, state, plan)
            failed.append(name)
    for name, victims in preempted.items():
        if name not in due:  # a model not deciding this tick, preempted for another
            _finish_victim(snapshot.models[name], state.models[name], victims, plan)
    return failed


def _finish(s: _Sized, plan: Plan, placed: Sequence[tuple[str, Slot]], shortfalls: Sequence[Shortfall],
            removed: list[RemoveReplica], config: CoreConfig,
            groups: Mapping[str, tuple[Slot, ...]] | None = None) -> None:
    """A due model's actions: its placements (``groups``: the other pods' slots of replicas that are pod groups),
    shortfalls, removals (its own and preemptions), scale and status."""
    obs, ms, ctx = s.obs, s.ms, s.ctx
    spec = obs.spec
    assert spec is not None
    current = obs.active_replicas
    reason, detail = s.reason, s.detail
    for rid, slot in placed:
        plan.actions.append(PlaceReplica(obs.name, rid, slot, groups.get(rid, ()) if groups else ()))
    plan.actions.extend(shortfalls)
    refused = [sf for sf in shortfalls if sf.cause not in GRANTS]
    waiting = sum(sf.missing for sf in shortfalls if sf.cause in GRANTS)
    if refused:
        missing = sum(sf.missing for sf in refused)
        causes = ", ".join(sorted({str(sf.cause) for sf in refused}))
        reason, detail = Reason.UNPLACEABLE, f"{missing} replica(s) {causes}; {detail}".strip("; ")
    if waiting:
        detail = f"{waiting} replica(s) waiting for capacity being freed; {detail}".strip("; ")
    if s.target > current and s.learning is not None and placed:
        units = sum(s.learning.relative_speed(slot) for _, slot in placed)
        if len(placed) > units + 1e-9 and not refused:
            detail = f"{detail}; {len(placed)} placed on slower slots for {s.target - current}".strip("; ")
    plan.actions.extend(removed)
    preempted = [r for r in removed if r.preempted_by]
    if preempted:
        reason = Reason.PREEMPTED
        detail = f"{len(preempted)} replica(s) preempted for {', '.join(sorted({r.preempted_by for r in preempted}))}"
    target = current + len(placed) - len(removed) if s.target >= current else s.target - len(preempted)
    plan.decisions[obs.name] = reason
    if target != current:
        plan.actions.append(ScaleModel(obs.name, target, current, reason, detail))
    if config.report_every_decision or target != ms.last_desired or reason is not ms.last_reason:
        forecast_rps = None if ctx.forecast is None else ctx.forecast.at(config.upper_quantile)
        predicted_ms = None
        # The prediction (a search over the queueing model) is for the live status and /metrics; the
        # simulator's statuses only count reasons, so it does not pay for it.
        if forecast_rps is not None and config.report_every_decision:
            latency_s = predicted_latency_s(forecast_rps, target, ctx.capacity)
            predicted_ms = latency_s * 1000.0 if math.isfinite(latency_s) else None
        plan.actions.append(
            UpdateStatus(
                obs.name,
                desired=target,
                current=obs.ready_replicas,
                reason=reason,
                forecast_rps=forecast_rps,
                message=detail,
                predicted_latency_ms=predicted_ms,
                slo_latency_ms=spec.slo_latency_ms,
                # an SLO out of reach is a problem the owner must see (a Warning Event, conditionOk false)
                condition_ok=reason is not Reason.SLO_UNATTAINABLE,
            )
        )
    ms.last_desired, ms.last_reason = target, reason


def _finish_victim(obs: ModelObservation, ms: ModelState, victims: list[RemoveReplica], plan: Plan) -> None:
    """A model that did not decide this tick lost replicas to a preemption: drain them and say so."""
    spec = obs.spec
    assert spec is not None
    current = obs.active_replicas
    target = current - len(victims)
    detail = f"{len(victims)} replica(s) preempted for {', '.join(sorted({r.preempted_by for r in victims}))}"
    plan.actions.extend(victims)
    plan.decisions[obs.name] = Reason.PREEMPTED
    plan.actions.append(ScaleModel(obs.name, target, current, Reason.PREEMPTED, detail))
    plan.actions.append(UpdateStatus(obs.name, desired=target, current=obs.ready_replicas, reason=Reason.PREEMPTED,
                                     message=detail, slo_latency_ms=spec.slo_latency_ms))
    ms.last_desired, ms.last_reason = target, Reason.PREEMPTED


