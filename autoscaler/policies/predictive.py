"""A Dynamo-Planner-like predictive baseline: a point forecast of the next interval's load, sized by throughput.

Models the throughput mode of NVIDIA Dynamo's planner (``ai-dynamo/dynamo``, ``components/src/dynamo/planner``;
``docs/architecture/sla_planner.md``), and with it the shape of AIBrix's predictive mode: every
``adjustment_interval_s`` (Dynamo's ``throughput_adjustment_interval``, 180 s):

1. observe the mean request rate over the last interval (NaN samples are missing data and are skipped);
2. fold it into an online point predictor and forecast the mean rate of the next interval:
   ``holt`` (Holt's linear exponential smoothing), ``kalman`` (Dynamo's local-linear-trend Kalman filter,
   defaults q_level 1.0, q_trend 0.1, r 10) or ``constant`` (Dynamo's ``ConstantPredictor``: the last
   interval's mean);
3. desired = ceil(forecast / (per-replica throughput × ``target_utilization``)), at least ``min_endpoint``
   (Dynamo's floor, 1). The per-replica throughput is ``concurrency / mean service time`` of the context's
   service profile (``ctx.capacity``), the counterpart of Dynamo's pre-deployment profiling: the simulator
   warm-starts it from offline profiling of the workload's service times, and without a profile it is the
   spec's prior, whose mean is exactly ``service_time_ms`` (then this is ``replicas_for_load`` on the spec).
   Not ``spec.service_time_ms`` alone: for a token-priced LLM spec (``prefill_ms_per_1k_tokens``,
   ``decode_ms_per_token``) that field is an unused default (100 ms) while a request really holds a slot for
   seconds, and sizing on it under-provisions by an order of magnitude.

What this baseline stands for in the benchmarks: forecast-based, but a *point* forecast (no quantiles, so no
headroom for forecast error), no learned capacity (the profile it is given, never corrected online), and a
fixed horizon (one interval ahead, whatever the model's cold start). The predictor lives in this policy's own state; the
decision core's quantile forecast is not used (``uses_forecast = False``).

Kalman units: Dynamo filters the request *count* per interval, and its noise defaults are in those units.
The filter here runs on the same count (rate × interval) and converts the forecast back to req/s. The point
forecast does not depend on that choice: scaling Q, R and the initial covariance by one common factor leaves
every gain, hence every forecast, unchanged, so the defaults mean the same for any unit of the data.

Holt: level/trend smoothing ``alpha`` = 0.5, ``beta`` = 0.3 (fixed: Dynamo's predictors take no tuning
either); the trend starts from the first two observations (l = y2, b = y2 − y1), so an exact linear ramp is
forecast exactly from the second decision on.

Not modelled (documented so nobody mistakes this for the real planner):

- ARIMA (Dynamo's default predictor) and Prophet: they need pmdarima/prophet and a refit per interval; Holt
  and the Kalman filter are the numpy point forecasters with the same role;
- ISL/OSL forecasts, the prefill/decode split and the ITL/TTFT correction factors: one replica kind, one
  request-rate signal, throughput from the given profile (no latency-driven correction);
- the 5 s load-based loop (online regression on forward-pass metrics) that adds replicas above the floor;
- holding while a previous scale is still in progress, the GPU budget (``max_gpu_budget``) and the
  scale-down consolidation check: the only stabilization is the interval itself;
- skipping the leading idle period (Dynamo ignores zeros until the first non-zero point) and reading NaN as
  0: here NaN samples are ignored and a whole interval of them skips the update (the core's stale-metric rail
  holds the replicas, as Dynamo skips a tick without metrics).

Clamping to the spec's min/max replicas and holding on stale metrics are the rails' (``autoscaler.decision.scaledown``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from autoscaler.api.plan import Reason
from autoscaler.api.snapshot import window_mean
from autoscaler.api.spec import ModelSpec
from autoscaler.policies.base import PolicyContext, PolicyResult, ScalingBehavior

PREDICTORS = ("holt", "kalman", "constant")

HOLT_ALPHA = 0.5  # level smoothing
HOLT_BETA = 0.3  # trend smoothing

# Dynamo's KalmanPredictor defaults (planner_config: kalman_q_level, kalman_q_trend, kalman_r; P = 1000 I),
# in its units: requests per adjustment interval.
KALMAN_Q_LEVEL = 1.0
KALMAN_Q_TREND = 0.1
KALMAN_R = 10.0
KALMAN_P0 = 1000.0


@dataclass(frozen=True)
class PredictiveState:
    """The point predictor, folded once per interval.

    ``level``/``trend`` are in req/s (Holt, constant) or requests per interval (Kalman, as Dynamo filters);
    ``cov`` is the Kalman posterior covariance (p_ll, p_lt, p_tt), unused by the other predictors.
    """

    observations: int = 0
    level: float = 0.0
    trend: float = 0.0
    cov: tuple[float, float, float] = (KALMAN_P0, 0.0, KALMAN_P0)


def _holt(state: PredictiveState, y: float) -> PredictiveState:
    if state.observations == 0:
        return PredictiveState(observations=1, level=y, trend=0.0)
    if state.observations == 1:
        return PredictiveState(observations=2, level=y, trend=y - state.level)
    level = HOLT_ALPHA * y + (1 - HOLT_ALPHA) * (state.level + state.trend)
    trend = HOLT_BETA * (level - state.level) + (1 - HOLT_BETA) * state.trend
    return PredictiveState(observations=state.observations + 1, level=level, trend=trend)


def _kalman(state: PredictiveState, z: float) -> PredictiveState:
    """One predict + update of the local linear trend model x = [level, trend], F = [[1, 1], [0, 1]], H = [1, 0]."""
    if state.observations == 0:
        # Dynamo: the first point sets the level, trend 0, covariance left at P0.
        return PredictiveState(observations=1, level=z, trend=0.0, cov=(KALMAN_P0, 0.0, KALMAN_P0))
    p_ll, p_lt, p_tt = state.cov
    # Predict: x = F x, P = F P F' + Q.
    level, trend = state.level + state.trend, state.trend
    p_ll, p_lt, p_tt = p_ll + 2 * p_lt + p_tt + KALMAN_Q_LEVEL, p_lt + p_tt, p_tt + KALMAN_Q_TREND
    # Update with z: K = P H' / (H P H' + R).
    s = p_ll + KALMAN_R
    k_l, k_t = p_ll / s, p_lt / s
    innovation = z - level
    level, trend = level + k_l * innovation, trend + k_t * innovation
    # P = (I - K H) P, kept symmetric.
    p_ll, p_lt, p_tt = (1 - k_l) * p_ll, (1 - k_l) * p_lt, p_tt - k_t * p_lt
    return PredictiveState(observations=state.observations + 1, level=level, trend=trend, cov=(p_ll, p_lt, p_tt))


def throughput_per_replica(ctx: PolicyContext) -> float:
    """Requests/s one replica completes when busy: its concurrency over the profile's mean service time."""
    return ctx.capacity.concurrency / ctx.capacity.mean_s


