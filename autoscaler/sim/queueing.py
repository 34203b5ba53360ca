"""Queueing engines for the simulator: the common interface and the workload they serve.

The cluster loop (``autoscaler/sim/cluster.py``) advances time in ticks of ``dt`` seconds. Each tick it
passes, per model, how many replicas are *routable* (Ready and not draining) and gets that tick's service
statistics back. kube-proxy routes each request to a uniformly random routable replica, so each replica
is its own station: ``concurrency`` servers (continuous-batching slots) fed by a Poisson-split share of
the load. A request's SLO latency is its queueing wait plus its latency part (== occupancy for ``e2e``,
the prefill time for ``ttft``).

Two engines implement :class:`QueueEngine`:

- :class:`autoscaler.sim.fluid.FluidEngine`: per-tick M/G/c steady state (the same formulas as
  :mod:`autoscaler.estimation.capacity`) plus a fluid backlog for overload. Vectorised over models; ~150 µs a tick
  for 50 models on a rate series, ~270 µs on a request log (``bench/fluid_speed.py``), which is what a
  14-day, 50-model run at 10 s ticks needs.
- :class:`autoscaler.sim.des.DesEngine`: request-level discrete events, exact, slower; the reference the
  fluid engine is checked against (``bench/fidelity.py``).

Outcome accounting (both engines): a request is *settled* when its latency becomes known. With routable
replicas that is on arrival (FIFO at its replica: its start time is fixed then). A request arriving while
its model has no routable replica waits in a model-level backlog; the DES settles it when a replica
appears and it is dispatched, the fluid engine settles it late at once (it cannot see the future, and
with a cold start of a minute against a 1-2 s SLO the difference is nil). ``TickStats.within_slo`` counts
requests settled within SLO in that tick, so summed over a run it is exact.

Success (issue 9): a request *succeeds* when it completes within the client's timeout (``request_timeout_s``,
default :data:`DEFAULT_REQUEST_TIMEOUT_S`): its wait plus its whole occupancy (not only the latency part) is at most
the timeout. It is settled as within-SLO is (``TickStats.within_timeout``), with the timeout less the occupancy as
the budget; a request that met no routable replica fails in the fluid engine, as it is late. The timeout is not
abandonment: a request past it still holds its server (what a client that gives up does not cancel).

Speed (issue 15): the workload's service times are those of a replica on the model's reference GPU (one whole
H100-80GB unless the model's ``slot-speeds`` say otherwise: :mod:`sharing.slot_speed`). A replica of speed ``s`` takes
``1/s`` times as long per request, occupancy and latency part alike. ``step`` gets the speeds as a
:class:`RoutableSpeeds` (the simulated cluster): per model the routable capacity in reference-speed replicas and the
routable replicas' speeds. Without it (None) every routable replica serves at speed 1, exactly as before speeds: the
cluster passes none while that holds.

Decode-bound saturation and the ITL SLO (issue 17; the law and its sources: :mod:`autoscaler.estimation.capacity`): a
model with a ``decode-batch-slowdown`` alpha decodes each request at ``ITL(b) = d (1 + alpha (b - 1))`` per token, ``b``
the batch it joins on its replica (the requests running there plus itself), so its decode takes ``1 + alpha (b - 1)``
times its batch-1 time (``Workload.decode_s``) and a replica's throughput saturates with the batch. A model with an ITL
SLO counts a request within the SLO only when its latency (TTFT or e2e) and its ITL ``ITL(b)`` both meet theirs. The
DES fixes ``b`` when the request starts (later arrivals do not slow it, earlier leavers do not speed it up: by PASTA
the batch an arrival finds is the time-average one); the fluid engine runs the mean-field batch of its state. Models
with neither (``Workload.decode_bound`` false) are served exactly as before.

Cold-started requests (issue 18): a request that arrives while its model has no routable replica is *cold-started*
(``TickStats.cold_arrivals``, in its arrival tick); it waits in the model's held queue (``TickStats.held``) until a
replica is routable and is then dispatched, its wait for a replica being dispatch - arrival; ``cold_waits(now)``
lists them all (the engine's simulated activator: it fronts every model and holds whatever arrives at zero,
whether or not the controller switched routing). The fluid engine settles them late in their arrival tick (so
``cold_within`` is 0), the DES when dispatched (``cold_within`` / ``cold_within_timeout``: the part of that tick's
``within_slo`` / ``within_timeout`` that was cold-started).

Busy (``TickStats.busy``): mean busy servers over the tick, per model -- the DES's exact busy server time / dt
(replicas draining included); the fluid engine's utilisation of its state ``rho(x)`` x servers (the offered load /
capacity, capped at 1, in steady state; after a surge the carried backlog keeps it at 1 until it is served).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Protocol

import numpy as np

from autoscaler.estimation.capacity import ServiceProfile, _bin_means

DEFAULT_REQUEST_TIMEOUT_S = 60.0  # a client's timeout when the run does not say (SimConfig.request_timeout_s)

if TYPE_CHECKING:
    from autoscaler.api.spec import ModelSpec
    from forecasting.traces.model import RequestLog


@dataclass(frozen=True)
class TickStats:
    """Arrays of shape (M,), one entry per model, for the tick [t0, t0+dt)."""

    arrivals: np.ndarray  # requests that arrived (fluid: expected count)
    within_slo: np.ndarray  # requests settled within their SLO latency this tick (fluid: expected)
    completed: np.ndarray  # requests that finished service this tick
    backlog: np.ndarray  # requests waiting (not in service) at the end of the tick
    in_flight: np.ndarray  # mean number in the system (running + queued) over the tick: KPA's concurrency
    latency_at_slo_pct: np.ndarray  # latency (s) at the model's SLO percentile, this tick; NaN if none
    within_timeout: np.ndarray  # requests settled this tick that complete within the request timeout
    busy: np.ndarray  # mean busy servers over the tick (module docstring)
    # Cold-started requests (issue 18; module docstring), None from an engine that does not count them:
    cold_arrivals: np.ndarray | None = None  # arrivals this tick that found no routable replica (held)
    cold_within: np.ndarray | None = None  # of within_slo, the cold-started requests
    cold_within_timeout: np.ndarray | None = None  # of within_timeout, the cold-started requests
    held: np.ndarray | None = None  # requests held (no routable replica) at the end of the tick
    # The ITL (s) at the model's SLO percentile this tick, what an engine's ITL histogram says (NaN: no decode law, or
    # no request); None from an engine that does not report it.
    itl_at_slo_pct: np.ndarray | None = None


@dataclass(frozen=True)
class ColdWaits:
    """Every cold-started request so far (fluid: one entry per model and tick of arrival, weighted by its expected
    count): its model, arrival time, wait for a replica (arrival -> dispatch; still held: -> ``now``), weight, and
    whether it met a replica yet."""

    model_index: np.ndarray
    t: np.ndarray
    wait_s: np.ndarray
    weight: np.ndarray
    dispatched: np.ndarray


class RoutableSpeeds(Protocol):
    """How fast the routable replicas serve (module docstring), as the simulated cluster keeps it."""

    @property
    def capacity(self) -> np.ndarray:
        """(M,) the routable replicas' speeds summed per model: capacity in reference-speed replicas."""
        ...

    def speeds_of(self, i: int) -> list[float]:
        """The speeds of model ``i``'s routable replicas, oldest first (as many as it has routable)."""
        ...


