"""The Kubernetes actuator: applies one tick's :class:`~autoscaler.api.plan.Plan` to a real cluster
(kubernetes_asyncio).

One module: every write of a tick (scale, template, ConfigMaps, status, Events, the MIG gate's node writes) goes
through the one :class:`KubeActuator`'s retries, per-tick rate limits and Event de-duplication; what it writes,
as pure functions, is in :mod:`~autoscaler.live.kube.writes`.

What each action becomes:

- ``ScaleModel``: the workload's ``scale`` subresource (replaced with the read ``resourceVersion``), whatever its
  kind -- Deployment, StatefulSet, LeaderWorkerSet (whose replicas are groups), Argo Rollout
  (:mod:`~autoscaler.live.kube.workloads`) -- through the generic object calls; the status annotation and the Events
  name the same workload. The Scale
  just read is compared with the replicas the plan started from (``ScaleModel.previous``): when they differ (a
  stale cache, another writer) a value below the live one is never written -- it would be a scale-down no rail
  approved -- and the action is skipped ``stale-view`` (the next tick plans from fresh data); a value above the
  live one is still written (it lowers nothing). Before a
  scale-down the plan's ``RemoveReplica`` pods get ``controller.kubernetes.io/pod-deletion-cost=-1000`` so the
  ReplicaSet removes them first (honoured from Kubernetes 1.22 on, harmless before); a StatefulSet or a
  LeaderWorkerSet removes its highest ordinals / group indices whatever the pods say, so nothing is marked there
  (the removals are skipped ``by-index``). A StatefulSet keeps ordinals ``[start, start + replicas)``: with an
  ordinal gap (pods 0, 1, 3, 4) the plan's count would remove more running pods than planned, so its scale-down
  writes the value that removes only the highest ones the plan takes off
  (``workloads.statefulset_replicas_keeping``; skipped ``ordinal-unknown`` when a replica has no ordinal). A
  preemption (a ``RemoveReplica`` with ``preempted_by``) takes the same path, and once the scale-down is written
  the victim workload gets a Warning Event ``Preempted`` with the core's message (one per replica; repeats bump
  the count).
- ``SetSlotTemplate``: a JSON patch of the pod template: the container's ``resources`` replaced whole (so the old
  GPU resource goes, e.g. ``nvidia.com/gpu`` -> ``nvidia.com/mig-3g.40gb``) and its ``nodeSelector``. An Argo
  Rollout with ``workloadRef`` has its template in the referenced Deployment, which is what gets the patch (Argo
  rolls out that Deployment's template changes); a reference to another kind is skipped ``no-pod-template``.
- ``SetTimeSlicing``: the device plugin's time-slicing ConfigMap (create, or update one key).
- ``SetMigLayout``: the MIG safety gate (:mod:`~autoscaler.live.kube.mig_gate`), only with ``mig_relayout``.
- ``UpdateStatus``: the ``slotwise.io/status`` annotation (merge patch of that key only) and a core/v1 Event;
  with the model's shortfall this tick (``shortfall``: cause -> replicas) when the plan has one. Written only on
  a material change (:func:`~autoscaler.live.kube.writes.status_change`: desired, ready, reason, condition,
  shortfall, the message's words, a forecast or latency moved by more than ``status_change_ratio``); a change of
  noise alone at most every ``status_refresh_s``, without an Event. The Event is de-duplicated on its
  number-free text (the repeat bumps the one Event and carries the latest message), as client-go's aggregator
  groups similar Events.
- ``Shortfall``: an Event whose reason and message say the cause
  (:func:`~autoscaler.live.kube.writes.shortfall_event`): a Warning for a refusal (``Unplaceable``,
  ``BorrowingLimit``, ``MinRuntime``, ``Outranked``, ``PreemptionTooCostly``, ``MaxReplicas``), Normal for headroom
  not granted and for capacity being freed (``Reclaiming``, ``Preempting``). Aggregated on its number-free text (the
  missing count moves); a shortfall that lasts -- the same Event on the model's previous decision too -- is
  written on its first decision and then bumped at most every ``status_refresh_s`` (the bump's ``count`` carries
  the decisions held between, as Kubernetes' event series do), while one that is new or comes back (another cause,
  other words, absent on the previous decision) is written at once.
- ``PlaceReplica``: nothing; kube-scheduler places the pods (reported as skipped ``scheduler-placed``).
- A model another autoscaler scales (``ManagedModel.autoscaled_by``: an HPA or a KEDA ScaledObject,
  :mod:`~autoscaler.live.kube.autoscalers`): its ``ScaleModel`` and ``RemoveReplica`` are skipped ``autoscaled-by``
  (never a second writer of ``/scale``), one Event per autoscaler and mode says why (status: ``autoscaledBy``);
  ``coexistence: hands-off`` (default) skips its ``SetSlotTemplate`` too, ``advise`` applies it (the exporter
  publishes the advised replicas).

Rules every write follows: **idempotent** (read first; no write when the object already says so), **optimistic
concurrency** (every read-modify-write carries the read ``resourceVersion``; a 409 Conflict re-reads and retries
up to ``conflict_retries`` times with full-jitter backoff; a 429 waits the server's ``Retry-After`` when it is at
most ``retry_after_max_s``, else the action fails for this tick), **gated** (``gate.check`` right before each
request that changes the cluster: a deposed leader writes nothing more,
:class:`~autoscaler.live.kube.term.LeadershipLost` leaves :meth:`KubeActuator.apply` and the tick is abandoned),
**rate-limited per tick** (scale writes, template changes, Events; what is over the limit is skipped
``rate-limit`` and the next tick re-plans it), **errors stay per action** (logged, listed in ``report.errors``
with the API status; the other actions go on), a Deployment deleted meanwhile is skipped ``gone``.

**Dry run** writes nothing at all (every change is listed as skipped ``dry-run``; only reads are made).
**Report mode** (``report_only``) writes only the status annotation (``"dryRun": true``) and Events (reason
prefixed ``DryRun``); every other change is skipped ``report-only``.

Events are de-duplicated like client-go's recorder: the same (object, type, reason, message) within
``event_dedup_window_s`` bumps ``count`` and ``lastTimestamp`` of the Event already written instead of creating
a new one.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml
from kubernetes_asyncio.client import AppsV1Api, CoreV1Api, CustomObjectsApi
from kubernetes_asyncio.client.rest import ApiException

from autoscaler.api.plan import (
    Action,
    PlaceReplica,
    Plan,
    RemoveReplica,
    ScaleModel,
    SetMigLayout,
    SetRouting,
    SetSlotTemplate,
    SetTimeSlicing,
    Shortfall,
    UpdateStatus,
)
from autoscaler.api.spec import SpecError, parse_annotations
from autoscaler.live.kube.dra_act import DraActuation
from autoscaler.live.kube.dra_claims import (
    DraTarget,
    claim_removal_ops,
    claim_spec,
    claim_template,
    dra_target,
    mig_relayout_refusal,
    pod_template_changes,
    without_slotwise_claim,
)
from autoscaler.live.kube.mig_gate import (
    OWNER_LABEL,
    STATE_PENDING,
    STATE_SUCCESS,
    MigGate,
    NodeRead,
)
from autoscaler.live.kube.objects import (
    FIELD_MANAGER,
    GPU_RESOURCE,
    MIG_CONFIG,
    MIG_CONFIG_STATE,
    POD_DELETION_COST,
    STATUS_ANNOTATION,
    ClusterView,
    ManagedModel,
)
from autoscaler.live.kube.routing_act import RoutingActuation
from autoscaler.live.kube.term import ALWAYS_OPEN, LeadershipLost, WriteGate
from autoscaler.live.kube.workloads import (
    STATEFULSET,
    by_name,
    ordinals_start,
    split_api_version,
    statefulset_replicas_keeping,
    template_home,
)
from autoscaler.live.kube.writes import (
    ADVISE,
    COEXISTENCE_DEFAULT,
    COEXISTENCE_MODES,
    PREEMPTED_EVENT,
    Gone,
    api_error,
    autoscaled_event,
    describe,
    merge_mig_configs,
    merged_node_selector,
    merged_resources,
    retry_after_s,
    rfc3339,
    scale_outcome,
    shortfall_event,
    split_key,
    stable_text,
    status_change,
    status_event,
    status_payload,
)
from sharing.render import time_slicing_config, to_yaml

log = logging.getLogger(__name__)

MERGE_PATCH = "application/merge-patch+json"
MIG_PARTED_KEY = "config.yaml"  # the key NVIDIA's MIG manager reads from its config ConfigMap
DELETION_COST_FIRST = "-1000"  # lower cost = removed first by the ReplicaSet controller
EVENT_CACHE_MAX = 4096  # de-duplication cache entries (client-go's recorder keeps an LRU of this size)
EVENT_MESSAGE_MAX = 4096  # core/v1 has no limit of its own; keep one runaway message from bloating etcd
# the reason of the routing check the actuator makes itself before a scale to 0 (not a planned SetRouting)
BEFORE_ZERO = "before-zero"


@dataclass
class ActuatorConfig:
    dry_run: bool = False  # read only: nothing is written, not even status or Events
    report_only: bool = False  # write only the status annotation and Events (settings `actuator: {report_only: true}`)
    max_scale_actions_per_tick: int = 50
    max_template_changes_per_tick: int = 5
    max_events_per_tick: int = 50
    conflict_retries: int = 5
    time_slicing_configmap: str = "gpu-operator/time-slicing-config"
    time_slicing_key: str = "any"
    mig_parted_configmap: str = "gpu-operator/slotwise-mig-parted-config"
    mig_relayout: bool = False
    max_nodes_relayout: int = 1
    mig_timeout_s: float = 600.0
    component: str = "slotwise"
    conflict_backoff_s: float = 0.05  # first retry's backoff cap (full jitter, doubling per retry)
    event_dedup_window_s: float = 600.0  # same Event again within this -> count bump instead of a new object
    # a status whose numbers alone moved is rewritten at most this often; so is a lasting shortfall's Event
    status_refresh_s: float = 300.0
    status_change_ratio: float = 0.2  # a forecast / latency moved by more than this share is a material change
    retry_after_max_s: float = 2.0  # a 429's Retry-After up to this is waited for within the tick, else it fails
    # a model an HPA or a KEDA ScaledObject scales (ManagedModel.autoscaled_by): never a /scale write; "hands-off"
    # leaves the workload alone (status + one Event say why), "advise" also applies its slot template and the
    # exporter publishes slotwise_advised_replicas for the autoscaler to act on (docs/kubernetes.md)
    coexistence: str = COEXISTENCE_DEFAULT

    def __post_init__(self) -> None:
        if self.coexistence not in COEXISTENCE_MODES:
            raise ValueError(f"actuator.coexistence must be one of {', '.join(COEXISTENCE_MODES)}, "
                             f"got {self.coexistence!r}")

    @property
    def acting(self) -> bool:
        """Changes the cluster (scale, templates, ConfigMaps, nodes): neither a dry run nor report mode."""
        return not (self.dry_run or self.report_only)

    @property
    def skip_why(self) -> str:
        """The skip reason of a change not made because of the mode."""
        return "dry-run" if self.dry_run else "report-only"


@dataclass
class ActuationReport:
    applied: list[str] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (line, why)
    errors: list[str] = field(default_factory=list)
    conflicts_retried: int = 0
    pending: list[str] = field(default_factory=list)  # MIG relayouts waiting (one line per node and tick)
    events: int = 0  # Events written this tick (created or count bumped)

    def why(self, prefix: str) -> list[str]:
        """The skip reasons of lines starting with ``prefix`` (tests, logs)."""
        return [why for line, why in self.skipped if line.startswith(prefix)]


def _slot_ops(pointer: str, pod_spec: Mapping[str, Any], idx: int, resources: Mapping[str, Any],
              node_selector: Mapping[str, str] | None) -> list[dict[str, Any]]:
    """The JSON-patch ops that give container ``idx`` of the pod template at ``pointer`` ``resources`` and the
    template ``node_selector`` (empty or None: removed). The name check guards the index (containers are a list)
    even without the resourceVersion precondition; the whole resources map is replaced: a merge would keep the old
    GPU resource next to the new one."""
    base = f"{pointer}/spec/containers/{idx}"
    ops: list[dict[str, Any]] = [
        {"op": "test", "path": f"{base}/name", "value": pod_spec["containers"][idx].get("name")},
        {"op": "add", "path": f"{base}/resources", "value": resources}]
    if node_selector:
        ops.append({"op": "add", "path": f"{pointer}/spec/nodeSelector", "value": node_selector})
    elif "nodeSelector" in pod_spec:
        ops.append({"op": "remove", "path": f"{pointer}/spec/nodeSelector"})
    return ops


class NoPodTemplate(Exception):
    """The workload has no pod template of its own to write a slot into (a Rollout with ``workloadRef``)."""


def _address(mm: ManagedModel) -> tuple[str, str, str]:
    """(group, version, plural) of a model's workload, for the generic object and /scale calls."""
    group, version = split_api_version(mm.api_version)
    return group, version, mm.resource


