"""Replicas that are pod groups in the simulator (issue 17, item 2): a replica of a model with ``pods_per_replica`` k
holds k slots from its placement until its drain ends, is Ready as one when its cold start ends, serves as one
replica, and its GPU-hours are k times a one-pod replica's; the models file and scenarios take ``pods-per-replica``."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autoscaler.api.plan import PlaceReplica, Plan, RemoveReplica
from autoscaler.api.spec import ModelSpec, SpecError, slot_request
from autoscaler.policies import make_policy
from autoscaler.sim import run as sim_run
from autoscaler.sim.cluster import SimCluster
from autoscaler.sim.defaults import parse_model_values
from autoscaler.sim.run import SimConfig, SimResult, simulate
from autoscaler.sim.workload import build_workload
from forecasting.traces.model import RateSeries
from sharing.cluster import nodes_from_spec
from sharing.packer import CostAwarePacker, place_group
from sharing.slots import Inventory

WHOLE = ModelSpec(name="a", slo_latency_ms=500, service_time_ms=100, cold_start_s=60, max_replicas=40)
SLICE = ModelSpec(name="a", slo_latency_ms=500, gpu_memory_gib=20, gpu_compute_share=0.25, service_time_ms=100,
                  cold_start_s=60, max_replicas=40)


def run(series: RateSeries, spec: ModelSpec, policy_name: str, nodes_spec: str, **policy_kw: object) -> SimResult:
    workload = build_workload(series, {"a": spec})
    return simulate(workload, nodes_from_spec(nodes_spec), make_policy(policy_name, **policy_kw),
                    SimConfig(burn_in_s=0.0, warmup_s=0.0))


# ------------------------------------------------------------------------------------------------ SimCluster


def test_a_group_holds_every_slot_is_ready_as_one_and_frees_them_all_on_drain() -> None:
    spec = WHOLE.with_(gpus_per_replica=2, pods_per_replica=3)
    nodes = nodes_from_spec("16xH100-80GB")
    cluster = SimCluster(nodes, ["a"], {"a": spec}, drain_s=np.array([20.0]))
    slots = place_group(CostAwarePacker(), cluster.inventory, slot_request(spec), 3)
    assert slots is not None
    cluster.apply(Plan(0.0, [PlaceReplica("a", "a-1", slots[0], slots[1:])]))
    assert cluster.inventory.gpus_in_use() == 6  # all three pods' slots
    assert cluster.gpus_allocated() == pytest.approx(6.0)
    (obs,) = cluster.snapshot(0.0).models.values()
    (r,) = obs.replicas
    assert r.group_slots == slots[1:] and not r.ready
    assert cluster.advance(59.0)[0] == 0
    assert cluster.advance(60.0)[0] == 1  # Ready when its cold start ends, as one replica
    assert cluster.n_held[0] == 1
    cluster.apply(Plan(100.0, [RemoveReplica("a", "a-1")]))
    assert cluster.advance(100.0)[0] == 0  # not routed from the removal on
    assert cluster.inventory.gpus_in_use() == 6  # ... its slots held while it drains
    cluster.advance(120.0)
    assert cluster.inventory.gpus_in_use() == 0 and cluster.gpus_allocated() == pytest.approx(0.0)
    assert cluster.n_held[0] == 0 and cluster.held_by_model[0] == 0.0


def test_losing_a_node_loses_the_group_replicas_with_a_pod_there() -> None:
    spec = WHOLE.with_(gpus_per_replica=8, pods_per_replica=2)
    cluster = SimCluster(nodes_from_spec("16xH100-80GB"), ["a"], {"a": spec}, drain_s=np.array([20.0]))
    slots = place_group(CostAwarePacker(), cluster.inventory, slot_request(spec), 2)
    assert slots is not None and {s.node for s in slots} == {"h100-80gb-0", "h100-80gb-1"}
    cluster.apply(Plan(0.0, [PlaceReplica("a", "a-1", slots[0], slots[1:])]))
    assert cluster.lose_node(slots[1].node, 10.0)["replicas"] == 1  # a worker's node: the whole group goes
    assert cluster.replicas[0] == {}
    assert cluster.inventory.device(slots[0].node, 0).idle  # the leader's slot is free again


# ------------------------------------------------------------------------------------------------ simulate


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pods=st.integers(2, 3), replicas=st.integers(1, 3), sliced=st.booleans())
def test_gpu_hours_of_a_k_pod_replica_are_k_times_a_one_pod_replicas(pods: int, replicas: int,
                                                                      sliced: bool) -> None:
    spec, nodes = (SLICE, "16xH100-80GB:mig") if sliced else (WHOLE, "64xH100-80GB")
    series = RateSeries(rates=np.full((1, 20), 1.0), models=("a",), step_s=60.0)
    one = run(series, spec, "static", nodes, replicas=replicas)
    group = run(series, spec.with_(pods_per_replica=pods), "static", nodes, replicas=replicas)
    assert one.gpu_hours > 0
    assert group.gpu_hours == pytest.approx(pods * one.gpu_hours)
    assert group.minute_replicas == pytest.approx(one.minute_replicas)  # a group serves as one replica


def test_a_two_pod_model_scales_by_groups(monkeypatch: pytest.MonkeyPatch) -> None:
    placed: list[PlaceReplica] = []

    class Recording(SimCluster):
        def apply(self, plan: Plan) -> None:
            placed.extend(plan.of_type(PlaceReplica))
            super().apply(plan)

    monkeypatch.setattr(sim_run, "SimCluster", Recording)
    # A ramp from 2 to 40 requests per second over 40 minutes: the model scales up as it goes.
    series = RateSeries(rates=np.linspace(2.0, 40.0, 40)[None, :], models=("a",), step_s=60.0)
    one = run(series, WHOLE, "slotwise", "64xH100-80GB")
    n_one = len(placed)
    placed.clear()
    group = run(series, WHOLE.with_(pods_per_replica=2), "slotwise", "64xH100-80GB")
    assert len(placed) >= 2
    assert all(len(a.slots) == 2 and len(set(a.slots)) == 2 for a in placed)  # every placement a whole group
    # Sizing is unchanged: the same replicas at every minute, each holding twice the GPUs.
    assert len(placed) == n_one
    assert group.minute_replicas == pytest.approx(one.minute_replicas)
    assert group.minute_replicas[0].max() > group.minute_replicas[0, 0]
    assert group.gpu_hours == pytest.approx(2 * one.gpu_hours)


# ------------------------------------------------------------------------------------------------ the key


def test_models_file_key_pods_per_replica() -> None:
    spec = parse_model_values("m", {"slo-latency-ms": 500, "pods-per-replica": 4, "gpus-per-replica": 2})
    assert spec.pods_per_replica == 4 and spec.gpus_per_replica == 2
    assert parse_model_values("m", {"slo-latency-ms": 500}).pods_per_replica == 1
    with pytest.raises(SpecError) as e:
        parse_model_values("m", {"slo-latency-ms": 500, "pods-per-replica": "two", "concurrency": 0})
    assert {p.key for p in e.value.problems} == {"pods-per-replica", "concurrency"}  # every problem named


def test_warm_start_places_whole_groups() -> None:
    cluster = SimCluster(nodes_from_spec("32xH100-80GB"), ["a"], {"a": WHOLE.with_(pods_per_replica=2,
                                                                                gpus_per_replica=4)},
                         drain_s=np.array([20.0]))
    series = RateSeries(rates=np.full((1, 10), 20.0), models=("a",), step_s=60.0)
    workload = build_workload(series, {"a": cluster.specs["a"]})
    sim_run._warm_start(cluster, workload, {"a": cluster.specs["a"]}, 10.0, CostAwarePacker())
    reps = list(cluster.replicas[0].values())
    assert reps and all(len(r.slots) == 2 for r in reps)
    assert cluster.inventory.gpus_in_use() == 8 * len(reps)
    assert isinstance(cluster.inventory, Inventory)


def test_the_lower_bound_counts_every_pod_of_a_group() -> None:
    from autoscaler.sim.lower_bound import replica_gpu_fraction

    nodes = nodes_from_spec("16xH100-80GB:mig")
    for spec in (WHOLE.with_(gpus_per_replica=2), SLICE):
        assert replica_gpu_fraction(spec.with_(pods_per_replica=3), nodes) == pytest.approx(
            3 * replica_gpu_fraction(spec, nodes))


def test_a_scenario_model_takes_pods_per_replica(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from autoscaler.sim.scenario import ScenarioError, load_scenario

    text = """\
duration: 1
teams:
  - {name: a, guaranteed_gpus: 4}
models:
  - {name: big, team: a, trace: azure-llm-2023, model: conv, slo-latency-ms: 2000, pods-per-replica: 2}
cluster: "16xH100-80GB"
"""
    ok = tmp_path / "ok.yaml"
    ok.write_text(text)
    (m,) = load_scenario(str(ok)).models
    assert m.spec.pods_per_replica == 2
    bad = tmp_path / "bad.yaml"
    bad.write_text(text.replace("pods-per-replica: 2", "pods-per-replica: 0"))
    with pytest.raises(ScenarioError, match=r"bad\.yaml: models\[0\]\.pods-per-replica: must be a whole number"):
        load_scenario(str(bad))
