"""Capacity model: predicted latency attainment of a model as a function of load and replicas.

First version: a queueing prior (each replica an M/G/c station with ``concurrency`` servers; load split
evenly, as kube-proxy's random routing does). The same math drives the simulator's fluid mode, so the
oracle baseline and the fluid simulator agree by construction. Issue "SLO sizing" learns it online.
It stays one module: the profile, its cached answers and the wait, batch and ITL laws are one model that
sizing, the lend stage, the lower bound and the fluid engine must all read the same way.

The wait model (shared with :mod:`autoscaler.sim.queueing`, which calls the functions below and never
re-derives them):

- P(wait > 0) is Erlang C for ``c`` servers at offered load ``a = rate/replicas * mean_s`` (Erlang B from
  the Poisson pmf/cdf ratio, which stays finite for c in the hundreds where the factorial form overflows);
- the wait, given that it is positive, is exponential. For M/M/c its rate is ``c(1-rho)/mean_s``; for
  general service we scale the mean wait by Allen–Cunneen's ``(1+scv)/2``, i.e. divide the rate by it.
  The fidelity bench (bench/fidelity.py) checked this against a request-level simulation on the Azure
  LLM traces; see docs there for what else was tried.

Decode-bound saturation and the ITL SLO (issue 17). With continuous batching a replica decodes all its running
requests together, one token each per step, and the step grows with the batch: it reads the weights once and every
running request's KV cache, so it is linear in the batch, ``ITL(b) = d (1 + alpha (b - 1))`` with ``d`` the ITL
of a request decoding alone (``decode-ms-per-token``) and ``alpha`` the declared ``decode-batch-slowdown``. That is
the linear decode-latency model of DistServe (Zhong et al., OSDI 2024, section 4 / appendix: decode time linear in
the batch's tokens) and of Vidur's and Splitwise's profiles, kept to one parameter because a user can measure it
from two points of a vLLM benchmark (the ITL at batch 1 and at batch ``c``). Two consequences:

- *saturation*: a request's decode takes ``ITL(b) / d`` times its batch-1 time, so a replica's throughput
  ``b / S(b)`` saturates with the batch. Mean-field: a replica at ``lam`` req/s with mean batch-1 occupancy ``m``
  (decode share ``delta``) runs ``a`` requests at once, and a request decodes beside the ``a`` others it finds (an
  arrival sees the time average; at most ``c - 1``), so ``a = lam m (1 + k min(a, c - 1))`` with ``k = alpha
  delta``: ``a = lam m / (1 - lam m k)``, or ``lam m (1 + k (c - 1))`` past ``c - 1``; the queueing model then runs
  on the occupancy ``a / lam`` (:func:`batch_factor`). ``a >= c`` (or ``lam m k >= 1``) is overload.
- *the ITL SLO* caps the batch: ``b_max`` = the largest batch whose ITL meets it (:attr:`ServiceProfile.itl_cap`). A
  request decodes in the batch it joins, the requests already running on its replica plus itself (``c`` when it had
  to wait for a slot); in M/M/c the running count an arrival finds is ``k < c`` with probability ``(1 - C) pois(k; a)
  / P(pois <= c - 1; a)``, so ``P(ITL ok) = (1 - C(c, a)) P(pois <= b_max - 1; a) / P(pois <= c - 1; a)``
  (:func:`itl_attainment`). Every request that waits for a slot decodes in a full batch and misses the ITL, and
  (when its prefill fits) only those miss the TTFT: the TTFT misses are among the ITL misses, so a request's joint
  attainment is the smaller of the two and the replicas a model needs are the larger of the two counts
  (:func:`attainment`, :func:`slo_bounds`).

Without an ITL SLO and with ``alpha = 0`` (or no decode part) every function below answers exactly as before.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import cached_property

import numpy as np
from scipy import special

from autoscaler.api.spec import ModelSpec

# Utilisation at or above which a station is treated as unstable (steady-state attainment 0).
_RHO_UNSTABLE = 1.0 - 1e-9


@dataclass(frozen=True)
class ServiceProfile:
    """How one replica of a model serves requests.

    ``occupancy_s``: sample of per-request service times (how long a request holds one of the replica's
    ``concurrency`` slots), as K representative quantile points. ``latency_part_s``: the matching sample of
    the part of service that counts toward the SLO latency (== occupancy for ``e2e``, prefill for ``ttft``).
    """

    occupancy_s: np.ndarray
    latency_part_s: np.ndarray
    concurrency: int
    slo_s: float
    percentile: float  # e.g. 95.0
    # Variability of the arrivals (squared coefficient of variation of inter-arrival times, estimated as
    # the index of dispersion of counts): 1 = Poisson; bursty traffic queues more at the same mean rate.
    arrival_scv: float = 1.0
    # Decode-bound saturation and the ITL SLO (module docstring): the ITL target (s; None: none), the ITL of a
    # request decoding alone, its growth per extra request in the batch, the decode part of the mean occupancy at
    # batch 1, and whether the latency part includes the decode (e2e, or a TTFT prior without prefill rates).
    itl_slo_s: float | None = None
    itl_base_s: float = 0.0
    decode_slowdown: float = 0.0
    decode_share: float = 0.0
    latency_decodes: bool = False
    # The ITL's own growth per extra request in the batch, when learned from the engine's ITL apart from the declared
    # ``decode_slowdown`` (autoscaler/estimation/decode.py); None: the declared one. The occupancy's slowdown
    # (:attr:`batch_slows`) stays declared: the capacity learner's factor absorbs what it gets wrong.
    itl_slowdown: float | None = None

    # Sizing asks the same question every tick while the load is steady: remember the answers.
    _memo: dict[tuple[float, int], int] = field(default_factory=dict, compare=False, repr=False)
    _variants: dict[float, ServiceProfile] = field(default_factory=dict, compare=False, repr=False)

    @cached_property
    def mean_s(self) -> float:
        return float(np.mean(self.occupancy_s))

    @cached_property
    def scv(self) -> float:
        """Squared coefficient of variation of the service time."""
        m = self.mean_s
        return float(np.var(self.occupancy_s) / (m * m)) if m > 0 else 0.0

    @cached_property
    def budget_s(self) -> np.ndarray:
        """Per sample point, how long a request may wait and still meet the SLO."""
        return self.slo_s - self.latency_part_s

    @cached_property
    def budget_pos_s(self) -> np.ndarray:
        """:attr:`budget_s` floored at 0 (the wait a point allows)."""
        return np.maximum(self.budget_s, 0.0)

    @cached_property
    def budget_ok(self) -> np.ndarray:
        """The points whose latency part alone fits the SLO."""
        return self.budget_s >= 0.0

    @cached_property
    def attainable(self) -> float:
        """Share of the sample points whose latency part alone fits the SLO (see :func:`attainable_share`)."""
        return float(np.mean(self.budget_s >= 0.0))

    # What sizing reads of the profile every tick, computed once per profile (a profile is immutable, and the
    # learner hands out the same object while its factor is steady): numpy on 32 points costs more than the rest.
    @cached_property
    def median_budget_s(self) -> float:
        """The median of :attr:`budget_s`, never below 0 (:func:`batch_replicas`)."""
        return max(float(np.median(self.budget_s)), 0.0)

    @cached_property
    def knee(self) -> float | None:
        """:func:`knee_target` of this profile."""
        ceiling = self.attainable
        target = self.percentile / 100.0
        return None if ceiling >= target else ceiling * target

    @cached_property
    def latency_part_at_percentile_s(self) -> float:
        """:func:`latency_part_at_percentile` of this profile."""
        return float(np.quantile(self.latency_part_s, self.percentile / 100.0))

    @cached_property
    def batch_slows(self) -> float:
        """``alpha x delta``: how much the mean occupancy grows per extra request in the batch (0: not at all)."""
        return self.decode_slowdown * self.decode_share

    @cached_property
    def itl_alpha(self) -> float:
        """The ITL's growth per extra request in the batch: the learned :attr:`itl_slowdown`, else the declared one."""
        return self.decode_slowdown if self.itl_slowdown is None else self.itl_slowdown

    @cached_property
    def itl_reachable(self) -> bool:
        """Whether a request decoding alone meets the ITL SLO (True without one): below that, no count helps."""
        return self.itl_slo_s is None or self.itl_base_s <= self.itl_slo_s * (1.0 + 1e-12)

    @cached_property
    def itl_cap(self) -> int | None:
        """The largest decode batch (< ``concurrency``) whose ITL meets the SLO; None when the ITL never binds (no ITL
        SLO, out of reach, or met even by a full batch)."""
        if self.itl_slo_s is None or not self.itl_reachable:
            return None
        d, alpha, c = self.itl_base_s, self.itl_alpha, self.concurrency
        if d <= 0 or alpha <= 0 or d * (1.0 + alpha * (c - 1)) <= self.itl_slo_s:
            return None
        return max(1, min(c - 1, math.floor(1.0 + (self.itl_slo_s / d - 1.0) / alpha + 1e-9)))

    @cached_property
    def decode_bound(self) -> bool:
        """Whether the batch slows the service or caps it (else the plain M/G/c of before applies)."""
        return self.batch_slows > 0 or self.itl_cap is not None

    def itl_s(self, batch: float) -> float:
        """The ITL of a request decoding in a batch of ``batch``."""
        return self.itl_base_s * (1.0 + self.itl_alpha * max(batch - 1.0, 0.0))

    def with_arrival_scv(self, arrival_scv: float) -> ServiceProfile:
        """This profile under arrivals of variability ``arrival_scv``; the variants are kept, so that
        sizing keeps its memo per variant (callers should round the value to a coarse grid)."""
        if arrival_scv == self.arrival_scv:
            return self
        variant = self._variants.get(arrival_scv)
        if variant is None:
            if len(self._variants) > 64:
                self._variants.clear()
            variant = replace(self, arrival_scv=arrival_scv, _memo={}, _variants={})
            self._variants[arrival_scv] = variant
        return variant

    def scaled(self, factor: float) -> ServiceProfile:
        """A new profile whose service (occupancy and latency part) takes ``factor`` times as long.

        What the online capacity learner (:mod:`autoscaler.estimation.learning`) hands to sizing: one multiplicative
        correction of the declared service time keeps the shape (scv) and the SLO, and a fresh object
        gets a fresh sizing memo, so answers for the old factor are never reused.
        """
        return ServiceProfile(
            occupancy_s=self.occupancy_s * factor,
            latency_part_s=self.latency_part_s * factor,
            concurrency=self.concurrency,
            slo_s=self.slo_s,
            percentile=self.percentile,
            arrival_scv=self.arrival_scv,
            itl_slo_s=self.itl_slo_s,
            itl_base_s=self.itl_base_s * factor,
            decode_slowdown=self.decode_slowdown,
            decode_share=self.decode_share,
            latency_decodes=self.latency_decodes,
            itl_slowdown=self.itl_slowdown,
        )


