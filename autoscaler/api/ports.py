"""The ports between the decision core and the world, as the adapters really are (tests/api/test_ports.py checks
each adapter against its port: method names, parameters, async-ness).

The simulator's (:mod:`autoscaler.sim`) are synchronous -- simulated time, nothing to wait for -- and
:func:`autoscaler.sim.run.simulate` drives them:

================  ==========================================  =================================================
port              adapter                                     what it does
================  ==========================================  =================================================
``ClusterPort``   ``SimCluster.snapshot(now)``                the cluster at ``now``
``MetricsPort``   ``SimMetrics.window(now)``                  the metrics window ending at ``now``
``Actuator``      ``SimCluster.apply(plan)``                  carries a plan out at ``plan.now``
================  ==========================================  =================================================

The live ones (:mod:`autoscaler.live`, driven by :class:`autoscaler.live.controller.Controller`) do real I/O, so
the metrics and the actuator are asynchronous, and the cluster is read as a *view*: the snapshot plus what
acting on it needs (the adapter's own addresses of models, nodes and workloads), which the actuator is given
back with the plan:

====================  ========================================  ===============================================
port                  adapter                                   what it does
====================  ========================================  ===============================================
``ViewPort``          ``InformerCluster.view(now)``             one read of the informer caches (in memory: sync)
``AsyncMetricsPort``  ``PrometheusMetrics.window(now, models)`` the window for these models; never raises
``AsyncActuator``     ``KubeActuator.apply(plan, view)``        applies the plan against the view it came from
====================  ========================================  ===============================================

The decision core only sees the data they return (:mod:`autoscaler.api.snapshot`) and returns a
:class:`~autoscaler.api.plan.Plan`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol, TypeVar

from autoscaler.api.plan import Plan
from autoscaler.api.snapshot import ClusterSnapshot, MetricsWindow
from autoscaler.api.spec import ModelSpec


# -- the simulator's (synchronous) ------------------------------------------------------------------------------
class ClusterPort(Protocol):
    """The cluster as the decision core sees it at ``now``."""

    def snapshot(self, now: float) -> ClusterSnapshot: ...


class MetricsPort(Protocol):
    """The metrics window ending at ``now``, one sample per step for every model."""

    def window(self, now: float) -> MetricsWindow: ...


class Actuator(Protocol):
    """Carries a plan out at ``plan.now``; what it did shows in the next snapshot."""

    def apply(self, plan: Plan) -> None: ...


# -- the live ones (real I/O) -----------------------------------------------------------------------------------
class ClusterRead(Protocol):
    """One read of a live cluster: the decision core's snapshot, plus whatever the adapter needs to act on it
    (for Kubernetes the ``ClusterView``: the Deployments, the GPU nodes, the training workloads)."""

    @property
    def snapshot(self) -> ClusterSnapshot: ...


View_co = TypeVar("View_co", bound=ClusterRead, covariant=True)
View_contra = TypeVar("View_contra", bound=ClusterRead, contravariant=True)
Report_co = TypeVar("Report_co", covariant=True)


class ViewPort(Protocol[View_co]):
    """The live cluster source: one read at ``now`` (of caches the informers keep current: no I/O, synchronous)."""

    def view(self, now: float) -> View_co: ...


class AsyncMetricsPort(Protocol):
    """The live metrics source: the window for the models given; never raises (a lost source makes models stale
    and sets ``last_error``)."""

    last_error: str | None

    async def window(self, now: float, models: Mapping[str, ModelSpec]) -> MetricsWindow: ...


class AsyncActuator(Protocol[View_contra, Report_co]):
    """The live actuator: applies a plan against the view it was made from (the view says which objects the plan's
    names mean and how they looked) and reports what it applied, skipped (and why) and what failed."""

    async def apply(self, plan: Plan, view: View_contra) -> Report_co: ...
