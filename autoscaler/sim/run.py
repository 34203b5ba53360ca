"""The simulated control loop: the same decision core as the live controller, on a simulated cluster.

Configured by the same function as the controller (:func:`autoscaler.decision.config.build_core`) and planned by
the same call (:func:`autoscaler.decision.tick.plan_tick`: decide, then the MIG layouts, time-slicing config and slot
templates the placements imply). Time advances in ticks of ``tick_s`` without sleeping. Each tick:

    advance cluster (readiness, drains) -> snapshot + metrics window -> plan_tick (pure core) -> apply plan
    -> queue engine serves the tick's traffic -> metrics recorded

and the scorecard accumulates (see :mod:`autoscaler.sim.scorecard`). With ``SimConfig.lending`` the core's lend
stage lends idle GPUs and the cluster runs preemptible training on them (:mod:`autoscaler.sim.training`); with
``SimConfig.static_training_gpus`` a fixed part of the cluster runs training instead (the static-split baseline).

Team numbers (issue 9; :func:`autoscaler.sim.scorecard.team_card`), scored ticks only: per model and minute the
requests that completed within ``SimConfig.request_timeout_s`` (``minute_success``), the GPU-equivalent seconds held
(``minute_gpu_s``) and busy (``minute_busy_gpu_s`` = held x the replicas' utilisation, busy servers / the servers of
every replica holding a slot, so a starting replica is held and idle); from every tick's plan (as the cluster keeps
them, :mod:`autoscaler.sim.cluster`) the replica-minutes short per model and cause (``shortfalls``), those refused
while the team was inside its guarantee (``refusals_within_guarantee``), the preemptions carried out
(``preemptions``) and the decisions without a reason (``unreasoned``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from autoscaler.accounting.cost import UNKNOWN_TEAM, price_table
from autoscaler.api.ports import Actuator, ClusterPort, MetricsPort
from autoscaler.api.spec import ModelSpec
from autoscaler.decision.arbitration import ArbitrationPolicy
from autoscaler.decision.config import DEFAULT_EXACT_BUDGET_S, CoreConfig, build_core
from autoscaler.decision.node_actions import NodeActionState
from autoscaler.decision.scaledown import DEFAULT_KV_SATURATION
from autoscaler.decision.state import fresh_state
from autoscaler.decision.tick import plan_tick
from autoscaler.estimation.forecast import FleetForecaster
from autoscaler.estimation.idle_times import IdleTimes
from autoscaler.policies.base import Policy
from autoscaler.policies.keepalive import histogram_range_s
from autoscaler.sim.cluster import SHORTFALL_CAUSES, SimCluster
from autoscaler.sim.engines import make_engine
from autoscaler.sim.lending import LendingStats
from autoscaler.sim.metrics import SimMetrics
from autoscaler.sim.queueing import ColdWaits, TickStats
from autoscaler.sim.training import TrainingJob, TrainingQueue, load_training
from autoscaler.sim.workload import SimWorkload, served_as
from sharing.lending import LendingPolicy
from sharing.packer import Packer, allocate_group, place_group
from sharing.slots import NodeSpec, Slot

Progress = Callable[[float], None]  # called with the fraction done
COLD_START_SLO = ("count", "exempt")  # SimConfig.cold_start_slo
# A model "serves nothing" in a tick (warm idle, issue 18) when nothing arrives and fewer than this many requests are
# in flight or held: the fluid engine's state decays towards 0 without reaching it.
IDLE_IN_FLIGHT = 1e-2
EPS_ARRIVALS = 1e-9


@dataclass(frozen=True)
class ClusterEvent:
    """A change to the simulated cluster at ``at_s`` (seconds into the simulated period), from a scenario file
    (:mod:`autoscaler.sim.scenario`). Applied at the first tick boundary at or after ``at_s``.

    - ``node_lost``: ``target`` is a node name, or with ``count`` a GPU kind: that many of its nodes (those holding
      the most replicas' GPUs first -- of the models in ``holding`` when given) are lost; every replica on a lost
      node is lost at once.
    - ``gpu_kind_removed``: every node of GPU kind ``target`` is lost.
    """

    at_s: float
    kind: str  # "node_lost" | "gpu_kind_removed"
    target: str
    count: int | None = None
    holding: tuple[str, ...] = ()  # rank a kind's nodes by these models' replicas only (a team's, say)


def _nodes_of_kind(cluster: SimCluster, kind: str) -> list[str]:
    from sharing.catalog import load_catalog

    canon = load_catalog().get(kind).name
    return [n.name for n in cluster.inventory.nodes.values()
            if n.gpu_model == canon and n.gpu_count and n.name not in cluster.lost_nodes]


def apply_event(cluster: SimCluster, event: ClusterEvent, now: float) -> dict[str, object]:
    """Carry out ``event`` on ``cluster`` at ``now``; returns what happened (for the scenario report)."""
    if event.kind == "node_lost" and event.count is None:
        nodes = [event.target] if event.target not in cluster.lost_nodes else []
    else:
        nodes = _nodes_of_kind(cluster, event.target)
        if event.kind == "node_lost":
            held = {n: 0.0 for n in nodes}
            for i, reps in enumerate(cluster.replicas):
                if event.holding and cluster.models[i] not in event.holding:
                    continue
                for r in reps.values():
                    if r.slot.node in held:
                        held[r.slot.node] += r.slot.gpu_fraction
            nodes = sorted(nodes, key=lambda n: -held[n])[: event.count]
    lost = {"replicas": 0, "gpus": 0}
    for n in nodes:
        for k, v in cluster.lose_node(n, now).items():
            lost[k] += v
    return {"at_s": now, "kind": event.kind, "target": event.target, "count": event.count, "nodes": nodes,
            "replicas_lost": lost["replicas"], "gpus_removed": lost["gpus"]}


@dataclass(frozen=True)
class SimConfig:
    tick_s: float = 10.0
    mode: str = "fluid"  # or "des" (request logs)
    seed: int = 0
    drain_timeout_s: float = 30.0
    metrics_window_s: float = 600.0
    fragmentation_every_s: float = 300.0
    warmup_s: float = 60.0  # the controller holds replicas until it has this much metric history
    # Not scored: before metrics warm up and a replica asked for then is Ready, no policy can have acted
    # (the run starts from the same warm-started cluster for all). None = warmup_s + the longest cold start.
    burn_in_s: float | None = None
    # Lend idle GPUs to preemptible training (None, or not enabled: no lending, the run is as without it).
    lending: LendingPolicy | None = None
    # The static-split baseline: this many GPUs taken out of the inference pool for training, never preempted.
    static_training_gpus: int = 0
    # The training backlog's jobs (None: the bundled Alibaba slice, loaded when lending or a static split needs it).
    training: tuple[TrainingJob, ...] | None = None
    # Placement options (issue 8, on by default since issue 15): the packer ranks slots on nodes holding something
    # first (``CostAwarePacker(prefer_open_nodes=True)``), and scale-down removes the replicas on the least occupied
    # nodes first (``CoreConfig.consolidate_removals``), so that whole nodes go idle; None: on, False: off (measured
    # in docs/benchmarks.md sections 7 and 10). Device-level anti-affinity (replicas of a model may share a node;
    # pods-mode lending only) is opt-in only.
    lending_prefer_open_nodes: bool | None = None
    lending_consolidate_removals: bool | None = None
    lending_device_anti_affinity: bool | None = None  # anti-affinity across devices only (not nodes)
    # Cluster events of a scenario (node loss, a GPU kind removed), applied at tick boundaries; () = none.
    events: tuple[ClusterEvent, ...] = ()
    # Who gets GPUs when they run out (team quotas, priorities, preemption); None: CoreConfig's default.
    arbitration: ArbitrationPolicy | None = None
    # A request not completed within this many seconds (wait + service) failed, for the success rate.
    request_timeout_s: float = 60.0
    # How cold-started requests (issue 18: arrived while their model had no routable replica) are judged: "count"
    # (against the SLO like any other) or "exempt" (left out of the SLO accounting, as some platforms do).
    cold_start_slo: str = "count"
    # Seconds a tick may spend placing its new replicas again exactly on a small MIG cluster (the controller's
    # CoreConfig.exact_budget_s; issue 19); 0: the packer's placement only (measured side by side, benchmarks.md).
    exact_budget_s: float = DEFAULT_EXACT_BUDGET_S
    # Whether the engines export an ITL histogram (ModelMetrics.itl_s, what the decode learner reads); False: as an
    # engine without one (the declared ITL law is all the controller has).
    itl_metric: bool = True
    # The KV rail's threshold (the controller's CoreConfig.kv_saturation; None: off, to measure what it does where the
    # engines simulate a KV cache, a spec's kv-cache-tokens).
    kv_saturation: float | None = DEFAULT_KV_SATURATION

    def __post_init__(self) -> None:
        if self.cold_start_slo not in COLD_START_SLO:
            raise ValueError(f"cold_start_slo {self.cold_start_slo!r}: one of {', '.join(COLD_START_SLO)}")


@dataclass
class SimResult:
    """Raw per-minute series and totals; :func:`autoscaler.sim.scorecard.scorecard` turns it into numbers."""

    policy: str
    mode: str
    models: tuple[str, ...]
    minute_arrivals: np.ndarray  # (M, n_minutes)
    minute_within: np.ndarray
    minute_replicas: np.ndarray  # mean routable replicas
    minute_desired: np.ndarray
    minute_latency: np.ndarray  # max over the minute's ticks of the latency at the SLO percentile
    slo_latency_s: np.ndarray  # (M,)
    slo_percentile: np.ndarray  # (M,)
    gpu_hours: float
    unplaced_replica_minutes: float
    scale_events: int
    reasons: dict[str, int]  # the scale events by reason
    fragmentation: float
    latency_p95_s: np.ndarray
    gpus_total: int
    sim_wall_s: float
    invalid_models: dict[str, str] = field(default_factory=dict)
    latency_at_slo_percentile_s: np.ndarray | None = None  # (M,) each model's latency at its own SLO percentile
    decisions: dict[str, int] = field(default_factory=dict)  # every decision of the scored period, by reason
    # exact MIG placements whose wall-clock safety cut fired (their plans may differ on another machine)
    exact_budget_exceeded: int = 0
    burn_in_s: float = 0.0  # the first seconds, not scored (see SimConfig.burn_in_s)
    # Cost attribution (scored ticks only, like gpu_hours; see autoscaler/accounting/cost.py for the units):
    gpu_kinds: tuple[str, ...] = ()  # the cluster's GPU kinds (canonical names), the columns below
    model_gpu_seconds: np.ndarray | None = None  # (M, K) GPU-equivalent seconds held per model and kind
    idle_gpu_seconds: np.ndarray | None = None  # (K,) idle reserved GPU-equivalent seconds per kind
    prices: dict[str, float] = field(default_factory=dict)  # USD per GPU-hour of the cluster's kinds
    teams: tuple[str, ...] = ()  # per model: the spec's team (cost.UNKNOWN_TEAM for an invalid spec)
    namespaces: tuple[str, ...] = ()  # per model: the spec's namespace
    scored_s: float = 0.0  # simulated seconds scored (after the burn-in): the period the costs cover
    # Lending (scored ticks only). The inference pool is every GPU not in a static split; idle reserved =
    # pool GPUs less what inference replicas hold (starting, serving or draining) = lent + free.
    lending_policy: LendingPolicy | None = None  # None: lending was off
    static_training_gpus: int = 0
    pool_gpus: float = 0.0
    lent_gpu_seconds: np.ndarray | None = None  # (K,) whole GPUs lent x seconds, per GPU kind
    idle_reserved_gpu_seconds: float = 0.0
    lending: LendingStats | None = None  # reclaims, training goodput (None: neither lending nor a static split)
    end_s: float = 0.0  # when the simulated period ends (open reclaims are judged against it)
    events: list[dict[str, object]] = field(default_factory=list)  # the cluster events that fired (apply_event)
    # Team numbers (issue 9; module docstring), scored ticks only. None / empty in results built without them.
    request_timeout_s: float = 60.0
    minute_success: np.ndarray | None = None  # (M, n_minutes) requests completed within request_timeout_s
    minute_gpu_s: np.ndarray | None = None  # (M, n_minutes) GPU-equivalent seconds held
    minute_busy_gpu_s: np.ndarray | None = None  # (M, n_minutes) ... x the replicas' utilisation
    shortfalls: dict[str, dict[str, float]] = field(default_factory=dict)  # model -> {cause: replica-minutes}
    refusals_within_guarantee: dict[str, float] = field(default_factory=dict)  # model -> replica-minutes refused
    # while its team was inside its guarantee (cause not reclaiming/preempting)
    preemptions: list[dict[str, object]] = field(default_factory=list)  # at_s, model, team, replica, by_model,
    # reason, message: one per replica preempted
    unreasoned: int = 0  # Shortfalls without a cause or words + preemptions without a reason or message
    # Scale to and from zero (issue 18), scored period only; None in results built without them.
    cold_start_slo: str = "count"  # SimConfig.cold_start_slo
    minute_cold: np.ndarray | None = None  # (M, n_minutes) cold-started arrivals (no routable replica on arrival)
    minute_cold_within: np.ndarray | None = None  # (M, n_minutes) of minute_within, the cold-started requests
    minute_cold_success: np.ndarray | None = None  # (M, n_minutes) of minute_success, the cold-started requests
    cold_waits: ColdWaits | None = None  # the cold-started requests that arrived in the scored period, and their waits
    model_warm_idle_gpu_seconds: np.ndarray | None = None  # (M,) GPU-equivalent seconds held while serving nothing
    routing_actions: dict[str, int] = field(default_factory=dict)  # model -> SetRouting actions applied (whole run)


def _warm_start(
    cluster: SimCluster, workload: SimWorkload, specs: dict[str, ModelSpec], dt: float, packer: Packer
) -> None:
    """Begin as a running cluster would be: each model with the replicas its first minutes of load need
    (the same for every policy), so the run measures steady control, not a cold boot."""
    from autoscaler.api.spec import slot_request
    from autoscaler.estimation.capacity import min_replicas_for_slo

    window = max(dt, 300.0)
    first = workload.arrivals_per_tick(window)[:, 0] / window
    profiles = workload.profiles
    for i, name in enumerate(workload.models):
        spec = specs[name]
        if name not in cluster.specs or not isinstance(cluster.specs[name], ModelSpec):
            continue
        n = min(max(min_replicas_for_slo(float(first[i]), profiles[name]), spec.min_replicas),
                spec.max_replicas)
        slots = []
        groups: list[tuple[Slot, ...]] = []  # a replica that is a group of pods: the other pods' slots
        req = slot_request(spec)
        scratch = cluster.inventory.copy()
        for r in range(n):
            placed = place_group(packer, scratch, req, spec.pods_per_replica)
            if placed is None:
                break
            allocate_group(scratch, placed, f"{name}-init{r}", model=name)  # the owner name preplace gives it
            slots.append(placed[0])
            groups.append(placed[1:])
        cluster.preplace(name, slots, groups=groups if spec.pods_per_replica > 1 else ())


def _forecaster(
    workload: SimWorkload, policy: Policy, factory: Callable[[], FleetForecaster] = FleetForecaster
) -> FleetForecaster | None:
    """The fleet forecaster (from ``factory``: the core's) warm-started from the trace's past, when there is one and
    the policy forecasts."""
    history = workload.history
    if history is None or not policy.uses_forecast:
        return None
    if policy.learns and workload.history_work is not None:
        history = workload.history_work  # (a learning policy forecasts offered work: autoscaler/estimation/work.py)
    forecaster = factory()
    forecaster.warm_start({m: history.rates[i] for i, m in enumerate(history.models)}, history.step_s)
    return forecaster


def _idle_history(workload: SimWorkload, specs: Mapping[str, ModelSpec], policy: Policy) -> dict[str, IdleTimes]:
    """The idle times of every model that may go to zero, warm-started from the trace's past (as the forecaster
    is): the simulated part starts at 0, where the history ends."""
    history = workload.history
    if history is None:
        return {}
    out = {}
    for i, m in enumerate(history.models):
        spec = specs.get(m)
        if spec is not None and spec.min_replicas == 0:
            out[m] = IdleTimes.from_rates(history.rates[i], history.step_s, 0.0, keep_alive_s=histogram_range_s(spec),
                                          head_s=spec.cold_start_s + policy.tick_s)
    return out


def scored_period(workload: SimWorkload, config: SimConfig) -> tuple[float, int, int, int]:
    """``(burn_in_s, first_scored_tick, n_ticks, n_minutes)`` of a run: the burn-in (``SimConfig.burn_in_s``, by
    default the metrics warm-up plus the longest cold start) in whole minutes and never the whole run. The lower
    bound (:mod:`autoscaler.sim.lower_bound`) scores the same period."""
    dt = config.tick_s
    n_ticks = int(math.ceil(workload.duration_s / dt))
    burn_in = config.burn_in_s
    if burn_in is None:
        good = served_as(workload.specs)
        burn_in = config.warmup_s + max((s.cold_start_s for s in good.values()), default=0.0)
    burn_in = min(math.ceil(burn_in / 60.0) * 60.0, max(0.0, (n_ticks * dt // 60.0 - 1) * 60.0))
    first_scored = int(math.ceil(burn_in / dt - 1e-9))
    n_min = int(math.ceil((n_ticks - first_scored) * dt / 60.0))
    return burn_in, first_scored, n_ticks, n_min


def _waiting(stats: TickStats) -> np.ndarray:
    """The engines' waiting gauge: requests queued for a slot at the tick's end (the backlog less those held for a
    model with no routable replica, which no engine holds)."""
    held = 0.0 if stats.held is None else stats.held
    return np.maximum(stats.backlog - held, 0.0)


def sim_core(policy: Policy, cfg: SimConfig) -> CoreConfig:
    """The decision core's configuration for a simulated run: the controller's (:func:`build_core`) from the
    simulator's flags. Lending not enabled is no lending at all (None): nothing was lent before the run. Two
    settings stay the simulator's own, as measured runs need: no metric lag (the window is the engine's own) and a
    status only when a decision changes (the controller reports every one)."""
    lending = cfg.lending if cfg.lending is not None and cfg.lending.enabled else None
    return build_core(policy, lending=lending, arbitration=cfg.arbitration,
                      prefer_open_nodes=cfg.lending_prefer_open_nodes,
                      consolidate_removals=cfg.lending_consolidate_removals,
                      device_anti_affinity=bool(cfg.lending_device_anti_affinity),
                      exact_budget_s=cfg.exact_budget_s, kv_saturation=cfg.kv_saturation)


def simulate(
    workload: SimWorkload,
    nodes: Sequence[NodeSpec],
    policy: Policy,
    config: SimConfig | None = None,
    progress: Progress | None = None,
) -> SimResult:
    cfg = config or SimConfig()
    wall0 = time.perf_counter()
    models = workload.models
    m = len(models)
    specs = workload.specs
    good = served_as(specs)
    told = workload.controller_specs  # the annotations the controller reads (a what-if's declared ones)
    dt = cfg.tick_s
    burn_in, first_scored, n_ticks, n_min = scored_period(workload, cfg)

    profiles = workload.profiles
    drain = np.array([min(cfg.drain_timeout_s, float(profiles[x].occupancy_s.max())) for x in models])
    core = sim_core(policy, cfg)
    lending = core.lending
    queue = None
    if lending is not None or cfg.static_training_gpus > 0:
        queue = TrainingQueue(cfg.training if cfg.training is not None else load_training())
    kv_cache = workload.queue if workload.queue.kv_tokens is not None else None  # (only where a spec declares one)
    # (the controller reads the annotations it is told: the declared specs of a what-if, else the served ones)
    cluster = SimCluster(nodes, models, workload.controller_specs, drain_s=drain, instant_start=policy.instant_start,
                         lending=lending, training=queue, served=None if workload.declared is None else specs,
                         servers=None if kv_cache is None else kv_cache.concurrency.tolist())
    cluster.score_from = burn_in
    if cfg.static_training_gpus > 0:
        cluster.reserve_static_training(cfg.static_training_gpus)
    _warm_start(cluster, workload, good, dt, core.packer)
    metrics = SimMetrics(
        models, dt, max(2, int(math.ceil(cfg.metrics_window_s / dt))), warmup=int(math.ceil(cfg.warmup_s / dt))
    )
    engine = make_engine(cfg.mode, workload, dt, seed=cfg.seed)
    # An engine wrapped by a benchmark (bench/fidelity.py's recorder) may not pass the timeout on: it keeps the
    # engines' default (60 s, the SimConfig default too).
    set_timeout = getattr(engine, "set_request_timeout", None)
    if set_timeout is not None:
        set_timeout(cfg.request_timeout_s)
    state = fresh_state(profiles=workload.controller_profiles,
                        forecaster=_forecaster(workload, policy, core.forecaster_factory),
                        idle=_idle_history(workload, good, policy))
    node_state = NodeActionState()
    future = workload.arrivals_per_tick(dt) / dt if policy.instant_start else None

    shape = (m, n_min)
    arrivals = np.zeros(shape)
    within = np.zeros(shape)
    replicas = np.zeros(shape)
    desired = np.zeros(shape)
    latency = np.full(shape, np.nan)
    success = np.zeros(shape)
    cold = np.zeros(shape)
    cold_within = np.zeros(shape)
    cold_success = np.zeros(shape)
    warm_idle_s = np.zeros(m)
    held_s = np.zeros(shape)  # summed per tick, x dt at the end
    busy_s = np.zeros(shape)
    short_s = np.zeros((m, len(SHORTFALL_CAUSES)))  # replica-seconds short per model and cause
    refused_s = np.zeros(m)
    ticks_in_min = np.zeros(n_min)
    gpu_seconds = 0.0
    # per tick two array adds: the cluster keeps both arrays up to date as slots are taken and released
    model_gpu_s = np.zeros_like(cluster.held)
    idle_s = np.zeros(len(cluster.gpu_kinds))
    lent_s = np.zeros(len(cluster.gpu_kinds))
    idle_reserved_s = 0.0
    unplaced_s = 0.0
    decisions: dict[str, int] = {}
    exact_cuts = 0
    frag_sum, frag_n = 0.0, 0
    next_frag = 0.0
    report_every = max(1, n_ticks // 200)
    pending = sorted(cfg.events, key=lambda e: e.at_s)
    fired: list[dict[str, object]] = []
    # The ports the loop drives (autoscaler/api/ports.py): the cluster is also the actuator.
    observe: ClusterPort = cluster
    measure: MetricsPort = metrics
    act: Actuator = cluster

    for k in range(n_ticks):
        now = k * dt
        cluster.advance(now)
        while pending and pending[0].at_s <= now + 1e-9:
            fired.append(apply_event(cluster, pending.pop(0), now))
        if future is not None:
            # The oracle knows the load of the tick it is about to serve.
            metrics.future_rate = future[:, k]
        plan = plan_tick(observe.snapshot(now), measure.window(now), state, core, node_state)
        exact_cuts += plan.exact_budget_exceeded  # (every tick's, burn-in included: a run's plans as a whole)
        if plan.actions:
            act.apply(plan)
            routable = cluster.advance(now)  # instant-start replicas serve this tick
        else:
            routable = cluster.routable
        if cluster.at_reference_speed:
            stats = engine.step(now, dt, routable)
        else:  # slot speeds (issue 15): only while some routable replica is not at speed 1
            stats = engine.step(now, dt, routable, cluster)
        kv = None if kv_cache is None else kv_cache.kv_use(stats.busy, routable)
        metrics.push(stats.arrivals / dt, stats.in_flight, stats.latency_at_slo_pct, stats.within_slo / dt,
                     held=stats.held, itl=stats.itl_at_slo_pct if cfg.itl_metric else None, kv_cache=kv,
                     queued=None if kv is None else _waiting(stats), running=None if kv is None else stats.busy)
        if k < first_scored:
            continue
        for why in plan.decisions.values():  # every decision, also those that leave the count as it is
            decisions[why] = decisions.get(why, 0) + 1

        j = min(int((now - burn_in) // 60.0), n_min - 1)
        arrivals[:, j] += stats.arrivals
        within[:, j] += stats.within_slo
        success[:, j] += stats.within_timeout
        if stats.cold_arrivals is not None:
            cold[:, j] += stats.cold_arrivals
            cold_within[:, j] += stats.cold_within if stats.cold_within is not None else 0.0
            cold_success[:, j] += stats.cold_within_timeout if stats.cold_within_timeout is not None else 0.0
        busy_now = stats.in_flight + (stats.held if stats.held is not None else 0.0)
        idle = (stats.arrivals <= EPS_ARRIVALS) & (busy_now < IDLE_IN_FLIGHT)
        warm_idle_s += np.where(idle, cluster.held_by_model, 0.0) * dt
        held_s[:, j] += cluster.held_by_model  # kept by the cluster as slots are taken and released
        busy_s[:, j] += cluster.busy_gpus(stats.busy)
        replicas[:, j] += routable
        desired[:, j] += cluster.desired
        latency[:, j] = np.fmax(latency[:, j], stats.latency_at_slo_pct)
        ticks_in_min[j] += 1
        gpu_seconds += cluster.gpus_allocated() * dt
        model_gpu_s += cluster.held * dt
        idle_s += cluster.idle_by_kind() * dt
        idle_reserved_s += (cluster.pool_gpus - cluster.gpus_allocated()) * dt
        if lending is not None:
            lent_s += cluster.lent_by_kind * dt
        if cluster.shortfall.any():
            unplaced_s += float(cluster.shortfall.sum()) * dt
            short_s += cluster.shortfall_by_cause * dt
            refused_s += cluster.refused_within * dt
        if now >= next_frag:
            frag_sum += cluster.inventory.fragmentation()
            frag_n += 1
            next_frag = now + cfg.fragmentation_every_s
        if progress is not None and k % report_every == 0:
            progress(k / n_ticks)
    if queue is not None:
        cluster.finish(n_ticks * dt)
    waits = getattr(engine, "cold_waits", None)
    cold_waits = None
    if waits is not None:
        w = waits(n_ticks * dt)
        keep = w.t >= burn_in - 1e-9
        cold_waits = ColdWaits(model_index=w.model_index[keep], t=w.t[keep], wait_s=w.wait_s[keep],
                               weight=w.weight[keep], dispatched=w.dispatched[keep])
    if progress is not None:
        progress(1.0)
    ticks_in_min[ticks_in_min == 0] = 1
    return SimResult(
        policy=policy.name,
        mode=cfg.mode,
        models=models,
        minute_arrivals=arrivals,
        minute_within=within,
        minute_replicas=replicas / ticks_in_min,
        minute_desired=desired / ticks_in_min,
        minute_latency=latency,
        slo_latency_s=np.array([good[x].slo_latency_s for x in models]),
        slo_percentile=np.array([good[x].slo_percentile for x in models]),
        gpu_hours=gpu_seconds / 3600.0,
        unplaced_replica_minutes=unplaced_s / 60.0,
        scale_events=cluster.scale_events,
        reasons=dict(cluster.reasons),
        decisions={str(k): v for k, v in decisions.items()},
        exact_budget_exceeded=exact_cuts,
        fragmentation=frag_sum / max(frag_n, 1),
        latency_p95_s=engine.latency_quantile(0.95),
        latency_at_slo_percentile_s=engine.latency_quantile(
            np.array([good[x].slo_percentile for x in models]) / 100.0),
        gpus_total=cluster.inventory.gpus_total,
        sim_wall_s=time.perf_counter() - wall0,
        invalid_models={x: str(s) for x, s in told.items() if not isinstance(s, ModelSpec)},
        burn_in_s=burn_in,
        gpu_kinds=cluster.gpu_kinds,
        model_gpu_seconds=model_gpu_s,
        idle_gpu_seconds=idle_s,
        prices={k: v for k, v in price_table(cluster.inventory.catalog).items() if k in cluster.gpu_kinds},
        teams=tuple(s.team if isinstance(s, ModelSpec) else UNKNOWN_TEAM for s in (told[x] for x in models)),
        namespaces=tuple(good[x].namespace for x in models),
        scored_s=max(0, n_ticks - first_scored) * dt,
        lending_policy=lending,
        static_training_gpus=cfg.static_training_gpus,
        pool_gpus=cluster.pool_gpus,
        lent_gpu_seconds=lent_s,
        idle_reserved_gpu_seconds=idle_reserved_s,
        lending=cluster.stats if queue is not None else None,
        end_s=n_ticks * dt,
        events=fired,
        request_timeout_s=cfg.request_timeout_s,
        minute_success=success,
        minute_gpu_s=held_s * dt,
        minute_busy_gpu_s=busy_s * dt,
        shortfalls={x: {c or "none": float(short_s[i, j]) / 60.0 for j, c in enumerate(SHORTFALL_CAUSES)
                        if short_s[i, j] > 0} for i, x in enumerate(models) if short_s[i].any()},
        refusals_within_guarantee={x: float(refused_s[i]) / 60.0 for i, x in enumerate(models) if refused_s[i] > 0},
        preemptions=list(cluster.preemptions),
        unreasoned=cluster.unreasoned,
        cold_start_slo=cfg.cold_start_slo,
        minute_cold=cold,
        minute_cold_within=cold_within,
        minute_cold_success=cold_success,
        cold_waits=cold_waits,
        model_warm_idle_gpu_seconds=warm_idle_s,
        routing_actions=dict(cluster.routing_actions),
    )
