"""The controller's own Prometheus metrics (liveness, readiness and the HTTP server: :mod:`autoscaler.live.health`).

One module: one registry and the one class that feeds every series of it from a tick, so that the table below is
the whole of what ``/metrics`` serves.

:class:`ControllerMetrics` holds the ``slotwise_*`` metrics in its OWN ``CollectorRegistry`` (two
controllers in one process, or a test, never collide on the global one) and is fed once per tick
(:meth:`~ControllerMetrics.record_tick`: the plan, the snapshot and the metrics window the core decided on)
and once per actuation (:meth:`~ControllerMetrics.record_actuation`); :meth:`~ControllerMetrics.exposition` is
what ``/metrics`` serves.

SLO accounting: ``slotwise_requests_total`` / ``slotwise_requests_late_total`` count the requests each metrics
step of the window finished, and those settled beyond the model's SLO latency (``rate - within_rate``, see
:class:`~autoscaler.api.snapshot.ModelMetrics`), so that Prometheus can compute the error ratio over ANY window
(the burn-rate alerts in ``charts/slotwise/rules/``). Successive windows overlap (each tick reads the last
``window_s`` again), so the exporter remembers per model the time of the last step it counted and adds only
newer steps; the window's steps sit on the grid ``floor(now / step_s) * step_s - k * step_s`` (the
Prometheus adapter's ``grid`` aligns them so; a window whose newest sample is taken at ``now`` itself, one
per step, floors to the same times tick after tick). A model seen for the first time (or again after this
replica regained the lease) counts only its newest step: its history is not dumped into a counter at once,
which ``rate()`` would read as a burst.
Steps where the rate or the within-SLO rate is not a number are skipped, and so are stale models and models
whose server has no latency histogram (``within_rate`` None: nothing to judge lateness by, and a request
count without late counts would read as a perfect SLO).

Only the leader ticks, so a replica that lost the lease keeps exporting its last tick's gauges, frozen,
until it leads again or restarts (its counters freeze too: rate 0, so sums over replicas stay right).
Queries about the cluster's decisions read the leader's series: ``X and on (job, instance)
(slotwise_is_leader == 1)``, as the chart's alert rules do. A tick still under way when the lease goes
records its duration only, and a replica that regains the lease counts requests from the newest step on
(the other leader counted the steps in between).

Label cardinality stays bounded: labels are model keys (the managed models, whose series are REMOVED when
a model leaves the snapshot: no stale series forever), reasons (the core's :class:`~autoscaler.api.plan.Reason`
values; shortfall reasons are :class:`~autoscaler.api.plan.ShortfallCause` values, preemption reasons
:class:`~autoscaler.api.plan.PreemptionReason` values, anything else ``other``), teams (of the managed models and the
configured quotas), GPU kinds, and action kinds / outcomes, which come from the actuator's report lines and are
capped at :data:`MAX_LABEL_VALUES` distinct values each (beyond, ``other``).

Metrics (GPU counts are GPU-equivalents: a whole GPU is 1, a MIG instance or share its compute fraction):

==========================================================  =====================================================
``slotwise_decisions_total{model,reason}``                  decision reports (one per model with a status update
                                                            or a scale action in a tick), by reason
``slotwise_desired_replicas{model}``                        the replica count the plan wants (else the
                                                            Deployment's current scale)
``slotwise_current_replicas{model}``                        replicas placed and not draining
``slotwise_forecast_requests_per_second{model}``            the forecast's upper quantile (absent: no forecast)
``slotwise_observed_requests_per_second{model}``            the metrics window's last step (absent: stale)
``slotwise_predicted_latency_seconds{model}``               predicted latency at the SLO percentile
``slotwise_slo_latency_seconds{model}``                     the model's SLO latency
``slotwise_gpu_slots{gpu_model,state}``                     ``used`` / ``free`` by inference, ``lent`` to training
``slotwise_fragmentation_ratio``                            stranded share of free GPU memory (Inventory)
``slotwise_shortfall_replicas{team,model,reason}``          replicas asked for but not placed this tick, by cause
                                                            (``reason`` = :class:`~autoscaler.api.plan.ShortfallCause`)
``slotwise_metrics_stale{model}``                           1 while the model's metrics are stale
``slotwise_metrics_partial{model}``                         1 while only part of the model is observed (no scale-down)
``slotwise_tick_duration_seconds``                          histogram of the decision tick's duration
``slotwise_errors_total{kind}``                             errors by kind (``metrics``, ``kube``, ``actuation``, ...)
``slotwise_is_leader``                                      1 while this replica holds the leader Lease
``slotwise_actions_total{kind,outcome}``                    actuation: ``applied``, ``error`` or the skip reason
``slotwise_requests_total{model}``                          requests finished, per metrics step, each step once
``slotwise_requests_late_total{model}``                     of those, settled beyond the model's SLO latency
``slotwise_slo_objective_ratio{model}``                     the SLO's objective: percentile / 100 (e.g. 0.95)
``slotwise_lent_gpu_slots{gpu_model}``                      GPUs lent to training now (``ClusterSnapshot.lent``)
``slotwise_lends_total``                                    lends applied (a node lent; a lendingLimit raised)
``slotwise_reclaims_total{reason}``                         reclaims started, by the plan's reason
``slotwise_reclaim_duration_seconds``                       histogram: decision to reclaim -> GPUs free, per
                                                            finished reclaim; a bucket bound at the deadline
``slotwise_reclaim_deadline_seconds``                       the published reclaim deadline (``max_reclaim_s``)
``slotwise_reclaim_in_flight_age_seconds``                  the oldest reclaim in flight: seconds since its
                                                            decision (0 when none is in flight)
``slotwise_reclaims_in_flight``                             reclaims in flight (started, GPUs not free yet)
``slotwise_reclaim_evictions_refused_total{reason}``        evictions refused with 429: ``disruption-budget``
                                                            (a PodDisruptionBudget) or ``too-many-requests``
``slotwise_preemptions_total{team,model,reason}``           replicas preempted: the victim's team and model, the
                                                            :class:`~autoscaler.api.plan.PreemptionReason`
``slotwise_guarantee_refusals_total{team,model,reason}``    replicas refused while the team was inside its
                                                            guarantee (cause not ``reclaiming``/``preempting``),
                                                            in missing replicas per tick (replica-ticks)
``slotwise_team_gpus{team,kind}``                           ``held`` (GPU-equivalents the team's replicas hold in
                                                            the tick's inventory), ``guaranteed``, ``limit``
                                                            (guarantee + borrowing limit; only when finite)
``slotwise_advised_replicas{namespace,kind,name}``          advise mode: the replicas slotwise would set on a
                                                            workload an HPA / KEDA ScaledObject scales, for that
                                                            autoscaler to act on (``record_advice``)
==========================================================  =====================================================

Advice (issue 17): a workload another autoscaler scales gets no /scale write from slotwise; with
``actuator.coexistence: advise`` its desired replicas are published as ``slotwise_advised_replicas``, labelled by the
workload's own ``namespace``, ``kind`` and ``name`` (the chart's ServiceMonitor honours labels, so ``namespace`` stays
the workload's), so that a KEDA prometheus trigger or a prometheus-adapter external rule selects one workload with
plain label matchers. Unlike the other gauges these series are REMOVED when this replica loses the lease: an
autoscaler must never act on a follower's frozen advice (no series: KEDA / the HPA get no metric and hold).

Arbitration (issue 9): a model's team is its spec's (``slotwise.io/team``; ``unknown`` for invalid annotations,
as in :mod:`autoscaler.accounting.cost`), else the Shortfall's ``team``. A preemption is a ``RemoveReplica`` with
``preempted_by`` set; it is counted when planned (in a dry run too, like the decisions), once per replica even
when the core plans it again on later ticks (the scale write failed or was rate-limited, or a dry run changed
nothing): the exporter remembers preempted replicas for :data:`PREEMPTION_MEMORY_S`. Each managed model has a
``slotwise_preemptions_total`` series at 0 per preemption reason from its first tick, so that ``increase()``
sees its first preemption (a series born at 1 would hide it). Shortfall series of a model or cause absent this
tick are removed (a gauge that exists says "short now").

Lending (issue 8) is fed by :meth:`~ControllerMetrics.record_lending` with the lending actuator's report
(:class:`~autoscaler.live.kube.lending.LendingReport`, duck-typed) and, for the lent gauge, by
:meth:`~ControllerMetrics.record_tick` from the snapshot. The reclaim histogram has a bucket bound exactly at the
deadline given to the constructor (``reclaim_deadline_s``), so the alert ``SlotwiseReclaimTooSlow`` (p99 above
``slotwise_reclaim_deadline_seconds``) compares at a bucket edge, where ``histogram_quantile`` is exact. A reclaim
stuck in flight (never in the histogram) shows in the in-flight age, which ``SlotwiseReclaimStuck`` compares.
In ``slotwise_gpu_slots`` a lent GPU is ``lent``, neither ``used`` nor ``free`` (used + free + lent = the GPUs);
training that runs on GPUs slotwise did not lend (e.g. Kueue borrowing on its own) counts as ``lent`` too.
"""

