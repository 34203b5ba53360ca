"""Online learning for SLO-driven sizing: service-time scale and sizing quantile.

Everything here is pure (no I/O, no clock: ``now`` comes from the snapshot) and cheap, because the
decision core calls it once per model per tick: 1,000 models must decide in 200 ms in total, so the
common path of every call below is a handful of float operations and dict look-ups (a few µs), and
anything that needs numpy is either rare (a replica became ready) or computed once and cached.

- :class:`CapacityLearner` — a multiplicative correction of the declared service time, per slot kind,
  learned by inverting the queueing model of :mod:`autoscaler.estimation.capacity` on observed (rate, replicas,
  in-flight[, latency]);
- :class:`SloQuantile` — which forecast quantile to size for, from the SLO and its error-budget burn.

The cold-start lead time is learned in :mod:`autoscaler.estimation.cold_start`.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Mapping
from dataclasses import replace
from functools import lru_cache

import numpy as np

from autoscaler.estimation.capacity import ServiceProfile
from autoscaler.estimation.inverse_tables import in_flight_table as _in_flight_table
from autoscaler.estimation.inverse_tables import inversion as _inversion
from autoscaler.estimation.inverse_tables import latency_table as _latency_table

__all__ = ["CapacityLearner", "SloQuantile"]


def _logit(p: float) -> float:
    return math.log(p / (1.0 - p))


def _expit(z: float) -> float:
    if z >= 0:
        return 1.0 / (1.0 + math.exp(-z))
    e = math.exp(z)
    return e / (1.0 + e)


# ---------------------------------------------------------------------------------------------------
# Capacity: service-time scale


def _invert(ys: list[float], xs: list[float], y: float) -> float | None:
    """x with table(x) == y by linear interpolation; None when y is beyond the table (saturated)."""
    i = bisect_left(ys, y)
    if i == 0:
        return xs[0]
    if i >= len(ys):
        return None
    y0 = ys[i - 1]
    return xs[i - 1] + (xs[i] - xs[i - 1]) * (y - y0) / (ys[i] - y0)


class _EwLogMean:
    """Exponentially weighted mean of log-factors with a fading prior (``prior_weight`` pseudo-points)."""

    __slots__ = ("prior_w", "s", "w")

    def __init__(self, prior_weight: float) -> None:
        self.s = 0.0  # decayed sum of data
        self.w = 0.0  # decayed count of data
        self.prior_w = prior_weight  # decays like a data point, so a changed model is eventually trusted

    def add(self, v: float, gamma: float) -> None:
        self.s = gamma * self.s + v
        self.w = gamma * self.w + 1.0
        self.prior_w *= gamma

    def value(self, prior_log: float) -> float:
        tot = self.w + self.prior_w
        return (self.s + self.prior_w * prior_log) / tot if tot > 0 else prior_log


class CapacityLearner:
    """Learns, per model, how much longer (or shorter) service really takes than declared.

    ``scale`` multiplies the prior profile's service times (1.0: the spec is right; 2.0: requests take
    twice as long). Each informative tick is inverted through the capacity model: the scale whose
    predicted mean time in system (scaled service + predicted wait at ``rate/ready`` per replica)
    equals the observed one, ``W = in_flight / rate`` (Little's law). This is a table look-up, not a
    search (:mod:`autoscaler.estimation.inverse_tables`). With ``latency_s`` (at the SLO percentile) a second
    estimate matches the predicted latency quantile; the two are averaged in log space with weight
    ``latency_weight``: the mean pins throughput, the tail is what the SLO is about.

    Estimates are combined in log space (a factor 2 too slow and 2 too fast are symmetric errors) as an
    exponentially weighted mean with ``half_life`` observations, starting from ``prior_weight``
    pseudo-observations at 1.0 that fade like data: little data shrinks toward the spec, a model that
    changes (new version, new hardware) is followed within a few half-lives.

    Slot kinds: the factor is kept relative to the hardware the spec was declared for (the reference);
    ``declared_speed[kind]`` says how fast a kind is relative to it (0.5: twice as slow; missing: 1.0).
    An observation is attributed to a kind only when all ready replicas run on it (the caller passes
    ``kind=None`` for mixed placements; those feed the reference as if at speed 1.0). A kind's factor
    is its own data shrunk toward ``reference / speed``, so a kind without data gets exactly that.

    Saturated observations (in flight beyond the model's stable range: the queue is growing, no steady
    state) only say ``scale >= capacity bound``: they count when that bound exceeds the current factor,
    and are otherwise skipped, so a burst above capacity never talks the factor down.
    """

    def __init__(
        self,
        prior: ServiceProfile,
        *,
        declared_speed: Mapping[str, float] | None = None,
        prior_weight: float = 4.0,
        half_life: float = 60.0,
        bounds: tuple[float, float] = (0.1, 10.0),
        min_rate: float = 0.0,
        latency_weight: float = 0.5,
        resolution: float = 0.01,
    ) -> None:
        lo, hi = bounds
        if not (0.0 < lo < 1.0 < hi and math.isfinite(hi)):
            raise ValueError(f"bounds must satisfy 0 < lo < 1 < hi, got {bounds!r}")
        if not (half_life > 0 and prior_weight >= 0 and 0.0 <= latency_weight <= 1.0 and resolution > 0):
            raise ValueError("need half_life > 0, prior_weight >= 0, 0 <= latency_weight <= 1, resolution > 0")
        if prior.mean_s <= 0 or prior.concurrency < 1:
            raise ValueError("prior profile needs a positive mean service time and concurrency >= 1")
        self.prior = prior
        self._settings = dict(prior_weight=prior_weight, half_life=half_life, bounds=bounds, min_rate=min_rate,
                              latency_weight=latency_weight, resolution=resolution)
        self._speed_log: dict[str, float] = {}
        for k, v in (declared_speed or {}).items():
            if not (math.isfinite(v) and v > 0):
                raise ValueError(f"declared_speed[{k!r}] must be finite and > 0, got {v!r}")
            self._speed_log[k] = math.log(v)
        self._gamma = 0.5 ** (1.0 / half_life)
        self._prior_weight = float(prior_weight)
        self._log_lo, self._log_hi = math.log(lo), math.log(hi)
        self._min_rate = float(min_rate)
        self._lat_w = float(latency_weight)
        self._step = math.log1p(resolution)
        self._ref = _EwLogMean(self._prior_weight)
        self._kinds: dict[str, _EwLogMean] = {}
        self._profiles: dict[str | None, tuple[int, ServiceProfile]] = {}
        # profile() is read several times per model and tick and its inputs move only when the learner does:
        # the last answer per kind, valid while ``_version`` (bumped by every change of the factors) stays.
        self._version = 0
        self._answers: dict[str | None, tuple[int, ServiceProfile]] = {}
        self._n = 0

        m = prior.mean_s
        self._mean = m
        scv = round(prior.scv, 9)
        self._y_tab, self._x_tab = _in_flight_table(prior.concurrency, scv)
        self._x_max = self._x_tab[-1]
        self._scv = scv
        self._h_tab: list[float] | None = None  # latency table, built on the first latency reading
        self._hx_tab: list[float] = []
        # The batch's own slowdown (decode-bound saturation, issue 17): the offered load ``x`` a reading implies is
        # ``rate/replicas * scale * mean * (1 + k min(x, c - 1))`` (capacity.batch_factor), so
        # the scale is what is left once the batch's factor at ``x`` is taken out -- else the factor would learn the
        # batch's slowdown and sizing would charge it twice. 0 without a slowdown (the division by 1 is exact).
        self._batch_k = prior.batch_slows
        self._c_1 = prior.concurrency - 1.0
        # The same inversion on arrays, for offered_work: one object per (concurrency, scv, slowdown), shared by
        # every learner of that shape, so the fleet's windows can be inverted together (work.offered_rates).
        self.inversion = _inversion(prior.concurrency, scv, self._batch_k)

    def restarted(self, prior: ServiceProfile) -> CapacityLearner:
        """A learner with this one's settings and declared speeds, starting over on ``prior`` (nothing learned)."""
        speeds = {k: math.exp(v) for k, v in self._speed_log.items()}
        return CapacityLearner(prior, declared_speed=speeds, **self._settings)  # type: ignore[arg-type]

    def declare_speed(self, kind: str, speed: float) -> None:
        """Declare how fast ``kind`` is relative to the reference (as ``declared_speed`` does), e.g. when
        the model first runs there: the kinds in use are known only then."""
        if not (math.isfinite(speed) and speed > 0):
            raise ValueError(f"speed of {kind!r} must be finite and > 0, got {speed!r}")
        self._speed_log[kind] = math.log(speed)
        self._profiles.pop(kind, None)  # a cached profile of the kind was for the old speed
        self._version += 1

    # -- reading ------------------------------------------------------------------------------

    @property
    def count(self) -> int:
        """Informative observations used so far."""
        return self._n

    @property
    def scale(self) -> float:
        """The model's factor on the reference hardware (what ``profile()`` uses)."""
        return math.exp(self._ref.value(0.0))

    def _kind_log(self, kind: str) -> float:
        prior_log = self._ref.value(0.0) - self._speed_log.get(kind, 0.0)
        acc = self._kinds.get(kind)
        return acc.value(prior_log) if acc is not None else prior_log

    def scale_for(self, kind: str | None = None) -> float:
        """The factor for replicas on ``kind`` (None: the reference, i.e. :attr:`scale`)."""
        return self.scale if kind is None else math.exp(self._kind_log(kind))

    def profile(self, kind: str | None = None) -> ServiceProfile:
        """The prior profile scaled by the current factor for ``kind``.

        The factor is rounded to ``resolution`` (1%) steps and the profile cached per kind, so while the
        factor is steady the same object comes back and sizing keeps its memo.
        """
        answer = self._answers.get(kind)
        if answer is not None and answer[0] == self._version:
            return answer[1]
        lg = self._ref.value(0.0) if kind is None else self._kind_log(kind)
        key = round(lg / self._step)
        hit = self._profiles.get(kind)
        if hit is not None and hit[0] == key:
            prof = hit[1]
        else:
            prof = self.prior if key == 0 else self.prior.scaled(math.exp(key * self._step))
            if prof.itl_slo_s is not None:
                # The factor is learned from in-flight counts and request latency, not from tokens: the ITL of a
                # request decoding alone stays as declared, slowed only by the kind's declared speed (a factor
                # learned a little low would otherwise lift the ITL's batch cap off entirely).
                itl_base = self.prior.itl_base_s / math.exp(self._speed_log.get(kind, 0.0) if kind else 0.0)
                if prof.itl_base_s != itl_base:
                    prof = replace(prof, itl_base_s=itl_base, _memo={}, _variants={})
            self._profiles[kind] = (key, prof)
        self._answers[kind] = (self._version, prof)
        return prof

    def speed(self, kind: str | None) -> float:
        """The declared speed of ``kind`` relative to the reference (1.0: none declared, or the reference)."""
        return math.exp(self._speed_log.get(kind, 0.0)) if kind else 1.0

    def erlangs(self, in_flight: float, ready: int) -> float | None:
        """The offered load per replica, in Erlangs of the service as it runs (the batch's slowdown in), that a mean
        in-flight count over ``ready`` replicas implies: the inversion :meth:`observe` starts from (Little's law
        through the queueing model). The stable range's top when saturated; None without a replica or a reading."""
        if ready < 1 or not (math.isfinite(in_flight) and in_flight >= 0.0):
            return None
        x = _invert(self._y_tab, self._x_tab, in_flight / ready)
        return self._x_max if x is None else x

    def offered_work(self, in_flight: np.ndarray, ready: int) -> np.ndarray:
        """Per sample, the load the in-flight count implies, in requests/s of the prior's mean service time (the
        offered Erlangs over ``prior.mean_s``): the same inversion as :meth:`observe`'s (Little's law through the
        queueing model, the batch's own slowdown taken out), applied to each sample of a window with ``ready``
        replicas. It counts work, not requests: a minute of many short requests and one of fewer long ones that
        keep the same replicas as busy read the same. NaN where the sample is missing or saturated (beyond the
        stable range: a growing queue says nothing about the offered load), and everywhere without a replica."""
        if ready < 1:
            return np.full(np.shape(in_flight), np.nan)
        return self.inversion.erlangs(np.asarray(in_flight, dtype=float) / ready) * (ready / self._mean)

    # -- learning -----------------------------------------------------------------------------

    def _latency_ready(self) -> bool:
        if self._h_tab is None:
            prior = self.prior
            shape = np.round(np.asarray(prior.latency_part_s, dtype=np.float64) / self._mean, 9)
            tab = _latency_table(prior.concurrency, self._scv, prior.percentile / 100.0, shape.tobytes())
            self._h_tab, self._hx_tab = tab if tab is not None else ([], [])
        return bool(self._h_tab)

    def estimate(self, rate: float, ready: int, in_flight: float, latency_s: float = math.nan) -> float | None:
        """The scale one tick implies on its own (clamped to the bounds), or None if uninformative.

        A saturated reading comes back as the (lower) capacity bound; :meth:`observe` decides whether
        to use it.
        """
        est, _ = self._estimate(rate, ready, in_flight, latency_s)
        return None if est is None else math.exp(est)

    def _estimate(self, rate: float, ready: int, in_flight: float, latency_s: float) -> tuple[float | None, bool]:
        """(log scale, saturated) for one tick."""
        if not (rate > self._min_rate and rate > 0.0 and ready > 0 and math.isfinite(rate)):
            return None, False
        per = rate / ready
        to_log = self._mean * per  # scale = x / (mean * rate/replicas)
        est_mean: float | None = None
        saturated = False
        if in_flight > 0.0 and math.isfinite(in_flight):
            x = _invert(self._y_tab, self._x_tab, in_flight / ready)
            if x is None:
                x, saturated = self._x_max, True
            if x > 0.0:
                est_mean = math.log(x / (to_log * (1.0 + self._batch_k * min(x, self._c_1))))
        est_lat: float | None = None
        if latency_s > 0.0 and math.isfinite(latency_s) and self._latency_ready():
            assert self._h_tab is not None
            x = _invert(self._h_tab, self._hx_tab, latency_s * per)
            lat_sat = x is None
            if x is None:
                x = self._x_max
            if x > 0.0:
                est_lat = math.log(x / (to_log * (1.0 + self._batch_k * min(x, self._c_1))))
                if est_mean is None:
                    saturated = lat_sat
                elif lat_sat != saturated:
                    # One reading saturated, the other not: keep the informative one.
                    if saturated:
                        est_mean, saturated = None, False
                    else:
                        est_lat = None
        if est_mean is None and est_lat is None:
            return None, False
        if est_mean is None:
            v = est_lat
        elif est_lat is None:
            v = est_mean
        else:
            v = (1.0 - self._lat_w) * est_mean + self._lat_w * est_lat
        assert v is not None
        return min(max(v, self._log_lo), self._log_hi), saturated

    def observe(
        self,
        rate: float,
        ready: int,
        in_flight: float,
        latency_s: float = math.nan,
        kind: str | None = None,
    ) -> float | None:
        """Learn from one tick: total request rate (req/s), ready replicas, mean in flight (running +
        queued, whole model), optionally the latency at the SLO percentile, and the slot kind all ready
        replicas run on (None if mixed). Returns the tick's own estimate, or None if it was skipped
        (no load, no replicas, non-finite, or a saturated reading that says nothing new)."""
        v, saturated = self._estimate(rate, ready, in_flight, latency_s)
        if v is None:
            return None
        if saturated and v <= (self._ref.value(0.0) if kind is None else self._kind_log(kind)):
            return None
        g = self._gamma
        self._version += 1
        if kind is None:
            self._ref.add(v, g)
        else:
            self._ref.add(v + self._speed_log.get(kind, 0.0), g)
            acc = self._kinds.get(kind)
            if acc is None:
                acc = self._kinds[kind] = _EwLogMean(self._prior_weight)
            acc.add(v, g)
        self._n += 1
        return math.exp(v)


# ---------------------------------------------------------------------------------------------------
# Sizing quantile

# The miss fraction that sizes for its own quantile (an 80% SLO sizes for the 80% rate quantile).
_REFERENCE_MISS = 0.05  # the SLO miss rate (95 %) at which the window objective is the quantile


class SloQuantile:
    """Which forecast quantile to size for: from the SLO, corrected by the error-budget burn.

    An SLO on a percentile is judged per window: a window (``ticks_per_window`` ticks, a minute) meets
    it when at least the declared percentile of its requests were within the latency target, and the
    objective is that windows holding ``objective`` (99.5 %) of the requests meet it; the error budget is
    the other 0.5 % (request-weighted, so "99.5 % of requests are served in windows that met the SLO").

    Start (:meth:`initial`): a window is lost mostly when the load beats the quantile sized for, so the
    quantile starts at the window objective for a 95 % SLO, and a stricter percentile (less slack inside
    each window for a load surprise) moves the tail further out, in proportion to the square root of its
    miss rate: ``1 - q = (1 - objective) * sqrt((1 - p) / 0.05)``: 95 % -> 0.995, 99 % -> 0.9978,
    99.9 % -> 0.9993 (at most 0.9995, leaving the controller room above: it may go to 0.9999, beyond
    the forecaster's top tracked level, where ``Forecast.at`` extrapolates the tail). Stricter SLO,
    higher quantile.

    Then (:meth:`update`, once per tick; the controller moves once per completed window) an integral
    controller in logit space on the burn rate = recent share of requests in missed windows / budget
    (request-weighted: a miss at the daily peak costs more requests than one at night), exponentially
    weighted over ``memory`` windows (6 h: a 1 % budget needs hours of windows to be measured at all),
    with ``prior_misses`` pseudo-misses at exactly the budget so that a few windows prove nothing. Per
    window it moves by ``log(burn) / windows_per_hour`` times ``gain_up`` (burning faster than 1x) or
    ``gain_down`` (slower: give capacity back). The gains are equal by default: with a faster way up than
    down, the swings of the burn around 1 at exactly the budget ratchet the quantile up (measured: +0.8
    logits in 2,000 windows with 3 up / 0.5 down); equal gains hold it within ~0.4 logits. Bounded in
    ``bounds``. More misses never give a lower quantile.

    ``evidence_hours`` (None: the descent above, on the recent burn alone): a descent is a bet that the margin is
    not needed, and at a strict objective six hours cannot show it -- 360 windows at a 0.5 % budget expect fewer
    than two misses, so a calm morning reads as a burn of 0.36 and the quantile falls a logit an hour, into the
    evening peak it was sized for (ServeGen's largest client: from 0.995 to the median by noon, then 2.3x its
    requests late by night). With it, the quantile comes down only as far as a second, longer record allows:
    the misses of the last ``evidence_hours`` (the traffic's period, a day: every phase of the daily cycle met) at
    a one-sigma upper count (Poisson, Gehrels' approximation ``k + sqrt(k + 3/4) + 1``) must still be under the
    budget, and the step is the smaller of the two. The way up is unchanged.
    """

    def __init__(
        self,
        slo_percentile: float,
        *,
        objective: float = 0.995,
        ticks_per_window: int = 6,
        memory: float = 360.0,
        windows_per_hour: float = 60.0,
        gain_up: float = 1.0,
        gain_down: float = 1.0,
        max_burn: float = 10.0,
        prior_misses: float = 1.0,
        bounds: tuple[float, float] = (0.5, 0.9999),
        evidence_hours: float | None = None,
    ) -> None:
        if not 0.0 < slo_percentile < 100.0:
            raise ValueError(f"slo_percentile must be in (0, 100), got {slo_percentile!r}")
        if not 0.0 < objective < 1.0:
            raise ValueError(f"objective must be in (0, 1), got {objective!r}")
        lo, hi = bounds
        if not 0.0 < lo < hi < 1.0:
            raise ValueError(f"bounds must satisfy 0 < lo < hi < 1, got {bounds!r}")
        if not (memory >= 1 and windows_per_hour > 0 and gain_up >= 0 and gain_down >= 0 and max_burn > 1
                and prior_misses > 0):
            raise ValueError("need memory >= 1, windows_per_hour > 0, gains >= 0, max_burn > 1, prior_misses > 0")
        if int(ticks_per_window) < 1:
            raise ValueError("ticks_per_window must be >= 1")
        if evidence_hours is not None and not evidence_hours * windows_per_hour >= 1:
            raise ValueError(f"evidence_hours must hold at least one window, got {evidence_hours!r}")
        self.target = slo_percentile / 100.0
        self.objective = objective
        self._budget = 1.0 - objective
        self._ticks = int(ticks_per_window)
        self._gamma = 1.0 - 1.0 / memory
        self._up = gain_up / windows_per_hour
        self._down = gain_down / windows_per_hour
        self._log_max_burn = math.log(max_burn)
        self._prior_misses = prior_misses
        self._zlo, self._zhi = _logit(lo), _logit(hi)
        self._z = min(max(_logit(self.initial(slo_percentile, objective)), self._zlo), self._zhi)
        self._q = _expit(self._z)
        self._windows = 0.0  # exponentially weighted count of windows with requests
        self._served = 0.0  # ... and their requests, and the requests of the missed ones
        self._missed = 0.0
        self._requests = 0.0  # exponentially weighted request counts (attainment, for reporting)
        self._late = 0.0
        # The longer record a descent must also be justified by (None: not kept): windows, requests, missed ones.
        self._evidence_gamma = None if evidence_hours is None else 1.0 - 1.0 / (evidence_hours * windows_per_hour)
        self._ev_windows = self._ev_served = self._ev_missed = 0.0
        self._win_ticks = 0  # the window in progress
        self._win_requests = 0.0
        self._win_within = 0.0

    @staticmethod
    @lru_cache(maxsize=256)  # (asked by the policy for every model and tick)
    def initial(slo_percentile: float, objective: float = 0.995) -> float:
        """The forecast quantile to start from for an SLO of ``slo_percentile`` % (see class doc)."""
        eps = min(max(1.0 - slo_percentile / 100.0, 1e-9), 1.0)
        q = 1.0 - (1.0 - objective) * math.sqrt(eps / _REFERENCE_MISS)
        return min(max(q, 0.5), 0.9995)

    @property
    def quantile(self) -> float:
        return self._q

    @property
    def attainment(self) -> float:
        """Recent (exponentially weighted) fraction of requests within the latency target; 1.0 before any."""
        return 1.0 - self._late / self._requests if self._requests > 0 else 1.0

    @property
    def closes_window(self) -> bool:
        """Whether the next :meth:`update` completes a window (only then does it read its ``target``)."""
        return self._win_ticks + 1 >= self._ticks

    @property
    def burn(self) -> float:
        """Error-budget burn rate over windows (1.0: losing exactly the budget), shrunk toward 1 early."""
        # prior pseudo-misses in requests: so many windows of the recent mean size
        prior = self._prior_misses * (self._served / self._windows if self._windows > 0 else 1.0)
        denominator = self._served * self._budget + prior
        if not denominator > 0:  # (request counts that underflow: no evidence either way)
            return 1.0
        return (self._missed + prior) / denominator

    def _evidence_burn(self) -> float:
        """The burn over the longer record at a one-sigma upper count of its misses (see the class doc)."""
        mean = self._ev_served / self._ev_windows if self._ev_windows > 0 else 1.0
        if not mean > 0:
            return 1.0
        k = self._ev_missed / mean  # the misses, in windows of the record's mean size
        upper = k + math.sqrt(k + 0.75) + 1.0
        return (upper + self._prior_misses) / (self._ev_windows * self._budget + self._prior_misses)

    def update(self, requests: float, requests_within: float, target: float | None = None) -> float:
        """One tick's requests and how many met the latency target; returns the quantile to size for now.

        Invalid counts (non-finite, negative) are ignored; ``requests_within`` is clipped to
        ``[0, requests]``. A window without requests does not count and does not move the quantile.
        ``target``: the share a window must have in time to count as met, when not the SLO's percentile (an SLO
        out of reach is judged at its knee: windows that no replica count could save burn no budget).
        """
        r = float(requests)
        w = float(requests_within)
        if not (math.isfinite(r) and math.isfinite(w) and r >= 0.0):
            return self._q
        w = min(max(w, 0.0), r)
        self._win_ticks += 1
        self._win_requests += r
        self._win_within += w
        if self._win_ticks < self._ticks:
            return self._q
        r, w = self._win_requests, self._win_within
        self._win_ticks, self._win_requests, self._win_within = 0, 0.0, 0.0
        if r <= 0.0:
            return self._q
        g = self._gamma
        self._requests = g * self._requests + r
        self._late = g * self._late + (r - w)
        self._windows = g * self._windows + 1.0
        self._served = g * self._served + r
        goal = self.target if target is None else target
        missed = r if w < goal * r - 1e-9 else 0.0
        self._missed = g * self._missed + missed
        log_burn = max(min(math.log(self.burn), self._log_max_burn), -self._log_max_burn)
        if self._evidence_gamma is not None:
            ge = self._evidence_gamma
            self._ev_windows, self._ev_served = ge * self._ev_windows + 1.0, ge * self._ev_served + r
            self._ev_missed = ge * self._ev_missed + missed
            if log_burn < 0.0:
                log_burn = max(log_burn, min(math.log(self._evidence_burn()), 0.0))
        dz = (self._up if log_burn > 0 else self._down) * log_burn
        self._z = min(max(self._z + dz, self._zlo), self._zhi)
        self._q = _expit(self._z)
        return self._q
