"""The decision core's lend stage: after packing, lend idle reserved GPUs to training and reclaim them ahead of need.

``decide`` (autoscaler/decision/core.py) calls :func:`lend_stage` at the end of a tick when ``CoreConfig.lending`` is
set and enabled (or GPUs are still lent). The rules live in :func:`sharing.lending.plan_lending` (pure, over the
inventory); this stage turns the decision core's view into its inputs and its result into plan actions:

- **need-soon**, per model: the replicas the capacity model (the slotwise policy's sizing:
  :func:`autoscaler.estimation.capacity.min_replicas_for_slo` on the model's learned profile, with the arrivals'
  dispersion the policy last sized with, ``ModelState.arrival_scv``) sizes at the forecast's upper quantile --
  the model's own sizing quantile when it learns one, else ``CoreConfig.upper_quantile`` -- of the peak load
  over the **reclaim horizon** (``max_reclaim_s`` + the model's lead time: cold start + tick + metric lag),
  within the spec's min/max replicas. The extra replicas beyond those the plan leaves active are trial-packed by
  the plan, lent GPUs last: a lent GPU they land on is reclaimed now (reason ``forecast``). Replicas unplaceable
  this tick (the plan's :class:`~autoscaler.api.plan.Shortfall` actions) go first (reason ``shortfall``).
- **cost**: the stage runs every tick for up to 1,000 models, so a model's need-soon is computed when the core
  decides for it (once per policy tick) and cached in :class:`LendState` until its next decision; each tick
  then only compares the cached count with the plan's, and the trial packing (one packer call per missing
  replica) is skipped when nothing is lent and nothing could be lent.
- **never lend on a guess**: a model whose metrics are stale, or that has no forecast (a new model before its
  first forecast, a policy that does not forecast), is assumed to need ``max(active replicas, min replicas)`` --
  nothing extra, since nothing is known -- and while any model is in that state no new GPUs are lent (GPUs
  lent already stay lent and are reclaimed by the usual rules).
- **reclaims in flight**: a reclaim takes up to ``max_reclaim_s``; its GPUs stay lent in the snapshot until freed.
  They are remembered (:attr:`LendState.reclaiming`), not asked again, and counted as coming back; if they are
  still lent ``max_reclaim_s`` after the decision (the executor lost it: a restart, an error), the reclaim is
  issued again, so executors must treat a repeated reclaim of the same GPUs as one.
"""

from __future__ import annotations

import math

from autoscaler.api.plan import LendGpus, Plan, ReclaimGpus, ScaleModel, Shortfall, ShortfallCause
from autoscaler.api.snapshot import STALE_METRICS, ClusterSnapshot, MetricsWindow, ModelObservation, TrainingWorkload
from autoscaler.api.spec import slot_request
from autoscaler.decision.config import CoreConfig
from autoscaler.decision.state import ControllerState, LendState, NeedSoon
from autoscaler.estimation.capacity import batch_replicas, min_replicas_for_slo, quantize_up
from autoscaler.estimation.forecast import FleetForecaster
from autoscaler.policies.base import Forecast
from sharing.lending import (
    Borrower,
    LendingPolicy,
    LendReason,
    NeedRequest,
    ReclaimReason,
    could_lend,
    plan_lending,
)
from sharing.packer import decreasing_order
from sharing.slots import Inventory, SlotRequest

# Shortfalls that lent GPUs can fix: not a team at its limit, headroom, or replicas waiting for a drain.
_RECLAIM_FOR = frozenset({ShortfallCause.UNPLACEABLE, ShortfallCause.RECLAIMING})


def borrowers(training: tuple[TrainingWorkload, ...]) -> list[Borrower]:
    """The running training workloads as the lending plan sees them: by their GPUs where the snapshot knows them
    (``TrainingWorkload.devices``), else by their nodes (see ``sharing.lending.attribute``)."""
    return [
        Borrower(w.name, w.gpus, nodes=w.nodes, devices=w.devices, grace_s=w.grace_s,
                 started_at=w.started_at, last_checkpoint_at=w.last_checkpoint_at)
        for w in training
        if w.running
    ]


