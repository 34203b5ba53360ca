"""Decode behaviour learned online: the ITL of a request decoding alone and its growth with the batch.

The capacity model's ITL law (:mod:`autoscaler.estimation.capacity`, "Decode-bound saturation and the ITL SLO") is
``ITL(b) = d (1 + alpha (b - 1))``, with ``d`` (``decode-ms-per-token``) and ``alpha`` (``decode-batch-slowdown``)
declared. Both depend on things a user rarely measures for the fleet's real traffic -- the prompt and output
lengths (the KV cache each step reads), the engine version, the GPU's clocks -- and the ITL SLO's batch cap is
sized from them: a ``d`` declared 20 % low lifts the cap, and every replica is then run at a batch whose ITL misses.

Every engine the controller reads exports an ITL histogram (vLLM, SGLang, TGI: ``MetricNames.itl_histogram``), so
each metric step gives the ITL at the SLO percentile (``ModelMetrics.itl_s``); the batch that percentile was
decoded at is the law's own: :func:`~autoscaler.estimation.capacity.itl_batch` of the replicas' offered load,
which the capacity learner reads from the in-flight count (:meth:`CapacityLearner.erlangs`). So each step is one
point ``(b - 1, ITL)`` of a straight line with intercept ``d`` and slope ``d alpha``, and :class:`ItlLearner`
fits it by exponentially weighted least squares.

The declared curve is the prior: pseudo-observations at both ends of the batch range (batch 1 and a full batch),
fading like data down to a floor that is never lost. A model served at one steady load shows one batch only, which
pins the line's height there and says nothing of its slope; the floor then keeps the declared slope through that
point (the data move the level, the declaration keeps the shape), while a load that moves spreads the points and
the data take over both.
"""

from __future__ import annotations

import math

from autoscaler.estimation.capacity import itl_batch_scalar

__all__ = ["ItlLearner"]


