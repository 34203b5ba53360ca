"""Prometheus: one async client (aiohttp) and all PromQL the project sends.

- :mod:`~autoscaler.live.prometheus.metrics`: the per-tick metrics window of the managed models;
- :mod:`~autoscaler.live.prometheus.history`: per-model rate history, to warm-start the forecaster.
"""
