"""A plan is data: the typed actions one tick of the decision core wants applied.

Printing a plan is dry-run; applying it is the actuator's job (simulated or Kubernetes).
Every scale action carries a machine-readable :class:`Reason`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from sharing.lending import LendReason, ReclaimReason
from sharing.slots import Slot


class Reason(StrEnum):
    """Why a model's replica count is what it is. Counted by the scorecard, exported by the controller."""

    FORECAST = "forecast"  # sized for the forecast load
    REACTIVE = "reactive"  # sized for observed load (baseline policies)
    PANIC = "panic"  # short-window load above plan
    STABLE = "stable"  # the policy asks for the count in place
    STABILIZING = "stabilizing"  # the policy asks for another count; the stabilization window holds this one
    SLO_UNATTAINABLE = "slo_unattainable"  # more replicas stop helping: sized at the knee (the service alone is slow)
    SLO_BURN = "slo_burn"
    N_MINUS_1 = "n_minus_1_check_failed"
    UNPLACEABLE = "unplaceable"
    METRICS_STALE = "metrics_stale"
    METRICS_PARTIAL = "metrics_partial"  # part of the model unobserved (a scrape target down, no rate now)
    KV_SATURATED = "kv_saturated"  # the engines report KV-cache use at the saturation threshold: no scale-down
    BOUNDS = "bounds"  # clamped to min/max replicas
    STATIC = "static"
    ORACLE = "oracle"
    INVALID_SPEC = "invalid_spec"
    DECISION_FAILED = "decision_failed"  # the model's decision raised: it alone keeps its replicas
    PREEMPTED = "preempted"  # replicas drained for a higher-priority model or a team reclaiming its guarantee
    # Scale to and from zero (min-replicas 0; autoscaler/decision/zero.py, issue 18):
    SCALED_TO_ZERO = "scaled_to_zero"  # idle, and its keep-alive policy says no request is likely soon
    KEEP_WARM = "keep_warm"  # idle, and its keep-alive policy keeps one replica for the next request
    PRE_WARM = "pre_warm"  # at zero, and its keep-alive policy expects a request within the cold start
    ACTIVATED = "activated"  # at zero with requests held (the activator): one replica at once


class ShortfallCause(StrEnum):
    """Why replicas a model's policy asked for were not placed (autoscaler/decision/arbitration/). Exported as the
    ``reason`` label of ``slotwise_shortfall_replicas``. ``RECLAIMING`` and ``PREEMPTING`` are grants in
    progress (the capacity is being freed for the model); the others are refusals."""

    UNPLACEABLE = "unplaceable"  # no slot fits, even on capacity being freed, and nothing may be preempted for it
    BORROWING_LIMIT = "borrowing_limit"  # the team holds its guarantee + borrowing limit
    HEADROOM = "headroom"  # the model meets its SLO without it: nothing is preempted for headroom
    MIN_RUNTIME = "min_runtime"  # what it could preempt has not run the minimum runtime yet
    OUTRANKED = "outranked"  # the preemptions this tick went to models ranked ahead (per-tick limit, claimed GPUs)
    MAX_REPLICAS = "max_replicas"  # the slots it got are slower than sized for, and max replicas are reached
    DAMAGE = "damage"  # preempting for it would cost the victims more SLO than it brings (priority-weighted)
    RECLAIMING = "reclaiming"  # lent training GPUs are being reclaimed for it
    PREEMPTING = "preempting"  # lower-priority (or over-guarantee) replicas are draining for it


# Causes that are grants in progress, not refusals.
GRANTS = frozenset({ShortfallCause.RECLAIMING, ShortfallCause.PREEMPTING})


class PreemptionReason(StrEnum):
    PRIORITY = "priority"  # a higher-priority model would miss its SLO without the capacity
    GUARANTEE = "guarantee"  # the preemptor's team is inside its guarantee; the victim's team is borrowing


@dataclass(frozen=True)
class ScaleModel:
    """Set a model's desired replica count (the Deployment's scale)."""

    model: str
    replicas: int
    previous: int
    reason: Reason
    detail: str = ""


