"""Prometheus: one async client (aiohttp) and all PromQL the project sends.

- :mod:`~autoscaler.live.prometheus.client`: the client -- instant and range queries (chunked past Prometheus'
  11,000-point limit), timeouts, every failure one :class:`~autoscaler.live.prometheus.client.PrometheusError`;
- :mod:`~autoscaler.live.prometheus.promql`: every PromQL string, among them THE request-rate definition
  (``step_increments``: reset-safe per-step counter differences) that the window and the warm start share;
- :mod:`~autoscaler.live.prometheus.metrics`: the per-tick metrics window of the managed models;
- :mod:`~autoscaler.live.prometheus.history`: per-model request-rate history, to warm-start the forecaster;
- :mod:`~autoscaler.live.prometheus.report`: what ``slotwise report --prometheus`` reads of the controller's
  exported series (the report layer turns it into numbers).
"""
