"""The decision core's settings (:class:`CoreConfig`), and the one place they are built from what a user sets.

The simulator (``slotwise simulate``) and the live controller (``slotwise run``) both build their configuration
with :func:`build_core`, so a simulated run is configured as a deployed controller would be.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

from autoscaler.api.spec import SpecLimits
from autoscaler.decision.arbitration import ArbitrationPolicy
from autoscaler.decision.scaledown import DEFAULT_KV_SATURATION
from autoscaler.decision.zero import ZeroConfig
from autoscaler.estimation.forecast import FleetForecaster
from autoscaler.policies.base import Policy
from sharing.lending import LendingPolicy
from sharing.mig_exact_model import DEFAULT_BUDGET_S
from sharing.packer import CostAwarePacker, Packer

# The exact placement's wall-clock safety cut. What bounds a solve is its work limit (sharing's DEFAULT_NODE_LIMIT:
# HiGHS branch-and-bound nodes, at most ~1.3 s on the mig-bench's clusters here), so a snapshot gets the same plan on
# any machine; the cut fires only on a machine several times slower, and is counted then
# (slotwise_exact_budget_exceeded_total; docs/sharing.md, "Exact placement"). Only a tick that opens a GPU, or whose
# batch the packer finds no room for, on a cluster of <= 16 MIG GPUs (or an empty one) pays for a solve (the decision
# blocks meanwhile; the controller's `exact_budget_s` setting, 0: off).
DEFAULT_EXACT_BUDGET_S = DEFAULT_BUDGET_S


@dataclass
class CoreConfig:
    """Settings of the decision core. ``forecaster_factory`` builds the fleet forecaster when the state
    has none (a warm-started one can be put in the state instead); ``upper_quantile`` is the forecast
    quantile reported in the status. Build it with :func:`build_core`, which derives the fields that depend on
    each other (the forecaster's horizon from lending, the pods-mode packing); only a benchmark that times
    ``decide`` alone (``bench/decide_speed.py``, no lending) constructs one directly."""

    policy: Policy
    packer: Packer = field(default_factory=CostAwarePacker)
    forecaster_factory: Callable[[], FleetForecaster] = FleetForecaster
    upper_quantile: float = 0.9
    metric_lag_s: float = 0.0
    # The live controller reports every decision (status, metrics: forecast and predicted latency); the
    # simulator only asks for a status when the decision changes, without the predicted latency (a search).
    report_every_decision: bool = False
    # Lending idle reserved GPUs to training (autoscaler/decision/lend.py); None: no lend stage; disabled: the stage
    # runs only while GPUs are still lent, to reclaim them. Whole nodes only for the Kubernetes "pods" mode (a node
    # label cannot split a node).
    lending: LendingPolicy | None = None
    lending_whole_nodes_only: bool = False
    # A scale-down removes replicas on the nodes with the fewest replicas first (then as usual), so emptied nodes
    # become whole and lendable; build_core turns it on for pods-mode lending (issue 8).
    consolidate_removals: bool = False
    # Who gets GPUs when they run out: team quotas, priorities, SLO damage, preemption
    # (autoscaler/decision/arbitration/).
    arbitration: ArbitrationPolicy = field(default_factory=ArbitrationPolicy)
    # The operator's caps on what one model's annotations may ask for (the settings' `limits:`): a model over one is
    # refused before the core decides (autoscaler/decision/admission.py), so it cannot stall or reconfigure the rest.
    limits: SpecLimits = field(default_factory=SpecLimits)
    # KV-cache use (ModelMetrics.kv_cache_usage, a fraction) at or above which a model's engines count as saturated:
    # no scale-down, and one more replica when its queue grows (the rails, autoscaler/decision/scaledown.py); None: off.
    kv_saturation: float | None = DEFAULT_KV_SATURATION
    # The zero rail (min-replicas 0 models; autoscaler/decision/zero.py): idle-time decay, the fleet prior.
    zero: ZeroConfig = field(default_factory=ZeroConfig)
    # Seconds a tick may spend placing the replicas it starts again exactly, by the MILP, on a small MIG cluster
    # when that saves a GPU (autoscaler/decision/arbitration/exact.py; issue 19); 0: the packer's placement only.
    exact_budget_s: float = DEFAULT_EXACT_BUDGET_S

    def __post_init__(self) -> None:
        if self.kv_saturation is not None and not 0.0 < self.kv_saturation <= 1.0:
            raise ValueError(f"kv_saturation must be a fraction in (0, 1] or None, got {self.kv_saturation!r}")
        if not self.exact_budget_s >= 0.0:
            raise ValueError(f"exact_budget_s must be >= 0 seconds, got {self.exact_budget_s!r}")


def build_core(
    policy: Policy,
    *,
    lending: LendingPolicy | None = None,
    arbitration: ArbitrationPolicy | None = None,
    metric_lag_s: float = 0.0,
    report_every_decision: bool = False,
    prefer_open_nodes: bool | None = None,
    consolidate_removals: bool | None = None,
    device_anti_affinity: bool = False,
    limits: SpecLimits | None = None,
    kv_saturation: float | None = DEFAULT_KV_SATURATION,
    exact_budget_s: float = DEFAULT_EXACT_BUDGET_S,
) -> CoreConfig:
    """The decision core's configuration from what ``slotwise run`` (the controller's settings) or ``slotwise
    simulate`` (the simulator's flags) set: the packer, the forecaster (its horizon) and the lend stage's settings.

    ``lending`` None or disabled: no lending (a disabled policy still reclaims GPUs lent before). With lending
    enabled the forecaster looks ahead as far as the lend stage does: the reclaim deadline plus a cold start.
    So that whole nodes go idle (free for training, for a larger model, or for the cluster autoscaler to remove),
    the packer prefers nodes already in use and a scale-down empties the least used node first: measured first for
    pods-mode lending, which lends whole idle nodes only (docs/benchmarks.md section 7), and on by default since
    issue 15 (the demo's idle reserved GPU-hours on nodes holding replicas 9.5 -> 4.5 for slotwise at the same
    GPU-hours and SLO; section 10). ``prefer_open_nodes`` / ``consolidate_removals`` False turn either off (None:
    on); ``device_anti_affinity`` (pods-mode lending only) spreads a model's replicas over devices only, not nodes.
    ``limits``: the caps on every model's annotations (None: the safe defaults of :class:`SpecLimits`).
    ``kv_saturation``: the KV-cache fraction at which the rails hold scale-downs (None: off; docs/metrics.md).
    ``exact_budget_s``: the wall-clock safety cut on the exact placement of the replicas a tick starts (0: off; the
    solves are bounded by their work limit first).
    """
    enabled = lending if lending is not None and lending.enabled else None
    whole_nodes = lending is not None and lending.mode == "pods"
    forecaster: Callable[[], FleetForecaster] = FleetForecaster
    if enabled is not None:
        forecaster = partial(FleetForecaster, horizon_s=max(300.0, enabled.max_reclaim_s + 600.0))
    return CoreConfig(
        policy=policy,
        packer=CostAwarePacker(prefer_open_nodes=prefer_open_nodes is not False,
                               node_anti_affinity=not (whole_nodes and device_anti_affinity)),
        forecaster_factory=forecaster,
        metric_lag_s=metric_lag_s,
        report_every_decision=report_every_decision,
        lending=lending,
        lending_whole_nodes_only=whole_nodes,
        consolidate_removals=consolidate_removals is not False,
        arbitration=arbitration if arbitration is not None else ArbitrationPolicy(),
        limits=limits if limits is not None else SpecLimits(),
        kv_saturation=kv_saturation,
        exact_budget_s=exact_budget_s,
    )
