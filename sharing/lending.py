"""Lending reserved-but-idle inference GPUs to preemptible training, and taking them back ahead of need.

One module: the lending plan is one decision (what is idle, what to lend, what to reclaim and in which order)
over one view of the inventory and the borrowers, and its steps are the functions below.

Pure: a function of the inventory, what inference will need over the reclaim horizon, what is lent now and the
training workloads on it (no I/O, no clock: ``now`` is an argument). The decision core calls it after packing
(``autoscaler/decision/lend.py`` turns models into requests and the result into ``LendGpus`` / ``ReclaimGpus`` of
``autoscaler/api/plan.py``); the simulator and the Kubernetes actuator carry out its decisions.

Terms (issue 8):
- **reserved**: what sizing needs at the upper quantile over the reclaim horizon (reclaim deadline + each model's
  cold start) plus a **warm buffer** that is never lent;
- **idle** = reserved minus in use; **lendable** = idle shaped into blocks training can use (whole GPUs),
  preferring blocks the packer keeps contiguous (whole idle nodes first);
- **reclaim ahead of need**: when inference will need lent capacity within (reclaim deadline + cold start), reclaim
  now; **anti-thrash**: a minimum lend duration and hysteresis; **preemption order**: the least training work lost
  (time since the last checkpoint x GPUs), then the smallest job.

How :func:`plan_lending` decides, per tick (all GPU counts are whole GPUs, per GPU kind, since a replica of one
kind cannot use another's idle GPUs):

1. **Warm buffer**: ``policy.buffer_gpus(inference GPUs of the kind)`` idle GPUs are set aside first, on the nodes
   with the fewest idle GPUs (fragments), so whole idle nodes stay lendable. They are never lent, and the trial
   below cannot use them: they are what absorbs growth beyond the forecast while a reclaim is under way.
2. **Trial packing** of the replicas inference needs (``need``: replicas unplaceable now, then the extra replicas
   the forecast says are needed within the reclaim horizon), with the packer the core uses, on a copy of the
   inventory: first where lent GPUs stay lent; what does not fit there is placed on lent GPUs released one node
   at a time, the cheapest to take back first (GPUs already being reclaimed, then GPUs nobody trains on, then
   the least training work lost; GPUs of workloads whose grace exceeds the deadline last, as their reclaim would
   be late). Every lent GPU such a placement lands on is reclaimed now (reason ``shortfall`` or ``forecast``),
   whatever ``min_lend_s`` says. Trying lent GPUs last means a reclaim happens only when the unlent capacity
   (less the buffer) cannot hold the need, and choosing them ourselves (not by packer tie-breaks) takes back the
   cheapest.
3. **Surplus** = idle GPUs after the trial (the buffer included, GPUs coming back from reclaims included) minus
   the buffer. Below 0 the buffer is short: lent GPUs that have been lent at least ``min_lend_s`` are reclaimed
   voluntarily (reason ``hysteresis``), cheapest first. Above ``hysteresis_gpus`` (and only for a kind with no
   reclaim this tick or in flight, and not while ``hold``), the idle GPUs beyond the buffer are lent: whole
   idle nodes first (counting GPUs already lent as part of the node), then the nodes with the most idle GPUs,
   each block a contiguous run of at least ``min_block_gpus``. Lending all of the surplus puts the count at
   the bottom of the band: one GPU more of inference eats into the buffer (reclaimed after ``min_lend_s``),
   and lending resumes only once more than ``hysteresis_gpus`` are idle again.
4. **What a reclaim preempts**: the workloads on the chosen GPUs, in :func:`preemption_order`. For a voluntary
   reclaim the GPUs are chosen so that the least work is lost: GPUs of workloads whose grace period exceeds the
   reclaim deadline first (they break the contract; the executor should never have put them there), then lent
   GPUs nobody runs on (on the nodes with the fewest lent GPUs first, so big lent blocks stay whole), then the
   GPUs of workloads in preemption order.

``whole_nodes_only`` (Kubernetes "pods" mode: a node label cannot split a node): only nodes whose every GPU is
idle or lent are lent, and a reclaim takes back all lent GPUs of the node.

A lent GPU is in the inventory as a whole slot of owner :func:`lent_owner` under the model :data:`LENT_MODEL`
(:func:`allocate_lent` / :func:`release_lent`), so the packer never places inference there.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import NamedTuple

from sharing.packer import Packer
from sharing.slots import DeviceState, Inventory, NodeSpec, Slot, SlotRequest

LENT_MODEL = "(lent)"  # the inventory's model name for GPUs lent to training: no inference replica lands there
_BUFFER_MODEL = "(warm buffer)"  # the trial's placeholder for the buffer GPUs (never leaves plan_lending)

Key = tuple[str, int]  # (node, GPU index)

class ReclaimReason(StrEnum):
    """Why lent GPUs are taken back (``ReclaimGpus.reason``; exported as the ``reason`` label of
    ``slotwise_reclaims_total``). The first two are urgent (inference needs the GPUs); the others wait for
    ``min_lend_s``."""

    SHORTFALL = "shortfall"  # replicas unplaceable now would land on them
    FORECAST = "forecast"  # inference will need them within the reclaim horizon
    HYSTERESIS = "hysteresis"  # the warm buffer fell short (the surplus is gone)
    DISABLED = "disabled"  # lending was turned off


class LendReason(StrEnum):
    """Why idle GPUs are lent (``LendGpus.reason``)."""

    SURPLUS = "surplus"  # idle beyond the warm buffer (and the hysteresis band)


_URGENCY = {ReclaimReason.SHORTFALL: 0, ReclaimReason.FORECAST: 1}


def lent_owner(node: str, device: int) -> str:
    """The inventory owner of a lent GPU."""
    return f"lent:{node}/{device}"


def lent_slot(inventory: Inventory, node: str, device: int) -> Slot:
    """The whole-GPU slot a lent GPU is held by."""
    return Slot.whole(node, device, inventory.gpu_of(node))


def allocate_lent(inventory: Inventory, node: str, device: int) -> None:
    """Mark a GPU lent in ``inventory`` (raises :class:`~sharing.slots.AllocationError` if it is not free).

    The model is given explicitly: the owner name alone would read as model ``lent:<node>`` by the owner naming
    convention.
    """
    inventory.allocate(lent_slot(inventory, node, device), lent_owner(node, device), model=LENT_MODEL)


def release_lent(inventory: Inventory, node: str, device: int) -> None:
    """Take a lent GPU back in ``inventory`` (raises KeyError if it is not lent there)."""
    slot = _lent_entry(inventory.device(node, device))
    if slot is None:
        raise KeyError(f"GPU {device} on {node!r} is not lent")
    inventory.release(slot, lent_owner(node, device))


def _lent_entry(d: DeviceState) -> Slot | None:
    owner = lent_owner(d.node, d.index)
    for o, s in d.entries:
        if o == owner:
            return s
    return None


@dataclass(frozen=True)
class LendingPolicy:
    """The lending settings (``lending:`` in the controller's settings file and the chart's values).

    ``max_reclaim_s`` is the published reclaim contract (``maxReclaimSeconds``): from the decision to reclaim until
    the capacity is free. Only workloads whose termination grace period fits in it may run on lent capacity.
    """

    enabled: bool = False
    mode: str = "pods"  # "pods": label/taint lendable nodes, evict through the Eviction API; "kueue": ClusterQueue
    max_reclaim_s: float = 120.0
    warm_buffer_gpus: float = 1.0  # GPU-equivalents never lent (absorbs growth during a reclaim)
    warm_buffer_fraction: float = 0.02  # ... or this share of the inference GPUs, whichever is larger
    min_lend_s: float = 600.0  # a block lent stays lent at least this long unless inference needs it
    hysteresis_gpus: float = 1.0  # lend more only when the lendable surplus exceeds this
    min_block_gpus: float = 1.0  # the smallest block worth lending (training wants whole GPUs)
    # Kueue mode: the inference ClusterQueue whose lendingLimit the controller sets, and its flavor/resource
    kueue_cluster_queue: str = "inference"
    kueue_flavor: str = "default-flavor"
    kueue_resource: str = "nvidia.com/gpu"
    # Opt-in: a reclaim whose evictions a PodDisruptionBudget still refuses this many seconds after its deadline
    # deletes those training pods (the budget is overridden; grace capped by max_reclaim_s). None: never.
    force_after_s: float | None = None

    def __post_init__(self) -> None:
        if self.mode not in ("pods", "kueue"):
            raise ValueError(f"lending mode must be 'pods' or 'kueue', got {self.mode!r}")
        for name in ("max_reclaim_s", "warm_buffer_gpus", "warm_buffer_fraction", "min_lend_s", "hysteresis_gpus",
                     "min_block_gpus"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"lending {name} must be a finite number >= 0, got {value!r}")
        if self.max_reclaim_s <= 0:
            raise ValueError("lending max_reclaim_s must be > 0")
        if self.force_after_s is not None and not (math.isfinite(self.force_after_s) and self.force_after_s >= 0):
            raise ValueError(f"lending force_after_s must be a finite number >= 0 or unset, got {self.force_after_s!r}")

    def buffer_gpus(self, inference_gpus: float) -> int:
        """Whole idle GPUs of one GPU kind never lent: ``max(warm_buffer_gpus, warm_buffer_fraction x
        inference_gpus)`` rounded up (a replica needing a whole GPU cannot use two halves)."""
        return max(0, math.ceil(max(self.warm_buffer_gpus, self.warm_buffer_fraction * inference_gpus) - 1e-9))

    @property
    def min_block(self) -> int:
        """``min_block_gpus`` in whole GPUs (at least 1)."""
        return max(1, math.ceil(self.min_block_gpus - 1e-9))


# --------------------------------------------------------------------------------------------- training side


@dataclass(frozen=True)
class Borrower:
    """A training workload on lent GPUs, as the plan needs it (the decision core converts its own snapshot type:
    ``sharing`` never imports ``autoscaler``).

    ``devices``: the GPUs it runs on, when the executor knows them; otherwise ``nodes`` and ``gpus`` are spread
    over the lent GPUs of those nodes (:func:`attribute`).
    """

    name: str
    gpus: float
    nodes: tuple[str, ...] = ()
    devices: tuple[Key, ...] = ()
    grace_s: float = 30.0
    started_at: float | None = None
    last_checkpoint_at: float | None = None

    def work_at_risk(self, now: float) -> float:
        """GPU-seconds lost if preempted now: GPUs x time since the last checkpoint (or since the start when it
        has none; 0 when neither is known)."""
        since = self.last_checkpoint_at if self.last_checkpoint_at is not None else self.started_at
        return self.gpus * max(0.0, now - since) if since is not None else 0.0


def preemption_order(borrowers: Iterable[Borrower], now: float) -> list[Borrower]:
    """Least training work lost first (GPUs x time since the last checkpoint), then fewer GPUs, then by name."""
    return sorted(borrowers, key=lambda b: (b.work_at_risk(now), b.gpus, b.name))


def attribute(borrowers: Iterable[Borrower], lent: Collection[Key]) -> dict[Key, list[Borrower]]:
    """Lent GPU -> the borrowers on it.

    Known devices are taken as they are (those not lent are ignored: training on other capacity is not ours to
    reclaim). A borrower known only by its nodes gets ``ceil(gpus / nodes)`` lent GPUs on each of its nodes, the
    least occupied first (by index among equals): in "pods" mode a reclaim takes the whole node anyway, and
    otherwise this is the best guess a node-level view allows.
    """
    lent_set = set(lent)
    by_dev: dict[Key, list[Borrower]] = {}
    by_node: dict[str, list[int]] = {}
    for node, dev in sorted(lent_set):
        by_node.setdefault(node, []).append(dev)
    vague: list[Borrower] = []
    for b in borrowers:
        if b.devices:
            for k in dict.fromkeys(b.devices):
                if k in lent_set:
                    by_dev.setdefault(k, []).append(b)
        elif b.nodes:
            vague.append(b)
    for b in sorted(vague, key=lambda b: b.name):
        per_node = max(1, math.ceil(b.gpus / len(b.nodes) - 1e-9))
        for node in dict.fromkeys(b.nodes):
            devs = by_node.get(node)
            if not devs:
                continue
            ranked = sorted(devs, key=lambda i, node=node: (len(by_dev.get((node, i), ())), i))  # type: ignore[misc]
            for i in ranked[:per_node]:
                by_dev.setdefault((node, i), []).append(b)
    return by_dev


# ------------------------------------------------------------------------------------------------- the plan


class NeedRequest(NamedTuple):
    """One replica inference needs: ``reason`` is ``shortfall`` (unplaceable now) or ``forecast`` (needed within
    the reclaim horizon)."""

    request: SlotRequest
    reason: ReclaimReason


@dataclass(frozen=True)
class LendBlock:
    node: str
    devices: tuple[int, ...]
    gpu_model: str


@dataclass(frozen=True)
class ReclaimBlock:
    node: str
    devices: tuple[int, ...]
    workloads: tuple[str, ...]  # to preempt, in preemption order
    reason: ReclaimReason


@dataclass(frozen=True)
class LendingPlan:
    lend: tuple[LendBlock, ...] = ()
    reclaim: tuple[ReclaimBlock, ...] = ()
    buffer: Mapping[str, int] = field(default_factory=dict)  # GPU kind -> idle GPUs never lent
    # GPU kind -> idle GPUs beyond the buffer after the trial (negative: the buffer is short by that many)
    surplus: Mapping[str, int] = field(default_factory=dict)
    needed: Mapping[Key, ReclaimReason] = field(default_factory=dict)  # lent GPUs the trial placements need
    unplaced: int = 0  # needed replicas that fit nowhere, lent GPUs included
    trialled: bool = False  # whether the trial packing ran (skipped when nothing could be lent or reclaimed)

    @property
    def lent_gpus(self) -> int:
        return sum(len(b.devices) for b in self.lend)

    @property
    def reclaimed_gpus(self) -> int:
        return sum(len(b.devices) for b in self.reclaim)


def _shape(req: SlotRequest) -> tuple:
    return (req.memory_gib, req.compute_fraction, req.gpus, req.kinds, req.gpu_models)


def _idle_keys(inv: Inventory, kind: str) -> list[Key]:
    """Idle GPUs (no allocation, no MIG instance) of one kind, from the inventory's state groups (no full scan)."""
    out: list[Key] = []
    for sig, members in inv.device_groups(kind).items():
        if sig.idle:
            for p in members:
                d = inv.device_at(p)
                out.append((d.node, d.index))
    return out


