"""Arbitration among models when GPUs run out: team quotas, priorities and SLO damage (issue 9).

The decision core sizes every model first (the policy, inside its rails); the replicas asked for beyond the
current ones are *asks*. When they do not all fit, :func:`arbitrate` decides who gets the GPUs, one replica at a
time, and who is preempted, and says why for every replica refused. Pure: no I/O, no clock.

The rules (``mode="slo"``, the default). A model's SLO is judged with the queueing model of
:mod:`autoscaler.estimation.capacity` (attainment: the share of its requests within the SLO latency) at two loads:
the load its
policy sized for (the forecast's upper quantile: its *tail*) and the load it expects (the forecast's median, at least
what it observes now). Values are shares of a model's requests, so every model counts the same, as in the summed SLO
attainment a platform is judged by.

1. **Guarantee first.** A replica that keeps its team inside its guaranteed GPUs (GPU-equivalents: a slot counts
   by its GPU fraction) is served before any replica that borrows. A team never holds more than its guarantee +
   borrowing limit (``borrowing_limit``).
2. **Then what fixes an SLO miss.** Among the rest, a replica without which the model would miss its SLO at its
   tail is served before headroom, by priority, then by **SLO damage per GPU**: the share of the model's requests
   the replicas still to come bring inside the SLO, averaged over them, per GPU-equivalent (the model that would
   miss worst, per GPU it costs, first), then the team that borrowed least lately (fair between equal teams over
   time).
3. **Capacity being freed before new preemptions.** An ask that does not fit now but fits on GPUs already being
   freed (replicas draining, lent training GPUs) waits for them: on lent GPUs the lend stage reclaims them
   (``reclaiming``); lent training is always reclaimed before any inference is preempted. The GPUs a waiting ask
   counts on are claimed: an ask ranked after it may not take them (``outranked``).
4. **Preemption, only to fix an SLO miss.** It may drain replicas of models of strictly lower priority
   (``priority``), or, inside its team's guarantee, replicas of teams above their guarantee (``guarantee``, at
   once: borrowed capacity is lent on that condition), never a victim's team below its guarantee nor a model
   below its floor, priority victims only after ``min_runtime_s``, at most ``max_preemptions_per_tick``. A model
   that would miss at its *expected* load may take any such replica, the least harm first (replica by replica or
   a whole shared device, whichever costs less, then trimmed to what the slot needs), unless the victims lose more
   than it gains, each model weighted by 1 + its priority (``damage``). A model that would miss only at its
   *tail* may take only replicas their own model can spare even at its tail (``headroom`` otherwise): so a victim
   does not miss a tick later and preempt further down in turn. Nothing is preempted for headroom. No flapping: a
   victim's model ranks below its preemptor by the same rules next tick.

Baselines, for the benchmark: ``mode="priority"`` (Kueue/KAI-style: the same quotas, then priority and arrival
order, preempting lower priority for any ask, with no SLO knowledge) and ``mode="partition"`` (static per-team
partitions: each team's guarantee, scaled to the cluster, is its hard limit; no borrowing, no preemption).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from autoscaler.api.plan import PreemptionReason, RemoveReplica, Shortfall, ShortfallCause
from autoscaler.estimation.capacity import ServiceProfile, attainment, min_replicas_for_slo
from sharing.lending import LENT_MODEL
from sharing.packer import Packer
from sharing.slots import Inventory, Slot, SlotRequest

ARBITRATION_MODES = ("slo", "priority", "partition")


@dataclass(frozen=True)
class TeamQuota:
    """A team's GPU quota for inference, in GPU-equivalents: ``guaranteed_gpus`` it always gets when its models
    need them, and at most ``borrowing_limit_gpus`` more of what others do not use (None: no limit)."""

    name: str
    guaranteed_gpus: float = 0.0
    borrowing_limit_gpus: float | None = None

    def __post_init__(self) -> None:
        if not self.name or not isinstance(self.name, str):
            raise ValueError(f"team name must be a non-empty string, got {self.name!r}")
        if not (isinstance(self.guaranteed_gpus, int | float) and math.isfinite(self.guaranteed_gpus)
                and self.guaranteed_gpus >= 0):
            raise ValueError(f"team {self.name}: guaranteed_gpus must be a number >= 0, got {self.guaranteed_gpus!r}")
        b = self.borrowing_limit_gpus
        if b is not None and not (isinstance(b, int | float) and math.isfinite(b) and b >= 0):
            raise ValueError(f"team {self.name}: borrowing_limit_gpus must be a number >= 0 (or absent: no limit), "
                             f"got {b!r}")

    @property
    def limit_gpus(self) -> float:
        """The most the team may hold (inf: no limit)."""
        return math.inf if self.borrowing_limit_gpus is None else self.guaranteed_gpus + self.borrowing_limit_gpus


@dataclass(frozen=True)
class ArbitrationPolicy:
    """How the decision core arbitrates when GPUs run out (see the module docstring).

    ``teams``: the quotas; a model whose team is not listed has no guarantee and no borrowing limit.
    ``preemption``: False never drains inference for other inference. ``min_runtime_s``: a replica younger than
    this is not preempted for priority. ``fairness_half_life_s``: how long a team's borrowing is remembered when
    ordering equal asks.
    """

    mode: str = "slo"
    teams: tuple[TeamQuota, ...] = ()
    preemption: bool = True
    min_runtime_s: float = 300.0
    max_preemptions_per_tick: int = 8
    fairness_half_life_s: float = 3600.0

    def __post_init__(self) -> None:
        if self.mode not in ARBITRATION_MODES:
            raise ValueError(f"arbitration mode must be one of {', '.join(ARBITRATION_MODES)}, got {self.mode!r}")
        names = [t.name for t in self.teams]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"teams listed twice: {', '.join(dup)}")
        for knob in ("min_runtime_s", "fairness_half_life_s"):
            v = getattr(self, knob)
            if not (isinstance(v, int | float) and math.isfinite(v) and v >= 0):
                raise ValueError(f"{knob} must be a number >= 0, got {v!r}")
        if not (isinstance(self.max_preemptions_per_tick, int) and self.max_preemptions_per_tick >= 0):
            raise ValueError(f"max_preemptions_per_tick must be an integer >= 0, got {self.max_preemptions_per_tick!r}")
        if not isinstance(self.preemption, bool):
            raise ValueError(f"preemption must be true or false, got {self.preemption!r}")

    def quota(self, team: str) -> TeamQuota:
        for t in self.teams:
            if t.name == team:
                return t
        return TeamQuota(team)

    @classmethod
    def from_mapping(cls, arbitration: Mapping[str, Any] | None, teams: Any = None) -> ArbitrationPolicy:
        """From configuration: ``arbitration`` (mode, preemption, min_runtime_s, max_preemptions_per_tick,
        fairness_half_life_s) and ``teams`` (a list of {name, guaranteed_gpus, borrowing_limit_gpus}). Raises
        ValueError naming the key for anything unknown or invalid."""
        doc = dict(arbitration or {})
        allowed = {"mode", "preemption", "min_runtime_s", "max_preemptions_per_tick", "fairness_half_life_s"}
        unknown = sorted(set(doc) - allowed)
        if unknown:
            raise ValueError(f"arbitration: unknown key(s) {', '.join(unknown)} (known: {', '.join(sorted(allowed))})")
        quotas = []
        if teams is not None and not isinstance(teams, list | tuple):
            raise ValueError(f"teams must be a list of {{name, guaranteed_gpus, borrowing_limit_gpus}}, got {teams!r}")
        for i, t in enumerate(teams or ()):
            if not isinstance(t, Mapping):
                raise ValueError(f"teams[{i}] must be a mapping, got {t!r}")
            extra = sorted(set(t) - {"name", "guaranteed_gpus", "borrowing_limit_gpus"})
            if extra:
                raise ValueError(f"teams[{i}]: unknown key(s) {', '.join(extra)} "
                                 "(known: name, guaranteed_gpus, borrowing_limit_gpus)")
            try:
                quotas.append(TeamQuota(t.get("name", ""), t.get("guaranteed_gpus", 0.0),
                                        t.get("borrowing_limit_gpus")))
            except ValueError as e:
                raise ValueError(f"teams[{i}]: {e}") from None
        return cls(teams=tuple(quotas), **doc)


# ---------------------------------------------------------------------------------------------------
# The algorithm

_EPS = 1e-9
_MAX_VICTIM_TRIALS = 48  # victims tried per preemption (each is one packer call on a trial inventory)
_MAX_DEVICE_TRIALS = 8  # devices tried per preemption when clearing whole devices


@dataclass
class Ask:
    """Replicas one model's policy asked for beyond its current ones.

    ``wanted``: capacity in replicas of the kind the policy sized for (a slot of another speed counts for
    ``speed(slot)``); at most ``max_new`` replicas. ``load_rps``, ``profile`` and ``slo_target`` (the SLO
    percentile / 100) give the SLO damage: the queueing model's attainment at the load the policy sized for.
    ``order``: arrival order (the priority baseline serves equal priorities first come, first served)."""

    model: str
    team: str
    priority: int
    request: SlotRequest
    wanted: float
    current: int
    max_new: int
    load_rps: float
    profile: ServiceProfile | None
    slo_target: float
    order: int = 0
    expected_rps: float | None = None  # the expected load (median forecast, at least observed); None: load_rps
    speed: Callable[[Slot], float] | None = None


@dataclass(frozen=True)
class Candidate:
    """A running replica that may be preempted: its model, team, priority, id, slot and start time."""

    model: str
    team: str
    priority: int
    replica_id: str
    slot: Slot
    started_at: float


@dataclass(frozen=True)
class ModelLoad:
    """A model's damage inputs as last sized: the load, the capacity profile, the SLO target, its floor."""

    load_rps: float
    profile: ServiceProfile | None
    slo_target: float
    active: int
    min_replicas: int
    expected_rps: float | None = None