class QueueEngine(Protocol):
    def step(self, t0: float, dt: float, routable: np.ndarray, speeds: RoutableSpeeds | None = None) -> TickStats:
        """Serve the tick ``[t0, t0 + dt)`` with ``routable`` replicas per model, at ``speeds`` (None: speed 1)."""
        ...

    def set_request_timeout(self, timeout_s: float) -> None:
        """The client timeout ``within_timeout`` counts against (before the first step)."""
        ...

    def cold_waits(self, now: float) -> ColdWaits:
        """Every cold-started request so far (module docstring); still held ones have waited until ``now``."""
        ...

    def latency_quantile(self, q: float | np.ndarray) -> np.ndarray:
        """Per model, the ``q``-quantile (0 < q < 1; one level, or one per model) of latency over all requests so
        far."""
        ...


# ---------------------------------------------------------------------------------------------------
# Workload


def _per_model(value: float | Sequence[float] | np.ndarray, m: int, dtype: type) -> np.ndarray:
    arr = np.asarray(value, dtype=dtype)
    return np.full(m, arr, dtype=dtype) if arr.ndim == 0 else arr.astype(dtype)


def _resample(points: np.ndarray, k: int) -> np.ndarray:
    """K points from a sorted sample of any length (equal-probability bins; exact when len == k)."""
    pts = np.sort(np.asarray(points, dtype=np.float64))
    if len(pts) == k:
        return pts
    if len(pts) > k:
        return _bin_means(pts, k)
    return np.interp(np.linspace(0, 1, k), np.linspace(0, 1, len(pts)), pts)


