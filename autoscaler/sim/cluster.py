"""The simulated cluster: GPU nodes, replicas on slots, cold start and drain. One module: placement, readiness,
drain, lending and node loss all move the same accounting (held, routable, capacity, idle), kept incrementally here.

It is both the simulated Cluster port (``snapshot``) and the simulated Actuator (``apply``), so the
decision core drives it exactly as it drives Kubernetes. A placed replica becomes Ready after its
model's load time (``cold_start_s``; zero for a policy that asks for ``instant_start``); a removed
replica stops receiving traffic at once and frees its slot when its in-flight work is done
(bounded by the drain timeout). A replica that is a group of pods (``ModelSpec.pods_per_replica``, a LeaderWorkerSet
replica: ``PlaceReplica.group_slots``) holds every pod's slot under its id from placement to the end of its drain,
is Ready as one when its cold start ends, serves as one replica, and its GPU-hours are all its slots'. The node-level
actions (``SetMigLayout``, ``SetTimeSlicing``, ``SetSlotTemplate``)
are recorded: the packer made the MIG instances as it placed, so they change no capacity here; each model's
template shows in the next snapshot, as the live controller reads it from the Deployment.

Lending (issue 8): ``LendGpus`` allocates idle whole GPUs to ``lent_owner(node, dev)`` under ``LENT_MODEL`` (so
no inference replica can land there) and starts preemptible training jobs on them from a :class:`TrainingQueue`;
``ReclaimGpus`` sends the jobs on those GPUs SIGTERM (they lose the work since their last checkpoint, stop after
their grace period, and go back to the queue with what they kept) and gives each GPU back to inference when its
job has stopped. A static split (``reserve_static_training``) takes GPUs out of the inference pool up front for
training that is never preempted. The accounting (:class:`LendingStats`) is exact in time (event-driven), clipped
to the scored period from ``score_from`` (the records: :mod:`autoscaler.sim.lending`).

Speed (issue 15): each replica serves at its slot's speed relative to the hardware the model's service profile
describes (:func:`autoscaler.api.spec.replica_speed`: the model's ``slot-speeds`` annotation, else the published
table), fixed when it is placed. ``capacity`` keeps, per model, the routable replicas' speeds summed (reference-speed
replicas), and :meth:`speeds_of` lists them, both updated only when a replica starts or stops being routable, as
``routable`` is; the engines serve at them (:mod:`autoscaler.sim.queueing`). ``at_reference_speed`` is true while
every routable replica runs at speed 1, where the engines take their old path: such a run is unchanged by speeds.

What the plans said (issue 9), for the scorecard: the replicas each model is short, by :class:`ShortfallCause`
(``shortfall_by_cause``; a model's shortfall stands until a status update for it comes without one, since the core
re-states it only when it decides the model), the part refused while its team was inside its guarantee
(``refused_within``), the preemptions carried out (``preemptions``) and the decisions that came without a reason
(``unreasoned``: a Shortfall without a known cause or words, a preemption without a reason or message). The last
two count from ``score_from``, as the lending numbers do.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np

from autoscaler.api.plan import (
    LendGpus,
    PlaceReplica,
    Plan,
    ReclaimGpus,
    RemoveReplica,
    ScaleModel,
    SetMigLayout,
    SetRouting,
    SetSlotTemplate,
    SetTimeSlicing,
    Shortfall,
    ShortfallCause,
    UpdateStatus,
)
from autoscaler.api.snapshot import ClusterSnapshot, ModelObservation, Replica, SlotTemplate
from autoscaler.api.spec import ModelSpec, SpecError, replica_speed
from autoscaler.decision.node_actions import Layout, slot_template
from autoscaler.sim.lending import LendingStats, Reclaim, TrainingRun
from autoscaler.sim.training import TrainingQueue
from sharing.lending import LENT_MODEL, LendingPolicy, lent_owner
from sharing.packer import allocate_group
from sharing.slots import Inventory, NodeSpec, Slot

# Event kinds, in the order events due at the same time are handled: a training job that stops frees its GPUs
# before the next one starts on them.
_READY, _RELEASE, _JOB_STOPPED, _JOB_DONE = 0, 1, 2, 3

STATIC_TRAINING_MODEL = "(training)"  # the inventory's model for GPUs a static split gives to training
LOST_MODEL = "(lost)"  # the inventory's model for the GPUs of a node lost in a scenario event

# The columns of ``SimCluster.shortfall_by_cause``: every ShortfallCause, then "" for a cause the core did not give
# (or one this module does not know): such a Shortfall is also counted as unreasoned.
SHORTFALL_CAUSES: tuple[str, ...] = (*(str(c) for c in ShortfallCause), "")
_CAUSE_INDEX = {c: j for j, c in enumerate(SHORTFALL_CAUSES)}
# Grants in progress: the capacity is being freed for the model, so waiting on them breaks no guarantee.
_GRANTS = frozenset({str(ShortfallCause.RECLAIMING), str(ShortfallCause.PREEMPTING)})


def static_owner(node: str, device: int) -> str:
    """The inventory owner of a GPU reserved for training by a static split."""
    return f"training:{node}/{device}"


class LendingViolation(AssertionError):
    """A plan broke a lending invariant (training on a GPU holding inference, or the reverse): a core bug."""


@dataclass
class SimReplica:
    replica_id: str
    slot: Slot
    started_at: float
    ready_at: float
    release_at: float | None = None  # set when draining
    speed: float = 1.0  # serving speed relative to the model's reference GPU (sharing.slot_speed)
    routable: bool = False  # Ready and not draining: the engines route to it
    # A replica that is a group of pods (ModelSpec.pods_per_replica > 1): the other pods' slots, held with ``slot``
    # (all under the replica's id) from placement to release; Ready, routable and drained as one replica.
    group_slots: tuple[Slot, ...] = ()

    @property
    def slots(self) -> tuple[Slot, ...]:
        return (self.slot, *self.group_slots) if self.group_slots else (self.slot,)


class SimCluster:
    def __init__(
        self,
        nodes: Sequence[NodeSpec],
        models: Sequence[str],
        specs: dict[str, ModelSpec | SpecError],
        drain_s: np.ndarray,
        instant_start: bool = False,
        lending: LendingPolicy | None = None,
        training: TrainingQueue | None = None,
        served: dict[str, ModelSpec | SpecError] | None = None,
        servers: Sequence[float] | None = None,
    ) -> None:
        # ``specs``: the annotations the controller reads; ``served``: what the replicas really are (cold start, slot
        # speed, servers), when they differ (a declaration that is wrong: SimWorkload.declared); None: the same.
        # ``servers``: requests a replica runs at once per model, when not the served spec's concurrency (a KV cache
        # that fits fewer, Workload.with_kv_cache).
        physics = specs if served is None else served
        self.inventory = Inventory.from_nodes(nodes)
        self.models = list(models)
        self.index = {m: i for i, m in enumerate(self.models)}
        self.specs = specs
        self.drain_s = drain_s  # per model: how long a removed replica keeps its slot
        self.instant_start = instant_start
        self.replicas: list[dict[str, SimReplica]] = [{} for _ in self.models]
        self.desired = np.zeros(len(self.models), dtype=int)
        self.shortfall = np.zeros(len(self.models), dtype=int)  # replicas short per model (all causes)
        # ... by cause (SHORTFALL_CAUSES columns), and the part refused while the team was inside its guarantee
        self.shortfall_by_cause = np.zeros((len(self.models), len(SHORTFALL_CAUSES)), dtype=int)
        self.refused_within = np.zeros(len(self.models), dtype=int)
        self.preemptions: list[dict[str, object]] = []  # carried out from score_from (RemoveReplica.preempted_by)
        self.unreasoned = 0  # from score_from: Shortfalls without a cause or words, preemptions without a reason
        self.n_held = np.zeros(len(self.models), dtype=int)  # replicas holding a slot (starting, serving, draining)
        self.held_by_model = np.zeros(len(self.models))  # GPU-equivalents held per model (``held`` summed over kinds)
        # servers (concurrency) per replica, and per model GPU-equivalents per server held (None after a change)
        self._servers = np.array([float(s.concurrency) if isinstance(s, ModelSpec) else 1.0
                                  for s in (physics[x] for x in self.models)] if servers is None else servers,
                                 dtype=np.float64)
        self._gpu_per_server: np.ndarray | None = None
        self.scale_events = 0
        self.reasons: dict[str, int] = {}
        # The simulated activator (issue 18) fronts every model whose spec has min_replicas 0: via_activator False
        # (they start with replicas, traffic straight to them) until a SetRouting says otherwise; None for the others.
        # The engines hold a model's requests while it has no routable replica whatever routing says (the activator
        # is always there): SetRouting is counted (``routing_actions``, per model) and shown back, nothing more.
        self.via_activator: list[bool | None] = [
            False if isinstance(s, ModelSpec) and s.min_replicas == 0 else None
            for s in (specs[m] for m in self.models)]
        self.routing_actions: dict[str, int] = {}
        self._obs: list[ModelObservation | None] = [None] * len(self.models)
        self.routable = np.zeros(len(self.models), dtype=int)
        # Routable capacity in reference-speed replicas (module docstring), and how many routable replicas are not at
        # speed 1 (0: the engines need no speeds).
        self.capacity = np.zeros(len(self.models))
        self._off_reference = 0
        # the spec each model is served as (a model with invalid annotations: a default one, as the workload does)
        self._served = [s if isinstance(s, ModelSpec) else ModelSpec(name=x) for x, s in
                        ((x, physics[x]) for x in self.models)]
        self._speeds: dict[tuple[int, str, str, str | None, float], float] = {}  # memo of replica_speed
        self._gpus_held = 0.0  # sum of gpu_fraction over held slots, kept incrementally
        # Cost accounting, also incremental (updated on allocate/release only, so a tick reads arrays):
        # GPU-equivalents held per (model, GPU kind), and per node what replicas hold there, for the idle
        # reserved capacity (free GPU-equivalents on nodes with at least one replica; see
        # autoscaler/accounting/cost.py).
        nodes_ = [n for n in self.inventory.nodes.values() if n.gpu_count]
        self.gpu_kinds: tuple[str, ...] = tuple(sorted({n.gpu_model for n in nodes_}))
        kind_index = {k: j for j, k in enumerate(self.gpu_kinds)}
        self._node_index = {n.name: j for j, n in enumerate(nodes_)}
        self._node_kind = np.array([kind_index[n.gpu_model] for n in nodes_], dtype=int)
        self._node_gpus = np.array([float(n.gpu_count) for n in nodes_])
        self._node_held = np.zeros(len(nodes_))
        self._node_replicas = np.zeros(len(nodes_), dtype=int)
        self.held = np.zeros((len(self.models), len(self.gpu_kinds)))  # GPU-equivalents by model and kind
        self._idle: np.ndarray | None = None  # cached idle_by_kind(); None after a change
        self._events: list[tuple[float, int, int, str]] = []  # (time, kind, model, replica or job) heap
        # Lending and training (idle unless a plan lends or a static split is reserved: the tick loop of a run
        # without either never touches them).
        self.lending = lending
        self.training = training
        self.score_from = 0.0  # the scored period starts here (the run's burn-in): LendingStats count from it
        self.lent: dict[tuple[str, int], float] = {}  # (node, device) -> lent since
        self.static: set[tuple[str, int]] = set()  # GPUs a static split gave to training
        self.pool_gpus = float(self.inventory.gpus_total)  # the inference pool: every GPU not in a static split
        self.lent_by_kind = np.zeros(len(self.gpu_kinds))  # whole GPUs lent now, per GPU kind
        self.stats = LendingStats()
        self.runs: dict[str, TrainingRun] = {}  # by job name: running, or stopping after a SIGTERM
        self._dev_run: dict[tuple[str, int], str] = {}  # GPU -> the job on it
        self._reclaiming: dict[tuple[str, int], Reclaim] = {}  # lent GPU -> the reclaim waiting for it
        self._node_training = np.zeros(len(nodes_))  # whole GPUs per node held by training (lent or static)
        self._lent_view: MappingProxyType | None = None  # snapshot's read-only copy of ``lent``; None after a change
        self.lost_nodes: list[str] = []  # nodes lost to scenario events, in order
        # Node-level actions, recorded: the packer creates MIG instances as it places (the inventory has them
        # already), so a layout, the time-slicing config and a model's template change nothing else here; the
        # templates go into the next snapshot, as the live controller reads them from the Deployments.
        self.templates: dict[str, SlotTemplate] = {m: SlotTemplate() for m in self.models}  # none asks for a GPU yet
        self._templates_view: MappingProxyType | None = None  # the snapshot's read-only copy; None after a change
        self.mig_layouts: dict[str, dict[int, Layout]] = {}  # node -> its GPUs' layouts as last set
        self.time_slicing: dict[str, int] = {}  # the device plugin's shares per resource as last set

    # -- ClusterPort ---------------------------------------------------------------------------
    def snapshot(self, now: float) -> ClusterSnapshot:
        models = {}
        for i, name in enumerate(self.models):
            obs = self._obs[i]
            if obs is None:
                obs = self._observe(i, now)
                self._obs[i] = obs
            models[name] = obs
        if self._templates_view is None:
            self._templates_view = MappingProxyType(dict(self.templates))
        if not self.lent and not self.runs:
            return ClusterSnapshot(now=now, models=models, inventory=self.inventory, templates=self._templates_view)
        if self._lent_view is None:
            self._lent_view = MappingProxyType(dict(self.lent))
        # Jobs stopping after a SIGTERM are already being reclaimed: the core sees their GPUs lent, not the job.
        training = tuple(r.view(now) for r in self.runs.values() if r.lent and r.stop_at is None)
        return ClusterSnapshot(now=now, models=models, inventory=self.inventory, training=training,
                               lent=self._lent_view, templates=self._templates_view)

    def _observe(self, i: int, now: float) -> ModelObservation:
        name = self.models[i]
        spec = self.specs[name]
        reps = tuple(
            Replica(r.replica_id, r.slot, ready=r.ready_at <= now, started_at=r.started_at,
                    draining=r.release_at is not None, group_slots=r.group_slots)
            for r in self.replicas[i].values()
        )
        if isinstance(spec, SpecError):
            return ModelObservation(name, None, int(self.desired[i]), reps, spec_error=spec)
        return ModelObservation(name, spec, int(self.desired[i]), reps, via_activator=self.via_activator[i])

    # -- Actuator ------------------------------------------------------------------------------
    def apply(self, plan: Plan) -> None:
        now = plan.now
        scored = now >= self.score_from
        touched = set()
        short: set[int] = set()  # models with a Shortfall in this plan
        restated: set[int] = set()  # models with a status update in this plan
        for a in plan.actions:
            match a:
                case PlaceReplica():
                    i = self.index[a.model]
                    spec = self.specs[a.model]
                    assert isinstance(spec, ModelSpec)
                    if self.lent or self.static:
                        self._check_not_training(a)
                    allocate_group(self.inventory, a.slots, a.replica_id)
                    self._hold(i, a.slot, 1)
                    for g in a.group_slots:  # a group's other pods: held, not more replicas
                        self._hold(i, g, 1, replica=False)
                    # (a group is Ready as one, when its cold start ends)
                    ready_at = now if self.instant_start else now + self._served[i].cold_start_s
                    self.replicas[i][a.replica_id] = SimReplica(a.replica_id, a.slot, now, ready_at,
                                                                speed=self._speed(i, a.slot),
                                                                group_slots=a.group_slots)
                    heapq.heappush(self._events, (ready_at, _READY, i, a.replica_id))
                    touched.add(i)
                case RemoveReplica():
                    i = self.index[a.model]
                    if a.preempted_by and scored and not (a.reason and a.message):
                        self.unreasoned += 1
                    r = self.replicas[i].get(a.replica_id)
                    if r is None or r.release_at is not None:
                        continue
                    if a.preempted_by and scored:
                        spec = self.specs[a.model]
                        self.preemptions.append({
                            "at_s": now, "model": a.model, "team": spec.team if isinstance(spec, ModelSpec) else "",
                            "replica": a.replica_id, "by_model": a.preempted_by, "reason": str(a.reason),
                            "message": a.message,
                        })
                    if r.ready_at > now:  # never served: free at once
                        self._release(i, r)
                    else:
                        # Stop routing now; keep the slot until in-flight requests are done.
                        if r.routable:
                            self._route(i, r, -1)
                        r.release_at = now + (0.0 if self.instant_start else self.drain_s[i])
                        heapq.heappush(self._events, (r.release_at, _RELEASE, i, r.replica_id))
                    touched.add(i)
                case ScaleModel():
                    i = self.index[a.model]
                    self.desired[i] = a.replicas
                    self.scale_events += 1
                    self.reasons[str(a.reason)] = self.reasons.get(str(a.reason), 0) + 1
                    touched.add(i)
                case Shortfall():
                    i = self.index[a.model]
                    if i not in short:  # this plan's Shortfalls for the model replace the last ones
                        short.add(i)
                        self.shortfall[i] = 0
                        self.shortfall_by_cause[i] = 0
                        self.refused_within[i] = 0
                    cause = str(a.cause) if a.cause else ""
                    j = _CAUSE_INDEX.get(cause, len(SHORTFALL_CAUSES) - 1)
                    if scored and (j == len(SHORTFALL_CAUSES) - 1 or not str(a.reason).strip()):
                        self.unreasoned += 1
                    self.shortfall[i] += a.missing
                    self.shortfall_by_cause[i, j] += a.missing
                    if a.within_guarantee and cause not in _GRANTS:
                        self.refused_within[i] += a.missing
                case UpdateStatus() if a.model in self.index:
                    restated.add(self.index[a.model])
                case LendGpus():
                    self._lend(a, now)
                case ReclaimGpus():
                    self._reclaim(a, now)
                case SetSlotTemplate():
                    self.templates[a.model] = SlotTemplate(a.resources, a.node_selector)
                    self._templates_view = None
                case SetMigLayout():
                    self.mig_layouts[a.node] = dict(a.layouts)
                case SetTimeSlicing():
                    self.time_slicing = dict(a.replicas)
                case SetRouting() if a.model in self.index:
                    i = self.index[a.model]
                    self.routing_actions[a.model] = self.routing_actions.get(a.model, 0) + 1
                    if self.via_activator[i] is not None:  # nobody fronts the others: nothing to switch
                        self.via_activator[i] = a.via_activator
                        touched.add(i)
        # The core re-states a model's status whenever its reason changes, with the Shortfall in the same plan while
        # it is short: a status update without one means the shortfall is over.
        for i in restated - short:
            self.shortfall[i] = 0
            self.shortfall_by_cause[i] = 0
            self.refused_within[i] = 0
        for i in touched:
            self._obs[i] = None

    def _speed(self, i: int, slot: Slot) -> float:
        key = (i, slot.gpu_model, str(slot.kind), slot.profile, slot.compute_fraction)
        hit = self._speeds.get(key)
        if hit is None:
            hit = self._speeds[key] = replica_speed(self._served[i], slot, self.inventory.catalog)
        return hit

    def _route(self, i: int, r: SimReplica, sign: int) -> None:
        """Replica ``r`` of model ``i`` starts (+1) or stops (-1) being routable."""
        r.routable = sign > 0
        self.routable[i] += sign
        # exactly 0 once nothing is routable (speeds like 0.463 leave float residue)
        self.capacity[i] = self.capacity[i] + sign * r.speed if self.routable[i] else 0.0
        if r.speed != 1.0:
            self._off_reference += sign

    @property
    def at_reference_speed(self) -> bool:
        """Every routable replica serves at speed 1: ``capacity`` equals ``routable``."""
        return self._off_reference == 0

    def speeds_of(self, i: int) -> list[float]:
        """The speeds of model ``i``'s routable replicas, in the order they were placed (``len == routable[i]``)."""
        return [r.speed for r in self.replicas[i].values() if r.routable]

    def _release(self, i: int, r: SimReplica) -> None:
        for g in r.group_slots:  # (before the leader: the model's held GPUs are zeroed with its last replica)
            self.inventory.release(g, r.replica_id)
            self._hold(i, g, -1, replica=False)
        self.inventory.release(r.slot, r.replica_id)
        self._hold(i, r.slot, -1)
        del self.replicas[i][r.replica_id]

    def _hold(self, i: int, slot: Slot, sign: int, replica: bool = True) -> None:
        """Account a slot taken (+1) or given back (-1) by model ``i``; ``replica`` False: another pod's slot of a
        replica that is a group (its GPUs are held, the replica is counted once, with its leader's slot)."""
        f = slot.gpu_fraction * sign
        self._gpus_held += f
        n = self._node_index[slot.node]
        self.held[i, self._node_kind[n]] += f
        self._node_held[n] += f
        self._node_replicas[n] += sign
        if replica:
            self.n_held[i] += sign
        # exactly 0 once nothing is held (fractions like 3/7 leave float residue)
        self.held_by_model[i] = self.held_by_model[i] + f if self.n_held[i] else 0.0
        self._gpu_per_server = None
        self._idle = None

    # -- time ----------------------------------------------------------------------------------
    def advance(self, now: float) -> np.ndarray:
        """Apply readiness and drain completions due by ``now``; return routable replicas per model.

        Event-driven (a heap of readiness/release times), so a tick costs nothing when nothing changes.
        """
        events = self._events
        while events and events[0][0] <= now:
            t, kind, i, rid = heapq.heappop(events)
            if kind >= _JOB_STOPPED:
                self._job_event(t, kind, rid)
                continue
            r = self.replicas[i].get(rid)
            if r is None:
                continue
            if kind == _READY and r.release_at is None and not r.routable:
                self._route(i, r, 1)
            elif kind == _RELEASE:
                self._release(i, r)
            self._obs[i] = None
        return self.routable

    # -- lending: the executor of LendGpus / ReclaimGpus ---------------------------------------
    def _check_not_training(self, a: PlaceReplica) -> None:
        for slot in a.slots:
            for d in slot.devices:
                if (slot.node, d) in self.lent or (slot.node, d) in self.static:
                    raise LendingViolation(f"place {a.model}/{a.replica_id} on {slot.describe()}: the GPU is "
                                           "training's (lent or statically split); inference never lands there")

    def _take_gpu(self, node: str, dev: int, owner: str, model: str, sign: int) -> None:
        """Allocate (+1) or release (-1) one whole GPU for training, with the node and kind accounting."""
        slot = Slot.whole(node, dev, self.inventory.gpu_of(node))
        if sign > 0:
            self.inventory.allocate(slot, owner, model=model)
        else:
            self.inventory.release(slot, owner)
        n = self._node_index[node]
        self._node_training[n] += sign
        if model == LENT_MODEL:
            self.lent_by_kind[self._node_kind[n]] += sign
            self._lent_view = None
        self._idle = None

    def _lend(self, a: LendGpus, now: float) -> None:
        new = [dev for dev in dict.fromkeys(a.devices) if (a.node, dev) not in self.lent]  # repeats change nothing
        for dev in new:  # all checked before any is taken: a bad plan changes nothing
            d = self.inventory.device(a.node, dev)
            if d.entries or d.pinned:
                # Training never takes a GPU holding inference (or a MIG layout inference set up).
                what = d.entries[0][0] if d.entries else f"MIG instances {list(d.pinned)}"
                raise LendingViolation(f"lend {a.node}/gpu{dev}: not idle (held by {what})")
        for dev in new:
            self._take_gpu(a.node, dev, lent_owner(a.node, dev), LENT_MODEL, 1)
            self.lent[(a.node, dev)] = now
        if new:
            self.stats.lends += 1
            self.stats.lent_gpus += len(new)
            self._fill(a.node, now, lent=True)

    def _reclaim(self, a: ReclaimGpus, now: float) -> None:
        targets = []
        for dev in dict.fromkeys(a.devices):
            key = (a.node, dev)
            if key not in self.lent or key in self._reclaiming:
                self.stats.reclaim_noops += 1  # not lent, or already coming back: the first reclaim stands
                continue
            targets.append(dev)
        if not targets:
            return
        rec = Reclaim(a.node, tuple(targets), a.reason, now, a.deadline_s, pending=set(targets))
        if now >= self.score_from:
            self.stats.reclaims.append(rec)
        # SIGTERM the named workloads (the plan's preemption order) and any other job on these GPUs.
        names = [*a.workloads, *(self._dev_run[(a.node, d)] for d in targets if (a.node, d) in self._dev_run)]
        for name in dict.fromkeys(names):
            run = self.runs.get(name)
            if run is not None and run.lent and run.stop_at is None:
                self._sigterm(run, now)
        for dev in targets:
            self._reclaiming[(a.node, dev)] = rec
        for dev in targets:
            if (a.node, dev) not in self._dev_run:
                self._give_back(a.node, dev, now)

    def _give_back(self, node: str, dev: int, now: float) -> None:
        """A reclaimed GPU is free: it goes back to inference."""
        rec = self._reclaiming.pop((node, dev))
        self._take_gpu(node, dev, lent_owner(node, dev), LENT_MODEL, -1)
        del self.lent[(node, dev)]
        rec.pending.discard(dev)
        if not rec.pending:
            rec.freed_at = now

    def _fill(self, node: str, now: float, lent: bool) -> None:
        """Start jobs from the backlog on the node's idle training GPUs (lent, or the static split's)."""
        if self.training is None:
            return
        pool = self.lent if lent else self.static
        free = [d for d in range(self.inventory.nodes[node].gpu_count)
                if (node, d) in pool and (node, d) not in self._dev_run and (node, d) not in self._reclaiming]
        # Lent GPUs must come back within the reclaim deadline: a job that cannot stop that fast never starts there.
        max_grace = (self.lending or LendingPolicy()).max_reclaim_s if lent else math.inf
        while free:
            q = self.training.take(len(free), max_grace, now)
            if q is None:
                break
            if q.first_started_at is None:
                q.first_started_at = now
                if now >= self.score_from:
                    self.stats.job_waits_s.append(now - q.entered_at)
            devs, free = tuple(free[: q.job.gpus]), free[q.job.gpus:]
            run = TrainingRun(q, node, devs, now, lent)
            self.runs[q.name] = run
            for d in devs:
                self._dev_run[(node, d)] = q.name
            self.stats.jobs_started += 1
            heapq.heappush(self._events, (now + q.remaining_s, _JOB_DONE, 0, q.name))

    def _scored(self, t0: float, t1: float) -> float:
        """Seconds of ``[t0, t1)`` in the scored period."""
        return max(0.0, t1 - max(t0, self.score_from))

    def _goodput(self, run: TrainingRun, until: float) -> None:
        kept = len(run.devices) * self._scored(run.started_at, until)
        if run.lent:
            self.stats.goodput_lent_s += kept
        else:
            self.stats.goodput_static_s += kept

    def _sigterm(self, run: TrainingRun, now: float) -> None:
        """Preempt: the work since the last checkpoint is lost; the GPUs stay taken for the grace period."""
        ckpt = run.last_checkpoint_at(now)
        kept_until = run.started_at if ckpt is None else ckpt
        gpus = len(run.devices)
        self._goodput(run, kept_until)
        self.stats.lost_s += gpus * self._scored(kept_until, now)
        grace = run.job.job.grace_s
        self.stats.grace_s += gpus * self._scored(now, now + grace)
        self.stats.preemptions += 1
        run.job.done_s += kept_until - run.started_at
        run.job.preemptions += 1
        run.sigterm_at, run.stop_at = now, now + grace
        heapq.heappush(self._events, (run.stop_at, _JOB_STOPPED, 0, run.job.name))

    def _job_event(self, t: float, kind: int, name: str) -> None:
        run = self.runs.get(name)
        if run is None:
            return
        if kind == _JOB_DONE:
            if run.stop_at is not None or t != run.started_at + run.job.remaining_s:
                return  # stale: the run was preempted (or this is an earlier run of the same job)
            self._goodput(run, t)
            self.stats.jobs_finished += 1
            if t >= self.score_from:
                self.stats.jobs_finished_scored += 1
        elif run.stop_at != t:
            return
        del self.runs[name]
        if kind == _JOB_STOPPED and self.training is not None:
            self.training.requeue(run.job)
        refill = False
        for d in run.devices:
            del self._dev_run[(run.node, d)]
            if (run.node, d) in self._reclaiming:
                self._give_back(run.node, d, t)
            else:
                refill = True
        if refill:
            self._fill(run.node, t, lent=run.lent)

    def reserve_static_training(self, gpus: int, now: float = 0.0) -> list[tuple[str, int]]:
        """The static-split baseline: take ``gpus`` idle GPUs out of the inference pool for training, never
        preempted. Whole nodes from the end of the node list first (the packers fill from the front), so the
        split is as contiguous as the nodes allow. Call before any replica is placed."""
        taken: list[tuple[str, int]] = []
        for node in reversed(list(self.inventory.nodes.values())):
            for dev in reversed(range(node.gpu_count)):
                if len(taken) >= gpus:
                    break
                if not self.inventory.device(node.name, dev).idle:
                    continue
                self._take_gpu(node.name, dev, static_owner(node.name, dev), STATIC_TRAINING_MODEL, 1)
                self.static.add((node.name, dev))
                taken.append((node.name, dev))
        if len(taken) < gpus:
            raise ValueError(f"a static split of {gpus} GPUs needs that many idle GPUs; {len(taken)} were")
        self.pool_gpus -= len(taken)
        for node in dict.fromkeys(n for n, _ in taken):
            self._fill(node, now, lent=False)
        return taken

    def finish(self, end: float) -> None:
        """End of the run: handle what is due by ``end``; jobs still running keep their work (nothing preempted
        it), so it counts as goodput."""
        self.advance(end)
        for run in self.runs.values():
            if run.stop_at is None:
                self._goodput(run, end)

    def lose_node(self, node: str, now: float) -> dict[str, int]:
        """A node fails at ``now`` (scenario events, :mod:`autoscaler.sim.scenario`): every replica on it is lost
        at once (starting, serving or draining; its slot freed, no drain), and its GPUs leave the inference pool:
        each is held by a ``lost:`` owner so that nothing is placed there again. GPUs held by training (lent or a
        static split) or with pinned MIG instances are left as they are (training on a lost node is not modelled).
        Returns ``{"replicas": lost, "gpus": removed}``."""
        if node not in self.inventory.nodes:
            raise KeyError(f"no node {node!r} in the cluster")
        lost = 0
        for i, reps in enumerate(self.replicas):
            for r in [r for r in reps.values() if any(s.node == node for s in r.slots)]:  # (a group: any pod)
                if r.routable:
                    self._route(i, r, -1)
                self._release(i, r)  # pending readiness/release events find no replica and are skipped
                self._obs[i] = None
                lost += 1
        gpus = 0
        gpu = self.inventory.gpu_of(node)
        for dev in range(self.inventory.nodes[node].gpu_count):
            d = self.inventory.device(node, dev)
            if d.entries or d.pinned:
                continue
            self.inventory.allocate(Slot.whole(node, dev, gpu), f"lost:{node}/{dev}", model=LOST_MODEL)
            gpus += 1
        self.pool_gpus -= gpus
        self.lost_nodes.append(node)
        self._idle = None
        return {"replicas": lost, "gpus": gpus}

    def busy_gpus(self, busy_servers: np.ndarray) -> np.ndarray:
        """Per model, the GPU-equivalents busy: what its replicas hold x their utilisation, ``busy_servers`` (the
        engine's mean busy servers) / the servers of every replica holding a slot (starting and draining ones
        included: a replica starting up is held and idle); capped at what it holds."""
        if self._gpu_per_server is None:  # only after a slot was taken or released: a tick costs two array ops
            self._gpu_per_server = self.held_by_model / np.maximum(self.n_held * self._servers, 1.0)
        return np.minimum(busy_servers * self._gpu_per_server, self.held_by_model)

    def gpus_allocated(self) -> float:
        """GPU-equivalents held by replicas (starting, serving or draining): what the fleet pays for."""
        return self._gpus_held

    def idle_by_kind(self) -> np.ndarray:
        """Per GPU kind (``gpu_kinds`` order): idle reserved GPU-equivalents, the free capacity on nodes that
        hold at least one replica (:func:`autoscaler.accounting.cost.idle_reserved`). Compute is not oversubscribed (the
        inventory's default), so a node's free capacity is its GPUs less what its replicas and training hold."""
        if self._idle is None:
            # GPUs held whole by training (lent or statically split) are used, as in cost.idle: already lent
            # capacity is not idle.
            used = self._node_held + self._node_training
            free = np.where(self._node_replicas > 0, np.maximum(self._node_gpus - used, 0.0), 0.0)
            self._idle = np.bincount(self._node_kind, weights=free, minlength=len(self.gpu_kinds))
        return self._idle

    def preplace(self, model: str, slots: Sequence[Slot], now: float = 0.0,
                 groups: Sequence[tuple[Slot, ...]] = ()) -> None:
        """Start the run with a warm cluster: replicas already Ready on ``slots`` (not scale events); ``groups``
        (replicas that are groups of pods): each replica's other pods' slots, in the order of ``slots``."""
        i = self.index[model]
        for n, slot in enumerate(slots):
            rid = f"{model}-init{n}"
            group = tuple(groups[n]) if n < len(groups) else ()
            # (a name the inventory cannot read the model from)
            allocate_group(self.inventory, (slot, *group), rid, model=model)
            self._hold(i, slot, 1)
            for g in group:
                self._hold(i, g, 1, replica=False)
            r = self.replicas[i][rid] = SimReplica(rid, slot, now, now, speed=self._speed(i, slot), group_slots=group)
            self._route(i, r, 1)
        self.desired[i] = len(self.replicas[i])
        self._obs[i] = None
        if slots:  # the running Deployment's template asks for the slots it runs on
            self.templates[model] = slot_template(slots, self.inventory, {})
            self._templates_view = None
