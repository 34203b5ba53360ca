"""Queueing engines for the simulator: the common interface, the workload, and the fluid engine.

The cluster loop (``autoscaler/sim/cluster.py``) advances time in ticks of ``dt`` seconds. Each tick it
passes, per model, how many replicas are *routable* (Ready and not draining) and gets that tick's service
statistics back. kube-proxy routes each request to a uniformly random routable replica, so each replica
is its own station: ``concurrency`` servers (continuous-batching slots) fed by a Poisson-split share of
the load. A request's SLO latency is its queueing wait plus its latency part (== occupancy for ``e2e``,
the prefill time for ``ttft``).

Two engines implement :class:`QueueEngine`:

- :class:`FluidEngine` (here): per-tick M/G/c steady state (the same formulas as
  :mod:`autoscaler.capacity`) plus a fluid backlog for overload. Vectorised over models; ~100 µs a tick
  for 50 models, which is what a 14-day, 50-model run at 10 s ticks needs.
- :class:`autoscaler.sim.des.DesEngine`: request-level discrete events, exact, slower; the reference the
  fluid engine is checked against (``bench/fidelity.py``).

Outcome accounting (both engines): a request is *settled* when its latency becomes known. With routable
replicas that is on arrival (FIFO at its replica: its start time is fixed then). A request arriving while
its model has no routable replica waits in a model-level backlog; the DES settles it when a replica
appears and it is dispatched, the fluid engine settles it late at once (it cannot see the future, and
with a cold start of a minute against a 1-2 s SLO the difference is nil). ``TickStats.within_slo`` counts
requests settled within SLO in that tick, so summed over a run it is exact.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np

from autoscaler.capacity import ServiceProfile, _bin_means, wait_params, within_prob

if TYPE_CHECKING:
    from autoscaler.spec import ModelSpec
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


class QueueEngine(Protocol):
    def step(self, t0: float, dt: float, routable: np.ndarray) -> TickStats: ...

    def latency_quantile(self, q: float) -> np.ndarray:
        """Per model, the ``q``-quantile (0 < q < 1) of latency over all requests so far."""
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

    @property
    def n_models(self) -> int:
        return len(self.models)

    @property
    def is_request_log(self) -> bool:
        return self.t is not None

    def profile(self, m: int) -> ServiceProfile:
        return ServiceProfile(
            occupancy_s=self.occupancy_pts[m],
            latency_part_s=self.latency_pts[m],
            concurrency=int(self.concurrency[m]),
            slo_s=float(self.slo_s[m]),
            percentile=float(self.percentile[m]),
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
        for m, spec in enumerate(specs):
            sel = mi == m
            tokens = log.input_tokens is not None and log.output_tokens is not None
            has_rates = spec.prefill_ms_per_1k_tokens is not None or spec.decode_ms_per_token is not None
            if tokens and has_rates:
                assert log.input_tokens is not None and log.output_tokens is not None
                pre = (spec.prefill_ms_per_1k_tokens or 0.0) * log.input_tokens[sel] / 1e6
                dec = (spec.decode_ms_per_token or 0.0) * log.output_tokens[sel] / 1e3
                occ[sel] = pre + dec
                lat[sel] = pre if spec.slo_metric == "ttft" else pre + dec
            else:
                if log.service_s is not None:
                    occ[sel] = log.service_s[sel]
                else:
                    occ[sel] = rng.exponential(spec.service_time_s, int(sel.sum()))
                lat[sel] = occ[sel]
        return cls.from_requests(
            log.models,
            log.t,
            mi,
            occ,
            lat,
            concurrency=[s.concurrency for s in specs],
            slo_s=[s.slo_latency_s for s in specs],
            percentile=[s.slo_percentile for s in specs],
        )

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
        )

    def expected_arrivals(self, t0: np.ndarray | float, t1: np.ndarray | float) -> np.ndarray:
        """Rate series only: expected arrivals per model in [t0, t1) (vectorised, piecewise-constant)."""
        assert self.rates is not None
        return _cum_at(self, t1) - _cum_at(self, t0)


def _cum_rates(w: Workload) -> np.ndarray:
    assert w.rates is not None
    return np.concatenate([np.zeros((w.n_models, 1)), np.cumsum(w.rates * w.step_s, axis=1)], axis=1)


def _cum_at(w: Workload, t: np.ndarray | float, cum: np.ndarray | None = None) -> np.ndarray:
    assert w.rates is not None
    cum = _cum_rates(w) if cum is None else cum
    n_steps = w.rates.shape[1]
    u = min(max((float(t) - w.start_s) / w.step_s, 0.0), float(n_steps))
    k = min(int(u), n_steps - 1)
    return cum[:, k] + (u - k) * w.rates[:, k] * w.step_s


# ---------------------------------------------------------------------------------------------------
# Fluid engine

# Per-replica number-in-system grid for the inverse of the stationary relation x = L(rho).
_X_GRID = np.logspace(-6, 8, 700)
_LOG_X0 = float(np.log(_X_GRID[0]))
_DLOG_X = float(np.log(_X_GRID[1]) - np.log(_X_GRID[0]))
# Utilisation grid used to tabulate L(rho): linear, then geometric towards 1.
_RHO_GRID = np.concatenate([np.linspace(0.0, 0.9, 181)[:-1], 1.0 - np.logspace(-1, -9, 400)])
# Wait grid for the whole-run latency sketch: 0 plus 64 log-spaced points, 1 ms .. 3 h.
_WAIT_GRID = np.concatenate([[0.0], np.logspace(-3, 4, 64)])


def _stationary_in_system(rho: np.ndarray, c: float, mean_s: float, scv: float) -> np.ndarray:
    """Mean number in system of one replica at utilisation ``rho``: busy servers + queue (Little on the
    wait model of :func:`autoscaler.capacity.wait_params`)."""
    rate = rho * c / mean_s
    p_wait, decay = wait_params(rate, c, mean_s, scv)
    with np.errstate(divide="ignore", invalid="ignore"):
        lq = np.where(decay > 0, rate * p_wait / np.where(decay > 0, decay, 1.0), np.inf)
    return c * rho + lq


class FluidEngine:
    """Pointwise-stationary fluid flow (PSFFA) over M/G/c replicas plus a request-level burst backlog.

    1. State per model: ``x``, the mean number of requests in system per routable replica. The
       stationary M/G/c relation ``x = L(rho)`` (busy servers + Little's queue, from the shared wait
       model in :mod:`autoscaler.capacity`) is inverted by table to give the utilisation ``rho(x)`` the
       state implies, and ``x`` moves as ``dx/dt = lam/n - (c/mean_s) * rho(x)``, integrated with a
       linearly-implicit Euler step (stiff at light load, where it relaxes within one service time).
       Arrivals see the stationary M/G/c wait at ``min(rho(x), rho_cap)``. In steady state rho(x) is
       the offered utilisation, so this reproduces :func:`autoscaler.capacity.attainment`.
       Why not the steady state at each tick's rate: a replica's queue at rho 0.9 takes minutes to
       build (relaxation ~ mean_s / (c (1-sqrt(rho))^2)), so a minute-long surge, or the Poisson noise
       of a 10 s count, would be charged its full stationary wait (-4 to -15 pp against the DES).
    2. ``mean_s`` follows the requests actually arriving (arrival-weighted, half-life
       ``service_halflife_s``, shrunk to the run mean by ``service_prior_n`` pseudo-requests): in the
       Azure conv trace the busy minutes also have shorter requests, and a fixed mean made the fluid
       engine 10 pp too pessimistic.
    3. Request logs only: bursts inside a tick (the code trace sends dozens of requests within
       milliseconds; interarrival scv ~170) are not Poisson. Each request also gets a deterministic
       delay from a request-level fluid backlog (Lindley recursion, :meth:`_burst_delay`), minus
       ``allow_k`` times the M/D/1 mean that Poisson arrivals alone would leave in it (that part is
       already in the stationary wait). Without this the code trace came out 20-30 pp too optimistic.

    Whole-run latency quantiles come from a sketch: per model, the arrival-weighted CDF of the wait on a
    fixed grid (0 plus 64 log-spaced points from 1 ms to 10^4 s, ratio 1.29 between points), updated
    every tick with the tick's stationary wait (the burst delays of part 3 are not in it). At query
    time the CDF is interpolated in log-wait and convolved with the latency-part sample.
    """

    def __init__(
        self,
        workload: Workload,
        substep_s: float = 5.0,
        service_halflife_s: float = 20.0,
        service_prior_n: float = 5.0,
        per_request_state: bool = True,
        rho_cap: float = 0.95,
        allow_k: float = 3.0,
    ) -> None:
        self._allow_k = allow_k
        self._rho_cap = rho_cap
        self._per_request = per_request_state
        w = workload
        self.workload = w
        self._m = w.n_models
        self._c = w.concurrency.astype(np.float64)
        self._mean = w.mean_s.astype(np.float64)
        self._scv = w.scv.astype(np.float64)
        self._q_frac = 1.0 - w.percentile / 100.0
        self._substep_s = substep_s
        self._svc_halflife_s = service_halflife_s
        self._svc_prior_n = service_prior_n
        self._svc_sum = np.zeros(self._m)
        self._svc_n = np.zeros(self._m)
        # rho(x) on _X_GRID, per model: the inverse of the (monotone) stationary relation.
        self._rho_tab = np.empty((self._m, len(_X_GRID)))
        for m in range(self._m):  # once, at construction
            lx = _stationary_in_system(_RHO_GRID, self._c[m], self._mean[m], self._scv[m])
            ok = np.isfinite(lx)
            self._rho_tab[m] = np.interp(_X_GRID, lx[ok], _RHO_GRID[ok], right=1.0)
        self._slope_tab = np.diff(self._rho_tab, axis=1) / np.diff(_X_GRID)[None, :]
        self._rows = np.arange(self._m)
        self._total_x = np.zeros(self._m)  # requests in system over routable replicas (or waiting for one)
        self._prev_n = np.zeros(self._m)
        self._excess = np.zeros(self._m)  # request-level fluid backlog per replica (see _burst_delay)
        self._lat_q = np.array([np.percentile(w.latency_pts[m], w.percentile[m]) for m in range(self._m)])
        if w.is_request_log:
            assert w.t is not None and w.model_index is not None and w.latency_part_s is not None
            self._t = w.t
            self._mi = w.model_index
            self._budget = w.slo_s[w.model_index] - w.latency_part_s
            assert w.occupancy_s is not None
            self._occ = w.occupancy_s
            self._cum = None
        else:
            self._cum = _cum_rates(w)
            self._budget_pts = w.slo_s[:, None] - w.latency_pts
        self._wcdf = np.zeros((self._m, len(_WAIT_GRID)))
        self._total = np.zeros(self._m)

    def _rho(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """rho(x) and d rho / dx per model, by linear interpolation in the table (log-spaced x)."""
        pos = (np.log(np.maximum(x, _X_GRID[0])) - _LOG_X0) / _DLOG_X
        i = np.minimum(pos.astype(np.int64), len(_X_GRID) - 2)
        lo = _X_GRID[i]
        slope = self._slope_tab[self._rows, i]
        rho = np.minimum(self._rho_tab[self._rows, i] + slope * (np.maximum(x, lo) - lo), 1.0)
        # Below the grid (x < 1e-6) rho is ~ x / c; the table's first segment says the same.
        return rho, slope

    def _burst_delay(
        self, mi: np.ndarray, tm: np.ndarray, n: np.ndarray, mu: np.ndarray, dt: float
    ) -> tuple[np.ndarray, np.ndarray]:
        """Per-request fluid delay from the request-level excess backlog (Lindley recursion).

        Per replica, each arrival adds 1/n request and the backlog drains at full capacity ``mu``
        between arrivals: ``E_i = max(0, E_{i-1} + 1/n - mu*(t_i - t_{i-1}))``, evaluated for all models at
        once with a segmented cumulative minimum. Returns (delay of each request, end-of-tick E per replica).
        """
        order = np.argsort(mi, kind="stable")
        ms = mi[order]
        ts = tm[order]
        gs = np.searchsorted(ms, ms, side="left")  # index of each request's group start
        prev_t = np.empty_like(ts)
        prev_t[0] = 0.0
        prev_t[1:] = ts[:-1]
        prev_t[gs == np.arange(len(ms))] = 0.0
        inc = 1.0 / n[ms] - mu[ms] * (ts - prev_t)
        cs = np.cumsum(inc)
        s_ = cs - (cs[gs] - inc[gs])
        big = 2.0 * (float(np.abs(s_).max()) + float(self._excess.max()) + 1.0)
        run_min = np.minimum.accumulate(s_ - big * ms) + big * ms
        e0 = self._excess[ms]
        w = s_ - np.minimum(-e0, run_min)
        delay = np.empty_like(w)
        delay[order] = np.maximum(w - 1.0 / n[ms], 0.0) / mu[ms]
        e_end = np.maximum(self._excess - mu * dt, 0.0)
        last = np.r_[ms[1:] != ms[:-1], True]
        e_end[ms[last]] = np.maximum(w[last] - mu[ms[last]] * (dt - ts[last]), 0.0)
        return delay, e_end

    def step(self, t0: float, dt: float, routable: np.ndarray) -> TickStats:
        w = self.workload
        n = np.asarray(routable, dtype=np.float64)
        t1 = t0 + dt
        has = n > 0
        n_safe = np.where(has, n, 1.0)
        prev = self._prev_n
        # Removed replicas leave with their share of the work (they drain it themselves); added ones
        # start empty and share the rest from now on (optimistic: random routing would leave the old
        # queues on the old replicas, but they are short whenever adding replicas helps at all).
        shrink = has & (n < prev)
        total = np.where(shrink, self._total_x * n / np.where(prev > 0, prev, 1.0), self._total_x)
        # Per replica: more replicas share the excess; fewer keep theirs (the removed ones drain theirs).
        # Coming back from zero replicas, the held requests are dispatched as a burst, as in the DES.
        self._excess = np.where(
            prev > 0, np.where(shrink, self._excess, self._excess * prev / n_safe), total / n_safe
        )
        self._excess = np.where(has, self._excess, 0.0)
        self._prev_n = n

        if self._cum is not None:
            arrivals = _cum_at(w, t1, self._cum) - _cum_at(w, t0, self._cum)
        else:
            i0, i1 = np.searchsorted(self._t, (t0, t1), side="left")
            mi = self._mi[i0:i1]
            arrivals = np.bincount(mi, minlength=self._m).astype(np.float64)
            occ_sum = np.bincount(mi, weights=self._occ[i0:i1], minlength=self._m)
        lam = arrivals / dt
        mean_s = self._mean
        if self._cum is None and self._svc_halflife_s > 0:
            a = 0.5 ** (dt / self._svc_halflife_s)
            self._svc_sum = a * self._svc_sum + occ_sum
            self._svc_n = a * self._svc_n + arrivals
            k0 = self._svc_prior_n
            mean_s = (self._svc_sum + k0 * self._mean) / (self._svc_n + k0)
        mu = self._c / mean_s

        # Integrate the per-replica state over the tick; keep the mean state for the arrivals' waits.
        x = total / n_safe
        lam_r = lam / n_safe
        steps = max(1, int(np.ceil(dt / self._substep_s - 1e-9)))
        h = dt / steps
        x_sum = 0.5 * x
        for k in range(steps):
            rho, slope = self._rho(x)
            x = np.maximum(x + h * (lam_r - mu * rho) / (1.0 + h * mu * slope), 0.0)
            x_sum += x if k < steps - 1 else 0.5 * x
        x_mean = x_sum / steps
        rho_e, _ = self._rho(x_mean)
        p_wait, decay = wait_params(rho_e * mu, self._c, mean_s, self._scv)
        new_total = np.where(has, x * n, total + arrivals)  # no replica: everybody waits
        x_mean_total = np.where(has, x_mean * n, total + 0.5 * arrivals)
        self._total_x = new_total

        # A request arriving with no routable replica is settled late (module docstring).
        p_wait = np.where(has, p_wait, 1.0)
        decay = np.where(has, decay, 0.0)
        if self._cum is not None:
            pts = within_prob(self._budget_pts, p_wait[:, None], decay[:, None])
            within = arrivals * np.mean(pts, axis=1)
        else:
            if self._per_request and i1 > i0:
                d_i, e_end = self._burst_delay(mi, self._t[i0:i1] - t0, n_safe, mu, dt)
                rho_s = np.minimum(rho_e, self._rho_cap)
                pw_s, dec_s = wait_params(rho_s * mu, self._c, mean_s, self._scv)
                pw_s = np.where(has, pw_s, 1.0)
                dec_s = np.where(has, dec_s, 0.0)
                # Under Poisson arrivals the request-level backlog is not zero (it is the M/D/1 queue of
                # a server as fast as the whole model), and that part is already in the stationary wait:
                # only its excess over the M/D/1 mean counts as burst delay.
                allow = rho_s * rho_s / (2.0 * (1.0 - rho_s)) / n_safe / mu
                d_i = np.maximum(d_i - self._allow_k * allow[mi], 0.0)
                wi = within_prob(self._budget[i0:i1] - d_i, pw_s[mi], dec_s[mi])
                self._excess = np.where(has, e_end, 0.0)
            else:
                self._excess = np.maximum(self._excess - mu * dt, 0.0)
                wi = within_prob(self._budget[i0:i1], p_wait[mi], decay[mi])
            within = np.bincount(mi, weights=wi, minlength=self._m)

        # Whole-run wait sketch (see class docstring).
        self._wcdf += arrivals[:, None] * within_prob(_WAIT_GRID[None, :], p_wait[:, None], decay[:, None])
        self._total += arrivals

        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            # Latency at the SLO percentile: the exponential tail of W + L solved in closed form (exact
            # once the quantile lies beyond every latency part), floored by the latency part's own
            # percentile. NaN-free: decay 0 (no replica / saturated) gives inf.
            # log E[exp(decay * L)] over the K points, shifted by the max (scipy's logsumexp costs ~60 µs).
            z = decay[:, None] * w.latency_pts
            z_max = z.max(axis=1)
            log_mgf = np.log(np.mean(np.exp(z - z_max[:, None]), axis=1)) + z_max
            x_tail = (np.log(p_wait) + log_mgf - np.log(self._q_frac)) / decay
            lat_pct = np.maximum(np.where(np.isnan(x_tail), np.inf, x_tail), self._lat_q)
        lat_pct = np.where(arrivals > 0, lat_pct, np.nan)
        rho_end, _ = self._rho(x)
        return TickStats(
            arrivals=arrivals,
            within_slo=within,
            completed=np.maximum(total + arrivals - new_total, 0.0),
            backlog=np.where(has, np.maximum(x - self._c * rho_end, 0.0) * n, new_total),
            in_flight=x_mean_total,
            latency_at_slo_pct=lat_pct,
        )

    def latency_quantile(self, q: float) -> np.ndarray:
        """Per model, the q-quantile of latency over the run so far, from the wait sketch (NaN: no requests).

        Requests that met no routable replica count as infinitely late.
        """
        out = np.full(self._m, np.nan)
        lat_pts = self.workload.latency_pts
        logw = np.log(_WAIT_GRID[1:])
        xs = np.concatenate([[0.0], np.logspace(-3, 4.3, 800)])
        for m in range(self._m):
            tot = self._total[m]
            if tot <= 0:
                continue
            fw = self._wcdf[m] / tot  # P(W <= grid), non-decreasing, may stop below 1 (infinite waits)
            r = xs[None, :] - lat_pts[m][:, None]  # F(x) = mean_k P(W <= x - L_k)
            with np.errstate(divide="ignore"):
                lr = np.log(np.where(r > 0, r, 1e-300))
            f_pos = np.interp(lr, logw, fw[1:], left=fw[0], right=fw[-1])
            f = np.where(r >= 0, np.where(r >= _WAIT_GRID[1], f_pos, fw[0]), 0.0).mean(axis=0)
            idx = int(np.searchsorted(f, q, side="left"))
            out[m] = xs[idx] if idx < len(xs) else np.inf
        return out