@dataclass(frozen=True)
class Workload:
    """What the engines serve: per-model service description plus the traffic.

    Traffic is either a request log (``t``, ``model_index``, ``occupancy_s``, ``latency_part_s``, one entry
    per request, sorted by ``t``) or a rate series (``rates[m, k]`` req/s over ``[start_s + k*step_s, ...)``)
    whose service times come from the K profile points. Build with :meth:`from_requests`,
    :meth:`from_request_log` or :meth:`from_rates`.
    """

    models: tuple[str, ...]
    concurrency: np.ndarray  # int64 (M,)
    slo_s: np.ndarray  # (M,)
    percentile: np.ndarray  # (M,), e.g. 95.0
    mean_s: np.ndarray  # (M,) mean occupancy
    scv: np.ndarray  # (M,) squared coefficient of variation of the occupancy
    occupancy_pts: np.ndarray  # (M, K) quantile points of the occupancy
    latency_pts: np.ndarray  # (M, K) quantile points of the latency part
    t: np.ndarray | None = None
    model_index: np.ndarray | None = None
    occupancy_s: np.ndarray | None = None
    latency_part_s: np.ndarray | None = None
    rates: np.ndarray | None = None
    step_s: float = 0.0
    start_s: float = 0.0
    # Decode-bound saturation and the ITL SLO (module docstring), per model (None: no model has either): the ITL
    # SLO (s, inf: none), the ITL of a request decoding alone, the batch slowdown alpha, the decode part of the mean
    # occupancy at batch 1, whether the SLO latency includes the decode; the batch-1 decode time per request (logs)
    # and per profile point.
    itl_slo_s: np.ndarray | None = None
    itl_base_s: np.ndarray | None = None
    slowdown: np.ndarray | None = None
    decode_share: np.ndarray | None = None
    latency_decodes: np.ndarray | None = None
    decode_s: np.ndarray | None = None
    decode_pts: np.ndarray | None = None
    # The KV cache (issue 28, request logs with token counts and a spec's ``kv_cache_tokens``; None: no model has
    # one): per model the tokens one replica's cache holds (0: not simulated) and the mean a request in service holds.
    # ``concurrency`` is then what fits (:meth:`with_kv_cache`).
    kv_tokens: np.ndarray | None = None
    kv_held: np.ndarray | None = None
    declared_concurrency: np.ndarray | None = None  # (the batch limit before the cache's fit)

    @property
    def n_models(self) -> int:
        return len(self.models)

    @property
    def is_request_log(self) -> bool:
        return self.t is not None

    @property
    def decode_bound(self) -> np.ndarray:
        """(M,) bool: the models whose batch slows their decode or whose ITL SLO can be missed."""
        if self.itl_slo_s is None:
            return np.zeros(self.n_models, dtype=bool)
        assert self.itl_base_s is not None and self.slowdown is not None and self.decode_share is not None
        full = self.itl_base_s * (1.0 + self.slowdown * np.maximum(self.concurrency - 1, 0))
        return (self.slowdown * self.decode_share > 0) | (full > self.itl_slo_s)

    def profile(self, m: int) -> ServiceProfile:
        itl = {}
        if self.itl_slo_s is not None:
            assert self.itl_base_s is not None and self.slowdown is not None
            assert self.decode_share is not None and self.latency_decodes is not None
            slo = float(self.itl_slo_s[m])
            itl = dict(itl_slo_s=slo if np.isfinite(slo) else None, itl_base_s=float(self.itl_base_s[m]),
                       decode_slowdown=float(self.slowdown[m]), decode_share=float(self.decode_share[m]),
                       latency_decodes=bool(self.latency_decodes[m]))
        return ServiceProfile(
            occupancy_s=self.occupancy_pts[m],
            latency_part_s=self.latency_pts[m],
            concurrency=int(self.concurrency[m]),
            slo_s=float(self.slo_s[m]),
            percentile=float(self.percentile[m]),
            **itl,
        )

    def with_kv_cache(self, kv_tokens: Sequence[int | None], input_tokens: np.ndarray,
                      output_tokens: np.ndarray) -> Workload:
        """This request log's workload with each model's KV cache (``kv_tokens`` per model, None: not simulated; the
        same object when no model has one). ``input_tokens``, ``output_tokens``: per request, in the workload's order.

        A request holds its prompt's KV and, as it decodes, its output's: over its time in service half the output on
        average, so a replica's requests hold ``mean(occupancy x (in + out / 2)) / mean(occupancy)`` tokens each (the
        time average, longer requests weighing more). The engine runs as many at once as fit, ``floor(kv_tokens /
        that)``, at most the declared ``concurrency`` (vLLM's scheduler admits a request when its blocks are free;
        the rest wait in its queue): an engine whose cache binds first serves fewer at once than its batch limit,
        which the controller is not told (it starts from the declaration and reads the gauges, :meth:`kv_use`)."""
        if all(k is None for k in kv_tokens):
            return self
        assert self.model_index is not None and self.occupancy_s is not None
        held_each = np.asarray(input_tokens, dtype=np.float64) + 0.5 * np.asarray(output_tokens, dtype=np.float64)
        occ = self.occupancy_s
        weight = np.bincount(self.model_index, weights=occ, minlength=self.n_models)
        held = np.bincount(self.model_index, weights=occ * held_each, minlength=self.n_models)
        held = np.where(weight > 0, held / np.where(weight > 0, weight, 1.0), 0.0)
        cap = np.array([0 if k is None else k for k in kv_tokens], dtype=np.float64)
        with np.errstate(divide="ignore"):
            fits = np.where((cap > 0) & (held > 0), np.floor(cap / np.where(held > 0, held, 1.0)), self.concurrency)
        concurrency = np.clip(fits, 1, self.concurrency).astype(np.int64)
        return replace(self, concurrency=concurrency, kv_tokens=cap, kv_held=held,
                       declared_concurrency=self.concurrency)

    def kv_use(self, busy: np.ndarray, replicas: np.ndarray) -> np.ndarray | None:
        """Each model's KV-cache use (a fraction, vLLM's ``kv_cache_usage_perc``, the mean over its replicas) with
        ``busy`` requests running (the engines' mean busy servers: the queued hold none) on ``replicas`` routable
        replicas: a replica's running requests over the requests its cache holds, ``kv_tokens / kv_held``. Where the
        cache binds (it holds fewer than the declared concurrency) that count is the whole requests it admits,
        ``concurrency``: with those running the next one does not fit, and the cache reads full (1), as a saturated
        engine's gauge does (requests grow as they decode: vLLM's scheduler fills the blocks and preempts). NaN for a
        model without a simulated cache or without a replica (no engine reports); None when no model has one."""
        if self.kv_tokens is None or self.kv_held is None or self.declared_concurrency is None:
            return None
        n = np.asarray(replicas, dtype=np.float64)
        with np.errstate(divide="ignore", invalid="ignore"):
            running = np.minimum(np.asarray(busy, dtype=np.float64) / n, self.concurrency)
            holds = self.kv_tokens / self.kv_held
            use = running / np.where(holds < self.declared_concurrency, self.concurrency, holds)
        return np.where((self.kv_tokens > 0) & (n > 0), np.clip(use, 0.0, 1.0), np.nan)

    def as_declared(self) -> Workload:
        """This workload at the concurrency its specs declare (the same object without a KV cache): what the
        controller is told and profiles offline; the engines run at what the cache fits."""
        if self.declared_concurrency is None:
            return self
        return replace(self, concurrency=self.declared_concurrency)

    def with_decode(self, itl_slo_s: Sequence[float | None], itl_base_s: Sequence[float],
                    slowdown: Sequence[float], latency_decodes: Sequence[bool],
                    decode_s: np.ndarray | None = None, decode_pts: np.ndarray | None = None) -> Workload:
        """This workload with decode-bound saturation and ITL SLOs (module docstring); unchanged (the same object)
        when no model has a slowdown or an ITL SLO. ``decode_s``: per request of a log, its batch-1 decode time;
        ``decode_pts``: per model and profile point (default: for a log, from ``decode_s``)."""
        if not any(a > 0 for a in slowdown) and all(x is None for x in itl_slo_s):
            return self
        m_count, k = self.occupancy_pts.shape
        if decode_pts is None:
            if decode_s is None:
                raise ValueError("decode_s or decode_pts")
            assert self.model_index is not None
            decode_pts = np.stack([_resample(decode_s[self.model_index == m], k) if (self.model_index == m).any()
                                   else np.zeros(k) for m in range(m_count)])
        if decode_s is None and self.is_request_log:
            raise ValueError("a request log needs decode_s")
        occ_mean = self.occupancy_pts.mean(axis=1)
        share = np.where(occ_mean > 0, decode_pts.mean(axis=1) / np.where(occ_mean > 0, occ_mean, 1.0), 0.0)
        return replace(
            self,
            itl_slo_s=np.array([np.inf if x is None else x for x in itl_slo_s], dtype=np.float64),
            itl_base_s=np.asarray(itl_base_s, dtype=np.float64),
            slowdown=np.asarray(slowdown, dtype=np.float64),
            decode_share=np.minimum(share, 1.0),
            latency_decodes=np.asarray(latency_decodes, dtype=bool),
            decode_s=None if decode_s is None else np.asarray(decode_s, dtype=np.float64),
            decode_pts=np.asarray(decode_pts, dtype=np.float64),
        )

    @classmethod
    def from_requests(
        cls,
        models: Sequence[str],
        t: np.ndarray,
        model_index: np.ndarray,
        occupancy_s: np.ndarray,
        latency_part_s: np.ndarray,
        concurrency: int | Sequence[int] | np.ndarray,
        slo_s: float | Sequence[float] | np.ndarray,
        percentile: float | Sequence[float] | np.ndarray = 95.0,
        k: int = 32,
    ) -> Workload:
        """A request log. Mean and scv per model are taken from all the requests (exact), the K points
        only summarise the marginals (used for latency quantiles and by :meth:`profile`)."""
        m_count = len(models)
        t = np.asarray(t, dtype=np.float64)
        order = np.argsort(t, kind="stable")
        t = t[order]
        mi = np.asarray(model_index, dtype=np.int64)[order]
        occ = np.asarray(occupancy_s, dtype=np.float64)[order]
        lat = np.asarray(latency_part_s, dtype=np.float64)[order]
        if not (len(t) == len(mi) == len(occ) == len(lat)):
            raise ValueError("request arrays must have the same length")
        if len(mi) and (mi.min() < 0 or mi.max() >= m_count):
            raise ValueError("model_index out of range")
        cnt = np.bincount(mi, minlength=m_count).astype(np.float64)
        s1 = np.bincount(mi, weights=occ, minlength=m_count)
        s2 = np.bincount(mi, weights=occ * occ, minlength=m_count)
        with np.errstate(divide="ignore", invalid="ignore"):
            mean = np.where(cnt > 0, s1 / cnt, 1.0)
            var = np.where(cnt > 0, s2 / cnt - mean * mean, 0.0)
        scv = np.maximum(var, 0.0) / (mean * mean)
        occ_pts = np.empty((m_count, k))
        lat_pts = np.empty((m_count, k))
        for m in range(m_count):  # once, at construction
            sel = mi == m
            occ_pts[m] = _resample(occ[sel], k) if sel.any() else mean[m]
            lat_pts[m] = _resample(lat[sel], k) if sel.any() else 0.0
        return cls(
            models=tuple(models),
            concurrency=_per_model(concurrency, m_count, np.int64),
            slo_s=_per_model(slo_s, m_count, np.float64),
            percentile=_per_model(percentile, m_count, np.float64),
            mean_s=mean,
            scv=scv,
            occupancy_pts=occ_pts,
            latency_pts=lat_pts,
            t=t,
            model_index=mi,
            occupancy_s=occ,
            latency_part_s=lat,
        )

    @classmethod
    def from_request_log(cls, log: RequestLog, specs: Sequence[ModelSpec], seed: int = 0) -> Workload:
        """A :class:`forecasting.traces.model.RequestLog` served as ``specs`` (one per ``log.models``) say.

        Occupancy: from tokens when both the log and the spec have them (prefill + decode); else the log's
        measured ``service_s``; else exponential around ``service_time_ms`` (the prior's shape).
        Latency part: the prefill time for ``ttft`` with tokens, else the occupancy.
        """
        if len(specs) != len(log.models):
            raise ValueError("one spec per model of the log")
        mi = np.asarray(log.model_index, dtype=np.int64)
        n = len(mi)
        rng = np.random.default_rng(seed)
        occ = np.empty(n)
        lat = np.empty(n)
        dec = np.zeros(n)  # batch-1 decode time (issue 17: what the batch slows)
        for m, spec in enumerate(specs):
            sel = mi == m
            tokens = log.input_tokens is not None and log.output_tokens is not None
            has_rates = spec.prefill_ms_per_1k_tokens is not None or spec.decode_ms_per_token is not None
            if tokens and has_rates:
                assert log.input_tokens is not None and log.output_tokens is not None
                pre = (spec.prefill_ms_per_1k_tokens or 0.0) * log.input_tokens[sel] / 1e6
                decode = (spec.decode_ms_per_token or 0.0) * log.output_tokens[sel] / 1e3
                occ[sel] = pre + decode
                lat[sel] = pre if spec.slo_metric == "ttft" else pre + decode
                dec[sel] = decode
            else:
                if log.service_s is not None:
                    occ[sel] = log.service_s[sel]
                else:
                    occ[sel] = rng.exponential(spec.service_time_s, int(sel.sum()))
                lat[sel] = occ[sel]
        out = cls.from_requests(
            log.models,
            log.t,
            mi,
            occ,
            lat,
            concurrency=[s.concurrency for s in specs],
            slo_s=[s.slo_latency_s for s in specs],
            percentile=[s.slo_percentile for s in specs],
        )
        order = np.argsort(np.asarray(log.t, dtype=np.float64), kind="stable")  # (from_requests sorts by time)
        tokens = log.input_tokens is not None and log.output_tokens is not None
        out = out.with_decode(
            [s.slo_itl_s for s in specs], [(s.decode_ms_per_token or 0.0) / 1e3 for s in specs],
            [s.decode_batch_slowdown for s in specs],
            [not (s.slo_metric == "ttft" and tokens
                  and (s.prefill_ms_per_1k_tokens is not None or s.decode_ms_per_token is not None)) for s in specs],
            decode_s=dec[order])
        if not tokens:
            return out  # (no token counts: nothing to hold a cache with)
        assert log.input_tokens is not None and log.output_tokens is not None
        return out.with_kv_cache([s.kv_cache_tokens for s in specs], np.asarray(log.input_tokens)[order],
                                 np.asarray(log.output_tokens)[order])

    @classmethod
    def from_rates(
        cls,
        models: Sequence[str],
        rates: np.ndarray,
        step_s: float,
        profiles: Sequence[ServiceProfile],
        start_s: float = 0.0,
        k: int = 32,
    ) -> Workload:
        """A rate series (req/s, shape (M, T); NaN counts as 0) served as ``profiles`` describe."""
        rates = np.nan_to_num(np.asarray(rates, dtype=np.float64), nan=0.0)
        if rates.ndim != 2 or rates.shape[0] != len(models) or len(profiles) != len(models):
            raise ValueError("rates must be (M, T) with one profile per model")
        occ_pts = np.stack([_resample(p.occupancy_s, k) for p in profiles])
        lat_pts = np.stack([_resample(p.latency_part_s, k) for p in profiles])
        return cls(
            models=tuple(models),
            concurrency=np.array([p.concurrency for p in profiles], dtype=np.int64),
            slo_s=np.array([p.slo_s for p in profiles], dtype=np.float64),
            percentile=np.array([p.percentile for p in profiles], dtype=np.float64),
            mean_s=np.array([p.mean_s for p in profiles]),
            scv=np.array([p.scv for p in profiles]),
            occupancy_pts=occ_pts,
            latency_pts=lat_pts,
            rates=rates,
            step_s=float(step_s),
            start_s=float(start_s),
        ).with_decode([p.itl_slo_s for p in profiles], [p.itl_base_s for p in profiles],
                      [p.decode_slowdown for p in profiles], [p.latency_decodes for p in profiles],
                      decode_pts=occ_pts * np.array([[p.decode_share] for p in profiles]))

    def expected_arrivals(self, t0: np.ndarray | float, t1: np.ndarray | float) -> np.ndarray:
        """Rate series only: expected arrivals per model in [t0, t1) (vectorised, piecewise-constant)."""
        assert self.rates is not None
        return cumulative_at(self, t1) - cumulative_at(self, t0)


def cumulative_rates(w: Workload) -> np.ndarray:
    """Per model, the expected arrivals from the start to each step boundary (rate series only)."""
    assert w.rates is not None
    return np.concatenate([np.zeros((w.n_models, 1)), np.cumsum(w.rates * w.step_s, axis=1)], axis=1)


def cumulative_at(w: Workload, t: np.ndarray | float, cum: np.ndarray | None = None) -> np.ndarray:
    """Per model, the expected arrivals from the start to time ``t`` (``cum``: :func:`cumulative_rates`, if known)."""
    assert w.rates is not None
    cum = cumulative_rates(w) if cum is None else cum
    n_steps = w.rates.shape[1]
    u = min(max((float(t) - w.start_s) / w.step_s, 0.0), float(n_steps))
    k = min(int(u), n_steps - 1)
    return cum[:, k] + (u - k) * w.rates[:, k] * w.step_s
