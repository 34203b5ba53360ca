"""Test inputs shared by the live controller tests: a metrics port with chosen load, a model Deployment."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from autoscaler.api.snapshot import MetricsWindow, ModelMetrics
from autoscaler.api.spec import ModelSpec


class ScriptedLoad:
    """A metrics port with chosen per-model request rates (req/s, constant over the window)."""

    def __init__(self, rates: Mapping[str, float], step_s: float = 15.0, samples: int = 20) -> None:
        self.rates = dict(rates)
        self.step_s = step_s
        self.samples = samples
        self.last_error: str | None = None

    async def window(self, now: float, models: Mapping[str, ModelSpec]) -> MetricsWindow:
        out = {}
        for key, spec in models.items():
            if key not in self.rates:
                out[key] = ModelMetrics(rate=np.zeros(0), in_flight=np.zeros(0), stale=True)
                continue
            r = self.rates[key]
            busy = r * spec.service_time_s
            out[key] = ModelMetrics(rate=np.full(self.samples, r), in_flight=np.full(self.samples, busy))
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