def need_soon(
    obs: ModelObservation,
    state: ControllerState,
    config: CoreConfig,
    lending: LendingPolicy,
    forecaster: FleetForecaster | None,
    metrics: MetricsWindow,
    now: float,
    last: NeedSoon | None = None,
) -> NeedSoon:
    """The model's need over the reclaim horizon (see the module docstring). ``obs.spec`` must be valid; ``last``
    (the previous answer) saves the slot request and the sizing when their inputs did not change: the forecast
    moves once per forecast step, the model decides every policy tick."""
    spec = obs.spec
    assert spec is not None
    ms = state.models[obs.name]
    floor = min(max(obs.active_replicas, spec.min_replicas), spec.max_replicas)
    same_spec = last is not None and last.spec is spec
    request = last.request if same_spec else slot_request(spec)  # type: ignore[union-attr]
    m = metrics.models.get(obs.name, STALE_METRICS)
    learning = ms.learning
    lead_s = spec.cold_start_s if learning is None else learning.cold_start.lead_s
    horizon_s = lending.max_reclaim_s + lead_s + config.policy.tick_s + config.metric_lag_s
    unknown = m.stale or forecaster is None or m.partial_reason() is not None  # a partial load: need unknown
    values = None if unknown else forecaster.quantiles(obs.name, now, horizon_s)
    next_at = max(ms.next_decision_at, now + 1e-9)
    if values is None:
        return NeedSoon(floor, request, True, next_at, spec)
    q = config.upper_quantile if learning is None else learning.quantile.quantile
    profile = ms.profile()
    # (profiles are cached objects, replaced when what they say changes: compared by identity)
    sized_for = (values.tobytes(), q, profile)
    if same_spec and last is not None and last.sized_for is not None and last.sized_for[2] is profile \
            and last.sized_for[:2] == sized_for[:2]:
        return NeedSoon(last.replicas, request, False, next_at, spec, last.sized_for)
    rate = Forecast(quantiles=forecaster.levels, values=values, horizon_s=horizon_s).at(q)  # type: ignore[union-attr]
    if not math.isfinite(rate):
        return NeedSoon(floor, request, True, next_at, spec)
    # (rounded up on the sizing policy's grid, so that sizing hits its memo as the policy's own calls do)
    sized = min_replicas_for_slo(quantize_up(rate), profile, spec.max_replicas) if rate > 0 else 0
    # bursts as the policy charges them: a batch of the arrivals' measured dispersion, served in time
    sized = max(sized, batch_replicas(rate, ms.arrival_scv, profile))
    replicas = min(max(sized, spec.min_replicas), spec.max_replicas)
    return NeedSoon(replicas, request, False, next_at, spec, sized_for)


def lend_stage(
    snapshot: ClusterSnapshot,
    metrics: MetricsWindow,
    plan: Plan,
    inventory: Inventory,
    state: ControllerState,
    config: CoreConfig,
    forecaster: FleetForecaster | None,
) -> list[LendGpus | ReclaimGpus]:
    """This tick's lend and reclaim actions. ``inventory``: after the tick's placements (the snapshot's when
    nothing was placed); not changed."""
    lending = config.lending
    assert lending is not None
    now = snapshot.now
    ls = state.lending
    if not isinstance(ls, LendState):
        ls = state.lending = LendState()
    lent = snapshot.lent
    ls.reclaiming = {k: t for k, t in ls.reclaiming.items() if k in lent and now - t < lending.max_reclaim_s}

    need: list[NeedRequest] = []
    hold = forecaster is None
    if lending.enabled and not lent and (forecaster is None or not could_lend(inventory, lending)):
        # Nothing lent, and nothing idle beyond the buffers (or no forecast to lend on): nothing to decide, and no
        # need-soon to work out (the common case on a busy cluster; the cache is refreshed when lending can matter).
        ls.last = None
        return []
    if lending.enabled:
        after: dict[str, int] = {}
        for a in plan.actions:
            if isinstance(a, ScaleModel):
                after[a.model] = a.replicas
            elif isinstance(a, Shortfall) and a.cause in _RECLAIM_FOR:
                obs = snapshot.models.get(a.model)
                if obs is not None and obs.spec is not None:
                    # (a replica that is a group of pods needs every pod's slot)
                    need.extend([NeedRequest(slot_request(obs.spec), ReclaimReason.SHORTFALL)]
                                * (a.missing * obs.spec.pods_per_replica))
        soon: list[SlotRequest] = []
        cache = ls.need
        for name, obs in snapshot.models.items():
            if obs.spec is None or name not in state.models:
                continue
            entry = cache.get(name)
            if entry is None or entry.next_at <= now:
                try:
                    entry = cache[name] = need_soon(obs, state, config, lending, forecaster, metrics, now, entry)
                except Exception as e:  # its need is unknown: a guess, as for a model without a forecast
                    cache.pop(name, None)
                    plan.stage_failures["lend"] = f"model {name}: need-soon failed ({type(e).__name__}: {e})"[:300]
                    hold = True
                    continue
            hold = hold or entry.guess
            extra = entry.replicas - after.get(name, obs.active_replicas)
            if extra > 0:
                soon.extend([entry.request] * (extra * obs.spec.pods_per_replica))  # every pod of a group
        if len(cache) > len(snapshot.models):
            for name in [n for n in cache if n not in snapshot.models]:
                del cache[name]
        # Largest first, as first-fit-decreasing: the big replicas get the GPUs only they fit.
        need.extend(NeedRequest(soon[i], ReclaimReason.FORECAST) for i in decreasing_order(soon))

    result = plan_lending(
        inventory,
        lent,
        lending,
        now,
        packer=config.packer,
        need=need,
        borrowers=borrowers(snapshot.training) if lent else (),
        whole_nodes_only=config.lending_whole_nodes_only,
        hold=hold,
        reclaiming=ls.reclaiming.keys(),
    )
    ls.last = result
    actions: list[LendGpus | ReclaimGpus] = []
    for r in result.reclaim:
        actions.append(ReclaimGpus(r.node, r.devices, r.workloads, r.reason, lending.max_reclaim_s))
        for d in r.devices:
            ls.reclaiming[(r.node, d)] = now
    for b in result.lend:
        actions.append(LendGpus(b.node, b.devices, b.gpu_model, LendReason.SURPLUS))
    return actions