# ---------------------------------------------------------------------------------------------------
# Shared, vectorised queueing math (also used by the fluid simulator every tick: keep it cheap).


def erlang_b(c: np.ndarray | int, a: np.ndarray | float) -> np.ndarray:
    """Erlang B blocking probability for ``c`` servers at offered load ``a`` Erlangs (vectorised).

    B(c, a) = Poisson pmf(c; a) / Poisson cdf(c; a). Both come from log-space/incomplete-gamma
    ufuncs, so the ratio is stable for c up to many hundreds (the textbook a^c/c! form overflows at ~170).
    """
    c_arr = np.asarray(c, dtype=np.float64)
    a_arr = np.asarray(a, dtype=np.float64)
    a_pos = np.maximum(a_arr, 1e-300)
    log_pmf = c_arr * np.log(a_pos) - a_pos - special.gammaln(c_arr + 1.0)
    cdf = special.pdtr(c_arr, a_pos)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        b = np.exp(log_pmf) / cdf
    # cdf underflows only far beyond saturation (a >> c), where blocking tends to 1.
    b = np.where(cdf > 0, b, 1.0)
    return np.where(a_arr > 0, np.clip(b, 0.0, 1.0), 0.0)


def erlang_c(c: np.ndarray | int, a: np.ndarray | float) -> np.ndarray:
    """Erlang C: probability that an arrival waits, ``c`` servers, offered load ``a`` Erlangs.

    1 where ``a >= c`` (no steady state: everybody waits).
    """
    c_arr = np.asarray(c, dtype=np.float64)
    a_arr = np.asarray(a, dtype=np.float64)
    b = erlang_b(c_arr, a_arr)
    with np.errstate(divide="ignore", invalid="ignore"):
        rho = a_arr / c_arr
        pc = b / (1.0 - rho * (1.0 - b))
    return np.where(rho < _RHO_UNSTABLE, np.clip(pc, 0.0, 1.0), 1.0)