def _idle_and_buffer(
    inventory: Inventory, kinds: list[str], lent_set: set[Key], kind_of: Mapping[Key, str], policy: LendingPolicy
) -> tuple[dict[str, list[Key]], dict[str, int]]:
    """Per GPU kind: the idle GPUs not lent, and the warm buffer (from the inference GPUs: all others not lent)."""
    lent_count: dict[str, int] = {}
    for k in lent_set:
        lent_count[kind_of[k]] = lent_count.get(kind_of[k], 0) + 1
    idle_before: dict[str, list[Key]] = {}
    buffer: dict[str, int] = {}
    for kind in kinds:
        idle = [k for k in _idle_keys(inventory, kind) if k not in lent_set]
        idle_before[kind] = idle
        total = sum(len(m) for m in inventory.device_groups(kind).values())
        buffer[kind] = policy.buffer_gpus(total - len(idle) - lent_count.get(kind, 0))
    return idle_before, buffer


def could_lend(inventory: Inventory, policy: LendingPolicy) -> bool:
    """Whether some GPU kind has more idle GPUs beyond its warm buffer than the hysteresis, before any trial
    packing (the trial only takes idle GPUs away): with nothing lent, False means this tick neither lends nor
    reclaims, so the caller may skip working out what inference needs. Nothing may be lent in ``inventory``."""
    kinds = list(inventory.kind_node_counts())
    idle, buffer = _idle_and_buffer(inventory, kinds, set(), {}, policy)
    return any(len(idle[k]) - buffer[k] > policy.hysteresis_gpus for k in kinds)


