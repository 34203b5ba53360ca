"""The narrow ports between the decision core and the world (simulated or real).

Adapters implement these: ``autoscaler/sim`` (the embedded default and benchmark harness, synchronous: simulated
time) and the Kubernetes / Prometheus adapters (asynchronous: real I/O; ``autoscaler/live/controller.py`` awaits them).
The decision core only sees the data they return.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from autoscaler.api.plan import Plan
from autoscaler.api.snapshot import ClusterSnapshot, MetricsWindow
from autoscaler.api.spec import ModelSpec


class ClusterPort(Protocol):
    def snapshot(self, now: float) -> ClusterSnapshot: ...


class MetricsPort(Protocol):
    def window(self, now: float) -> MetricsWindow: ...


class Actuator(Protocol):
    """Applies a plan: idempotent, rate-limited; a dry-run actuator only reports."""

    def apply(self, plan: Plan) -> None: ...


class AsyncMetricsPort(Protocol):
    """The live metrics source (``adapters/prometheus_metrics.PrometheusMetrics``): the window for the models
    given; never raises (a lost source makes models stale and sets ``last_error``)."""

    last_error: str | None

    async def window(self, now: float, models: Mapping[str, ModelSpec]) -> MetricsWindow: ...


class AsyncActuator(Protocol):
    """The live actuator (``adapters/kube/actuator.KubeActuator``): applies a plan against the view it was made
    from and reports what it applied, skipped (and why) and what failed."""

    async def apply(self, plan: Plan, view: Any) -> Any: ...
