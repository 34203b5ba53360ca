"""What the decision core sees: a cluster snapshot and a metrics window, both plain data.

Built by the Cluster and Metrics ports (simulated or Kubernetes/Prometheus adapters);
the decision core never does I/O and never reads a clock: ``now`` is in the snapshot.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from autoscaler.api.spec import ModelSpec, SpecError
from sharing.slots import Inventory, Slot


@dataclass(frozen=True)
class Replica:
    replica_id: str
    slot: Slot | None  # None: not placed on a known GPU slot (a Pending pod, or one on a node outside the inventory)
    ready: bool
    started_at: float  # when it was placed (scale-up decision time)
    draining: bool = False
    # A replica that is a group of pods (a LeaderWorkerSet replica: leader + workers, ModelSpec.pods_per_replica):
    # ``slot`` is the leader's, these the other pods' slots (the ones known); empty for a one-pod replica.
    group_slots: tuple[Slot, ...] = ()


@dataclass(frozen=True)
class ModelObservation:
    """One managed model as observed. ``spec`` is None when its annotations are invalid (``spec_error``)."""

    name: str
    spec: ModelSpec | None
    desired_replicas: int  # the Deployment's current scale
    replicas: tuple[Replica, ...] = ()
    spec_error: SpecError | None = None
    # another autoscaler (an HPA, a KEDA ScaledObject: "<Kind> <ns>/<name>") writes this model's replica count:
    # slotwise sizes it (to report or advise) but cannot remove its replicas, so it is never a preemption victim
    scaled_by: str | None = None
    # the workload removes its highest-index replicas itself on a scale-down (a StatefulSet its highest ordinals, a
    # LeaderWorkerSet its highest group indices: neither honours pod-deletion-cost), so slotwise cannot choose which
    # go: ``choose_removals`` names those, and only the next of them can be a preemption victim
    removal_by_index: bool = False
    # where its traffic goes now (a model that may go to zero): True through the activator, False straight to its
    # pods, None when nobody fronts it (no activator, or the model is not fronted); SetRouting changes it
    via_activator: bool | None = None

    # Cached: the core asks every tick, and an observation is immutable.
    @cached_property
    def ready_replicas(self) -> int:
        return sum(1 for r in self.replicas if r.ready and not r.draining)

    @cached_property
    def active_replicas(self) -> int:
        """Placed and not draining (ready or still starting)."""
        return sum(1 for r in self.replicas if not r.draining)


DEFAULT_GRACE_S = 30.0  # Kubernetes' default terminationGracePeriodSeconds: a workload's notice before SIGKILL


@dataclass(frozen=True)
class TrainingWorkload:
    """A preemptible training workload running on (or waiting for) GPU capacity inference lends.

    ``kind`` is where it came from (``Pod``, ``Job``, ``Workload`` for Kueue); ``gpus`` its GPU-equivalents;
    ``grace_s`` its termination grace period (the reclaim contract caps lending by it).
    """

    name: str  # namespace/name
    kind: str
    gpus: float
    nodes: tuple[str, ...] = ()
    running: bool = False
    grace_s: float = DEFAULT_GRACE_S
    started_at: float | None = None
    last_checkpoint_at: float | None = None
    # The (node, GPU index) pairs it runs on, where the source knows them; () = only its nodes are known, and the
    # lending plan attributes lent GPUs to it by node (sharing.lending.attribute).
    devices: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True)
class SlotTemplate:
    """The slot half of a model's pod template: the GPU resources its pods ask for (the ``nvidia.com/*`` requests
    and limits, shaped as :func:`sharing.render.pod_resources` writes them; empty: no GPU) and the node selector they
    are created with. Node-level planning (:mod:`autoscaler.decision.node_actions`) compares a tick's placements with
    it; the live adapters read it from the Deployment, the simulator keeps it as the plans set it."""

    resources: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    node_selector: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ClusterSnapshot:
    now: float
    models: dict[str, ModelObservation]
    inventory: Inventory  # GPU devices and what is allocated on them; the core copies before changing it
    training: tuple[TrainingWorkload, ...] = ()
    # GPUs lent to training now: (node, device) -> when lent. In the inventory they are allocated whole to the
    # owner ``sharing.lending.lent_owner(node, device)`` under the model ``sharing.lending.LENT_MODEL``.
    lent: Mapping[tuple[str, int], float] = field(default_factory=dict)
    # Each model's pod template as far as slots go; a model absent here gets no template action.
    templates: Mapping[str, SlotTemplate] = field(default_factory=dict)


@dataclass(frozen=True)
class ModelMetrics:
    """Recent observations of one model, oldest first, one sample per ``MetricsWindow.step_s``.

    ``stale`` is True when the metric source is lost or older than the staleness limit: policies must
    then hold replicas rather than guess.

    ``partial`` says why the window covers only part of the model (None: the source knows of nothing missing),
    e.g. some of its scrape targets not answering: what is missing then reads as low load, so the rails never
    scale down on it (:func:`autoscaler.decision.scaledown.normalize`). ``observed_fraction``: the share of the
    model's known sources (scrape targets) the window holds, 1.0 when all answer or when the source knows no
    targets, NaN when it could not tell (``partial`` then says why). :meth:`partial_reason` adds what the samples
    themselves show (no request-rate sample at all, or none for the newest step).
    """

    rate: np.ndarray  # requests/s per step
    in_flight: np.ndarray  # mean requests in the system (running + queued) per step
    latency_s: float = float("nan")  # observed latency at the model's SLO percentile, last step
    queue_depth: float = 0.0
    stale: bool = False
    future_rate: float | None = None  # clairvoyant load for the next tick: ONLY the oracle baseline gets this
    # requests/s settled within the SLO latency per step (Prometheus: the rate of the latency histogram's
    # bucket at the SLO); None where the source has no such series. rate vs this = error-budget burn.
    within_rate: np.ndarray | None = None
    partial: str | None = None
    observed_fraction: float = 1.0
    # the engines' own saturation signal: KV-cache use as a fraction (0..1) at the newest step, the mean over the
    # model's replicas (vLLM's vllm:kv_cache_usage_perc, SGLang's token usage ...); NaN where the source has none
    kv_cache_usage: float = float("nan")
    # observed inter-token latency (ITL/TPOT) at the model's SLO percentile over the last step, from the engine's
    # ITL histogram (vLLM's vllm:inter_token_latency_seconds, SGLang's, TGI's mean time per token); NaN without one
    itl_s: float = float("nan")
    # requests held for this model while it has no Ready replica (the activator's report in the live controller, the
    # engine's held queue in the simulator), at the newest step; > 0 scales a model at zero to one at once
    # (autoscaler/decision/zero.py), whatever the other samples say
    held_requests: float = 0.0
    # requests executing (in the engines' batches, not waiting) summed over the model's replicas, at the step
    # ``queue_depth`` is read at (vLLM's vllm:num_requests_running, SGLang's num_running_reqs, TGI's batch size); NaN
    # where the source has no such gauge. With a queue it says how many requests the engines admit at once
    # (autoscaler/estimation/batch.py)
    running: float = float("nan")

    def partial_reason(self) -> str | None:
        """Why this window is not the whole model's load (a scale-down must not be decided on it); None when it
        is. The source's own word (``partial``) first, then the samples: an empty window, or a NaN request rate
        at the newest step (the load now is unknown, and every policy's short window would read it as zero)."""
        if self.partial is not None:
            return self.partial
        rate = self.rate
        if rate.size == 0:
            return NO_RATE_SAMPLES
        if not math.isfinite(rate[-1]):
            return NO_NEWEST_RATE
        return None


NO_RATE_SAMPLES = "no request-rate samples in the window"
NO_NEWEST_RATE = "no request-rate sample for the newest step"


# "No data" for a model the window does not cover: a flag, never zero load.
_EMPTY = np.zeros(0)
STALE_METRICS = ModelMetrics(rate=_EMPTY, in_flight=_EMPTY, stale=True)


@dataclass(frozen=True)
class MetricsWindow:
    now: float
    step_s: float
    models: dict[str, ModelMetrics] = field(default_factory=dict)


def window_mean(samples: np.ndarray, step_s: float, window_s: float) -> float | None:
    """Mean of the samples covering the last ``window_s`` (at least one sample); None without data.

    The window is rounded to the nearest whole number of steps: rounding up would make a short window
    (KPA's 6 s panic window on 5 s steps) twice as long and hide the very bursts it exists to catch.
    """
    if samples.size == 0:
        return None
    n = max(1, math.floor(window_s / step_s + 0.5)) if step_s > 0 else 1
    if n <= 8:
        # (every policy asks every tick: for a few samples plain floats beat numpy's call overhead)
        vals = [v for v in samples[-n:].tolist() if math.isfinite(v)]
        return sum(vals) / len(vals) if vals else None
    tail = samples[-n:]
    finite = tail[np.isfinite(tail)]
    if finite.size == 0:
        return None
    return float(finite.mean())