@dataclass(frozen=True)
class PlaceReplica:
    """Start one new replica of ``model`` on ``slot`` (the slot already fits: the packer checked).

    A replica that is a group of pods (``ModelSpec.pods_per_replica`` > 1, a LeaderWorkerSet replica) is placed
    whole: ``slot`` is its leader's, ``group_slots`` the other pods' (placed together with it, all or none);
    empty for a one-pod replica."""

    model: str
    replica_id: str
    slot: Slot
    group_slots: tuple[Slot, ...] = ()

    @property
    def slots(self) -> tuple[Slot, ...]:
        """Every pod's slot, the leader's first."""
        return (self.slot, *self.group_slots)


@dataclass(frozen=True)
class RemoveReplica:
    """Stop routing to a replica, then remove it once its in-flight requests finish. How long that may take is the
    executor's: the pod's ``terminationGracePeriodSeconds`` on Kubernetes, ``SimConfig.drain_timeout_s`` in the
    simulator.

    A preemption (``preempted_by`` set) is a removal for another model's sake: ``reason`` says why, ``message``
    in words (for the Event); an ordinary scale-down has neither."""

    model: str
    replica_id: str
    preempted_by: str = ""
    reason: PreemptionReason | None = None
    message: str = ""


@dataclass(frozen=True)
class Shortfall:
    """The model needs ``missing`` more replicas than it gets this tick: ``cause`` (machine-readable), ``reason``
    (in words), its ``team``, and whether the team was inside its guarantee (``within_guarantee``: a refusal
    then breaks the guarantee, unless the cause is a grant in progress, RECLAIMING or PREEMPTING)."""

    model: str
    missing: int
    reason: str
    cause: ShortfallCause = ShortfallCause.UNPLACEABLE
    team: str = ""
    within_guarantee: bool = False


@dataclass(frozen=True)
class UpdateStatus:
    """Status written on the model (Deployment annotation + condition; Events for problems)."""

    model: str
    desired: int
    current: int
    reason: Reason
    forecast_rps: float | None = None
    message: str = ""
    condition_ok: bool = True
    # predicted latency at the SLO percentile for ``desired`` replicas at the forecast load (None: no forecast)
    predicted_latency_ms: float | None = None
    slo_latency_ms: float | None = None


@dataclass(frozen=True)
class SetMigLayout:
    """Re-partition the MIG instances of some GPUs of ``node``.

    ``layouts`` maps every GPU index of the node to its wanted instances (``(profile key, start)``; None =
    MIG off); ``changed`` lists the GPUs whose layout differs from now; ``busy`` maps each MIG resource
    (``nvidia.com/mig-3g.40gb``) to how many pods on the node may keep using it through the change (those on
    instances that stay): the safety gate waits until the node's pods use no more than that.
    ``config_name`` is the mig-parted entry (and ``nvidia.com/mig.config`` label value), ``config`` the
    mig-parted document holding it.
    """

    node: str
    config_name: str
    config: dict
    layouts: dict[int, tuple[tuple[str, int], ...] | None]
    changed: tuple[int, ...]
    busy: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class SetTimeSlicing:
    """The device plugin's time-slicing config: ``replicas[resource]`` shares per GPU or MIG instance."""

    replicas: dict[str, int]


@dataclass(frozen=True)
class SetSlotTemplate:
    """Change a model's pod template to request ``resources`` (container ``resources`` dict) on nodes matching
    ``node_selector``: how a model's slot kind reaches Kubernetes (its pods are then scheduled by kube-scheduler)."""

    model: str
    resources: dict
    node_selector: dict


@dataclass(frozen=True)
class LendGpus:
    """Lend whole GPUs (``devices`` of ``node``) to preemptible training until reclaimed."""

    node: str
    devices: tuple[int, ...]
    gpu_model: str
    reason: LendReason = LendReason.SURPLUS


