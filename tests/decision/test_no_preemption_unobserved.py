"""Issue 16: a preemption is a scale-down, so it is never made from missing data. A model whose metrics are stale or
partial is no preemption victim -- its load reads as 0 (stale) or as part of itself (partial), so it would look spare
-- whatever the arbitration mode; the same model, whole, is preempted."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from autoscaler.api.plan import Reason, RemoveReplica
from autoscaler.api.snapshot import (
    STALE_METRICS,
    ClusterSnapshot,
    MetricsWindow,
    ModelMetrics,
    ModelObservation,
    Replica,
)
from autoscaler.api.spec import ModelSpec, slot_request
from autoscaler.decision.arbitration import ArbitrationPolicy
from autoscaler.decision.config import CoreConfig
from autoscaler.decision.core import decide
from autoscaler.decision.state import fresh_state
from autoscaler.policies.base import PolicyResult
from sharing.packer import FirstFitPacker
from sharing.slots import Inventory, NodeSpec


@dataclass
class Wants:
    """A policy that asks for a fixed count per model."""

    wants: dict
    behavior: object = None
    name: str = "wants"
    tick_s: float = 10.0
    instant_start: bool = False
    uses_forecast: bool = False
    learns: bool = False

    def initial_state(self, spec: ModelSpec, replicas: int) -> int:
        return 0

    def decide(self, ctx) -> PolicyResult:
        return PolicyResult(self.wants[ctx.spec.name], 0, Reason.FORECAST, "wants")


def _preempted(low: ModelMetrics, mode: str, low_scaled_by: str | None = None) -> list[RemoveReplica]:
    top = ModelSpec(name="top", slo_latency_ms=1000, service_time_ms=200, max_replicas=10, priority=100)
    low_spec = ModelSpec(name="low", slo_latency_ms=1000, service_time_ms=200, max_replicas=10, priority=0,
                         min_replicas=0)
    inventory = Inventory.from_nodes([NodeSpec("n0", "H100-80GB", 3, False)])  # full: top's asks need low's GPUs
    models = {}
    for spec, n in ((top, 1), (low_spec, 2)):
        replicas = []
        for i in range(n):
            slot = FirstFitPacker().place(inventory, slot_request(spec))
            inventory.allocate(slot, f"{spec.name}-{i}", model=spec.name)
            replicas.append(Replica(f"{spec.name}-{i}", slot, ready=True, started_at=0.0))
        models[spec.name] = ModelObservation(spec.name, spec, desired_replicas=n, replicas=tuple(replicas),
                                             scaled_by=low_scaled_by if spec is low_spec else None)
    window = MetricsWindow(now=1000.0, step_s=10.0, models={
        "top": ModelMetrics(rate=np.full(12, 30.0), in_flight=np.full(12, 6.0)), "low": low})
    config = CoreConfig(policy=Wants({"top": 3, "low": 2}), arbitration=ArbitrationPolicy(mode=mode))
    plan = decide(ClusterSnapshot(now=1000.0, models=models, inventory=inventory), window, fresh_state(), config).plan
    return [a for a in plan.actions if isinstance(a, RemoveReplica) and a.model == "low"]


WHOLE = ModelMetrics(rate=np.full(12, 0.5), in_flight=np.full(12, 0.1))
PARTIAL = ModelMetrics(rate=np.full(12, 0.5), in_flight=np.full(12, 0.1),
                       partial="1 of 2 scrape targets not answering (up == 0)", observed_fraction=0.5)
NAN = ModelMetrics(rate=np.full(12, np.nan), in_flight=np.full(12, np.nan))


@pytest.mark.parametrize("mode", ["priority", "slo"])
def test_an_unobserved_model_is_never_preempted(mode: str) -> None:
    assert _preempted(WHOLE, "priority"), "the test needs a victim that is preempted when observed whole"
    for window in (PARTIAL, NAN, STALE_METRICS):
        assert _preempted(window, mode) == []


@pytest.mark.parametrize("mode", ["priority", "slo"])
def test_a_model_another_autoscaler_scales_is_never_preempted(mode: str) -> None:
    """Issue 17: an HPA/KEDA owns its count; slotwise does not write its /scale, so preempting it would free
    nothing (the preemptor would wait on a scale-down that never happens)."""
    assert _preempted(WHOLE, "priority")
    assert _preempted(WHOLE, mode, low_scaled_by="HorizontalPodAutoscaler ns/low") == []
