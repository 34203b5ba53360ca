"""Lending reserved-but-idle inference GPUs to preemptible training, and taking them back ahead of need.

Pure: a function of the inventory, what inference will need over the reclaim horizon, what is lent now and the
training workloads on it (no I/O, no clock: ``now`` is an argument). The decision core calls it after packing;
the simulator and the Kubernetes actuator carry out its decisions (``LendGpus`` / ``ReclaimGpus`` in
``autoscaler/plan.py``).

Terms (issue 8):
- **reserved**: what sizing needs at the upper quantile over the reclaim horizon (reclaim deadline + each model's
  cold start) plus a **warm buffer** that is never lent;
- **idle** = reserved minus in use; **lendable** = idle shaped into blocks training can use (whole GPUs, or large
  MIG instances), preferring blocks the packer keeps contiguous (whole idle nodes first);
- **reclaim ahead of need**: when inference will need lent capacity within (reclaim deadline + cold start), reclaim
  now; **anti-thrash**: a minimum lend duration and hysteresis; **preemption order**: the least training work lost
  (time since the last checkpoint x GPUs), then the smallest job.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

LENT_MODEL = "(lent)"  # the inventory's model name for GPUs lent to training: no inference replica lands there


def lent_owner(node: str, device: int) -> str:
    """The inventory owner of a lent GPU."""
    return f"lent:{node}/{device}"


@dataclass(frozen=True)
class LendingPolicy:
    """The lending settings (``lending:`` in the controller's settings file and the chart's values).

    ``max_reclaim_s`` is the published reclaim contract (``maxReclaimSeconds``): from the decision to reclaim until
    the capacity is free. Only workloads whose termination grace period fits in it may run on lent capacity.
    """

    enabled: bool = False
    mode: str = "pods"  # "pods": label/taint lendable nodes, evict through the Eviction API; "kueue": ClusterQueue
    max_reclaim_s: float = 120.0
    warm_buffer_gpus: float = 1.0  # GPU-equivalents never lent (absorbs growth during a reclaim)
    warm_buffer_fraction: float = 0.02  # ... or this share of the inference GPUs, whichever is larger
    min_lend_s: float = 600.0  # a block lent stays lent at least this long unless inference needs it
    hysteresis_gpus: float = 1.0  # lend more only when the lendable surplus exceeds this
    min_block_gpus: float = 1.0  # the smallest block worth lending (training wants whole GPUs)
    # Kueue mode: the inference ClusterQueue whose lendingLimit the controller sets, and its flavor/resource
    kueue_cluster_queue: str = "inference"
    kueue_flavor: str = "default-flavor"
    kueue_resource: str = "nvidia.com/gpu"

    def __post_init__(self) -> None:
        if self.mode not in ("pods", "kueue"):
            raise ValueError(f"lending mode must be 'pods' or 'kueue', got {self.mode!r}")
        for name in ("max_reclaim_s", "warm_buffer_gpus", "warm_buffer_fraction", "min_lend_s", "hysteresis_gpus",
                     "min_block_gpus"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"lending {name} must be a finite number >= 0, got {value!r}")
        if self.max_reclaim_s <= 0:
            raise ValueError("lending max_reclaim_s must be > 0")