from __future__ import annotations

import contextlib
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from autoscaler.accounting.cost import DEFAULT_TEAM, identity
from autoscaler.api.plan import (
    Plan,
    PreemptionReason,
    RemoveReplica,
    ScaleModel,
    Shortfall,
    ShortfallCause,
    UpdateStatus,
)
from autoscaler.api.snapshot import ClusterSnapshot, MetricsWindow
from autoscaler.decision.arbitration import TeamQuota
from sharing.lending import LENT_MODEL
from sharing.slots import Inventory

MAX_LABEL_VALUES = 32  # distinct action kinds / outcomes / error kinds kept before folding into "other"
TICK_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
# Reclaims take a training pod's grace period plus eviction and scheduling: seconds to tens of minutes.
RECLAIM_BUCKETS = (1.0, 2.5, 5.0, 10.0, 15.0, 30.0, 45.0, 60.0, 90.0, 120.0, 180.0, 240.0, 300.0, 600.0, 1200.0)
DEFAULT_RECLAIM_DEADLINE_S = 120.0  # LendingPolicy.max_reclaim_s's default
_WORD = re.compile(r"[a-z][a-z0-9_-]{0,39}")
_GRID_EPS = 1e-6  # in steps: two step times closer than this are the same step (float noise of now / step_s)
# A replica preempted is counted once; the core may plan the same preemption again while the scale-down has not
# happened yet (a failed or rate-limited write, the ReplicaSet not done): remember it this long.
PREEMPTION_MEMORY_S = 3600.0
PREEMPTION_MEMORY_MAX = 10_000  # replicas remembered at most (the oldest are forgotten first)
# Shortfall causes that are grants in progress, not refusals (plan.ShortfallCause)
GRANT_CAUSES = frozenset({str(ShortfallCause.RECLAIMING), str(ShortfallCause.PREEMPTING)})
_CAUSES = frozenset(str(c) for c in ShortfallCause)
_PREEMPTION_REASONS = tuple(str(r) for r in PreemptionReason)


