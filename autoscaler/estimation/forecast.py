"""The forecast stage of the decision core: every model's load quantiles from one batch forecaster.

The slotwise forecaster (:class:`forecasting.slotwise.SlotwiseBatch`) is cheap per series only when
many series step together (one object per model costs ~15x more), and a load forecast needs no finer
step than about a minute: the lead times it serves (cold start + tick) are 30 s to a few minutes. So
:class:`FleetForecaster` keeps the models in shards of at most ``shard_size`` series, folds in each
model's mean rate once per forecast step (``step_s``, a multiple of the tick), and between steps
answers from the quantiles it computed at the last step boundary.

Models come and go in a live cluster. A new model joins the last shard with room, and that shard
alone is rebuilt from its members' kept history (a warm start, a fraction of a second for one shard);
a new model with no history forecasts its prior -- the ``expected-rps`` annotation hint, or the
median recent load of the others -- under a wide spread until its own samples arrive.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from autoscaler.api.snapshot import MetricsWindow, ModelMetrics
from forecasting.slotwise import DEFAULT_LEVELS, REPLAY, SlotwiseBatch, season_steps


@dataclass
class _Shard:
    """Up to ``shard_size`` models forecast together. The batch's own buffer (a week of days for the
    seasonal members) is the history a rebuild starts from."""

    names: list[str]  # the models wanted in this shard
    batch: SlotwiseBatch | None = None
    built: list[str] = field(default_factory=list)  # the models the batch was built for, in row order
    quantiles: np.ndarray = field(default_factory=lambda: np.zeros((0, 0, 0)))  # (M, L, H) at the last step
    # (M, H, L): per model and horizon step, the running maximum of ``quantiles`` over the steps up to it --
    # what every model asks every tick, computed once per step (read-only: answers are views of it)
    peaks: np.ndarray = field(default_factory=lambda: np.zeros((0, 0, 0)))
    step: int | None = None  # index of the last step folded in
    boundary_s: float = 0.0  # when that step ended (the origin of ``quantiles``)


class FleetForecaster:
    """Load forecasts for a changing set of models; see the module docstring.

    Parameters
    ----------
    step_s: forecast step in seconds (each model's mean rate over a step is one observation).
    horizon_s: the longest lead time forecast; longer ones reuse the last step's quantiles.
    levels: quantile levels tracked (others are interpolated between them by the caller).
    season_s: the season (one day); None = no seasonal members.
    shard_size: models per batch: a rebuild (model added or removed) costs one shard's warm start.
    replay: steps of history replayed through the full online updates on a rebuild.
    peak: forecast each step's peak metric sample (True) or its mean (False, the default). The queue a
        burst builds depends on the rate over seconds, not over the minute; the sizing policy accounts
        for that with the arrivals' measured dispersion on top of the mean (peak=True counts Poisson noise
        twice: on the Azure LLM trace 11.0 GPU-h vs 8.3 with the mean and the dispersion, for 0.949 vs
        0.936 of the minutes met).
    """

    def __init__(
        self,
        step_s: float = 60.0,
        horizon_s: float = 300.0,
        levels: Sequence[float] = DEFAULT_LEVELS,
        season_s: float | None = 86400.0,
        shard_size: int = 64,
        replay: int = REPLAY,
        peak: bool = False,
    ) -> None:
        if not step_s > 0:
            raise ValueError("step_s must be > 0")
        self.step_s = float(step_s)
        self.horizon = max(1, math.ceil(horizon_s / step_s - 1e-9))
        self.levels = tuple(sorted(float(q) for q in levels))
        self.season = season_steps(self.step_s) if season_s else None
        self.shard_size = max(1, int(shard_size))
        self.replay = max(1, int(replay))
        self.peak = bool(peak)
        self._shards: list[_Shard] = []
        self._where: dict[str, tuple[int, int]] = {}  # model -> (shard, row)
        self._pending: dict[str, np.ndarray] = {}  # warm-start history of models not yet in a shard
        self._clock: int | None = None  # steps completed at the last observe()
        # Models whose last due step could not be folded in (their signal or their step raised, or came out
        # infinite), until one folds: the step is a missing one for the forecast, and the decision core holds them.
        self.failed: dict[str, Exception] = {}

    # ----------------------------------------------------------------- set-up

    def new_batch(self, n: int, prior: np.ndarray | float | None = None) -> SlotwiseBatch:
        """The forecaster of one shard of ``n`` models (req/s in and out), exactly as the controller runs it.

        ``slotwise backtest`` scores this batch (built by a ``FleetForecaster`` with the set's step and
        horizon and every other setting at its default), so the benchmarked forecaster is the shipped one.
        The series of a batch do not interact: one batch of many models forecasts each as its own shard would.
        """
        return SlotwiseBatch(
            n,
            horizon=self.horizon,
            levels=self.levels,
            season=self.season,
            step_s=self.step_s,
            unit=1.0 / self.step_s,  # one request per step, in req/s
            replay=self.replay,
            prior=prior,
        )

    def warm_start(self, history: Mapping[str, np.ndarray], history_step_s: float) -> None:
        """History (req/s, oldest first, ending now) for models about to be added: resampled to the
        forecast step and replayed when the model joins (see :meth:`sync`)."""
        for name, series in history.items():
            self._pending[name] = resample(np.asarray(series, dtype=float), history_step_s, self.step_s)

    def has_history(self, name: str) -> bool:
        """Whether ``name`` already has warm-start history waiting, or is forecast already."""
        return name in self._pending or name in self._where

    def sync(self, names: Sequence[str], priors: Mapping[str, float | None]) -> None:
        """Make the shards hold exactly ``names``: drop the missing, add the new (rebuilding only the
        shards that change). ``priors``: a load hint per model (req/s) for models without history."""
        wanted = set(names)
        changed: set[int] = set()
        for name, (s, _row) in list(self._where.items()):
            if name not in wanted:
                self._shards[s].names.remove(name)
                del self._where[name]
                self.failed.pop(name, None)
                changed.add(s)
        for name in names:
            if name in self._where:
                continue
            s = next((i for i, sh in enumerate(self._shards) if len(sh.names) < self.shard_size), None)
            if s is None:
                self._shards.append(_Shard([]))
                s = len(self._shards) - 1
            self._shards[s].names.append(name)
            self._where[name] = (s, -1)
            changed.add(s)
        if not changed:
            return
        fallback = self._similar_prior()
        for s in sorted(changed):
            self._rebuild(s, priors, fallback)
        self._shards = [sh for sh in self._shards if sh.names]
        self._where = {n: (i, r) for i, sh in enumerate(self._shards) for r, n in enumerate(sh.names)}

    def _similar_prior(self) -> float:
        """Median recent rate of the models that have data: the prior of a model with no hint."""
        recent = []
        for sh in self._shards:
            if sh.batch is None:
                continue
            hist = sh.batch.history()[:, -60:]
            with np.errstate(all="ignore"):
                recent.extend(float(np.nanmean(row)) for row in hist if np.isfinite(row).any())
        return float(np.median(recent)) if recent else 0.0

    def _rebuild(self, s: int, priors: Mapping[str, float | None], fallback: float) -> None:
        shard = self._shards[s]
        old = {n: i for i, n in enumerate(shard.built)}
        old_hist = shard.batch.history() if shard.batch is not None else np.zeros((0, 0))
        if not shard.names:
            shard.batch, shard.built = None, []
            return
        rows = []
        for name in shard.names:
            if name in old:
                rows.append(old_hist[old[name]])
            else:
                rows.append(self._pending.pop(name, np.zeros(0)))
        length = max((len(r) for r in rows), default=0)
        hist = np.full((len(rows), length), np.nan)
        for i, r in enumerate(rows):
            if len(r):
                hist[i, length - len(r) :] = r
        prior = np.array([p if (p := priors.get(n)) is not None else fallback for n in shard.names], dtype=float)
        batch = self.new_batch(len(rows), prior)
        if length and np.isfinite(hist).any():
            batch.warm_start(hist)
        shard.batch, shard.built = batch, list(shard.names)
        _set_quantiles(shard, batch.predict_quantiles(self.horizon, self.levels))
        shard.step = self._clock  # the history ends now: the next step folded in is the next one
        shard.boundary_s = (self._clock or 0) * self.step_s

    # ----------------------------------------------------------------- online

    def observe(self, now: float, metrics: MetricsWindow,
                signal: Callable[[list[tuple[str, ModelMetrics]]], Sequence[np.ndarray]] | None = None) -> bool:
        """Fold in the steps completed since each shard's last one (each model's mean rate over each step,
        from its metrics window; NaN where stale or missing). Returns True when a shard was updated.

        ``signal``: the series to forecast for each of the (name, metrics) it is given, aligned with their ``rate``
        samples (the decision core's offered work, :mod:`autoscaler.estimation.work`, read for the shard's models
        together); None: the request rate. Asked only for the models of a shard due this call.

        The shards due are spread over the ticks of a step (at most ``ceil(shards / ticks per step)`` per
        call, the longest-waiting first), so that no tick pays for the whole fleet: a shard's forecast is
        then up to one step's ticks late, and its samples are taken aligned to the step boundary.
        """
        k = math.floor(now / self.step_s + 1e-9)  # steps completed by now
        first = self._clock is None
        self._clock = k
        active = [sh for sh in self._shards if sh.batch is not None]
        for sh in active:
            if sh.step is None:
                sh.step, sh.boundary_s = k, k * self.step_s
        if first:
            return False
        due = sorted((sh for sh in active if sh.step is not None and sh.step < k), key=lambda sh: sh.step or 0)
        if not due:
            return False
        per = max(1, round(self.step_s / metrics.step_s))  # metric samples (~ticks) per step
        budget = max(1, math.ceil(len(active) / per))
        # samples taken after the boundary belong to the next step
        offset = max(0, round((now - k * self.step_s) / metrics.step_s))
        aggregate = step_peaks if self.peak else step_means
        for shard in due[:budget]:
            assert shard.batch is not None and shard.step is not None
            # (after a pause longer than the metrics window the older steps are NaN: the batch's clock,
            # and so the time of day of its seasonal members, stays right)
            d = k - shard.step
            y = np.full((len(shard.names), d), np.nan)
            rows: list[tuple[int, str, ModelMetrics]] = []
            for i, name in enumerate(shard.names):
                m = metrics.models.get(name)
                if m is None or m.stale or m.rate.size == 0 or m.partial is not None:  # missing, not halved
                    continue
                rows.append((i, name, m))
            for (i, name, _), rate in zip(rows, self._series(rows, signal), strict=True):
                if rate is None:
                    continue  # (its signal raised: recorded in failed, a missing step)
                try:  # one model's series cannot stop the shard's other models
                    rate = rate[: rate.size - offset] if offset else rate
                    y[i] = aggregate(rate, per, d)
                    if np.isinf(y[i]).any():
                        y[i] = np.nan
                        raise FloatingPointError("its rate is infinite")
                except Exception as e:
                    self.failed[name] = e
                    continue
                self.failed.pop(name, None)
            shard.batch.update(y)
            _set_quantiles(shard, shard.batch.predict_quantiles(self.horizon, self.levels))
            shard.step, shard.boundary_s = k, k * self.step_s
        return True

    def _series(self, rows: list[tuple[int, str, ModelMetrics]],
                signal: Callable[[list[tuple[str, ModelMetrics]]], Sequence[np.ndarray]] | None,
                ) -> list[np.ndarray | None]:
        """The series of each row: read together; should that raise, row by row, so that only the model whose
        read raises is left out (None in its place, its error in :attr:`failed`)."""
        if signal is None:
            return [m.rate for _, _, m in rows]
        try:
            return list(signal([(n, m) for _, n, m in rows]))
        except Exception:
            pass
        out: list[np.ndarray | None] = []
        for _, name, m in rows:
            try:
                (one,) = signal([(name, m)])
                out.append(one)
            except Exception as e:
                self.failed[name] = e
                out.append(None)
        return out

    def quantiles(self, name: str, now: float, lead_s: float) -> np.ndarray | None:
        """Per level, the forecast of the peak step rate (req/s) from now to ``now + lead_s``: the
        maximum of the per-step quantiles over the steps that window touches. None for unknown models."""
        found = self._window(name, now, lead_s)
        if found is None:
            return None
        shard, row, _ahead, h = found
        return shard.peaks[row, h - 1]

    def lead_quantiles(self, name: str, now: float, lead_s: float,
                       from_s: float) -> tuple[np.ndarray, np.ndarray | None] | None:
        """:meth:`quantiles` of the window to ``now + lead_s``, and the same over the steps of that window that end
        after ``now + from_s`` (the planner's ready window: what a replica asked for now, ready after its cold start
        ``from_s``, can still serve; :mod:`autoscaler.policies.horizon`), found with one look-up (every model, every
        tick). The ready window is None where no step is left out (it is then the whole window). None for unknown
        models."""
        found = self._window(name, now, lead_s)
        if found is None:
            return None
        shard, row, ahead, h = found
        whole = shard.peaks[row, h - 1]
        first = min(math.floor((ahead + max(from_s, 0.0)) / self.step_s + 1e-9) + 1, h)
        if first <= 1:
            return whole, None
        q = shard.quantiles[row]
        return whole, q[:, h - 1] if first == h else q[:, first - 1 : h].max(axis=1)

    def _window(self, name: str, now: float, lead_s: float) -> tuple[_Shard, int, float, int] | None:
        """The model's shard and row, how far ``now`` is past the shard's forecast origin, and how many forecast
        steps the window to ``now + lead_s`` touches."""
        where = self._where.get(name)
        if where is None:
            return None
        s, row = where
        shard = self._shards[s]
        q = shard.quantiles
        if q.size == 0:
            return None
        ahead = now - shard.boundary_s
        h = math.ceil((ahead + max(lead_s, 0.0)) / self.step_s - 1e-9)
        return shard, row, ahead, min(max(h, 1), q.shape[2])

    @property
    def models(self) -> list[str]:
        return [n for sh in self._shards for n in sh.names]


def _set_quantiles(shard: _Shard, quantiles: np.ndarray) -> None:
    quantiles.flags.writeable = False  # (lead_quantiles answers with views of it, as quantiles() does of peaks)
    shard.quantiles = quantiles
    peaks = np.ascontiguousarray(np.maximum.accumulate(quantiles, axis=2).transpose(0, 2, 1))
    peaks.flags.writeable = False
    shard.peaks = peaks


def _groups(rate: np.ndarray, per: int, d: int) -> tuple[np.ndarray, np.ndarray]:
    want = per * d
    tail = rate[-want:]
    if tail.size < want:
        tail = np.concatenate([np.full(want - tail.size, np.nan), tail])
    groups = tail.reshape(d, per)
    return groups, np.isfinite(groups)


def step_means(rate: np.ndarray, per: int, d: int) -> np.ndarray:
    """Means of the last ``d`` groups of ``per`` samples (oldest first); NaN for a group with no finite sample."""
    want = per * d
    if rate.size >= want:
        tail = rate[-want:]
        if np.isfinite(tail).all():
            # (every sample there: the same sums, divided by the same count, without the masks; every model, once a
            # forecast step)
            return tail.reshape(d, per).sum(axis=1) / per
    groups, ok = _groups(rate, per, d)
    n = ok.sum(axis=1)
    sums = np.where(ok, groups, 0.0).sum(axis=1)
    return np.where(n > 0, sums / np.maximum(n, 1), np.nan)


def step_peaks(rate: np.ndarray, per: int, d: int) -> np.ndarray:
    """Maxima of the last ``d`` groups of ``per`` samples (oldest first); NaN for a group with no finite sample."""
    groups, ok = _groups(rate, per, d)
    peaks = np.where(ok, groups, -np.inf).max(axis=1)
    return np.where(ok.any(axis=1), peaks, np.nan)


def resample(series: np.ndarray, from_step_s: float, to_step_s: float) -> np.ndarray:
    """A piecewise-constant rate series on a new step (mean rate per new step), ending at the same time.

    A new step that overlaps a missing (NaN) point is missing; a partial first step is dropped.
    """
    if series.size == 0:
        return series
    if math.isclose(from_step_s, to_step_s):
        return series.copy()
    span = series.size * from_step_s
    n = int(span // to_step_s + 1e-9)
    if n == 0:
        return np.zeros(0)
    missing = ~np.isfinite(series)
    edges_old = np.arange(series.size + 1) * from_step_s
    cum = np.concatenate([[0.0], np.cumsum(np.where(missing, 0.0, series) * from_step_s)])
    cum_missing = np.concatenate([[0.0], np.cumsum(missing * from_step_s)])
    # the new grid ends where the series ends
    edges_new = span - to_step_s * np.arange(n, -1, -1)
    total = np.interp(edges_new, edges_old, cum)
    gaps = np.interp(edges_new, edges_old, cum_missing)
    out = np.diff(total) / to_step_s
    out[np.diff(gaps) > 1e-9] = np.nan
    return out
