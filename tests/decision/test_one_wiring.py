"""One wiring (issue 14): the live controller and the simulator configure the decision core with the same function
(``decision.config.build_core``) and plan a tick with the same call (``decision.tick.plan_tick``). Given the same
snapshot and metrics window and equivalent settings, the controller's planning path (``Controller.plan``) and the
simulator's (``plan_tick`` with ``sim.run.sim_core``'s configuration, as ``simulate`` runs it) plan the same tick,
node-level actions included: a MIG re-layout on a node where a placement needs a new instance, the time-slicing
config for a time-sliced model, the pod template of a model's first placement. The simulator then applies them.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from autoscaler.api.plan import (
    PlaceReplica,
    Plan,
    SetMigLayout,
    SetSlotTemplate,
    SetTimeSlicing,
    UpdateStatus,
)
from autoscaler.api.snapshot import ClusterSnapshot, MetricsWindow, ModelMetrics, SlotTemplate
from autoscaler.api.spec import ModelSpec, slot_request
from autoscaler.decision.arbitration import ArbitrationPolicy, TeamQuota
from autoscaler.decision.config import CoreConfig
from autoscaler.decision.node_actions import NodeActionState
from autoscaler.decision.state import fresh_state
from autoscaler.decision.tick import plan_tick
from autoscaler.live.controller import Controller, ControllerSettings, read_view
from autoscaler.live.kube.objects import ClusterView
from autoscaler.policies import make_policy
from autoscaler.sim.cluster import SimCluster
from autoscaler.sim.run import SimConfig, sim_core
from sharing.lending import LendingPolicy
from sharing.packer import CostAwarePacker
from sharing.slots import NodeSpec

T0 = "2026-11-30T10:00:00Z"
NOW = 1_764_500_000.0
BASE = {"slotwise.io/slo-latency-ms": "500", "slotwise.io/service-time-ms": "100",
        "slotwise.io/cold-start-seconds": "10", "slotwise.io/max-replicas": "4"}
H100 = "NVIDIA-H100-80GB-HBM3"


def _node(name: str, product: str, capacity: dict[str, str], labels: dict[str, str]) -> dict:
    labels = {"nvidia.com/gpu.product": product, "nvidia.com/gpu.count": "1",
              "nvidia.com/gpu.memory": "81559" if "H100" in product else "23034", **labels}
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}, "spec": {},
            "status": {"capacity": capacity, "allocatable": capacity}}


def _deployment(name: str, annotations: dict[str, str], limits: dict[str, str] | None, replicas: int) -> dict:
    labels = {"app": name}
    container: dict = {"name": "server", "image": "server:1"}
    if limits:
        container["resources"] = {"limits": limits}
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}", "annotations": annotations,
                         "labels": labels},
            "spec": {"replicas": replicas, "selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels}, "spec": {"containers": [container]}}}}


def _view(now: float = NOW) -> ClusterView:
    """An H100 in MIG (one 1g.10gb instance today) and an L4 time-sliced four ways. ``embed`` runs nothing and its
    template asks for no GPU: its first placement needs a 2g.20gb instance the H100 does not have (a re-layout) and
    sets its template. ``tiny`` (time-sliced shares) runs one replica and must have three: shares of one GPU."""
    nodes = [
        _node("h100", H100, {"nvidia.com/mig-1g.10gb": "1"},
              {"nvidia.com/mig.capable": "true", "nvidia.com/mig.strategy": "mixed",
               "nvidia.com/mig.config": "custom-1g", "nvidia.com/mig.config.state": "success"}),
        _node("l4", "NVIDIA-L4", {"nvidia.com/gpu": "4"}, {"nvidia.com/gpu.replicas": "4"}),
    ]
    deployments = [
        _deployment("embed", {**BASE, "slotwise.io/gpu-memory-gib": "15", "slotwise.io/gpu-compute-share": "0.25",
                              "slotwise.io/slot-kinds": "mig", "slotwise.io/min-replicas": "1"}, None, 0),
        _deployment("tiny", {**BASE, "slotwise.io/gpu-memory-gib": "4", "slotwise.io/gpu-compute-share": "0.2",
                             "slotwise.io/slot-kinds": "share", "slotwise.io/min-replicas": "3"},
                    {"nvidia.com/gpu": "1"}, 1),
    ]
    pods = [{"apiVersion": "v1", "kind": "Pod",
             "metadata": {"name": "tiny-0", "namespace": "ns", "labels": {"app": "tiny"}, "creationTimestamp": T0},
             "spec": {"nodeName": "l4", "containers": [{"name": "server", "resources": {
                 "limits": {"nvidia.com/gpu": "1"}}}]},
             "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}}]
    view = read_view(deployments, pods, nodes, now=now)
    assert not view.problems, view.problems
    return view


def _window(snapshot: ClusterSnapshot) -> MetricsWindow:
    return MetricsWindow(snapshot.now, 15.0, {k: ModelMetrics(rate=np.full(60, 3.0), in_flight=np.full(60, 0.5))
                                              for k in snapshot.models})


def _assert_same(live: Plan, simulated: Plan) -> None:
    """The same decisions, in the same order. Statuses are reporting: the controller reports every decision, with
    the predicted latency (``report_every_decision``); the simulator only a changed one, without it (a search per
    status) -- so each of the simulator's is among the controller's, in order."""
    def decided(plan: Plan) -> list:
        return [a for a in plan.actions if not isinstance(a, UpdateStatus)]

    def statuses(plan: Plan) -> list:
        return [dataclasses.replace(a, predicted_latency_ms=None) for a in plan.of_type(UpdateStatus)]

    assert decided(live) == decided(simulated)
    reported = iter(statuses(live))
    assert all(any(s == r for r in reported) for s in statuses(simulated))


LENDING = {
    "off": LendingPolicy(),
    "pods": LendingPolicy(enabled=True),
    "kueue": LendingPolicy(enabled=True, mode="kueue", max_reclaim_s=300.0),
}
ARBITRATION = ArbitrationPolicy(teams=(TeamQuota("default", 2.0),))


def _paths(lending: LendingPolicy, policy: str = "slotwise") -> tuple[Controller, CoreConfig]:
    """The controller as ``slotwise run`` builds it, and the simulator's core as ``simulate`` builds it, from the
    same settings."""
    ctl = Controller(object(), ControllerSettings(policy=policy, lending=lending, arbitration=ARBITRATION))
    return ctl, sim_core(make_policy(policy), SimConfig(lending=lending, arbitration=ARBITRATION))


def _settings(core: CoreConfig) -> dict:
    forecaster = core.forecaster_factory()
    lent = core.lending is not None and core.lending.enabled
    return {
        "policy": type(core.policy), "upper_quantile": core.upper_quantile, "arbitration": core.arbitration,
        "packer": {k: v for k, v in vars(core.packer).items() if not k.startswith("_")},
        "forecaster": (forecaster.step_s, forecaster.horizon, forecaster.levels),
        # Lending off: the controller keeps its disabled policy (to reclaim GPUs lent before it was switched off),
        # the simulator has none (nothing was lent before a run); either way no lend stage runs.
        "lending": core.lending if lent else None,
        "whole_nodes_only": core.lending_whole_nodes_only if lent else None,
        "consolidate_removals": core.consolidate_removals,
    }


@pytest.mark.parametrize("lending", list(LENDING), ids=list(LENDING))
def test_the_controller_and_the_simulator_configure_the_core_alike(lending: str) -> None:
    ctl, sim = _paths(LENDING[lending])
    assert _settings(ctl.core) == _settings(sim)
    # The lend stage looks ahead by the reclaim deadline plus a cold start: the forecaster forecasts that far.
    horizon = ctl.core.forecaster_factory().horizon * 60.0
    assert horizon == (300.0 if lending == "off" else LENDING[lending].max_reclaim_s + 600.0)
    # Every mode packs onto nodes in use and empties the least used first (the default since issue 15).
    assert sim.packer.prefer_open_nodes is sim.consolidate_removals is True  # type: ignore[attr-defined]
    # The simulator's own two: no metric lag, a status only when a decision changes.
    assert (ctl.core.metric_lag_s, ctl.core.report_every_decision) == (15.0, True)
    assert (sim.metric_lag_s, sim.report_every_decision) == (0.0, False)


@pytest.mark.parametrize("lending", list(LENDING), ids=list(LENDING))
def test_the_controller_and_the_simulator_plan_the_same_tick(lending: str) -> None:
    ctl, sim = _paths(LENDING[lending])
    sim_state, sim_nodes = fresh_state(), NodeActionState()
    for now in (NOW, NOW + 60.0):  # the second tick: what the first one planned is remembered alike
        view = _view(now)
        window = _window(view.snapshot)
        live = ctl.plan(view, window)
        simulated = plan_tick(view.snapshot, window, sim_state, sim, sim_nodes)
        _assert_same(live, simulated)
        if now == NOW:
            first = live
    kinds = [type(a) for a in first.actions]
    assert PlaceReplica in kinds
    (layout,) = first.of_type(SetMigLayout)
    assert layout.node == "h100" and layout.changed == (0,)
    kept_and_new = {("1g", 0), ("2g", 2)}  # the 1g.10gb instance there is, a 2g.20gb one for embed
    assert kept_and_new <= set(layout.layouts[0] or ())
    (shares,) = first.of_type(SetTimeSlicing)
    assert shares.replicas["nvidia.com/gpu"] >= 2
    (template,) = first.of_type(SetSlotTemplate)
    assert template.model == "ns/embed"
    assert template.resources["limits"] == {"nvidia.com/mig-2g.20gb": "1"}
    assert template.node_selector == {"nvidia.com/gpu.product": H100}
    assert ctl.node_state == sim_nodes and sim_nodes.time_slicing == shares.replicas


def test_the_simulator_applies_the_node_level_actions_and_shows_the_template_next() -> None:
    spec = ModelSpec(name="m", slo_latency_ms=500.0, slot_kinds=("mig",), gpu_memory_gib=15.0, gpu_compute_share=0.25)
    cluster = SimCluster([NodeSpec("n", "H100-80GB", 1, mig_enabled=True)], ["m"], {"m": spec}, np.array([10.0]))
    assert cluster.snapshot(0.0).templates == {"m": SlotTemplate()}  # nothing placed: its pods ask for no GPU
    snapshot = cluster.snapshot(0.0)
    window = MetricsWindow(0.0, 10.0, {"m": ModelMetrics(rate=np.full(6, 3.0), in_flight=np.full(6, 0.5))})
    core = sim_core(make_policy("static", replicas=2), SimConfig())
    nodes = NodeActionState()
    plan = plan_tick(snapshot, window, fresh_state(), core, nodes)
    (layout,) = plan.of_type(SetMigLayout)
    (template,) = plan.of_type(SetSlotTemplate)
    cluster.apply(plan)
    assert cluster.mig_layouts == {"n": layout.layouts}
    assert cluster.snapshot(0.0).templates["m"] == SlotTemplate(template.resources, template.node_selector)
    assert template.resources["limits"] == {"nvidia.com/mig-2g.20gb": "1"}
    # Running now: a third replica keeps the template.
    more = sim_core(make_policy("static", replicas=3), SimConfig())
    later = plan_tick(cluster.snapshot(100.0), dataclasses.replace(window, now=100.0), fresh_state(), more, nodes)
    assert later.of_type(PlaceReplica) and not later.of_type(SetSlotTemplate)


def test_a_warm_started_model_has_the_template_of_the_slots_it_runs_on() -> None:
    spec = ModelSpec(name="m", slo_latency_ms=500.0, slot_kinds=("whole",))
    node = NodeSpec("n", "H100-80GB", 2, labels={"nvidia.com/gpu.product": H100})
    cluster = SimCluster([node], ["m"], {"m": spec}, np.array([10.0]))
    slot = CostAwarePacker().place(cluster.inventory, slot_request(spec))
    assert slot is not None
    cluster.preplace("m", [slot])
    template = cluster.snapshot(0.0).templates["m"]
    assert template == SlotTemplate({"requests": {"nvidia.com/gpu": "1"}, "limits": {"nvidia.com/gpu": "1"}},
                                    {"nvidia.com/gpu.product": H100})
