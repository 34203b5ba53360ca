"""The live control loop: informers -> snapshot, Prometheus -> metrics window, decide, act, report.

The same decision core as the simulator, configured by the same function
(:func:`autoscaler.decision.config.build_core`) and planned by the same call
(:func:`autoscaler.decision.tick.plan_tick`); everything here is wiring, through the ports of
:mod:`autoscaler.api.ports`:

- **observe**: list+watch informers (Deployments, Pods, Nodes, preemptible training workloads) keep caches;
  each tick :class:`InformerCluster` turns one read of them into the view (the snapshot, each model's pod
  template in it). Metrics come from :class:`~autoscaler.live.prometheus.metrics.PrometheusMetrics` (without a
  Prometheus every model is "stale" and the rails hold replicas: no guessing).
- **decide**: ``plan_tick()``: ``decide()``, then the node-level actions the placements imply (MIG re-layouts,
  time-slicing config, pod templates).
- **act**: only while this process holds the Lease (:class:`~autoscaler.live.kube.leader.LeaderElector`), in the
  term the tick was planned in: every write passes the :class:`~autoscaler.live.kube.term.WriteGate` first, and a
  tick is abandoned (its task cancelled) as soon as leadership is lost. A new term starts from the cluster as it
  is: the decision state (scale-down windows, lending memory, reclaims and MIG jobs in flight) is dropped and
  re-adopted from what the labels and annotations say, and scale-downs wait out the stabilization window as on a
  fresh start.
- **report**: ``/metrics``, ``/healthz``, ``/readyz`` (:mod:`autoscaler.live.exporter`, served by
  :mod:`autoscaler.live.health`), a log line per action.
- **activations** (issue 18, ``activator_enabled``): every replica books the activators' ``POST /v1/activations``
  (:mod:`autoscaler.live.activations`); a report holding requests for a model without an active replica wakes the
  leader's loop at once (it waits on that event with its tick timeout), and the held counts reach the decision as
  ``ModelMetrics.held_requests``. The controller's activator EndpointSlices and the activator's pods are watched
  for the routing (:mod:`autoscaler.live.kube.routing`).

Shutdown (SIGTERM): the tick in progress finishes, then the Lease is released and the tasks stop.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import math
import socket
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from autoscaler.api.plan import LendGpus, Plan, ReclaimGpus
from autoscaler.api.ports import AsyncMetricsPort, ViewPort
from autoscaler.api.snapshot import STALE_METRICS, MetricsWindow, SlotTemplate
from autoscaler.api.spec import SpecLimits
from autoscaler.decision.arbitration import ArbitrationPolicy
from autoscaler.decision.config import DEFAULT_EXACT_BUDGET_S, build_core
from autoscaler.decision.node_actions import NodeActionState, gpu_resources
from autoscaler.decision.scaledown import DEFAULT_KV_SATURATION
from autoscaler.decision.state import ControllerState, fresh_state
from autoscaler.decision.tick import plan_tick
from autoscaler.live.activations import (
    ACTIVATION_AUDIENCE,
    DEFAULT_TTL_S,
    ActivationBook,
    ReportAuth,
    kube_token_review,
    refused_counter,
    service_account_user,
)
from autoscaler.live.cost_metrics import CostMetrics
from autoscaler.live.exporter import ControllerMetrics
from autoscaler.live.health import Health, start_http
from autoscaler.live.kube.actuator import ActuationReport, ActuatorConfig, KubeActuator
from autoscaler.live.kube.discovery import ServedApis, discover
from autoscaler.live.kube.dra_act import DraActuation
from autoscaler.live.kube.informer import DEFAULT_FREEZE_AFTER_S, Informer, frozen_informers, liveness
from autoscaler.live.kube.leader import LeaderElector
from autoscaler.live.kube.lending import LendingActuator, workloads_path
from autoscaler.live.kube.objects import PREEMPTIBLE_LABEL, ClusterView, ManagedModel
from autoscaler.live.kube.pods import PodScope, slim_pod
from autoscaler.live.kube.routing import pod_ips
from autoscaler.live.kube.term import LeadershipLost, WriteGate
from autoscaler.live.kube.translate import build_view
from autoscaler.live.kube.watches import ENDPOINT_SLICE_WATCH, RESOURCE_SLICES, WATCHES, Watch, by_role, stamped
from autoscaler.live.prometheus.client import PrometheusAuth
from autoscaler.live.prometheus.metrics import MetricNames, PrometheusMetrics, serving_pods
from autoscaler.policies import make_policy
from sharing.catalog import load_catalog
from sharing.lending import LendingPolicy

log = logging.getLogger("slotwise.controller")

KUEUE_V1BETA1_WORKLOADS = "/apis/kueue.x-k8s.io/v1beta1/workloads"  # until discovery says otherwise


@dataclass
class ControllerSettings:
    """What ``slotwise run`` configures. ``namespace`` None watches every namespace."""

    namespace: str | None = None
    label_selector: str | None = None
    policy: str = "slotwise"
    policy_knobs: dict = field(default_factory=dict)  # the policy's constructor parameters (HPA/KPA-style names)
    tick_s: float = 5.0  # how often the loop runs; each policy decides on its own tick_s within it
    prometheus_url: str | None = None
    # TLS (verified always, unless insecure_skip_verify is written), bearer token or basic auth for Prometheus
    prometheus_auth: PrometheusAuth = field(default_factory=PrometheusAuth)
    metric_names: MetricNames = field(default_factory=lambda: MetricNames.preset("vllm"))
    metrics_step_s: float = 15.0
    metrics_window_s: float = 900.0
    stale_after_s: float = 90.0
    history_hours: float = 24.0  # forecaster warm start from Prometheus history (0: none)
    lease_namespace: str = "default"
    lease_name: str = "slotwise-controller"
    identity: str = field(default_factory=lambda: f"{socket.gethostname()}-{time.time_ns() % 10**9}")
    lease_duration_s: float = 15.0
    renew_deadline_s: float = 10.0
    retry_period_s: float = 2.0
    http_host: str = "0.0.0.0"
    http_port: int = 8080
    actuator: ActuatorConfig = field(default_factory=ActuatorConfig)
    lending: LendingPolicy = field(default_factory=LendingPolicy)  # off by default
    # who gets GPUs when they run out: team quotas (`teams:` in the settings file), priorities, preemption
    # (`arbitration:`); the default has no quotas and arbitrates by SLO damage
    arbitration: ArbitrationPolicy = field(default_factory=ArbitrationPolicy)
    # the operator's caps on every numeric annotation (`limits:`; a model over one is refused, alone)
    limits: SpecLimits = field(default_factory=SpecLimits)
    # the engines' KV-cache use (a fraction) at which no model scales down (None: the rail is off; docs/metrics.md)
    kv_saturation: float | None = DEFAULT_KV_SATURATION
    # seconds a tick may spend placing its new replicas exactly (MILP) on a small MIG cluster (0: the packer only;
    # decision/arbitration/exact.py); the tick blocks meanwhile
    exact_budget_s: float = DEFAULT_EXACT_BUDGET_S
    # USD per GPU-hour by GPU kind (any catalog name or GFD product label), overriding the catalog's rough
    # defaults: the price table cost attribution uses
    prices: dict = field(default_factory=dict)
    # preemptible training workloads (the lending issue acts on them; here they are observed)
    training_paths: tuple[str, ...] = ("/api/v1/pods", "/apis/batch/v1/jobs")
    kueue_workloads_path: str | None = None  # None: the version the apiserver serves (v1beta2, else v1beta1)
    # Scale to and from zero (docs/scale-to-zero.md): the activator is deployed (the chart's activator.enabled);
    # its pods are found in ``activator_namespace`` (None: the controller's own, ``lease_namespace``) by
    # ``activator_selector``; a held count expires ``activation_ttl_s`` after an activator's last report
    activator_enabled: bool = False
    activator_namespace: str | None = None
    activator_selector: str = "app.kubernetes.io/name=slotwise,app.kubernetes.io/component=activator"
    activation_ttl_s: float = DEFAULT_TTL_S
    # who may report (POST /v1/activations): a token of this ServiceAccount (in the activator's namespace), issued
    # for ``activator_token_audience`` (empty: any audience the apiserver accepts), checked by a TokenReview
    activator_service_account: str = "slotwise-activator"
    activator_token_audience: str = ACTIVATION_AUDIENCE


def _collection(group_path: str, resource: str, namespace: str | None) -> str:
    return f"{group_path}/namespaces/{namespace}/{resource}" if namespace else f"{group_path}/{resource}"


def pod_templates(models: Mapping[str, ManagedModel]) -> dict[str, SlotTemplate]:
    """Each managed model's pod template as far as slots go: its container's GPU resources and node selector."""
    return {k: SlotTemplate(gpu_resources(m.resources), dict(m.node_selector)) for k, m in models.items()}


def read_view(
    deployments: Iterable[dict], pods: Iterable[dict], nodes: Iterable[dict], training: Iterable[dict] = (), *,
    now: float, lending: LendingPolicy | None = None, **watched: Iterable[dict],
) -> ClusterView:
    """One read of the caches as the decision core's view: ``build_view``, each model's template in the snapshot.
    ``watched``: the issue-17 inputs by role (``workloads``, ``autoscalers``, ``resource_slices``,
    ``resource_claims``; :mod:`~autoscaler.live.kube.watches`)."""
    view = build_view(deployments, pods, nodes, training, now=now, lending=lending, **watched)
    return replace(view, snapshot=replace(view.snapshot, templates=pod_templates(view.models)))


def with_held(window: MetricsWindow, held: Mapping[str, float], view: ClusterView) -> MetricsWindow:
    """``window`` with each model's held requests (the activation book's counts) as ``held_requests``. A model
    the source has nothing for (at zero it has no scrape targets) gets a stale entry carrying them: the zero rail
    wakes it on held requests whatever the staleness. Models not in the view are left out."""
    if not held:
        return window
    models = dict(window.models)
    for key, n in held.items():
        if key in view.snapshot.models and n > 0:
            models[key] = replace(models.get(key, STALE_METRICS), held_requests=float(n))
    return replace(window, models=models)


class InformerCluster:
    """The live cluster port (:class:`~autoscaler.api.ports.ViewPort`): one read of the informer caches at ``now``
    (in memory: the informers' own tasks keep them current, so a read does no I/O)."""

    def __init__(self, deployments: Informer, pods: Informer, nodes: Informer, training: Sequence[Informer],
                 lending: LendingPolicy, watched: Mapping[Watch, Informer] | None = None) -> None:
        self.deployments, self.pods, self.nodes, self.training = deployments, pods, nodes, tuple(training)
        self.lending = lending
        self.watched = dict(watched or {})

    def view(self, now: float) -> ClusterView:
        # (preemptible pods are found among the pods by build_view itself)
        training = [obj for inf in self.training for obj in inf.items()]
        extra = by_role({w: inf.items() for w, inf in self.watched.items()})
        return read_view(self.deployments.items(), self.pods.items(), self.nodes.items(), training, now=now,
                         lending=self.lending, **extra)


@dataclass
class TickResult:
    plan: Plan
    view: ClusterView
    window: MetricsWindow
    report: ActuationReport | None  # None: not the leader, nothing applied
    seconds: float


class Controller:
    """One controller process. ``run(stop)`` until ``stop`` is set; :meth:`tick` is one pass (tests call it)."""

    discovery_retry_s: tuple[float, ...] = (1.0, 2.0, 4.0)  # waits before asking discovery again at start

    def __init__(
        self,
        api_client: object,
        settings: ControllerSettings,
        *,
        metrics_source: AsyncMetricsPort | None = None,
        clock: Callable[[], float] = time.time,
        cache_freeze_after_s: float = DEFAULT_FREEZE_AFTER_S,  # no apiserver contact this long: frozen, decisions held
    ) -> None:
        self.api = api_client
        self.settings = settings
        self.clock = clock
        ns, sel = settings.namespace, settings.label_selector
        self._liveness = live = liveness(cache_freeze_after_s)  # every informer's watch timeout and grace
        self.deployments = Informer(api_client, _collection("/apis/apps/v1", "deployments", ns),
                                    label_selector=sel, name="deployments", **live)
        # every pod of the cluster, whatever the models' scope: the GPU inventory must see what other namespaces
        # hold (read-only; slimmed to the fields the readers use, so no env or volumes are cached); in namespace
        # mode only those that can matter (PodScope, against the GPU nodes: listed once the nodes informers synced)
        self.pod_scope = PodScope(frozenset({ns}) if ns else None, sources=lambda: (
            self.nodes, *[inf for w, inf in self.watched.items() if w.role == RESOURCE_SLICES]))
        self.pods = Informer(api_client, "/api/v1/pods", name="pods", transform=slim_pod, keep=self.pod_scope.keep,
                             after=self.pod_scope.sources if ns else None, **live)
        self.pod_scope.relist = self.pods.request_relist
        self.nodes = Informer(api_client, "/api/v1/nodes", name="nodes", **live)
        self.nodes.subscribe(self.pod_scope.on_node)
        self.training = [
            Informer(api_client, path, label_selector=f"{PREEMPTIBLE_LABEL}=true", name=f"training:{path}",
                     optional=True, **live)
            for path in (*[p for p in settings.training_paths if p != "/api/v1/pods"],
                         settings.kueue_workloads_path or KUEUE_V1BETA1_WORKLOADS)
        ]
        # issue 17: other workload kinds, HPAs and ScaledObjects, DRA's ResourceSlices and ResourceClaims, at the
        # versions discovery picks (discover(), before the informers run; until then each watch's fallback)
        self.apis: ServedApis | None = None
        watches = (*WATCHES, ENDPOINT_SLICE_WATCH) if settings.activator_enabled else WATCHES
        self.watched: dict[Watch, Informer] = {w: self._watch_informer(w) for w in watches}
        # the activator's pods, unslimmed (their IPs are the slices' endpoints); only with the activator enabled
        self.activator_pods: Informer | None = None
        if settings.activator_enabled:
            ans = settings.activator_namespace or settings.lease_namespace
            self.activator_pods = Informer(api_client, f"/api/v1/namespaces/{ans}/pods",
                                           label_selector=settings.activator_selector, name="activator-pods", **live)
        self.activations = ActivationBook(settings.activation_ttl_s)
        # models with an active replica (placed, not draining: Ready or starting) in the last view; a report for one
        # does not wake the tick (a cold start in progress has nothing a tick could do sooner)
        self._active_models: set[str] = set()
        self.activations.active = lambda model: model in self._active_models
        self.informers = [self.deployments, self.pods, self.nodes, *self.training, *self.watched.values(),
                          *([self.activator_pods] if self.activator_pods is not None else [])]
        self.cluster: ViewPort[ClusterView] = InformerCluster(self.deployments, self.pods, self.nodes, self.training,
                                                              settings.lending, self.watched)
        self.elector = LeaderElector(
            api_client, settings.lease_namespace, settings.lease_name, settings.identity,
            lease_duration_s=settings.lease_duration_s, renew_deadline_s=settings.renew_deadline_s,
            retry_period_s=settings.retry_period_s,
        )
        self.actuator = KubeActuator(api_client, settings.actuator)  # an AsyncActuator, with the write gate
        if self.activator_pods is not None:
            self.actuator.activator_pods = self.activator_pods.items
            # the reconcile of the activator slices compares what the informers hold (no reads while in step);
            # looked up each time: discover() may replace the slice informer (v1beta1 on an old apiserver)
            self.actuator.routing.slices = lambda: self.watched[ENDPOINT_SLICE_WATCH].items()
        # Lending: lend/reclaim writes (node label+taint and evictions, or Kueue quota and Workload deactivation).
        # Always built: a reclaim in flight is carried to its end even if lending is switched off meanwhile.
        # (report mode writes status and Events only: no lending, no evictions)
        self.lender = LendingActuator(api_client, settings.lending, dry_run=not settings.actuator.acting, clock=clock)
        self.exporter = ControllerMetrics(reclaim_deadline_s=settings.lending.max_reclaim_s,
                                          teams=settings.arbitration.teams)
        # GPU-slot-seconds and cost per team/namespace/model, on the same /metrics registry
        self.cost = CostMetrics(self.exporter.registry, load_catalog(), settings.prices)
        self.report_auth = self._report_auth(api_client)
        self._cost_at: float | None = None  # when cost was last recorded (None: not since leading)
        # Alive while the loop beat within a minute (or three ticks): a slow tick is not a dead loop.
        self.health = Health(settings.tick_s, max_missed_ticks=max(3, math.ceil(60.0 / settings.tick_s)),
                             clock=clock)
        self.prometheus: AsyncMetricsPort | None = metrics_source
        if self.prometheus is None and settings.prometheus_url:
            self.prometheus = PrometheusMetrics(
                settings.prometheus_url, settings.metric_names, step_s=settings.metrics_step_s,
                window_s=settings.metrics_window_s, stale_after_s=settings.stale_after_s, auth=settings.prometheus_auth,
            )
        # Configured as the simulator configures itself (decision/config.py). A disabled lending policy is passed on:
        # with GPUs still lent the lend stage reclaims them (reason "disabled").
        self.core = build_core(make_policy(settings.policy, **settings.policy_knobs), lending=settings.lending,
                               arbitration=settings.arbitration, metric_lag_s=settings.metrics_step_s,
                               report_every_decision=True, limits=settings.limits,
                               kv_saturation=settings.kv_saturation, exact_budget_s=settings.exact_budget_s)
        self.state: ControllerState = fresh_state()
        self.node_state = NodeActionState()  # the time-slicing config last planned
        self.ticks = 0
        # every write is gated on leading, in the term the tick was planned in (live/kube/term.py)
        # A dry run writes nothing, not even the Lease: it takes no part in the election and plans every tick.
        self.elects = not settings.actuator.dry_run
        self.gate = WriteGate(leading=lambda: self.elector.is_leader or not self.elects,
                              term=lambda: self.elector.term if self.elects else 1)
        self._term = 0  # the leadership term the decision state belongs to (0: none yet)
        self._tick_task: asyncio.Task | None = None  # the tick in progress, cancelled when leadership is lost
        self.elector.on_change(self._leadership_changed)

    def _watch_informer(self, w: Watch) -> Informer:
        path = w.path(self.apis, self.settings.namespace)
        labels = self.settings.label_selector if w.selected else w.labels
        inf = Informer(self.api, path, label_selector=labels, name=w.name, optional=w.optional,
                       transform=stamped(w.kind, w.api_version(path)), **self._liveness)
        if w.role == RESOURCE_SLICES:
            inf.subscribe(self.pod_scope.on_slice)  # DRA nodes are GPU nodes for which pods are kept
        return inf

    async def discover(self) -> ServedApis:
        """Ask the server which API versions it serves (once, before the informers run) and point every versioned
        watch at the newest one slotwise speaks: Kueue Workloads, the workload kinds, HPAs, ScaledObjects, DRA."""
        self.apis = await discover(self.api)
        for delay in self.discovery_retry_s:  # the apiserver may be slow at start: ask again before using fallbacks
            if self.apis.discovered:
                break
            await asyncio.sleep(delay)
            self.apis = await discover(self.api)
        if self.elects:
            self.elector.require_served(self.apis)  # no Lease API: say so now, not as retries forever
        # the writers speak what the server serves (Eviction's policy version, Kueue's, resource.k8s.io's)
        self.lender.apis = self.apis
        self.actuator.dra = DraActuation(self.api, self.apis)
        self.actuator.slice_api_version = f"discovery.k8s.io/{ENDPOINT_SLICE_WATCH.version(self.apis)}"
        if self.settings.kueue_workloads_path is None:
            self._watch_kueue(workloads_path(self.apis))
        for w, old in list(self.watched.items()):
            if w.path(self.apis, self.settings.namespace) != old.path:
                new = self._watch_informer(w)
                self.watched[w] = new
                self.informers[self.informers.index(old)] = new
                log.info("%s watched at %s", w.kind, new.path)
        self.cluster = InformerCluster(self.deployments, self.pods, self.nodes, self.training, self.settings.lending,
                                       self.watched)
        return self.apis

    # -- one pass ---------------------------------------------------------------------------------------------
    def view(self) -> ClusterView:
        view = self.cluster.view(self.clock())
        self._active_models = {k for k, o in view.snapshot.models.items() if o.active_replicas > 0}
        return view

    async def metrics_window(self, view: ClusterView) -> MetricsWindow:
        return with_held(await self._metrics_window(view), self.activations.held(), view)

    async def _metrics_window(self, view: ClusterView) -> MetricsWindow:
        now = view.snapshot.now
        specs = {k: o.spec for k, o in view.snapshot.models.items() if o.spec is not None}
        if self.prometheus is None:
            # No metric source: "no data", never "no load" -- every policy holds its replicas.
            stale = dict.fromkeys(specs, STALE_METRICS)
            return MetricsWindow(now=now, step_s=self.settings.metrics_step_s, models=stale)
        if (expect := getattr(self.prometheus, "expect_pods", None)) is not None:  # a silent pod's target: partial
            expect(serving_pods(view.snapshot))
        window = await self.prometheus.window(now, specs)
        if self.prometheus.last_error:
            self.exporter.error("prometheus")
            log.warning("metrics: %s (models hold their replicas)", self.prometheus.last_error)
        elif health_error := getattr(self.prometheus, "health_error", None):
            # the scrape-health query failed: every model is "partially observed" this tick (no scale-down)
            self.exporter.error("prometheus")
            log.warning("metrics: scrape health unknown, %s (no model scales down)", health_error)
        return window

    def plan(self, view: ClusterView, window: MetricsWindow) -> Plan:
        return plan_tick(view.snapshot, window, self.state, self.core, self.node_state)

    async def tick(self) -> TickResult:
        started = time.perf_counter()
        gate = self.gate.for_term()
        if gate.open() and gate.term_started != self._term:
            self._start_term(gate.term_started or 0)
        view = self.view()
        frozen = frozen_informers(self.informers)
        if frozen:
            return self._held(view, started, frozen)
        for problem in view.problems:
            log.warning("cluster: %s", problem)
            self.exporter.error("cluster_object")
        window = await self.metrics_window(view)
        plan = self.plan(view, window)
        for stage, what in plan.stage_failures.items():  # (confined to the models named; the rest is planned)
            log.error("decision stage %s failed: %s", stage, what)
            self.exporter.error(f"stage-{stage}")
        report: ActuationReport | None = None
        try:
            # Leadership is re-checked right before writing (the decision took time) and before every write.
            if gate.open():
                report = await self._act(plan, view, gate)
        except LeadershipLost as e:
            log.warning("leadership lost during the tick, the rest of it is abandoned: %s", e)
            self.exporter.error("leadership_lost")
        seconds = time.perf_counter() - started
        self.exporter.record_tick(plan, view.snapshot, window, seconds)
        # models an HPA/KEDA scales: in advise mode, the replicas slotwise would set, for them to act on
        self.exporter.record_advice(plan, view.models, advise=self.settings.actuator.coexistence == "advise")
        # Charge the time since the last record, capped: a gap (a follower's wait, a stall) charges a few ticks at
        # most, never the time nobody observed.
        now = view.snapshot.now
        held = 0.0 if self._cost_at is None else min(max(0.0, now - self._cost_at), 3.0 * self.settings.tick_s)
        self.cost.record(view.snapshot, held)
        self._cost_at = now
        self.ticks += 1
        if self.ticks == 1:
            # The first tick built what lives as long as the process (the warm-started forecaster, caches): move it
            # out of the collector's reach, so a full collection later does not walk it (measured: a 50-60 ms pause
            # in a 1,000-model tick, benchmarks section 6).
            gc.freeze()
        self.health.beat(self.clock())
        return TickResult(plan, view, window, report, seconds)

    def _held(self, view: ClusterView, started: float, frozen: list[str]) -> TickResult:
        """A cache the server has not confirmed for longer than a watch lasts may be missing any change (a
        Deployment scaled by someone else, a node lent by the other replica): nothing is planned or written from
        it. Every model holds, scale-ups included; the tick says why."""
        log.warning("cache(s) %s not confirmed by the apiserver for longer than a watch lasts: decisions held",
                    ", ".join(frozen))
        self.exporter.error("cache_frozen")
        self.health.beat(self.clock())
        now = view.snapshot.now
        window = MetricsWindow(now=now, step_s=self.settings.metrics_step_s, models={})
        return TickResult(Plan(now=now), view, window, None, time.perf_counter() - started)

    async def _act(self, plan: Plan, view: ClusterView, gate: WriteGate) -> ActuationReport:
        report = await self.actuator.apply(plan, view, gate=gate)
        self.exporter.record_actuation(report)
        for line in report.applied:
            log.info("applied: %s", line)
        for line, why in report.skipped:
            log.info("skipped (%s): %s", why, line)
        for line in report.errors:
            log.error("action failed: %s", line)
            self.exporter.error("actuation")
        lending_actions = any(isinstance(a, (LendGpus, ReclaimGpus)) for a in plan.actions)
        if (self.settings.lending.enabled or self.lender.reclaims or self.lender.cleanup_due or view.snapshot.lent
                or lending_actions):
            # every tick, even without lending actions: a reclaim spans ticks and is advanced here. With lending
            # switched off, GPUs still lent (seen in the cluster, e.g. after a restart) are reclaimed by the plan
            # (reason "disabled") and the reclaim carried to its end.
            lent = await self.lender.apply(plan.actions, view, gate=gate)
            self.exporter.record_lending(lent)
            self.exporter.record_actuation(lent)
            for line in lent.applied:
                log.info("lending: %s", line)
            for line in (*lent.errors, *lent.refused):
                log.error("lending: %s", line)
                self.exporter.error("lending")
        return report

    def _start_term(self, term: int) -> None:
        """A new term of leadership starts from the cluster as it is. What the decision state remembers from an
        earlier term (scale-down windows and their stabilization, the load last sized for, the lend stage's
        memory) may be stale by any amount of time: it is dropped, so scale-downs wait out the stabilization window
        exactly as after a fresh start. What was learned about the models (their service-time profiles) and the
        forecaster are kept: they are knowledge, not cluster state. So is the time-slicing config last planned: it
        is only ever raised, and forgetting it could lower the device plugin's replicas under running shares.
        Reclaims and MIG re-layouts in flight are re-adopted from the cluster's labels and annotations."""
        if self._term:
            log.info("leadership term %d starts: decision state from term %d dropped", term, self._term)
            self.state = fresh_state(profiles=self.state.profiles, forecaster=self.state.forecaster)
        self.actuator.new_term()  # MIG re-layouts: re-adopted from the nodes' labels
        self.lender.new_term()  # reclaims: re-adopted from the nodes' taints and labels, the Workloads' marks
        self._term = term

    # -- the process ------------------------------------------------------------------------------------------
    def _leadership_changed(self, leader: bool) -> None:
        self.exporter.set_leader(leader)
        if not leader and self._tick_task is not None and not self._tick_task.done():
            # abandon the tick in progress at once (the write gate would refuse its next write anyway; this also
            # stops its reads and planning)
            log.warning("leadership lost: abandoning the tick in progress")
            self._tick_task.cancel()
        self._cost_at = None  # a new term of leadership charges from its first tick
        log.info("%s %s the lease %s/%s", self.settings.identity, "acquired" if leader else "lost",
                 self.settings.lease_namespace, self.settings.lease_name)

    async def run(self, stop: asyncio.Event) -> None:
        """Observe always (a follower keeps warm caches), decide and act only as the leader; until ``stop``."""
        runner = await start_http(self.exporter, self.health, self.settings.http_host, self.settings.http_port,
                                  self.activations, leading=self.gate.open, allowed=self._activator_ips(),
                                  auth=self.report_auth)
        try:
            await self.discover()
        except BaseException:
            await runner.cleanup()
            raise
        informer_tasks = [asyncio.create_task(i.run(), name=f"informer:{i.name}") for i in self.informers]
        elector_task = asyncio.create_task(self.elector.run() if self.elects else asyncio.sleep(0),
                                           name="leader-election")
        try:
            synced = await self._wait_synced(stop)
            if synced:
                self.health.set_ready(True)
                mode = ("dry run: nothing will be changed, no Lease taken" if self.settings.actuator.dry_run
                        else "report mode: only status and Events written, when leader"
                        if self.settings.actuator.report_only else "acting when leader")
                log.info("caches synced; %s", mode)
            while synced and not stop.is_set():
                started = self.clock()
                self.activations.wake.clear()  # this tick sees every report booked so far
                if self.gate.open():
                    log.debug("acting: tick %d at %.3f", self.ticks, time.time())
                    await self._run_tick()
                else:
                    self.health.beat(self.clock())
                delay = max(0.0, self.settings.tick_s - (self.clock() - started))
                await self._sleep(stop, delay)
        finally:
            elector_task.cancel()  # releases the Lease when held
            with contextlib.suppress(asyncio.CancelledError):
                await elector_task
            for t in informer_tasks:
                t.cancel()
            await asyncio.gather(*informer_tasks, return_exceptions=True)
            await runner.cleanup()
            log.info("stopped")

    async def _sleep(self, stop: asyncio.Event, delay: float) -> None:
        """Until the next tick is due, ``stop`` is set, or an activation report asks for a scale from zero (a
        request held for a model at zero must not wait for the next tick)."""
        waits = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(self.activations.wake.wait())]
        try:
            await asyncio.wait(waits, timeout=delay, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()
            await asyncio.gather(*waits, return_exceptions=True)

    def _report_auth(self, api_client: object) -> ReportAuth | None:
        """Who may report activations: the activator ServiceAccount's token (a TokenReview) and, the second check,
        its pod among the activator pods the informer knows (docs/scale-to-zero.md, Security). None: the activator
        is not enabled."""
        pods = self.activator_pods
        if pods is None:
            return None
        ns = self.settings.activator_namespace or self.settings.lease_namespace
        refused = refused_counter(self.exporter.registry)
        user = service_account_user(ns, self.settings.activator_service_account)
        return ReportAuth(kube_token_review(api_client), user, pods.items,
                          audience=self.settings.activator_token_audience or None,
                          peer_ips=lambda p: pod_ips(p.get("status") or {}),
                          on_refused=lambda reason: refused.labels(reason).inc())

    def _activator_ips(self) -> Callable[[], set[str]] | None:
        """The IPs of the activator pods the informer knows (any phase: a pod reports as soon as it holds a
        request): where reports were taken from before tokens, now only for a server without ``report_auth``
        (the token check, :meth:`_report_auth`, takes precedence). None: the activator is not enabled."""
        pods = self.activator_pods
        if pods is None:
            return None
        return lambda: {str(ip) for p in pods.items()
                        for ip in [(p.get("status") or {}).get("podIP"),
                                   *[i.get("ip") for i in (p.get("status") or {}).get("podIPs") or ()]] if ip}

    def _watch_kueue(self, path: str) -> None:
        """Watch Kueue Workloads at ``path`` (the version the apiserver serves: v1beta2 on a current Kueue)."""
        old = self.training[-1]
        if path == old.path:
            return
        new = Informer(self.api, path, label_selector=old.label_selector, name=f"training:{path}", optional=True,
                       **self._liveness)
        self.training[-1] = new
        self.informers[self.informers.index(old)] = new
        log.info("Kueue Workloads watched at %s", path)

    async def _run_tick(self) -> None:
        """One tick as its own task: not cancelled by ``stop`` (a tick finishes cleanly), cancelled when
        leadership is lost (see :meth:`_leadership_changed`)."""
        self._tick_task = asyncio.create_task(self.tick(), name=f"tick-{self.ticks}")
        try:
            await asyncio.wait({self._tick_task})
        finally:
            task, self._tick_task = self._tick_task, None
        if task.cancelled():
            self.exporter.error("leadership_lost")
        elif (exc := task.exception()) is not None:  # a bug or an API outage must not kill the loop; say so, go on
            log.error("tick failed", exc_info=exc)
            self.exporter.error("tick")

    async def _wait_synced(self, stop: asyncio.Event) -> bool:
        while not stop.is_set():
            if all(i.synced for i in self.informers):
                return True
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=0.2)
        return False