@dataclass
class ArbitrationState:
    """What arbitration remembers between ticks: each team's recent borrowing (GPU-seconds above its guarantee,
    decayed with ``fairness_half_life_s``), the fairness tie-break among equal asks."""

    borrowed: dict[str, float] = field(default_factory=dict)
    at: float | None = None


@dataclass
class ArbitrationResult:
    placed: dict[str, list[tuple[str, Slot]]] = field(default_factory=dict)  # model -> (replica id, slot) to start
    shortfalls: list[Shortfall] = field(default_factory=list)
    preemptions: list[RemoveReplica] = field(default_factory=list)
    team_gpus: dict[str, float] = field(default_factory=dict)  # GPU-equivalents held per team after the tick


def request_fraction(req: SlotRequest) -> float:
    """The GPU-equivalents a replica of ``req`` takes before it is placed (a whole-only request: its GPUs;
    else its compute share): the guarantee and limit checks of an ask that has no slot yet."""
    if req.whole_only:
        return float(req.gpus)
    return req.compute_fraction * req.gpus


def _weight(priority: int) -> float:
    """A model's SLO counts this much when a preemption weighs the preemptor's gain against the victims' loss."""
    return 1.0 + max(priority, 0)


def _served(load: float, replicas: int, profile: ServiceProfile) -> float:
    """Requests per second ``replicas`` serve at ``load`` (all of it, or their capacity when overloaded)."""
    return min(load, max(replicas, 0) * profile.concurrency / profile.mean_s)


