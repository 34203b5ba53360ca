"""The scorecard: the numbers every simulation reports -- printed by ``slotwise simulate``, written by ``--json``
as ``{"results": [card, ...]}`` (a list for one policy or many) and read back, field for field, by ``slotwise
report``. Every field is defined here, once; docs/scorecard.md is the same list for users. One module: the
definitions and the code that computes them stay side by side, so they cannot drift apart.

**The SLO.** Each model declares a latency target and a percentile (p99 <= 2 s). A *model-minute* (one model, one
scored minute) *meets its SLO* when its declared percentile of latency is within the target -- equivalently, when
the share of its requests within the latency target is >= percentile / 100. Minutes without requests do not count.

- ``slo_attainment`` (**the headline**): requests in SLO-meeting model-minutes / requests
  = (requests - violating_requests) / requests (1.0 without requests);
- ``violating_requests``: requests in model-minutes that missed (a missed minute charges all of its requests; a
  met p95 minute is not charged for the 5 % it allows to be slow);
- ``slo_minutes_met``: SLO-meeting model-minutes / model-minutes with requests (1.0 when none has requests);
- ``requests_within_latency``: requests whose latency was within the target / requests, whatever their minute did:
  the raw share, which is *not* SLO attainment and is never labelled so; ``late_requests`` = requests - those;
- ``success_rate``: requests completed (wait + whole service) within ``SimConfig.request_timeout_s`` / requests.

**References.** ``gpu_hours``: GPU-equivalent hours the replicas held (starting, serving or draining) over the scored
period (the unit of :mod:`autoscaler.accounting.cost`). ``lower_bound_gpu_hours`` / ``gpu_hours_vs_lower_bound``: the
clairvoyant lower bound's GPU-hours (it meets every attainable model-minute, cold starts included) and gpu_hours /
it; None without a bound. ``oracle_gpu_hours`` / ``gpu_hours_vs_oracle``: the same against the per-tick,
zero-cold-start oracle -- a second, named reference, *not* a lower bound (a policy can come out below it).
The ``attainable`` mask (an argument of :func:`scorecard`, from the lower bound; None: every minute) marks the
model-minutes the bound could meet: ``unattainable_requests`` = requests in the others; ``slo_attainment_attainable``
= requests in SLO-meeting attainable minutes / requests in attainable minutes (= slo_attainment when every minute
is attainable; 1.0 when none is).

**Scale to and from zero** (issue 18; :func:`cold_start_card`, overall and per model). A request is *cold-started*
when it arrives while its model has no routable replica (the engines hold it until one is: the simulated activator).
``cold_start_slo``: ``"count"`` (cold-started requests judged against the SLO like any other) or ``"exempt"`` (left
out of slo_attainment, violating_requests, slo_minutes_met, requests_within_latency and late_requests, numerator and
denominator; ``requests`` and ``success_rate`` still cover every request); ``slo_judged_requests``: the requests the
SLO accounting judged (requests, less the cold-started under exempt); ``cold_started_requests`` (whole, rounded once
per model); ``cold_start_wait_mean_s`` / ``cold_start_wait_p95_s``: their wait for a replica (arrival -> dispatch),
mean and empirical p95 over those that met one (fluid: weighted by expected counts), None when none did;
``cold_start_timeouts``: those whose wait went past ``request_timeout_s`` (still held at the end past it included);
``warm_idle_gpu_hours``: GPU-equivalent hours of replicas held in ticks where their model had nothing arriving, in
flight or held (Shahrad et al.'s wasted memory time; not ``idle_gpu_hours``, the free GPUs beside replicas);
``lower_bound_comparable``: false without a bound and under exempt (the bound judges cold-started requests, so a
policy exempting them can come out below it: ``gpu_hours_vs_lower_bound`` is None then).

**Latency.** Per model, ``latency_at_slo_percentile_s``: the latency (queue wait + service) at the model's own
declared percentile over the run, the serving engine's quantile (``SimResult.latency_at_slo_percentile_s``, from
``engine.latency_quantile`` at each model's percentile; the whole run, burn-in included). A SimResult built without
it (a hand-made one) gives it for p95 models only (``SimResult.latency_p95_s``); others are None --
``minute_latency`` is a per-tick maximum and cannot give the run's quantile exactly. None: no requests, or the
percentile falls on requests that never met a replica (infinitely late; JSON has no infinity).

**Cost.** ``cost_usd`` = ``serving_cost_usd`` + ``idle_cost_usd`` (so idle <= total, always).
``serving_cost_usd``: the GPU-equivalent hours the replicas held x the price of their GPU kind = the models'
``cost_usd`` summed (idle capacity is no model's); ``idle_cost_usd``: ``idle_gpu_hours`` -- free GPU-equivalents on
nodes holding replicas (:func:`autoscaler.accounting.cost.idle_reserved`, what a live controller can attribute) --
x price. The ``cost`` block has the same by GPU kind and team, and ``total_gpu_hours`` = ``serving_gpu_hours`` +
``idle_gpu_hours``. (``idle_reserved_gpu_hours`` below is another number: the whole inference pool less what replicas
held, every node counted.)

**Counts are integers**: requests, violating_requests, unattainable_requests, late_requests (per model, per team and
in total), scale_events, preemptions, reclaims, reclaims_late, training jobs. The fluid engine's arrivals are
expected (fractional) counts: the scorecard rounds them once per model -- the requests in minutes met and missed by
cumulative rounding (whole, adding up to the model's rounded requests, each within 1 of its unrounded value), then
each of the two split by attainability (so the violating count is the same with or without the lower bound's mask,
and the team view agrees with the card to the request); the within-latency and within-timeout counts round
the same way; totals are the per-model sums and every ratio is computed from these integers. The discrete-event
engine's counts are whole already. **Float noise**: a float within 1e-9 of 0 is stored (and printed) as 0.

Lending (issue 8; :func:`lending_card`), all over the scored period, in whole-GPU hours:

- ``idle_reserved_gpu_hours``: GPU-hours inference reserved but did not use = the inference pool's GPUs (every
  GPU of the simulated cluster except a static split's) less the GPU-equivalents its replicas held (starting,
  serving or draining) = **lent + idle not lent**. The simulated cluster is all inference's, so every node
  counts: ``idle_gpu_hours`` (above) counts only nodes holding a replica, because a live controller cannot tell
  which replica-free nodes are inference's, and counts a lent GPU as used; the two agree on nodes with replicas
  and no lent GPUs.
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

- ``requests``, ``violating_requests``, ``late_requests``, ``slo_attainment``, ``requests_within_latency``,
  ``success_rate``: as above, over the team's models;
- ``gpu_hours_allocated``: GPU-equivalent hours its replicas held (starting, serving, draining; the ``cost`` block's
  unit); ``gpu_hours_busy``: the same x the replicas' utilisation (busy servers / the servers of every replica
  holding a slot); ``utilization_busy`` = busy / allocated; ``cost_usd``: its models' cost (the "all" row:
  ``serving_cost_usd`` = the teams' summed, ``idle_cost_usd``, and ``cost_usd`` = their sum, as in the scorecard);
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
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from autoscaler.decision.arbitration import TeamQuota
from autoscaler.sim.run import SimResult

EPS = 1e-9  # float noise: a float within EPS of 0 is stored and printed as 0

# The keys, in the order the table prints them: the headline first.
COLUMNS = (
    "slo_attainment",
    "slo_attainment_attainable",
    "violating_requests",
    "unattainable_requests",
    "requests",
    "slo_minutes_met",
    "requests_within_latency",
    "late_requests",
    "success_rate",
    "gpu_hours",
    "gpu_hours_vs_lower_bound",
    "gpu_hours_vs_oracle",
    "cost_usd",
    "serving_cost_usd",
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
# Scale to and from zero (issue 18): shown in the table only when some request was cold-started or cold-started
# requests are exempt; always in the JSON.
ZERO_COLUMNS = (
    "cold_start_slo",
    "cold_started_requests",
    "cold_start_wait_mean_s",
    "cold_start_wait_p95_s",
    "cold_start_timeouts",
    "warm_idle_gpu_hours",
)
# What each printed number is (the table's first column; the field name is printed next to it). Only the headline's
# label says "SLO attainment".
LABELS: dict[str, str] = {
    "slo_attainment": "SLO attainment: requests in SLO-meeting model-minutes",
    "slo_attainment_attainable": "SLO attainment over attainable model-minutes",
    "violating_requests": "violating requests (in model-minutes that missed)",
    "unattainable_requests": "requests in model-minutes the lower bound cannot meet",
    "requests": "requests",
    "slo_minutes_met": "model-minutes that met the SLO (share of those with requests)",
    "requests_within_latency": "requests within the latency target (raw share)",
    "late_requests": "requests beyond the latency target",
    "success_rate": "requests completed within the timeout (share)",
    "gpu_hours": "GPU-hours held by replicas",
    "gpu_hours_vs_lower_bound": "GPU-hours / lower bound",
    "gpu_hours_vs_oracle": "GPU-hours / per-tick zero-cold-start oracle (not a bound)",
    "cost_usd": "cost USD (serving + idle)",
    "serving_cost_usd": "serving cost USD (GPU-hours held x price)",
    "idle_cost_usd": "idle cost USD (free GPUs on nodes holding replicas)",
    "lent_gpu_hours": "GPU-hours lent to training",
    "scale_events": "scale events",
    "unplaced_replica_minutes": "replica-minutes asked for and not placed",
    "preemptions": "replicas preempted",
    "fragmentation": "fragmentation (stranded share of free GPU memory)",
    "sim_wall_s": "simulation wall time (s)",
    "idle_reserved_gpu_hours": "idle reserved GPU-hours (inference pool less replicas)",
    "lending_efficiency": "lending efficiency (lent / idle reserved)",
    "reclaims": "reclaims",
    "reclaim_p50_s": "reclaim p50 (s)",
    "reclaim_p99_s": "reclaim p99 (s)",
    "reclaims_late": "reclaims late",
    "training_goodput_gpu_hours": "training goodput GPU-hours",
    "training_lost_gpu_hours": "training GPU-hours lost to preemption",
    "cold_start_slo": "cold-started requests in the SLO accounting (count / exempt)",
    "cold_started_requests": "cold-started requests (arrived with no routable replica)",
    "cold_start_wait_mean_s": "cold-started requests' wait for a replica, mean (s)",
    "cold_start_wait_p95_s": "cold-started requests' wait for a replica, p95 (s)",
    "cold_start_timeouts": "cold-started requests that waited past the request timeout",
    "warm_idle_gpu_hours": "warm idle GPU-hours (replicas held, model serving nothing)",
}


@dataclass(frozen=True)
class Counts:
    """Per model (M,), whole numbers (module docstring: how the fluid engine's fractions are rounded), and the
    ratios computed from them."""

    requests: np.ndarray
    violating: np.ndarray  # in model-minutes that missed
    unattainable: np.ndarray  # in model-minutes the lower bound cannot meet
    violating_attainable: np.ndarray  # in attainable model-minutes that missed
    late: np.ndarray  # beyond the latency target
    successful: np.ndarray  # completed within the request timeout
    minutes: np.ndarray  # model-minutes with requests
    minutes_met: np.ndarray  # ... that met the SLO
    cold_started: np.ndarray | None = None  # cold-started requests (issue 18), a part of requests + exempt
    exempt: np.ndarray | None = None  # cold-started requests left out of the SLO accounting (cold_start_slo "exempt")

    def all_requests(self, sel: np.ndarray | slice = slice(None)) -> int:
        """Every request of the models ``sel``, those the SLO accounting left out (``exempt``) included."""
        return int(self.requests[sel].sum()) + (0 if self.exempt is None else int(self.exempt[sel].sum()))

    def ratios(self, sel: np.ndarray | slice = slice(None)) -> dict[str, float]:
        """The ratios over the models ``sel`` (an index array or a slice) together."""
        n = int(self.requests[sel].sum())
        att = n - int(self.unattainable[sel].sum())
        mins = int(self.minutes[sel].sum())
        return {
            "slo_attainment": _share(n - int(self.violating[sel].sum()), n),
            "slo_attainment_attainable": _share(att - int(self.violating_attainable[sel].sum()), att),
            "slo_minutes_met": _share(int(self.minutes_met[sel].sum()), mins),
            "requests_within_latency": _share(n - int(self.late[sel].sum()), n),
            "success_rate": _share(int(self.successful[sel].sum()), self.all_requests(sel)),
        }


def _share(num: int, den: int) -> float:
    return num / den if den > 0 else 1.0


def _whole(parts: np.ndarray) -> np.ndarray:
    """(M, P) non-negative fractional counts -> whole ones by cumulative rounding along P: each row's parts add up
    to its rounded total and each part is within 1 of its own value."""
    cum = np.rint(np.cumsum(np.maximum(parts, 0.0), axis=1))
    return np.diff(cum, axis=1, prepend=0.0).astype(np.int64)


def model_counts(result: SimResult, attainable: np.ndarray | None = None) -> Counts:
    """The whole-number counts of every model (module docstring); ``attainable``: (M, n_minutes) bool, None = all."""
    arrivals = np.asarray(result.minute_arrivals, dtype=np.float64)
    within = np.asarray(result.minute_within, dtype=np.float64)
    cold_m = getattr(result, "minute_cold", None)
    cold_m = np.zeros_like(arrivals) if cold_m is None else np.asarray(cold_m, dtype=np.float64)
    exempting = getattr(result, "cold_start_slo", "count") == "exempt"
    total = _whole(arrivals.sum(axis=1)[:, None])[:, 0]
    cold = np.minimum(_whole(cold_m.sum(axis=1)[:, None])[:, 0], total)
    success_all = result.minute_success if result.minute_success is not None else np.zeros_like(arrivals)
    if exempting:  # the cold-started requests leave the SLO accounting: its numerator and its denominator
        arrivals = np.maximum(arrivals - cold_m, 0.0)
        cold_within = getattr(result, "minute_cold_within", None)
        if cold_within is not None:
            within = np.maximum(within - np.asarray(cold_within, dtype=np.float64), 0.0)
    if attainable is None:
        att = np.ones(arrivals.shape, dtype=bool)
    else:
        att = np.asarray(attainable, dtype=bool)
        if att.shape != arrivals.shape:
            raise ValueError(f"attainable has shape {att.shape}, the run's model-minutes {arrivals.shape}")
    has = arrivals > EPS
    share = np.divide(within, arrivals, out=np.ones_like(within), where=has)
    met = has & (share >= result.slo_percentile[:, None] / 100.0 - EPS)
    missed = has & ~met
    # Minutes without requests hold (almost) no arrivals: they join "met", so the parts cover every request.
    # Met and missed are rounded first, and then split by attainability, so that the violating count does not
    # depend on the mask (the team view, without one, says the same number).
    two = _whole(np.stack([(arrivals * ~missed).sum(axis=1), (arrivals * missed).sum(axis=1)], axis=1))
    if exempting:  # judged = the rounded requests less the rounded cold-started ones, so the two always add up
        judged = np.maximum(total - cold, 0)
        two[:, 0] = np.maximum(two[:, 0] + judged - two.sum(axis=1), 0)
        two[:, 1] = np.minimum(two[:, 1], judged - two[:, 0])
    p = np.zeros((arrivals.shape[0], 4), dtype=np.int64)
    for k, part in enumerate((~missed, missed)):
        whole = (arrivals * part).sum(axis=1)
        in_reach = (arrivals * (part & att)).sum(axis=1)
        share = np.divide(in_reach, whole, out=np.ones_like(whole), where=whole > 0)
        p[:, k] = np.minimum(np.rint(two[:, k] * share).astype(np.int64), two[:, k])  # attainable
        p[:, k + 2] = two[:, k] - p[:, k]  # not attainable
    requests = p.sum(axis=1)
    exempt = np.maximum(total - requests, 0) if exempting else np.zeros_like(requests)
    # within and successful are parts of the requests: rounded, and never more than the rounded requests
    # (successful: of every request, the exempt ones too -- the timeout is no SLO)
    ok = np.minimum(np.rint(within.sum(axis=1)).astype(np.int64), requests)
    done = np.minimum(np.rint(np.asarray(success_all, dtype=np.float64).sum(axis=1)).astype(np.int64),
                      requests + exempt)
    return Counts(
        requests=requests,
        violating=p[:, 1] + p[:, 3],
        unattainable=p[:, 2] + p[:, 3],
        violating_attainable=p[:, 1],
        late=requests - ok,
        successful=done,
        minutes=has.sum(axis=1).astype(np.int64),
        minutes_met=met.sum(axis=1).astype(np.int64),
        cold_started=np.minimum(cold, requests + exempt),
        exempt=exempt,
    )


def _weighted_quantile(x: np.ndarray, w: np.ndarray, q: float) -> float | None:
    """The smallest ``x`` that at least ``q`` of the weight does not exceed (never interpolated); None: no weight."""
    keep = w > 0
    if not keep.any():
        return None
    order = np.argsort(x[keep], kind="stable")
    xs, cum = x[keep][order], np.cumsum(w[keep][order])
    return float(xs[min(int(np.searchsorted(cum, q * cum[-1] - EPS, side="left")), len(xs) - 1)])


def cold_start_card(result: SimResult, counts: Counts) -> dict[str, Any]:
    """Cold-started requests and warm idle GPU-hours (issue 18; module docstring), overall and ``per_model``."""
    m = len(result.models)
    waits = getattr(result, "cold_waits", None)
    idle = getattr(result, "model_warm_idle_gpu_seconds", None)
    idle_h = np.zeros(m) if idle is None else np.asarray(idle, dtype=np.float64) / 3600.0
    timeout = float(result.request_timeout_s)

    def block(sel: np.ndarray) -> dict[str, Any]:
        out: dict[str, Any] = {"cold_started_requests": int(counts.cold_started[sel].sum())
                               if counts.cold_started is not None else 0,
                               "cold_start_wait_mean_s": None, "cold_start_wait_p95_s": None,
                               "cold_start_timeouts": 0, "warm_idle_gpu_hours": math.fsum(idle_h[sel])}
        if waits is None or not len(waits.t):
            return out
        mine = np.isin(waits.model_index, sel)
        met = mine & waits.dispatched
        w, x = waits.weight[met], waits.wait_s[met]
        if w.sum() > EPS:
            out["cold_start_wait_mean_s"] = float(np.dot(w, x) / w.sum())
            out["cold_start_wait_p95_s"] = _weighted_quantile(x, w, 0.95)
        # (one that gave up waited the timeout exactly; none dispatched waited past it)
        late = mine & (((waits.wait_s >= timeout - 1e-9) & ~waits.dispatched) | (waits.wait_s > timeout + 1e-9))
        out["cold_start_timeouts"] = min(int(np.rint(waits.weight[late].sum())), out["cold_started_requests"])
        return out

    return {**block(np.arange(m)), "per_model": {name: block(np.array([i])) for i, name in enumerate(result.models)}}


def latency_at_slo_percentile(result: SimResult) -> list[float | None]:
    """Per model, the run's latency at its declared percentile (module docstring: where it comes from)."""
    own = getattr(result, "latency_at_slo_percentile_s", None)
    if own is not None:
        return [_num(x) for x in np.asarray(own, dtype=np.float64)]
    p95 = np.asarray(result.latency_p95_s, dtype=np.float64)
    return [_num(p95[i]) if abs(float(pct) - 95.0) < EPS else None for i, pct in enumerate(result.slo_percentile)]


def scorecard(
    result: SimResult,
    oracle_gpu_hours: float | None = None,
    *,
    lower_bound_gpu_hours: float | None = None,
    attainable: np.ndarray | None = None,
) -> dict[str, Any]:
    """The run's scorecard (module docstring: every field). ``oracle_gpu_hours``: the per-tick zero-cold-start
    oracle's GPU-hours; ``lower_bound_gpu_hours``: the clairvoyant lower bound's; ``attainable``: (M, n_minutes)
    bool, the model-minutes that bound can meet (None: all)."""
    counts = model_counts(result, attainable)
    cost = cost_card(result)
    lend = lending_card(result)
    overall = team_card(result, attainable=attainable)["all"]
    busy_h = _per_model(result.minute_busy_gpu_s, len(result.models)) / 3600.0
    latency = latency_at_slo_percentile(result)
    cold = cold_start_card(result, counts)
    exempting = getattr(result, "cold_start_slo", "count") == "exempt"
    per_model = {}
    for i, name in enumerate(result.models):
        per_model[name] = {
            "requests": counts.all_requests(np.array([i])),
            "slo_judged_requests": int(counts.requests[i]),
            **cold["per_model"][name],
            "violating_requests": int(counts.violating[i]),
            "unattainable_requests": int(counts.unattainable[i]),
            "late_requests": int(counts.late[i]),
            **counts.ratios(np.array([i])),
            "gpu_hours_busy": float(busy_h[i]),
            "shortfall_minutes_by_cause": dict(result.shortfalls.get(name, {})),
            "slo_percentile": float(result.slo_percentile[i]),
            "latency_at_slo_percentile_s": latency[i],
            "slo_latency_s": float(result.slo_latency_s[i]),
            "mean_replicas": float(result.minute_replicas[i].mean()) if result.minute_replicas.size else 0.0,
            **cost["per_model"].get(name, {}),
        }
    card = {
        "policy": result.policy,
        "mode": result.mode,
        **counts.ratios(),
        "requests": counts.all_requests(),
        "cold_start_slo": "exempt" if exempting else "count",
        "slo_judged_requests": int(counts.requests.sum()),
        **{k: v for k, v in cold.items() if k != "per_model"},
        "violating_requests": int(counts.violating.sum()),
        "unattainable_requests": int(counts.unattainable.sum()),
        "late_requests": int(counts.late.sum()),
        "request_timeout_s": result.request_timeout_s,
        "gpu_hours": result.gpu_hours,
        "lower_bound_gpu_hours": lower_bound_gpu_hours,
        # Under "exempt" a policy may leave models at zero and exempt what arrives there: the bound, which meets
        # every attainable minute with cold-started requests judged, is no bound for that (no ratio then).
        "lower_bound_comparable": lower_bound_gpu_hours is not None and not exempting,
        "gpu_hours_vs_lower_bound": None if exempting else _ratio(result.gpu_hours, lower_bound_gpu_hours or 0.0),
        "oracle_gpu_hours": oracle_gpu_hours,
        "gpu_hours_vs_oracle": _ratio(result.gpu_hours, oracle_gpu_hours or 0.0),
        "cost_usd": cost["cost_usd"],
        "serving_cost_usd": cost["serving_cost_usd"],
        "idle_cost_usd": cost["idle_cost_usd"],
        "idle_gpu_hours": cost["idle_gpu_hours"],
        "lent_gpu_hours": lend["lent_gpu_hours"],
        **{k: lend[k] for k in LENDING_COLUMNS},
        "reclaims_within_deadline": lend["reclaims_within_deadline"],
        "reclaim_max_late_s": lend["reclaim_max_late_s"],
        "lending": lend["lending"],
        "scale_events": int(result.scale_events),
        # every decision of the scored period by its reason (those that leave the count unchanged too: stable,
        # stabilizing, metrics_stale, slo_unattainable, ...); the scale events alone by theirs
        "decisions_by_reason": {k: int(v) for k, v in result.decisions.items()},
        "scale_events_by_reason": {k: int(v) for k, v in result.reasons.items()},
        # exact MIG placements whose wall-clock safety cut fired (0: every plan of the run was the snapshot's alone)
        "exact_budget_exceeded": int(result.exact_budget_exceeded),
        "unplaced_replica_minutes": result.unplaced_replica_minutes,
        "gpu_hours_busy": overall["gpu_hours_busy"],
        "utilization_busy": overall["utilization_busy"],
        "shortfall_minutes_by_cause": overall["shortfall_minutes_by_cause"],
        "refusals_within_guarantee": overall["refusals_within_guarantee"],
        "preemptions": len(result.preemptions),
        "preemptions_by_reason": overall["preemptions_by_reason"],
        "unreasoned": int(result.unreasoned),
        **{k: overall[k] for k in TRAINING_KEYS if k not in LENDING_COLUMNS},  # (goodput is there already)
        "fragmentation": result.fragmentation,
        "gpus_total": result.gpus_total,
        "sim_wall_s": result.sim_wall_s,
        "burn_in_s": result.burn_in_s,
        "invalid_models": result.invalid_models,
        "per_model": per_model,
        "cost": {k: v for k, v in cost.items() if k != "per_model"},
    }
    return clean(card)


def clean(x: Any) -> Any:
    """JSON-ready: numpy scalars to Python numbers, floats within EPS of 0 to 0.0, recursively."""
    if isinstance(x, dict):
        return {k: clean(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [clean(v) for v in x]
    if isinstance(x, bool | np.bool_):
        return bool(x)
    if isinstance(x, int | np.integer):
        return int(x)
    if isinstance(x, float | np.floating):
        return _z(float(x))
    return x


def _z(x: float) -> float:
    return 0.0 if abs(x) < EPS else x


def cost_card(result: SimResult) -> dict[str, Any]:
    """Cost attribution of a run (scored time only, like ``gpu_hours``), priced with ``result.prices`` (module
    docstring: cost).

    ``per_model``: team, namespace, GPU-equivalent hours by GPU kind and in total, and their cost (``cost_usd``);
    ``by_team``: the same summed per team; ``idle_gpu_hours_by_kind`` / ``idle_cost_usd``: idle reserved capacity
    (free GPU-equivalents on nodes holding replicas). Sums are exact (``math.fsum``), so they do not depend on the
    order of the models; noise within EPS of 0 is 0 before anything is added up.
    """
    kinds = result.gpu_kinds
    held = result.model_gpu_seconds
    idle = result.idle_gpu_seconds
    if held is None or idle is None:
        held, idle = np.zeros((len(result.models), len(kinds))), np.zeros(len(kinds))
    prices = [float(result.prices.get(k, 0.0)) for k in kinds]
    hours = np.asarray(held, dtype=np.float64) / 3600.0
    per_model: dict[str, dict[str, Any]] = {}
    by_team: dict[str, dict[str, Any]] = {}
    for i, name in enumerate(result.models):
        team = result.teams[i] if result.teams else "default"
        h = [_z(float(x)) for x in hours[i]]
        row = {
            "team": team,
            "namespace": result.namespaces[i] if result.namespaces else "default",
            "gpu_hours": math.fsum(h),
            "gpu_hours_by_kind": {k: h[j] for j, k in enumerate(kinds) if h[j] > 0},
            "cost_usd": _z(math.fsum(x * p for x, p in zip(h, prices, strict=True))),
        }
        per_model[name] = row
        t = by_team.setdefault(team, {"models": []})
        t["models"].append(name)
    for t in by_team.values():
        t["gpu_hours"] = math.fsum(per_model[m]["gpu_hours"] for m in t["models"])
        t["cost_usd"] = math.fsum(per_model[m]["cost_usd"] for m in t["models"])
    idle_h = [_z(float(x) / 3600.0) for x in idle]
    lent = result.lent_gpu_seconds if result.lent_gpu_seconds is not None else np.zeros(len(kinds))
    lent_h = [_z(float(x) / 3600.0) for x in lent]
    serving_h = math.fsum(r["gpu_hours"] for r in per_model.values())
    serving_usd = math.fsum(r["cost_usd"] for r in per_model.values())
    idle_usd = _z(math.fsum(x * p for x, p in zip(idle_h, prices, strict=True)))
    return {
        "currency": "USD",
        "hours": result.scored_s / 3600.0,
        "prices_usd_per_gpu_hour": dict(zip(kinds, prices, strict=True)),
        "cost_usd": serving_usd + idle_usd,
        "serving_cost_usd": serving_usd,
        "idle_cost_usd": idle_usd,
        "total_gpu_hours": serving_h + math.fsum(idle_h),
        "serving_gpu_hours": serving_h,
        "idle_gpu_hours": math.fsum(idle_h),
        "idle_gpu_hours_by_kind": dict(zip(kinds, idle_h, strict=True)),
        "lent_gpu_hours": math.fsum(lent_h),
        "lent_gpu_hours_by_kind": {k: h for k, h in zip(kinds, lent_h, strict=True) if h > 0},
        "lent_value_usd": _z(math.fsum(x * p for x, p in zip(lent_h, prices, strict=True))),
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
    "violating_requests",
    "late_requests",
    "slo_attainment",
    "requests_within_latency",
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
# ... and the "all" row's extra keys (its cost_usd is serving + idle, as in the scorecard).
ALL_KEYS = (
    "gpus_total",
    "fragmentation",
    "serving_cost_usd",
    "idle_cost_usd",
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


def team_card(
    result: SimResult, quotas: Sequence[TeamQuota] = (), attainable: np.ndarray | None = None
) -> dict[str, Any]:
    """Per team and overall (module docstring): ``{"teams": [row, ...], "all": row}``.

    Teams: those of ``quotas`` (in their order, with or without models), then the models' teams (from their specs)
    in model order. ``guaranteed_gpus`` / ``borrowing_limit_gpus`` come from ``quotas`` (a team without one: 0 and
    None = no limit). Ratios are None for a team with nothing to divide (no requests, no GPU-hours). The "all" row
    sums the teams' (``borrowing_limit_gpus`` None when any team has no limit; ``models`` every model; ``cost_usd``
    serving + idle, the teams' sum being ``serving_cost_usd``) and adds the run-wide numbers (``ALL_KEYS``). Every key
    of ``TEAM_KEYS`` is in every row. Counts are the scorecard's whole numbers (:func:`model_counts`, with the same
    ``attainable`` mask as the scorecard's, so that they round the same parts and agree to the request).
    """
    models = result.models
    m = len(models)
    model_team = list(result.teams) if result.teams else ["default"] * m
    quota = {q.name: q for q in quotas}
    names = list(dict.fromkeys([*(q.name for q in quotas), *model_team]))
    counts = model_counts(result, attainable)
    busy_h = _per_model(result.minute_busy_gpu_s, m) / 3600.0
    cost = cost_card(result)
    team_of = dict(zip(models, model_team, strict=True))

    rows: dict[str, dict[str, Any]] = {}
    index: dict[str, list[int]] = {name: [] for name in names}
    for name in names:
        q = quota.get(name, TeamQuota(name))
        rows[name] = {
            "team": name, "guaranteed_gpus": float(q.guaranteed_gpus), "borrowing_limit_gpus": q.borrowing_limit_gpus,
            "models": [], "gpu_hours_busy": 0.0, "replica_wait_minutes": 0.0, "shortfall_minutes_by_cause": {},
            "refusals_within_guarantee": 0.0, "preemptions_by_reason": {}, "preemptions_caused": 0,
        }
    for i, x in enumerate(models):
        r = rows[model_team[i]]
        r["models"].append(x)
        index[model_team[i]].append(i)
        r["gpu_hours_busy"] += float(busy_h[i])
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
    for key in ("gpu_hours_busy", "replica_wait_minutes", "refusals_within_guarantee", "preemptions_caused"):
        total[key] = sum(r[key] for r in rows.values())
    for r in rows.values():
        _add(total["shortfall_minutes_by_cause"], r["shortfall_minutes_by_cause"])
        _add(total["preemptions_by_reason"], r["preemptions_by_reason"])

    def finish(r: dict[str, Any], sel: list[int]) -> dict[str, Any]:
        idx = np.array(sel, dtype=np.int64)
        n = int(counts.requests[idx].sum())
        r["requests"] = counts.all_requests(idx)
        r["violating_requests"] = int(counts.violating[idx].sum())
        r["late_requests"] = int(counts.late[idx].sum())
        ratios = counts.ratios(idx)
        for key in ("slo_attainment", "requests_within_latency", "success_rate"):
            r[key] = ratios[key] if n > 0 else None
        held = [cost["per_model"][models[i]] for i in sel]
        r["gpu_hours_allocated"] = math.fsum(h["gpu_hours"] for h in held)
        r["cost_usd"] = math.fsum(h["cost_usd"] for h in held)
        r["utilization_busy"] = _ratio(r["gpu_hours_busy"], r["gpu_hours_allocated"])
        return {k: r[k] for k in TEAM_KEYS}

    lend = lending_card(result)
    stats = result.lending
    waits = np.array(stats.job_waits_s if stats is not None else [], dtype=np.float64)
    total = finish(total, list(range(m)))
    total.update({
        "cost_usd": cost["cost_usd"],  # serving + idle, as the scorecard's
        "gpus_total": result.gpus_total,
        "fragmentation": result.fragmentation,
        "serving_cost_usd": cost["serving_cost_usd"],
        # free GPU-equivalents on nodes holding replicas (autoscaler/accounting/cost.py)
        "idle_cost_usd": cost["idle_cost_usd"],
        "lent_gpu_hours": cost["lent_gpu_hours"],
        "lent_value_usd": cost["lent_value_usd"],
        "training_jobs_started": int(waits.size),
        "training_jobs_completed": stats.jobs_finished_scored if stats is not None else 0,
        "training_wait_p50_s": float(np.quantile(waits, 0.5, method="inverted_cdf")) if waits.size else None,
        "training_wait_p95_s": float(np.quantile(waits, 0.95, method="inverted_cdf")) if waits.size else None,
        "training_goodput_gpu_hours": lend["training_goodput_gpu_hours"],
        "unreasoned": result.unreasoned,
    })
    return clean({"teams": [finish(r, index[name]) for name, r in rows.items()], "all": total})
