"""The simulated cluster: GPU nodes, replicas on slots, cold start and drain.

It is both the simulated Cluster port (``snapshot``) and the simulated Actuator (``apply``), so the
decision core drives it exactly as it drives Kubernetes. A placed replica becomes Ready after its
model's load time (``cold_start_s``; zero for a policy that asks for ``instant_start``); a removed
replica stops receiving traffic at once and frees its slot when its in-flight work is done
(bounded by the drain timeout).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from autoscaler.plan import PlaceReplica, Plan, Reason, RemoveReplica, ScaleModel, Shortfall, UpdateStatus
from autoscaler.snapshot import ClusterSnapshot, ModelObservation, Replica
from autoscaler.spec import ModelSpec, SpecError
from sharing.slots import Inventory, NodeSpec, Slot

_READY, _RELEASE = 0, 1


@dataclass
class SimReplica:
    replica_id: str
    slot: Slot
    started_at: float
    ready_at: float
    release_at: float | None = None  # set when draining


class SimCluster:
    def __init__(
        self,
        nodes: Sequence[NodeSpec],
        models: Sequence[str],
        specs: dict[str, ModelSpec | SpecError],
        drain_s: np.ndarray,
        instant_start: bool = False,
    ) -> None:
        self.inventory = Inventory.from_nodes(nodes)
        self.models = list(models)
        self.index = {m: i for i, m in enumerate(self.models)}
        self.specs = specs
        self.drain_s = drain_s  # per model: how long a removed replica keeps its slot
        self.instant_start = instant_start
        self.replicas: list[dict[str, SimReplica]] = [{} for _ in self.models]
        self.desired = np.zeros(len(self.models), dtype=int)
        self.shortfall = np.zeros(len(self.models), dtype=int)
        self.scale_events = 0
        self.reasons: dict[str, int] = {}
        self._obs: list[ModelObservation | None] = [None] * len(self.models)
        self.routable = np.zeros(len(self.models), dtype=int)
        self._gpus_held = 0.0  # sum of gpu_fraction over held slots, kept incrementally
        # Cost accounting, also incremental (updated on allocate/release only, so a tick reads arrays):
        # GPU-equivalents held per (model, GPU kind), and per node what replicas hold there, for the idle
        # reserved capacity (free GPU-equivalents on nodes with at least one replica; see autoscaler/cost.py).
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
        self._events: list[tuple[float, int, int, str]] = []  # (time, kind, model, replica) heap

    # -- ClusterPort ---------------------------------------------------------------------------
    def snapshot(self, now: float) -> ClusterSnapshot:
        models = {}
        for i, name in enumerate(self.models):
            obs = self._obs[i]
            if obs is None:
                obs = self._observe(i, now)
                self._obs[i] = obs
            models[name] = obs
        return ClusterSnapshot(now=now, models=models, inventory=self.inventory)

    def _observe(self, i: int, now: float) -> ModelObservation:
        name = self.models[i]
        spec = self.specs[name]
        reps = tuple(
            Replica(r.replica_id, r.slot, ready=r.ready_at <= now, started_at=r.started_at,
                    draining=r.release_at is not None)
            for r in self.replicas[i].values()
        )
        if isinstance(spec, SpecError):
            return ModelObservation(name, None, int(self.desired[i]), reps, spec_error=spec)
        return ModelObservation(name, spec, int(self.desired[i]), reps)

    # -- Actuator ------------------------------------------------------------------------------
    def apply(self, plan: Plan) -> None:
        now = plan.now
        touched = set()
        for a in plan.actions:
            match a:
                case PlaceReplica():
                    i = self.index[a.model]
                    spec = self.specs[a.model]
                    assert isinstance(spec, ModelSpec)
                    self.inventory.allocate(a.slot, a.replica_id)
                    self._hold(i, a.slot, 1)
                    ready_at = now if self.instant_start else now + spec.cold_start_s
                    self.replicas[i][a.replica_id] = SimReplica(a.replica_id, a.slot, now, ready_at)
                    heapq.heappush(self._events, (ready_at, _READY, i, a.replica_id))
                    touched.add(i)
                case RemoveReplica():
                    i = self.index[a.model]
                    r = self.replicas[i].get(a.replica_id)
                    if r is None or r.release_at is not None:
                        continue
                    if r.ready_at > now:  # never served: free at once
                        self._release(i, r)
                    else:
                        # Stop routing now; keep the slot until in-flight requests are done.
                        self.routable[i] -= 1
                        r.release_at = now + (0.0 if self.instant_start else min(a.drain_s, self.drain_s[i]))
                        heapq.heappush(self._events, (r.release_at, _RELEASE, i, r.replica_id))
                    touched.add(i)
                case ScaleModel():
                    i = self.index[a.model]
                    self.desired[i] = a.replicas
                    self.scale_events += 1
                    self.reasons[str(a.reason)] = self.reasons.get(str(a.reason), 0) + 1
                    touched.add(i)
                case Shortfall():
                    self.shortfall[self.index[a.model]] = a.missing
                case UpdateStatus() if a.reason is not Reason.UNPLACEABLE and a.model in self.index:
                    # The core re-states a model's status whenever its reason changes: once it is no
                    # longer unplaceable, its shortfall is over.
                    self.shortfall[self.index[a.model]] = 0
        for i in touched:
            self._obs[i] = None

    def _release(self, i: int, r: SimReplica) -> None:
        self.inventory.release(r.slot, r.replica_id)
        self._hold(i, r.slot, -1)
        del self.replicas[i][r.replica_id]

    def _hold(self, i: int, slot: Slot, sign: int) -> None:
        """Account a slot taken (+1) or given back (-1) by model ``i``."""
        f = slot.gpu_fraction * sign
        self._gpus_held += f
        n = self._node_index[slot.node]
        self.held[i, self._node_kind[n]] += f
        self._node_held[n] += f
        self._node_replicas[n] += sign
        self._idle = None

    # -- time ----------------------------------------------------------------------------------
    def advance(self, now: float) -> np.ndarray:
        """Apply readiness and drain completions due by ``now``; return routable replicas per model.

        Event-driven (a heap of readiness/release times), so a tick costs nothing when nothing changes.
        """
        events = self._events
        while events and events[0][0] <= now:
            _, kind, i, rid = heapq.heappop(events)
            r = self.replicas[i].get(rid)
            if r is None:
                continue
            if kind == _READY and r.release_at is None:
                self.routable[i] += 1
            elif kind == _RELEASE:
                self._release(i, r)
            self._obs[i] = None
        return self.routable

    def gpus_allocated(self) -> float:
        """GPU-equivalents held by replicas (starting, serving or draining): what the fleet pays for."""
        return self._gpus_held

    def idle_by_kind(self) -> np.ndarray:
        """Per GPU kind (``gpu_kinds`` order): idle reserved GPU-equivalents, the free capacity on nodes that
        hold at least one replica. Every slot here is a replica's and compute is not oversubscribed (the
        inventory's default), so a node's free capacity is its GPUs less what its replicas hold."""
        if self._idle is None:
            free = np.where(self._node_replicas > 0, np.maximum(self._node_gpus - self._node_held, 0.0), 0.0)
            self._idle = np.bincount(self._node_kind, weights=free, minlength=len(self.gpu_kinds))
        return self._idle

    def preplace(self, model: str, slots: Sequence[Slot], now: float = 0.0) -> None:
        """Start the run with a warm cluster: replicas already Ready on ``slots`` (not scale events)."""
        i = self.index[model]
        for n, slot in enumerate(slots):
            rid = f"{model}-init{n}"
            self.inventory.allocate(slot, rid)
            self._hold(i, slot, 1)
            self.replicas[i][rid] = SimReplica(rid, slot, now, now)
            self.routable[i] += 1
        self.desired[i] = len(self.replicas[i])
        self._obs[i] = None