def plan_lending(
    inventory: Inventory,
    lent: Mapping[Key, float],
    policy: LendingPolicy,
    now: float,
    *,
    packer: Packer,
    need: Sequence[NeedRequest] = (),
    borrowers: Sequence[Borrower] = (),
    whole_nodes_only: bool = False,
    hold: bool = False,
    reclaiming: Collection[Key] = (),
    eligible: Callable[[DeviceState], bool] | None = None,
) -> LendingPlan:
    """What to lend and what to reclaim this tick (see the module docstring for the rules).

    ``inventory``: after this tick's placements, lent GPUs allocated as :func:`allocate_lent` does (not changed:
    the trial works on a copy). ``lent``: (node, GPU) -> when lent. ``need``: replicas inference needs, urgent
    ones first. ``hold``: lend nothing new (a forecast is missing: never lend on a guess); reclaims go on.
    ``reclaiming``: lent GPUs whose reclaim is already under way (not asked again, counted as coming back).
    ``eligible``: which idle GPUs training may run on (default: any idle GPU).
    """
    kinds = list(inventory.kind_node_counts())
    devices = inventory.devices
    lent_keys = [k for k in lent if k in devices]  # a GPU gone from the inventory cannot be reclaimed here
    lent_set = set(lent_keys)
    kind_of = {k: devices[k].gpu_model for k in lent_keys}
    in_flight = {k for k in reclaiming if k in lent_set}

    if not policy.enabled:
        reclaim = {k: ReclaimReason.DISABLED for k in lent_keys if k not in in_flight}
        return LendingPlan(reclaim=_reclaim_blocks(reclaim, borrowers, lent_keys, now))

    idle_before, buffer = _idle_and_buffer(inventory, kinds, lent_set, kind_of, policy)
    h = policy.hysteresis_gpus
    if not lent_keys and (hold or all(len(idle_before[k]) - buffer[k] <= h for k in kinds)):
        # Nothing lent and nothing to lend: the trial could only shrink the surplus. (The common case with
        # lending on and a busy cluster: it keeps the stage to a few dict look-ups per GPU kind.)
        return LendingPlan(buffer=buffer, surplus={k: len(idle_before[k]) - buffer[k] for k in kinds})

    trial = inventory.copy()
    # 1. The warm buffer, set aside on the nodes with the fewest idle GPUs so that whole idle nodes stay lendable.
    held = _hold_buffer(trial, inventory, kinds, idle_before, buffer)

    # 2. Trial packing: unlent capacity first; what does not fit there, on lent GPUs released one node at a time,
    # the cheapest to take back first.
    dev_borrowers = attribute(borrowers, lent_keys)
    needed: dict[Key, ReclaimReason] = {}
    leftovers = _trial_pack(trial, need, packer)
    if leftovers and lent_keys:
        leftovers = _trial_on_lent(trial, leftovers, lent_keys, in_flight, dev_borrowers, policy, now, packer,
                                   needed)

    # 3. Urgent reclaims: lent GPUs the trial needs (in "pods" mode with the rest of their node).
    lent_by_node: dict[str, list[Key]] = {}
    for k in sorted(lent_keys):
        lent_by_node.setdefault(k[0], []).append(k)
    reclaim = _urgent_reclaims(needed, in_flight, lent_by_node, whole_nodes_only)

    order = preemption_order({b.name: b for bs in dev_borrowers.values() for b in bs}.values(), now)
    surplus: dict[str, int] = {}
    lend: list[LendBlock] = []
    for kind in kinds:
        idle_after = [k for k in _idle_keys(trial, kind) if k not in lent_set]
        back = sum(1 for k in lent_keys if kind_of[k] == kind and (k in reclaim or k in in_flight)
                   and k not in needed)
        s = len(idle_after) + len(held[kind]) + back - buffer[kind]
        surplus[kind] = s
        if s < 0:
            # The buffer is short: take back the cheapest lent GPUs that have served their minimum lend time.
            ripe = [k for k in lent_keys if kind_of[k] == kind and k not in reclaim and k not in in_flight
                    and now - lent[k] >= policy.min_lend_s - 1e-9]
            if whole_nodes_only:
                chosen = _voluntary_nodes(ripe, -s, lent_by_node, policy, now, dev_borrowers, reclaim, in_flight)
            else:
                chosen = _voluntary_gpus(ripe, -s, lent_by_node, order, dev_borrowers, policy.max_reclaim_s)
            for k in chosen:
                reclaim[k] = ReclaimReason.HYSTERESIS
        elif s > h and not hold:
            busy = any(kind_of[k] == kind for k in (*reclaim, *in_flight))
            if not busy:
                cands = [k for k in idle_after if eligible is None or eligible(trial.device(*k))]
                lend.extend(_lend_blocks(trial, cands, s, lent_by_node, policy.min_block, whole_nodes_only))

    return LendingPlan(
        lend=tuple(lend),
        reclaim=_reclaim_blocks(reclaim, borrowers, lent_keys, now, dev_borrowers),
        buffer=buffer,
        surplus=surplus,
        needed=needed,
        unplaced=len(leftovers),
        trialled=True,
    )