async def _or_gone(read: Awaitable[Any], key: str) -> Any:
    """A read of an object that may have been deleted meanwhile: a 404 is :class:`Gone` (``key``)."""
    try:
        return await read
    except ApiException as e:
        if e.status == 404:
            raise Gone(key) from None
        raise


# -- the actuator -------------------------------------------------------------------------------------------------


@dataclass
class _Tick:
    view: ClusterView
    now: float
    gate: WriteGate = ALWAYS_OPEN
    report: ActuationReport = field(default_factory=ActuationReport)
    scale_writes: int = 0
    template_writes: int = 0
    events: int = 0


@dataclass
class _Seen:
    name: str
    namespace: str
    count: int  # the count the Event has on the server
    last: float  # last seen (written or held): the de-duplication window runs from here
    written: float = -float("inf")  # last written (created or bumped)
    held: int = 0  # occurrences not written yet (a lasting shortfall's): the next bump adds them to the count


Hook = Callable[[str, str], Awaitable[None]]


class KubeActuator:
    """Applies plans to the cluster; one object for the controller's life (the MIG gate and the Event
    de-duplication cache persist across ticks)."""

    def __init__(self, api_client: Any, config: ActuatorConfig, *, clock: Callable[[], float] = time.time,
                 rng: random.Random | None = None) -> None:
        self.api_client = api_client
        self.config = config
        self.clock = clock
        self._apps = AppsV1Api(api_client)
        self._core = CoreV1Api(api_client)
        # any workload kind (Deployment, StatefulSet, LeaderWorkerSet, Rollout): its object and /scale by
        # group/version/plural; these calls work for built-in groups as for CRDs, and answer plain dicts
        self._objects = CustomObjectsApi(api_client)
        # DRA reads and writes (discovery asked on first use; the controller hands over its own)
        self.dra = DraActuation(api_client)
        # the activator's EndpointSlices (SetRouting); the controller points activator_pods at its informer and
        # slice_api_version at the discovered discovery.k8s.io version
        self.routing = RoutingActuation(api_client)
        self._rng = rng or random.Random()
        self.gate = MigGate(max_nodes=config.max_nodes_relayout, timeout_s=config.mig_timeout_s,
                            retry_after_s=config.mig_timeout_s)
        self._seen: dict[tuple, _Seen] = {}
        # model -> the Event keys of its shortfalls on its previous decision: only those may be held (lasting)
        self._shortfalls: dict[str, set[tuple]] = {}
        self._event_seq = 0
        self._told: dict[str, tuple[str, str]] = {}  # model -> (autoscaled_by, coexistence) its Event told
        # Test seam: awaited after every read and before the write that depends on it, with (what, object key),
        # what in {"scale", "template", "time-slicing", "mig-config", "cordon"}: a test changes the object here
        # to make the write really conflict (409) against the server.
        self.before_write: Hook | None = None

    # -- the tick ---------------------------------------------------------------------------------------------

    def new_term(self) -> None:
        """Leadership was (re)gained: forget what an earlier term remembered (MIG relayouts in flight); the next
        :meth:`apply` adopts what the nodes' labels say instead."""
        self.gate.new_term()

    async def apply(self, plan: Plan, view: ClusterView, gate: WriteGate = ALWAYS_OPEN) -> ActuationReport:
        """Apply ``plan`` (made from ``view``); ``gate`` is checked right before every write (pass the one pinned
        to the term the plan was made in). Raises :class:`LeadershipLost` as soon as a write is refused."""
        tick = _Tick(view=view, now=self.clock(), gate=gate)
        r = tick.report
        removals: dict[str, list[RemoveReplica]] = {}
        for a in plan.of_type(RemoveReplica):
            removals.setdefault(a.model, []).append(a)
        # order: device-plugin config and MIG layout first (new pods need the resources), then templates (new
        # pods of a scale-up must get the new slot kind), then scale, then what only reports
        for a in plan.of_type(SetTimeSlicing):
            await self._guard(tick, a, self._time_slicing)
        await self._mig(tick, plan.of_type(SetMigLayout))
        for a in plan.of_type(SetSlotTemplate):
            if not self._leaves_template(tick, a):
                await self._guard(tick, a, self._template)
        # routing before scaling: a model goes to zero only once its traffic goes through the activator, and
        # not at all when that write failed (its requests would have nowhere to go)
        unrouted = await self._routes(tick, plan)
        scaled = set()
        for a in plan.of_type(ScaleModel):
            scaled.add(a.model)
            if a.replicas == 0 and a.model in unrouted:
                r.skipped.append((describe(a), "routing-failed"))
                r.skipped.extend((describe(x), "routing-failed") for x in removals.get(a.model, []))
                continue
            await self._guard(tick, a, lambda t, a=a: self._scale(t, a, removals.get(a.model, [])))
        # after the scale writes: a scale from zero (ACTIVATED) never waits behind the reconciles of the other
        # models at zero
        await self._reconcile_routes(tick, plan)
        for model, rems in removals.items():
            if model not in scaled:
                r.skipped.extend((describe(x), "no-scale") for x in rems)
        for a in plan.of_type(PlaceReplica):
            r.skipped.append((describe(a), "scheduler-placed"))
        now_short: dict[str, set[tuple]] = {}
        for a in plan.of_type(Shortfall):
            await self._guard(tick, a, lambda t, a=a: self._shortfall(t, a, now_short))
        self._shortfalls = now_short  # a model without a shortfall this tick: its next one is new
        short: dict[str, dict[str, int]] = {}
        for a in plan.of_type(Shortfall):
            causes = short.setdefault(a.model, {})
            causes[str(a.cause)] = causes.get(str(a.cause), 0) + a.missing
        for a in plan.of_type(UpdateStatus):
            await self._guard(tick, a, lambda t, a=a: self._status(t, a, short.get(a.model)))
        if r.errors:
            log.warning("actuation: %d applied, %d skipped, %d error(s): %s", len(r.applied), len(r.skipped),
                        len(r.errors), "; ".join(r.errors))
        else:
            log.info("actuation: %d applied, %d skipped, %d conflict(s) retried", len(r.applied), len(r.skipped),
                     r.conflicts_retried)
        return r

    # -- routing (scale to and from zero) -------------------------------------------------------------------

    @property
    def activator_pods(self) -> Callable[[], Any]:
        return self.routing.activator_pods

    @activator_pods.setter
    def activator_pods(self, pods: Callable[[], Any]) -> None:
        self.routing.activator_pods = pods

    @property
    def slice_api_version(self) -> str:
        return self.routing.api_version

    @slice_api_version.setter
    def slice_api_version(self, api_version: str) -> None:
        self.routing.api_version = api_version

    async def _routes(self, tick: _Tick, plan: Plan) -> set[str]:
        """Apply the plan's ``SetRouting``. Answers the models whose routing could not be written (no scale to
        zero for them this tick)."""
        failed: set[str] = set()
        planned = {a.model for a in plan.of_type(SetRouting)}
        # A scale to 0 of a fronted model whose routing an earlier tick wrote (the rail routes first, keeps one
        # replica, and scales to 0 on a later tick): the slice is made current now, with at least one Ready
        # activator pod, or the scale waits. The activators of that earlier tick may be gone since; a slice still
        # naming them would leave the model's requests nowhere.
        before_zero = [SetRouting(a.model, True, BEFORE_ZERO) for a in plan.of_type(ScaleModel)
                       if a.replicas == 0 and a.model not in planned
                       and getattr(tick.view.models.get(a.model), "service", None) is not None]
        for a in [*plan.of_type(SetRouting), *before_zero]:
            errors = len(tick.report.errors)
            await self._guard(tick, a, self._route)
            if len(tick.report.errors) > errors:
                failed.add(a.model)
        return failed

    async def _reconcile_routes(self, tick: _Tick, plan: Plan) -> None:
        """Keep the slices of the models already going through the activator (and not routed by the plan) in
        step with the activator's pods: from the informers' copies, so a model in step costs no API call; a
        read and a write only for one that differs."""
        planned = {a.model for a in plan.of_type(SetRouting)}
        for k, o in sorted(tick.view.snapshot.models.items()):
            mm = tick.view.models.get(k)
            if not o.via_activator or k in planned or mm is None or mm.service is None:
                continue
            try:
                in_step = self.routing.in_step(mm)
                if in_step is None and self.routing.slices is not None:
                    await self.routing.ports(mm)  # not cached yet (a fresh start): one Service read, then memory
                    in_step = self.routing.in_step(mm)
            except Exception as e:  # a failed Service read: the reconcile below says it as the action's error
                log.debug("routing reconcile of %s: %s", k, api_error(e))
                in_step = None
            if not in_step:
                await self._guard(tick, SetRouting(k, True, "reconcile"), self._route)

    async def _route(self, tick: _Tick, a: SetRouting) -> None:
        r, line = tick.report, describe(a)
        mm = self._model(tick, a.model)
        if mm.service is None:
            r.skipped.append((line, "no-service"))
            return
        if not self.config.acting:
            r.skipped.append((line, self.config.skip_why))
            return
        await self._hook("routing", mm.key)
        if a.via_activator:
            done = await self.routing.route(mm, tick.gate, lambda attempt: self._retrying(tick, attempt),
                                            reconcile=a.reason == "reconcile")
        else:
            done = await self.routing.unroute(mm, tick.gate)
        if done == "unchanged":
            if a.reason not in ("reconcile", BEFORE_ZERO):
                r.skipped.append((line, "unchanged"))
            return
        r.applied.append(f"{line}: EndpointSlice {done}")

    async def _guard(self, tick: _Tick, a: Action, fn: Callable[[_Tick, Any], Awaitable[None]]) -> None:
        """Run one action; whatever goes wrong stays with it."""
        try:
            await fn(tick, a)
        except Gone:
            tick.report.skipped.append((describe(a), "gone"))
        except NoPodTemplate:
            tick.report.skipped.append((describe(a), "no-pod-template"))
        except LeadershipLost:
            raise  # not this action's error: the whole tick stops
        except Exception as e:
            line = describe(a)
            log.warning("%s: %s", line, api_error(e))
            tick.report.errors.append(f"{line}: {api_error(e)}")

    async def _retrying(self, tick: _Tick, attempt: Callable[[], Awaitable[Any]]) -> Any:
        """``attempt`` (a read-compare-write) again after each 409 Conflict, or after a 429 whose ``Retry-After``
        is at most ``retry_after_max_s`` (waited in full), up to ``conflict_retries`` times."""
        for n in range(self.config.conflict_retries + 1):
            try:
                return await attempt()
            except ApiException as e:
                if n == self.config.conflict_retries:
                    raise
                if e.status == 429:
                    wait = retry_after_s(getattr(e, "headers", None), e.body)
                    if wait is None or wait > self.config.retry_after_max_s:
                        raise  # the server asks for longer than a tick may wait: the next tick re-plans
                    log.info("too many requests (%s), retrying after %.1fs", api_error(e), wait)
                    await asyncio.sleep(wait)
                    continue
                if e.status != 409:
                    raise
                tick.report.conflicts_retried += 1
                log.info("conflict (%s), re-reading (retry %d)", api_error(e), n + 1)
                await asyncio.sleep(self._rng.uniform(0.0, self.config.conflict_backoff_s * 2**n))
        raise AssertionError("unreachable")

    async def _hook(self, what: str, key: str) -> None:
        if self.before_write is not None:
            await self.before_write(what, key)

    def _model(self, tick: _Tick, model: str) -> ManagedModel:
        mm = tick.view.models.get(model)
        if mm is None:
            raise Gone(model)
        return mm

    # -- scale ------------------------------------------------------------------------------------------------

    async def _scale(self, tick: _Tick, a: ScaleModel, removals: list[RemoveReplica]) -> None:
        r, line = tick.report, describe(a)
        mm = self._model(tick, a.model)
        if await self._autoscaled(tick, a, mm, removals):
            return  # an HPA / KEDA scales it: never a second writer of its /scale
        if not self.config.acting:
            r.skipped.append((line, self.config.skip_why))
            r.skipped.extend((describe(x), self.config.skip_why) for x in removals)
            await self._preempted(tick, mm, removals)  # reported as DryRunPreempted: what would happen
            return
        if tick.scale_writes >= self.config.max_scale_actions_per_tick:
            r.skipped.append((line, "rate-limit"))
            r.skipped.extend((describe(x), "rate-limit") for x in removals)
            return
        marked = False
        live = mm.replicas
        # The ReplicaSet still counts pods on nodes out of service (NotReady, GPUs gone) until they are evicted:
        # the plan's live replicas come on top of them. The plan started from the Deployment's spec.replicas as the
        # view read it: a Scale that says otherwise now means the view is stale (a frozen cache, another writer).
        target = a.replicas + mm.unavailable_replicas

        group, version, plural = _address(mm)
        wrote = target

        async def attempt() -> str:
            nonlocal marked, live, wrote
            # the workload's /scale subresource, whatever its kind (a LeaderWorkerSet's counts groups)
            scale = await _or_gone(self._objects.get_namespaced_custom_object_scale(
                group, version, mm.namespace, plural, mm.name), mm.key)
            current = live = int((scale.get("spec") or {}).get("replicas") or 0)
            wrote = target
            if target < current and by_name(mm.kind, mm.api_version) is STATEFULSET:
                got = await self._ordinal_target(tick, mm, a)
                if got is None:
                    return "ordinal-unknown"
                wrote = min(got, current)  # a scale-down never turns into a scale-up (pods above it not yet gone)
            outcome = scale_outcome(current, wrote, mm.replicas, decrease=a.replicas < a.previous)
            if outcome != "write":
                return outcome
            if wrote < current and not marked:
                await self._mark_for_removal(tick, mm, removals)
                marked = True
            await self._hook("scale", mm.key)
            tick.gate.check(f"scale {mm.key}")
            body = {
                "apiVersion": "autoscaling/v1",
                "kind": "Scale",
                "metadata": {"name": mm.name, "namespace": mm.namespace,
                             "resourceVersion": (scale.get("metadata") or {}).get("resourceVersion")},
                "spec": {"replicas": wrote},
            }
            await self._objects.replace_namespaced_custom_object_scale(
                group, version, mm.namespace, plural, mm.name, body, field_manager=FIELD_MANAGER)
            return f"{current} -> {wrote}"

        try:
            outcome = await self._retrying(tick, attempt)
        except Gone:
            r.skipped.extend((describe(x), "gone") for x in removals)
            raise
        if outcome == "stale-view":
            log.warning("%s: not written, the scale is %d but the plan started from %d", line, live, mm.replicas)
            r.skipped.append((f"{line}: scale is {live}, planned from {mm.replicas}", "stale-view"))
            r.skipped.extend((describe(x), "stale-view") for x in removals)
            return
        if outcome == "ordinal-unknown":
            # which pods a StatefulSet would remove is not known: holding loses nothing, a guess might lose more
            r.skipped.append((f"{line}: a replica's StatefulSet ordinal is unknown", "ordinal-unknown"))
            r.skipped.extend((describe(x), "ordinal-unknown") for x in removals)
            return
        if outcome == "unchanged":
            r.skipped.append((line, "unchanged"))
            if not marked:
                r.skipped.extend((describe(x), "unchanged") for x in removals)
            return
        tick.scale_writes += 1
        if wrote != target:
            line = (f"{line}: wrote {wrote}, not {target}: StatefulSet ordinal gap (only the {live - wrote}"
                    " highest ordinals go; the missing ones below are recreated)")
        r.applied.append(line)
        # only once the scale-down is written: a skipped or failed one is planned again next tick
        await self._preempted(tick, mm, removals)

    async def _ordinal_target(self, tick: _Tick, mm: ManagedModel, a: ScaleModel) -> int | None:
        """A StatefulSet scale-down's ``spec.replicas``: the controller deletes every ordinal at or above
        ``start + replicas``, so with a gap (pods 0, 1, 3, 4) the plan's count (3) would remove 3 AND 4; this is
        the value that removes only the highest replicas the plan takes off (:func:`statefulset_replicas_keeping`,
        from the view's replicas that are not already going). None: some replica's ordinal is unknown."""
        group, version, plural = _address(mm)
        obj = await _or_gone(self._objects.get_namespaced_custom_object(group, version, mm.namespace, plural,
                                                                        mm.name), mm.key)
        obs = tick.view.snapshot.models.get(mm.key)
        if obs is None:
            return a.replicas + mm.unavailable_replicas
        pods = [r.replica_id.rpartition("/")[2] for r in obs.replicas if not r.draining]
        return statefulset_replicas_keeping(mm.name, ordinals_start(obj), pods, a.replicas)

    async def _preempted(self, tick: _Tick, mm: ManagedModel, removals: list[RemoveReplica]) -> None:
        """A Warning Event ``Preempted`` on the victim workload per preempted replica (the core's message)."""
        for x in removals:
            if x.preempted_by:
                message = x.message or f"replica {x.replica_id} preempted ({x.reason}) for {x.preempted_by}"
                await self._event(tick, self._deployment_ref(mm, mm.uid), "Warning", PREEMPTED_EVENT, message)

    async def _mark_for_removal(self, tick: _Tick, mm: ManagedModel, removals: list[RemoveReplica]) -> None:
        """Best effort: a pod already gone is fine, a failure is reported and does not stop the scale-down.

        Only where a ReplicaSet does the removing (Deployment, Argo Rollout): a StatefulSet removes its highest
        ordinals and a LeaderWorkerSet its highest group indices (leader and workers), whatever
        ``pod-deletion-cost`` says, so the replicas the plan named are not marked there (skipped ``by-index``)."""
        wk = by_name(mm.kind, mm.api_version)
        if wk is not None and not wk.deletion_cost:
            tick.report.skipped.extend((describe(x), "by-index") for x in removals)
            return
        for x in removals:
            ns, pod = split_key(x.replica_id, mm.namespace)

            async def mark(ns: str = ns, pod: str = pod) -> None:
                tick.gate.check(f"{POD_DELETION_COST} on {ns}/{pod}")  # in the attempt: checked again on a retry
                await self._core.patch_namespaced_pod(
                    pod, ns, {"metadata": {"annotations": {POD_DELETION_COST: DELETION_COST_FIRST}}},
                    _content_type=MERGE_PATCH, field_manager=FIELD_MANAGER)

            try:
                await self._retrying(tick, mark)
            except ApiException as e:
                if e.status == 404:
                    tick.report.skipped.append((describe(x), "gone"))
                    continue
                tick.report.errors.append(f"{describe(x)}: {api_error(e)}")
                continue
            tick.report.applied.append(f"{describe(x)}: {POD_DELETION_COST}={DELETION_COST_FIRST}")

    # -- living beside an HPA or a KEDA ScaledObject -----------------------------------------------------------

    async def _autoscaled(self, tick: _Tick, a: ScaleModel, mm: ManagedModel, removals: list[RemoveReplica]) -> bool:
        """True when another autoscaler scales the model (``mm.autoscaled_by``): the scale and its removals are
        skipped ``autoscaled-by`` (no /scale write, no pod marked) and, once per autoscaler and mode, an Event says
        why (Warning ``AutoscaledElsewhere``; Normal ``AdvisingAutoscaler`` in advise mode)."""
        if not mm.autoscaled_by:
            self._told.pop(mm.key, None)  # an autoscaler added again later is told again
            return False
        r = tick.report
        r.skipped.append((describe(a), "autoscaled-by"))
        r.skipped.extend((describe(x), "autoscaled-by") for x in removals)
        said = (mm.autoscaled_by, self.config.coexistence)
        if self._told.get(mm.key) == said:
            return True
        type_, reason, message = autoscaled_event(mm.kind, mm.namespace, mm.name, mm.autoscaled_by,
                                                  a.replicas + mm.unavailable_replicas, self.config.coexistence)
        if await self._event(tick, self._deployment_ref(mm, mm.uid), type_, reason, message, aggregate=True):
            self._told[mm.key] = said
        return True

    def _leaves_template(self, tick: _Tick, a: SetSlotTemplate) -> bool:
        """Hands-off leaves an autoscaled model's pod template alone too (skipped ``autoscaled-by``). Advise mode
        applies it: the replicas it advises are sized for that slot, and HPA / KEDA write only /scale."""
        mm = tick.view.models.get(a.model)
        if mm is None or not mm.autoscaled_by or self.config.coexistence == ADVISE:
            return False
        tick.report.skipped.append((describe(a), "autoscaled-by"))
        return True

    # -- slot template ----------------------------------------------------------------------------------------

    async def _template(self, tick: _Tick, a: SetSlotTemplate) -> None:
        r, line = tick.report, describe(a)
        mm = self._model(tick, a.model)
        if not self.config.acting:
            r.skipped.append((line, self.config.skip_why))
            return
        if tick.template_writes >= self.config.max_template_changes_per_tick:
            r.skipped.append((line, "rate-limit"))
            return
        # DRA nodes (issue 17): the slot is a ResourceClaimTemplate the pod template references (dra_claims.py)
        dra = self.dra
        version = await dra.version()
        labels = {n: info.labels for n, info in tick.view.nodes.items()}
        target = None if version is None else dra_target(await dra.inventory(labels), labels.items(),
                                                         a.node_selector)
        if target is not None and version is not None:
            await self._template_claim(tick, a, mm, dra, version, target)
            return

        async def attempt() -> bool:
            obj, where = await self._pod_templates(mm)
            # a resourceVersion in the patch is a precondition: the server answers 409 if it moved on
            ops: list[dict[str, Any]] = [
                {"op": "replace", "path": "/metadata/resourceVersion", "value": obj["metadata"]["resourceVersion"]}]
            for pointer, pod_spec, idx in where:  # every template of the workload (a LeaderWorkerSet: both)
                container = pod_spec["containers"][idx]
                old_res = container.get("resources") or {}
                old_sel = pod_spec.get("nodeSelector") or {}
                # a model coming back from a DRA pool: its claim of the DRA slot goes (a pod asking for
                # nvidia.com/gpu AND the claim never schedules); claims that are not slotwise's stay
                unclaimed, _ = without_slotwise_claim(pod_spec, container)
                claim_ops = claim_removal_ops(pointer, pod_spec)
                new_res = merged_resources(unclaimed, a.resources)
                new_sel = merged_node_selector(old_sel, a.node_selector)
                if new_res == old_res and new_sel == old_sel and not claim_ops:
                    continue
                ops += _slot_ops(pointer, pod_spec, idx, new_res, new_sel) + claim_ops
            if len(ops) == 1:
                return False
            await self._hook("template", mm.key)
            tick.gate.check(f"template {mm.key}")
            await self._patch_object(mm, ops, obj)
            return True

        if await self._retrying(tick, attempt):
            tick.template_writes += 1
            r.applied.append(line)
        else:
            r.skipped.append((line, "unchanged"))

    async def _template_claim(self, tick: _Tick, a: SetSlotTemplate, mm: ManagedModel, dra: DraActuation,
                              version: str, target: DraTarget) -> None:
        """The DRA half of :meth:`_template`: the ResourceClaimTemplate (created once: its name is its spec's hash),
        then the pod template's claim reference, container claim and node selector (one JSON patch, as above)."""
        r, line = tick.report, describe(a)
        share = None
        if target.shareable and GPU_RESOURCE in (a.resources.get("limits") or {}):
            try:
                spec = parse_annotations(mm.key, mm.annotations, namespace=mm.namespace)
            except SpecError:
                spec = None
            if spec is not None and spec.gpu_memory_gib is not None and set(spec.slot_kinds) <= {"share"}:
                share = spec.gpu_memory_gib
        claim = claim_spec(a.resources, a.node_selector, version, product_name=target.product_name,
                           share_memory_gib=share)

        async def attempt() -> str | None:
            obj, where = await self._pod_templates(mm)
            meta = obj["metadata"]
            # owned by the object whose pod template references it (a Rollout's workloadRef: that Deployment)
            owner = {"apiVersion": str(obj["apiVersion"]), "kind": str(obj["kind"]), "name": str(meta["name"]),
                     "uid": meta.get("uid") or mm.uid}
            body = claim_template(mm.namespace, owner, claim, version, self.config.component)
            name = body["metadata"]["name"]
            ops: list[dict[str, Any]] = [
                {"op": "replace", "path": "/metadata/resourceVersion", "value": meta["resourceVersion"]}]
            for pointer, pod_spec, idx in where:  # every template of the workload (a LeaderWorkerSet: both)
                container = pod_spec["containers"][idx]
                want = pod_template_changes(pod_spec, str(container.get("name")), name)
                if (want["resourceClaims"] == pod_spec.get("resourceClaims")
                        and want["resources"] == container.get("resources")
                        and want["nodeSelector"] == pod_spec.get("nodeSelector")):
                    continue
                ops += _slot_ops(pointer, pod_spec, idx, want["resources"], want["nodeSelector"])
                ops.append({"op": "add", "path": f"{pointer}/spec/resourceClaims", "value": want["resourceClaims"]})
            if len(ops) == 1:
                return None
            await self._hook("template", mm.key)
            tick.gate.check(f"ResourceClaimTemplate {mm.namespace}/{name}")
            await dra.ensure_claim_template(body)
            tick.gate.check(f"template {mm.key}")
            await self._patch_object(mm, ops, obj)
            return name

        name = await self._retrying(tick, attempt)
        if name is None:
            r.skipped.append((line, "unchanged"))
            return
        tick.template_writes += 1
        r.applied.append(f"{line}: ResourceClaimTemplate {mm.namespace}/{name} ({', '.join(target.nodes)})")

    async def _pod_templates(self, mm: ManagedModel) -> tuple[dict[str, Any], list[tuple[str, dict[str, Any], int]]]:
        """The object that holds the model's pod template(s), read fresh, and where a slot change goes in it:
        ``(JSON pointer of a pod template, its pod spec, the container's index)`` per template
        (:meth:`WorkloadKind.containers`: a LeaderWorkerSet has two). That object is the workload itself, or, for
        an Argo Rollout with ``workloadRef``, the Deployment it references: Argo rolls out that Deployment's
        template changes (its docs: "to perform an update, the change should be made to the Pod template field of
        the Deployment"). The object is stamped with its ``apiVersion`` and ``kind`` (:meth:`_patch_object`
        patches what it names)."""
        group, version, plural = _address(mm)
        obj = await _or_gone(self._objects.get_namespaced_custom_object(group, version, mm.namespace, plural,
                                                                        mm.name), mm.key)
        obj = {**obj, "apiVersion": mm.api_version, "kind": mm.kind}
        kind = by_name(mm.kind, mm.api_version)
        if kind is not None and not kind.templates(obj):
            home = template_home(obj)
            if home is None:
                # a workloadRef to another kind (ReplicaSet, PodTemplate) or none at all: nothing slotwise writes
                raise NoPodTemplate(f"{mm.kind} {mm.key} has no pod template of its own, nor a Deployment's")
            kind, name = home
            ref_group, ref_version = kind.group, kind.versions[0]
            obj = await _or_gone(self._objects.get_namespaced_custom_object(ref_group, ref_version, mm.namespace,
                                                                            kind.resource, name),
                                 f"{mm.namespace}/{name}")
            obj = {**obj, "apiVersion": kind.api_version(ref_version), "kind": kind.kind}
        where = []
        for pointer, idx in kind.containers(obj, mm.container) if kind is not None else ():
            node: Any = obj
            for part in pointer.strip("/").split("/"):
                node = node[part]
            where.append((pointer, node["spec"], idx))
        if not where:
            raise ValueError(f"container {mm.container!r} not in the pod template of {mm.kind} {mm.key}")
        return obj, where

    async def _patch_object(self, mm: ManagedModel, ops: list[dict[str, Any]],
                            obj: Mapping[str, Any] | None = None) -> None:
        """One JSON patch on the model's workload, whatever its kind; or on ``obj`` (what :meth:`_pod_templates`
        read: the Deployment a Rollout's ``workloadRef`` names)."""
        group, version, plural = _address(mm)
        name = mm.name
        if obj is not None and (obj.get("kind"), obj.get("apiVersion")) != (mm.kind, mm.api_version):
            kind = by_name(str(obj.get("kind")), str(obj.get("apiVersion")))
            assert kind is not None
            group, version = split_api_version(str(obj["apiVersion"]))
            plural, name = kind.resource, str(obj["metadata"]["name"])
        await self._objects.patch_namespaced_custom_object(group, version, mm.namespace, plural, name, ops,
                                                           _content_type="application/json-patch+json",
                                                           field_manager=FIELD_MANAGER)

    # -- ConfigMaps -------------------------------------------------------------------------------------------

    async def _upsert_configmap(self, tick: _Tick, ref: str, what: str,
                                render: Callable[[str | None], tuple[str, bool]], key: str) -> str:
        """Create or update one key of ConfigMap ``ref`` ("ns/name") to ``render(current value)`` -> (text,
        changed); returns "created", "updated" or "unchanged"."""
        ns, name = split_key(ref, "default")

        async def attempt() -> str:
            try:
                cm = self.api_client.sanitize_for_serialization(
                    await self._core.read_namespaced_config_map(name, ns))
            except ApiException as e:
                if e.status != 404:
                    raise
                cm = None
            current = None if cm is None else (cm.get("data") or {}).get(key)
            text, changed = render(current)
            if cm is not None and (not changed or current == text):
                return "unchanged"
            await self._hook(what, ref)
            tick.gate.check(f"{what} ConfigMap {ref}")
            if cm is None:
                body = {"apiVersion": "v1", "kind": "ConfigMap",
                        "metadata": {"name": name, "namespace": ns,
                                     "labels": {"app.kubernetes.io/managed-by": self.config.component}},
                        "data": {key: text}}
                await self._core.create_namespaced_config_map(ns, body, field_manager=FIELD_MANAGER)
                return "created"
            patch = {"metadata": {"resourceVersion": cm["metadata"]["resourceVersion"]}, "data": {key: text}}
            await self._core.patch_namespaced_config_map(name, ns, patch, _content_type=MERGE_PATCH,
                                                        field_manager=FIELD_MANAGER)
            return "updated"

        return await self._retrying(tick, attempt)

    async def _time_slicing(self, tick: _Tick, a: SetTimeSlicing) -> None:
        r, line = tick.report, describe(a)
        text = to_yaml(time_slicing_config(a.replicas))  # raises on an invalid config: nothing is written then
        if not self.config.acting:
            r.skipped.append((line, self.config.skip_why))
            return
        outcome = await self._upsert_configmap(tick, self.config.time_slicing_configmap, "time-slicing",
                                               lambda current: (text, current != text), self.config.time_slicing_key)
        if outcome == "unchanged":
            r.skipped.append((line, "unchanged"))
        else:
            r.applied.append(f"{line}: {outcome} {self.config.time_slicing_configmap}")

    # -- MIG --------------------------------------------------------------------------------------------------

    async def _mig(self, tick: _Tick, actions: list[SetMigLayout]) -> None:
        r = tick.report
        if not self.config.acting:
            r.skipped.extend((describe(a), self.config.skip_why) for a in actions)
            return
        # recovery and relayouts in flight go on even with the gate off: a node we cordoned is never abandoned
        self.gate.recover(tick.view, tick.now)
        if not self.config.mig_relayout:
            r.skipped.extend((describe(a), "gate-disabled") for a in actions)
            actions = []
        try:
            actions = await self._mig_on_dra(tick, actions)
        except LeadershipLost:
            raise
        except Exception as e:  # no fresh read of the DRA nodes: no new re-layout this tick, the rest of it goes on
            log.warning("MIG re-layouts: the DRA nodes could not be read (%s); none started this tick", api_error(e))
            r.errors.append(f"MIG re-layouts: the DRA nodes could not be read: {api_error(e)}")
            r.skipped.extend((describe(a), "dra-unknown") for a in actions)
            actions = []
        for a in actions:
            self.gate.submit(a, tick.now, r)
        if self.gate.jobs:  # the jobs in flight advance whatever happened above
            await self.gate.tick(tick.view, tick.now, _KubeGateIO(self, tick), r)

    async def _mig_on_dra(self, tick: _Tick, actions: list[SetMigLayout]) -> list[SetMigLayout]:
        """The re-layouts on device-plugin nodes; those on DRA nodes are skipped here: with the driver's DynamicMIG
        nothing is to be written (the claims create the instances), without it refused with a Warning Event on the
        node (:func:`~autoscaler.live.kube.dra_claims.mig_relayout_refusal`)."""
        if not actions:
            return actions
        dra = self.dra
        if await dra.version() is None:
            return actions
        inv = await dra.inventory()
        rest = []
        for a in actions:
            dn = inv.nodes.get(a.node)
            if dn is None:
                rest.append(a)
                continue
            why, message = mig_relayout_refusal(a.node, dn.dynamic_mig)
            tick.report.skipped.append((describe(a), why))
            if not dn.dynamic_mig:
                ref = {"kind": "Node", "apiVersion": "v1", "name": a.node}
                await self._event(tick, ref, "Warning", "MigRelayoutRefused", message)
        return rest

    # -- status and Events ------------------------------------------------------------------------------------

    async def _status(self, tick: _Tick, a: UpdateStatus, shortfall: Mapping[str, int] | None = None) -> None:
        r, line = tick.report, describe(a)
        mm = self._model(tick, a.model)
        if self.config.dry_run:
            r.skipped.append((line, "dry-run"))
            return
        payload = status_payload(a, dry_run=self.config.report_only, now=tick.now, shortfall=shortfall,
                                 autoscaled_by=mm.autoscaled_by, coexistence=self.config.coexistence)
        cfg = self.config

        def change(current: str | None) -> str | None:
            return status_change(current, payload, now=tick.now, refresh_s=cfg.status_refresh_s,
                                 ratio=cfg.status_change_ratio)

        # the cached workload first: in a steady state nothing is worth writing and no request is made
        if change(mm.annotations.get(STATUS_ANNOTATION)) is None:
            r.skipped.append((line, "unchanged"))
            return
        group, version, plural = _address(mm)
        obj = await _or_gone(self._objects.get_namespaced_custom_object(group, version, mm.namespace, plural,
                                                                        mm.name), mm.key)
        meta = obj.get("metadata") or {}
        why = change((meta.get("annotations") or {}).get(STATUS_ANNOTATION))
        if why is None:
            # already said (e.g. after a controller restart): neither the annotation nor a new Event
            r.skipped.append((line, "unchanged"))
            return

        async def write() -> None:
            tick.gate.check(f"status {mm.key}")
            await self._objects.patch_namespaced_custom_object(
                group, version, mm.namespace, plural, mm.name,
                {"metadata": {"annotations": {STATUS_ANNOTATION: json.dumps(payload)}}},
                _content_type=MERGE_PATCH, field_manager=FIELD_MANAGER)

        await self._retrying(tick, write)  # a merge patch of one key: a retry is a 429's, never a conflict's
        r.applied.append(line)
        if why == "refresh":
            return  # only the numbers moved: nothing happened that an Event should tell
        type_, reason, message = status_event(a, mm.autoscaled_by)
        await self._event(tick, self._deployment_ref(mm, meta.get("uid")), type_, reason, message,
                          aggregate=True)

    async def _shortfall(self, tick: _Tick, a: Shortfall, now_short: dict[str, set[tuple]]) -> None:
        """The shortfall's Event; one that lasts (the same Event on the model's previous decision) only every
        ``status_refresh_s``: a model short for an hour is one write per refresh, not one per tick (skipped
        ``event-held``, its occurrence counted on the next bump). ``now_short`` collects this tick's Event keys."""
        mm = self._model(tick, a.model)
        type_, reason, message = shortfall_event(a)
        ref = self._deployment_ref(mm, mm.uid)
        key = self._event_key(ref, type_, self._event_reason(reason), message[:EVENT_MESSAGE_MAX], aggregate=True)
        now_short.setdefault(a.model, set()).add(key)
        if key in self._shortfalls.get(a.model, ()) and self._hold(key, tick.now, self.config.status_refresh_s):
            tick.report.skipped.append((describe(a), "event-held"))
            return
        if await self._event(tick, ref, type_, reason, message, aggregate=True):
            tick.report.applied.append(describe(a))

    def _hold(self, key: tuple, now: float, every_s: float) -> bool:
        """Whether a repeat of the Event ``key`` waits (counted, not written): written less than ``every_s`` ago
        and still known (an Event forgotten or never written is written)."""
        seen = self._seen.get(key)
        if seen is None or self.config.dry_run or now - seen.written >= every_s:
            return False
        seen.held += 1
        seen.last = now
        return True

    @staticmethod
    def _deployment_ref(mm: ManagedModel, uid: str | None) -> dict[str, str]:
        """The Event's involvedObject: the model's workload, whatever its kind."""
        ref = {"kind": mm.kind, "apiVersion": mm.api_version, "name": mm.name, "namespace": mm.namespace}
        if uid:
            ref["uid"] = uid
        return ref

    async def _event(self, tick: _Tick, ref: Mapping[str, str], type_: str, reason: str, message: str, *,
                     aggregate: bool = False) -> bool:
        """Record an Event (rate-limited per tick, de-duplicated; with ``aggregate`` on the message's number-free
        text); False when skipped or failed."""
        if self.config.dry_run:
            return False  # a dry run writes nothing; the plan is in the log and the report
        reason = self._event_reason(reason)
        line = f"event {type_} {reason} {ref['kind']} {ref.get('namespace', '')}/{ref['name']}".replace(" /", " ")
        if tick.events >= self.config.max_events_per_tick:
            tick.report.skipped.append((line, "rate-limit"))
            return False
        tick.events += 1
        try:
            # through the retries too: a throttled (429) Event waits a short Retry-After like every write
            outcome = await self._retrying(
                tick, lambda: self._record(tick, ref, type_, reason, message[:EVENT_MESSAGE_MAX], aggregate))
        except LeadershipLost:
            raise
        except Exception as e:  # an Event is a report, never a reason to fail the action it reports
            log.warning("%s: %s", line, api_error(e))
            tick.report.errors.append(f"{line}: {api_error(e)}")
            return False
        tick.report.events += 1
        log.debug("%s (%s): %s", line, outcome, message)
        return True

    def _event_reason(self, reason: str) -> str:
        """The reason an Event is written with: prefixed ``DryRun`` in report mode."""
        return "DryRun" + reason if self.config.report_only else reason

    @staticmethod
    def _event_key(ref: Mapping[str, str], type_: str, reason: str, message: str, *, aggregate: bool) -> tuple:
        """What Events are de-duplicated by: the object, type, reason and message (with ``aggregate``: its
        number-free text)."""
        text = stable_text(message) if aggregate else message
        return ref["kind"], ref.get("namespace", ""), ref["name"], ref.get("uid", ""), type_, reason, text

    async def _record(self, tick: _Tick, ref: Mapping[str, str], type_: str, reason: str, message: str,
                      aggregate: bool) -> str:
        now = tick.now
        key = self._event_key(ref, type_, reason, message, aggregate=aggregate)
        window = self.config.event_dedup_window_s
        self._seen = {k: s for k, s in self._seen.items() if now - s.last <= window}
        if len(self._seen) >= EVENT_CACHE_MAX:  # bounded like client-go's LRU: forget the least recently seen
            for k, _ in sorted(self._seen.items(), key=lambda kv: kv[1].last)[: len(self._seen) // 2]:
                del self._seen[k]
        seen = self._seen.get(key)
        if seen is not None:
            count = seen.count + seen.held + 1  # the repeats held since the last write count too
            bump: dict[str, Any] = {"count": count, "lastTimestamp": rfc3339(now)}
            if aggregate:
                bump["message"] = message  # the latest numbers, on the one Event
            tick.gate.check(f"event {reason} {ref['name']}")
            try:
                await self._core.patch_namespaced_event(
                    seen.name, seen.namespace, bump, _content_type=MERGE_PATCH, field_manager=FIELD_MANAGER)
                seen.count, seen.held = count, 0
                seen.last = seen.written = now
                return "bumped"
            except ApiException as e:
                if e.status != 404:  # 404: the Event expired (TTL) meanwhile: write a new one
                    raise
        namespace = ref.get("namespace") or "default"  # events about cluster-scoped objects live in "default"
        self._event_seq += 1
        # client-go names Events "<object>.<unix nanos in hex>"; the sequence keeps names unique under a fake clock
        name = f"{ref['name'][:200]}.{int(now * 1e9) + self._event_seq:x}"
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": name, "namespace": namespace},
            "involvedObject": dict(ref),
            "reason": reason,
            "message": message,
            "type": type_,
            "count": 1,
            "firstTimestamp": rfc3339(now),
            "lastTimestamp": rfc3339(now),
            "source": {"component": self.config.component},
            "reportingComponent": self.config.component,
        }
        tick.gate.check(f"event {reason} {ref['name']}")
        await self._core.create_namespaced_event(namespace, body, field_manager=FIELD_MANAGER)
        self._seen[key] = _Seen(name, namespace, 1, now, written=now)
        return "created"