def wait_params(
    rate_per_replica: np.ndarray | float,
    concurrency: np.ndarray | int,
    mean_s: np.ndarray | float,
    scv: np.ndarray | float,
) -> tuple[np.ndarray, np.ndarray]:
    """The M/G/c wait tail ``P(W > t) = p_wait * exp(-decay * t)`` of one replica (vectorised).

    ``decay`` is 0 where the replica is unstable (rho >= 1), meaning the wait grows without bound.
    """
    c = np.asarray(concurrency, dtype=np.float64)
    m = np.asarray(mean_s, dtype=np.float64)
    a = np.asarray(rate_per_replica, dtype=np.float64) * m
    p_wait = erlang_c(c, a)
    rho = a / c
    # Allen–Cunneen: the mean wait of M/G/c is about (1+scv)/2 times that of M/M/c; we keep the M/M/c
    # P(wait>0) and stretch the exponential instead, which keeps the formula closed-form.
    ac = 0.5 * (1.0 + np.asarray(scv, dtype=np.float64))
    with np.errstate(divide="ignore", invalid="ignore"):
        decay = np.where(rho < _RHO_UNSTABLE, c * (1.0 - rho) / (m * ac), 0.0)
    return p_wait, decay


def within_prob(budget_s: np.ndarray, p_wait: np.ndarray, decay: np.ndarray) -> np.ndarray:
    """P(W <= budget) for the wait tail of :func:`wait_params` (broadcasts; budget < 0 gives 0)."""
    with np.errstate(over="ignore", invalid="ignore"):
        tail = p_wait * np.exp(-decay * np.maximum(budget_s, 0.0))
    return np.where(budget_s >= 0.0, 1.0 - tail, 0.0)