def _hold_buffer(trial: Inventory, inventory: Inventory, kinds: Sequence[str], idle_before: Mapping[str, list[Key]],
                 buffer: Mapping[str, int]) -> dict[str, list[Key]]:
    """Set each kind's warm buffer aside in ``trial`` (allocated to a placeholder), on the nodes with the fewest idle
    GPUs first, so that whole idle nodes stay lendable. Returns the GPUs held per kind."""
    held: dict[str, list[Key]] = {}
    for kind in kinds:
        idle = idle_before[kind]
        per_node: dict[str, int] = {}
        for node, _ in idle:
            per_node[node] = per_node.get(node, 0) + 1
        chosen = sorted(idle, key=lambda k: (per_node[k[0]], inventory.position(*k)))[: buffer[kind]]
        held[kind] = chosen
        for node, dev in chosen:
            trial.allocate(Slot.whole(node, dev, trial.gpu_of(node)), f"buffer:{node}/{dev}", model=_BUFFER_MODEL)
    return held


def _trial_pack(trial: Inventory, need: Sequence[NeedRequest], packer: Packer) -> list[NeedRequest]:
    """Place ``need`` on ``trial``'s unlent capacity, in order; returns what did not fit (a shape that failed once
    is not tried again this tick)."""
    failed: set[tuple] = set()
    leftovers: list[NeedRequest] = []
    seq = 0
    for nr in need:
        req = nr.request
        shape = _shape(req)
        slot = None if shape in failed else packer.place(trial, req)
        if slot is None:
            failed.add(shape)
            leftovers.append(nr)
            continue
        seq += 1
        trial.allocate(slot, f"trial:{req.model}:{seq}", model=req.model)
    return leftovers


