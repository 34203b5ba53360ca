"""What the simulator serves: a trace, each model's spec, and the queueing engines' view of both.

The per-request service times (occupancy, and the part that counts toward SLO latency) are derived
once, in :meth:`autoscaler.sim.queueing.Workload.from_request_log`. Per model, the resulting
:class:`ServiceProfile` is what a controller would know from offline profiling: it warm-starts the
capacity model and sizes the static and oracle baselines.

Those service times are a replica's on the model's reference GPU (one whole H100-80GB: :mod:`sharing.slot_speed`);
the engines serve each replica at its slot's speed. Sizing for a slot of speed ``s`` is sizing with the profile scaled
by ``1 / s`` (``ServiceProfile.scaled``): :func:`peak_replicas` takes the speeds :func:`expected_speeds` finds.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from autoscaler.api.spec import ModelSpec, SpecError, replica_speed, slot_request
from autoscaler.estimation.capacity import ServiceProfile, min_replicas_for_slo, profile_from_spec
from autoscaler.sim.queueing import Workload
from forecasting.traces.model import RateSeries, RequestLog, Trace
from sharing.packer import CostAwarePacker, Packer
from sharing.slots import Inventory, NodeSpec

Specs = dict[str, ModelSpec | SpecError]


@dataclass(frozen=True)
class SimWorkload:
    trace: Trace
    specs: Specs
    queue: Workload  # the engines' arrays
    # The trace's past, before the simulated part: the forecaster's warm start (the controller's
    # Prometheus history, in a live cluster). None = the controller starts with no history.
    history: RateSeries | None = None
    # The same past as offered work (requests/s of the profile each model starts from; autoscaler/estimation/work.py):
    # what a learning policy's forecaster is warm-started from. None: no history, or a rate series (no requests).
    history_work: RateSeries | None = None
    # What the controller is told when it differs from what the engines serve (``slotwise simulate
    # --declared-models``): the annotations it reads and the profiles it starts from, while ``specs``/``queue`` are
    # the truth the engines serve -- the what-if of a spec that is wrong. None: told the truth.
    declared: Specs | None = None
    declared_queue: Workload | None = None

    @property
    def controller_specs(self) -> Specs:
        """The specs the controller reads (its models' annotations): the declared ones, else the served ones."""
        return self.specs if self.declared is None else self.declared

    @property
    def controller_profiles(self) -> dict[str, ServiceProfile]:
        """The profiles the controller starts from (offline profiling of the declared spec), else :attr:`profiles`;
        at the declared concurrency either way (a KV cache that fits fewer is the engines', not told:
        :meth:`~autoscaler.sim.queueing.Workload.with_kv_cache`)."""
        if self.declared_queue is None and self.queue.declared_concurrency is None:
            return self.profiles
        q = (self.queue if self.declared_queue is None else self.declared_queue).as_declared()
        return {m: q.profile(i) for i, m in enumerate(q.models)}

    @property
    def models(self) -> tuple[str, ...]:
        return self.queue.models

    @property
    def duration_s(self) -> float:
        if isinstance(self.trace, RequestLog):
            return float(math.ceil(self.trace.duration_s + 1e-9))
        return self.trace.duration_s

    @property
    def profiles(self) -> dict[str, ServiceProfile]:
        return {m: self.queue.profile(i) for i, m in enumerate(self.models)}

    def arrivals_per_tick(self, dt: float) -> np.ndarray:
        """Requests arriving in each tick ``[k*dt, (k+1)*dt)`` per model, shape (M, n_ticks)."""
        n = max(1, int(math.ceil(self.duration_s / dt)))
        if isinstance(self.trace, RequestLog):
            k = np.minimum((self.trace.t / dt).astype(np.int64), n - 1)
            out = np.zeros((len(self.models), n))
            np.add.at(out, (self.trace.model_index, k), 1.0)
            return out
        # Piecewise-constant rates integrated over each tick (ticks may straddle trace steps).
        trace = self.trace
        rates = np.nan_to_num(trace.rates, nan=0.0)
        cum = np.concatenate([np.zeros((rates.shape[0], 1)), np.cumsum(rates * trace.step_s, axis=1)], axis=1)
        grid = trace.start_s + np.arange(cum.shape[1]) * trace.step_s
        edges = np.arange(n + 1) * dt
        at_edges = np.stack([np.interp(edges, grid, row) for row in cum])
        return np.diff(at_edges, axis=1)


def served_as(specs: Specs) -> dict[str, ModelSpec]:
    """The spec each model is *served* with. A model with invalid annotations still receives its real
    traffic; it is served as a default model while the controller leaves it alone."""
    return {m: s if isinstance(s, ModelSpec) else ModelSpec(name=m) for m, s in specs.items()}


def build_workload(trace: Trace, specs: Specs, seed: int = 0, history_s: float = 0.0,
                   declared: Specs | None = None) -> SimWorkload:
    """The workload of ``trace``; with ``history_s`` > 0 its first ``history_s`` seconds are the
    controller's history (warm start) and only the rest is simulated. ``declared``: the specs the controller is told,
    when not ``specs`` (which the engines serve; :attr:`SimWorkload.declared`)."""
    history = history_work = past = None
    served = served_as(specs)
    if history_s > 0:
        from forecasting.traces.ops import split

        past_log = trace
        history, trace = split(trace, history_s)
        past = past_log if isinstance(past_log, RequestLog) else None
    ordered = [served[m] for m in trace.models]
    queue = _queue(trace, ordered, seed)
    declared_queue = None
    if declared is not None:
        if set(declared) != set(specs):
            raise ValueError("the declared specs must name the same models as the served ones")
        told = served_as(declared)
        declared_queue = _queue(trace, [told[m] for m in trace.models], seed)
    if past is not None and history is not None:
        # (in the unit the controller's learner starts from: the profile it is told, the served one unless declared)
        told_queue = queue if declared_queue is None else declared_queue
        means = np.array([told_queue.profile(i).mean_s for i in range(len(told_queue.models))])
        history_work = _work_history(past, history, [served[m] for m in past.models], seed, means)
    return SimWorkload(trace, specs, queue, history, history_work, declared, declared_queue)


def _queue(trace: Trace, ordered: Sequence[ModelSpec], seed: int) -> Workload:
    if isinstance(trace, RequestLog):
        return Workload.from_request_log(trace, ordered, seed=seed)
    return Workload.from_rates(
        trace.models, trace.rates, trace.step_s, [profile_from_spec(s) for s in ordered], trace.start_s
    )


def _work_history(log: RequestLog, history: RateSeries, specs: Sequence[ModelSpec], seed: int,
                  means: np.ndarray) -> RateSeries:
    """``history``'s steps as offered work: per model and step, the service its requests asked for (each request's
    occupancy on one replica, as the simulator serves it) per second, over the declared mean service time -- what
    a Prometheus history of the in-flight count says in steady state (Little's law)."""
    end = history.rates.shape[1] * history.step_s
    served = Workload.from_request_log(log, specs, seed=seed)  # (its arrays sorted by arrival)
    assert served.t is not None and served.model_index is not None and served.occupancy_s is not None
    keep = served.t < end
    step = np.minimum((served.t[keep] // history.step_s).astype(np.int64), history.rates.shape[1] - 1)
    work = np.zeros(history.rates.shape)
    np.add.at(work, (served.model_index[keep], step), served.occupancy_s[keep])
    return replace(history, rates=work / history.step_s / means[:, None])


def expected_speeds(
    workload: SimWorkload, nodes: Sequence[NodeSpec], packer: Packer | None = None
) -> dict[str, float]:
    """Per model, the speed of the slot the packer gives its first replica on an empty cluster of ``nodes``
    (:func:`autoscaler.api.spec.replica_speed`; 1.0 where it does not fit): what sizing for that cluster divides the
    service time by. A model spread over kinds gets other speeds too; this is the packer's first choice."""
    packer = packer or CostAwarePacker()
    empty = Inventory.from_nodes(nodes)
    out: dict[str, float] = {}
    for m, spec in served_as(workload.specs).items():
        slot = packer.place(empty.copy(), slot_request(spec))
        out[m] = 1.0 if slot is None else replica_speed(spec, slot, empty.catalog)
    return out


def peak_replicas(
    workload: SimWorkload, dt: float, floor_s: float = 60.0, speeds: Mapping[str, float] | None = None
) -> dict[str, int]:
    """Replicas each model needs at its peak load (the peak over windows of ``max(dt, floor_s)``):
    the 'sized for the peak' static baseline. ``speeds`` (per model, default 1): the speed of the slots it will
    run on (:func:`expected_speeds`); a replica of speed ``s`` is sized with the profile scaled by ``1 / s``."""
    window = max(dt, floor_s)
    arr = workload.arrivals_per_tick(window) / window
    profiles = workload.profiles
    out: dict[str, int] = {}
    for i, m in enumerate(workload.models):
        spec = workload.specs[m]
        speed = (speeds or {}).get(m, 1.0)
        prof = profiles[m] if speed == 1.0 else profiles[m].scaled(1.0 / speed)
        n = min_replicas_for_slo(float(arr[i].max()) if arr.shape[1] else 0.0, prof)
        if isinstance(spec, ModelSpec):
            n = min(max(n, spec.min_replicas), spec.max_replicas)
        out[m] = n
    return out