# ---------------------------------------------------------------------------------------------------
# Profiles


def _bin_means(x: np.ndarray, k: int) -> np.ndarray:
    """K equal-probability bins of the sorted sample, each replaced by its mean (keeps the mean exact)."""
    xs = np.sort(np.asarray(x, dtype=np.float64))
    edges = np.linspace(0, len(xs), k + 1).round().astype(np.int64)
    csum = np.concatenate(([0.0], np.cumsum(xs)))
    counts = np.maximum(edges[1:] - edges[:-1], 1)
    return (csum[edges[1:]] - csum[edges[:-1]]) / counts


def _exp_bin_means(mean: float, k: int) -> np.ndarray:
    """Conditional means of an exponential(mean) over K equal-probability bins (closed form)."""
    p = np.linspace(0.0, 1.0, k + 1)
    lo, hi = p[:-1], p[1:]
    # E[X | F(X) in [lo, hi)] = (1/(hi-lo)) * integral_lo^hi -mean*ln(1-u) du
    #                       = mean * (1 - [(1-lo)ln(1-lo) - (1-hi)ln(1-hi)] / (hi - lo)), with 0 ln 0 = 0.
    # (The sign matters: with "+" the points are mirrored about the mean -- same mean and variance, but the
    # top bin comes out negative.)
    def xlogx(u: np.ndarray) -> np.ndarray:
        return np.where(u > 0, u * np.log(np.where(u > 0, u, 1.0)), 0.0)

    return mean * (1.0 - (xlogx(1.0 - lo) - xlogx(1.0 - hi)) / (hi - lo))


def profile_from_spec(spec: ModelSpec, k: int = 32) -> ServiceProfile:
    """Prior profile from the declared spec only (exponential service around ``service_time_ms``).

    The K points are the conditional means of K equal-probability bins, so the mean is exact; the scv
    comes out a little below 1 (the spread inside each bin is lost, mostly in the top bin).
    For ``ttft`` the latency part is the prefill share of the service when the token rates say how big
    it is (prefill of a 1k-token prompt against the whole service time), else the whole occupancy: a
    conservative prior, since it can only over-estimate the latency part.
    """
    occ = _exp_bin_means(spec.service_time_s, k)
    prefill = None if spec.prefill_ms_per_1k_tokens is None else min(1.0, spec.prefill_ms_per_1k_tokens
                                                                       / spec.service_time_ms)
    if spec.slo_metric == "ttft" and prefill is not None:
        lat = occ * prefill
    else:
        lat = occ.copy()
    # the decode's share of the service: what the batch slows (the rest, prefill, it does not)
    decode_share = 0.0 if spec.decode_ms_per_token is None else 1.0 - (prefill or 0.0)
    return ServiceProfile(
        occupancy_s=occ,
        latency_part_s=lat,
        concurrency=spec.concurrency,
        slo_s=spec.slo_latency_s,
        percentile=spec.slo_percentile,
        itl_slo_s=spec.slo_itl_s,
        itl_base_s=(spec.decode_ms_per_token or 0.0) / 1000.0,
        decode_slowdown=spec.decode_batch_slowdown,
        decode_share=decode_share,
        latency_decodes=not (spec.slo_metric == "ttft" and prefill is not None),
    )


