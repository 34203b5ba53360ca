"""One tick's whole plan: :func:`plan_tick` runs the decision core and plans the node-level actions its placements
imply. The simulator (:func:`autoscaler.sim.run.simulate`), the live controller
(:meth:`autoscaler.live.controller.Controller.plan`) and ``bench/controller_tick.py`` all plan a tick with it, so
what is simulated is what is deployed.
"""

from __future__ import annotations

from autoscaler.api.plan import Plan
from autoscaler.api.snapshot import ClusterSnapshot, MetricsWindow
from autoscaler.decision.config import CoreConfig
from autoscaler.decision.core import decide
from autoscaler.decision.node_actions import NodeActionState, node_actions
from autoscaler.decision.state import ControllerState


def plan_tick(
    snapshot: ClusterSnapshot,
    metrics: MetricsWindow,
    state: ControllerState,
    config: CoreConfig,
    nodes: NodeActionState,
) -> Plan:
    """``decide`` (which updates ``state``), then the MIG layouts, the time-slicing config (``nodes`` remembers the
    last one) and the slot templates the placements need, appended to the plan in that order."""
    decision = decide(snapshot, metrics, state, config)
    plan = decision.plan
    plan.actions.extend(node_actions(snapshot, plan, decision.inventory, nodes,
                                     max_time_slice_replicas=config.limits.max_time_slice_replicas))
    return plan
