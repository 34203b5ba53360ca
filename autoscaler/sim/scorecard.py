"""The scorecard: the numbers every simulation reports (printed, and written as JSON).

Lending (issue 8; :func:`lending_card`), all over the scored period, in whole-GPU hours:

- ``idle_reserved_gpu_hours``: GPU-hours inference reserved but did not use = the inference pool's GPUs (every
  GPU of the simulated cluster except a static split's) less the GPU-equivalents its replicas held (starting,
  serving or draining) = **lent + idle not lent**. The simulated cluster is all inference's, so every node
  counts: :func:`autoscaler.accounting.cost.idle_reserved` (the ``cost`` block's ``idle_gpu_hours``) counts only nodes
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

Per team (issue 9; :func:`team_card`, the PoC scorecard platform teams evaluate with), and the same numbers over
all teams in :func:`scorecard`:

- ``success_rate``: requests completed (wait + whole service) within ``SimConfig.request_timeout_s`` / requests
  (:mod:`autoscaler.sim.queueing`); ``slo_attainment``: requests within their SLO latency / requests;
- ``gpu_hours_allocated``: GPU-equivalent hours its replicas held (starting, serving, draining; the ``cost`` block's
  unit); ``gpu_hours_busy``: the same x the replicas' utilisation (busy servers / the servers of every replica
  holding a slot); ``utilization_busy`` = busy / allocated;
- ``replica_wait_minutes``: replica-minutes its models asked for and did not get yet, any cause (the run's
  ``unplaced_replica_minutes`` summed over teams); ``shortfall_minutes_by_cause``: the same by
  :class:`autoscaler.api.plan.ShortfallCause` (``none``: a Shortfall without a known cause);
  ``refusals_within_guarantee``: the replica-minutes refused (cause not ``reclaiming``/``preempting``, which are
  grants in progress) while the team was inside its guarantee -- a broken guarantee, 0 when arbitration works;
- ``preemptions_by_reason``: replicas preempted from the team, by :class:`autoscaler.api.plan.PreemptionReason`;
  ``preemptions_caused``: replicas preempted for the team's models;
- overall only: ``training_jobs_started`` (jobs first started in the scored period), ``training_jobs_completed``,
  ``training_wait_p50_s`` / ``training_wait_p95_s`` (a job's wait: entered the backlog -> first start, see
  :mod:`autoscaler.sim.training`; empirical quantiles, None when no job started), ``unreasoned`` (Shortfalls without
  a cause or words + preemptions without a reason or message: must be 0).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from autoscaler.decision.arbitration import TeamQuota
from autoscaler.sim.run import SimResult

# The keys, in the order the table prints them.
COLUMNS = (
    "requests",
    "slo_attainment",
    "success_rate",
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
    "preemptions",
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
    teams = team_card(result)
    overall = teams["all"]
    success = _per_model(result.minute_success, len(result.models))
    busy_h = _per_model(result.minute_busy_gpu_s, len(result.models)) / 3600.0
    per_model = {}
    for i, name in enumerate(result.models):
        a = float(arrivals[i].sum())
        per_model[name] = {
            "requests": a,
            "late_requests": a - float(within[i].sum()),
            "slo_attainment": float(within[i].sum() / a) if a > 0 else 1.0,
            "success_rate": float(success[i] / a) if a > 0 else 1.0,
            "gpu_hours_busy": float(busy_h[i]),
            "shortfall_minutes_by_cause": dict(result.shortfalls.get(name, {})),
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
        # requests completed within the request timeout / requests (1.0 with no requests, like slo_attainment)
        "success_rate": overall["success_rate"] if overall["success_rate"] is not None else 1.0,
        "request_timeout_s": result.request_timeout_s,
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
        "gpu_hours_busy": overall["gpu_hours_busy"],
        "utilization_busy": overall["utilization_busy"],
        "shortfall_minutes_by_cause": overall["shortfall_minutes_by_cause"],
        "refusals_within_guarantee": overall["refusals_within_guarantee"],
        "preemptions": len(result.preemptions),
        "preemptions_by_reason": overall["preemptions_by_reason"],
        "unreasoned": result.unreasoned,
        **{k: overall[k] for k in TRAINING_KEYS if k not in LENDING_COLUMNS},  # (goodput is there already)
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


def _per_model(minutes: np.ndarray | None, m: int) -> np.ndarray:
    """A per-minute (M, n) series summed per model; zeros for a result built without it."""
    return np.zeros(m) if minutes is None else minutes.sum(axis=1)


# The keys of a team_card row, in order (the contract with ``slotwise simulate --scenario`` and the report).
TEAM_KEYS = (
    "team",
    "guaranteed_gpus",
    "borrowing_limit_gpus",
    "models",
    "requests",
    "slo_attainment",
    "success_rate",
    "gpu_hours_allocated",
    "gpu_hours_busy",
    "utilization_busy",
    "cost_usd",
    "replica_wait_minutes",
    "shortfall_minutes_by_cause",
    "refusals_within_guarantee",
    "preemptions_by_reason",
    "preemptions_caused",
)
TRAINING_KEYS = (
    "training_jobs_started",
    "training_jobs_completed",
    "training_wait_p50_s",
    "training_wait_p95_s",
    "training_goodput_gpu_hours",
)
# ... and the "all" row's extra keys.
ALL_KEYS = (
    "gpus_total",
    "fragmentation",
    "idle_reserved_cost_usd",
    "lent_gpu_hours",
    "lent_value_usd",
    *TRAINING_KEYS,
    "unreasoned",
)


def _add(into: dict[str, float], more: dict[str, Any]) -> None:
    for k, v in more.items():
        into[k] = into.get(k, 0) + v


def _ratio(num: float, den: float) -> float | None:
    return num / den if den > 0 else None


def team_card(result: SimResult, quotas: Sequence[TeamQuota] = ()) -> dict[str, Any]:
    """Per team and overall (module docstring): ``{"teams": [row, ...], "all": row}``.

    Teams: those of ``quotas`` (in their order, with or without models), then the models' teams (from their specs)
    in model order. ``guaranteed_gpus`` / ``borrowing_limit_gpus`` come from ``quotas`` (a team without one: 0 and
    None = no limit). Ratios are None for a team with nothing to divide (no requests, no GPU-hours). The "all" row
    sums the teams' (``borrowing_limit_gpus`` None when any team has no limit; ``models`` every model) and adds the
    run-wide numbers (``ALL_KEYS``). Every key of ``TEAM_KEYS`` is in every row.
    """
    models = result.models
    m = len(models)
    model_team = list(result.teams) if result.teams else ["default"] * m
    quota = {q.name: q for q in quotas}
    names = list(dict.fromkeys([*(q.name for q in quotas), *model_team]))
    arrivals = result.minute_arrivals.sum(axis=1) if m else np.zeros(0)
    within = result.minute_within.sum(axis=1) if m else np.zeros(0)
    success = _per_model(result.minute_success, m)
    busy_h = _per_model(result.minute_busy_gpu_s, m) / 3600.0
    cost = cost_card(result)
    team_of = dict(zip(models, model_team, strict=True))

    rows: dict[str, dict[str, Any]] = {}
    for name in names:
        q = quota.get(name, TeamQuota(name))
        rows[name] = {
            "team": name, "guaranteed_gpus": float(q.guaranteed_gpus), "borrowing_limit_gpus": q.borrowing_limit_gpus,
            "models": [], "requests": 0.0, "_within": 0.0, "_success": 0.0, "gpu_hours_allocated": 0.0,
            "gpu_hours_busy": 0.0, "cost_usd": 0.0, "replica_wait_minutes": 0.0, "shortfall_minutes_by_cause": {},
            "refusals_within_guarantee": 0.0, "preemptions_by_reason": {}, "preemptions_caused": 0,
        }
    for i, x in enumerate(models):
        r = rows[model_team[i]]
        r["models"].append(x)
        r["requests"] += float(arrivals[i])
        r["_within"] += float(within[i])
        r["_success"] += float(success[i])
        r["gpu_hours_allocated"] += cost["per_model"][x]["gpu_hours"]
        r["gpu_hours_busy"] += float(busy_h[i])
        r["cost_usd"] += cost["per_model"][x]["cost_usd"]
        by_cause = result.shortfalls.get(x, {})
        r["replica_wait_minutes"] += sum(by_cause.values())
        _add(r["shortfall_minutes_by_cause"], by_cause)
        r["refusals_within_guarantee"] += result.refusals_within_guarantee.get(x, 0.0)
    for p in result.preemptions:
        victim = team_of.get(str(p["model"]), str(p.get("team", "")))
        if victim in rows:
            _add(rows[victim]["preemptions_by_reason"], {str(p["reason"]) or "none": 1})
        by = team_of.get(str(p["by_model"]))
        if by in rows:
            rows[by]["preemptions_caused"] += 1

    limits = [r["borrowing_limit_gpus"] for r in rows.values()]
    total: dict[str, Any] = {
        "team": "all",
        "guaranteed_gpus": sum(r["guaranteed_gpus"] for r in rows.values()),
        "borrowing_limit_gpus": None if not limits or None in limits else sum(limits),
        "models": list(models), "shortfall_minutes_by_cause": {}, "preemptions_by_reason": {},
    }
    for key in ("requests", "_within", "_success", "gpu_hours_allocated", "gpu_hours_busy", "cost_usd",
                "replica_wait_minutes", "refusals_within_guarantee", "preemptions_caused"):
        total[key] = sum(r[key] for r in rows.values())
    for r in rows.values():
        _add(total["shortfall_minutes_by_cause"], r["shortfall_minutes_by_cause"])
        _add(total["preemptions_by_reason"], r["preemptions_by_reason"])

    def finish(r: dict[str, Any]) -> dict[str, Any]:
        r["slo_attainment"] = _ratio(r.pop("_within"), r["requests"])
        r["success_rate"] = _ratio(r.pop("_success"), r["requests"])
        r["utilization_busy"] = _ratio(r["gpu_hours_busy"], r["gpu_hours_allocated"])
        return {k: r[k] for k in TEAM_KEYS}

    lend = lending_card(result)
    stats = result.lending
    waits = np.array(stats.job_waits_s if stats is not None else [], dtype=np.float64)
    total = finish(total)
    total.update({
        "gpus_total": result.gpus_total,
        "fragmentation": result.fragmentation,
        # the report's "idle reserved cost": free GPU-equivalents on nodes holding replicas
        # (autoscaler/accounting/cost.py)
        "idle_reserved_cost_usd": cost["idle_usd"],
        "lent_gpu_hours": cost["lent_gpu_hours"],
        "lent_value_usd": cost["lent_usd"],
        "training_jobs_started": int(waits.size),
        "training_jobs_completed": stats.jobs_finished_scored if stats is not None else 0,
        "training_wait_p50_s": float(np.quantile(waits, 0.5, method="inverted_cdf")) if waits.size else None,
        "training_wait_p95_s": float(np.quantile(waits, 0.95, method="inverted_cdf")) if waits.size else None,
        "training_goodput_gpu_hours": lend["training_goodput_gpu_hours"],
        "unreasoned": result.unreasoned,
    })
    return {"teams": [finish(r) for r in rows.values()], "all": total}