class _KubeGateIO:
    """The MIG gate's writes, against the API server (one per tick: carries the tick's report, limits and write
    gate). Every node write re-reads the node first and carries its ``resourceVersion``: the check and the write
    see the same node, or the write is refused (409) and re-checked."""

    def __init__(self, actuator: KubeActuator, tick: _Tick) -> None:
        self.a = actuator
        self.tick = tick
        self._uids: dict[str, str] = {}

    async def read_node(self, name: str) -> NodeRead | None:
        try:
            node = await self.a._core.read_node(name)
        except ApiException as e:
            if e.status == 404:
                return None
            raise
        self._uids[name] = node.metadata.uid or ""
        return NodeRead(name, dict(node.metadata.labels or {}), bool(node.spec.unschedulable),
                        node.metadata.resource_version or "")

    async def cordon(self, name: str, config_name: str) -> bool:
        async def attempt() -> bool:
            node = await self.read_node(name)
            if node is None:
                raise Gone(name)
            if node.unschedulable:
                # an admin's cordon stays theirs (we never lift it) -- unless it is our own label from a
                # previous process
                return node.labels.get(OWNER_LABEL) is not None
            await self.a._hook("cordon", name)
            self.tick.gate.check(f"cordon node {name}")
            await self.a._core.patch_node(
                name, {"metadata": {"resourceVersion": node.resource_version, "labels": {OWNER_LABEL: config_name}},
                       "spec": {"unschedulable": True}},
                _content_type=MERGE_PATCH, field_manager=FIELD_MANAGER)
            return True

        return await self.a._retrying(self.tick, attempt)

    async def uncordon(self, name: str, we_cordoned: bool, owner: str = "") -> None:
        if not we_cordoned:
            return

        async def attempt() -> None:
            node = await self.read_node(name)
            if node is None:
                return
            if owner and node.labels.get(OWNER_LABEL) != owner:
                log.warning("mig relayout %s: not uncordoned, %s is %r now (not ours)", name, OWNER_LABEL,
                            node.labels.get(OWNER_LABEL))
                return
            self.tick.gate.check(f"uncordon node {name}")
            try:
                await self.a._core.patch_node(
                    name, {"metadata": {"resourceVersion": node.resource_version, "labels": {OWNER_LABEL: None}},
                           "spec": {"unschedulable": False}},
                    _content_type=MERGE_PATCH, field_manager=FIELD_MANAGER)
            except ApiException as e:
                if e.status != 404:
                    raise

        await self.a._retrying(self.tick, attempt)

    async def _config_entry(self, config_name: str) -> Any:
        ns, name = split_key(self.a.config.mig_parted_configmap, "default")
        try:
            cm = await self.a._core.read_namespaced_config_map(name, ns)
        except ApiException as e:
            if e.status == 404:
                return None
            raise
        doc = yaml.safe_load((cm.data or {}).get(MIG_PARTED_KEY) or "") or {}
        return (doc.get("mig-configs") or {}).get(config_name) if isinstance(doc, dict) else None

    async def config_applied(self, node: NodeRead, config_name: str, config: dict) -> bool:
        if node.labels.get(MIG_CONFIG) != config_name or node.labels.get(MIG_CONFIG_STATE) != STATE_SUCCESS:
            return False
        wanted = (config.get("mig-configs") or {}).get(config_name)
        return wanted is not None and await self._config_entry(config_name) == wanted

    async def write_config(self, config: dict) -> bool:  # gated in _upsert_configmap
        outcome = await self.a._upsert_configmap(self.tick, self.a.config.mig_parted_configmap, "mig-config",
                                                 lambda current: merge_mig_configs(current, config), MIG_PARTED_KEY)
        if outcome != "unchanged":
            self.tick.report.applied.append(f"mig-parted config: {outcome} {self.a.config.mig_parted_configmap}")
        return outcome != "unchanged"

    async def relabel(self, name: str, config_name: str, owner: str | None = None) -> bool:
        async def attempt() -> bool:
            node = await self.read_node(name)
            if node is None:
                raise Gone(name)
            if not node.unschedulable or (owner is not None and node.labels.get(OWNER_LABEL) != owner):
                log.warning("mig relayout %s: not relabeled, the node changed (cordoned %s, %s=%r, expected %r)",
                            name, node.unschedulable, OWNER_LABEL, node.labels.get(OWNER_LABEL), owner)
                return False
            await self.a._hook("relabel", name)
            self.tick.gate.check(f"relabel node {name}")
            # both labels in ONE patch: a later "success" can only be the MIG manager's answer to this config;
            # our owner label names the config too (a retargeted relayout's cordon named the first one), so a
            # process adopting the node after a restart or a new term waits for this config instead of
            # uncordoning a node the MIG manager is re-partitioning
            labels = {MIG_CONFIG: config_name, MIG_CONFIG_STATE: STATE_PENDING}
            if owner is not None:
                labels[OWNER_LABEL] = config_name
            await self.a._core.patch_node(
                name, {"metadata": {"resourceVersion": node.resource_version, "labels": labels}},
                _content_type=MERGE_PATCH, field_manager=FIELD_MANAGER)
            return True

        return await self.a._retrying(self.tick, attempt)

    async def event(self, node: str, type_: str, reason: str, message: str) -> None:
        ref = {"kind": "Node", "apiVersion": "v1", "name": node}
        if self._uids.get(node):
            ref["uid"] = self._uids[node]
        await self.a._event(self.tick, ref, type_, reason, message)
