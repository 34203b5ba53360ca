"""The decision core's settings (:class:`CoreConfig`), and the one place they are built from what a user sets.

The simulator (``slotwise simulate``) and the live controller (``slotwise run``) both build their configuration
with :func:`build_core`, so a simulated run is configured as a deployed controller would be.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from autoscaler.decision.arbitration import ArbitrationPolicy
from autoscaler.estimation.forecast import FleetForecaster
from autoscaler.policies.base import Policy
from sharing.lending import LendingPolicy
from sharing.packer import CostAwarePacker, Packer


@dataclass
class CoreConfig:
    """Settings of the decision core. ``forecaster_factory`` builds the fleet forecaster when the state
    has none (a warm-started one can be put in the state instead); ``upper_quantile`` is the forecast
    quantile reported in the status."""

    policy: Policy
    packer: Packer = field(default_factory=CostAwarePacker)
    forecaster_factory: Callable[[], FleetForecaster] = FleetForecaster
    upper_quantile: float = 0.9
    metric_lag_s: float = 0.0
    # The live controller reports every decision (status, metrics: forecast and predicted latency); the
    # simulator only asks for a status when the decision changes, without the predicted latency (a search).
    report_every_decision: bool = False
    # Lending idle reserved GPUs to training (autoscaler/decision/lend.py); None or disabled: no lend stage. Whole nodes
    # only for the Kubernetes "pods" mode (a node label cannot split a node).
    lending: LendingPolicy | None = None
    lending_whole_nodes_only: bool = False
    # Opt-in (issue 8, pods-mode lending): a scale-down removes replicas on the nodes with the fewest replicas
    # first (then as usual), so emptied nodes become whole and lendable.
    consolidate_removals: bool = False
    # Who gets GPUs when they run out: team quotas, priorities, SLO damage, preemption
    # (autoscaler/decision/arbitration.py).
    arbitration: ArbitrationPolicy = field(default_factory=ArbitrationPolicy)
