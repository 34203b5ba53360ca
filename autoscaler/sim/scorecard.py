"""The scorecard: the numbers every simulation reports (printed, and written as JSON).

Lending (issue 8; :func:`lending_card`), all over the scored period, in whole-GPU hours:

- ``idle_reserved_gpu_hours``: GPU-hours inference reserved but did not use = the inference pool's GPUs (every
  GPU of the simulated cluster except a static split's) less the GPU-equivalents its replicas held (starting,
  serving or draining) = **lent + idle not lent**. The simulated cluster is all inference's, so every node
  counts: :func:`autoscaler.cost.idle_reserved` (the ``cost`` block's ``idle_gpu_hours``) counts only nodes
  holding a replica, because a live controller cannot tell which replica-free nodes are inference's, and counts a
  lent GPU as used; the two agree on nodes with replicas and no lent GPUs.
- ``lent_gpu_hours``: whole GPUs lent x hours (from the LendGpus until the GPU is back, grace period included);
  ``lending_efficiency`` = lent / idle reserved;
- ``reclaims`` (ReclaimGpus decided in the scored period that took back at least one GPU), ``reclaim_p50_s`` /
  ``reclaim_p99_s`` (decision -> last GPU free; empirical quantiles, the shortest measured duration that at least
  50 % / 99 % of reclaims did not exceed: never interpolated), ``reclaims_late`` (took longer than their
  ``deadline_s``, or still open at the end and already past it), ``reclaims_within_deadline`` (the share that were
  not late), ``reclaim_max_late_s`` (the worst overrun, 0 when none);
- ``training_goodput_gpu_hours``: training work kept (GPU-hours of running, less what preemption threw away;
  a job still running at the end keeps its work), on lent GPUs and on a static split's;
  ``training_lost_gpu_hours``: work thrown away since the last checkpoint by preemption.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from autoscaler.sim.run import SimResult

# The keys, in the order the table prints them.
COLUMNS = (
    "requests",
    "slo_attainment",
    "slo_windows_met",
    "slo_requests_met",
    "violating_requests",
    "gpu_hours",
    "gpu_hours_vs_oracle",
    "cost_usd",
    "idle_cost_usd",
    "lent_gpu_hours",
    "scale_events",
    "unplaced_replica_minutes",
    "fragmentation",
    "sim_wall_s",
)
# Shown in the table only when a run lent GPUs or had a static split.
LENDING_COLUMNS = (
    "idle_reserved_gpu_hours",
    "lending_efficiency",
    "reclaims",
    "reclaim_p50_s",
    "reclaim_p99_s",
    "reclaims_late",
    "training_goodput_gpu_hours",
    "training_lost_gpu_hours",
)


def scorecard(result: SimResult, oracle_gpu_hours: float | None = None) -> dict[str, Any]:
    arrivals = result.minute_arrivals
    within = result.minute_within
    total = float(arrivals.sum())
    attainment = float(within.sum() / total) if total > 0 else 1.0
    # A model-minute meets its SLO when at least the declared percentile of its requests were in time
    # (equivalently: the percentile latency is within the target). Minutes without requests do not count.
    has = arrivals > 0
    frac = np.divide(within, arrivals, out=np.ones_like(within), where=has)
    met = frac >= (result.slo_percentile[:, None] / 100.0) - 1e-9
    windows_met = float(met[has].mean()) if has.any() else 1.0
    # An SLO on a percentile is judged per window: a request is served within the SLO when its model-minute
    # met the declared percentile, and "violating" when that minute missed it (so a 95 % SLO is not
    # charged for the 5 % of requests it allows to be slow, but a missed minute charges all of its requests).
    violating = float(arrivals[has & ~met].sum())
    cost = cost_card(result)
    lend = lending_card(result)
    per_model = {}
    for i, name in enumerate(result.models):
        a = float(arrivals[i].sum())
        per_model[name] = {
            "requests": a,
            "late_requests": a - float(within[i].sum()),
            "slo_attainment": float(within[i].sum() / a) if a > 0 else 1.0,
            "slo_percentile": float(result.slo_percentile[i]),
            "p95_latency_s": _num(result.latency_p95_s[i]),
            "slo_latency_s": float(result.slo_latency_s[i]),
            "mean_replicas": float(result.minute_replicas[i].mean()) if result.minute_replicas.size else 0.0,
            **cost["per_model"].get(name, {}),
        }
    return {
        "policy": result.policy,
        "mode": result.mode,
        "requests": total,
        "slo_attainment": attainment,
        "slo_windows_met": windows_met,
        "slo_requests_met": 1.0 - violating / total if total > 0 else 1.0,
        "violating_requests": violating,
        "late_requests": total - float(within.sum()),
        "gpu_hours": result.gpu_hours,
        "gpu_hours_vs_oracle": (result.gpu_hours / oracle_gpu_hours) if oracle_gpu_hours else None,
        "cost_usd": cost["total_usd"],
        "idle_cost_usd": cost["idle_usd"],
        "lent_gpu_hours": lend["lent_gpu_hours"],
        **{k: lend[k] for k in LENDING_COLUMNS},
        "reclaims_within_deadline": lend["reclaims_within_deadline"],
        "reclaim_max_late_s": lend["reclaim_max_late_s"],
        "lending": lend["lending"],
        "scale_events": result.scale_events,
        "decisions_by_reason": result.reasons,
        "unplaced_replica_minutes": result.unplaced_replica_minutes,
        "fragmentation": result.fragmentation,
        "gpus_total": result.gpus_total,
        "sim_wall_s": result.sim_wall_s,
        "burn_in_s": result.burn_in_s,
        "invalid_models": result.invalid_models,
        "per_model": per_model,
        "cost": {k: v for k, v in cost.items() if k != "per_model"},
    }


def cost_card(result: SimResult) -> dict[str, Any]:
    """Cost attribution of a run (scored time only, like ``gpu_hours``), priced with ``result.prices``.

    ``per_model``: team, namespace, GPU-equivalent hours by GPU kind and in total, and their cost;
    ``by_team``: the same summed per team; ``idle_gpu_hours_by_kind`` / ``idle_usd``: idle reserved capacity
    (free GPU-equivalents on nodes holding replicas). The models' GPU-hours sum to the run's ``gpu_hours``.
    """
    kinds = result.gpu_kinds
    held = result.model_gpu_seconds
    idle = result.idle_gpu_seconds
    if held is None or idle is None:
        held, idle = np.zeros((len(result.models), len(kinds))), np.zeros(len(kinds))
    prices = np.array([result.prices.get(k, 0.0) for k in kinds])
    hours = held / 3600.0
    usd = hours * prices[None, :]
    per_model: dict[str, dict[str, Any]] = {}
    by_team: dict[str, dict[str, Any]] = {}
    for i, name in enumerate(result.models):
        team = result.teams[i] if result.teams else "default"
        row = {
            "team": team,
            "namespace": result.namespaces[i] if result.namespaces else "default",
            "gpu_hours": float(hours[i].sum()),
            "gpu_hours_by_kind": {k: float(hours[i, j]) for j, k in enumerate(kinds) if hours[i, j] > 0},
            "cost_usd": float(usd[i].sum()),
        }
        per_model[name] = row
        t = by_team.setdefault(team, {"gpu_hours": 0.0, "cost_usd": 0.0, "models": []})
        t["gpu_hours"] += row["gpu_hours"]
        t["cost_usd"] += row["cost_usd"]
        t["models"].append(name)
    idle_h = idle / 3600.0
    lent = result.lent_gpu_seconds if result.lent_gpu_seconds is not None else np.zeros(len(kinds))
    lent_h = lent / 3600.0
    return {
        "currency": "USD",
        "hours": result.scored_s / 3600.0,
        "prices_usd_per_gpu_hour": {k: float(p) for k, p in zip(kinds, prices, strict=True)},
        "total_usd": float(usd.sum()),
        "gpu_hours": float(hours.sum()),
        "idle_gpu_hours_by_kind": {k: float(h) for k, h in zip(kinds, idle_h, strict=True)},
        "idle_gpu_hours": float(idle_h.sum()),
        "idle_usd": float((idle_h * prices).sum()),
        "lent_gpu_hours": float(lent_h.sum()),
        "lent_gpu_hours_by_kind": {k: float(h) for k, h in zip(kinds, lent_h, strict=True) if h > 0},
        "lent_usd": float((lent_h * prices).sum()),
        "by_team": by_team,
        "per_model": per_model,
    }


def lending_card(result: SimResult) -> dict[str, Any]:
    """The lending numbers of a run (module docstring); ``lending`` holds the details (None: lending off and
    no static split), the other keys are always there (0 / None when nothing was lent)."""
    lent_h = float(result.lent_gpu_seconds.sum()) / 3600.0 if result.lent_gpu_seconds is not None else 0.0
    idle_h = result.idle_reserved_gpu_seconds / 3600.0
    stats = result.lending
    reclaims = stats.reclaims if stats is not None else []
    done = np.array([r.duration_s for r in reclaims if r.duration_s is not None])
    # An open reclaim is late once the end of the run is past its deadline; it has no duration yet.
    overrun = [(r.duration_s if r.duration_s is not None else result.end_s - r.decided_at) - r.deadline_s
               for r in reclaims]
    late = sum(1 for x in overrun if x > 1e-9)
    card: dict[str, Any] = {
        "lent_gpu_hours": lent_h,
        "idle_reserved_gpu_hours": idle_h,
        "lending_efficiency": lent_h / idle_h if idle_h > 0 else 0.0,
        "reclaims": len(reclaims),
        "reclaim_p50_s": float(np.quantile(done, 0.5, method="inverted_cdf")) if done.size else None,
        "reclaim_p99_s": float(np.quantile(done, 0.99, method="inverted_cdf")) if done.size else None,
        "reclaims_late": late,
        "reclaims_within_deadline": 1.0 - late / len(reclaims) if reclaims else None,
        "reclaim_max_late_s": max(0.0, max(overrun, default=0.0)),
        "training_goodput_gpu_hours": 0.0,
        "training_lost_gpu_hours": 0.0,
        "lending": None,
    }
    if stats is None:
        return card
    card["training_goodput_gpu_hours"] = (stats.goodput_lent_s + stats.goodput_static_s) / 3600.0
    card["training_lost_gpu_hours"] = stats.lost_s / 3600.0
    by_reason: dict[str, int] = {}
    for r in reclaims:
        by_reason[r.reason] = by_reason.get(r.reason, 0) + 1
    card["lending"] = {
        "policy": dataclasses.asdict(result.lending_policy) if result.lending_policy is not None else None,
        "static_training_gpus": result.static_training_gpus,
        "pool_gpus": result.pool_gpus,
        "mean_lent_gpus": lent_h / (result.scored_s / 3600.0) if result.scored_s > 0 else 0.0,
        "lends": stats.lends,
        "lent_gpus": stats.lent_gpus,
        "reclaims_by_reason": by_reason,
        "reclaims_open": sum(1 for r in reclaims if r.freed_at is None),
        "reclaim_noops": stats.reclaim_noops,
        "preemptions": stats.preemptions,
        "jobs_started": stats.jobs_started,
        "jobs_finished": stats.jobs_finished,
        "goodput_lent_gpu_hours": stats.goodput_lent_s / 3600.0,
        "goodput_static_gpu_hours": stats.goodput_static_s / 3600.0,
        "grace_gpu_hours": stats.grace_s / 3600.0,
    }
    return card


def _num(x: float) -> float | None:
    return None if not np.isfinite(x) else float(x)