def _attainment(load: float, replicas: int, profile: ServiceProfile | None) -> float:
    if profile is None or not load > 0 or not math.isfinite(load):
        return 1.0
    return attainment(load, replicas, profile)


@dataclass
class _Taken:
    """Victims chosen so far in one search: replicas per model, GPU-equivalents per team."""

    models: dict[str, int] = field(default_factory=dict)
    teams: dict[str, float] = field(default_factory=dict)

    def add(self, c: Candidate) -> None:
        self.models[c.model] = self.models.get(c.model, 0) + 1
        self.teams[c.team] = self.teams.get(c.team, 0.0) + c.slot.gpu_fraction


def _share_gained(p: _Progress, load: float) -> float:
    """The share of the model's requests its next replica brings inside the SLO at ``load``: the share the replicas
    still to come (up to what it needs) bring, averaged over them -- one replica of a model several short of its
    need brings none inside on its own, yet it is part of the way there -- at least the share it serves while the
    model stays overloaded."""
    a = p.ask
    if a.profile is None or not load > 0:
        return 0.0
    n = p.replicas
    room = max(1, p.remaining())
    n_to = max(n + 1, min(min_replicas_for_slo(load, a.profile, n + room), n + room))
    inside = _attainment(load, n_to, a.profile) - _attainment(load, n, a.profile)
    return max(inside / (n_to - n), (_served(load, n + 1, a.profile) - _served(load, n, a.profile)) / load)


@dataclass
class _Progress:
    ask: Ask
    frac: float  # GPU-equivalents of the next replica (estimate until one is placed)
    placed: int = 0
    waiting: int = 0  # replicas granted on capacity being freed (reclaiming / preempting)
    units: float = 0.0
    done: bool = False

    @property
    def replicas(self) -> int:
        return self.ask.current + self.placed + self.waiting

    def remaining(self) -> int:
        """Replicas still to grant: the capacity left, at one unit per replica."""
        left = math.ceil(self.ask.wanted - self.units - self.waiting - _EPS)
        return max(0, min(left, self.ask.max_new - self.placed - self.waiting))


Views = Callable[[], tuple[Mapping[str, ModelLoad], list[Candidate]]]


class LazyMapping(Mapping[str, ModelLoad]):
    """A model's :class:`ModelLoad` computed on first lookup (a preemption looks at a few models of thousands)."""

    def __init__(self, compute: Callable[[str], ModelLoad]) -> None:
        self._compute = compute
        self._cache: dict[str, ModelLoad] = {}

    def __getitem__(self, model: str) -> ModelLoad:
        hit = self._cache.get(model)
        if hit is None:
            hit = self._cache[model] = self._compute(model)
        return hit

    def __iter__(self) -> Iterator[str]:
        return iter(self._cache)

    def __len__(self) -> int:
        return len(self._cache)


