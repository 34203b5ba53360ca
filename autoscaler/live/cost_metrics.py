"""The cost counters of the live controller's /metrics: what :mod:`autoscaler.accounting.cost` attributes
(GPU-equivalent seconds per team, namespace and model; idle reserved capacity; the price table), charged tick by tick.

=====================================================  =====================================================
``slotwise_gpu_slot_seconds_total{team,namespace,       GPU-equivalent seconds the model's replicas held
model,gpu_model}``                                      (starting, serving or draining)
``slotwise_gpu_cost_dollars_total{team,namespace,       those seconds x price / 3600
model}``
``slotwise_gpu_idle_seconds_total{gpu_model}``          idle reserved GPU-equivalent seconds
                                                        (:func:`~autoscaler.accounting.cost.idle_reserved`)
``slotwise_gpu_price_dollars_per_hour{gpu_model}``      the price table (kinds in the cluster)
=====================================================  =====================================================

Cardinality stays bounded: label sets are the managed models (x the GPU kinds they ran on) and the GPU kinds of
the cluster. A model that leaves the snapshot has its series REMOVED (as the exporter does for its gauges), and
so does a model's old ``team``/``namespace`` identity when its annotation changes: Prometheus keeps the history,
``increase()`` over a range that spans the removal still counts it, and a key that comes back starts from zero,
which ``increase()`` reads as a counter reset.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge

from autoscaler.accounting.cost import identity, idle_reserved, price_table, usage
from autoscaler.api.snapshot import ClusterSnapshot
from sharing.catalog import Catalog


class CostMetrics:
    """The cost counters on a given registry (the controller's: ``ControllerMetrics.registry``).

    ``record(snapshot, seconds)`` charges what the snapshot shows held for ``seconds`` (the time since the
    previous record: the controller's tick interval, not the tick's duration). ``prices``: overrides of the
    catalog's USD per GPU-hour by any accepted GPU name (the settings file's ``prices``).
    """

    def __init__(
        self, registry: CollectorRegistry, catalog: Catalog, prices: Mapping[str, float] | None = None
    ) -> None:
        self.prices = price_table(catalog, prices)
        r = registry
        self.slot_seconds = Counter(
            "slotwise_gpu_slot_seconds",
            "GPU-equivalent seconds held by a model's replicas (whole GPU 1, MIG slice or share its compute "
            "fraction).",
            ["team", "namespace", "model", "gpu_model"],
            registry=r,
        )
        self.cost = Counter(
            "slotwise_gpu_cost_dollars",
            "USD of GPU time held by a model's replicas (GPU-equivalent seconds x price per hour / 3600).",
            ["team", "namespace", "model"],
            registry=r,
        )
        self.idle_seconds = Counter(
            "slotwise_gpu_idle_seconds",
            "GPU-equivalent seconds free on nodes that hold inference replicas (reserved, not used).",
            ["gpu_model"],
            registry=r,
        )
        self.price = Gauge(
            "slotwise_gpu_price_dollars_per_hour", "USD per GPU-hour of a GPU kind.", ["gpu_model"], registry=r
        )
        # model key -> label tuples created for it, so a model that leaves (or changes team) is forgotten
        self._series: dict[str, set[tuple[str, ...]]] = {}
        self._cost_series: dict[str, tuple[str, str, str]] = {}
        self._kinds: set[str] = set()

    def _price(self, kind: str) -> float:
        p = self.prices.get(kind)
        return p if p is not None else 0.0  # a kind the catalog does not know: free, rather than a crash

    def record(self, snapshot: ClusterSnapshot, seconds: float) -> None:
        """Charge ``seconds`` of the snapshot's holdings (``seconds`` <= 0 or not finite: only refresh the
        series set and the prices)."""
        dt = seconds if math.isfinite(seconds) and seconds > 0 else 0.0
        rows = usage(snapshot)
        present = set(snapshot.models)

        for gone in set(self._cost_series) - present:
            self._forget(gone)
        cost: dict[str, float] = {}
        for u in rows:
            labels = (u.team, u.namespace, u.model, u.gpu_model)
            self.slot_seconds.labels(*labels).inc(u.gpus * dt)
            self._series.setdefault(u.model, set()).add(labels)
            cost[u.model] = cost.get(u.model, 0.0) + u.gpus * dt * self._price(u.gpu_model) / 3600.0
        for key, obs in snapshot.models.items():
            team, ns = identity(key, obs)
            labels3 = (team, ns, key)
            old = self._cost_series.get(key)
            if old is not None and old != labels3:  # the team (or namespace) changed: drop the old identity
                self._remove(self.cost, *old)
                for stale in [s for s in self._series.get(key, ()) if s[:2] != labels3[:2]]:
                    self._remove(self.slot_seconds, *stale)
                    self._series[key].discard(stale)
            # every managed model has a cost series, 0 while it holds nothing: dashboards list all teams
            self.cost.labels(*labels3).inc(cost.get(key, 0.0))
            self._cost_series[key] = labels3

        free = idle_reserved(snapshot)
        kinds = {n.gpu_model for n in snapshot.inventory.nodes.values() if n.gpu_count} | {u.gpu_model for u in rows}
        for kind in kinds:
            self.idle_seconds.labels(kind).inc(free.get(kind, 0.0) * dt)
            self.price.labels(kind).set(self._price(kind))
        for kind in self._kinds - kinds:  # a kind whose nodes all left: its price is no longer the cluster's
            self._remove(self.price, kind)
            self._remove(self.idle_seconds, kind)
        self._kinds = kinds

    def _forget(self, model: str) -> None:
        old = self._cost_series.pop(model, None)
        if old is not None:
            self._remove(self.cost, *old)
        for labels in self._series.pop(model, set()):
            self._remove(self.slot_seconds, *labels)

    @staticmethod
    def _remove(metric: Counter | Gauge, *labels: str) -> None:
        with contextlib.suppress(KeyError):  # never created: nothing to remove
            metric.remove(*labels)
