"""The live adapters: everything that talks to a real cluster or a real Prometheus.

- :mod:`~autoscaler.live.controller`: the control loop (informers, Lease, tick, act, report);
- :mod:`~autoscaler.live.kube`: Kubernetes -- informers, translation into the snapshot, the actuators, the Lease,
  the MIG re-layout gate;
- :mod:`~autoscaler.live.prometheus`: the one Prometheus client (aiohttp) and all PromQL;
- :mod:`~autoscaler.live.exporter`, :mod:`~autoscaler.live.cost_metrics`: the controller's own metrics and the
  cost counters;
- :mod:`~autoscaler.live.health`: liveness, readiness and the HTTP server of ``/metrics``, ``/healthz``, ``/readyz``.

The only layer that imports kubernetes_asyncio and aiohttp. May import: everything below it (``api``,
``estimation``, ``policies``, ``decision``, ``accounting.cost``), ``sharing``, ``forecasting``.
"""