class _Arbiter:
    def __init__(self, inventory: Inventory, packer: Packer, policy: ArbitrationPolicy, now: float,
                 team_of: Mapping[str, str], held: Mapping[str, float], views: Views,
                 freeing: list[tuple[str, Slot]], state: ArbitrationState,
                 name_replica: Callable[[str], str]) -> None:
        self.inv = inventory
        self.packer = packer
        self.policy = policy
        self.now = now
        self.team_of = team_of
        self._views = views
        self._loads: Mapping[str, ModelLoad] | None = None
        self._candidates: list[Candidate] | None = None
        self.delta: dict[str, int] = {}  # replicas placed (+) and preempted (-) this tick, per model
        self.freeing = freeing
        self.state = state
        self.name_replica = name_replica
        self.result = ArbitrationResult()
        self.future: Inventory | None = None  # capacity once what is being freed is free (built on first need)
        self.unplaceable: set[tuple] = set()  # request shapes that failed on ``inv`` (free capacity only shrinks)
        self.budget = policy.max_preemptions_per_tick
        # GPUs a waiting grant counts on (being freed for it): an ask ranked after it may not take them, or the
        # capacity a preemption freed would go to the next small ask and the preemption would repeat.
        self.claimed: set[tuple[str, int]] = set()
        self.held = held
        self.usage = dict(held)  # GPU-equivalents per team, not counting what is being freed
        self.caps = self._caps()

    # -- the views preemption needs, built on first use ----------------------------------------------------
    @property
    def loads(self) -> Mapping[str, ModelLoad]:
        if self._loads is None:
            self._loads, self._candidates = self._views()
        return self._loads

    @property
    def candidates(self) -> list[Candidate]:
        if self._candidates is None:
            self._loads, self._candidates = self._views()
        return self._candidates

    def n_active(self, model: str) -> int:
        """The model's replicas after this tick's placements and preemptions so far."""
        return self.loads[model].active + self.delta.get(model, 0)

    # -- quotas ---------------------------------------------------------------------------------------
    def _caps(self) -> dict[str, tuple[float, float]]:
        """(guarantee, limit) per team. Partition mode: the listed guarantees scaled to the cluster are hard
        limits (a team not listed has no partition)."""
        teams = set(self.team_of.values()) | {t.name for t in self.policy.teams}
        if self.policy.mode != "partition":
            return {t: (q.guaranteed_gpus, q.limit_gpus) for t in teams for q in (self.policy.quota(t),)}
        total = sum(t.guaranteed_gpus for t in self.policy.teams)
        scale = self.inv.gpus_total / total if total > 0 else 0.0
        out = {}
        for t in teams:
            share = self.policy.quota(t).guaranteed_gpus * scale
            out[t] = (share, share)
        return out

    def within_guarantee(self, team: str, frac: float) -> bool:
        return self.usage.get(team, 0.0) + frac <= self.caps[team][0] + _EPS

    def over_limit(self, team: str, frac: float) -> bool:
        return self.usage.get(team, 0.0) + frac > self.caps[team][1] + _EPS

    # -- ranking ---------------------------------------------------------------------------------------
    def misses(self, p: _Progress) -> bool:
        """Without the next replica the model misses its SLO at the load it was sized for (its forecast's upper
        quantile): what ranks free capacity."""
        a = p.ask
        return _attainment(a.load_rps, p.replicas, a.profile) < a.slo_target - _EPS

    def would_miss(self, p: _Progress) -> bool:
        """Without the next replica the model misses its SLO at the load it expects (the forecast's median, at
        least the observed load): what justifies a preemption. Draining another model's replicas for the tail
        of one's own forecast would turn a risk into a certain loss."""
        a = p.ask
        load = a.load_rps if a.expected_rps is None else a.expected_rps
        return _attainment(load, p.replicas, a.profile) < a.slo_target - _EPS

    def gain_per_gpu(self, p: _Progress) -> float:
        """What the next replica is worth at the model's tail, per GPU-equivalent it takes (:func:`_share_gained`):
        the ranking of free capacity."""
        return _share_gained(p, p.ask.load_rps) / max(p.frac, _EPS)

    def share_gained(self, p: _Progress) -> float:
        """What the next replica is worth at the model's expected load: what a preemption for it is weighed by."""
        a = p.ask
        return _share_gained(p, a.load_rps if a.expected_rps is None else a.expected_rps)

    def key(self, p: _Progress) -> tuple:
        a = p.ask
        tier = 0 if self.within_guarantee(a.team, p.frac) else 1
        mode = self.policy.mode
        if mode == "slo":
            return (tier, 0 if self.misses(p) else 1, -a.priority, -self.gain_per_gpu(p),
                    self.state.borrowed.get(a.team, 0.0), a.order)
        if mode == "priority":
            return (tier, -a.priority, a.order)
        return (-a.priority, a.order)

    # -- the loop --------------------------------------------------------------------------------------
    def run(self, asks: list[Ask]) -> ArbitrationResult:
        if not self._serve_in_order(asks):
            self._ranked(asks)
        for team in self.caps:
            self.result.team_gpus[team] = self.usage.get(team, 0.0)
        return self.result

    def _serve_in_order(self, asks: list[Ask]) -> bool:
        """Every ask in full, in the order given, or nothing (False, the inventory as it was): when all fit, the
        order does not matter and no ranking is paid for (most ticks of a cluster that is not full)."""
        log: list[tuple[Ask, str, Slot]] = []
        ok = True
        for a in asks:
            p = _Progress(a, request_fraction(a.request))
            while ok and p.remaining() > 0:
                slot = self.packer.place(self.inv, a.request)
                if slot is None or self.over_limit(a.team, slot.gpu_fraction):
                    ok = False
                    break
                owner = self.name_replica(a.model)
                self.inv.allocate(slot, owner, model=a.model)
                self.usage[a.team] = self.usage.get(a.team, 0.0) + slot.gpu_fraction
                log.append((a, owner, slot))
                p.placed += 1
                p.units += 1.0 if a.speed is None else a.speed(slot)
            if ok and math.ceil(a.wanted - p.units - _EPS) > 0:
                ok = False  # slower slots and max replicas reached: say so on the ranked path
            if not ok:
                break
        if not ok:
            for a, owner, slot in reversed(log):
                self.inv.release(slot, owner)
                self.usage[a.team] -= slot.gpu_fraction
            self.usage = dict(self.held)
            return False
        for a, owner, slot in log:
            self.result.placed.setdefault(a.model, []).append((owner, slot))
        return True

    def _ranked(self, asks: list[Ask]) -> None:
        heap: list[tuple[tuple, int, _Progress]] = []
        progress = [_Progress(a, request_fraction(a.request)) for a in asks]
        for i, p in enumerate(progress):
            if p.remaining() > 0:
                heapq.heappush(heap, (self.key(p), i, p))
        while heap:
            key, i, p = heapq.heappop(heap)
            fresh = self.key(p)
            if heap and fresh > key and fresh > heap[0][0]:
                heapq.heappush(heap, (fresh, i, p))  # its rank fell (its team passed its guarantee...)
                continue
            self.step(p)
            if not p.done and p.remaining() > 0:
                heapq.heappush(heap, (self.key(p), i, p))
        for p in progress:
            a = p.ask
            short = math.ceil(a.wanted - p.units - p.waiting - _EPS)
            if not p.done and short > 0:  # slower slots than it was sized for, and max replicas reached
                self.result.shortfalls.append(Shortfall(
                    a.model, short, f"the slots it got are slower than those it was sized for, and its "
                                    f"{a.current + a.max_new} max replicas are reached", ShortfallCause.MAX_REPLICAS,
                    a.team, self.within_guarantee(a.team, 0.0)))

    def refuse(self, p: _Progress, cause: ShortfallCause, why: str) -> None:
        missing = p.remaining()
        p.done = True
        if missing <= 0:
            return
        a = p.ask
        self.result.shortfalls.append(Shortfall(a.model, missing, why, cause, a.team,
                                                self.within_guarantee(a.team, p.frac)))

    def grant_waiting(self, p: _Progress, slot: Slot, cause: ShortfallCause, why: str) -> None:
        a = p.ask
        assert self.future is not None
        self.future.allocate(slot, f"{a.model}/(waiting-{len(self.result.shortfalls)}-{p.waiting})", model=a.model)
        self.claimed.update((slot.node, i) for i in slot.devices)
        self.usage[a.team] = self.usage.get(a.team, 0.0) + slot.gpu_fraction
        p.waiting += 1
        p.frac = slot.gpu_fraction
        within = self.within_guarantee(a.team, 0.0)
        self.result.shortfalls.append(Shortfall(a.model, 1, why, cause, a.team, within))

    def step(self, p: _Progress) -> None:
        a = p.ask
        team = a.team
        if self.over_limit(team, p.frac):
            limit = self.caps[team][1]
            what = "partition" if self.policy.mode == "partition" else "guarantee + borrowing limit"
            self.refuse(p, ShortfallCause.BORROWING_LIMIT,
                        f"team {team} holds {self.usage.get(team, 0.0):.2f} GPUs of its {what} {limit:.2f}")
            return
        req = a.request
        shape = (req.memory_gib, req.compute_fraction, req.gpus, req.kinds, req.gpu_models)
        slot = None if shape in self.unplaceable else self.packer.place(self.inv, req)
        if slot is not None and self.claimed.intersection((slot.node, i) for i in slot.devices):
            self.refuse(p, ShortfallCause.OUTRANKED, "the free GPU slot it fits is being freed for a model ranked "
                                                     "ahead")
            return
        if slot is not None:
            if self.over_limit(team, slot.gpu_fraction):
                self.refuse(p, ShortfallCause.BORROWING_LIMIT,
                            f"team {team} holds {self.usage.get(team, 0.0):.2f} GPUs; the slot found "
                            f"({slot.gpu_fraction:.2f}) would pass its limit {self.caps[team][1]:.2f}")
                return
            owner = self.name_replica(a.model)
            self.inv.allocate(slot, owner, model=a.model)
            # The future view keeps this tick's waiting grants; a placement now on a GPU one of them counts on
            # (a draining slice's neighbour) is left out of it: the grant is looked at again next tick anyway.
            if self.future is not None and self.future.fits(slot):
                self.future.allocate(slot, owner, model=a.model)
            self.result.placed.setdefault(a.model, []).append((owner, slot))
            self.usage[team] = self.usage.get(team, 0.0) + slot.gpu_fraction
            self.delta[a.model] = self.delta.get(a.model, 0) + 1
            p.placed += 1
            p.frac = slot.gpu_fraction
            p.units += 1.0 if a.speed is None else a.speed(slot)
            return
        self.unplaceable.add(shape)
        future = self._future()
        slot = self.packer.place(future, req)
        if slot is not None:
            lent = any(self.inv.model_of(o) == LENT_MODEL for i in slot.devices
                       for o, _ in self.inv.device(slot.node, i).entries)
            if lent:
                self.grant_waiting(p, slot, ShortfallCause.RECLAIMING, "lent training GPUs are being reclaimed for it")
            else:
                self.grant_waiting(p, slot, ShortfallCause.PREEMPTING, "waiting for replicas that are draining")
            return
        self.preempt_for(p)

    def _future(self) -> Inventory:
        if self.future is None:
            fut = self.inv.copy()
            for owner, slot in self.freeing:
                fut.release(slot, owner)
            for owner, slot in list(fut.allocations()):
                if fut.model_of(owner) == LENT_MODEL:
                    fut.release(slot, owner)
            self.future = fut
        return self.future

    # -- preemption ------------------------------------------------------------------------------------
    def preempt_for(self, p: _Progress) -> None:
        a = p.ask
        policy = self.policy
        if not policy.preemption or policy.mode == "partition":
            self.refuse(p, ShortfallCause.UNPLACEABLE, "no free GPU slot fits the replica")
            return
        within = self.within_guarantee(a.team, p.frac)
        # A miss at the expected load may cost others SLO; a miss only at the forecast's tail may take only
        # replicas that are spare for their own model (no SLO damage at its expected load).
        certain = policy.mode == "priority" or self.would_miss(p)
        miss = certain or self.misses(p)
        eligible: list[tuple[Candidate, PreemptionReason]] = []
        lower = young = False  # lower-ranked replicas exist / some are too young to preempt
        for c in self.candidates:
            if c.model == a.model or self.n_active(c.model) <= self.loads[c.model].min_replicas:
                continue
            if self.usage.get(c.team, 0.0) - c.slot.gpu_fraction < self.caps[c.team][0] - _EPS:
                continue  # never below the victim team's guarantee
            if within and c.team != a.team:
                reason = PreemptionReason.GUARANTEE
            elif c.priority < a.priority:
                reason = PreemptionReason.PRIORITY
            else:
                continue
            lower = True
            if not miss:
                continue
            if reason is not PreemptionReason.GUARANTEE and self.now - c.started_at < policy.min_runtime_s:
                young = True
                continue
            eligible.append((c, reason))
        if not eligible:
            if lower and not miss:
                self.refuse(p, ShortfallCause.HEADROOM, "the model meets its SLO without it: nothing is preempted "
                                                        "for headroom, and no free GPU slot fits the replica")
            elif young:
                self.refuse(p, ShortfallCause.MIN_RUNTIME, f"the lower-ranked replicas it could preempt have run "
                                                           f"less than {policy.min_runtime_s:g} s")
            else:
                self.refuse(p, ShortfallCause.UNPLACEABLE, "no free GPU slot fits the replica and nothing ranked "
                                                           "below it holds GPUs it may preempt")
            return
        if self.budget <= 0:
            self.refuse(p, ShortfallCause.OUTRANKED, f"the {policy.max_preemptions_per_tick} preemptions of this "
                                                     "tick went to models ranked ahead")
            return
        found = self._victims(a.request, eligible, certain)
        if found is None:
            if certain:
                self.refuse(p, ShortfallCause.UNPLACEABLE, "no free GPU slot fits the replica, even after "
                                                           "preempting every replica it may")
            else:
                self.refuse(p, ShortfallCause.HEADROOM, "it would miss its SLO only at the forecast's upper "
                                                        "quantile, and no lower-ranked replica is spare enough "
                                                        "to preempt for that")
            return
        slot, needed = found
        if policy.mode == "slo" and certain and not within:
            gain = _weight(a.priority) * self.share_gained(p)
            loss = self._set_loss(needed, weighted=True)
            if gain < loss - _EPS:
                self.refuse(p, ShortfallCause.DAMAGE, f"preempting would cost the victims more of their SLO than it "
                                                      f"brings (priority-weighted {loss:.3g} > {gain:.3g})")
                return
        if len(needed) > self.budget:
            self.refuse(p, ShortfallCause.OUTRANKED, f"it needs {len(needed)} preemptions; {self.budget} are left "
                                                     "this tick")
            return
        future = self._future()
        for c, reason in needed:
            future.release(c.slot, c.replica_id)
            self.candidates.remove(c)
            self.usage[c.team] = self.usage.get(c.team, 0.0) - c.slot.gpu_fraction
            self.delta[c.model] = self.delta.get(c.model, 0) - 1
            self.budget -= 1
            if reason is PreemptionReason.GUARANTEE:
                why = f"team {a.team} is inside its guarantee and team {c.team} is borrowing"
            else:
                why = f"priority {a.priority} > {c.priority} and {a.model} would miss its SLO"
            self.result.preemptions.append(RemoveReplica(
                c.model, c.replica_id, preempted_by=a.model, reason=str(reason),
                message=f"replica {c.replica_id} of {c.model} (team {c.team}) preempted for {a.model} "
                        f"(team {a.team}): {why}"))
        self.grant_waiting(p, slot, ShortfallCause.PREEMPTING,
                           f"preempted {len(needed)} replica(s) of lower rank; waiting for them to drain")

    # -- choosing victims --------------------------------------------------------------------------------
    def _loss(self, c: Candidate, taken: int) -> float:
        """What taking one more replica of ``c``'s model (after ``taken``) costs, as a share of its requests at
        its expected load (pushed out of the SLO, at least no longer served), per GPU-equivalent freed. Without
        SLO knowledge (the priority baseline): 0."""
        if self.policy.mode != "slo":
            return 0.0
        ld = self.loads[c.model]
        n = self.n_active(c.model) - taken
        load = ld.load_rps if ld.expected_rps is None else ld.expected_rps
        if ld.profile is None or not load > 0:
            return 0.0
        inside = _attainment(load, n, ld.profile) - _attainment(load, n - 1, ld.profile)
        value = max(inside, (_served(load, n, ld.profile) - _served(load, n - 1, ld.profile)) / load)
        return round(value / max(c.slot.gpu_fraction, _EPS), 9)

    def _spare(self, c: Candidate, taken: int) -> bool:
        """``c``'s model still meets its SLO without one more replica (after ``taken``) even at the load it was
        sized for (its forecast's upper quantile): what a model that would miss only at its own forecast's tail
        may take. (Judged at the victim's expected load instead, a victim on the edge misses a tick later and
        preempts further down in turn.)"""
        if self.policy.mode != "slo":
            return False
        ld = self.loads[c.model]
        n = self.n_active(c.model) - taken
        return _attainment(ld.load_rps, n - 1, ld.profile) >= ld.slo_target - _EPS

    def _set_loss(self, victims: list[tuple[Candidate, PreemptionReason]], weighted: bool = False) -> float:
        """The shares of their models' requests the victims take out of the SLO together (optionally weighted by
        their priority)."""
        taken: dict[str, int] = {}
        total = 0.0
        for c, _ in victims:
            w = _weight(c.priority) if weighted else 1.0
            total += w * self._loss(c, taken.get(c.model, 0)) * c.slot.gpu_fraction
            taken[c.model] = taken.get(c.model, 0) + 1
        return total

    def _allowed(self, c: Candidate, took: _Taken, certain: bool) -> bool:
        """With the victims ``took`` already holds: never a model below its floor nor a team below its guarantee;
        a victim whose model would then miss its SLO only for a certain miss."""
        ld = self.loads[c.model]
        taken = took.models.get(c.model, 0)
        if self.n_active(c.model) - taken - 1 < ld.min_replicas:
            return False
        left = self.usage.get(c.team, 0.0) - took.teams.get(c.team, 0.0) - c.slot.gpu_fraction
        if left < self.caps[c.team][0] - _EPS:
            return False
        return certain or self._spare(c, taken)

    def _victims(self, req: SlotRequest, eligible: list[tuple[Candidate, PreemptionReason]],
                 certain: bool) -> tuple[Slot, list[tuple[Candidate, PreemptionReason]]] | None:
        """The slot and the least harmful set of victims that frees it, or None. Two searches, the cheaper kept:
        replica by replica, least harm first (a model's next replica costs more than its last, so one model is
        not emptied while others lose nothing), which suits a small slot; and device by device, the device whose
        victims cost least in total first, which suits a whole GPU on a device shared by many small replicas. The
        set is then trimmed: a victim the slot does not need after all stays."""
        future = self._future()
        options: list[tuple[float, int, Slot, list[tuple[Candidate, PreemptionReason]]]] = []

        def keep(slot: Slot, released: list[tuple[Candidate, PreemptionReason]]) -> None:
            touched = {(slot.node, i) for i in slot.devices}
            needed = [(c, r) for c, r in released if any((c.slot.node, i) in touched for i in c.slot.devices)]
            options.append((self._set_loss(needed), len(needed), slot, needed))

        # replica by replica
        trial = future.copy()
        took = _Taken()
        released: list[tuple[Candidate, PreemptionReason]] = []
        pool = list(eligible)
        while pool and len(released) < _MAX_VICTIM_TRIALS:
            best, best_key = -1, None
            for k, (c, r) in enumerate(pool):
                if not self._allowed(c, took, certain):
                    continue
                loss = self._loss(c, took.models.get(c.model, 0))
                key = (0 if r is PreemptionReason.GUARANTEE else 1, loss, c.priority, -c.started_at)
                if best_key is None or key < best_key:
                    best, best_key = k, key
            if best < 0:
                break
            c, r = pool.pop(best)
            took.add(c)
            trial.release(c.slot, c.replica_id)
            released.append((c, r))
            slot = self.packer.place(trial, req)
            if slot is not None:
                keep(slot, released)
                break
        # device by device
        by_device: dict[tuple[str, tuple[int, ...]], list[tuple[Candidate, PreemptionReason]]] = {}
        for c, r in eligible:
            by_device.setdefault((c.slot.node, c.slot.devices), []).append((c, r))
        groups = []
        for members in by_device.values():
            group = _Taken()
            ok = True
            for c, _ in members:
                if not self._allowed(c, group, certain):
                    ok = False
                    break
                group.add(c)
            if ok:
                groups.append((self._set_loss(members), len(members), members))
        groups.sort(key=lambda g: (g[0], g[1]))
        for _, _, members in groups[:_MAX_DEVICE_TRIALS]:
            trial = future.copy()
            for c, _ in members:
                trial.release(c.slot, c.replica_id)
            slot = self.packer.place(trial, req)
            if slot is not None and slot.node == members[0][0].slot.node and set(slot.devices) & set(
                    members[0][0].slot.devices):
                keep(slot, members)
                break
        if not options:
            return None
        _, _, slot, needed = min(options, key=lambda o: (o[0], o[1]))
        # trim: put back every victim the slot still fits without, the most harmful first
        trial = future.copy()
        for c, _ in needed:
            trial.release(c.slot, c.replica_id)
        kept = []
        for c, r in sorted(needed, key=lambda v: -self._loss(v[0], 0)):
            if trial.fits(c.slot):
                trial.allocate(c.slot, c.replica_id, model=c.model)
                if trial.fits(slot):
                    continue
                trial.release(c.slot, c.replica_id)
            kept.append((c, r))
        return slot, kept

