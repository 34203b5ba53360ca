"""slotwise's policy: the fewest replicas whose predicted latency meets the SLO at the forecast's upper
quantile of load over the model's lead time, inside the rails a production controller needs.

Registered as ``slotwise``. What it is given (by the decision core, learned online per model):

- the forecast (:mod:`autoscaler.estimation.forecast`) of the peak load over the lead time = the measured cold start
  (a high percentile of observed scale-up-to-Ready times; the annotation is only the prior) + tick +
  metric lag, so new replicas are Ready when the load arrives;
- the quantile to size for (``ctx.sizing_quantile``): it follows from the SLO (a 99.9 % target needs a
  higher quantile than a 95 % one) and rises while the model burns its error budget;
- the capacity curve (``ctx.capacity``): the queueing model of :mod:`autoscaler.estimation.capacity` on a
  service-time profile whose scale is learned from observed (rate, replicas, in-flight, latency).

What it adds, each tick:

1. **Plan**: desired = fewest replicas meeting the SLO at max(forecast quantile, observed load over the
   stable window) -- the observed floor because a forecast that lags a ramp must not shed busy replicas. The
   receding horizon's first step (:mod:`autoscaler.policies.horizon`): a scale-up is for the part of the lead window
   a replica asked for now can serve (``Forecast.ready``, from its cold start on), the whole window is held.
   The forecast quantile is of the arrival intensity (its spread less the Poisson noise of a minute's count,
   which the queueing model charges again), and bursts are charged as batches of the arrivals' measured
   dispersion that must be served within the SLO (not as a Poisson wait stretched by it: that asked for 201
   replicas of a model whose bursts three serve). docs/benchmarks.md section 10 lists what was measured.
2. **Panic** (as KPA's): the load over the short panic window, and a queue already built (sized to drain
   within the SLO latency), are a floor under the plan; reason ``panic`` when that floor is above the
   current count.
3. **Scale down** (declared in :attr:`SloPolicy.behavior`, applied by :mod:`autoscaler.decision.scaledown`)
   only when every recommendation of the stabilization window was lower AND N-1 (the target) still meets the
   SLO at a stricter quantile than scale-up used (hysteresis: a model does not flap between two counts on
   forecast noise; the policy computes that floor, :attr:`PolicyResult.n_minus_1`), at most
   ``max_scale_down_fraction`` of the replicas per tick. Removal drains (the core stops routing, then removes
   after in-flight requests finish).
4. Stale or lost metrics hold the replicas (the rails), and min/max bounds are applied there.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from statistics import NormalDist

import numpy as np

from autoscaler.api.plan import Reason
from autoscaler.api.snapshot import window_mean
from autoscaler.api.spec import ModelSpec
from autoscaler.estimation import capacity as capacity_model
from autoscaler.estimation.capacity import ServiceProfile, quantize_up
from autoscaler.estimation.learning import SloQuantile
from autoscaler.policies.base import Forecast, NMinus1, PolicyContext, PolicyResult, ScalingBehavior
from autoscaler.policies.horizon import first_step


@dataclass(frozen=True)
class SloState:
    # the arrivals' dispersion and when it was measured: a property of the whole window, re-measured
    # once per stable window rather than every tick
    dispersion: float = 1.0
    dispersion_at: float = -math.inf
    # the largest dispersion measured within the burst memory, and when: what a scale-down keeps a burst's batch for
    peak: float = 1.0
    peak_at: float = -math.inf


class SloPolicy:
    """SLO-driven sizing from forecast quantiles; see the module docstring.

    Knobs: ``tick_s`` (how often it decides), ``stable_window_s`` (observed-load floor),
    ``panic_window_s``, ``scale_down_stabilization_s``, ``max_scale_down_fraction`` (per tick; at least one
    replica), ``down_margin`` (scale-down's quantile leaves this fraction of scale-up's tail: 0.5 sizes
    the N-1 check at 1 - (1 - q) / 2), ``burstiness`` (a floor for bursts: a batch of the arrivals' measured
    dispersion served in time, :func:`autoscaler.estimation.capacity.batch_replicas`), ``deflate_poisson``
    (size for the quantile of the arrival intensity: the forecast's spread less a minute count's Poisson noise,
    :func:`intensity_quantile`), ``burst_memory_s`` (half-life of the measured dispersion: a quiet window lowers it
    slowly),
    ``drain_s`` (clear a built-up queue within this long; None = the model's SLO latency).
    """

    name = "slotwise"
    instant_start = False
    uses_forecast = True
    learns = True
    behavior: ScalingBehavior

    def __init__(
        self,
        tick_s: float = 10.0,
        stable_window_s: float = 60.0,
        panic_window_s: float = 10.0,
        scale_down_stabilization_s: float = 60.0,
        max_scale_down_fraction: float = 0.5,
        down_margin: float = 0.5,
        burstiness: bool = True,
        drain_s: float | None = None,
        deflate_poisson: bool = True,
        burst_memory_s: float = 3600.0,
    ) -> None:
        for knob, value in (("tick_s", tick_s), ("stable_window_s", stable_window_s),
                            ("panic_window_s", panic_window_s), ("drain_s", 1.0 if drain_s is None else drain_s)):
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{knob} must be > 0, got {value}")
        if not scale_down_stabilization_s >= 0:
            raise ValueError("scale_down_stabilization_s must be >= 0")
        if not 0 < max_scale_down_fraction <= 1:
            raise ValueError("max_scale_down_fraction must be in (0, 1]")
        if not 0 < down_margin <= 1:
            raise ValueError("down_margin must be in (0, 1]")
        if not burst_memory_s > 0:
            raise ValueError(f"burst_memory_s must be > 0, got {burst_memory_s}")
        self.tick_s = tick_s
        self.stable_window_s = stable_window_s
        self.panic_window_s = panic_window_s
        self.scale_down_stabilization_s = scale_down_stabilization_s
        self.max_scale_down_fraction = max_scale_down_fraction
        self.down_margin = down_margin
        self.burstiness = burstiness
        self.drain_s = drain_s
        self.deflate_poisson = deflate_poisson
        self.burst_memory_s = burst_memory_s
        self.behavior = ScalingBehavior(stabilization_s=scale_down_stabilization_s, warm_up=True,
                                        step_fraction=max_scale_down_fraction, n_minus_1=True)

    def initial_state(self, spec: ModelSpec, replicas: int) -> SloState:
        return SloState()

    def _size(self, rate: float, ctx: PolicyContext, profile: ServiceProfile) -> int:
        if not rate > 0:
            return 0
        rate = quantize_up(rate)
        # One past the ceiling, so that "needs more than allowed" still shows as BOUNDS in the rails. An SLO no
        # count reaches is sized at its knee (capacity.knee_replicas), not at the ceiling.
        return capacity_model.knee_replicas(rate, profile, ctx.spec.max_replicas + 1)

    def _dispersion(self, state: SloState, ctx: PolicyContext) -> tuple[float, float, float, float]:
        """The arrivals' dispersion to size bursts for and when it was measured, and the largest within the burst
        memory and when: re-measured once per stable window."""
        now = ctx.now
        dispersion, dispersion_at = state.dispersion, state.dispersion_at
        peak, peak_at = state.peak, state.peak_at
        if self.burstiness and now - dispersion_at >= self.stable_window_s:
            # Bursts are the traffic's habit, not the last window's: a quiet window lowers the batch the model is
            # sized for only slowly (half-life ``burst_memory_s``), or the next burst finds the replicas shed.
            fade = 0.5 ** ((now - dispersion_at) / self.burst_memory_s) if math.isfinite(dispersion_at) else 0.0
            measured = arrival_dispersion(ctx.metrics.rate, ctx.metrics_step_s)
            dispersion, dispersion_at = max(measured, 1.0 + (dispersion - 1.0) * fade), now
            if measured >= peak or now - peak_at > self.burst_memory_s:
                peak, peak_at = measured, now
        return dispersion, dispersion_at, peak, peak_at

    def _ready_need(self, ctx: PolicyContext, q: float, stable: float, whole: int, whole_at_q: float) -> int:
        """The replicas the part of the lead window a replica asked for now can serve needs (``Forecast.ready``, from
        its cold start on; :mod:`autoscaler.policies.horizon`); ``whole``: what the whole window needs, sized at its
        ``q`` quantile ``whole_at_q``."""
        forecast = ctx.forecast
        ready = forecast.ready if forecast is not None else None
        if ready is None or not (load := ready.at(q)) < whole_at_q:
            # (the usual case: a quantile's spread widens with the horizon, and its peak is the window's last step)
            return whole
        if self.deflate_poisson:
            load = intensity_quantile(ready, q, FORECAST_STEP_S, value=load)
        return self._size(max(load, stable), ctx, ctx.capacity)

    def decide(self, ctx: PolicyContext) -> PolicyResult:
        state: SloState = ctx.state if isinstance(ctx.state, SloState) else SloState()
        current, spec = ctx.current_replicas, ctx.spec
        first_q = SloQuantile.initial(spec.slo_percentile)
        q = ctx.sizing_quantile if ctx.sizing_quantile is not None else first_q
        q_down = 1.0 - (1.0 - q) * self.down_margin
        step = ctx.metrics_step_s
        # (the observed floors in the forecast's unit: the offered work, where the core reads it)
        load_rate = ctx.metrics.rate if ctx.work_rate is None else ctx.work_rate
        stable = _window_mean(load_rate, step, self.stable_window_s) or 0.0
        short = _window_mean(load_rate, step, self.panic_window_s) or 0.0

        profile = ctx.capacity
        dispersion, dispersion_at, peak, peak_at = self._dispersion(state, ctx)
        forecast = at_q = ctx.forecast.at(q) if ctx.forecast is not None else math.nan
        if self.deflate_poisson and math.isfinite(forecast):
            forecast = intensity_quantile(ctx.forecast, q, FORECAST_STEP_S, value=forecast)
        if math.isfinite(forecast):
            load = max(forecast, stable)
            reason = Reason.SLO_BURN if q > first_q + 1e-6 and ctx.burn > 1.0 else Reason.FORECAST
        else:
            # Without a forecast this is a reactive policy; say so rather than claim a forecast.
            load, reason = stable, Reason.REACTIVE
        raw = self._size(load, ctx, profile)
        # The receding horizon's scale-up need (autoscaler/policies/horizon.py): the part of the window a replica
        # asked for now can serve, from its cold start on; ``raw`` is what the whole window holds.
        up = raw if not math.isfinite(forecast) else self._ready_need(ctx, q, stable, raw, at_q)
        # The load a burst lands on is the typical one, the forecast's median: its upper quantile is high *because*
        # minutes with a burst in them are (on the Azure code model q0.995 read 16 req/s around bursts on a
        # median of 3), and a burst charged as a batch on top of it is charged twice.
        expected = ctx.forecast.at(0.5) if ctx.forecast is not None else math.nan
        expected = max(expected, stable) if math.isfinite(expected) else load
        batch = capacity_model.batch_replicas(min(expected, load), dispersion, profile) if self.burstiness else 0
        batch = min(batch, ctx.spec.max_replicas + 1)
        raw, up = max(raw, batch), max(up, batch)  # (a burst can come at any time: a floor of both needs)
        detail = f"{_q_text(q)} forecast {forecast:.2f}, observed {stable:.2f} req/s ({short:.2f} short): {raw}"
        # A queue already built (after a burst, or a jump the forecast missed) must drain, not only stop
        # growing: size for the arrivals plus the backlog spread over ``drain_s`` (Little's law: the
        # requests in the system beyond those in service at this rate). By default the backlog is to be
        # gone within the SLO latency -- a queue older than that is late requests. (Measured on ServeGen
        # days 2 and 3 separately: draining over 60 s instead left 1.7-1.9x the violating requests at
        # about the same GPU-hours.)
        in_flight = _last_finite(ctx.metrics.in_flight)
        # (a decode-bound model holds each request longer the larger its batch: what is in service at this load
        # is no backlog, capacity.batch_factor)
        mean_s = profile.mean_s if not profile.batch_slows else _served_mean_s(max(stable, short), ctx, profile)
        backlog = in_flight - max(stable, short) * mean_s
        # It is a backlog when the replicas in place need longer than the SLO latency to serve it (a
        # steady queue of a count that meets the SLO never is).
        throughput = max(ctx.ready_replicas, 1) * profile.concurrency / mean_s
        if backlog > 0 and backlog / throughput > spec.slo_latency_s:
            drain_s = self.drain_s if self.drain_s is not None else spec.slo_latency_s
            drain = self._size(max(stable, short) + backlog / drain_s, ctx, profile)
        else:
            drain = 0
        panic = max(self._size(short, ctx, profile), drain)
        if panic > raw:
            # (also when not above the current count: then it is the floor the scale-down must respect)
            if panic > current:
                reason = Reason.PANIC
            raw, up = panic, max(up, panic)
            detail = f"short-window load {short:.2f} req/s, backlog {max(backlog, 0.0):.0f}: {panic}"

        knee = capacity_model.knee_target(profile)
        if knee is not None:
            # More replicas stop helping: the service alone is slower than the SLO for too many requests.
            reason = Reason.SLO_UNATTAINABLE
            detail = (f"p{spec.slo_percentile:g} {spec.slo_metric} service time "
                      f"{capacity_model.latency_part_at_percentile(profile):.2f} s vs SLO {spec.slo_latency_s:g} s: "
                      f"at most {profile.attainable:.1%} of requests can be in time however many replicas serve; "
                      f"sized at the knee ({raw}, for {knee:.1%} within the SLO); {detail}")
        if profile.itl_slo_s is not None:
            itl_reason, detail = _itl_detail(load, profile, spec, detail)
            reason = itl_reason or reason
        if up < raw:
            planned = first_step(current, up, raw)
            if planned < raw:
                detail = f"{detail}; {planned} by the ready window ({up} needed from the cold start on)"
            raw = planned
        new_state = state if (dispersion_at == state.dispersion_at) \
            else SloState(dispersion, dispersion_at, peak, peak_at)  # (immutable: kept while unchanged)
        n_minus_1 = None
        if raw < current:
            # N-1 check: the smaller count must still meet the SLO at a stricter quantile than scale-up's.
            strict = ctx.forecast.at(q_down) if ctx.forecast is not None else math.nan
            floor_load = max(strict if math.isfinite(strict) else 0.0, stable, short)
            # The check keeps a burst's batch at the largest dispersion measured within the burst memory (scale-up
            # sizes it at the faded one): a window whose bursts were smaller, or that missed one, does not shed the
            # replicas the next large burst needs (the Azure code model went from 3 to 2 replicas that way, and lost
            # 243 requests to its next bursts).
            burst = max(peak, dispersion) if self.burstiness else 1.0
            base = min(expected, load)
            n_minus_1 = NMinus1(lambda: max(self._size(floor_load, ctx, profile),
                                            capacity_model.batch_replicas(base, burst, profile)),
                                f"the SLO at {_q_text(q_down)}")
        return PolicyResult(raw, new_state, reason, detail, n_minus_1=n_minus_1,
                            arrival_scv=dispersion if self.burstiness else None)


def _served_mean_s(rate: float, ctx: PolicyContext, profile: ServiceProfile) -> float:
    """How long a request holds its slot on the replicas in place at ``rate``: the mean occupancy slowed by the batch
    (:func:`autoscaler.estimation.capacity.batch_factor`), a full batch's when they cannot keep up."""
    g = capacity_model.batch_factor(rate / max(ctx.ready_replicas, 1), profile)
    full = 1.0 + profile.batch_slows * (profile.concurrency - 1)
    return profile.mean_s * min(g, full)


def _itl_detail(load: float, profile: ServiceProfile, spec: ModelSpec, detail: str) -> tuple[Reason | None, str]:
    """A TTFT+ITL model's detail names the bound that set its count (issue 17): the replicas each SLO alone needs at
    the load it was sized for (the larger is the count, :func:`autoscaler.estimation.capacity.min_replicas_for_slo`),
    and the batch the ITL target allows. An ITL a request decoding alone misses is out of reach: said, with the
    reason ``SLO_UNATTAINABLE``; the model is sized for its latency SLO."""
    itl_ms = spec.slo_itl_ms
    if not profile.itl_reachable:
        return Reason.SLO_UNATTAINABLE, (f"ITL SLO {itl_ms:g} ms out of reach: a request decoding alone takes "
                                         f"{profile.itl_base_s * 1000:.3g} ms per token; sized for the "
                                         f"{spec.slo_metric} SLO; {detail}")
    cap = profile.itl_cap
    if cap is None or not load > 0:
        return None, f"{detail}; {spec.slo_metric} binds (the ITL SLO {itl_ms:g} ms holds at the full batch)"
    lat, itl = capacity_model.slo_bounds(quantize_up(load), profile, spec.max_replicas + 1)
    which = "ITL" if itl > lat else spec.slo_metric.upper()
    return None, (f"{detail}; {which} binds: ITL {itl_ms:g} ms allows a batch of {cap} of {profile.concurrency} "
                  f"(ITL needs {itl}, {spec.slo_metric} {lat} replicas)")


FORECAST_STEP_S = 60.0  # the fleet forecaster's step: its quantiles are of per-minute mean rates


def intensity_quantile(forecast: Forecast, q: float, step_s: float, value: float | None = None) -> float:
    """The ``q`` quantile of the arrival *intensity* the forecast implies: its spread above the median less the
    Poisson noise of a count over ``step_s`` (variance ``rate / step_s``), which the queueing model charges
    again when it sizes for Poisson arrivals at that rate. The two are normal-approximated: at the level
    ``q`` (z standard deviations) the spread ``s`` keeps ``sqrt(s^2 - (z sd_poisson)^2)``. Never below the
    median: where the spread is no wider than the Poisson part it is all noise, and the median is the intensity.
    ``value``: ``forecast.at(q)`` when the caller has it already."""
    if value is None:
        value = forecast.at(q)
    median = forecast.at(0.5)
    spread = value - median
    if not (spread > 0 and median > 0 and q > 0.5):
        return value
    noise = _z(q) * math.sqrt(median / step_s)
    return median + math.sqrt(max(spread * spread - noise * noise, 0.0))


@lru_cache(maxsize=1024)
def _q_text(q: float) -> str:
    """``q0.995``: a quantile as the details name it (formatted for every model and tick; ``q`` moves once a
    minute)."""
    return f"q{q:.3g}"


@lru_cache(maxsize=1024)
def _z(q: float) -> float:
    """The standard normal quantile at ``q`` (asked for every model and tick; ``q`` moves once a minute)."""
    return NormalDist().inv_cdf(min(q, 1.0 - 1e-9))


def _window_mean(samples: np.ndarray, step_s: float, window_s: float) -> float | None:
    """:func:`window_mean`, read every tick twice: a window of one sample (the panic window on 10 s samples)
    without the slicing, a short one (the stable window) summed at once when every sample is finite (the same sum
    in the same order as window_mean's of the finite samples)."""
    if samples.size and step_s > 0:
        n = max(1, math.floor(window_s / step_s + 0.5))
        if n == 1:
            v = float(samples[-1])
            return v if math.isfinite(v) else None
        if n <= 8:
            tail = samples[-n:].tolist()
            total = sum(tail)
            if math.isfinite(total):
                return total / len(tail)
    return window_mean(samples, step_s, window_s)


def arrival_dispersion(rate: np.ndarray, step_s: float, cap: float = 64.0) -> float:
    """The arrivals' index of dispersion (variance / mean of the per-sample counts; 1 for Poisson) over
    the window, from first differences so that a trend is not read as burstiness (a single level shift
    is, for the length of the window: a mild over-provision right after a jump). Below 2^(1/2) it is 1:
    the estimate of a Poisson stream scatters around 1 (over 30-60 samples a quarter of the estimates
    reach 1.4), and the stabilization window would keep the worst of them. Above, rounded to the nearest
    step of a geometric grid of 2^(1/4) so that sizing reuses its memo; at most ``cap``."""
    counts = rate[np.isfinite(rate)] * step_s
    if counts.size < 6:
        return 1.0
    mean = float(np.add.reduce(counts)) / counts.size  # (= counts.mean(), without its dispatch)
    if not mean > 0:
        return 1.0
    d = np.diff(counts)
    index = float(np.dot(d, d)) / (2.0 * d.size * mean)
    if not index >= math.sqrt(2.0):
        return 1.0
    return min(cap, 2.0 ** (round(math.log2(index) * 4.0) / 4.0))


def _last_finite(samples: np.ndarray) -> float:
    if samples.size and math.isfinite(last := float(samples[-1])):
        return last  # the common case, without a numpy pass over the window
    finite = samples[np.isfinite(samples)] if samples.size else samples
    return float(finite[-1]) if finite.size else 0.0