def _urgent_reclaims(needed: Mapping[Key, ReclaimReason], in_flight: Collection[Key],
                     lent_by_node: Mapping[str, list[Key]], whole_nodes_only: bool) -> dict[Key, ReclaimReason]:
    """The lent GPUs the trial needs, not already being reclaimed; in "pods" mode with the rest of their node (the
    node's most urgent reason)."""
    reclaim: dict[Key, ReclaimReason] = {k: r for k, r in needed.items() if k not in in_flight}
    if whole_nodes_only:
        for node in {k[0] for k in reclaim}:
            reason = min((r for k, r in reclaim.items() if k[0] == node), key=lambda r: _URGENCY.get(r, 9))
            for k in lent_by_node[node]:
                if k not in in_flight:
                    reclaim.setdefault(k, reason)
    return reclaim


_TRIAL_NODES = 4  # nodes of lent GPUs tried per replica before it counts as unplaceable


def _urgent_cost(k: Key, in_flight: Collection[Key], on: Mapping[Key, list[Borrower]], policy: LendingPolicy,
                 now: float) -> tuple:
    """How dear a lent GPU is to take back when inference needs it: one already coming back costs nothing, then a
    GPU nobody trains on, then the least training work lost; a workload whose grace period exceeds the deadline
    last (its reclaim would be late, and inference is waiting)."""
    if k in in_flight:
        return (0, 0.0)
    bs = on.get(k, ())
    if not bs:
        return (1, 0.0)
    late = any(b.grace_s > policy.max_reclaim_s for b in bs)
    return (3 if late else 2, sum(b.work_at_risk(now) for b in bs))


