"""A StatefulSet or a LeaderWorkerSet removes its highest ordinals / group indices on a scale-down, whatever the
pods say (``ModelObservation.removal_by_index``): the decision names those replicas, so that the capacity it counts
on is what stays, and preempts only the replica the scale-down would actually take."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_no_preemption_unobserved import Wants

from autoscaler.api.plan import RemoveReplica
from autoscaler.api.snapshot import ClusterSnapshot, MetricsWindow, ModelMetrics, ModelObservation, Replica
from autoscaler.api.spec import ModelSpec, slot_request
from autoscaler.decision.arbitration import ArbitrationPolicy
from autoscaler.decision.config import CoreConfig
from autoscaler.decision.core import decide
from autoscaler.decision.scaledown import choose_removals
from autoscaler.decision.state import fresh_state
from sharing.packer import FirstFitPacker
from sharing.slots import Inventory, NodeSpec

WHOLE = ModelMetrics(rate=np.full(12, 0.5), in_flight=np.full(12, 0.1))


def _model(inventory: Inventory, spec: ModelSpec, ids: list[str], *, by_index: bool,
           not_ready: tuple[str, ...] = (), started: dict[str, float] | None = None) -> ModelObservation:
    replicas = []
    for rid in ids:
        slot = FirstFitPacker().place(inventory, slot_request(spec))
        assert slot is not None
        inventory.allocate(slot, rid, model=spec.name)
        replicas.append(Replica(rid, slot, ready=rid not in not_ready, started_at=(started or {}).get(rid, 0.0)))
    return ModelObservation(spec.name, spec, desired_replicas=len(ids), replicas=tuple(replicas),
                            removal_by_index=by_index)


def _removed(plan, model: str) -> list[RemoveReplica]:
    return [a for a in plan.actions if isinstance(a, RemoveReplica) and a.model == model]


# -- scale-down -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("by_index", [False, True])
def test_a_by_index_model_scales_down_its_highest_index(by_index: bool) -> None:
    """Four replicas, one of them (a low ordinal) still starting, down to three: a Deployment loses the one that
    serves nothing; a StatefulSet loses ordinal 10 (the highest, numerically, Ready) whatever slotwise names, so
    that is the replica named -- the not-ready one stays."""
    spec = ModelSpec(name="ml/db", slo_latency_ms=1000, service_time_ms=200, max_replicas=10, min_replicas=0)
    inventory = Inventory.from_nodes([NodeSpec("n0", "H100-80GB", 8, False)])
    obs = _model(inventory, spec, ["ml/db-0", "ml/db-1", "ml/db-2", "ml/db-10"], by_index=by_index,
                 not_ready=("ml/db-1",))
    window = MetricsWindow(now=1000.0, step_s=10.0, models={"ml/db": WHOLE})
    plan = decide(ClusterSnapshot(now=1000.0, models={"ml/db": obs}, inventory=inventory), window, fresh_state(),
                  CoreConfig(policy=Wants({"ml/db": 3}))).plan
    assert [r.replica_id for r in _removed(plan, "ml/db")] == (["ml/db-10"] if by_index else ["ml/db-1"])


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 40), st.booleans(), st.booleans(), st.floats(0, 100)), min_size=1,
                max_size=12, unique_by=lambda t: t[0]),
       st.integers(0, 12), st.lists(st.text("abc-", min_size=1, max_size=4), max_size=3, unique=True))
def test_by_index_removals_are_the_highest_live_indices(pods, count, odd) -> None:
    """Whatever is Ready, starting or draining: the replicas named are the highest indices among those not already
    going, ids without an index last."""
    replicas = [Replica(f"ml/s-{i}", None, ready=ready, started_at=t, draining=draining)
                for i, ready, draining, t in pods]
    replicas += [Replica(f"ml/{o}x", None, ready=True, started_at=0.0) for o in odd]  # no index
    obs = ModelObservation("ml/s", None, len(replicas), tuple(replicas), removal_by_index=True)
    live = sorted((i for i, _, draining, _ in pods if not draining), reverse=True)
    got = choose_removals(obs, count)
    expect = [f"ml/s-{i}" for i in live[:count]]
    assert got[:len(expect)] == expect
    assert sorted(got[len(expect):]) == sorted(f"ml/{o}x" for o in odd)[:max(0, count - len(live))]


# -- preemption -------------------------------------------------------------------------------------------------
def _preempted(by_index: bool, wants: int = 2, low_wants: int = 2, mode: str = "priority") -> list[str]:
    """``top`` (priority 100) wants ``wants`` replicas on a full node; ``low`` (priority 0) holds two GPUs as
    ``low-0`` (the newer) and ``low-1``; what ``low`` loses (its own scale-down to ``low_wants`` and the
    preemptions)."""
    top = ModelSpec(name="top", slo_latency_ms=1000, service_time_ms=200, max_replicas=10, priority=100)
    low = ModelSpec(name="low", slo_latency_ms=1000, service_time_ms=200, max_replicas=10, priority=0,
                    min_replicas=0)
    inventory = Inventory.from_nodes([NodeSpec("n0", "H100-80GB", 3, False)])
    models = {"top": _model(inventory, top, ["top-0"], by_index=False),
              "low": _model(inventory, low, ["ns/low-0", "ns/low-1"], by_index=by_index,
                            started={"ns/low-0": 500.0, "ns/low-1": 0.0})}
    window = MetricsWindow(now=1000.0, step_s=10.0, models={
        "top": ModelMetrics(rate=np.full(12, 30.0), in_flight=np.full(12, 6.0)), "low": WHOLE})
    config = CoreConfig(policy=Wants({"top": wants, "low": low_wants}), arbitration=ArbitrationPolicy(mode=mode))
    plan = decide(ClusterSnapshot(now=1000.0, models=models, inventory=inventory), window, fresh_state(), config).plan
    return [r.replica_id for r in _removed(plan, "low")]


@pytest.mark.parametrize("mode", ["priority", "slo"])
def test_only_the_replica_a_by_index_scale_down_takes_is_preempted(mode: str) -> None:
    """A Deployment gives up its newest replica (``low-0``); a StatefulSet would delete ``low-1`` whatever slotwise
    named, so preempting ``low-0`` would free nothing (the preemptor would wait, and the next tick preempt again):
    ``low-1`` is the victim -- and the only one per tick, the next highest once it is going."""
    assert _preempted(False, mode=mode) == ["ns/low-0"]
    assert _preempted(True, mode=mode) == ["ns/low-1"]
    assert _preempted(False, wants=3, mode=mode) == ["ns/low-0", "ns/low-1"]
    assert _preempted(True, wants=3, mode=mode) == ["ns/low-1"]


def test_a_by_index_preemption_comes_after_the_models_own_removals() -> None:
    """``low`` scales itself down by one this tick (``low-1``, its highest): the replica a preemption can take is
    the next one the StatefulSet removes, ``low-0``."""
    assert _preempted(True, wants=3, low_wants=1) == ["ns/low-1", "ns/low-0"]
