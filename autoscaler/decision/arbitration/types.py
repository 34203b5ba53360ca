"""The data in and out of :func:`~autoscaler.decision.arbitration.arbitrate`: the asks, the replicas that may be
preempted, each model's damage inputs, the fairness memory between ticks, and the result."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

from autoscaler.api.plan import RemoveReplica, Shortfall
from autoscaler.estimation.capacity import ServiceProfile
from sharing.slots import Slot, SlotRequest


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
    # Pods per replica (ModelSpec.pods_per_replica): each replica is ``pods`` slots of ``request``, placed together
    # (all or none, sharing.packer.place_group); its speed is its leader's slot's.
    pods: int = 1


@dataclass(frozen=True)
class Candidate:
    """A running replica that may be preempted: its model, team, priority, id, slot and start time; a replica that
    is a group of pods also the other pods' slots (``group_slots``), all freed with it."""

    model: str
    team: str
    priority: int
    replica_id: str
    slot: Slot
    started_at: float
    group_slots: tuple[Slot, ...] = ()

    @property
    def slots(self) -> tuple[Slot, ...]:
        return (self.slot, *self.group_slots) if self.group_slots else (self.slot,)

    @property
    def gpu_fraction(self) -> float:
        """GPU-equivalents the replica holds: all its pods' slots."""
        if not self.group_slots:
            return self.slot.gpu_fraction
        return self.slot.gpu_fraction + sum(s.gpu_fraction for s in self.group_slots)


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
    """What one tick of arbitration decided: the replicas to start, the asks refused (and why), the replicas
    preempted, and what each team holds after it."""

    placed: dict[str, list[tuple[str, Slot]]] = field(default_factory=dict)  # model -> (replica id, slot) to start
    # replica id -> the other pods' slots, for each placed replica that is a group of pods (the leader's is in placed)
    group_slots: dict[str, tuple[Slot, ...]] = field(default_factory=dict)
    shortfalls: list[Shortfall] = field(default_factory=list)
    preemptions: list[RemoveReplica] = field(default_factory=list)
    team_gpus: dict[str, float] = field(default_factory=dict)  # GPU-equivalents held per team after the tick
    # exact placements whose wall-clock safety cut fired this tick (sharing.mig_exact.BatchOutcome.budget_exceeded)
    exact_budget_exceeded: int = 0


# What preemption looks at, asked for only when the asks do not all fit: every valid model's damage inputs and the
# running replicas that may be preempted.
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


def request_fraction(req: SlotRequest) -> float:
    """The GPU-equivalents a replica of ``req`` takes before it is placed (a whole-only request: its GPUs;
    else its compute share): the guarantee and limit checks of an ask that has no slot yet."""
    if req.whole_only:
        return float(req.gpus)
    return req.compute_fraction * req.gpus


def ask_fraction(a: Ask) -> float:
    """:func:`request_fraction` of a whole replica of the ask: every pod of a group."""
    f = request_fraction(a.request)
    return f if a.pods <= 1 else f * a.pods


def held_by_team(replicas: list[Candidate]) -> dict[str, float]:
    """GPU-equivalents the replicas hold, per team (a slot counts by its GPU fraction)."""
    out: dict[str, float] = {}
    for c in replicas:
        out[c.team] = out.get(c.team, 0.0) + c.gpu_fraction
    return out
