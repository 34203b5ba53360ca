"""Keep-alive policies for a model that may go to zero (``min-replicas: 0``): keep one replica / start one now?

Pure functions of the model's :class:`~autoscaler.estimation.idle_times.IdleTimes`, its idle age, the lead time
(learned cold start + tick + metric lag: how far ahead a replica started now serves) and its spec; each answers a
:class:`KeepAlive` (warm or not, with why). The zero rail (``autoscaler/decision/zero.py``) applies the answer only
to an idle model its sizing policy wants at most one replica for.

- ``fixed``: warm while the idle age is below ``keep_alive_s`` (Knative's scale-to-zero grace, KEDA's cooldown).
- ``hybrid``: the hybrid histogram policy of Shahrad et al., "Serverless in the Wild: Characterizing and Optimizing
  the Serverless Workload at a Large Cloud Provider" (USENIX ATC'20), section 4.2.
- ``learned``: slotwise's, decision-theoretic over the same histogram (:func:`learned`), with a hysteresis that
  prices the scale events of going to zero and being pre-warmed again within one idle gap
  (:data:`LEARNED_SCALE_EVENT_S`, issue 30).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from autoscaler.api.spec import ModelSpec
from autoscaler.estimation.idle_times import BIN_S, IdleTimes

# Hybrid: the paper's numbers (section 4.2).
HYBRID_HEAD_PCT, HYBRID_TAIL_PCT = 5.0, 99.0
HYBRID_MARGIN = 0.10
HYBRID_MIN_CV = 2.0
HYBRID_MIN_IDLE = 10  # fewer idle times than this: not representative (the paper leaves the number open)
OUT_OF_RANGE = 0.5  # more than this share of idle times beyond the range: "mostly out of range"

PRIOR_REFRESH = 50
LEARNED_MIN_WEIGHT = 3.0  # own + prior idle-time weight below which learned falls back to fixed
# learned's histogram spans at least this (Shahrad et al.'s 4 h range): the hazard, not the range, decides how long
# an idle model stays warm, and a model called every hour is pre-warmed for its next call. keep_alive_s is then
# only its fallback while too few idle times are known.
LEARNED_RANGE_S = 4 * 3600.0
# What one scale event (a replica count change, 1 -> 0 or 0 -> 1) costs learned, in replica-seconds: a cold (not
# worth it) run of bins between warm ones -- the model would go to zero and be pre-warmed again within one idle
# gap -- is kept warm when the replica-seconds its zero would save are below the two events it costs (the
# hysteresis of ``learned_bins``, issue 30). 0: no hysteresis (the bare knapsack).
LEARNED_SCALE_EVENT_S = 120.0


@dataclass(frozen=True)
class KeepAlive:
    warm: bool
    detail: str


def histogram_range_s(spec: ModelSpec) -> float:
    """The range of the model's idle-time histogram: ``keep_alive_s`` (hybrid's range, as in the paper), at least
    :data:`LEARNED_RANGE_S` for ``learned``."""
    return max(spec.keep_alive_s, LEARNED_RANGE_S) if spec.keep_alive == "learned" else spec.keep_alive_s


def fixed(idle: IdleTimes | None, age: float, lead_s: float, spec: ModelSpec) -> KeepAlive:
    """Warm while the idle age is below ``keep_alive_s`` (no pre-warm)."""
    warm = age < spec.keep_alive_s
    return KeepAlive(warm, f"fixed keep-alive {spec.keep_alive_s:g}s, idle {age:.0f}s")


def _percentile_edges(counts: np.ndarray, overflow: float, pct: float) -> tuple[float, float]:
    """The bin holding the ``pct`` percentile of the idle times (overflow counted beyond the last bin): its
    (start, end) in seconds."""
    cum = np.cumsum(counts)
    total = float(cum[-1]) + overflow if cum.size else overflow
    k = int(np.searchsorted(cum, pct / 100.0 * total - 1e-12))
    return k * BIN_S, (k + 1) * BIN_S


def hybrid_windows(idle: IdleTimes) -> tuple[float, float] | None:
    """The hybrid policy's (pre-warm, keep-alive end) in seconds of idle age, or None when the histogram is not
    representative (then the fixed keep-alive applies). Cached per ``idle.version``."""
    cache = _cache(idle)
    hit = cache.get("hybrid")
    if hit is not None:
        return hit[0]
    counts, total = idle.counts, idle.total
    windows: tuple[float, float] | None = None
    if idle.n_idle >= HYBRID_MIN_IDLE and total > 0 and idle.overflow <= OUT_OF_RANGE * total:
        mean = float(counts.mean())
        cv = float(counts.std()) / mean if mean > 0 else 0.0
        if cv >= HYBRID_MIN_CV:
            head, _ = _percentile_edges(counts, idle.overflow, HYBRID_HEAD_PCT)
            _, tail = _percentile_edges(counts, idle.overflow, HYBRID_TAIL_PCT)
            windows = (head * (1.0 - HYBRID_MARGIN), tail * (1.0 + HYBRID_MARGIN))
    cache["hybrid"] = (windows,)
    return windows


def hybrid(idle: IdleTimes | None, age: float, lead_s: float, spec: ModelSpec) -> KeepAlive:
    """Shahrad et al. (ATC'20) section 4.2, the hybrid histogram policy. From the model's idle-time histogram (one
    -minute bins up to ``keep_alive_s``): pre-warm window = the 5th percentile, keep-alive window = the 99th
    percentile minus the pre-warm window, with 10% margins (the pre-warm x 0.9, the 99th percentile x 1.1). With a
    pre-warm window > 0 the model is unloaded right after an execution and loaded again at the pre-warm time; here
    "loaded at" means Ready at, so the replica is started one lead time ahead (as for learned: both pay the same
    cold start). Warm iff ``[age, age + lead]`` overlaps ``[pre-warm, keep-alive end)``.

    Not representative -- fewer than ``HYBRID_MIN_IDLE`` idle times, or the bin counts' coefficient of variation
    below 2 -- : the fixed keep-alive of the histogram's range (``keep_alive_s``), as in the paper. Idle times mostly
    beyond the range: the paper forecasts the next idle time with ARIMA; slotwise falls back to the same fixed
    keep-alive instead (no ARIMA)."""
    windows = None if idle is None else hybrid_windows(idle)
    if windows is None:
        ka = fixed(idle, age, lead_s, spec)
        return KeepAlive(ka.warm, f"hybrid: histogram not representative, {ka.detail}")
    start, end = windows
    warm = age < end and age + lead_s >= start
    return KeepAlive(warm, f"hybrid: pre-warm {start:.0f}s, keep alive to {end:.0f}s, idle {age:.0f}s")


def _cache(idle: IdleTimes) -> dict:
    c = idle.__dict__.get("_policy_cache")
    if c is None or c.get("version") != idle.version:
        c = {"version": idle.version}
        idle.__dict__["_policy_cache"] = c
    return c


def learned_bins(idle: IdleTimes, worth_s: float, prior: IdleTimes | None = None,
                 prior_weight: float = 2.0, lead_s: float = 0.0,
                 scale_event_s: float = LEARNED_SCALE_EVENT_S) -> np.ndarray | None:
    """The bins ``learned`` keeps warm (a boolean mask over ``idle``'s bins), or None when too few idle times are
    known (own plus ``prior_weight`` pseudo-counts of the fleet's pooled histogram ``prior``).

    With p_k = P(idle time in bin k) and S_k = P(idle >= bin k's start), keeping one replica warm during bin k costs
    S_k x bin width replica-seconds in expectation and saves p_k x head cold-started requests, so the bins worth it
    at ``worth_s`` replica-seconds per avoided cold-started request are exactly those with hazard h_k = p_k / S_k
    and h_k x head x worth_s >= bin width: a fractional knapsack, optimal for that exchange rate (any other warm set
    with as few expected cold-started requests costs at least as many warm replica-seconds).

    Then the hysteresis (:func:`_fill_holes`): the knapsack prices each bin alone, but a cold run of bins between
    warm ones (or between the activity's end and the first warm bin) is where the model goes to zero and is
    pre-warmed again within one idle gap: two scale events and a restart for the few replica-seconds the run's
    zero saves. Such a run is kept warm when what its zero saves (the expected replica-seconds at zero: the run less
    the lead time ``lead_s`` the pre-warm starts ahead, less its cold-started requests at ``worth_s``) is below
    ``2 x scale_event_s`` at the odds the gap reaches it. Cached per ``idle.version`` (and the prior's count, in
    steps of ``PRIOR_REFRESH``), ``worth_s``, the lead time (to 10 s) and ``scale_event_s``."""
    cache = _cache(idle)
    # (the prior moves with every idle time of any model: a model's blend is refreshed every PRIOR_REFRESH of them,
    # not every tick -- one fleet idle time barely moves a pooled distribution)
    key = (worth_s, None if prior is None else prior.n_idle // PRIOR_REFRESH, prior_weight,
           round(lead_s / 10.0) if scale_event_s > 0 else None, scale_event_s)
    hit = cache.get("learned")
    if hit is not None and hit[0] == key:
        return hit[1]
    n = idle.bins
    counts = idle.counts.copy()
    overflow = idle.overflow
    head = idle.head
    weight = idle.total
    if prior is not None and prior.total > 0:
        # Borrow strength: the fleet's distribution as prior_weight pseudo-observations over the model's range.
        pc = np.zeros(n)
        m = min(n, prior.bins)
        pc[:m] = prior.counts[:m]
        p_over = float(prior.counts[m:].sum()) + prior.overflow
        scale = prior_weight / prior.total
        counts += pc * scale
        overflow += p_over * scale
        weight += prior_weight
        if head is None:
            head = prior.head
    mask: np.ndarray | None = None
    if weight >= LEARNED_MIN_WEIGHT:
        total = float(counts.sum()) + overflow
        p = counts / total
        survive = (np.cumsum(p[::-1])[::-1] + overflow / total)
        with np.errstate(divide="ignore", invalid="ignore"):
            hazard = np.where(survive > 0, p / survive, 0.0)
        h = max(head if head is not None else 1.0, 0.0)
        mask = hazard * h * worth_s >= BIN_S
        if scale_event_s > 0 and mask.any():
            mask = _fill_holes(mask, p, survive, h * worth_s, 10.0 * round(lead_s / 10.0), scale_event_s)
    cache["learned"] = (key, mask)  # (one entry: the prior's version moves as the fleet learns)
    return mask


def _fill_holes(mask: np.ndarray, p: np.ndarray, survive: np.ndarray, cold_s: float, lead_s: float,
                event_s: float) -> np.ndarray:
    """``mask`` with its cold runs that end in a warm bin kept warm where their zero is not worth two scale events
    (:func:`learned_bins`). ``p``, ``survive``: the bins' probabilities and survival; ``cold_s``: replica-seconds
    one cold start of the bin's arrivals is worth (head x worth)."""
    out = mask.copy()
    warm = np.flatnonzero(mask)
    starts = [0] + [int(k) + 1 for k in warm]  # a cold run starts at the gap's start or right after a warm bin
    for a in starts:
        if a >= mask.size or mask[a]:
            continue
        b = a + int(np.argmax(mask[a:])) if mask[a:].any() else mask.size
        if b >= mask.size:  # (the last cold run: the model stays at zero until a request comes, as fixed does)
            continue
        zero_end = b * BIN_S - lead_s  # the pre-warm starts a lead time before the warm bin
        if zero_end <= a * BIN_S:  # never at zero in this run (the lead time spans it): warm as it is
            out[a:b] = True
            continue
        lo = np.arange(a, b) * BIN_S
        at_zero = np.clip(zero_end - lo, 0.0, BIN_S)  # seconds of each bin spent at zero
        saved = float(np.sum(survive[a:b] * at_zero - p[a:b] * cold_s * at_zero / BIN_S))
        if saved < 2.0 * event_s * float(survive[a]):
            out[a:b] = True
    return out


def learned(idle: IdleTimes | None, age: float, lead_s: float, spec: ModelSpec, prior: IdleTimes | None = None,
            prior_weight: float = 2.0, scale_event_s: float = LEARNED_SCALE_EVENT_S) -> KeepAlive:
    """slotwise's keep-alive: warm now iff a bin :func:`learned_bins` keeps warm overlaps ``[age, age + lead]``
    (keep-alive and pre-warm in one rule: a replica started now serves a lead time later). Too few idle times, even
    with the fleet prior: the fixed keep-alive ``keep_alive_s``. Beyond the histogram's range nothing is kept warm
    (the zero rail still keeps a model the forecast expects a request for)."""
    mask = None if idle is None else learned_bins(idle, spec.cold_start_worth_s, prior, prior_weight, lead_s,
                                                  scale_event_s)
    if mask is None:
        ka = fixed(idle, age, lead_s, spec)
        return KeepAlive(ka.warm, f"learned: too few idle times, {ka.detail}")
    lo = int(age // BIN_S)
    hi = min(mask.size - 1, int(math.floor((age + lead_s) / BIN_S)))
    warm = lo <= hi and bool(mask[lo:hi + 1].any())
    return KeepAlive(warm, f"learned: {int(mask.sum())}/{mask.size} minute bins warm, idle {age:.0f}s")


def keep_alive(idle: IdleTimes | None, age: float, lead_s: float, spec: ModelSpec, prior: IdleTimes | None = None,
               prior_weight: float = 2.0, scale_event_s: float = LEARNED_SCALE_EVENT_S) -> KeepAlive:
    """The model's keep-alive policy (``spec.keep_alive``) answered."""
    if spec.keep_alive == "fixed":
        return fixed(idle, age, lead_s, spec)
    if spec.keep_alive == "hybrid":
        return hybrid(idle, age, lead_s, spec)
    return learned(idle, age, lead_s, spec, prior, prior_weight, scale_event_s)