def profile_from_samples(
    occupancy: np.ndarray,
    latency_part: np.ndarray,
    concurrency: int,
    slo_s: float,
    percentile: float,
    k: int = 32,
) -> ServiceProfile:
    """Compress measured per-request samples to K points each (equal-probability bin means).

    The two arrays are summarised separately (paired by rank, not by request): the attainment math only
    needs each marginal, because under FIFO a request's wait does not depend on its own service time.
    The mean is kept exactly; the variance loses the within-bin spread (for the Azure code trace, whose
    service scv is ~2.0, 32 points keep ~95% of it).
    """
    occ = np.asarray(occupancy, dtype=np.float64)
    lat = np.asarray(latency_part, dtype=np.float64)
    if occ.size == 0 or lat.size == 0:
        raise ValueError("profile_from_samples needs at least one sample")
    kk = max(1, min(k, occ.size))
    return ServiceProfile(
        occupancy_s=_bin_means(occ, kk),
        latency_part_s=_bin_means(lat, max(1, min(k, lat.size))),
        concurrency=int(concurrency),
        slo_s=float(slo_s),
        percentile=float(percentile),
    )


# ---------------------------------------------------------------------------------------------------
# Steady state


def attainment(rate: float, replicas: int, profile: ServiceProfile) -> float:
    """Steady-state fraction of requests whose latency is within the SLO."""
    if rate <= 0:
        return 1.0  # no requests, none late
    if replicas <= 0:
        return 0.0
    if profile.decode_bound:
        lat = latency_attainment(rate, replicas, profile)
        return lat if profile.itl_cap is None else min(lat, itl_attainment(rate, replicas, profile))
    # Allen-Cunneen's (ca^2 + cs^2) / 2: burstier arrivals stretch the wait like a more variable service.
    scv = profile.scv + profile.arrival_scv - 1.0
    p_wait, decay = _wait_params_scalar(rate / replicas, profile.concurrency, profile.mean_s, scv)
    if decay <= 0:
        return 0.0  # unstable: the queue grows without bound
    # within_prob(profile.budget_s, p_wait, decay), with the budget's clipping done once per profile
    tail = p_wait * np.exp(-decay * profile.budget_pos_s)
    return float(np.mean(np.where(profile.budget_ok, 1.0 - tail, 0.0)))


def batch_factor(rate_per_replica: float, profile: ServiceProfile) -> float:
    """How many times its batch-1 occupancy a request holds its slot at ``rate_per_replica`` (module docstring, the
    mean-field batch); inf when the replica cannot keep up (the decode-bound saturation); 1 without a slowdown."""
    k = profile.batch_slows
    a0 = rate_per_replica * profile.mean_s
    if k <= 0 or a0 <= 0.0:
        return 1.0
    c = profile.concurrency
    a = a0 / (1.0 - a0 * k) if a0 * k < 1.0 else math.inf
    if a > c - 1:
        a = a0 * (1.0 + k * (c - 1))  # the others are at most a full batch
    return a / a0 if a < c else math.inf


def latency_attainment(rate: float, replicas: int, profile: ServiceProfile) -> float:
    """:func:`attainment` of the latency SLO alone (TTFT or e2e), the occupancy slowed by the batch it runs in."""
    if rate <= 0:
        return 1.0
    if replicas <= 0:
        return 0.0
    g = batch_factor(rate / replicas, profile)
    if not math.isfinite(g):
        return 0.0
    scv = profile.scv + profile.arrival_scv - 1.0
    p_wait, decay = _wait_params_scalar(rate / replicas, profile.concurrency, profile.mean_s * g, scv)
    if decay <= 0:
        return 0.0
    if profile.latency_decodes and g != 1.0:
        budget = profile.slo_s - profile.latency_part_s * g  # (the decode in the latency slows too)
        tail = p_wait * np.exp(-decay * np.maximum(budget, 0.0))
        return float(np.mean(np.where(budget >= 0.0, 1.0 - tail, 0.0)))
    tail = p_wait * np.exp(-decay * profile.budget_pos_s)
    return float(np.mean(np.where(profile.budget_ok, 1.0 - tail, 0.0)))