def _trial_on_lent(
    trial: Inventory,
    leftovers: list[NeedRequest],
    lent_keys: list[Key],
    in_flight: Collection[Key],
    on: Mapping[Key, list[Borrower]],
    policy: LendingPolicy,
    now: float,
    packer: Packer,
    needed: dict[Key, ReclaimReason],
) -> list[NeedRequest]:
    """Place the replicas that did not fit on unlent capacity, releasing lent GPUs in ``trial`` as they are
    needed: per replica, on the cheapest nodes (:func:`_urgent_cost` of their cheapest lent GPU; fewer lent GPUs
    first, so big lent blocks stay whole) whose GPUs could hold it, its GPU count of the cheapest lent GPUs there,
    then the rest of the node. Released GPUs a replica lands on go into ``needed``; the others are lent again at
    the end. Releasing only what is needed keeps a tick's cost in proportion to what it reclaims, not to what is
    lent. Returns the replicas that fit nowhere."""
    cost = {k: _urgent_cost(k, in_flight, on, policy, now) for k in lent_keys}
    by_node: dict[str, list[Key]] = {}
    for k in sorted(lent_keys, key=lambda k: (cost[k], k)):
        by_node.setdefault(k[0], []).append(k)
    node_order = sorted(by_node, key=lambda n: (cost[by_node[n][0]], len(by_node[n]), n))
    released: dict[Key, Slot] = {}
    fits_kind: dict[tuple, bool] = {}
    failed: set[tuple] = set()
    rest: list[NeedRequest] = []

    def could_hold(req: SlotRequest, node: str) -> bool:
        # Would the replica fit on idle GPUs like this node's lent ones? (A one-node scratch inventory: cheap, and
        # it spares releasing GPUs a replica can never use, e.g. non-MIG GPUs for a MIG-only replica.)
        d = trial.device(*by_node[node][0])
        n = min(len(by_node[node]), max(req.gpus, 1))
        key = (_shape(req), d.gpu_model, d.mig_enabled, n)
        hit = fits_kind.get(key)
        if hit is None:
            scratch = Inventory.from_nodes([NodeSpec("scratch", d.gpu_model, n, d.mig_enabled)], trial.catalog,
                                           trial.share_reserve_gib, trial.max_compute_oversubscription)
            hit = fits_kind[key] = packer.place(scratch, req) is not None
        return hit

    def release(keys: Iterable[Key]) -> None:
        for k in keys:
            if k in released:
                continue
            slot = _lent_entry(trial.device(*k))
            if slot is not None:
                trial.release(slot, lent_owner(*k))
                released[k] = slot

    seq = 0
    for nr in leftovers:
        req = nr.request
        shape = _shape(req)
        slot = packer.place(trial, req) if released and shape not in failed else None
        if slot is None and shape not in failed:
            tried = 0
            for node in node_order:
                if tried >= _TRIAL_NODES:
                    break
                held = [k for k in by_node[node] if k not in released]
                if not held or not could_hold(req, node):
                    continue
                tried += 1
                first = max(1, req.gpus)
                for batch in (held[:first], held[first:]):
                    if not batch:
                        continue
                    release(batch)
                    slot = packer.place(trial, req)
                    if slot is not None:
                        break
                if slot is not None:
                    break
            if slot is None:
                failed.add(shape)
        if slot is None:
            rest.append(nr)
            continue
        seq += 1
        trial.allocate(slot, f"trial-lent:{req.model}:{seq}", model=req.model)
        for i in slot.devices:
            k = (slot.node, i)
            if k in released and k not in needed:
                needed[k] = nr.reason
    for k, slot in released.items():
        if k not in needed:
            trial.allocate(slot, lent_owner(*k), model=LENT_MODEL)
    return rest


