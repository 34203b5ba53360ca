"""Test inputs shared by the live controller tests: a metrics port with chosen load, a model Deployment."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping

import numpy as np

from autoscaler.api.snapshot import MetricsWindow, ModelMetrics
from autoscaler.api.spec import ModelSpec


def in_system(rate: float, service_s: float, servers: int, samples: int, step_s: float) -> np.ndarray:
    """What ``servers`` replicas hold (running + queued) per sample at ``rate`` req/s of ``service_s`` each, as a
    real engine's in-flight gauge reads: the M/M/c mean (Erlang C, the textbook formula) while they keep up, a
    backlog that grows by what they cannot serve while they do not (no steady state: the queue only grows)."""
    a = rate * service_s
    if a < servers:
        term, total = 1.0, 1.0
        for k in range(1, servers):
            term *= a / k
            total += term
        last = term * a / servers / (1.0 - a / servers)  # a^c / c! / (1 - rho)
        wait_p = last / (total + last)
        return np.full(samples, a + wait_p * a / (servers - a))
    backlog = (rate - servers / service_s) * step_s * np.arange(1, samples + 1)
    return servers + backlog


class ScriptedLoad:
    """A metrics port with chosen per-model request rates (req/s, constant over the window).

    The in-flight gauge is ``rate x service time`` (no queueing) unless ``ready`` says how many replicas of a model
    are Ready (an async look-up by model key): it then reads what that many replicas would hold
    (:func:`in_system`), so a load beyond their capacity shows as the growing queue a real engine reports, not as
    an impossible steady state (which reads as requests shorter than declared)."""

    def __init__(self, rates: Mapping[str, float], step_s: float = 15.0, samples: int = 20,
                 ready: Callable[[str], Awaitable[int]] | None = None) -> None:
        self.rates = dict(rates)
        self.step_s = step_s
        self.samples = samples
        self.ready = ready
        self.last_error: str | None = None

    async def window(self, now: float, models: Mapping[str, ModelSpec]) -> MetricsWindow:
        out = {}
        for key, spec in models.items():
            if key not in self.rates:
                out[key] = ModelMetrics(rate=np.zeros(0), in_flight=np.zeros(0), stale=True)
                continue
            r = self.rates[key]
            servers = None if self.ready is None else await self.ready(key)
            if servers is None or servers < 1:
                in_flight = np.full(self.samples, r * spec.service_time_s)
            else:
                in_flight = in_system(r, spec.service_time_s, servers, self.samples, self.step_s)
            out[key] = ModelMetrics(rate=np.full(self.samples, r), in_flight=in_flight)
        return MetricsWindow(now=now, step_s=self.step_s, models=out)


def deployment(name: str, annotations: dict[str, str], resources: dict | None = None, replicas: int = 1) -> dict:
    """A model-server Deployment with slotwise annotations (and GPU ``resources`` for its one container)."""
    labels = {"app": name}
    container: dict = {"name": "server", "image": "registry.invalid/vllm:test"}
    if resources:
        container["resources"] = resources
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "labels": labels, "annotations": annotations},
        "spec": {"replicas": replicas, "selector": {"matchLabels": labels},
                 "template": {"metadata": {"labels": labels}, "spec": {"containers": [container]}}},
    }
