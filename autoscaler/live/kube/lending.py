"""Lending GPUs to preemptible training in Kubernetes, and taking them back: the plan's ``LendGpus`` /
``ReclaimGpus`` applied to a real cluster, in the two modes of :class:`~sharing.lending.LendingPolicy`.

One module: lends and reclaims in both modes share one :class:`LendingActuator` -- the reclaims in flight across
ticks (adopted again after a restart), the tick's rate limits and retries; its pure rules (what may be evicted and
in what order, the node patches, the lendingLimit) are in :mod:`~autoscaler.live.kube.lending_rules`.

**Pods mode** (``mode: pods``) lends whole nodes (a label or a taint cannot split a node):

- ``LendGpus`` naming EVERY GPU of a node that holds no inference pod (no GPU pod without the
  ``slotwise.io/preemptible=true`` label, checked on the live pod list, not only the cache) -> one merge patch of the
  node (with the read ``resourceVersion``): label ``slotwise.io/lent=true`` (training pods select it), taint
  ``slotwise.io/lent=true:NoSchedule`` (training pods tolerate it, inference pods do not), annotation
  ``slotwise.io/lent-since`` (RFC 3339). A node that already says so is left alone (``unchanged``).
- ``ReclaimGpus`` on a lent node -> a reclaim that spans ticks (per-node state, like the MIG gate), phases::

      UNLABEL ──▶ EVICT ──▶ RELEASE ──▶ done (duration recorded)
      (label off, so no new     (Eviction API for every      (taint and annotations off once
       training lands; the       pod labelled preemptible     no preemptible pod is left on
       decision's time and       on the node, the named       the node: inference may land)
       reason as annotations)    workloads' pods first)

  Evictions go through the Eviction subresource (``policy/v1`` where the server serves it, ``policy/v1beta1`` on 1.20:
  by discovery, :mod:`~autoscaler.live.kube.discovery`) with ``deleteOptions.gracePeriodSeconds`` = the pod's own
  grace period capped by ``max_reclaim_s``, and ``preconditions`` (uid, resourceVersion) so that the pod evicted is
  exactly the one read -- still labelled preemptible. A pod WITHOUT the preemptible label is never evicted, whatever
  the plan says: a plan naming one gets it reported in ``report.refused`` instead. Right before evicting, the node is
  read again: one lent again meanwhile (the other replica, in a term this one did not lead) or released is not evicted
  from -- the reclaim ends there. A 429 is told apart: a PodDisruptionBudget's refusal (its Status cause or message)
  is asked again next tick (or after its ``Retry-After``); a plain 429 (the server throttling) stops every request
  until its ``Retry-After``. The reclaim's duration is measured from the decision (the view's ``now`` when the action
  first came) to the taint's removal.
- After a restart, and at every new term of leadership (:meth:`LendingActuator.new_term` drops what the earlier
  term remembered), a node with the taint but no label is a reclaim in flight: it is adopted (its decision time
  read back from ``slotwise.io/reclaim-since``) and finished.
- A reclaim still in flight past its deadline is said once: a ``ReclaimOverdue`` Warning Event on the pod holding
  it up (else the node), ``report.overdue``; ``report.in_flight_age_s`` (the oldest in flight) feeds the gauge
  the alert ``SlotwiseReclaimStuck`` reads. Opt-in (``LendingPolicy.force_after_s``): pods a budget still
  protects that long after the deadline are deleted (preconditions, capped grace; ``ReclaimForced`` Event).

**Kueue mode** (``mode: kueue``) has no per-node state; the inference ClusterQueue's
``spec.resourceGroups[*].flavors[kueue_flavor].resources[kueue_resource].lendingLimit`` caps what its cohort may
borrow. Lent GPUs are those training pods hold (``translate``), so the limit is set, on every tick with a lend or
a new reclaim, to ``lent now - being reclaimed + newly lent`` (capped by the resource's ``nominalQuota``). Lowering
the limit evicts nothing (kubernetes-sigs/kueue#5176), so a reclaim also sets ``spec.active: false`` on the
named workloads' Kueue Workloads, in the plan's preemption order (Kueue evicts a deactivated Workload at once and
releases its quota); a named workload without a Workload (a bare preemptible pod) is evicted as in pods mode.
The reclaim is done when no pod of the named workloads is left on the node. Kueue stops a deactivated Job's pods
with their own grace period: keep ``terminationGracePeriodSeconds`` of workloads in the training ClusterQueue within
``max_reclaim_s`` (the reclaim contract), or the reclaims measured here will be late. A Workload deactivated here
carries slotwise's mark (label ``slotwise.io/deactivated=reclaim``, annotations of when and for which node); on a
later tick that lends capacity again, every marked Workload whose reclaim is over is reactivated (the mark off:
Kueue queues it and admits it as the lendingLimit allows); Workloads deactivated by anyone else are never touched.
The operator's own lendingLimit (a value, or none at all) is recorded on the ClusterQueue, in the same patch as
slotwise's first change of it (annotation ``slotwise.io/original-lending-limit``): lending switched off, once every
reclaim is over and nothing is lent, gives exactly that back -- in this process, after a restart or in the other
replica's term alike -- and takes the record off; a limit slotwise never changed (no record) is left as it is.
The Kueue API version comes from discovery too (v1beta2 preferred, v1beta1 otherwise). What the server serves
(:class:`~autoscaler.live.kube.discovery.ServedApis`) is the controller's one discovery at start when it is handed
over (``apis=`` or :attr:`LendingActuator.apis`), else asked on first use; a new term asks again.

Every request that changes the cluster is preceded by the write gate's check (``apply(..., gate=)``):
``LeadershipLost`` ends the tick and reaches the caller.

Every write is idempotent (read first, no write when it already says so), read-modify-writes carry the read
``resourceVersion`` and are retried on 409 with full-jitter backoff, lends are rate-limited per tick
(``max_lends_per_tick``, the rest re-planned next tick) and so are evictions (``max_evictions_per_tick``).
Errors stay with their action. **Dry run** changes nothing: every action is reported skipped ``dry-run``.
The report (:class:`LendingReport`) is what the exporter's ``record_lending`` counts.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from kubernetes_asyncio.client import CoreV1Api, CustomObjectsApi
from kubernetes_asyncio.client.rest import ApiException

from autoscaler.api.plan import LendGpus, ReclaimGpus
from autoscaler.live.kube.discovery import KUEUE, POLICY, ServedApis, collection_path, discover
from autoscaler.live.kube.lending_rules import (
    DEACTIVATED_LABEL,
    DEACTIVATED_SINCE_ANNOTATION,
    DEACTIVATED_VALUE,
    DEFAULT_RETRY_AFTER_S,
    RECLAIM_FORCED_REASON,
    RECLAIM_OVERDUE_REASON,
    admits,
    belongs_to,
    deactivate_patch,
    deactivated_by_slotwise,
    deactivation_reason,
    eviction_grace,
    eviction_order,
    eviction_refusal,
    inference_pods,
    is_live,
    is_preemptible,
    lending_limit,
    lent_node_patch,
    parse_rfc3339,
    pod_key,
    reactivate_patch,
    reclaim_event,
    released_node_patch,
    remember_original,
    restore_lending_limit,
    retry_after_s,
    rfc3339_precise,
    set_lending_limit,
)
from autoscaler.live.kube.objects import (
    FIELD_MANAGER,
    LENT_LABEL,
    PREEMPTIBLE_LABEL,
    RECLAIM_REASON_ANNOTATION,
    RECLAIM_SINCE_ANNOTATION,
    ClusterView,
    TrainingRef,
    has_lent_taint,
)
from autoscaler.live.kube.term import ALWAYS_OPEN, LeadershipLost, WriteGate
from autoscaler.live.kube.writes import Gone, api_error, describe
from sharing.lending import LendingPolicy

log = logging.getLogger(__name__)

MERGE_PATCH = "application/merge-patch+json"
KUEUE_GROUP = "kueue.x-k8s.io"
KUEUE_VERSION = "v1beta1"  # when discovery cannot tell (the group is not served, discovery failed)


async def discover_kueue_version(api_client: Any) -> str | None:
    """The ``kueue.x-k8s.io`` version to use, from the server's discovery (:mod:`~autoscaler.live.kube.discovery`,
    v1beta2 preferred over v1beta1); None when the server serves no Kueue version slotwise knows (Kueue not
    installed) or discovery failed."""
    return (await discover(api_client)).pick(KUEUE)


def workloads_path(apis: ServedApis | None) -> str:
    """The collection path of Kueue Workloads for an informer, in the newest version both slotwise and the server
    speak (``/apis/kueue.x-k8s.io/v1beta2/workloads`` on a current Kueue); v1beta1's when Kueue is not (yet)
    installed, discovery failed or has not run (the informer is optional: a 404 there means no Workloads). Pure."""
    version = apis.pick(KUEUE) if apis is not None else None
    return collection_path(KUEUE_GROUP, version or KUEUE_VERSION, "workloads")


async def kueue_workloads_path(api_client: Any) -> str:
    """:func:`workloads_path` after asking the server (one discovery; the controller, which has discovered once
    already, calls :func:`workloads_path` with what it got). Never raises: discovery that fails assumes v1beta1."""
    return workloads_path(await discover(api_client))


class Phase(StrEnum):
    UNLABEL = "unlabel"  # pods mode: take the label off (no new training lands)
    DEACTIVATE = "deactivate"  # kueue mode: spec.active=false on the named workloads' Workloads
    EVICT = "evict"  # evict the preemptible pods until none is left
    RELEASE = "release"  # pods mode: taint and annotations off


@dataclass
class Reclaim:
    """One node's reclaim in flight."""

    node: str
    devices: tuple[int, ...]
    workloads: tuple[str, ...]  # the plan's preemption order
    reason: str
    decided_at: float  # the decision (the view's now when the action first came; annotation after a restart)
    deadline_s: float
    phase: Phase
    recovered: bool = False  # adopted after a restart
    timed: bool = True  # the decision time is known: record the duration
    refused: set[str] = field(default_factory=set)  # already reported, once per reclaim
    bare: set[str] = field(default_factory=set)  # kueue mode: named workloads without a Kueue Workload (evicted)
    blocked: set[str] = field(default_factory=set)  # pods whose eviction a PodDisruptionBudget refused (429)
    deactivated: set[str] = field(default_factory=set)  # kueue mode: Workloads ("ns/name") this reclaim deactivated
    overdue: bool = False  # past its deadline: said once (Warning Event, log)