def _is_number(x: object) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


class PredictivePolicy:
    """Dynamo-Planner-like throughput scaling on a point forecast of the next interval's mean request rate.

    ``target_utilization`` is the fraction of a replica's profiled throughput (``concurrency / mean service
    time`` of ``ctx.capacity``, req/s) planned for; ``adjustment_interval_s`` is both the forecast step and
    how often the policy decides (``tick_s``); ``predictor`` is ``holt``, ``kalman`` or ``constant``;
    ``min_endpoint`` is the replica floor.
    """

    name = "predictive"
    instant_start = False
    uses_forecast = False  # keeps its own point predictor in its state; the core's quantiles are not for it
    learns = False
    behavior: ScalingBehavior | None = None  # the adjustment interval is its only stabilization (as Dynamo's)

    def __init__(
        self,
        target_utilization: float = 0.7,
        adjustment_interval_s: float = 180.0,
        predictor: str = "holt",
        min_endpoint: int = 1,
    ) -> None:
        if not (_is_number(target_utilization) and 0 < target_utilization <= 1):
            raise ValueError(f"target_utilization must be in (0, 1], got {target_utilization!r}")
        if not (_is_number(adjustment_interval_s) and 0 < adjustment_interval_s < math.inf):
            raise ValueError(f"adjustment_interval_s must be a finite number > 0, got {adjustment_interval_s!r}")
        if predictor not in PREDICTORS:
            raise ValueError(f"unknown predictor {predictor!r}; known: {', '.join(PREDICTORS)}")
        if isinstance(min_endpoint, bool) or not isinstance(min_endpoint, int) or min_endpoint < 0:
            raise ValueError(f"min_endpoint must be an integer >= 0, got {min_endpoint!r}")
        self.target_utilization = float(target_utilization)
        self.adjustment_interval_s = float(adjustment_interval_s)
        self.predictor = predictor
        self.min_endpoint = min_endpoint
        self.tick_s = self.adjustment_interval_s

    def initial_state(self, spec: ModelSpec, replicas: int) -> PredictiveState:
        return PredictiveState()

    def _fold(self, state: PredictiveState, observed: float) -> tuple[PredictiveState, float]:
        """The predictor after ``observed`` (req/s over the last interval) and its forecast for the next one."""
        if self.predictor == "kalman":
            new = _kalman(state, observed * self.adjustment_interval_s)
            return new, (new.level + new.trend) / self.adjustment_interval_s
        if self.predictor == "holt":
            new = _holt(state, observed)
            return new, new.level + new.trend
        new = PredictiveState(observations=state.observations + 1, level=observed)
        return new, observed

    def decide(self, ctx: PolicyContext) -> PolicyResult:
        state: PredictiveState = ctx.state if isinstance(ctx.state, PredictiveState) else PredictiveState()
        current = ctx.current_replicas
        observed = window_mean(ctx.metrics.rate, ctx.metrics_step_s, self.adjustment_interval_s)
        if observed is None:
            # No finite rate sample in the interval: like Dynamo skipping a tick, the predictor is not fed.
            return PolicyResult(current, state, Reason.METRICS_STALE, "no rate samples in the interval")
        new_state, forecast = self._fold(state, observed)
        forecast = max(0.0, forecast)
        per_replica = throughput_per_replica(ctx) * self.target_utilization
        # As replicas_for_load, with the profile's throughput instead of the spec's service_time_ms.
        needed = math.ceil(forecast / per_replica - 1e-9) if forecast > 0 else 0
        desired = max(self.min_endpoint, needed)
        detail = (
            f"{self.predictor} forecast {forecast:.2f} req/s for the next {self.adjustment_interval_s:g}s "
            f"(observed {observed:.2f} req/s), {per_replica:.2f} req/s/replica at {self.target_utilization:.0%}"
        )
        reason = Reason.STABLE if desired == current else Reason.FORECAST
        return PolicyResult(desired, new_state, reason, detail)
