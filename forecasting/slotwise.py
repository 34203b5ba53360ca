"""The slotwise forecaster: an online, per-series selection of cheap members by recent pinball loss,
with conformal (quantile-tracking) calibration of every quantile.

One module: :class:`SlotwiseBatch` is one online algorithm whose members, selection and calibration update the
same arrays in lock step every step, and :class:`SlotwiseForecaster` is its one-series face.

Why this shape. Request-rate series of inference models are a zoo: smooth high-volume services,
bursty ones, timers that fire every 5 or 15 minutes, intermittent functions that are mostly zero,
daily seasonal chat traffic, level shifts when a client moves traffic. No single model wins on all of
them, and the controller must forecast every model on every tick. So each series gets a small library
of members that cost a few array operations each (last value, moving means, exponential smoothing at
three speeds, repeat-the-last-period for timer periods, seasonal naive / seasonal means with a level
correction), and per (series, horizon step) the member with the lowest exponentially weighted
absolute error (pinball at the median) over the recent past gives the point forecast. That choice
adapts online: when the series changes character, another member takes over within a few dozen steps,
and nothing is fitted to a particular data set.

Quantiles: per (series, step, level) the candidate with the lowest running pinball loss among
(a) the combined point plus the empirical quantiles of its recent errors, relative to a running level
of the series (split-conformal on a sliding window, so intervals follow day/night swings and level
shifts), (b) the empirical quantiles of the series' own last 16 / 64 values (a mean-reverting or bursty
series is better described by its recent spread than by a point plus an error) and (c) with a season,
the level-corrected spread of the same time of day over the last days. Choosing by loss is itself a
data-dependent step, so a conformal quantile tracker (:mod:`forecasting.calibration`) calibrates the
final quantile and guarantees long-run coverage at the nominal level, per series. Every series is
forecast on its own: a batch is only a way to step many series with the same array operations, so a
series' forecast does not depend on which others share its batch (what the controller's shards rely on).

:class:`SlotwiseBatch` runs M series in lock step (the backtest, the 1,000-series benchmark);
:class:`SlotwiseForecaster` is the per-model object the controller holds (one series, same code).

Missing points (NaN): no member is scored on them and the series is imputed with its own one-step
median forecast, so a gap neither teaches the trackers nor breaks the lags. Empty history: the
quantiles of a prior rate (an annotation hint, or the median of similar models -- see
:func:`prior_from_similar`) under an exponential spread, which errs wide on purpose.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from forecasting.calibration import QuantileTracker, pinball

DEFAULT_LEVELS = (0.5, 0.75, 0.9, 0.95, 0.99)
# Periods (seconds) of the timers that dominate serverless / batch traffic; used as "repeat the last
# period" members when they are a whole number of steps.
TIMER_PERIODS_S = (300.0, 600.0, 900.0, 1800.0, 3600.0)
# Windows (steps) of the "recent-window quantile" candidates: for a mean-reverting or bursty series
# the spread of its own recent values is a better upper quantile than any point plus an error.
CLIMATE_WINDOWS = (16, 64)
# Steps of a warm-start history replayed through the full online updates (members scored, windows and
# trackers filled exactly as live); older steps only fill lags and levels. The controller's setting, and
# the default everywhere, so that a warm start costs the same and gives the same state in every path.
REPLAY = 256


@dataclass(frozen=True)
class _Member:
    name: str
    kind: str
    arg: float = 0.0


def _interp_levels(values: np.ndarray, levels: np.ndarray, quantiles: np.ndarray) -> np.ndarray:
    """values (..., L, h) at ``levels`` -> (..., len(quantiles), h), linear in the level, clamped."""
    if len(levels) == len(quantiles) and np.allclose(levels, quantiles):
        return values
    idx = np.clip(np.searchsorted(levels, quantiles, side="left"), 1, len(levels) - 1)
    lo, hi = levels[idx - 1], levels[idx]
    w = np.clip((quantiles - lo) / np.where(hi > lo, hi - lo, 1.0), 0.0, 1.0)
    if len(levels) == 1:
        return np.repeat(values, len(quantiles), axis=-2)
    a = values[..., idx - 1, :]
    b = values[..., idx, :]
    return a + (b - a) * w[:, None]


class SlotwiseBatch:
    """M series forecast together (same step, same clock). See the module docstring.

    Parameters
    ----------
    n_series: number of series M.
    horizon: steps tracked (scored, calibrated); longer requests repeat the last step's quantiles.
    levels: quantile levels tracked; other levels are interpolated.
    season: season length in steps (e.g. one day), or None.
    step_s: step in seconds (decides which timer periods are whole steps); None = no timer members.
    unit: one request in the input's units (1 for counts per step, 1/step_s for req/s): the floor of
        the scale, so an idle series is not judged in relative error against a level of zero.
    loss_decay: weight of the newest loss in the running pinball loss (memory ~ 1/loss_decay steps).
    calib_lr: learning rate of the calibration tracker (relative to the running |score|).
    window: recent errors kept per (series, step) for the conformal spread.
    min_scored: a member is eligible once it has been scored this many times (at that step).
    season_days: days averaged by the seasonal-mean members.
    replay: steps of a warm-start history run through the full online updates (see warm_start).
    spread_every: recompute the conformal spread (quantiles of the error window) every this many steps
        (None = window // 64). The window moves by one error per step, so between recomputations the
        spread changes by ~1/64 of its content; the calibration tracker absorbs that, and the quantiles
        of the window are over half of the per-step cost.
    prior: per-series prior rate used while a series has no observation (None = 0).
    zero_aware: count a zero target as covered (as the metric does) and floor the offset there.
    blend_power: quantile candidates are combined with weights (best loss / loss) ** blend_power
        (inf = use the best one only); see :meth:`_combine`.
    """

    def __init__(
        self,
        n_series: int,
        horizon: int = 30,
        levels: Sequence[float] = DEFAULT_LEVELS,
        season: int | None = None,
        step_s: float | None = None,
        unit: float = 0.0,
        loss_decay: float = 0.02,
        calib_lr: float = 0.02,
        min_scored: int = 10,
        window: int = 256,
        season_days: int = 7,
        replay: int = REPLAY,
        spread_every: int | None = None,
        prior: np.ndarray | float | None = None,
        zero_aware: bool = True,
        blend_power: float = 4.0,
    ) -> None:
        self.n_series = int(n_series)
        self.zero_aware = bool(zero_aware)
        if not float(blend_power) >= 0.0:
            raise ValueError(f"blend_power must be >= 0 (inf: the argmin), got {blend_power!r}")
        self.blend_power = float(blend_power)

        self.horizon = max(1, int(horizon))
        self.levels = np.sort(np.asarray(levels, dtype=float))
        if not np.all((self.levels > 0) & (self.levels < 1)):
            raise ValueError("quantile levels must lie in (0, 1)")
        self.season = int(season) if season and season >= 2 else None
        self.step_s = step_s
        self.unit = float(unit)
        self.loss_decay = float(loss_decay)
        self.calib_lr = float(calib_lr)
        self.min_scored = int(min_scored)
        self.window = max(2, int(window))
        self.season_days = max(1, int(season_days))
        self.replay = max(1, int(replay))
        self.spread_every = max(1, int(spread_every if spread_every is not None else self.window // 64))
        self.prior = prior
        self._build()

    # ------------------------------------------------------------------ set-up

    def _members(self) -> list[_Member]:
        out = [_Member("naive", "naive")]
        out += [_Member(f"mean{w}", "mean", w) for w in (4, 16, 64)]
        out += [_Member(f"ses{a}", "ses", a) for a in (0.5, 0.2, 0.05)]
        if self.step_s:
            periods = sorted(
                {
                    round(p / self.step_s)
                    for p in TIMER_PERIODS_S
                    if abs(p / self.step_s - round(p / self.step_s)) < 1e-9 and round(p / self.step_s) >= 2
                }
            )
            out += [_Member(f"period{p}", "period", p) for p in periods if p != self.season]
        if self.season and self.horizon <= self.season:
            out += [
                _Member("snaive", "snaive"),
                _Member("snaive+level", "snaive_adj"),
                _Member("smean+level", "smean_add"),
                _Member("smean*level", "smean_mul"),
            ]
        return out

    def _n_cand(self) -> int:
        seasonal = 1 if self.season and self.horizon <= self.season else 0
        return 1 + len(CLIMATE_WINDOWS) + seasonal + 1  # (the last: the point + absolute errors)

    def _build(self) -> None:
        m, h, q = self.n_series, self.horizon, len(self.levels)
        self.members_ = self._members()
        j = len(self.members_)
        periods = [int(x.arg) for x in self.members_ if x.kind == "period"]
        need = max([64, *periods]) + 1
        if self.season:
            need = max(need, self.season_days * self.season + self.season // 24 + 2)
        self._keep = need
        self._buf = np.zeros((m, 2 * need))
        self._pos = need  # columns [pos-keep, pos) hold the newest values; zeros before any data
        self.t_ = 0
        self.n_obs_ = np.zeros(m, dtype=np.int64)
        self.alphas_ = np.array([x.arg for x in self.members_ if x.kind == "ses"])
        self._ses = np.zeros((len(self.alphas_), m))
        self._fast = np.zeros(m)
        self._slow = np.zeros(m)
        # Forecasts waiting for their target, indexed by target slot (t mod h) and step k.
        self._pend_p = np.zeros((h, j, m, h))
        self._pend_valid = np.zeros((h, j, m, h), dtype=bool)
        self._pend_s = np.ones((h, m, h))
        self._pend_point = np.zeros((h, m, h))
        self._pend_spread = np.zeros((h, m, h, q))
        c = self._n_cand()
        self._pend_cand = np.zeros((h, c, m, h, q))
        self._pend_f = np.zeros((h, m, h, q))
        self.qloss_ = np.zeros((c, m, h, q))
        self.qn_ = np.zeros((c, m, h), dtype=np.int64)
        self._pend_ok = np.zeros((h, m, h), dtype=bool)
        self.loss_ = np.zeros((j, m, h))
        self.n_scored_ = np.zeros((j, m, h), dtype=np.int64)
        # Relative errors of the combined point forecast, newest `window` per (series, step).
        self._res = np.full((m, h, self.window), np.nan)
        # ... and the same errors in the series' own units (see _origin's absolute candidate)
        self._res_abs = np.full((m, h, self.window), np.nan)
        self._res_pos = 0
        self._res_n = 0
        # Wide, conservative spread (in units of the running level) until enough errors are seen:
        # a new series is over-provisioned for a few steps rather than under.
        self._init_spread = np.interp(self.levels, [0.5, 0.9, 0.99], [0.0, 1.0, 2.5])
        self.calib_ = QuantileTracker((m, h), self.levels, lr=self.calib_lr)
        self._cur_point = np.zeros((m, h))
        self._cur_f = np.zeros((m, h, q))
        self._qsel = np.zeros((m, h, q), dtype=np.int64)
        self._cur_spread = np.broadcast_to(self._init_spread, (m, h, q)).copy()
        self._cur_abs_spread = np.zeros((m, h, q))
        # The levels each candidate forecasts: all, but the absolute candidate the tail only (see _origin).
        self._levels_ok = np.ones((self._n_cand(), q), dtype=bool)
        self._levels_ok[-1] = self.levels > 0.5
        self._cur_s = np.ones(m)
        self._ks = np.arange(h)
        self._sel = np.zeros((m, h), dtype=np.int64)

    # ------------------------------------------------------------------ online

    @property
    def member_names(self) -> list[str]:
        return [x.name for x in self.members_]

    def _view(self) -> np.ndarray:
        return self._buf[:, self._pos - self._keep : self._pos]

    def _append(self, y: np.ndarray) -> None:
        if self._pos == self._buf.shape[1]:
            self._buf[:, : self._keep] = self._buf[:, self._pos - self._keep : self._pos]
            self._pos = self._keep
        self._buf[:, self._pos] = y
        self._pos += 1

    def update(self, y_new: np.ndarray) -> SlotwiseBatch:
        """Fold in new observations: shape (M,) for one step or (M, k) for k steps, oldest first."""
        y = np.asarray(y_new, dtype=float)
        if y.ndim == 1:
            y = y[:, None]
        if y.shape[0] != self.n_series:
            raise ValueError(f"expected {self.n_series} series, got {y.shape[0]}")
        for c in range(y.shape[1]):
            self._step(y[:, c])
        return self

    def warm_start(self, y: np.ndarray) -> SlotwiseBatch:
        """Start from a history (M, T): the last ``replay`` steps go through the online updates (members
        scored, windows and trackers filled exactly as live); older steps only fill the lags and levels,
        so a week of 10-second history costs a fraction of a second, not a minute."""
        y = np.asarray(y, dtype=float)
        if y.ndim == 1:
            y = y[:, None]
        old = max(0, y.shape[1] - self.replay)
        for c in range(old):
            self._step(y[:, c], score=False)
        if old:
            self._origin()
        return self.update(y[:, old:])

    def _step(self, y: np.ndarray, score: bool = True) -> None:
        slot = self.t_ % self.horizon
        seen = np.isfinite(y)
        if self.t_ > 0 and score:
            self._score(slot, y, seen)
        # Impute a gap with the one-step median forecast (else the last value), so lags stay sane.
        if not seen.all():
            fill = np.where(self._pend_ok[slot, :, 0] & score, self._cur_median1(slot), self._view()[:, -1])
            y = np.where(seen, y, fill)
        y = np.maximum(y, 0.0)
        first = self.n_obs_ == 0
        self.n_obs_ += seen
        self._append(y)
        self._ses = np.where(first, y, self._ses + self.alphas_[:, None] * (y - self._ses))
        ay = np.abs(y)
        self._fast = np.where(first, ay, self._fast + 0.1 * (ay - self._fast))
        self._slow = np.where(first, ay, self._slow + 0.01 * (ay - self._slow))
        self.t_ += 1
        if score:
            self._origin()

    def _cur_median1(self, slot: int) -> np.ndarray:
        return np.maximum(self._pend_point[slot, :, 0], 0.0)

    def _score(self, slot: int, y: np.ndarray, seen: np.ndarray) -> None:
        ok = self._pend_ok[slot] & seen[:, None]  # (M, h)
        if not ok.any():
            return
        s = self._pend_s[slot]  # (M, h): the scale when the forecast was made
        yy = np.where(seen, y, 0.0)[:, None]
        # Members: running absolute error (pinball at the median) of their point forecasts.
        valid = self._pend_valid[slot] & ok[None]
        err = np.abs(yy[None] - self._pend_p[slot])
        n = self.n_scored_
        # Plain mean while young, exponential forgetting afterwards.
        a = np.maximum(self.loss_decay, 1.0 / (n + 1.0)) * valid
        self.loss_ += a * (err - self.loss_)
        self.n_scored_ = n + valid
        # Combined forecast: its relative error joins the conformal window ...
        score = (yy - self._pend_point[slot]) / s
        # Until every step k has a forecast to score (the first h steps) the window is left alone: a
        # NaN in it would send every later step down the slow NaN-aware quantile path.
        if self._pend_ok[slot].any(axis=0).all():
            # (a relative error of 50 says "outlier", not "widen by 50x")
            self._res[:, :, self._res_pos] = np.where(ok, np.clip(score, -50.0, 50.0), np.nan)
            self._res_abs[:, :, self._res_pos] = np.where(ok, np.clip(score, -50.0, 50.0) * s, np.nan)
            self._res_pos = (self._res_pos + 1) % self.window
            self._res_n = min(self._res_n + 1, self.window)
        # ... and the tracker corrects whatever coverage error the window leaves.
        # Quantile candidates (conformal point + spread, recent-window quantiles): pinball per level.
        cand = self._pend_cand[slot]  # (C, M, h, Q)
        pin = pinball(yy[None, :, :, None], cand, self.levels)
        qn = self.qn_
        a = (np.maximum(self.loss_decay, 1.0 / (qn + 1.0)) * ok[None])[..., None]
        self.qloss_ += a * (pin - self.qloss_)
        self.qn_ = qn + ok[None]
        # ... and the tracker corrects whatever coverage error the chosen quantile leaves.
        final = (yy[..., None] - self._pend_f[slot]) / s[..., None]
        if self.zero_aware:
            # Coverage as it is scored: the quantile is clipped at 0, so a zero target is covered
            # whatever the offset. Counting it as a miss (the raw score exceeds a negative offset)
            # would push the offset up and over-cover the non-zero targets.
            final = np.where(yy[..., None] <= 0.0, np.minimum(final, self.calib_.r_), final)
        self.calib_.update(final, mask=ok, clip=50.0)
        if self.zero_aware:
            # Below -f/s the clipped quantile is 0 for that forecast: going further only stores up
            # offset that a series waking from zero would have to unlearn step by step.
            np.maximum(
                self.calib_.r_, np.where(ok[..., None], -self._pend_f[slot] / s[..., None], -np.inf), out=self.calib_.r_
            )

    def _scale(self) -> np.ndarray:
        return np.maximum(np.maximum(self._fast, 0.2 * self._slow), max(self.unit, 1e-12))

    def _points(self) -> tuple[np.ndarray, np.ndarray]:
        """Member point forecasts (J, M, h) at the current origin and their validity (J, M)."""
        v = self._view()
        m, h = self.n_series, self.horizon
        n = self.n_obs_
        ks = self._ks
        pts = np.empty((len(self.members_), m, h))
        valid = np.ones((len(self.members_), m), dtype=bool)
        ses_i = 0
        shared: dict[str, object] = {}  # what the seasonal members have in common, computed once
        for i, mem in enumerate(self.members_):
            if mem.kind == "naive":
                pts[i] = v[:, -1:]
            elif mem.kind == "mean":
                w = int(mem.arg)
                pts[i] = (v[:, -w:].sum(axis=1) / np.clip(n, 1, w))[:, None]
            elif mem.kind == "ses":
                pts[i] = self._ses[ses_i][:, None]
                ses_i += 1
            elif mem.kind == "period":
                p = int(mem.arg)
                pts[i] = v[:, -p + (ks % p)]
                valid[i] = n >= p
            else:
                pts[i], valid[i] = self._seasonal(mem.kind, v, n, shared)
        return pts, valid

    def _seasonal(self, kind: str, v: np.ndarray, n: np.ndarray,
                  shared: dict[str, object] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """One seasonal member's points; ``shared``: the same origin's parts the members have in common (the recent
        level, the days' mean), kept between the calls of one origin."""
        m = self.season
        assert m is not None
        shared = {} if shared is None else shared
        ks = self._ks
        w = max(1, m // 24)  # level-correction window: about an hour of a day
        if "recent" not in shared:
            shared["recent"] = v[:, -w:].mean(axis=1)
        recent: np.ndarray = shared["recent"]  # type: ignore[assignment]
        if kind in ("snaive", "snaive_adj"):
            base = v[:, -m + ks]
            if kind == "snaive_adj":
                base = base + (recent - v[:, -m - w : -m].mean(axis=1))[:, None]
            return base, n >= m + w
        if "days" not in shared:
            days = np.clip(n // m, 1, self.season_days)  # whole days available per series
            acc = np.zeros((self.n_series, self.horizon))
            lvl = np.zeros(self.n_series)
            for d in range(1, self.season_days + 1):
                use = (d <= days).astype(float)[:, None]
                acc += use * v[:, -d * m + ks]
                lvl += use[:, 0] * v[:, -d * m - w : -d * m].mean(axis=1)
            acc /= days[:, None]
            lvl /= days
            shared["days"] = (acc, lvl)
        acc, lvl = shared["days"]  # type: ignore[misc]
        if kind == "smean_add":
            return acc + (recent - lvl)[:, None], n >= m + w
        ratio = np.clip((recent + self.unit) / (lvl + self.unit + 1e-12), 0.25, 4.0)
        return acc * ratio[:, None], n >= m + w

    def _origin(self) -> None:
        """Compute every member's forecast from the current origin and file them by target."""
        h = self.horizon
        pts, valid = self._points()
        s = self._scale()
        eligible = valid[:, :, None] & (self.n_scored_ >= self.min_scored)  # (J, M, h)
        eligible[0] = True  # naive: always
        sel = np.argmin(np.where(eligible, self.loss_, np.inf), axis=0)  # (M, h)
        self._sel = sel
        point = np.take_along_axis(pts, sel[None], axis=0)[0]  # (M, h)
        if self._res_n < self.window or self.t_ % self.spread_every == 0 or self._cur_spread.shape[1] != h:
            spread = self._spread(self._res, self._init_spread)
            abs_spread = (self._spread(self._res_abs, 0.0) if self._res_n >= self.min_scored
                          else spread * s[:, None, None])
        else:
            spread, abs_spread = self._cur_spread, self._cur_abs_spread
        self._cur_point, self._cur_spread, self._cur_s = point, spread, s
        self._cur_abs_spread = abs_spread
        cand = np.empty((self._n_cand(), self.n_series, h, len(self.levels)))
        cand[0] = np.maximum(point[..., None] + spread * s[:, None, None], 0.0)
        # The tail of the same errors in the series' units: a relative error is the right unit for noise that grows
        # with the level, not for a jump that does not -- a series switching on from near idle (ServeGen's clients,
        # 9 -> 63 req/s) leaves relative errors of 2-4 that, applied at the busy level an hour later, forecast four
        # times that level for the window's four hours (a model held at 50 replicas where 11 served). The losses
        # decide which unit a series' tail is in; the median and below stay the relative candidate's.
        cand[-1] = np.maximum(point[..., None] + abs_spread, 0.0)
        v = self._view()
        for i, w in enumerate(CLIMATE_WINDOWS, start=1):
            cand[i] = np.quantile(v[:, -w:], self.levels, axis=1).T[:, None, :]
        if self.season and self.horizon <= self.season:
            # Seasonal climatology: the spread of the same time of day over the last days, moved by
            # how today's last hour compares with theirs (the level correction of smean+level).
            m = self.season
            assert m is not None
            days = min(self.season_days, max(1, int(self.n_obs_.max()) // m))
            same = np.stack([v[:, -d * m + self._ks] for d in range(1, days + 1)], axis=2)  # (M, h, D)
            w = max(1, m // 24)
            lvl = np.mean([v[:, -d * m - w : -d * m].mean(axis=1) for d in range(1, days + 1)], axis=0)
            shift = v[:, -w:].mean(axis=1) - lvl
            cand[1 + len(CLIMATE_WINDOWS)] = np.maximum(
                np.quantile(same, self.levels, axis=2).transpose(1, 2, 0) + shift[:, None, None], 0
            )
        ok = self.qn_ >= self.min_scored
        ok[0] = True
        f = self._combine(cand, ok, self._levels_ok)
        self._cur_f = f
        self._pend_cand[(self.t_ + self._ks) % h, :, :, self._ks] = cand.transpose(2, 0, 1, 3)
        self._pend_f[(self.t_ + self._ks) % h, :, self._ks] = f.transpose(1, 0, 2)
        slots = (self.t_ + self._ks) % h  # target t_ + k for step k+1
        self._pend_p[slots, :, :, self._ks] = pts.transpose(2, 0, 1)
        self._pend_valid[slots, :, :, self._ks] = valid[None]
        self._pend_s[slots, :, self._ks] = s[None]
        self._pend_point[slots, :, self._ks] = point.T
        self._pend_spread[slots, :, self._ks] = spread.transpose(1, 0, 2)
        self._pend_ok[slots, :, self._ks] = (self.n_obs_ > 0)[None]

    def _combine(self, cand: np.ndarray, ok: np.ndarray, levels_ok: np.ndarray | None = None) -> np.ndarray:
        """The quantile per (series, step, level) from the candidates (C, M, h, Q): a weighted mean with
        weights (best loss / candidate loss) ** blend_power over the eligible candidates (``ok`` (C, M, h); and
        ``levels_ok`` (C, Q), the levels each candidate forecasts: None, all).

        Why a blend, not the argmin: running pinball losses of candidates that are nearly as good differ
        by noise, and picking the smallest flips between them; the pinball loss of a weighted mean of
        forecasts is at most the weighted mean of their losses (it is convex in the forecast), so
        averaging near-equal candidates costs nothing and damps the flipping, while a candidate clearly
        worse than the best gets almost no weight (at power 4, twice the best loss weighs 1/16).
        blend_power = inf is the argmin. Measured (protocol, shipped batch): ServeGen m-small wQL@0.9
        0.1269 -> 0.1225, Azure 500 0.0497 -> 0.0481 (power 1 / 2 / 10: 0.1260 / 0.1234 / 0.1239 and
        0.0523 / 0.0498 / 0.0484)."""
        ql = np.where(ok[..., None] & ~np.isnan(self.qloss_), self.qloss_, np.inf)
        if levels_ok is not None:  # (C, Q): a candidate that forecasts some levels only has no say at the others
            ql = np.where(levels_ok[:, None, None, :], ql, np.inf)
        qsel = np.argmin(ql, axis=0)  # (M, h, Q)
        self._qsel = qsel
        picked = np.take_along_axis(cand, qsel[None], axis=0)[0]
        if not math.isfinite(self.blend_power):
            return picked
        best = np.take_along_axis(ql, qsel[None], axis=0)
        with np.errstate(divide="ignore", invalid="ignore"):
            wts = np.where(np.isfinite(ql), (best / ql) ** self.blend_power, 0.0)
        # A loss of 0 (an idle series every candidate forecasts exactly): equal weight on the exact ones.
        wts = np.where(best > 0, wts, (ql == best).astype(float))
        # Weight 0 means no say, even for a candidate whose forecast is not finite (0 * inf would be NaN).
        with np.errstate(invalid="ignore"):
            num = np.where(wts > 0, wts * cand, 0.0).sum(axis=0)
            tot = wts.sum(axis=0)
            out = num / tot
        # No finite loss anywhere (every candidate unscored or infinite): the argmin's pick, as before the blend.
        return np.where((tot > 0) & np.isfinite(out), out, picked)

    def _spread(self, buf: np.ndarray, init: np.ndarray | float) -> np.ndarray:
        """Empirical quantiles (M, h, Q) of the recent errors in ``buf``; ``init`` while few."""
        m, h, q = self.n_series, self.horizon, len(self.levels)
        init = np.broadcast_to(np.asarray(init, dtype=float), (q,))
        if self._res_n < self.min_scored:
            return np.broadcast_to(init, (m, h, q)).copy()
        res = buf if self._res_n == self.window else buf[:, :, : self._res_n]
        if np.isnan(res).any():
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                out = np.nanquantile(res, self.levels, axis=2)
            out = np.where(np.isnan(out), init[:, None, None], out)
        else:
            out = np.quantile(res, self.levels, axis=2)
        return out.transpose(1, 2, 0)

    # ------------------------------------------------------------------ output

    def predict_quantiles(self, h: int, quantiles: Sequence[float]) -> np.ndarray:
        """(M, len(quantiles), h): calibrated, clipped at 0, sorted across quantiles."""
        qs = np.asarray(quantiles, dtype=float)
        f = self._cur_f + self.calib_.r_ * self._cur_s[:, None, None]  # (M, H, Q)
        f = np.sort(np.maximum(f, 0.0), axis=-1).transpose(0, 2, 1)  # (M, Q, H)
        if h > self.horizon:
            f = np.concatenate([f, np.repeat(f[:, :, -1:], h - self.horizon, axis=2)], axis=2)
        out = _interp_levels(f[:, :, :h], self.levels, qs)
        cold = self.n_obs_ == 0
        if cold.any():
            out[cold] = self._prior_quantiles(qs, h)[cold]
        return out

    def _prior_quantiles(self, qs: np.ndarray, h: int) -> np.ndarray:
        prior = np.zeros(self.n_series) if self.prior is None else np.broadcast_to(self.prior, (self.n_series,))
        # Exponential spread around the prior mean: quantile q = -ln(1-q) * mean. Wide on purpose:
        # a hint is a guess, and under-provisioning a new model costs more than over-provisioning.
        mult = -np.log1p(-qs)
        return np.repeat((prior[:, None] * mult[None, :])[:, :, None], h, axis=2)

    def history(self) -> np.ndarray:
        """The newest values kept (M, T), oldest first; NaN before a series' first observation
        (gaps inside are the imputed values). Enough to warm-start a new batch with the same settings."""
        v = self._view().copy()
        before = np.arange(v.shape[1])[None, :] < (v.shape[1] - np.minimum(self.n_obs_, v.shape[1]))[:, None]
        v[before] = np.nan
        return v

    def selected(self) -> np.ndarray:
        """Index of the member in use per (series, step, level) at the current origin (inspection)."""
        return self._sel


def prior_from_similar(histories: Sequence[np.ndarray], window: int = 60) -> float:
    """A prior rate for a new model: the median over similar models of their recent mean rate."""
    means = [float(np.nanmean(h[-window:])) for h in histories if np.isfinite(h).any()]
    return float(np.median(means)) if means else 0.0


class SlotwiseForecaster:
    """Per-model slotwise forecaster, the online API (scikit-learn style; parameters as for
    :class:`SlotwiseBatch`).

    The documented way to forecast per tick: ``fit(history)`` once, then ``update(y)`` with each new
    point and ``predict_quantiles(h, quantiles)`` -> (len(quantiles), h). ``update`` is incremental: one
    step costs a fixed number of array operations over fixed-size state (the kept buffer, the error
    window, the trackers), whatever the length of the history -- O(1) in the history, not a replay.

    ``fit(y)`` is a warm start: the last ``replay`` points go through exactly the updates ``update``
    applies (members scored, trackers calibrated on the past as they would have been live), older
    points only fill the lags and levels. So ``fit(y[:t]).update(y[t:])`` is the same forecaster as
    ``fit(y)`` when ``replay`` covers the whole series, and converges to it after ``replay`` steps
    otherwise (the state it forgets -- running losses, trackers, the error window -- has memory of a
    few hundred steps).
    """

    def __init__(
        self,
        horizon: int = 30,
        levels: Sequence[float] = DEFAULT_LEVELS,
        season: int | None = None,
        step_s: float | None = None,
        unit: float = 0.0,
        loss_decay: float = 0.02,
        calib_lr: float = 0.02,
        prior_rate: float | None = None,
        replay: int = REPLAY,
    ) -> None:
        self.horizon = horizon
        self.levels = levels
        self.season = season
        self.step_s = step_s
        self.unit = unit
        self.loss_decay = loss_decay
        self.calib_lr = calib_lr
        self.prior_rate = prior_rate
        self.replay = replay
        self.batch_: SlotwiseBatch | None = None

    def _new(self) -> SlotwiseBatch:
        return SlotwiseBatch(
            1,
            horizon=self.horizon,
            levels=self.levels,
            season=self.season,
            step_s=self.step_s,
            unit=self.unit,
            loss_decay=self.loss_decay,
            calib_lr=self.calib_lr,
            replay=self.replay,
            prior=self.prior_rate,
        )

    def fit(self, y: np.ndarray) -> SlotwiseForecaster:
        """Start from history ``y`` (oldest first, NaN = missing): a warm start, see the class docstring."""
        self.batch_ = self._new()
        y = np.asarray(y, dtype=float).ravel()
        if y.size:
            self.batch_.warm_start(y[None, :])
        return self

    def update(self, y_new: np.ndarray | float) -> SlotwiseForecaster:
        """Fold in the newest point(s), oldest first: O(1) per point."""
        if self.batch_ is None:
            self.batch_ = self._new()
        y = np.asarray(y_new, dtype=float).ravel()
        if y.size:
            self.batch_.update(y[None, :])
        return self

    def predict_quantiles(self, h: int, quantiles: Sequence[float]) -> np.ndarray:
        """Quantiles of the next ``h`` steps, (len(quantiles), h): clipped at 0, sorted across quantiles."""
        if self.batch_ is None:
            self.batch_ = self._new()
        return self.batch_.predict_quantiles(max(1, int(h)), quantiles)[0]


def season_steps(step_s: float, span_s: float | None = None) -> int | None:
    """One day in steps when the step divides a day and (if given) the history spans >= 3 days."""
    per_day = 86400.0 / step_s
    if abs(per_day - round(per_day)) > 1e-6 or round(per_day) < 2:
        return None
    if span_s is not None and span_s < 3 * 86400.0:
        return None
    return int(round(per_day)) if math.isfinite(per_day) else None
