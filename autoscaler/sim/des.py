"""Request-level discrete-event queueing engine: the exact reference for the fluid engine.

Each routable replica has ``concurrency`` servers and a FIFO queue; each arriving request picks a
routable replica uniformly at random (kube-proxy's default) and takes the first free server. Because a
replica's queue is FIFO and requests never move between replicas, a request's start time is fixed the
moment it arrives: ``start = max(arrival, earliest server free time)`` with the server free times of its
replica in a heap (the Kiefer–Wolfowitz workload recursion). So no event calendar is needed, the
latency of every request is exact, and the cost is O(log c) per request.

Replica count changes take effect at tick boundaries: a new replica starts empty at ``t0``; a removed
replica (the most recently added one first, like a Deployment scale-down of its newest Pod) gets no new
requests but keeps serving its queue. With no routable replica, arrivals wait in a model-level backlog
and are dispatched in arrival order, at the start of the first tick that has a routable replica, as if
they had arrived then (their latency still counts from their real arrival). A held request gives up like a client
at ``request_timeout_s``: at its timeout it leaves the backlog (no longer held at the end of that tick, never in
flight or served later; failed, never settled; ``cold_waits`` lists it undispatched with the timeout as its wait,
hence a cold-start timeout), as in the fluid engine.

Speed (issue 15; :mod:`autoscaler.sim.queueing`): each replica has the speed of its slot, and a request dispatched to
a replica of speed ``s`` occupies its server ``occupancy / s`` and has latency part ``latency part / s``. When a
model's routable replicas change, the engine keeps the oldest replicas whose speeds are still listed and adds empty
ones for the rest (with all speeds 1, the same as keeping the oldest ``n``).

Decode-bound saturation and the ITL SLO (issue 17; :mod:`autoscaler.sim.queueing`): for a model whose batch slows its
decode, a request's batch is fixed when it starts (the other servers of its replica still busy then, plus itself), and
its decode takes ``1 + alpha (batch - 1)`` times its batch-1 time; it is within the SLO when its latency and its ITL
at that batch both meet their targets. Other models take the path of before.

Success and busy time (issue 9; :mod:`autoscaler.sim.queueing`): a settled request succeeds when it completes
(start - arrival + occupancy) within the request timeout; busy is each tick's exact busy server time (the overlap of
every request's [start, finish) with the tick, removed replicas' queues included) / dt.
"""

from __future__ import annotations

import heapq
from collections import Counter
from dataclasses import replace

import numpy as np

from autoscaler.sim.queueing import DEFAULT_REQUEST_TIMEOUT_S, ColdWaits, RoutableSpeeds, TickStats, Workload