def itl_attainment(rate: float, replicas: int, profile: ServiceProfile) -> float:
    """The share of requests whose ITL meets the ITL SLO (module docstring): those that join a batch of at most
    :attr:`ServiceProfile.itl_cap`. 1 where the ITL never binds (an ITL out of reach is not charged here: no count
    helps it, :attr:`ServiceProfile.itl_reachable`)."""
    cap = profile.itl_cap
    if cap is None or rate <= 0:
        return 1.0
    if replicas <= 0:
        return 0.0
    g = batch_factor(rate / replicas, profile)
    c = profile.concurrency
    a = rate / replicas * profile.mean_s * g
    if not (math.isfinite(g) and a / c < _RHO_UNSTABLE):
        return 0.0
    pc = float(erlang_c(c, a))
    below = float(special.pdtr(cap - 1, a)) / float(special.pdtr(c - 1, a))
    return max(0.0, min(1.0, (1.0 - pc) * below))


def itl_batch(p: np.ndarray | float, a: np.ndarray | float, c: np.ndarray | int) -> np.ndarray:
    """The decode batch at the ``p``-quantile of the batches requests decode in, on replicas of ``c`` slots at an
    offered load of ``a`` Erlangs each (vectorised): :func:`itl_attainment`'s law read the other way. A request that
    finds ``k < c`` running decodes in ``1 + k`` (``k`` Poisson, given that it did not wait), one that waits in ``c``;
    so the quantile is ``1 + k`` with ``(1 - C) pdtr(k, a) / pdtr(c - 1, a) = p`` (``k`` continuous, as
    ``pdtrik`` solves it: a smooth quantile) while that is below ``c``, else ``c``. What the ITL at the SLO percentile
    is read against (:class:`autoscaler.estimation.decode.ItlLearner`), and what the fluid engine reports."""
    a = np.maximum(np.asarray(a, dtype=np.float64), 0.0)
    c = np.asarray(c)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        stable = a < c * _RHO_UNSTABLE
        a_s = np.where(stable, a, 0.0)
        free = 1.0 - erlang_c(np.maximum(c, 1), a_s)
        target = p * special.pdtr(c - 1, a_s) / free
        k = special.pdtrik(np.minimum(target, 1.0), np.maximum(a_s, 1e-12))
        b = np.where(target < 1.0, 1.0 + np.maximum(np.nan_to_num(k, nan=0.0), 0.0), c)
    return np.where(stable & (a > 1e-9), np.minimum(b, c), np.where(stable, 1.0, c)).astype(np.float64)


def itl_batch_scalar(p: float, a: float, c: int) -> float:
    """:func:`itl_batch` for one replica fleet: the same law on floats (the decode learner reads it for every model and
    metric step, where the array machinery costs ten times the arithmetic)."""
    a = max(a, 0.0)
    if not a < c * _RHO_UNSTABLE:
        return float(c)
    if a <= 1e-9:
        return 1.0
    free = 1.0 - _wait_params_scalar(a, c, 1.0, 1.0)[0]
    target = p * float(special.pdtr(c - 1, a)) / free
    if not target < 1.0:
        return float(c)
    k = float(special.pdtrik(target, a))
    return min(1.0 + (max(k, 0.0) if math.isfinite(k) else 0.0), float(c))


def _wait_params_scalar(rate_per_replica: float, concurrency: int, mean_s: float, scv: float) -> tuple[float, float]:
    """:func:`wait_params` for one replica count: the same operations, the same ufuncs (bit-identical answers),
    without the array machinery (sizing evaluates it in a search for every model whose load moved)."""
    c = float(concurrency)
    a = rate_per_replica * mean_s
    rho = a / c
    if not rho < _RHO_UNSTABLE:
        return 1.0, 0.0  # (erlang_c is 1 there, and the decay 0: unstable)
    if a > 0:
        # erlang_b
        a_pos = max(a, 1e-300)
        log_pmf = c * np.log(a_pos) - a_pos - special.gammaln(c + 1.0)
        cdf = special.pdtr(c, a_pos)
        b = np.exp(log_pmf) / cdf if cdf > 0 else 1.0
        b = min(max(b, 0.0), 1.0)
    else:
        b = 0.0
    # erlang_c
    pc = b / (1.0 - rho * (1.0 - b))
    p_wait = min(max(pc, 0.0), 1.0)
    ac = 0.5 * (1.0 + scv)
    return p_wait, c * (1.0 - rho) / (mean_s * ac)


