"""Per-model online learning as the decision core runs it, and the slot kinds it learns per.

:class:`ModelLearning` composes the pure pieces of :mod:`~autoscaler.estimation.cold_start` and
:mod:`~autoscaler.estimation.learning` for one model: measured cold starts (the forecast's lead time), the
service-time scale per slot kind, and the quantile to size for. :func:`slot_kind` names the kind of slot a replica
runs on; :func:`slot_speed` resolves the ``slotwise.io/slot-speeds`` annotation against it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np

from autoscaler.api.snapshot import ModelMetrics, ModelObservation, window_mean
from autoscaler.api.spec import ModelSpec
from autoscaler.estimation.batch import BatchLearner
from autoscaler.estimation.capacity import ServiceProfile, knee_target
from autoscaler.estimation.cold_start import ColdStartEstimator, ReadyTracker
from autoscaler.estimation.decode import ItlLearner
from autoscaler.estimation.learning import CapacityLearner, SloQuantile
from sharing.slot_speed import declared_speed
from sharing.slots import Slot, SlotKind

SLO_WINDOW_S = 60.0  # an SLO on a percentile is judged per window of this length
# The record a lower sizing quantile must be justified by (SloQuantile's evidence_hours): a day, the period of
# inference traffic, so that a quantile comes down only once it has met every phase of the daily cycle.
EVIDENCE_HOURS = 24.0


# (gpu model, slot kind, MIG profile key) -> slot-kind key; bounded by the catalog's geometry.
_KIND_KEYS: dict[tuple[str, SlotKind, str | None], str] = {}


def slot_kind(slot: Slot) -> str:
    """The slot-kind key the capacity model learns per: ``<gpu model>/<slot type>``.

    The GPU model is the catalog's canonical name; the slot type is ``whole`` (any number of GPUs),
    the MIG profile's NVIDIA name (``3g.40gb``), ``share`` (time-sliced GPU) or ``<profile>/share``
    (time-sliced MIG instance): ``H100-80GB/whole``, ``H100-80GB/3g.40gb``, ``L4-24GB/share``,
    ``A100-80GB/1g.10gb/share``. Memoised: one dict look-up per replica and tick.
    """
    key = (slot.gpu_model, slot.kind, slot.profile)
    hit = _KIND_KEYS.get(key)
    if hit is None:
        if slot.kind is SlotKind.WHOLE:
            slot_type = "whole"
        elif slot.kind is SlotKind.MIG:
            slot_type = str(slot.profile_name())
        else:
            slot_type = "share" if slot.profile is None else f"{slot.profile_name()}/share"
        hit = _KIND_KEYS[key] = f"{slot.gpu_model}/{slot_type}"
    return hit


def slot_speed(kind: str, speeds: tuple[tuple[str, float], ...]) -> float:
    """The declared relative speed of slot kind ``kind`` (a :func:`slot_kind` key) from the
    ``slotwise.io/slot-speeds`` entries (matched as :func:`sharing.slot_speed.declared_speed` matches them:
    the whole key, else the slot type, else the GPU model or a catalog alias); 1.0 when none matches."""
    declared = declared_speed(kind, speeds)
    return 1.0 if declared is None else declared


@dataclass
class ModelLearning:
    """What the core learns online about one model (for policies that ask: ``learns = True``).

    Slot kinds (:func:`slot_kind`): a tick's capacity observation is attributed to a kind when all ready
    replicas run on it (mixed placements feed the model-level factor only), and the policy sizes with the
    profile of the kind most active replicas run on (ties: the slower; none: the reference). A kind's
    declared speed (``spec.slot_speeds``, :func:`slot_speed`) is resolved on first sight of the kind, before
    anything about it is learned or read: the kinds a model lands on are only known from its replicas.
    """

    ready: ReadyTracker
    cold_start: ColdStartEstimator  # lead time of a scale-up
    capacity: CapacityLearner  # service-time correction of the capacity prior, per slot kind
    quantile: SloQuantile  # forecast quantile to size for, corrected by error-budget burn
    # ITL at batch 1 and its growth with the batch, learned from the engine's ITL (None: no ITL SLO, nothing to size)
    itl: ItlLearner | None = None
    # the batch the engines admit, from their running and waiting gauges (None: built by start())
    batch: BatchLearner | None = None
    slot_speeds: tuple[tuple[str, float], ...] = ()  # the spec's declared speeds, unresolved
    kind: str | None = None  # the slot kind most active replicas run on (this tick)
    kinds_seen: set[str] = field(default_factory=set)
    # the replicas as the batch learner last saw them, and since when (it reads the gauges only over a set that has
    # stayed long enough for every sample of the window's last step to be of it)
    _batch_replicas: tuple | None = field(default=None, repr=False)
    _batch_since: float = field(default=0.0, repr=False)
    # The last observation scanned and what it held (replicas per kind, the kind all ready ones run on or None):
    # the simulated cluster hands out the same immutable object while the model's replicas do not change.
    _scanned: tuple[ModelObservation, dict[str, int], str | None] | None = field(default=None, repr=False)
    # profile() per kind: (the capacity learner's profile, the ITL fit's key, the answer), reused while both stay
    _itl_profiles: dict[str | None, tuple[ServiceProfile, tuple[int, int], ServiceProfile]] = field(
        default_factory=dict, repr=False)

    @classmethod
    def start(cls, spec: ModelSpec, prior: ServiceProfile, tick_s: float) -> ModelLearning:
        # SLO windows of a minute: the scorecard's model-minutes, and Prometheus' usual rate window
        window_ticks = max(1, round(SLO_WINDOW_S / tick_s))
        itl = None
        if prior.itl_slo_s is not None and prior.itl_base_s > 0.0:
            itl = ItlLearner(prior.itl_base_s, min(prior.itl_alpha, 2.0), prior.concurrency, prior.percentile)
        return cls(ReadyTracker(), ColdStartEstimator(spec.cold_start_s), CapacityLearner(prior),
                   SloQuantile(spec.slo_percentile, ticks_per_window=window_ticks, evidence_hours=EVIDENCE_HOURS),
                   itl=itl, batch=BatchLearner(prior.concurrency), slot_speeds=spec.slot_speeds)

    def profile(self, kind: str | None = None) -> ServiceProfile:
        """The profile to size with on ``kind``: the capacity learner's, with the ITL law the engine's ITL taught
        (:mod:`autoscaler.estimation.decode`; a slower kind's ITL stretched by its declared speed, as its service
        is). Without an ITL learner, or while its readings bear the declaration out, the capacity learner's as it is."""
        prof = self.capacity.profile(kind)
        itl = self.itl
        if itl is None or itl.kept:  # (no readings yet, or they bear the declaration out: the profile as declared)
            return prof
        hit = self._itl_profiles.get(kind)
        if hit is not None and hit[0] is prof and hit[1] == itl.key:
            return hit[2]
        out = replace(prof, itl_base_s=itl.d_s / self.capacity.speed(kind), itl_slowdown=itl.alpha,
                      _memo={}, _variants={})
        self._itl_profiles[kind] = (prof, itl.key, out)
        return out

    def _learn_batch(self, batch: BatchLearner, obs: ModelObservation, m: ModelMetrics, ready: int, now: float,
                     tick_s: float, step_s: float) -> None:
        """Read the batch from the engines' gauges only over replicas that are all ready, none draining, and unchanged
        for two metric steps and a decision (a scrape and the step that holds it). The gauges are sums over what was
        scraped in the window's last step: a replica that left since (removed, drained, failed its readiness probe
        while still serving) can still be in them, and over fewer ready replicas its requests read as a larger batch
        than any replica runs -- the one error that would size too few."""
        replicas = obs.replicas
        if replicas is not self._batch_replicas and replicas != self._batch_replicas:
            self._batch_replicas, self._batch_since = replicas, now
            return
        if now - self._batch_since < 2.0 * step_s + tick_s - 1e-9:
            return
        if ready != len(replicas) or any(r.draining or not r.ready for r in replicas):
            return
        if batch.observe(m.running, m.queue_depth, ready, m.kv_cache_usage):
            self._resize_batch(batch.admitted)

    def _resize_batch(self, concurrency: int) -> None:
        """Size with ``concurrency`` requests per replica from now on (the batch the engines admit,
        :mod:`~autoscaler.estimation.batch`): the capacity learner starts over on the prior at that batch. Its factor
        was fit under the old batch, where a full cache's queue read as slow service; kept, it would charge the
        smaller batch twice. The ITL learner starts over at the new batch too; the kinds' declared speeds carry over."""
        old = self.capacity
        prior = replace(old.prior, concurrency=concurrency, _memo={}, _variants={})
        self.capacity = old.restarted(prior)
        if self.itl is not None:  # (its readings were mapped to batches of the old concurrency: it starts over too)
            self.itl = ItlLearner(prior.itl_base_s, min(prior.itl_alpha, 2.0), concurrency, prior.percentile)
        self._itl_profiles.clear()

    def _first_sight(self, kind: str) -> None:
        self.kinds_seen.add(kind)
        speed = slot_speed(kind, self.slot_speeds)
        if speed != 1.0:
            self.capacity.declare_speed(kind, speed)

    def relative_speed(self, slot: Slot) -> float:
        """How much of a replica of the sizing kind a replica on ``slot`` is worth (its speed relative to
        :attr:`kind`'s, from the learned / declared per-kind factors; 1 without a sizing kind)."""
        kind = slot_kind(slot)
        if kind not in self.kinds_seen:
            self._first_sight(kind)
        if not self.kind or kind == self.kind:
            return 1.0
        speed = self.capacity.scale_for(self.kind) / self.capacity.scale_for(kind)
        # Learned factors of two kinds differ by noise: within 10 % a replica is a replica (else a 0.98
        # would place two replicas for one).
        return 1.0 if abs(math.log(speed)) < math.log(1.1) else speed

    def _scan_kinds(self, obs: ModelObservation) -> str | None:
        """Set :attr:`kind`; return the kind all ready replicas run on (None: mixed, or none ready)."""
        scanned = self._scanned
        if scanned is not None and scanned[0] is obs:
            counts, ready = scanned[1], scanned[2]
            self._pick_kind(counts)
            return ready
        counts = {}
        ready_kind: str | None = None
        mixed = False
        for r in obs.replicas:
            if r.draining or r.slot is None:
                continue
            k = slot_kind(r.slot)
            counts[k] = counts.get(k, 0) + 1
            if r.ready:
                if ready_kind is None:
                    ready_kind = k
                elif k != ready_kind:
                    mixed = True
        for k in counts:
            if k not in self.kinds_seen:
                self._first_sight(k)
        ready = None if mixed else ready_kind
        self._scanned = (obs, counts, ready)
        self._pick_kind(counts)
        return ready

    def _pick_kind(self, counts: dict[str, int]) -> None:
        if len(counts) <= 1:
            self.kind = next(iter(counts), None)
        else:
            scale_for = self.capacity.scale_for
            self.kind = max(counts, key=lambda k: (counts[k], scale_for(k)))

    def observe(self, obs: ModelObservation, m: ModelMetrics, now: float, tick_s: float, step_s: float) -> None:
        for duration in self.ready.update(obs, now):
            self.cold_start.observe(duration)
        ready = obs.ready_replicas
        ready_kind = self._scan_kinds(obs)
        if m.stale or m.rate.size == 0 or m.partial_reason() is not None:  # a partial window: half a load
            return
        batch = self.batch
        if batch is not None and math.isfinite(m.running):
            self._learn_batch(batch, obs, m, ready, now, tick_s, step_s)
        # The samples since the previous decision (a policy tick may span several metric steps).
        n = max(1, min(m.rate.size, round(tick_s / step_s)))
        rate = _tail_mean(m.rate, step_s, n)
        in_flight = _tail_mean(m.in_flight, step_s, n)
        if rate is not None and in_flight is not None and not _draining(m.in_flight, n, rate,
                                                                      self.capacity.profile(self.kind).mean_s):
            self.capacity.observe(rate, ready, in_flight, m.latency_s, kind=ready_kind)
        if self.itl is not None and ready_kind is not None and in_flight is not None and math.isfinite(m.itl_s):
            # (all ready replicas on one kind: the reading is that kind's, stretched back to the reference's)
            erlangs = self.capacity.erlangs(in_flight, ready)
            if erlangs is not None:
                self.itl.observe(m.itl_s * self.capacity.speed(ready_kind), erlangs)
        if m.within_rate is not None and rate is not None:
            if n == 1 and m.within_rate.size:
                v = float(m.within_rate[-1])
                within = (0.0 + v if math.isfinite(v) else 0.0) * step_s  # (the sum below, of one sample)
            else:
                last = m.within_rate[-n:].tolist()
                within = sum(v for v in last if math.isfinite(v)) * step_s
            # (the knee is read only by the update that closes a window)
            target = knee_target(self.capacity.profile(self.kind)) if self.quantile.closes_window else None
            self.quantile.update(rate * n * step_s, min(within, rate * n * step_s), target)


def _tail_mean(samples: np.ndarray, step_s: float, n: int) -> float | None:
    """``window_mean`` of the last ``n`` samples; one sample (a decision every metric step) without the slicing."""
    if n == 1 and samples.size:
        v = float(samples[-1])
        return v if math.isfinite(v) else None
    return window_mean(samples, step_s, n * step_s)


def _draining(in_flight: np.ndarray, n: int, rate: float, mean_s: float) -> bool:
    """Whether the window's last ``n`` samples show a backlog draining: over twice the requests in flight that
    the arrivals keep in service at the current service time (Little's law), and fewer than one tick earlier.
    Little's law holds only in steady state; a backlog that a burst left behind, served at a low arrival rate,
    reads as a service ten times slower than it is (the Azure code model's factor went to the ceiling after its
    first burst, and it was sized at max replicas for minutes). A growing queue is kept: it says the replicas are
    too few, which is true."""
    if in_flight.size <= n:
        return False
    now, before = float(in_flight[-1]), float(in_flight[-1 - n])
    if not (math.isfinite(now) and math.isfinite(before)):
        return False
    return now > 2.0 * rate * mean_s and now < 0.9 * before