def arbitrate(
    asks: list[Ask],
    inventory: Inventory,
    packer: Packer,
    policy: ArbitrationPolicy,
    now: float,
    *,
    team_of: Mapping[str, str],
    held: Mapping[str, float],
    views: Views,
    freeing: list[tuple[str, Slot]],
    state: ArbitrationState,
    name_replica: Callable[[str], str],
) -> ArbitrationResult:
    """Serve ``asks`` on ``inventory`` (changed: each placed replica is allocated there under the id
    ``name_replica(model)`` gives) by the rules of the module docstring.

    ``team_of``: every valid model's team; ``held``: GPU-equivalents per team held by replicas not being freed
    (:func:`held_by_team` of the candidates); ``views()``: every valid model's damage inputs (``ModelLoad``) and
    the running replicas that may be preempted (not draining, not being removed this tick), asked for only when
    the asks do not all fit; ``freeing``: (owner, slot) of replicas being removed or drained (their capacity is
    coming free); ``state``: the fairness memory (updated)."""
    _remember_borrowing(state, held, policy, now)
    return _Arbiter(inventory, packer, policy, now, team_of, held, views, freeing, state, name_replica).run(asks)


def held_by_team(replicas: list[Candidate]) -> dict[str, float]:
    """GPU-equivalents the replicas hold, per team (a slot counts by its GPU fraction)."""
    out: dict[str, float] = {}
    for c in replicas:
        out[c.team] = out.get(c.team, 0.0) + c.slot.gpu_fraction
    return out


def _remember_borrowing(state: ArbitrationState, held: Mapping[str, float], policy: ArbitrationPolicy,
                        now: float) -> None:
    """Decay each team's borrowed GPU-seconds and add what it borrows now (held above its guarantee)."""
    dt = 0.0 if state.at is None else max(0.0, now - state.at)
    state.at = now
    if dt <= 0:
        return
    half = policy.fairness_half_life_s
    decay = 0.5 ** (dt / half) if half > 0 else 0.0
    for team in set(state.borrowed) | set(held):
        over = max(0.0, held.get(team, 0.0) - policy.quota(team).guaranteed_gpus)
        value = state.borrowed.get(team, 0.0) * decay + over * dt
        if value > _EPS:
            state.borrowed[team] = value
        else:
            state.borrowed.pop(team, None)
