"""The narrow ports between the decision core and the world (simulated or real).

Adapters implement these: ``autoscaler/sim`` (the embedded default and benchmark harness) and the
Kubernetes / Prometheus adapters (issue: real cluster). The decision core only sees the data they return.
"""

from __future__ import annotations

from typing import Protocol

from autoscaler.plan import Plan
from autoscaler.snapshot import ClusterSnapshot, MetricsWindow


class ClusterPort(Protocol):
    def snapshot(self, now: float) -> ClusterSnapshot: ...


class MetricsPort(Protocol):
    def window(self, now: float) -> MetricsWindow: ...


class Actuator(Protocol):
    """Applies a plan: idempotent, rate-limited; a dry-run actuator only reports."""

    def apply(self, plan: Plan) -> None: ...