def step_times(now: float, step_s: float, n: int) -> np.ndarray:
    """The times of a window's ``n`` steps (oldest first) on the grid of ``step_s`` ending at or before ``now``
    (what :meth:`~autoscaler.live.prometheus.metrics.PrometheusMetrics.grid` builds)."""
    end = math.floor(now / step_s + 1e-9) * step_s
    return end - step_s * np.arange(n - 1, -1, -1, dtype=float)


class _Bounded:
    """Maps free label text to at most ``limit`` distinct values (a short lowercase word, else ``other``)."""

    def __init__(self, limit: int = MAX_LABEL_VALUES) -> None:
        self.limit = limit
        self.seen: set[str] = set()

    def __call__(self, text: str) -> str:
        word = (text.strip().split() or ["other"])[0].lower().rstrip(":,;")
        if not _WORD.fullmatch(word):
            return "other"
        if word in self.seen:
            return word
        if len(self.seen) >= self.limit:
            return "other"
        self.seen.add(word)
        return word


def reclaim_buckets(deadline_s: float) -> tuple[float, ...]:
    """The reclaim histogram's bucket bounds: :data:`RECLAIM_BUCKETS` plus the deadline itself."""
    if not (math.isfinite(deadline_s) and deadline_s > 0):
        raise ValueError(f"reclaim deadline must be a positive number of seconds, got {deadline_s!r}")
    return tuple(sorted({*RECLAIM_BUCKETS, float(deadline_s)}))


def _lent_device(inventory: Inventory, entries: tuple) -> bool:
    return bool(entries) and all(inventory.model_of(owner) == LENT_MODEL for owner, _ in entries)


def gpu_slots(inventory: Inventory) -> dict[str, tuple[float, float]]:
    """GPU kind -> (used, free) in GPU-equivalents: per device, 1 under a whole slot, else the sum of its
    slots' compute fractions (capped at 1: time-slicing may oversubscribe compute); free = devices - used.
    GPUs lent to training (held by :data:`~sharing.lending.LENT_MODEL`) are neither: see :func:`lent_gpus`."""
    out: dict[str, list[float]] = {}
    for d in inventory.devices.values():
        acc = out.setdefault(d.gpu_model, [0.0, 0.0])
        if _lent_device(inventory, d.entries):
            continue
        if d.whole_owner is not None:  # a whole slot (of one or several GPUs) takes each of its devices
            used = 1.0
        else:
            used = min(1.0, sum(s.compute_fraction for _, s in d.entries))
        acc[0] += used
        acc[1] += 1.0 - used
    return {k: (used, free) for k, (used, free) in out.items()}


def lent_by_kind(snapshot: ClusterSnapshot) -> dict[str, int]:
    """GPU kind -> GPUs lent now (``ClusterSnapshot.lent``; a lent GPU outside the inventory is ``unknown``)."""
    nodes = snapshot.inventory.nodes
    out: dict[str, int] = {}
    for node, _dev in snapshot.lent:
        kind = nodes[node].gpu_model if node in nodes else "unknown"
        out[kind] = out.get(kind, 0) + 1
    return out