@dataclass(frozen=True)
class ReclaimGpus:
    """Take lent GPUs back: preempt ``workloads`` (training workloads on them, in preemption order) so that the
    GPUs are free within ``deadline_s`` (the reclaim contract). ``reason``: :class:`~sharing.lending.ReclaimReason`
    (``forecast``: inference will need them within the horizon, ``shortfall``: replicas unplaceable now,
    ``hysteresis``: the warm buffer fell short, ``disabled``)."""

    node: str
    devices: tuple[int, ...]
    workloads: tuple[str, ...]
    reason: ReclaimReason
    deadline_s: float


@dataclass(frozen=True)
class SetRouting:
    """Route a model's traffic through the activator (``via_activator``: requests are held while it has no Ready
    replica) or straight to its pods. Planned for models that may go to zero (``min-replicas: 0``): on before
    the scale to zero is written, off once a replica is Ready; the simulator records it, the Kubernetes actuator
    writes the activator's EndpointSlice for the model's Service (docs/scale-to-zero.md)."""

    model: str
    via_activator: bool
    reason: str = ""


Action = (
    ScaleModel
    | PlaceReplica
    | RemoveReplica
    | Shortfall
    | UpdateStatus
    | SetMigLayout
    | SetTimeSlicing
    | SetSlotTemplate
    | LendGpus
    | ReclaimGpus
    | SetRouting
)


@dataclass
class Plan:
    now: float
    actions: list[Action] = field(default_factory=list)
    # Every decision of this tick, model -> why its count is what it is (including those that leave it unchanged;
    # the simulator counts them as ``decisions_by_reason``).
    decisions: dict[str, Reason] = field(default_factory=dict)
    # Exact placements whose wall-clock safety cut fired this tick (their work limit did not bound them: the plan may
    # differ on a faster or less loaded machine); the controller counts them as slotwise_exact_budget_exceeded_total.
    exact_budget_exceeded: int = 0
    # Fleet-wide stages that failed this tick (stage -> what failed: "forecast", "arbitration", "lend"), each
    # failure confined to the models it came from where it could be traced to them (those models hold, reported on
    # their status); the controller logs each and counts it as slotwise_errors{kind="stage-<stage>"}.
    stage_failures: dict[str, str] = field(default_factory=dict)

    def of_type(self, kind: type) -> list:
        return [a for a in self.actions if isinstance(a, kind)]

    def describe(self) -> list[str]:
        """One line per action: the dry-run rendering."""
        lines = []
        for a in self.actions:
            match a:
                case ScaleModel():
                    lines.append(f"scale {a.model}: {a.previous} -> {a.replicas} ({a.reason}) {a.detail}".rstrip())
                case PlaceReplica():
                    group = "".join(f" + {g.describe()}" for g in a.group_slots)
                    lines.append(f"place {a.model}/{a.replica_id} on {a.slot.describe()}{group}")
                case RemoveReplica():
                    why = f" preempted ({a.reason}) for {a.preempted_by}" if a.preempted_by else ""
                    lines.append(f"drain {a.model}/{a.replica_id}{why}")
                case Shortfall():
                    lines.append(f"shortfall {a.model}: {a.missing} replica(s) {a.cause}: {a.reason}")
                case UpdateStatus():
                    lines.append(f"status {a.model}: {a.current}/{a.desired} {a.reason} {a.message}".rstrip())
                case SetMigLayout():
                    lines.append(f"mig-layout {a.node}: GPUs {list(a.changed)} -> {a.config_name}")
                case SetTimeSlicing():
                    lines.append(f"time-slicing {dict(sorted(a.replicas.items()))}")
                case LendGpus():
                    gpus = ",".join(map(str, a.devices))
                    lines.append(f"lend {a.node}/gpu{gpus} ({a.gpu_model}) {a.reason}".rstrip())
                case ReclaimGpus():
                    lines.append(f"reclaim {a.node}/gpu{','.join(map(str, a.devices))} ({a.reason}): preempt "
                                 f"{', '.join(a.workloads) or 'nothing'} within {a.deadline_s:.0f}s")
                case SetSlotTemplate():
                    lines.append(f"template {a.model}: resources {a.resources} nodeSelector {a.node_selector}")
                case SetRouting():
                    where = "the activator" if a.via_activator else "its pods"
                    lines.append(f"route {a.model}: via {where} {a.reason}".rstrip())
        return lines