@dataclass(frozen=True)
class ReclaimDone:
    """A finished reclaim: from the decision until the GPUs were free."""

    node: str
    devices: tuple[int, ...]
    reason: str
    seconds: float
    deadline_s: float

    @property
    def late(self) -> bool:
        return self.seconds > self.deadline_s


@dataclass
class LendingReport:
    """What one :meth:`LendingActuator.apply` did; lines in the style of ``ActuationReport``."""

    applied: list[str] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (line, why)
    errors: list[str] = field(default_factory=list)
    conflicts_retried: int = 0
    pending: list[str] = field(default_factory=list)  # reclaims in flight, one line per node
    refused: list[str] = field(default_factory=list)  # pods / workloads the plan named that may not be preempted
    evicted: list[str] = field(default_factory=list)  # pod keys evicted this tick
    deactivated: list[str] = field(default_factory=list)  # Kueue Workloads ("ns/name") deactivated this tick
    lends: int = 0  # LendGpus applied (a node lent; a lendingLimit raised for it)
    reclaims_started: list[tuple[str, str]] = field(default_factory=list)  # (node, reason) of new reclaims
    reclaims_done: list[ReclaimDone] = field(default_factory=list)
    reactivated: list[str] = field(default_factory=list)  # Kueue Workloads ("ns/name") given back this tick
    blocked: list[tuple[str, str]] = field(default_factory=list)  # (pod key, "disruption-budget" | "too-many-...")
    overdue: list[str] = field(default_factory=list)  # nodes whose reclaim passed its deadline this tick
    forced: list[str] = field(default_factory=list)  # pod keys deleted past deadline + force_after_s
    in_flight: int = 0  # reclaims in flight after this tick
    in_flight_age_s: float = 0.0  # the oldest of them: seconds since its decision (0 when none)

    def why(self, prefix: str) -> list[str]:
        return [why for line, why in self.skipped if line.startswith(prefix)]


# -- the actuator ---------------------------------------------------------------------------------------------------


@dataclass
class _Tick:
    view: ClusterView
    now: float
    gate: WriteGate = ALWAYS_OPEN
    report: LendingReport = field(default_factory=LendingReport)
    lends: int = 0
    evictions: int = 0