class ItlLearner:
    """Learns ``d`` and ``alpha`` of ``ITL(b) = d (1 + alpha (b - 1))`` for one model (module docstring).

    ``observe(itl_s, erlangs)``: the ITL at the SLO percentile over a metric step, on the reference hardware (the
    caller divides a slower slot's slowdown out), and the offered load per replica in Erlangs over the same step.
    ``half_life``: observations (60 at 10 s ticks: ten minutes). ``prior_weight`` pseudo-observations of the declared
    curve (half at batch 1, half at a full batch) fade like data to ``prior_floor``. ``bounds``: how far ``d`` may
    move from the declared (a factor); ``max_alpha``: the steepest slope believed (2: each extra request triples
    the step). Values are reported in 1 % steps (:attr:`key`), so sizing keeps its memo while the fit is steady.

    ``tolerance``: while the fit's ITL at batch 1 and at a full batch are both within this share of the declared
    curve's, the declared values are reported. The ITL SLO's batch cap is an integer, ``floor(1 + (slo / d - 1) /
    alpha)``, so a declaration that puts a batch's ITL right at the SLO (the simulator's own LLM defaults do) flips
    the cap by one on a 1 % fit error -- a sixth of a replica's capacity on the estimate's noise, where the ITL
    histogram's buckets (vLLM's 10, 25, 50, 75 ms ...) resolve no better than a few per cent. A declaration off by
    more than that is what the learner is for.
    """

    def __init__(
        self,
        d_s: float,
        alpha: float,
        concurrency: int,
        percentile: float,
        *,
        prior_weight: float = 4.0,
        prior_floor: float = 0.1,
        half_life: float = 60.0,
        bounds: tuple[float, float] = (0.1, 10.0),
        max_alpha: float = 2.0,
        resolution: float = 0.01,
        tolerance: float = 0.05,
    ) -> None:
        if not (math.isfinite(d_s) and d_s > 0.0):
            raise ValueError(f"the declared ITL at batch 1 must be > 0, got {d_s!r}")
        if not (math.isfinite(alpha) and 0.0 <= alpha <= max_alpha):
            raise ValueError(f"the declared decode-batch slowdown must be in [0, {max_alpha}], got {alpha!r}")
        if concurrency < 1 or not 0.0 < percentile < 100.0:
            raise ValueError("need concurrency >= 1 and a percentile in (0, 100)")
        lo, hi = bounds
        if not (0.0 < lo <= 1.0 <= hi and prior_weight >= prior_floor > 0.0 and half_life > 0 and resolution > 0):
            raise ValueError("need 0 < lo <= 1 <= hi, prior_weight >= prior_floor > 0, half_life > 0, resolution > 0")
        self.d0, self.alpha0 = float(d_s), float(alpha)
        self.concurrency = int(concurrency)
        self.p = percentile / 100.0
        self._x1 = float(self.concurrency - 1)  # the prior's far end: a full batch
        self._y1 = self.d0 * (1.0 + self.alpha0 * self._x1)
        self._gamma = 0.5 ** (1.0 / half_life)
        self._prior_w = float(prior_weight) / 2.0  # per end
        self._floor_w = float(prior_floor) / 2.0
        self._d_lo, self._d_hi = self.d0 * lo, self.d0 * hi
        self._max_alpha = float(max_alpha)
        self._step = math.log1p(resolution)
        self._tolerance = float(tolerance)
        # decayed sums of the data: weight, x, x^2, y, xy
        self._s = [0.0, 0.0, 0.0, 0.0, 0.0]
        self._n = 0
        self._fit = (self.d0, self.alpha0)
        self._kept = True
        self._key = (self.d0, self.alpha0)

    # -- reading ------------------------------------------------------------------------------

    @property
    def count(self) -> int:
        """Observations used so far."""
        return self._n

    @property
    def d_s(self) -> float:
        """The ITL of a request decoding alone (s): the declared one while it is :attr:`kept`, else in 1 % steps."""
        return self._key[0]

    @property
    def alpha(self) -> float:
        """The ITL's growth per extra request in the batch: the declared one while it is :attr:`kept`, else in 1 %
        steps of the full batch's growth."""
        return self._key[1]

    @property
    def kept(self) -> bool:
        """Whether the readings bear the declaration out (within the tolerance): the declared values, exactly."""
        return self._kept

    @property
    def key(self) -> tuple[float, float]:
        """The reported ``(d_s, alpha)``: equal keys, equal values (what a cache of profiles compares)."""
        return self._key

    def predicted_s(self, batch: float) -> float:
        """The ITL the current fit predicts at ``batch`` (unrounded)."""
        d, alpha = self._fit
        return d * (1.0 + alpha * max(batch - 1.0, 0.0))

    # -- learning -----------------------------------------------------------------------------

    def batch(self, erlangs: float) -> float:
        """The batch the ITL at the SLO percentile is decoded at, at ``erlangs`` offered per replica."""
        return itl_batch_scalar(self.p, erlangs, self.concurrency)

    def observe(self, itl_s: float, erlangs: float) -> float | None:
        """Learn from one step; returns the batch the reading was placed at, or None if it was skipped (not finite,
        not positive, or no load)."""
        if not (math.isfinite(itl_s) and itl_s > 0.0 and math.isfinite(erlangs) and erlangs > 0.0):
            return None
        x = self.batch(erlangs) - 1.0
        g = self._gamma
        s = self._s
        s[0] = g * s[0] + 1.0
        s[1] = g * s[1] + x
        s[2] = g * s[2] + x * x
        s[3] = g * s[3] + itl_s
        s[4] = g * s[4] + x * itl_s
        self._prior_w = max(self._prior_w * g, self._floor_w)
        self._n += 1
        self._refit()
        return x + 1.0

    def _refit(self) -> None:
        w, x1, y0, y1 = self._prior_w, self._x1, self.d0, self._y1
        s0, sx, sxx, sy, sxy = self._s
        s0 += 2.0 * w
        sx += w * x1
        sxx += w * x1 * x1
        sy += w * (y0 + y1)
        sxy += w * x1 * y1
        det = s0 * sxx - sx * sx
        if x1 <= 0.0 or not det > 1e-12 * s0 * sxx:  # one batch size only (c == 1): the level alone
            d, alpha = sy / s0, self.alpha0
        else:
            slope = (s0 * sxy - sx * sy) / det
            d = (sy - slope * sx) / s0
            d = min(max(d, self._d_lo), self._d_hi)
            alpha = min(max(slope / d, 0.0), self._max_alpha)
        d = min(max(d, self._d_lo), self._d_hi)
        self._fit = (d, alpha)
        tol = self._tolerance
        self._kept = abs(d / self.d0 - 1.0) <= tol and abs(d * (1.0 + alpha * x1) / y1 - 1.0) <= tol
        if self._kept:  # the declaration explains the data: its values, exactly
            self._key = (self.d0, self.alpha0)
        else:  # 1 % steps of d and of the full batch's growth, so that a steady fit reports the same values
            step = self._step
            d_q = self.d0 * math.exp(round(math.log(d / self.d0) / step) * step)
            a_q = math.expm1(round(math.log1p(alpha * x1) / step) * step) / x1 if x1 > 0.0 else self.alpha0
            self._key = (d_q, a_q)