class DesEngine:
    """Exact per-request simulation of :class:`Workload` (request logs; rate series get Poisson arrivals)."""

    def __init__(self, workload: Workload, seed: int = 0,
                 request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S) -> None:
        self.workload = workload
        self.request_timeout_s = float(request_timeout_s)
        self._m = workload.n_models
        self._rng = np.random.default_rng(seed)
        self._servers: list[list[list[float]]] = [[] for _ in range(self._m)]  # per model, per replica heap
        self._speed: list[list[float]] = [[] for _ in range(self._m)]  # per model, each replica's speed
        self._capacity = np.zeros(self._m)  # per model, the capacity last matched (to notice a change of speeds)
        self._off_speed = [False] * self._m  # per model: some replica not at speed 1
        self._waiting: list[list[int]] = [[] for _ in range(self._m)]  # request ids with no replica yet
        self._cold: list[int] = []  # cold-started request ids (issue 18), in arrival order
        self._cold_at: dict[int, float] = {}  # cold-started request id -> when it was dispatched
        self._gone_at: dict[int, float] = {}  # cold-started request id -> when it gave up (the request timeout)
        self._slo = workload.slo_s
        self._pct = workload.percentile
        # Per-request records grow as requests are generated (rate series) or are preallocated (logs).
        if workload.is_request_log:
            assert workload.t is not None and workload.model_index is not None
            assert workload.occupancy_s is not None and workload.latency_part_s is not None
            self._t = workload.t
            self._mi = workload.model_index
            self._occ = workload.occupancy_s
            self._lat = workload.latency_part_s
            n = len(self._t)
            self._tail = self._occ - self._lat  # completion - latency at the SLO: for the request timeout
        else:
            self._t = np.empty(0)
            self._mi = np.empty(0, dtype=np.int64)
            self._occ = np.empty(0)
            self._lat = np.empty(0)
            n = 0
            self._tail = np.empty(0)
        self._start = np.full(n, np.inf)
        self._latency = np.full(n, np.inf)
        self._req_speed = np.ones(n)  # the speed of the replica each request was dispatched to
        # Decode-bound models (module docstring): per model, (alpha, ITL at batch 1, ITL SLO, latency includes the
        # decode) or None; per request its ITL verdict and its own copy of the occupancy the batch stretches.
        w = workload
        bound = w.decode_bound
        self._decode: list[tuple[float, float, float, bool] | None] = [None] * self._m
        if bound.any():
            assert w.slowdown is not None and w.itl_base_s is not None and w.itl_slo_s is not None
            assert w.latency_decodes is not None
            for m in np.flatnonzero(bound):
                self._decode[m] = (float(w.slowdown[m]), float(w.itl_base_s[m]), float(w.itl_slo_s[m]),
                                   bool(w.latency_decodes[m]))
            if workload.is_request_log:
                assert w.decode_s is not None
                self._occ = self._occ.copy()  # (the workload's own arrays stay as they are)
                self._lat = self._lat.copy()
                self._dec = w.decode_s
        if not workload.is_request_log:
            self._dec = np.empty(0)
        self._itl_ok = np.ones(n, dtype=bool)
        self._itl = np.full(n, np.nan)  # per request the ITL of the batch it decoded in (NaN: not decode-bound)
        # Requests still in the system (not finished before the current tick): ids.
        self._active = np.empty(0, dtype=np.int64)
        self._next = 0  # first request id not yet arrived

    def set_request_timeout(self, timeout_s: float) -> None:
        self.request_timeout_s = float(timeout_s)

    # -- request source ---------------------------------------------------------------------------------

    def _generate(self, t0: float, t1: float) -> None:
        """Rate series: append Poisson arrivals in [t0, t1), service drawn from the K profile points."""
        w = self.workload
        lam = w.expected_arrivals(t0, t1)
        counts = self._rng.poisson(lam)
        total = int(counts.sum())
        if total == 0:
            return
        mi = np.repeat(np.arange(self._m), counts)
        t = t0 + self._rng.random(total) * (t1 - t0)
        k = self._rng.integers(0, w.occupancy_pts.shape[1], total)
        order = np.argsort(t, kind="stable")
        self._t = np.concatenate([self._t, t[order]])
        self._mi = np.concatenate([self._mi, mi[order]])
        # Occupancy and latency part share the quantile rank, so latency part <= occupancy holds.
        occ, lat = w.occupancy_pts[mi, k][order], w.latency_pts[mi, k][order]
        if w.decode_pts is not None:
            self._dec = np.concatenate([self._dec, w.decode_pts[mi, k][order]])
        self._itl_ok = np.concatenate([self._itl_ok, np.ones(total, dtype=bool)])
        self._itl = np.concatenate([self._itl, np.full(total, np.nan)])
        self._occ = np.concatenate([self._occ, occ])
        self._lat = np.concatenate([self._lat, lat])
        self._tail = np.concatenate([self._tail, occ - lat])
        self._start = np.concatenate([self._start, np.full(total, np.inf)])
        self._latency = np.concatenate([self._latency, np.full(total, np.inf)])
        self._req_speed = np.concatenate([self._req_speed, np.ones(total)])

    # -- engine interface ------------------------------------------------------------------------------

    def _match(self, m: int, target: list[float], t0: float) -> None:
        """Make model ``m``'s replicas those of speeds ``target``: keep the oldest whose speed is still wanted (the
        others keep serving their queue, outside our view), add empty ones for the rest."""
        c = int(self.workload.concurrency[m])
        need = Counter(target)
        reps: list[list[float]] = []
        speed: list[float] = []
        for heap, s in zip(self._servers[m], self._speed[m], strict=True):
            if need[s] > 0:
                need[s] -= 1
                reps.append(heap)
                speed.append(s)
        for s in target:
            if need[s] > 0:
                need[s] -= 1
                reps.append([t0] * c)  # a new replica starts empty
                speed.append(s)
        self._servers[m], self._speed[m] = reps, speed
        self._off_speed[m] = any(s != 1.0 for s in speed)

    def step(self, t0: float, dt: float, routable: np.ndarray, speeds: RoutableSpeeds | None = None) -> TickStats:
        t1 = t0 + dt
        if not self.workload.is_request_log:
            self._generate(t0, t1)
        n_new = np.asarray(routable, dtype=np.int64)
        settled: list[int] = []
        cold_settled: list[int] = []
        for m in range(self._m):
            reps = self._servers[m]
            want = int(n_new[m])
            if speeds is not None:
                cap = float(speeds.capacity[m])
                if want != len(reps) or cap != self._capacity[m]:
                    target = list(speeds.speeds_of(m))
                    assert len(target) == want, f"model {m}: {want} routable replicas but {len(target)} speeds"
                    self._match(m, target, t0)
                    self._capacity[m] = cap
            elif self._off_speed[m]:
                self._match(m, [1.0] * want, t0)
                self._capacity[m] = float(want)
            elif want != len(reps):
                c = int(self.workload.concurrency[m])
                while len(reps) < want:
                    reps.append([t0] * c)  # a new replica starts empty
                del reps[want:]  # removed replicas keep serving their queue, outside our view
                self._speed[m] = [1.0] * want
                self._capacity[m] = float(want)
            reps = self._servers[m]
            if self._waiting[m]:
                self._give_up(m, t0)
            if want and self._waiting[m]:
                for i in self._waiting[m]:
                    self._dispatch(i, m, t0)
                    settled.append(i)
                    cold_settled.append(i)
                    self._cold_at[i] = t0
                self._waiting[m].clear()

        n_cold = len(self._cold)
        i0 = self._next
        i1 = int(np.searchsorted(self._t, t1, side="left"))
        self._next = i1
        if i1 > i0:
            u = self._rng.random(i1 - i0)
            t_arr = self._t
            mis = self._mi[i0:i1].tolist()
            servers = self._servers
            for j, (i, m) in enumerate(zip(range(i0, i1), mis, strict=True)):
                reps = servers[m]
                if not reps:
                    self._waiting[m].append(i)
                    self._cold.append(i)
                    continue
                self._dispatch(i, m, float(t_arr[i]), int(u[j] * len(reps)))
                settled.append(i)
        stats = self._stats(t0, t1, i0, i1, np.asarray(settled, dtype=np.int64))
        cold = np.asarray(cold_settled, dtype=np.int64)
        lat_c, mi_c = self._latency[cold], self._mi[cold]
        ok = (lat_c <= self._slo[mi_c] + 1e-9) & self._itl_ok[cold]
        ok_to = lat_c + self._tail[cold] / self._req_speed[cold] <= self.request_timeout_s + 1e-9
        new_cold = np.asarray(self._cold[n_cold:], dtype=np.int64)
        return replace(
            stats,
            cold_arrivals=np.bincount(self._mi[new_cold], minlength=self._m).astype(np.float64),
            cold_within=np.bincount(mi_c[ok], minlength=self._m).astype(np.float64),
            cold_within_timeout=np.bincount(mi_c[ok_to], minlength=self._m).astype(np.float64),
            held=np.array([float(self._still_held(w, t1)) for w in self._waiting]),
        )

    def _give_up(self, m: int, t0: float) -> None:
        """Model ``m``'s held requests that waited past the request timeout by ``t0`` leave, like a client (module
        docstring): failed, never served, no longer held or in flight."""
        limit = t0 - self.request_timeout_s - 1e-9
        gone = [i for i in self._waiting[m] if float(self._t[i]) < limit]
        if not gone:
            return
        self._waiting[m] = [i for i in self._waiting[m] if float(self._t[i]) >= limit]
        for i in gone:
            self._gone_at[i] = float(self._t[i]) + self.request_timeout_s  # the client left at its timeout
        self._active = self._active[~np.isin(self._active, np.asarray(gone, dtype=np.int64))]

    def _still_held(self, waiting: list[int], t1: float) -> int:
        """Of a model's held requests, those that at ``t1`` have not yet waited past the request timeout."""
        limit = t1 - self.request_timeout_s - 1e-9
        return sum(1 for i in waiting if float(self._t[i]) >= limit)

    def cold_waits(self, now: float) -> ColdWaits:
        """The cold-started requests so far (:class:`autoscaler.sim.queueing.ColdWaits`), one entry per request."""
        ids = np.asarray(self._cold, dtype=np.int64)
        at = np.array([self._cold_at.get(int(i), np.nan) for i in ids], dtype=np.float64)
        gone = np.array([self._gone_at.get(int(i), np.nan) for i in ids], dtype=np.float64)
        done = np.isfinite(at)
        t = self._t[ids]
        # the wait for a replica: until dispatch (the tick boundary it met one at), until it gave up (its timeout), or
        # until now while held (at most its timeout: it gave up at the timeout even before the next tick noticed)
        dispatch = np.where(done, at, np.where(np.isfinite(gone), gone, np.minimum(now, t + self.request_timeout_s)))
        return ColdWaits(model_index=self._mi[ids], t=t, wait_s=dispatch - t, weight=np.ones(len(ids)),
                         dispatched=done)

    def _dispatch(self, i: int, m: int, now: float, rep: int | None = None) -> None:
        """Request ``i`` of model ``m`` goes to replica ``rep`` (None: a uniformly random one)."""
        reps = self._servers[m]
        if rep is None:
            rep = int(self._rng.random() * len(reps))
        heap = reps[rep]
        s = self._speed[m][rep]
        free = heapq.heappop(heap)
        start = now if now > free else free
        decode = self._decode[m]
        if decode is not None:
            self._batch(i, heap, start, s, decode)
        if s == 1.0:
            heapq.heappush(heap, start + float(self._occ[i]))
            self._latency[i] = start - float(self._t[i]) + float(self._lat[i])
        else:
            heapq.heappush(heap, start + float(self._occ[i]) / s)
            self._latency[i] = start - float(self._t[i]) + float(self._lat[i]) / s
            self._req_speed[i] = s
        self._start[i] = start

    def _batch(self, i: int, heap: list[float], start: float, s: float,
               decode: tuple[float, float, float, bool]) -> None:
        """Request ``i`` starts at ``start`` on the replica whose other servers free at ``heap``: its batch is the
        servers still busy then plus itself; the batch stretches its decode, and its ITL there is its verdict."""
        alpha, itl_1, itl_slo, latency_decodes = decode
        batch = 1 + sum(1 for f in heap if f > start)
        extra = float(self._dec[i]) * alpha * (batch - 1)
        self._occ[i] += extra
        if latency_decodes:
            self._lat[i] += extra
        else:
            self._tail[i] += extra
        itl = itl_1 * (1.0 + alpha * (batch - 1)) / s
        self._itl[i] = itl
        self._itl_ok[i] = itl <= itl_slo + 1e-12

    def _stats(self, t0: float, t1: float, i0: int, i1: int, settled: np.ndarray) -> TickStats:
        m_count = self._m
        new = np.arange(i0, i1, dtype=np.int64)
        arrivals = np.bincount(self._mi[new], minlength=m_count).astype(np.float64)
        lat_s = self._latency[settled]
        mi_s = self._mi[settled]
        ok = (lat_s <= self._slo[mi_s] + 1e-9) & self._itl_ok[settled]
        within = np.bincount(mi_s[ok], minlength=m_count).astype(np.float64)
        # completed: start - arrival + occupancy = the SLO latency + (occupancy - latency part)
        ok_to = lat_s + self._tail[settled] / self._req_speed[settled] <= self.request_timeout_s + 1e-9
        within_to = np.bincount(mi_s[ok_to], minlength=m_count).astype(np.float64)

        active = np.concatenate([self._active, new])
        a_t = self._t[active]
        a_m = self._mi[active]
        start = self._start[active]
        fin = start + self._occ[active] / self._req_speed[active]  # inf while undispatched
        end = np.minimum(fin, t1)
        overlap = end - np.maximum(a_t, t0)
        np.maximum(overlap, 0.0, out=overlap)
        in_flight = np.bincount(a_m, weights=overlap, minlength=m_count) / (t1 - t0)
        served = end - np.maximum(start, t0)  # undispatched: t1 - inf, no service in the tick
        np.maximum(served, 0.0, out=served)
        busy = np.bincount(a_m, weights=served, minlength=m_count) / (t1 - t0)
        done = fin < t1
        completed = np.bincount(a_m[done], minlength=m_count).astype(np.float64)
        waiting = start >= t1
        backlog = np.bincount(a_m[waiting], minlength=m_count).astype(np.float64)
        self._active = active[~done]

        lat_pct = np.full(m_count, np.nan)
        if len(settled):
            order = np.lexsort((lat_s, mi_s))
            ms = mi_s[order]
            ls = lat_s[order]
            bounds = np.searchsorted(ms, np.arange(m_count + 1))
            for m in np.flatnonzero(np.diff(bounds)):
                seg = ls[bounds[m] : bounds[m + 1]]
                lat_pct[m] = float(np.percentile(seg, self._pct[m]))
        itl_pct = np.full(m_count, np.nan)
        if any(d is not None for d in self._decode):
            # The engine's ITL histogram over the tick: the ITL each settled request decoded at, at the SLO percentile.
            itl_s = self._itl[settled]
            for m in np.flatnonzero([d is not None for d in self._decode]):
                seg = itl_s[(mi_s == m) & np.isfinite(itl_s)]
                if seg.size:
                    itl_pct[m] = float(np.percentile(seg, self._pct[m]))
        return TickStats(
            arrivals=arrivals,
            within_slo=within,
            completed=completed,
            backlog=backlog,
            in_flight=in_flight,
            latency_at_slo_pct=lat_pct,
            within_timeout=within_to,
            busy=busy,
            itl_at_slo_pct=itl_pct,
        )

    def latency_quantile(self, q: float | np.ndarray) -> np.ndarray:
        """Per model, exact q-quantile of latency over requests arrived so far (undispatched: infinite); ``q`` one
        level for all models or one per model. The empirical quantile (the smallest latency that at least ``q`` of
        the requests did not exceed, as "the share within >= the percentile" judges it; never interpolated, so an
        infinite latency is not mixed into a finite one)."""
        out = np.full(self._m, np.nan)
        lat = self._latency[: self._next]
        mi = self._mi[: self._next]
        levels = np.broadcast_to(np.asarray(q, dtype=np.float64), (self._m,))
        for m in range(self._m):
            sel = lat[mi == m]
            if len(sel):
                out[m] = float(np.quantile(sel, float(levels[m]), method="inverted_cdf"))
        return out

    def attainment(self) -> np.ndarray:
        """Per model, fraction of arrived requests within SLO so far (undispatched count as late)."""
        lat = self._latency[: self._next]
        mi = self._mi[: self._next]
        ok = (lat <= self._slo[mi] + 1e-9) & self._itl_ok[: self._next]
        n = np.bincount(mi, minlength=self._m)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.bincount(mi[ok], minlength=self._m) / n