class LendingActuator:
    """Applies the plan's lending actions; one object for the controller's life (reclaims in flight persist)."""

    def __init__(self, api_client: Any, policy: LendingPolicy, *, dry_run: bool = False,
                 clock: Callable[[], float] = time.time, max_lends_per_tick: int = 10,
                 max_evictions_per_tick: int = 50, conflict_retries: int = 5, conflict_backoff_s: float = 0.05,
                 rng: random.Random | None = None, apis: ServedApis | None = None) -> None:
        self.api_client = api_client
        # What the server serves (Eviction's policy version, Kueue's): the controller's one discovery at start when
        # it hands it over, else asked here on first use; a new term forgets it (an add-on may have been upgraded).
        self.apis = apis
        self.policy = policy
        self.dry_run = dry_run
        self.clock = clock
        self.max_lends_per_tick = max_lends_per_tick
        self.max_evictions_per_tick = max_evictions_per_tick
        self.conflict_retries = conflict_retries
        self.conflict_backoff_s = conflict_backoff_s
        self._rng = rng or random.Random()
        self._core = CoreV1Api(api_client)
        self._custom = CustomObjectsApi(api_client)
        self.reclaims: dict[str, Reclaim] = {}  # node -> reclaim in flight
        self._not_before: dict[str, float] = {}  # pod key -> when its eviction may be asked again (Retry-After)
        self._throttled_until = -math.inf  # a plain 429 (the server throttling): no request before this time
        self._limit_due = False  # kueue mode: reclaims started while throttled, their lendingLimit not written yet
        self._adopt_kueue = True  # kueue mode: adopt reclaims in flight from the Workloads' marks (start, new term)
        self._rolled_back = False  # kueue mode, lending off: the lendingLimit and the Workloads were rolled back
        self._event_seq = 0
        # Test seam, as KubeActuator's: awaited after a read and before the write depending on it, with (what, key),
        # what in {"lend", "unlabel", "release", "lending-limit"}.
        self.before_write: Callable[[str, str], Awaitable[None]] | None = None

    # -- the tick -------------------------------------------------------------------------------------------------

    def new_term(self) -> None:
        """Leadership (re)gained: forget everything remembered from an earlier term -- reclaims in flight, the
        pods whose eviction was to wait (Retry-After), the server's throttling, what discovery said. The next
        :meth:`apply` starts from the cluster as it is: a node with the lent taint but not the label is a reclaim
        in flight and is adopted (pods mode); a node lent again meanwhile (by the other replica, on purpose) is
        lent, and nothing of the old term's reclaim acts on it. Kueue mode: the Workloads slotwise deactivated
        carry their mark on the cluster; the decision core asks again for what it still needs."""
        if self.reclaims:
            log.info("new leadership term: %d reclaim(s) of the earlier term forgotten (%s); the cluster says what "
                     "is in flight", len(self.reclaims), ", ".join(sorted(self.reclaims)))
        self.reclaims.clear()
        self._not_before.clear()
        self._throttled_until = -math.inf
        self._limit_due = False
        self._adopt_kueue = True
        self._rolled_back = False
        self.apis = None

    @property
    def cleanup_due(self) -> bool:
        """Kueue mode with lending switched off: what lending left is not rolled back yet (the lendingLimit back to
        the operator's own value, the Workloads slotwise deactivated given back to Kueue). Call :meth:`apply` while
        it is true, even with nothing lent and no reclaim in flight: it rolls back once every reclaim is over and
        nothing is lent."""
        return self.policy.mode == "kueue" and not self.policy.enabled and not self._rolled_back

    async def apply(self, actions: Sequence[Any], view: ClusterView, gate: WriteGate = ALWAYS_OPEN
                    ) -> LendingReport:
        """Apply this tick's lending actions (``plan.actions`` may be passed whole: other actions are ignored) and
        advance every reclaim in flight. Call it every tick (with no actions too) while lending is on, a reclaim is
        in flight (``self.reclaims``) or the view shows GPUs still lent (lending switched off: the plan reclaims
        them, reason ``disabled``): a reclaim finishes over several ticks. ``view`` is the tick's view (its
        ``snapshot.now`` is taken as the decision time of new reclaims). ``gate`` is checked right before every
        request that changes the cluster; :class:`~autoscaler.live.kube.term.LeadershipLost` ends the tick there
        (raised to the caller)."""
        tick = _Tick(view=view, now=self.clock(), gate=gate)
        r = tick.report
        lends = [a for a in actions if isinstance(a, LendGpus)]
        reclaims = [a for a in actions if isinstance(a, ReclaimGpus)]
        if self.dry_run:
            r.skipped.extend((describe(a), "dry-run") for a in (*reclaims, *lends))
            return r
        kueue = self.policy.mode == "kueue"
        if tick.now < self._throttled_until:
            # the server asked us to wait (429 Retry-After): no request at all this tick. New reclaims are
            # remembered (the core does not ask twice) and their lendingLimit is written on the next tick.
            self._limit_due |= any([self._submit(tick, a) for a in reclaims])
            r.skipped.extend((describe(a), "retry-after") for a in (*reclaims, *lends))
            self._age(tick)
            return r
        if not kueue:
            await self._guarded(tick, "recover", self._recover(tick))
        elif self._adopt_kueue:
            await self._guarded(tick, "recover", self._recover_kueue(tick))
        new = [a for a in reclaims if self._submit(tick, a)]
        limit_ok = True
        if kueue and (lends or new or self._limit_due):
            limit_ok = await self._limit(tick, lends)
            self._limit_due = not limit_ok
        # reclaims first: inference is waiting for them, lends can wait a tick
        for node in sorted(self.reclaims):
            job = self.reclaims.get(node)
            if job is not None:
                await self._guarded(tick, f"reclaim {node}", self._advance(tick, job))
        if not kueue:
            for a in lends:
                await self._guarded(tick, describe(a), self._lend(tick, a))
        elif lends and limit_ok and self.policy.enabled:
            # capacity is lent again: the Workloads slotwise deactivated go back to Kueue's queue (admitted as the
            # lendingLimit just written allows)
            await self._guarded(tick, "reactivate", self._reactivate(tick, "capacity lent again"))
        elif self.cleanup_due and not self.reclaims and not tick.view.snapshot.lent:
            await self._guarded(tick, "roll back", self._roll_back(tick))
        self._age(tick)
        level = logging.WARNING if r.errors else logging.INFO
        log.log(level, "lending: %d applied, %d skipped, %d pending, %d refused, %d error(s)%s", len(r.applied),
                len(r.skipped), len(r.pending), len(r.refused), len(r.errors),
                (": " + "; ".join(r.errors)) if r.errors else "")
        return r

    def _age(self, tick: _Tick) -> None:
        r = tick.report
        r.in_flight = len(self.reclaims)
        ages = [tick.now - j.decided_at for j in self.reclaims.values()]
        r.in_flight_age_s = max(0.0, max(ages, default=0.0))

    async def _guarded(self, tick: _Tick, line: str, work: Awaitable[None]) -> None:
        try:
            await work
        except LeadershipLost:
            raise  # the tick ends here: nothing more is written in this term
        except Gone:
            tick.report.skipped.append((line, "gone"))
        except Exception as e:
            log.warning("%s: %s", line, api_error(e))
            tick.report.errors.append(f"{line}: {api_error(e)}")

    async def _retrying(self, tick: _Tick, attempt: Callable[[], Awaitable[Any]]) -> Any:
        for n in range(self.conflict_retries + 1):
            try:
                return await attempt()
            except ApiException as e:
                if e.status == 429 and eviction_refusal(e.body) == "too-many-requests":
                    self._throttle(tick, e)
                if e.status != 409 or n == self.conflict_retries:
                    raise
                tick.report.conflicts_retried += 1
                await asyncio.sleep(self._rng.uniform(0.0, self.conflict_backoff_s * 2**n))
        raise AssertionError("unreachable")

    def _throttle(self, tick: _Tick, e: ApiException) -> None:
        """A plain 429 (the server throttling, not a disruption budget): no request until its Retry-After."""
        wait = retry_after_s(e.headers, e.body)
        self._throttled_until = max(self._throttled_until,
                                    tick.now + (DEFAULT_RETRY_AFTER_S if wait is None else wait))

    async def _hook(self, what: str, key: str) -> None:
        if self.before_write is not None:
            await self.before_write(what, key)

    # -- reads ----------------------------------------------------------------------------------------------------

    async def _read_node(self, name: str) -> dict[str, Any] | None:
        try:
            return self.api_client.sanitize_for_serialization(await self._core.read_node(name))
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    async def _pods_on(self, node: str) -> list[dict[str, Any]]:
        """The live pod list of a node, from the server (the informer cache may lag an eviction or a bind)."""
        got = await self._core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node}")
        pods = self.api_client.sanitize_for_serialization(got).get("items") or []
        return [p for p in pods if is_live(p)]

    # -- pods mode: lend ------------------------------------------------------------------------------------------

    async def _lend(self, tick: _Tick, a: LendGpus) -> None:
        r, line = tick.report, describe(a)
        if a.node in self.reclaims:
            r.skipped.append((line, "reclaim-in-flight"))  # finish taking it back before lending it again
            return
        spec = tick.view.snapshot.inventory.nodes.get(a.node)
        if spec is None:
            r.skipped.append((line, "not-in-inventory"))
            return
        if sorted(set(a.devices)) != list(range(spec.gpu_count)):
            # a label and a taint hold for the whole node: lending part of one would hand training the rest too
            r.skipped.append((line, "not-whole-node"))
            return
        info = tick.view.nodes.get(a.node)
        cached = [p.key for p in (info.pods if info else ()) if p.gpus and not p.preemptible]
        if cached:
            r.skipped.append((line, "inference-on-node"))
            return
        if tick.lends >= self.max_lends_per_tick:
            r.skipped.append((line, "rate-limit"))
            return
        live = inference_pods(await self._pods_on(a.node))  # a pod bound since the cache was read
        if live:
            r.skipped.append((line, "inference-on-node"))
            return

        async def attempt() -> bool | str:
            node = await self._read_node(a.node)
            if node is None:
                raise Gone(a.node)
            meta = node.get("metadata") or {}
            if (meta.get("labels") or {}).get(LENT_LABEL) != "true" and has_lent_taint(
                    (node.get("spec") or {}).get("taints")):
                return "reclaim-in-flight"  # another process is reclaiming it
            patch = lent_node_patch(node, tick.now)
            if patch is None:
                return False
            await self._hook("lend", a.node)
            tick.gate.check(f"lend {a.node}")
            await self._core.patch_node(a.node, patch, _content_type=MERGE_PATCH, field_manager=FIELD_MANAGER)
            return True

        tick.lends += 1
        outcome = await self._retrying(tick, attempt)
        if outcome is True:
            r.applied.append(line)
            r.lends += 1
        else:
            r.skipped.append((line, outcome or "unchanged"))

    # -- reclaims -------------------------------------------------------------------------------------------------

    def _submit(self, tick: _Tick, a: ReclaimGpus) -> bool:
        """Start a reclaim, or fold the action into the one in flight on that node; True when new."""
        job = self.reclaims.get(a.node)
        if job is not None:
            job.devices = tuple(sorted(set(job.devices) | set(a.devices)))
            more = tuple(w for w in a.workloads if w not in job.workloads)
            job.workloads = (*job.workloads, *more)
            if more and job.phase is Phase.EVICT and self.policy.mode == "kueue":
                job.phase = Phase.DEACTIVATE  # deactivate the newly named ones too (idempotent for the rest)
            tick.report.skipped.append((describe(a), "in-flight"))
            return False
        phase = Phase.DEACTIVATE if self.policy.mode == "kueue" else Phase.UNLABEL
        self.reclaims[a.node] = Reclaim(a.node, tuple(sorted(set(a.devices))), tuple(a.workloads), a.reason,
                                        decided_at=tick.view.snapshot.now, deadline_s=a.deadline_s, phase=phase)
        tick.report.reclaims_started.append((a.node, a.reason))
        log.info("reclaim %s GPUs %s (%s): started", a.node, list(a.devices), a.reason)
        return True

    async def _recover(self, tick: _Tick) -> None:
        """Pods mode: adopt reclaims in flight that this process does not know (a restart): nodes with the taint
        but not the label. The live node is read first: a cache that still shows a reclaim just finished must not
        start it again."""
        for name, info in sorted(tick.view.nodes.items()):
            if name in self.reclaims or not info.reclaiming:
                continue
            node = await self._read_node(name)
            if node is None or not _reclaiming(node):
                continue
            annotations = (node.get("metadata") or {}).get("annotations") or {}
            since = parse_rfc3339(annotations.get(RECLAIM_SINCE_ANNOTATION))
            spec = tick.view.snapshot.inventory.nodes.get(name)
            self.reclaims[name] = Reclaim(
                name, tuple(range(spec.gpu_count)) if spec else (), (),
                str(annotations.get(RECLAIM_REASON_ANNOTATION) or "recovered"),
                decided_at=since if since is not None else tick.now, deadline_s=self.policy.max_reclaim_s,
                phase=Phase.EVICT, recovered=True, timed=since is not None)
            log.info("reclaim %s: adopted (in flight since %s)", name, annotations.get(RECLAIM_SINCE_ANNOTATION))

    async def _marked_workloads(self) -> list[dict[str, Any]]:
        """Kueue mode: the Workloads carrying slotwise's deactivation mark, cluster-wide (one LIST, by label)."""
        try:
            listed = await self._custom.list_cluster_custom_object(
                KUEUE_GROUP, await self._kueue(), "workloads",
                label_selector=f"{DEACTIVATED_LABEL}={DEACTIVATED_VALUE}")
        except ApiException as e:
            if e.status == 404:  # no Kueue CRDs: no Workloads
                return []
            raise
        return [w for w in listed.get("items") or () if deactivated_by_slotwise(w)]

    async def _recover_kueue(self, tick: _Tick) -> None:
        """Kueue mode, first tick of a process or of a term: the reclaims in flight are the Workloads slotwise
        deactivated (their mark) whose training pods are still on nodes. They are adopted per node, in flight
        since the mark's time: they count as coming back in the lendingLimit, finish and age as any reclaim, and
        are not reactivated before their pods are gone."""
        running = {w.name: w for w in tick.view.snapshot.training}
        found: dict[str, tuple[list[str], set[str], list[float], str]] = {}
        for w in await self._marked_workloads():
            if (w.get("spec") or {}).get("active") is not False:
                continue
            since = parse_rfc3339(((w.get("metadata") or {}).get("annotations") or {}).get(
                DEACTIVATED_SINCE_ANNOTATION))
            for name, ref in sorted(tick.view.training.items()):
                if not admits(w, ref) or name not in running:
                    continue
                for node in running[name].nodes:
                    names, keys, sinces, _ = found.setdefault(node, ([], set(), [], deactivation_reason(w) or ""))
                    if name not in names:
                        names.append(name)
                    keys.add(pod_key(w))
                    sinces.extend([since] if since is not None else [])
        for node, (names, keys, sinces, reason) in sorted(found.items()):
            if node in self.reclaims:
                self.reclaims[node].deactivated |= keys
                continue
            devices = tuple(sorted(d for n, d in tick.view.snapshot.lent if n == node))
            self.reclaims[node] = Reclaim(node, devices, tuple(names), reason or "recovered",
                                          decided_at=min(sinces) if sinces else tick.now,
                                          deadline_s=self.policy.max_reclaim_s, phase=Phase.EVICT, recovered=True,
                                          timed=bool(sinces), deactivated=keys)
            log.info("reclaim %s: adopted from the Workloads slotwise deactivated (%s)", node, ", ".join(sorted(keys)))
        self._adopt_kueue = False

    async def _advance(self, tick: _Tick, job: Reclaim) -> None:
        if job.phase is Phase.UNLABEL and not await self._unlabel(tick, job):
            return
        if job.phase is Phase.DEACTIVATE:
            await self._deactivate(tick, job)
        if job.phase is Phase.EVICT:
            await self._evict(tick, job)
        if job.phase is Phase.RELEASE:
            await self._release(tick, job)

    def _finish(self, tick: _Tick, job: Reclaim, *, record: bool = True) -> None:
        self.reclaims.pop(job.node, None)
        if not (record and job.timed):
            return
        seconds = max(0.0, tick.now - job.decided_at)
        done = ReclaimDone(job.node, job.devices, job.reason, seconds, job.deadline_s)
        tick.report.reclaims_done.append(done)
        tick.report.applied.append(f"reclaim {job.node}: free after {seconds:.1f}s ({job.reason})"
                                   + (f", LATE (deadline {job.deadline_s:.0f}s)" if done.late else ""))
        log.log(logging.WARNING if done.late else logging.INFO, "reclaim %s (%s) done in %.1fs (deadline %.0fs)",
                job.node, job.reason, seconds, job.deadline_s)

    async def _unlabel(self, tick: _Tick, job: Reclaim) -> bool:
        """Pods mode, first step: no new training may land. False when there was nothing to reclaim."""

        async def attempt() -> str:
            node = await self._read_node(job.node)
            if node is None:
                raise Gone(job.node)
            meta = node.get("metadata") or {}
            labelled = (meta.get("labels") or {}).get(LENT_LABEL) == "true"
            if not labelled and not has_lent_taint((node.get("spec") or {}).get("taints")):
                return "not-lent"
            annotations = meta.get("annotations") or {}
            if not labelled and RECLAIM_SINCE_ANNOTATION in annotations:
                return "unchanged"
            await self._hook("unlabel", job.node)
            tick.gate.check(f"reclaim {job.node}: unlabel")
            patch = {"metadata": {"resourceVersion": meta.get("resourceVersion"), "labels": {LENT_LABEL: None},
                                  "annotations": {RECLAIM_SINCE_ANNOTATION: rfc3339_precise(job.decided_at),
                                                  RECLAIM_REASON_ANNOTATION: job.reason}}}
            await self._core.patch_node(job.node, patch, _content_type=MERGE_PATCH, field_manager=FIELD_MANAGER)
            return "unlabelled"

        try:
            outcome = await self._retrying(tick, attempt)
        except Gone:
            self.reclaims.pop(job.node, None)
            raise
        if outcome == "not-lent":
            self.reclaims.pop(job.node, None)
            tick.report.skipped.append((f"reclaim {job.node}", "not-lent"))
            return False
        if outcome == "unlabelled":
            tick.report.applied.append(f"reclaim {job.node}: label {LENT_LABEL} removed ({job.reason})")
        job.phase = Phase.EVICT
        return True

    def _targets(self, tick: _Tick, job: Reclaim, pods: Sequence[Mapping[str, Any]]
                 ) -> tuple[list[Mapping[str, Any]], list[Mapping[str, Any]], list[str]]:
        """(pods the reclaim waits for, those of them to evict, pods refused). Pods mode: every preemptible pod on
        the node, all evicted. Kueue mode: the named workloads' pods (Kueue removes those of deactivated Workloads);
        only those of workloads without a Workload are evicted here."""
        if self.policy.mode == "pods":
            order, refused = eviction_order(pods, job.workloads, tick.view.training)
            return order, order, refused
        bare = [w for w in job.workloads if w in job.bare]
        evict, refused = eviction_order([p for p in pods if any(belongs_to(p, w, tick.view.training.get(w))
                                                                for w in bare)], bare, tick.view.training)
        wait = [p for p in pods if any(belongs_to(p, w, tick.view.training.get(w)) for w in job.workloads)
                and pod_key(p) not in refused]
        return sorted(wait, key=pod_key), evict, refused

    async def _evict(self, tick: _Tick, job: Reclaim) -> None:
        wait, evict, refused = self._targets(tick, job, await self._pods_on(job.node))
        self._refuse(tick, job, refused)
        todo = [p for p in evict if not (p.get("metadata") or {}).get("deletionTimestamp")]  # others: on their way
        if todo and self.policy.mode == "pods" and not await self._still_reclaiming(tick, job):
            return
        evicted_any = False
        for pod in todo:
            if tick.evictions >= self.max_evictions_per_tick or tick.now < self._throttled_until:
                break
            if tick.now < self._not_before.get(pod_key(pod), -math.inf):
                continue  # its budget asked us to wait (Retry-After)
            tick.evictions += 1
            evicted_any |= await self._evict_pod(tick, job, pod)
        if evicted_any:  # a grace of 0 deletes at once: look again before waiting a tick
            wait, _, _ = self._targets(tick, job, await self._pods_on(job.node))
        if not wait:
            if self.policy.mode == "pods":
                job.phase = Phase.RELEASE
            else:
                self._finish(tick, job)
            return
        waited = tick.now - job.decided_at
        tick.report.pending.append(
            f"reclaim {job.node}: {len(wait)} training pod(s) still on the node after {waited:.0f}s "
            f"({', '.join(pod_key(p) for p in wait[:5])}{' ...' if len(wait) > 5 else ''})")
        if waited > job.deadline_s:
            await self._overdue(tick, job, wait, waited)

    async def _still_reclaiming(self, tick: _Tick, job: Reclaim) -> bool:
        """Pods mode, right before evicting: the node as it is NOW must still be in this reclaim's state (the lent
        taint without the label). A node lent again meanwhile (the other replica, during a term this one did not
        lead; an admin) or released already is not ours to evict from: the reclaim ends there, unrecorded."""
        node = await self._read_node(job.node)
        if node is None:
            self.reclaims.pop(job.node, None)
            raise Gone(job.node)
        if _reclaiming(node):
            return True
        lent_again = ((node.get("metadata") or {}).get("labels") or {}).get(LENT_LABEL) == "true"
        why = "lent-again" if lent_again else "not-lent"
        log.warning("reclaim %s: the node is %s now; the reclaim ends without evicting", job.node,
                    "lent again" if lent_again else "no longer lent")
        self.reclaims.pop(job.node, None)
        tick.report.skipped.append((f"reclaim {job.node}", why))
        return False

    async def _overdue(self, tick: _Tick, job: Reclaim, wait: Sequence[Mapping[str, Any]], waited: float) -> None:
        """A reclaim in flight past its deadline: said once (a Warning Event on the pod holding it up -- one a
        PodDisruptionBudget protects first -- else on the node; the log; ``report.overdue``); with the opt-in
        ``force_after_s``, pods still refused by their budget that long after the deadline are deleted."""
        blocked = sorted(k for k in job.blocked if any(pod_key(p) == k for p in wait))
        force = _force_after(self.policy)
        if not job.overdue:
            job.overdue = True
            tick.report.overdue.append(job.node)
            message = (f"Reclaim of lent node {job.node} ({job.reason}) in flight for {waited:.0f}s, past its "
                       f"deadline of {job.deadline_s:.0f}s: {len(wait)} training pod(s) left")
            if blocked:
                message += f"; eviction refused by a PodDisruptionBudget: {', '.join(blocked[:5])}"
            message += (f"; they are deleted {force:.0f}s after the deadline (force_after_s)" if force is not None
                        else "; inference waits for these GPUs")
            log.warning("reclaim %s: %s", job.node, message)
            holder = next((p for p in wait if pod_key(p) in job.blocked), wait[0] if wait else None)
            await self._event(tick, _pod_ref(holder) if holder else {"kind": "Node", "name": job.node},
                              RECLAIM_OVERDUE_REASON, message, job.node)
        if force is None or waited <= job.deadline_s + force:
            return
        for pod in wait:
            meta = pod.get("metadata") or {}
            if pod_key(pod) in job.blocked and not meta.get("deletionTimestamp"):
                await self._force(tick, job, pod, waited)

    async def _force(self, tick: _Tick, job: Reclaim, pod: Mapping[str, Any], waited: float) -> None:
        """Delete a pod its disruption budget keeps refusing to evict (opt-in, past deadline + force_after_s):
        exactly the pod read (uid + resourceVersion preconditions), still labelled preemptible, with its grace
        capped by the reclaim deadline as an eviction's."""
        meta = pod.get("metadata") or {}
        ns, name, key = str(meta.get("namespace")), str(meta.get("name")), pod_key(pod)
        if not is_preemptible(meta.get("labels")):
            return
        grace = eviction_grace((pod.get("spec") or {}).get("terminationGracePeriodSeconds"), self.policy.max_reclaim_s)
        body = {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": grace,
                "preconditions": {"uid": meta.get("uid"), "resourceVersion": meta.get("resourceVersion")}}
        tick.gate.check(f"reclaim {job.node}: force-delete {key}")
        try:
            await self._core.delete_namespaced_pod(name, ns, body=body)
        except ApiException as e:
            if e.status in (404, 409):  # gone, or changed since read: the next tick looks again
                return
            raise
        line = (f"force-delete {key} from {job.node} (grace {grace}s): its PodDisruptionBudget refused the "
                f"eviction for {waited:.0f}s, past the deadline {job.deadline_s:.0f}s + force_after_s")
        tick.report.applied.append(line)
        tick.report.forced.append(key)
        log.warning("reclaim %s: %s", job.node, line)
        await self._event(tick, _pod_ref(pod), RECLAIM_FORCED_REASON, line[:1].upper() + line[1:], job.node)

    async def _event(self, tick: _Tick, ref: Mapping[str, str], reason: str, message: str, node: str) -> None:
        """A Warning Event (a report: a failure to write it is logged, never the action's failure). One about a
        training pod that may not be written there (403: with ``namespace:`` set the chart grants Events in the
        models' namespace and ``default`` only) is written about the node instead (in ``default``)."""
        for target in (ref, {"kind": "Node", "name": node}):
            self._event_seq += 1
            name = f"{target['name'][:200]}.{int(tick.now * 1e9) + self._event_seq:x}"
            body = reclaim_event(target, "Warning", reason, message, tick.now, name)
            tick.gate.check(f"event {reason} {target['kind']} {target['name']}")
            try:
                await self._core.create_namespaced_event(body["metadata"]["namespace"], body,
                                                         field_manager=FIELD_MANAGER)
                return
            except ApiException as e:
                log.warning("event %s on %s %s: %s", reason, target["kind"], target["name"], api_error(e))
                if e.status != 403 or target["kind"] == "Node":
                    tick.report.skipped.append((f"event {reason} {target['kind']} {target['name']}", "error"))
                    return

    def _refuse(self, tick: _Tick, job: Reclaim, keys: Iterable[str]) -> None:
        for key in keys:
            if key in job.refused:
                continue
            job.refused.add(key)
            line = f"evict {key} from {job.node}"
            tick.report.refused.append(key)
            tick.report.skipped.append((line, "not-preemptible"))
            log.warning("reclaim %s: the plan named %s, which is not labelled %s=true: never evicted", job.node,
                        key, PREEMPTIBLE_LABEL)

    async def _served(self) -> ServedApis:
        """What the server serves: :attr:`apis`, asked once (``discover``) when not given. A discovery that failed
        (its assumptions) is used but not kept: the next call asks again."""
        if self.apis is not None:
            return self.apis
        got = await discover(self.api_client)
        if got.discovered:
            self.apis = got
        return got

    async def _policy_version(self) -> str:
        """``policy/v1`` when the server serves it (1.21+), else ``policy/v1beta1`` (1.20), by discovery;
        ``policy/v1`` when it serves neither or discovery failed (a current cluster)."""
        return f"policy/{(await self._served()).pick(POLICY) or POLICY[1][0]}"

    async def _evict_pod(self, tick: _Tick, job: Reclaim, pod: Mapping[str, Any]) -> bool:
        """One Eviction, for exactly the pod read (uid + resourceVersion preconditions); a conflict re-reads it."""
        r = tick.report
        meta = pod.get("metadata") or {}
        ns, name = str(meta.get("namespace")), str(meta.get("name"))
        key = f"{ns}/{name}"
        api_version = await self._policy_version()
        current: Mapping[str, Any] = pod

        async def attempt() -> str:
            nonlocal current
            cm = current.get("metadata") or {}
            if not is_preemptible(cm.get("labels")):  # re-checked on every (re-)read: the label is the licence
                return "not-preemptible"
            if cm.get("deletionTimestamp"):
                return "deleting"
            grace = eviction_grace((current.get("spec") or {}).get("terminationGracePeriodSeconds"),
                                   self.policy.max_reclaim_s)
            body = {"apiVersion": api_version, "kind": "Eviction", "metadata": {"name": name, "namespace": ns},
                    "deleteOptions": {"gracePeriodSeconds": grace,
                                      "preconditions": {"uid": cm.get("uid"),
                                                        "resourceVersion": cm.get("resourceVersion")}}}
            tick.gate.check(f"evict {key} from {job.node}")
            try:
                await self._core.create_namespaced_pod_eviction(name, ns, body)
            except ApiException as e:
                if e.status == 409:  # the pod changed since it was read: read it again before retrying
                    try:
                        current = self.api_client.sanitize_for_serialization(
                            await self._core.read_namespaced_pod(name, ns))
                    except ApiException as e2:
                        if e2.status == 404:
                            return "gone"
                        raise
                raise
            return f"evicted (grace {grace}s)"

        try:
            outcome = await self._retrying(tick, attempt)
        except ApiException as e:
            if e.status == 404:
                return True  # gone already
            if e.status == 429:
                # a PodDisruptionBudget says not now (asked again next tick, or after its Retry-After), or the
                # server is throttling (no request at all until its Retry-After: _retrying noted it)
                why = eviction_refusal(e.body)
                r.blocked.append((key, why))
                if why == "disruption-budget":
                    wait = retry_after_s(e.headers, e.body)
                    if wait:
                        self._not_before[key] = tick.now + wait
                    if key in job.blocked:
                        return False
                    job.blocked.add(key)
                r.skipped.append((f"evict {key} from {job.node}", why))
                return False
            raise
        if outcome == "not-preemptible":
            self._refuse(tick, job, [key])
            return False
        if outcome in ("gone", "deleting"):
            return outcome == "gone"
        r.applied.append(f"evict {key} from {job.node} {outcome}")
        r.evicted.append(key)
        return True

    async def _release(self, tick: _Tick, job: Reclaim) -> None:
        """Pods mode, last step: the taint and our annotations off; the GPUs are inference's again."""
        recorded = True

        async def attempt() -> bool:
            nonlocal recorded
            node = await self._read_node(job.node)
            if node is None:
                raise Gone(job.node)
            meta = node.get("metadata") or {}
            if (meta.get("labels") or {}).get(LENT_LABEL) == "true":
                # lent again meanwhile (an admin, another process): their lend stands, this reclaim ends unrecorded
                recorded = False
                return False
            patch = released_node_patch(node)
            if patch is None:
                recorded = not job.recovered  # an adopted reclaim someone else finished: not ours to record
                return False
            await self._hook("release", job.node)
            tick.gate.check(f"reclaim {job.node}: release")
            await self._core.patch_node(job.node, patch, _content_type=MERGE_PATCH, field_manager=FIELD_MANAGER)
            return True

        try:
            await self._retrying(tick, attempt)
        except Gone:
            self.reclaims.pop(job.node, None)
            raise
        self._finish(tick, job, record=recorded)

    # -- kueue mode -----------------------------------------------------------------------------------------------

    async def _kueue(self) -> str:
        """The Kueue API version to speak, by discovery (v1beta2 preferred, then v1beta1). Kueue not served (not
        installed yet, or discovery failed): v1beta1, and discovery is asked again next time."""
        version = (await self._served()).pick(KUEUE)
        if version is None:
            self.apis = None  # Kueue may be installed meanwhile: ask again next time
            log.warning("the server serves no %s version slotwise knows (%s): assuming %s", KUEUE_GROUP,
                        "/".join(KUEUE[1]), KUEUE_VERSION)
            return KUEUE_VERSION
        return version

    async def _cluster_queue(self, version: str) -> dict[str, Any]:
        """The inference ClusterQueue as the server has it now (:class:`Gone` when it does not exist)."""
        name = self.policy.kueue_cluster_queue
        try:
            return await self._custom.get_cluster_custom_object(KUEUE_GROUP, version, "clusterqueues", name)
        except ApiException as e:
            if e.status == 404:
                raise Gone(f"ClusterQueue {name}") from None
            raise

    async def _limit(self, tick: _Tick, lends: Sequence[LendGpus]) -> bool:
        """Set the inference ClusterQueue's lendingLimit for this tick; False when it could not be written."""
        r = tick.report
        p = self.policy
        lent_now = set(tick.view.snapshot.lent)
        reclaiming = {(j.node, d) for j in self.reclaims.values() for d in j.devices}
        newly = {(a.node, d) for a in lends for d in a.devices}
        target = lending_limit(lent_now, reclaiming, newly)
        line = f"lending-limit ClusterQueue {p.kueue_cluster_queue} {p.kueue_flavor}/{p.kueue_resource} -> {target}"

        async def attempt() -> tuple[int, bool]:
            version = await self._kueue()
            cq = await self._cluster_queue(version)
            got = set_lending_limit(cq, p.kueue_flavor, p.kueue_resource, target)
            if isinstance(got, str):
                raise ValueError(got)
            groups, written, changed = got
            if not changed:
                return written, False
            await self._hook("lending-limit", p.kueue_cluster_queue)
            meta: dict[str, Any] = {"resourceVersion": cq["metadata"]["resourceVersion"]}
            # the operator's value, in the same write as slotwise's first change of it: never one without the other
            original = remember_original(cq, p.kueue_flavor, p.kueue_resource)
            if original is not None:
                meta["annotations"] = original
            patch = {"metadata": meta, "spec": {"resourceGroups": groups}}
            tick.gate.check(line)
            await self._custom.patch_cluster_custom_object(KUEUE_GROUP, version, "clusterqueues",
                                                           p.kueue_cluster_queue, patch, _content_type=MERGE_PATCH,
                                                           field_manager=FIELD_MANAGER)
            return written, True

        try:
            written, changed = await self._retrying(tick, attempt)
        except LeadershipLost:
            raise
        except Exception as e:
            why = f"{e} not found" if isinstance(e, Gone) else api_error(e)
            log.warning("%s: %s", line, why)
            r.errors.append(f"{line}: {why}")
            r.skipped.extend((describe(a), "error") for a in lends)
            return False
        if changed:
            r.applied.append(line if written == target else f"{line} (capped at nominalQuota {written})")
        else:
            r.skipped.append((line, "unchanged"))
        raised = changed and newly - lent_now - reclaiming
        for a in lends:
            if raised and set((a.node, d) for d in a.devices) - lent_now - reclaiming:
                r.applied.append(describe(a))
                r.lends += 1
            else:
                r.skipped.append((describe(a), "unchanged"))
        return True

    async def _workloads_of(self, name: str, ref: TrainingRef) -> list[tuple[str, str]]:
        """The Kueue Workloads ((namespace, name)) admitting the training workload ``name``: what the caches
        know, else the Workloads in its namespace it owns (Kueue names them after their owner, not predictably)."""
        if ref.kind == "Workload":
            ns, _, wl = name.partition("/")
            return [(ns, wl)]
        if ref.workloads:
            return [tuple(w.split("/", 1)) for w in ref.workloads]  # type: ignore[misc]
        _, _, obj = name.partition("/")
        try:
            listed = await self._custom.list_namespaced_custom_object(KUEUE_GROUP, await self._kueue(),
                                                                      ref.namespace, "workloads")
        except ApiException as e:
            if e.status == 404:  # no Kueue CRDs: no Workloads
                return []
            raise
        out = []
        for w in listed.get("items") or ():
            meta = w.get("metadata") or {}
            if any(o.get("kind") == ref.kind and (o.get("name") == obj or (ref.uid and o.get("uid") == ref.uid))
                   for o in meta.get("ownerReferences") or ()):
                out.append((ref.namespace, str(meta.get("name"))))
        return sorted(out)

    async def _deactivate(self, tick: _Tick, job: Reclaim) -> None:
        """Kueue mode: ``spec.active: false`` on the named workloads' Workloads, in the plan's order, each marked
        as slotwise's (label + annotations: only those are ever reactivated). A named workload the view does not
        know as training is refused; one without a Workload is evicted pod by pod. A Workload someone else
        deactivated is left alone (and not marked)."""
        r = tick.report
        version = await self._kueue()
        for name in job.workloads:
            ref = tick.view.training.get(name)
            if ref is None:
                self._refuse(tick, job, [name])
                continue
            found = await self._workloads_of(name, ref)
            if not found:
                job.bare.add(name)  # a preemptible pod (or Job) Kueue does not manage: evicted instead
            for ns, wl in found:
                try:
                    obj = await self._custom.get_namespaced_custom_object(KUEUE_GROUP, version, ns, "workloads", wl)
                except ApiException as e:
                    if e.status == 404:
                        continue
                    raise
                if (obj.get("spec") or {}).get("active") is False:
                    if deactivated_by_slotwise(obj):
                        job.deactivated.add(f"{ns}/{wl}")
                    continue
                tick.gate.check(f"deactivate Workload {ns}/{wl}")
                await self._custom.patch_namespaced_custom_object(
                    KUEUE_GROUP, version, ns, "workloads", wl, deactivate_patch(tick.now, job.node, job.reason),
                    _content_type=MERGE_PATCH, field_manager=FIELD_MANAGER)
                job.deactivated.add(f"{ns}/{wl}")
                r.applied.append(f"deactivate Workload {ns}/{wl} ({name}) for reclaim {job.node} ({job.reason})")
                r.deactivated.append(f"{ns}/{wl}")
        job.phase = Phase.EVICT

    async def _roll_back(self, tick: _Tick) -> None:
        """Kueue mode, lending switched off, every reclaim over and nothing lent: the inference ClusterQueue's
        lendingLimit goes back to the operator's own (:meth:`_restore_limit`), then the Workloads slotwise
        deactivated go back to Kueue -- admitted, if at all, as the operator's quotas allow. Once per process and
        term."""
        if await self._restore_limit(tick):
            await self._reactivate(tick, "lending switched off: rolled back")
            self._rolled_back = True

    async def _restore_limit(self, tick: _Tick) -> bool:
        """The lendingLimit recorded before slotwise first changed it, back on the ClusterQueue (unset: the key
        removed), the record taken off in the same write (with the read ``resourceVersion``). Not 0: that would
        take from the cohort what the operator lends it. Nothing recorded (slotwise never changed it) or the
        ClusterQueue gone: nothing to give back. False when it could not be written (tried again next tick)."""
        r = tick.report
        p = self.policy
        line = f"lending-limit ClusterQueue {p.kueue_cluster_queue} {p.kueue_flavor}/{p.kueue_resource}"

        async def attempt() -> tuple[Any, bool]:
            version = await self._kueue()
            cq = await self._cluster_queue(version)
            got = restore_lending_limit(cq, p.kueue_flavor, p.kueue_resource)
            if got is None:
                return None, False
            groups, value, annotations = got
            await self._hook("lending-limit", p.kueue_cluster_queue)
            patch = {"metadata": {"resourceVersion": cq["metadata"]["resourceVersion"], "annotations": annotations},
                     "spec": {"resourceGroups": groups}}
            tick.gate.check(f"{line} restored")
            await self._custom.patch_cluster_custom_object(KUEUE_GROUP, version, "clusterqueues",
                                                           p.kueue_cluster_queue, patch, _content_type=MERGE_PATCH,
                                                           field_manager=FIELD_MANAGER)
            return value, True

        try:
            value, restored = await self._retrying(tick, attempt)
        except LeadershipLost:
            raise
        except Gone:
            r.skipped.append((line, "gone"))
            return True
        except Exception as e:
            log.warning("%s: not restored: %s", line, api_error(e))
            r.errors.append(f"{line}: not restored: {api_error(e)}")
            return False
        if restored:
            r.applied.append(f"{line} restored to the operator's {'unset' if value is None else value}")
        else:
            r.skipped.append((line, "never-changed"))
        return True

    async def _reactivate(self, tick: _Tick, why: str) -> None:
        """Kueue mode, capacity lent again: every Workload slotwise deactivated (its mark) whose reclaim is over
        goes back to Kueue (``spec.active: true``; Kueue queues it and admits it as quota allows -- the
        lendingLimit this tick wrote). Listed server-side by the mark's label: one request per such tick."""
        r = tick.report
        version = await self._kueue()
        in_flight = {k for j in self.reclaims.values() for k in j.deactivated}
        for w in sorted(await self._marked_workloads(), key=pod_key):
            key = pod_key(w)
            if key in in_flight:
                continue  # its reclaim is still under way (its pods are leaving)
            ns, name = key.split("/", 1)
            current: Mapping[str, Any] = w

            async def attempt(ns: str = ns, name: str = name) -> bool:
                nonlocal current
                patch = reactivate_patch(current)
                was_active = (current.get("spec") or {}).get("active") is not False
                tick.gate.check(f"reactivate Workload {ns}/{name}")
                try:
                    await self._custom.patch_namespaced_custom_object(
                        KUEUE_GROUP, version, ns, "workloads", name, patch, _content_type=MERGE_PATCH,
                        field_manager=FIELD_MANAGER)
                except ApiException as e:
                    if e.status == 409:  # changed since listed: read it again before retrying
                        current = await self._custom.get_namespaced_custom_object(KUEUE_GROUP, version, ns,
                                                                                  "workloads", name)
                        if not deactivated_by_slotwise(current):
                            return False  # someone else took it over meanwhile
                    raise
                return not was_active

            try:
                if await self._retrying(tick, attempt):
                    r.applied.append(f"reactivate Workload {key} ({why})")
                    r.reactivated.append(key)
            except ApiException as e:
                if e.status != 404:
                    raise


def _reclaiming(node: Mapping[str, Any]) -> bool:
    labels = (node.get("metadata") or {}).get("labels") or {}
    return labels.get(LENT_LABEL) != "true" and has_lent_taint((node.get("spec") or {}).get("taints"))


def _pod_ref(pod: Mapping[str, Any]) -> dict[str, str]:
    meta = pod.get("metadata") or {}
    return {"kind": "Pod", "apiVersion": "v1", "namespace": str(meta.get("namespace")), "name": str(meta.get("name")),
            "uid": str(meta.get("uid") or "")}


def _force_after(policy: LendingPolicy) -> float | None:
    """The opt-in force: seconds after the deadline a reclaim blocked by a disruption budget deletes the pods
    (``LendingPolicy.force_after_s``); None (off) when unset or not a finite number >= 0."""
    value = getattr(policy, "force_after_s", None)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        return None
    return float(value)