def _lend_blocks(
    inv: Inventory,
    cands: list[Key],
    budget: int,
    lent_by_node: Mapping[str, list[Key]],
    min_block: int,
    whole_nodes_only: bool,
) -> list[LendBlock]:
    """Blocks of at most ``budget`` GPUs in all: nodes that become wholly lent first (their idle GPUs plus those
    lent already cover the node), then the nodes with the most idle GPUs; within a node the longest contiguous
    runs of GPU indices, each at least ``min_block`` long."""
    by_node: dict[str, list[int]] = {}
    for node, dev in cands:
        by_node.setdefault(node, []).append(dev)

    def whole(node: str) -> bool:
        return len(by_node[node]) + len(lent_by_node.get(node, ())) == inv.nodes[node].gpu_count

    ranked = sorted(by_node, key=lambda n: (not whole(n), -len(by_node[n]), inv.position(n, 0)))
    out: list[LendBlock] = []
    for node in ranked:
        if budget < min_block:
            break
        devs = sorted(by_node[node])
        if whole_nodes_only:
            if not whole(node) or len(devs) > budget:
                continue
            runs = [devs]  # the whole node goes in one action, contiguous or not
        else:
            runs = sorted(_runs(devs), key=lambda r: (-len(r), r[0]))
        for run in runs:
            take = run if whole_nodes_only else run[: budget]
            if len(take) < min_block:
                continue
            out.append(LendBlock(node, tuple(take), inv.nodes[node].gpu_model))
            budget -= len(take)
            if budget < min_block:
                break
    return out


