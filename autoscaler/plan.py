"""A plan is data: the typed actions one tick of the decision core wants applied.

Printing a plan is dry-run; applying it is the actuator's job (simulated or Kubernetes).
Every scale action carries a machine-readable :class:`Reason`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from sharing.slots import Slot


class Reason(StrEnum):
    """Why a model's replica count is what it is. Counted by the scorecard, exported by the controller."""

    FORECAST = "forecast"  # sized for the forecast load
    REACTIVE = "reactive"  # sized for observed load (baseline policies)
    PANIC = "panic"  # short-window load above plan
    STABLE = "stable"  # within tolerance / stabilization window holds the count
    SLO_BURN = "slo_burn"
    N_MINUS_1 = "n_minus_1_check_failed"
    UNPLACEABLE = "unplaceable"
    METRICS_STALE = "metrics_stale"
    BOUNDS = "bounds"  # clamped to min/max replicas
    STATIC = "static"
    ORACLE = "oracle"
    INVALID_SPEC = "invalid_spec"


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
    """Start one new replica of ``model`` on ``slot`` (the slot already fits: the packer checked)."""

    model: str
    replica_id: str
    slot: Slot


@dataclass(frozen=True)
class RemoveReplica:
    """Stop routing to a replica, then remove it once in-flight requests finish (or ``drain_s`` passes)."""

    model: str
    replica_id: str
    drain_s: float = 30.0


@dataclass(frozen=True)
class Shortfall:
    """The model needs ``missing`` more replicas than the cluster can place."""

    model: str
    missing: int
    reason: str


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


Action = ScaleModel | PlaceReplica | RemoveReplica | Shortfall | UpdateStatus


@dataclass
class Plan:
    now: float
    actions: list[Action] = field(default_factory=list)

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
                    lines.append(f"place {a.model}/{a.replica_id} on {a.slot.describe()}")
                case RemoveReplica():
                    lines.append(f"drain {a.model}/{a.replica_id} (timeout {a.drain_s:.0f}s)")
                case Shortfall():
                    lines.append(f"shortfall {a.model}: {a.missing} replica(s) unplaceable: {a.reason}")
                case UpdateStatus():
                    lines.append(f"status {a.model}: {a.current}/{a.desired} {a.reason} {a.message}".rstrip())
        return lines