def lent_gpus(snapshot: ClusterSnapshot) -> dict[str, float]:
    """GPU kind -> GPU-equivalents held by preemptible training: the GPUs lent (:func:`lent_by_kind`), plus
    running training on nodes holding no lent GPU (capacity slotwise did not lend, e.g. borrowed through Kueue on
    its own), spread evenly over a workload's nodes (a workload on no known node counts under ``unknown``)."""
    out: dict[str, float] = {k: float(v) for k, v in lent_by_kind(snapshot).items()}
    nodes = snapshot.inventory.nodes
    lent_nodes = {node for node, _ in snapshot.lent}
    for w in snapshot.training:
        if not w.running or w.gpus <= 0:
            continue
        where = list(w.nodes) or [None]
        for n in where:
            if n in lent_nodes:
                continue  # its share there is the lent GPUs, counted above
            kind = nodes[n].gpu_model if n in nodes else "unknown"
            out[kind] = out.get(kind, 0.0) + w.gpus / len(where)
    return out


class ControllerMetrics:
    """The controller's Prometheus metrics, in their own registry (``registry``: share one, else new)."""

    def __init__(self, registry: CollectorRegistry | None = None, *,
                 reclaim_deadline_s: float = DEFAULT_RECLAIM_DEADLINE_S, teams: Sequence[TeamQuota] = ()) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.reclaim_deadline_s = float(reclaim_deadline_s)
        # the team quotas of the arbitration settings: the guaranteed / limit series of slotwise_team_gpus
        self.quotas = {t.name: t for t in teams}
        self.decisions = Counter(
            "slotwise_decisions", "Decision reports per model and reason.", ["model", "reason"], registry=r
        )
        self.desired = Gauge("slotwise_desired_replicas", "Replicas the plan wants.", ["model"], registry=r)
        self.current = Gauge(
            "slotwise_current_replicas", "Replicas placed and not draining.", ["model"], registry=r
        )
        self.forecast = Gauge(
            "slotwise_forecast_requests_per_second", "Forecast load (upper quantile).", ["model"], registry=r
        )
        self.observed = Gauge(
            "slotwise_observed_requests_per_second", "Observed load, last metrics step.", ["model"], registry=r
        )
        self.predicted = Gauge(
            "slotwise_predicted_latency_seconds",
            "Predicted latency at the SLO percentile for the desired replicas at the forecast load.",
            ["model"],
            registry=r,
        )
        self.slo = Gauge("slotwise_slo_latency_seconds", "The model's SLO latency.", ["model"], registry=r)
        self.gpu_slots = Gauge(
            "slotwise_gpu_slots",
            "GPU-equivalents used and free by inference, and lent to preemptible training.",
            ["gpu_model", "state"],
            registry=r,
        )
        self.fragmentation = Gauge(
            "slotwise_fragmentation_ratio", "Share of free GPU memory that is stranded.", registry=r
        )
        self.shortfall = Gauge(
            "slotwise_shortfall_replicas", "Replicas asked for but not placed this tick, by cause.",
            ["team", "model", "reason"], registry=r,
        )
        self.preemptions = Counter(
            "slotwise_preemptions",
            "Replicas preempted for another model, by the victim's team and model and the preemption reason.",
            ["team", "model", "reason"], registry=r,
        )
        self.guarantee_refusals = Counter(
            "slotwise_guarantee_refusals",
            "Replicas refused while the model's team was inside its guarantee, per tick (replica-ticks), by cause.",
            ["team", "model", "reason"], registry=r,
        )
        self.team_gpus = Gauge(
            "slotwise_team_gpus",
            "GPU-equivalents a team's replicas hold (held), its guarantee (guaranteed), guarantee + borrowing "
            "limit (limit, only when finite).",
            ["team", "kind"], registry=r,
        )
        self.stale = Gauge("slotwise_metrics_stale", "1 while a model's metrics are stale.", ["model"], registry=r)
        self.partial = Gauge("slotwise_metrics_partial", "1 while a model is partially observed (targets not "
                             "scraped, an empty or NaN window): it does not scale down.", ["model"], registry=r)
        self.tick_duration = Histogram(
            "slotwise_tick_duration_seconds", "Duration of a decision tick.", buckets=TICK_BUCKETS, registry=r
        )
        self.errors = Counter("slotwise_errors", "Errors by kind.", ["kind"], registry=r)
        self.exact_budget_exceeded = Counter(
            "slotwise_exact_budget_exceeded", "Exact MIG placements stopped by their wall-clock safety cut, not their "
            "work limit (exact_budget_s): those plans may differ on another machine.", registry=r)
        self.leader = Gauge("slotwise_is_leader", "1 while this replica is the leader.", registry=r)
        self.actions = Counter(
            "slotwise_actions", "Actuation outcomes per action kind.", ["kind", "outcome"], registry=r
        )
        self.requests = Counter(
            "slotwise_requests", "Requests finished per model (each metrics step counted once).", ["model"],
            registry=r,
        )
        self.requests_late = Counter(
            "slotwise_requests_late", "Requests settled beyond the model's SLO latency.", ["model"], registry=r
        )
        self.objective = Gauge(
            "slotwise_slo_objective_ratio", "Share of requests that must meet the SLO latency (percentile / 100).",
            ["model"], registry=r,
        )
        self.lent_slots = Gauge(
            "slotwise_lent_gpu_slots", "GPUs lent to preemptible training now.", ["gpu_model"], registry=r
        )
        self.lends = Counter("slotwise_lends", "Lends applied (a node lent, a lendingLimit raised).", registry=r)
        self.reclaims = Counter("slotwise_reclaims", "Reclaims of lent GPUs started, by reason.", ["reason"],
                                registry=r)
        self.reclaim_duration = Histogram(
            "slotwise_reclaim_duration_seconds",
            "From the decision to reclaim lent GPUs until they are free (one observation per finished reclaim).",
            buckets=reclaim_buckets(self.reclaim_deadline_s), registry=r,
        )
        self.reclaim_deadline = Gauge(
            "slotwise_reclaim_deadline_seconds", "The published reclaim deadline (maxReclaimSeconds).", registry=r
        )
        self.reclaim_deadline.set(self.reclaim_deadline_s)
        self.reclaim_in_flight_age = Gauge(
            "slotwise_reclaim_in_flight_age_seconds",
            "Seconds since the decision of the oldest reclaim still in flight (0 when none is).", registry=r
        )
        self.reclaims_in_flight = Gauge(
            "slotwise_reclaims_in_flight", "Reclaims of lent GPUs started and not finished.", registry=r
        )
        self.evictions_refused = Counter(
            "slotwise_reclaim_evictions_refused",
            "Evictions of training pods refused with 429: by a PodDisruptionBudget or by the server throttling.",
            ["reason"], registry=r,
        )
        self.advised = Gauge(
            "slotwise_advised_replicas",
            "Advise mode: the replicas slotwise would set on a workload an HPA or KEDA ScaledObject scales.",
            ["namespace", "kind", "name"], registry=r,
        )
        self._advised: set[tuple[str, str, str]] = set()  # (namespace, kind, name) series set last tick
        self._lent_kinds: set[str] = set()
        self._reclaim_reason = _Bounded()
        self._counted_until: dict[str, float] = {}  # model -> time of the newest metrics step counted
        self._follower = False  # told it lost the lease (never told anything: a single replica, a test)
        self._models: set[str] = set()
        self._shortfalls: set[tuple[str, str, str]] = set()  # (team, model, cause) series set last tick
        self._arb_series: dict[str, set[tuple[Any, tuple[str, str, str]]]] = {}  # model -> (counter, labels)
        self._preempted: dict[tuple[str, str], float] = {}  # (model, replica) -> when last planned
        self._teams: set[str] = set()  # teams with slotwise_team_gpus series
        self._decision_labels: set[tuple[str, str]] = set()
        self._gpu_kinds: set[str] = set()
        self._action_kind = _Bounded()
        self._outcome = _Bounded()
        self._error_kind = _Bounded()

    # -- per tick ---------------------------------------------------------------------------------------
    def record_tick(self, plan: Plan, snapshot: ClusterSnapshot, window: MetricsWindow, seconds: float) -> None:
        """One decision tick: per-model gauges, decisions, shortfalls, GPU slots, the tick's duration.

        A tick that finishes after this replica lost the lease records its duration only: its numbers are
        no longer the cluster's decisions (see :meth:`set_leader`)."""
        if self._follower:
            self.tick_duration.observe(max(0.0, seconds))
            return
        models = set(snapshot.models)
        for gone in self._models - models:
            self._forget(gone)
        self._models = models

        if plan.exact_budget_exceeded:
            self.exact_budget_exceeded.inc(plan.exact_budget_exceeded)
        scales = {a.model: a for a in plan.of_type(ScaleModel)}
        statuses = {a.model: a for a in plan.of_type(UpdateStatus)}
        for name, obs in snapshot.models.items():
            scale, status = scales.get(name), statuses.get(name)
            desired = scale.replicas if scale else status.desired if status else obs.desired_replicas
            self.desired.labels(name).set(desired)
            self.current.labels(name).set(obs.active_replicas)
            reason = status.reason if status else scale.reason if scale else None
            if reason is not None:
                self.decisions.labels(name, str(reason)).inc()
                self._decision_labels.add((name, str(reason)))
            slo_ms = status.slo_latency_ms if status and status.slo_latency_ms is not None else None
            if slo_ms is None and obs.spec is not None:
                slo_ms = obs.spec.slo_latency_ms
            self._set_or_remove(self.slo, name, None if slo_ms is None else slo_ms / 1000.0)
            objective = None if obs.spec is None else obs.spec.slo_percentile / 100.0
            self._set_or_remove(self.objective, name, objective)
            if status is not None:  # a status update carries the decision's numbers; between them they hold
                self._set_or_remove(self.forecast, name, status.forecast_rps)
                pred = status.predicted_latency_ms
                self._set_or_remove(self.predicted, name, None if pred is None else pred / 1000.0)
            m = window.models.get(name)
            stale = m is None or m.stale
            self.stale.labels(name).set(1.0 if stale else 0.0)
            self.partial.labels(name).set(0.0 if stale or m is None or m.partial_reason() is None else 1.0)
            observed = None
            if not stale and m is not None and m.rate.size and math.isfinite(float(m.rate[-1])):
                observed = float(m.rate[-1])
            self._set_or_remove(self.observed, name, observed)
            if not stale and m is not None:
                self._count_requests(name, m.rate, m.within_rate, window)

        self._record_arbitration(plan, snapshot)

        inv = snapshot.inventory
        slots = gpu_slots(inv)
        lent = lent_gpus(snapshot)
        kinds = set(slots) | set(lent)
        for kind in self._gpu_kinds - kinds:
            for state in ("used", "free", "lent"):
                self._remove(self.gpu_slots, kind, state)
        for kind in kinds:
            used, free = slots.get(kind, (0.0, 0.0))
            self.gpu_slots.labels(kind, "used").set(used)
            self.gpu_slots.labels(kind, "free").set(free)
            self.gpu_slots.labels(kind, "lent").set(lent.get(kind, 0.0))
        self._gpu_kinds = kinds
        # lent GPUs per kind, 0 for every kind in the inventory (a series that exists says "nothing lent")
        lent_now = lent_by_kind(snapshot)
        lent_kinds = {d.gpu_model for d in inv.devices.values()} | set(lent_now)
        for kind in self._lent_kinds - lent_kinds:
            self._remove(self.lent_slots, kind)
        for kind in lent_kinds:
            self.lent_slots.labels(kind).set(lent_now.get(kind, 0))
        self._lent_kinds = lent_kinds
        self.fragmentation.set(inv.fragmentation())
        self.tick_duration.observe(max(0.0, seconds))

    # -- arbitration: shortfalls by cause, preemptions, guarantee refusals, team GPUs ----------------------------
    @staticmethod
    def _team(snapshot: ClusterSnapshot, model: str, hint: str = "") -> str:
        """The model's team: its spec's (as cost attribution names it), else ``hint`` (a Shortfall's team)."""
        obs = snapshot.models.get(model)
        if obs is not None and obs.spec is not None:
            return identity(model, obs)[0]
        return hint or (identity(model, obs)[0] if obs is not None else DEFAULT_TEAM)

    def _arb_inc(self, counter: Counter, labels: tuple[str, str, str], amount: float) -> None:
        counter.labels(*labels).inc(amount)
        self._arb_series.setdefault(labels[1], set()).add((counter, labels))

    def _record_arbitration(self, plan: Plan, snapshot: ClusterSnapshot) -> None:
        now = snapshot.now
        # a model whose team changed (its annotation was edited) drops the old team's series: one identity each
        for name in snapshot.models:
            team = self._team(snapshot, name)
            for counter, labels in [x for x in self._arb_series.get(name, ()) if x[1][0] != team]:
                self._remove(counter, *labels)
                self._arb_series[name].discard((counter, labels))
            if snapshot.models[name].spec is None:
                continue  # invalid annotations: the core leaves the model alone, nothing preempts it
            for reason in _PREEMPTION_REASONS:  # 0 from the first tick: increase() sees the first preemption
                self._arb_inc(self.preemptions, (team, name, reason), 0.0)

        shortfalls: dict[tuple[str, str, str], int] = {}
        for a in plan.of_type(Shortfall):
            cause = str(a.cause) if str(a.cause) in _CAUSES else "other"
            key = (self._team(snapshot, a.model, a.team), a.model, cause)
            shortfalls[key] = shortfalls.get(key, 0) + a.missing
            if a.within_guarantee and cause not in GRANT_CAUSES and a.missing > 0:
                self._arb_inc(self.guarantee_refusals, key, float(a.missing))
        for key in self._shortfalls - set(shortfalls):
            self._remove(self.shortfall, *key)
        for key, missing in shortfalls.items():
            self.shortfall.labels(*key).set(missing)
        self._shortfalls = set(shortfalls)

        for a in plan.of_type(RemoveReplica):
            if not a.preempted_by:
                continue
            seen = (a.model, a.replica_id)
            if seen not in self._preempted:
                reason = str(a.reason) if str(a.reason) in _PREEMPTION_REASONS else "other"
                self._arb_inc(self.preemptions, (self._team(snapshot, a.model), a.model, reason), 1.0)
            self._preempted[seen] = now
        self._preempted = {k: t for k, t in self._preempted.items() if now - t <= PREEMPTION_MEMORY_S}
        if len(self._preempted) > PREEMPTION_MEMORY_MAX:
            newest = sorted(self._preempted.items(), key=lambda kv: kv[1])[-PREEMPTION_MEMORY_MAX:]
            self._preempted = dict(newest)

        held: dict[str, float] = {}
        for model, allocations in snapshot.inventory.allocations_by_model().items():
            if model not in snapshot.models:  # lent training (LENT_MODEL) and unmanaged holders: no team
                continue
            team = self._team(snapshot, model)
            held[team] = held.get(team, 0.0) + sum(slot.gpu_fraction for _, slot in allocations)
        teams = set(held) | set(self.quotas) | {self._team(snapshot, m) for m in snapshot.models}
        for team in self._teams - teams:
            for kind in ("held", "guaranteed", "limit"):
                self._remove(self.team_gpus, team, kind)
        for team in teams:
            quota = self.quotas.get(team) or TeamQuota(team)
            self.team_gpus.labels(team, "held").set(held.get(team, 0.0))
            self.team_gpus.labels(team, "guaranteed").set(quota.guaranteed_gpus)
            if math.isfinite(quota.limit_gpus):
                self.team_gpus.labels(team, "limit").set(quota.limit_gpus)
            else:
                self._remove(self.team_gpus, team, "limit")
        self._teams = teams

    def _count_requests(self, model: str, rate: np.ndarray, within: np.ndarray | None, window: MetricsWindow) -> None:
        """Add the requests (and the late ones) of the window's steps not counted yet (module docstring)."""
        step = float(window.step_s)
        if within is None or not (math.isfinite(step) and step > 0):
            return
        n = min(rate.size, within.size)
        if n == 0:
            return
        rate_s = np.asarray(rate[-n:], dtype=float)  # both arrays end at the newest step
        within_s = np.asarray(within[-n:], dtype=float)
        times = step_times(window.now, step, n)
        last = self._counted_until.get(model)
        new = np.zeros(n, dtype=bool)
        if last is None:
            new[-1] = True  # first sight: the newest step only, no history dumped into the counter
        else:
            new = times > last + _GRID_EPS * step
        ok = new & np.isfinite(rate_s) & np.isfinite(within_s) & (rate_s >= 0)
        finished = float(np.sum(rate_s[ok])) * step
        # within can exceed rate by a little: the histogram and the request counter are separate series
        late = float(np.sum(np.clip(rate_s[ok] - within_s[ok], 0.0, rate_s[ok]))) * step
        self.requests.labels(model).inc(finished)  # inc(0) still creates the series: rate() starts at 0
        self.requests_late.labels(model).inc(late)
        self._counted_until[model] = float(times[-1]) if last is None else max(last, float(times[-1]))

    def _forget(self, model: str) -> None:
        """Remove every per-model series of a model that left (its counters too: a key that comes back
        starts from zero, which ``rate()`` reads as a counter reset)."""
        for g in (self.desired, self.current, self.forecast, self.observed, self.predicted, self.slo, self.stale,
                  self.partial, self.objective):
            self._remove(g, model)
        for c in (self.requests, self.requests_late):
            self._remove(c, model)
        self._counted_until.pop(model, None)
        for labels in [k for k in self._decision_labels if k[0] == model]:
            self._remove(self.decisions, *labels)
            self._decision_labels.discard(labels)
        for key in [k for k in self._shortfalls if k[1] == model]:
            self._remove(self.shortfall, *key)
            self._shortfalls.discard(key)
        for counter, labels in self._arb_series.pop(model, set()):
            self._remove(counter, *labels)
        for key in [k for k in self._preempted if k[0] == model]:
            del self._preempted[key]

    @staticmethod
    def _remove(metric: Any, *labels: str) -> None:
        with contextlib.suppress(KeyError):  # never set: nothing to remove
            metric.remove(*labels)

    def _set_or_remove(self, gauge: Gauge, model: str, value: float | None) -> None:
        if value is None or not math.isfinite(value):
            self._remove(gauge, model)
        else:
            gauge.labels(model).set(value)

    # -- per actuation and events ---------------------------------------------------------------------
    def record_actuation(self, report: Any) -> None:
        """Count an actuation report (duck-typed: ``applied`` lines, ``skipped`` (line, why) pairs,
        ``errors`` lines); an action's kind is its line's first word (``scale``, ``template``, ...)."""
        for line in getattr(report, "applied", ()) or ():
            self.actions.labels(self._action_kind(str(line)), "applied").inc()
        for item in getattr(report, "skipped", ()) or ():
            line, why = (item[0], item[1]) if isinstance(item, tuple | list) and len(item) >= 2 else (item, "")
            self.actions.labels(self._action_kind(str(line)), self._outcome(str(why))).inc()
        for line in getattr(report, "errors", ()) or ():
            self.actions.labels(self._action_kind(str(line)), "error").inc()

    def record_lending(self, report: Any) -> None:
        """Count a lending report (duck-typed, :class:`~autoscaler.live.kube.lending.LendingReport` or the
        simulator's equivalent): ``lends`` (a count, or a sequence of lends), ``reclaims_started`` ((node, reason)
        pairs, or objects with ``reason``), ``reclaims_done`` (objects with ``seconds``, or seconds). Counted by a
        follower too: a reclaim the leader started before losing the lease still finishes in its report."""
        lends = getattr(report, "lends", 0) or 0
        n = lends if isinstance(lends, int | float) else len(lends)
        if n > 0:
            self.lends.inc(n)
        for started in getattr(report, "reclaims_started", ()) or ():
            reason = started[1] if isinstance(started, tuple | list) else getattr(started, "reason", "")
            self.reclaims.labels(self._reclaim_reason(str(reason) or "other")).inc()
        for done in getattr(report, "reclaims_done", ()) or ():
            seconds = float(done if isinstance(done, int | float) else getattr(done, "seconds", math.nan))
            if math.isfinite(seconds) and seconds >= 0:
                self.reclaim_duration.observe(seconds)
        for _, why in getattr(report, "blocked", ()) or ():
            self.evictions_refused.labels(
                why if why in ("disruption-budget", "too-many-requests") else "other").inc()
        age = getattr(report, "in_flight_age_s", None)
        if isinstance(age, int | float) and math.isfinite(age):
            self.reclaim_in_flight_age.set(max(0.0, float(age)))
            self.reclaims_in_flight.set(float(getattr(report, "in_flight", 0) or 0))

    def record_advice(self, plan: Plan, models: Mapping[str, Any], *, advise: bool) -> None:
        """``slotwise_advised_replicas`` for each model another autoscaler scales, when ``advise``
        (``actuator.coexistence: advise``). ``models``: the view's managed models by key (duck-typed
        :class:`~autoscaler.live.kube.objects.ManagedModel`: ``autoscaled_by``, ``namespace``, ``kind``, ``name``,
        ``replicas``, ``unavailable_replicas``). The value is what slotwise would write to the workload's /scale:
        the plan's ``ScaleModel`` plus the replicas on nodes out of service (which the ReplicaSet still counts),
        else the replicas as read (nothing to change). Series of models gone, no longer autoscaled, or of
        hands-off mode are removed; a follower records nothing (see :meth:`set_leader`)."""
        if self._follower:
            return
        scales = {a.model: a for a in plan.of_type(ScaleModel)}
        advised: dict[tuple[str, str, str], int] = {}
        for key, mm in models.items() if advise else ():
            if not getattr(mm, "autoscaled_by", None):
                continue
            scale = scales.get(key)
            value = scale.replicas + int(getattr(mm, "unavailable_replicas", 0) or 0) if scale else mm.replicas
            advised[(str(mm.namespace), str(mm.kind), str(mm.name))] = int(value)
        for labels in self._advised - set(advised):
            self._remove(self.advised, *labels)
        for labels, value in advised.items():
            self.advised.labels(*labels).set(value)
        self._advised = set(advised)

    def error(self, kind: str) -> None:
        self.errors.labels(self._error_kind(kind)).inc()

    def set_leader(self, leader: bool) -> None:
        """Leadership changed. Gauges stay as they are (a replica shutting down gives the lease up and its
        last numbers are still worth a scrape; queries tell the leader by ``slotwise_is_leader``). What
        was counted is forgotten: after regaining the lease only new steps count, the other leader counted
        the ones in between (the counters themselves never go back)."""
        self.leader.set(1.0 if leader else 0.0)
        self._follower = not leader
        if not leader:
            self._counted_until.clear()
            for labels in self._advised:  # no autoscaler acts on a follower's frozen advice
                self._remove(self.advised, *labels)
            self._advised = set()

    def exposition(self) -> bytes:
        """The registry in the Prometheus text format (what ``/metrics`` serves)."""
        return generate_latest(self.registry)
