"""A workload's group size (``ModelSpec.pods_per_replica``, a LeaderWorkerSet's ``spec.leaderWorkerTemplate.size``)
is bounded like an annotation (issue 17): ``limits.max_pods_per_replica``, and the group's GPUs (size x
gpus-per-replica) by ``limits.max_gpus_per_replica``. A group of 800 pods made every placement try of it take a
fifth of a second to fail, tried dozens of times a tick by preemption: now that model alone is refused, naming the
group size, and every other model is decided as if it were not there."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from test_model_isolation import CountingPacker, Wants

from autoscaler.api.plan import Plan, Reason, ScaleModel, UpdateStatus
from autoscaler.api.snapshot import ClusterSnapshot, MetricsWindow, ModelMetrics, ModelObservation
from autoscaler.api.spec import (
    PODS_PER_REPLICA_KEY,
    PREFIX,
    ModelSpec,
    SpecLimits,
    limit_problems,
    parse_annotations,
    within_limits,
)
from autoscaler.decision import core
from autoscaler.decision.config import CoreConfig
from autoscaler.decision.state import fresh_state
from sharing.cluster import nodes_from_spec
from sharing.packer import CostAwarePacker
from sharing.slots import Inventory

GOOD = {PREFIX + "slo-latency-ms": "500"}


def spec(name: str, pods: int = 1, gpus: int = 1) -> ModelSpec:
    s = parse_annotations(name, {**GOOD, PREFIX + "gpus-per-replica": str(gpus)})
    return s.with_(pods_per_replica=pods) if pods != 1 else s


@pytest.mark.parametrize(("pods", "gpus", "shown", "cap"), [
    (800, 1, "800", "limits.max_pods_per_replica (64)"),
    (65, 1, "65", "limits.max_pods_per_replica (64)"),
    (8, 16, "8 pods x 16 GPUs", "limits.max_gpus_per_replica (64)"),
])
def test_a_group_over_the_caps_is_a_problem_naming_the_group_size(pods: int, gpus: int, shown: str,
                                                                  cap: str) -> None:
    s = spec("m", pods, gpus)
    assert not within_limits(s, SpecLimits())
    (problem,) = limit_problems(s, SpecLimits())
    assert problem.key == PODS_PER_REPLICA_KEY and problem.value == shown and cap in problem.reason


@pytest.mark.parametrize(("pods", "gpus"), [(1, 64), (64, 1), (8, 8), (2, 32)])
def test_groups_within_the_caps_pass(pods: int, gpus: int) -> None:
    s = spec("m", pods, gpus)
    assert within_limits(s, SpecLimits()) and limit_problems(s, SpecLimits()) == []


def test_the_operator_sets_the_group_cap() -> None:
    assert within_limits(spec("m", 800), SpecLimits(max_pods_per_replica=1000, max_gpus_per_replica=1000))
    (problem,) = limit_problems(spec("m", 8), SpecLimits(max_pods_per_replica=4))
    assert "limits.max_pods_per_replica (4)" in problem.reason
    with pytest.raises(ValueError, match=re.escape("limits.max_pods_per_replica must be a whole number")):
        SpecLimits(max_pods_per_replica=0)


def _decide(models: dict[str, ModelObservation], packer: CostAwarePacker, limits: SpecLimits | None = None) -> Plan:
    snap = ClusterSnapshot(now=100.0, models=models, inventory=Inventory.from_nodes(nodes_from_spec("4xH100-80GB")))
    window = MetricsWindow(now=100.0, step_s=15.0, models={
        n: ModelMetrics(rate=np.full(20, 20.0), in_flight=np.full(20, 2.0)) for n in models})
    config = CoreConfig(policy=Wants({"good": 2, "huge": 3}), packer=packer, limits=limits or SpecLimits())
    return core.decide(snap, window, fresh_state(), config).plan


def lines_of(plan: Plan, model: str) -> list[str]:
    return [line for line in plan.describe() if f" {model}" in line]


def test_a_huge_group_is_refused_alone_and_the_others_decide_as_if_it_were_not_there() -> None:
    good = ModelObservation("good", spec("good"), desired_replicas=0)
    huge = ModelObservation("huge", spec("huge", 800), desired_replicas=0)
    alone = _decide({"good": good}, CostAwarePacker())
    packer = CountingPacker()
    both = _decide({"huge": huge, "good": good}, packer)
    assert lines_of(both, "good") == lines_of(alone, "good")
    assert [a.replicas for a in both.of_type(ScaleModel) if a.model == "good"] == [2]
    (status,) = [a for a in both.of_type(UpdateStatus) if a.model == "huge"]
    assert not status.condition_ok and status.reason is Reason.INVALID_SPEC
    assert PODS_PER_REPLICA_KEY in status.message and "limits.max_pods_per_replica" in status.message
    assert [type(a) for a in both.actions if getattr(a, "model", None) == "huge"] == [UpdateStatus]
    assert packer.calls.get("huge", 0) == 0  # refused before anything was placed for it


def test_a_huge_group_the_operator_allows_costs_no_per_pod_placement() -> None:
    """Raised caps admit the 800-pod group; it does not fit 4 GPUs, and no pod of it is tried (place_group's bound)."""
    good = ModelObservation("good", spec("good"), desired_replicas=0)
    huge = ModelObservation("huge", spec("huge", 800), desired_replicas=0)
    packer = CountingPacker()
    plan = _decide({"huge": huge, "good": good}, packer,
                   SpecLimits(max_pods_per_replica=1000, max_gpus_per_replica=1000))
    assert [a.replicas for a in plan.of_type(ScaleModel) if a.model == "good"] == [2]
    assert packer.calls.get("huge", 0) == 0


def test_the_group_cap_is_a_setting(tmp_path: Path) -> None:
    from autoscaler.cli.main import build_parser
    from autoscaler.cli.run import build_settings
    from autoscaler.live.controller import Controller

    cfg = tmp_path / "slotwise.yaml"
    cfg.write_text("limits: {max_pods_per_replica: 16}\n")
    s = build_settings(build_parser().parse_args(["run", "--config", str(cfg)]))
    assert Controller(object(), s).core.limits == SpecLimits(max_pods_per_replica=16)