def predicted_latency_s(rate: float, replicas: int, profile: ServiceProfile, rel_tol: float = 1e-3) -> float:
    """Steady-state latency at the profile's percentile with ``replicas`` at ``rate`` (inf when unstable).

    What the status reports next to the SLO: the L with mean_k P(latency_part_k + W <= L) = percentile (the
    left side is non-decreasing in L). Found on a grid of candidates evaluated in one vectorised step, the
    bracket refined until it is within ``rel_tol``: the live controller asks for every model every tick.
    """
    target = profile.percentile / 100.0
    parts = profile.latency_part_s
    if rate <= 0:
        return float(np.quantile(parts, target))
    if replicas <= 0:
        return math.inf
    scv = profile.scv + profile.arrival_scv - 1.0
    g = batch_factor(rate / replicas, profile)
    if not math.isfinite(g):
        return math.inf
    p_wait, decay = wait_params(rate / replicas, profile.concurrency, profile.mean_s * g, scv)
    if decay <= 0:
        return math.inf
    if profile.latency_decodes and g != 1.0:
        parts = parts * g

    def met(latency: np.ndarray) -> np.ndarray:
        return np.mean(within_prob(latency[None, :] - parts[:, None], p_wait, decay), axis=0) >= target

    lo, hi = float(np.min(parts)), float(np.max(parts)) + 1.0 / float(decay)
    # (bounded loops: a profile whose parts are <= 0 -- e.g. a service time at the floor -- would otherwise never
    # double away from 0 or never narrow a negative bracket)
    for _ in range(200):
        if met(np.array([hi]))[0]:
            break
        lo, hi = hi, 2.0 * hi if hi > 0 else 1e-9
    for _ in range(200):
        if hi - lo <= rel_tol * abs(hi):
            break
        grid = np.linspace(lo, hi, 33)
        ok = met(grid)
        first = int(np.argmax(ok))  # hi meets the target, so some grid point does
        lo, hi = (grid[first - 1] if first > 0 else lo), grid[first]
    return hi


_RATE_GRID = 1.005
_LOG_RATE_GRID = math.log(_RATE_GRID)


def quantize_up(rate: float) -> float:
    """``rate`` (> 0) rounded UP to a 0.5 % geometric grid: never sized for less than asked, and a load that
    wanders by noise hits the sizing memo instead of a new search every tick (4x fewer queueing-model
    evaluations on the 14-day benchmark). Sizing callers (the slotwise policy, the lend stage's need-soon) round
    with it so that they share the memo."""
    return _RATE_GRID ** math.ceil(math.log(rate) / _LOG_RATE_GRID - 1e-9)


def attainable_share(profile: ServiceProfile) -> float:
    """The share of requests within the SLO latency with no wait at all (as many replicas as it takes): the
    points of the profile whose latency part alone fits. No replica count does better."""
    return profile.attainable


def knee_target(profile: ServiceProfile) -> float | None:
    """The attainment to size for when the SLO's percentile is out of reach of any replica count (None: it is
    within reach). The share the service time allows, times the percentile: the SLO asked of the requests
    that can meet it -- the knee, where more replicas stop helping (the rest are late however many serve)."""
    return profile.knee


def latency_part_at_percentile(profile: ServiceProfile) -> float:
    """The latency part alone (prefill for a TTFT SLO) at the SLO's percentile: what no replica count lowers."""
    return profile.latency_part_at_percentile_s