def _runs(devs: list[int]) -> list[list[int]]:
    """Sorted GPU indices split into runs of consecutive indices."""
    runs: list[list[int]] = []
    for d in devs:
        if runs and runs[-1][-1] == d - 1:
            runs[-1].append(d)
        else:
            runs.append([d])
    return runs


def _voluntary_gpus(
    ripe: list[Key],
    count: int,
    lent_by_node: Mapping[str, list[Key]],
    order: list[Borrower],
    dev_borrowers: Mapping[Key, list[Borrower]],
    max_reclaim_s: float,
) -> list[Key]:
    """``count`` of the ``ripe`` lent GPUs whose reclaim loses the least (see the module docstring, step 4)."""
    ripe_set = set(ripe)
    chosen: dict[Key, None] = {}

    def take(keys: Iterable[Key]) -> bool:
        for k in keys:
            if len(chosen) >= count:
                return True
            if k in ripe_set:
                chosen.setdefault(k)
        return len(chosen) >= count

    on: dict[str, list[Key]] = {}
    for k, bs in dev_borrowers.items():
        for b in bs:
            on.setdefault(b.name, []).append(k)
    if take(k for b in order if b.grace_s > max_reclaim_s for k in sorted(on[b.name])):
        return list(chosen)
    if take(sorted((k for k in ripe if not dev_borrowers.get(k)), key=lambda k: (len(lent_by_node[k[0]]), k))):
        return list(chosen)
    take(k for b in order for k in sorted(on[b.name]))
    return list(chosen)


def _voluntary_nodes(
    ripe: list[Key],
    count: int,
    lent_by_node: Mapping[str, list[Key]],
    policy: LendingPolicy,
    now: float,
    dev_borrowers: Mapping[Key, list[Borrower]],
    reclaim: Mapping[Key, ReclaimReason],
    in_flight: Collection[Key],
) -> list[Key]:
    """Whole nodes (every lent GPU on them ripe) covering ``count`` GPUs, cheapest first: a node holding a
    workload whose grace exceeds the deadline, then by training work lost, then fewer GPUs of training."""
    ripe_set = set(ripe)
    costs = []
    for node in {k[0] for k in ripe}:
        keys = [k for k in lent_by_node[node] if k not in reclaim and k not in in_flight]
        if not all(k in ripe_set for k in keys):
            continue
        on = {b.name: b for k in keys for b in dev_borrowers.get(k, ())}.values()
        breaks = any(b.grace_s > policy.max_reclaim_s for b in on)
        costs.append(((not breaks, sum(b.work_at_risk(now) for b in on), sum(b.gpus for b in on), node), keys))
    chosen: list[Key] = []
    for _, keys in sorted(costs):
        if len(chosen) >= count:
            break
        chosen.extend(keys)
    return chosen


def _reclaim_blocks(
    reclaim: Mapping[Key, ReclaimReason],
    borrowers: Sequence[Borrower],
    lent_keys: Collection[Key],
    now: float,
    dev_borrowers: Mapping[Key, list[Borrower]] | None = None,
) -> tuple[ReclaimBlock, ...]:
    """One block per (node, reason), naming the workloads on its GPUs in preemption order."""
    if not reclaim:
        return ()
    if dev_borrowers is None:
        dev_borrowers = attribute(borrowers, lent_keys)
    groups: dict[tuple[str, ReclaimReason], list[int]] = {}
    for (node, dev), reason in reclaim.items():
        groups.setdefault((node, reason), []).append(dev)
    out = []
    for (node, reason), devs in sorted(groups.items(), key=lambda g: (_URGENCY.get(g[0][1], 9), g[0][0])):
        devs.sort()
        on = {b.name: b for d in devs for b in dev_borrowers.get((node, d), ())}
        names = tuple(b.name for b in preemption_order(on.values(), now))
        out.append(ReclaimBlock(node, tuple(devs), names, reason))
    return tuple(out)