def batch_replicas(rate: float, batch: float, profile: ServiceProfile) -> int:
    """Fewest replicas that serve a batch of ``batch`` requests arriving together, on top of the load ``rate``,
    with the SLO's percentile of the batch within the latency target.

    Bursty arrivals are modelled as compound Poisson: the index of dispersion of the per-sample counts is the
    size-biased mean batch (E[B^2]/E[B]), so ``batch`` is what a request typically arrives with. A batch finds
    the slots the base load leaves free (``n c - rate mean_s``) and each of them turns over ``budget / mean_s``
    more times within the median budget (SLO latency less the latency part), so the percentile of the batch is
    in time when ``(n c - rate mean_s) (1 + budget / mean_s) >= percentile x batch``. Unlike stretching the
    Poisson wait by the dispersion (Allen-Cunneen with ca^2 = 64 asked for 201 replicas of the Azure code model,
    whose bursts three replicas serve), this charges a burst once, for its size.
    """
    if not batch > 1.0:
        return 0
    budget = profile.median_budget_s
    slots, mean_s = profile.concurrency, profile.mean_s
    if profile.decode_bound:
        # a decode-bound replica serves a burst in the batch the ITL allows, each request as slowly as that batch
        slots = profile.itl_cap or slots
        mean_s = mean_s * (1.0 + profile.batch_slows * (slots - 1))
    per_replica = slots * (1.0 + budget / mean_s)
    need = (profile.percentile / 100.0) * batch + max(rate, 0.0) * mean_s * (1.0 + budget / mean_s)
    return max(1, math.ceil(need / per_replica - 1e-9))


def min_replicas_for_slo(rate: float, profile: ServiceProfile, max_replicas: int = 10_000) -> int:
    """Fewest replicas whose steady-state attainment at ``rate`` meets ``profile.percentile``.

    Attainment is non-decreasing in replicas, so a bisection over [stability bound, max] finds the
    minimum. Returns ``max_replicas`` when even that is not enough (the SLO is unreachable by scaling,
    e.g. the latency part alone exceeds it); 0 for no load.
    """
    if rate <= 0:
        return 0
    memo = profile._memo
    key = (rate, max_replicas)
    if key not in memo:
        if len(memo) > 4096:
            memo.clear()
        memo[key] = _min_replicas_search(rate, profile, max_replicas)
    return memo[key]


def knee_replicas(rate: float, profile: ServiceProfile, max_replicas: int = 10_000) -> int:
    """Fewest replicas at ``rate`` that reach :func:`knee_target` (the SLO's percentile of the requests whose
    service allows it); :func:`min_replicas_for_slo` when the SLO is within reach."""
    target = knee_target(profile)
    if target is None:
        return min_replicas_for_slo(rate, profile, max_replicas)
    if rate <= 0:
        return 0
    memo = profile._memo
    key = (-rate, max_replicas)  # (negative: the knee's answers live beside the SLO's in the memo)
    if key not in memo:
        if len(memo) > 4096:
            memo.clear()
        memo[key] = _min_replicas_search(rate, profile, max_replicas, target)
    return memo[key]


def slo_bounds(rate: float, profile: ServiceProfile, max_replicas: int = 10_000) -> tuple[int, int]:
    """The replicas each SLO alone needs at ``rate``: (latency -- TTFT or e2e --, ITL). The model needs the larger
    (:func:`min_replicas_for_slo`); the status names the one that binds. The ITL count is 0 where the ITL never
    binds."""
    if rate <= 0:
        return 0, 0
    lat = _min_replicas_search(rate, profile, max_replicas, att=latency_attainment)
    itl = 0 if profile.itl_cap is None else _min_replicas_search(rate, profile, max_replicas, att=itl_attainment)
    return lat, itl


def itl_replicas(rate: float, profile: ServiceProfile, max_replicas: int = 10_000) -> int:
    """Fewest replicas whose ITL attainment at ``rate`` meets the percentile (0 where the ITL never binds)."""
    return slo_bounds(rate, profile, max_replicas)[1] if profile.itl_cap is not None and rate > 0 else 0


def _min_replicas_search(rate: float, profile: ServiceProfile, max_replicas: int, target: float | None = None,
                         att: Callable[[float, int, ServiceProfile], float] | None = None) -> int:
    target = profile.percentile / 100.0 if target is None else target
    check = att or attainment
    mean_s = profile.mean_s
    # Below this count the replicas are overloaded: attainment is 0 there, no need to evaluate.
    lo = max(1, math.floor(rate * mean_s / profile.concurrency) + 1)
    if lo > max_replicas:
        return max_replicas
    if check(rate, lo, profile) >= target:
        return lo
    hi = lo
    step = 1
    # Gallop up first: the answer is usually within a few replicas of the stability bound.
    while True:
        hi = min(max_replicas, lo + step)
        if check(rate, hi, profile) >= target:
            break
        if hi == max_replicas:
            return max_replicas
        lo = hi
        step *= 2
    while hi - lo > 1:  # invariant: lo fails, hi meets the target
        mid = (lo + hi) // 2
        if check(rate, mid, profile) >= target:
            hi = mid
        else:
            lo = mid
    return hi
