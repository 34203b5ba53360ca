"""The live Metrics port: the decision core's :class:`~autoscaler.api.snapshot.MetricsWindow` from Prometheus.

Each tick runs a handful of queries for ALL models at once (``sum by (<key labels>) (...)``, never one query per
model), concurrently, and turns them into one :class:`~autoscaler.api.snapshot.ModelMetrics` per model, on the
grid ``end - (n-1)*step, ..., end`` with ``end = floor(now / step) * step`` (aligned, so that successive
ticks read the same values for the same steps), oldest first -- the shape the simulator's
:class:`~autoscaler.sim.metrics.SimMetrics` hands the core:

- ``rate``: finished requests per step / ``step_s``, from the request counter (see "Counting" below);
- ``in_flight``: mean of ``running + waiting`` over each step (``avg_over_time`` of the gauges); a server
  without a running gauge (Triton) gets it by Little's law from its cumulative request-duration counter
  (summed request time per step / step = mean number of requests in the system);
- ``queue_depth``: the waiting gauge's last step; ``running``: the running gauge at that step (NaN without one, or
  where a KV gauge has no sample at that step: the two are read as a pair);
- ``within_rate``: requests/s that finished within the model's SLO latency, from the increments of the
  latency histogram's buckets per step, interpolated linearly at the SLO inside its bucket (the same
  assumption ``histogram_quantile`` makes); None for a server without a histogram. With an ITL SLO and an ITL
  histogram, the smaller of that and the ITL histogram's share within the ITL SLO times the requests (a request is
  in time when both are; the capacity model's joint attainment);
- ``latency_s``: the latency at the model's SLO percentile over the last step, from the same bucket
  increments, interpolated like ``histogram_quantile`` (identical numbers, see the tests). Which histogram
  is read follows the model's ``slo_metric`` (``e2e`` or ``ttft``); without a histogram (Triton's default
  exporter has none) it is the MEAN latency of the last step (duration-sum increase / request increase) --
  a mean, not a percentile, so it understates a p95; configure a histogram where the server has one;
- ``itl_s``: the inter-token latency at the model's SLO percentile over the last step, from the ITL histogram the
  same way (``MetricNames.itl_histogram``; NaN without one). vLLM and SGLang observe it per decode step of each
  request (a percentile over tokens), TGI once per request (its mean time per token: a percentile over requests);
- ``kv_cache_usage``: the engines' KV-cache use as a fraction, the mean over the model's series (replicas, engines)
  at the newest step that has one, within ``stale_after_s`` (``MetricNames.kv_cache``; NaN without one: no
  effect). The rails read it as a saturation signal (:func:`autoscaler.decision.scaledown.normalize`);
- ``stale``: no sample of the model's request counter at all (unknown model, wrong names or labels), or
  its newest sample older than ``stale_after_s``; and for every model when Prometheus cannot be asked
  (unreachable, HTTP error, PromQL error, an answer we cannot read). :meth:`PrometheusMetrics.window` never
  raises: it records ``last_error`` and counts ``errors``, and the policies hold replicas on stale data;
- ``partial`` / ``observed_fraction``: some of the model's scrape targets not answering (``up == 0``), from one
  instant query for all models (:func:`~autoscaler.live.prometheus.promql.target_health`). A target that stops
  answering loses its series from the sums, so the rate just drops while the model stays fresh -- and the
  targets whose scrapes time out are the overloaded ones. The model's targets are those that exported its
  request counter within the window, and those remembered from earlier ticks for as long as they stay in
  service discovery and down (a target down longer than the window is not forgotten). When that query fails
  (and the window's do not) every model is partial: nothing scales down on a health nobody checked
  (``health_error`` says why). A target that never answered at all has no series to tie it to its model: it is
  found by its pod instead. The controller tells which pods serve each model (:meth:`PrometheusMetrics.
  expect_pods`: the Ready replicas its informers see), and a target down now whose target labels name one of them
  (``pod_labels``: ``namespace`` and ``pod``, what Kubernetes service discovery relabels onto targets) counts as a
  target of that model not answering -- unless that pod has a target that did export the model's series (a
  sidecar's or a second port's target being down is not the model's data missing). Targets are matched by the pod
  they name, never counted against the replicas, so a router or a multi-host replica exporting for several is no
  false alarm; a pod that is not scraped at all (no target names it) is not seen. Without pod target labels (static
  targets) only a model whose key labels are target labels is matched; the rails also hold on the samples
  themselves (no request rate for the newest step, :meth:`~autoscaler.api.snapshot.ModelMetrics.partial_reason`).

Counting. ``rate`` and the histogram buckets are per-step counts: the reset-aware difference of each raw
counter series between consecutive grid points, summed per model
(:func:`~autoscaler.live.prometheus.promql.step_increments`, whose docstring says why) -- exact,
telescoping, and the same definition the forecaster's warm start reads
(:mod:`~autoscaler.live.prometheus.history`). Queries go through the one client,
:class:`~autoscaler.live.prometheus.client.PrometheusClient`; their PromQL is built in
:mod:`~autoscaler.live.prometheus.promql`.

Model keys are ``"<namespace>/<model label>"`` (``MetricNames.key_labels``): the served model name must be
the Deployment's name (vLLM ``--served-model-name``), or be relabeled so in the scrape config. Only models
in the ``models`` mapping are returned.
"""

from __future__ import annotations

import asyncio
import bisect
import dataclasses
import logging
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
import numpy as np

from autoscaler.api.snapshot import ClusterSnapshot, MetricsWindow, ModelMetrics
from autoscaler.api.spec import ModelSpec
from autoscaler.live.prometheus import promql
from autoscaler.live.prometheus.client import PrometheusAuth, PrometheusClient, PrometheusError, on_grid
from autoscaler.live.prometheus.names import MetricNames, preset_names

log = logging.getLogger(__name__)

_EMPTY = np.zeros(0)
_EMPTY.setflags(write=False)


# -- pure histogram arithmetic (the interpolation histogram_quantile does) ----------------------------------


def _monotone(counts: np.ndarray) -> np.ndarray:
    """Cumulative bucket counts made non-decreasing along the bounds (as Prometheus' ensureMonotonic: sums
    of per-series increments can dip by a count or two where a series started or reset mid-window)."""
    return np.maximum.accumulate(np.nan_to_num(counts, nan=0.0), axis=0)


def bucket_quantile(q: float, bounds: Sequence[float], counts: Sequence[float]) -> float:
    """The ``q`` quantile (0..1) of a histogram given its ``le`` bounds (ascending, the last ``+Inf``) and
    cumulative counts, interpolated linearly inside the bucket holding it, exactly as PromQL's
    ``histogram_quantile``: the first bucket starts at 0 (if its bound is positive), a quantile in the
    ``+Inf`` bucket is the largest finite bound. NaN without observations or without a ``+Inf`` bucket."""
    if len(bounds) != len(counts) or len(bounds) < 2 or not math.isinf(bounds[-1]):
        return math.nan
    if q < 0:
        return -math.inf
    if q > 1:
        return math.inf
    c = _monotone(np.asarray(counts, dtype=float)).tolist()
    total = c[-1]
    if not total > 0:
        return math.nan
    rank = q * total
    b = bisect.bisect_left(c, rank)  # the first bucket whose cumulative count reaches the rank
    if b >= len(bounds) - 1:
        return float(bounds[-2])
    if b == 0 and bounds[0] <= 0:
        return float(bounds[0])
    lo = 0.0 if b == 0 else float(bounds[b - 1])
    below = 0.0 if b == 0 else c[b - 1]
    inside = c[b] - below
    return lo + (float(bounds[b]) - lo) * ((rank - below) / inside)


def bucket_count_below(x: float, bounds: Sequence[float], counts: np.ndarray) -> np.ndarray | float:
    """How many observations were at most ``x``, interpolating linearly inside the bucket holding ``x`` (the
    counterpart of :func:`bucket_quantile`). ``counts``: cumulative counts per bound (axis 0), optionally
    with a second axis (one column per step): the answer has the shape of one row. Observations in the
    ``+Inf`` bucket never count (their latency is unknown), so beyond the largest finite bound the answer
    is that bound's count."""
    c = _monotone(np.asarray(counts, dtype=float))
    if x <= 0 or len(bounds) == 0:
        return np.zeros_like(c[0]) if c.ndim > 1 else 0.0
    finite = [float(b) for b in bounds if math.isfinite(b)]
    if not finite:
        return np.zeros_like(c[0]) if c.ndim > 1 else 0.0
    if x >= finite[-1]:
        out = c[len(finite) - 1]
        return out.copy() if c.ndim > 1 else float(out)
    b = bisect.bisect_left(finite, x)  # bounds[b] >= x > bounds[b-1]
    lo = 0.0 if b == 0 else finite[b - 1]
    below = np.zeros_like(c[0]) if b == 0 else c[b - 1]
    frac = (x - lo) / (finite[b] - lo)
    out = below + (c[b] - below) * frac
    return out if c.ndim > 1 else float(out)


# -- the window ----------------------------------------------------------------------------------------------


@dataclass
class _Series:
    """Range-query answers of one model: value arrays on the grid (NaN where Prometheus had none)."""

    requests: np.ndarray | None = None
    waiting: np.ndarray | None = None
    running: np.ndarray | None = None
    duration: np.ndarray | None = None
    kv: np.ndarray | None = None
    hist: dict[str, dict[float, np.ndarray]] = dataclasses.field(default_factory=dict)  # name -> le -> counts
    newest: float | None = None  # timestamp of the newest request-counter sample


class PrometheusMetrics:
    """The Metrics port over Prometheus' HTTP API (see the module docstring for what is computed how).

    ``step_s``: the grid; ``window_s``: how far back (``round(window_s / step_s)`` points, at least 1);
    ``stale_after_s``: a model whose newest request-counter sample is older is stale (Prometheus' lookback,
    5 min by default, caps it: older series are gone from instant queries anyway). ``timeout_s`` and
    ``session``: the :class:`~autoscaler.live.prometheus.client.PrometheusClient`'s (a session given is used
    and not closed here; without one the client's own is closed by :meth:`close`).
    """

    def __init__(
        self,
        url: str,
        names: MetricNames,
        *,
        step_s: float = 15.0,
        window_s: float = 900.0,
        stale_after_s: float = 90.0,
        timeout_s: float = 10.0,
        session: aiohttp.ClientSession | None = None,
        auth: PrometheusAuth | None = None,
        pod_labels: tuple[str, str] = ("namespace", "pod"),
    ) -> None:
        if not (math.isfinite(step_s) and step_s >= 0.001):
            raise ValueError(f"step_s must be at least 1 ms, got {step_s!r}")
        if not (math.isfinite(window_s) and window_s > 0):
            raise ValueError(f"window_s must be positive, got {window_s!r}")
        self.client = PrometheusClient(url, timeout_s=timeout_s, session=session, auth=auth)
        self.url = self.client.url
        self.names = names
        self.step_s = float(step_s)
        self.points = max(1, round(window_s / step_s))
        self.stale_after_s = float(stale_after_s)
        self.errors = 0
        self.last_error: str | None = None
        self.last_success: float | None = None  # ``now`` of the last window built from answers
        self.health_error: str | None = None  # why the last target-health query failed (every model partial)
        # model key -> its scrape targets (job, instance) last seen: kept while they stay down (module docstring)
        self._targets: dict[str, frozenset[tuple[str, str]]] = {}
        # the target labels naming a target's pod, and each model's serving pods as (namespace, pod), from the
        # controller (expect_pods): a down target naming one is that model's even if it never answered
        self.pod_labels = tuple(pod_labels)
        self._pods: dict[str, frozenset[tuple[str, str]]] = {}
        self._kv_warned: set[str] = set()  # models whose KV gauge read outside 0..1 (warned once each)

    # -- lifecycle -----------------------------------------------------------------------------------
    async def close(self) -> None:
        await self.client.close()

    async def __aenter__(self) -> PrometheusMetrics:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- PromQL (built in promql.py) -------------------------------------------------------------------
    def queries(self, metrics: Sequence[str] = ("e2e", "ttft")) -> dict[str, str]:
        """The range queries one tick runs, by name (``metrics``: the models' SLO metrics, which decide the
        latency histograms read; the ITL histogram and the KV-cache gauge are read whenever named). Their number does
        not grow with the number of models."""
        n = self.names
        keys, step, m = n.key_labels, self.step_s, n.matchers
        out = {"requests": promql.step_increments(n.requests, keys, step, m)}
        if n.waiting:
            out["waiting"] = promql.gauge_mean(n.waiting, keys, step, m)
        if n.running:
            out["running"] = promql.gauge_mean(n.running, keys, step, m)
        if n.duration_sum:
            out["duration"] = promql.step_increments(n.duration_sum, keys, step, m)
        if n.kv_cache:
            kv_m = ", ".join(x for x in (m, n.kv_cache_matchers) if x.strip())
            out["kv"] = promql.gauge_avg(n.kv_cache, keys, step, kv_m)
        hists = [self._histogram_for(which) for which in dict.fromkeys(metrics)] + [n.itl_histogram]
        for hist in dict.fromkeys(hists):
            if hist is not None:
                out[f"hist:{hist}"] = promql.step_increments(hist + "_bucket", keys, step, m, ("le",))
        return out

    def expect_pods(self, pods: Mapping[str, Iterable[str]]) -> None:
        """Which pods serve each model now (model key -> ``"<namespace>/<pod>"`` keys: its Ready replicas, from the
        cluster), for the next windows' target health: a down target naming one of them is a target of that model
        not answering, whether or not it ever answered (module docstring)."""
        self._pods = {key: frozenset(p.partition("/")[::2] for p in keys if "/" in p) for key, keys in pods.items()}

    def freshness_query(self) -> str:
        return promql.newest_sample(self.names.requests, self.names.key_labels, self.names.matchers)

    def health_query(self) -> str:
        """The one instant query of which targets serve each model and whether they answer (module docstring);
        its lookback is the window's length."""
        n = self.names
        return promql.target_health(n.requests, n.key_labels, self.points * self.step_s, n.matchers, self.pod_labels)

    def _histogram_for(self, slo_metric: str) -> str | None:
        """The histogram a model's SLO reads: TTFT's when asked and exported, else end-to-end's."""
        if slo_metric == "ttft" and self.names.ttft_histogram:
            return self.names.ttft_histogram
        return self.names.e2e_histogram

    # -- the port ----------------------------------------------------------------------------------------
    def grid(self, now: float) -> np.ndarray:
        """The grid times of a window at ``now`` (oldest first)."""
        end = math.floor(now / self.step_s + 1e-9) * self.step_s
        return end - self.step_s * np.arange(self.points - 1, -1, -1, dtype=float)

    async def window(self, now: float, models: Mapping[str, ModelSpec]) -> MetricsWindow:
        """The metrics window at ``now`` for ``models`` (model key -> spec). Never raises: on any failure
        every model is stale, ``last_error`` says why and ``errors`` counts it."""
        try:
            return await self._window(now, models)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # never out of the port: the loop must go on, holding replicas
            self.errors += 1
            self.last_error = str(exc) if isinstance(exc, PrometheusError) else f"{type(exc).__name__}: {exc}"
            log.warning("metrics window failed, every model stale: %s", self.last_error)
            stale = ModelMetrics(rate=_EMPTY, in_flight=_EMPTY, stale=True)
            return MetricsWindow(now=now, step_s=self.step_s, models=dict.fromkeys(models, stale))

    async def _window(self, now: float, models: Mapping[str, ModelSpec]) -> MetricsWindow:
        t = self.grid(now)
        start, end = float(t[0]), float(t[-1])
        wanted = [spec.slo_metric for spec in models.values()] or ["e2e"]
        queries = self.queries(wanted)
        names = list(queries)
        health, *answers = await asyncio.gather(
            self._health(now),
            self.client.query(self.freshness_query(), now),
            *(self.client.query_range(queries[k], start, end, self.step_s) for k in names),
        )
        series: dict[str, _Series] = {}

        def of(key: str) -> _Series:
            return series.setdefault(key, _Series())

        for r in answers[0]:
            try:
                of(self.names.key(r["metric"])).newest = float(r["value"][1])
            except (KeyError, IndexError, TypeError, ValueError) as exc:
                raise PrometheusError(f"unreadable freshness answer {r!r}: {exc}", url=self.url) from exc
        for name, result in zip(names, answers[1:], strict=True):
            for r in result:
                labels = r.get("metric") or {}
                values = on_grid(r.get("values") or [], start, self.step_s, len(t))
                s = of(self.names.key(labels))
                if name.startswith("hist:"):
                    try:
                        le = float(labels["le"])
                    except (KeyError, ValueError) as exc:
                        raise PrometheusError(f"a bucket series without a usable le label: {labels}",
                                              url=self.url) from exc
                    s.hist.setdefault(name.removeprefix("hist:"), {})[le] = values
                else:
                    setattr(s, name, values)
        targets = self._target_health(health, models)
        out = {key: self._model(now, spec, series.get(key), targets.get(key)) for key, spec in models.items()}
        self.last_error = None
        self.last_success = now
        return MetricsWindow(now=now, step_s=self.step_s, models=out)

    async def _health(self, now: float) -> list[dict[str, Any]] | Exception:
        """The target-health answer, or the exception that stopped it: its failure alone makes every model
        partial, not stale (the window's own answers still count)."""
        try:
            return await self.client.query(self.health_query(), now)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            return exc

    def _target_health(
        self, answer: list[dict[str, Any]] | Exception, models: Mapping[str, ModelSpec]
    ) -> dict[str, tuple[str | None, float]]:
        """Per model: (why partial or None, observed fraction), from the health answer and the targets remembered
        from earlier ticks (which this updates)."""
        if isinstance(answer, Exception):
            why = str(answer) if isinstance(answer, PrometheusError) else f"{type(answer).__name__}: {answer}"
            self.health_error = why
            log.warning("scrape-target health query failed, every model partial: %s", why)
            return dict.fromkeys(models, (f"scrape-target health unknown ({why})", math.nan))
        self.health_error = None
        seen: dict[str, dict[tuple[str, str], bool]] = {}
        seen_pods: dict[str, set[tuple[str, str]]] = {}  # model -> the pods of its targets with its series
        down: set[tuple[str, str]] = set()
        down_by_pod: dict[tuple[str, str], set[tuple[str, str]]] = {}  # (namespace, pod) -> its targets down now
        ns_label, pod_label = self.pod_labels
        for r in answer:
            try:
                labels, up = r["metric"], float(r["value"][1]) >= 1.0
            except (KeyError, IndexError, TypeError, ValueError) as exc:
                raise PrometheusError(f"unreadable target-health answer {r!r}: {exc}", url=self.url) from exc
            target = (labels.get("job", ""), labels.get("instance", ""))
            pod = (labels.get(ns_label, ""), labels.get(pod_label, ""))
            if not up:
                down.add(target)
                if all(pod):
                    down_by_pod.setdefault(pod, set()).add(target)
            key = self.names.key(labels)
            if key in models:
                seen.setdefault(key, {})[target] = up
                seen_pods.setdefault(key, set()).add(pod)
        out: dict[str, tuple[str | None, float]] = {}
        remembered = self._targets
        self._targets = {}
        for key in models:
            now_known = seen.get(key, {})
            # a target out of the window's lookback stays the model's while it is down (gone from discovery or
            # answering again without this model's series: forgotten)
            for target in remembered.get(key, ()):
                if target not in now_known and target in down:
                    now_known[target] = False
            if now_known:
                self._targets[key] = frozenset(now_known)
            # a serving pod none of whose targets exported the model's series, with a target down: that target is
            # the model's (it never answered, or not within the window). Not remembered: the pods told each tick are
            # what says whose it is (a pod no longer Ready, or gone, takes it along)
            for pod in self._pods.get(key, frozenset()) - seen_pods.get(key, set()):
                for target in down_by_pod.get(pod, ()):
                    now_known.setdefault(target, False)
            total, answering = len(now_known), sum(now_known.values())
            if answering < total:
                out[key] = (f"{total - answering} of {total} scrape targets not answering (up == 0)",
                            answering / total)
        return out

    def _model(self, now: float, spec: ModelSpec, s: _Series | None,
               health: tuple[str | None, float] | None = None) -> ModelMetrics:
        if s is None or s.newest is None:
            return ModelMetrics(rate=_EMPTY, in_flight=_EMPTY, stale=True)
        n, step = self.points, self.step_s
        nan = np.full(n, np.nan)
        # a step with no counter value but a fresh series: the series did not exist at both grid points
        rate = (s.requests if s.requests is not None else nan) / step
        waiting = s.waiting
        if self.names.running is None and s.duration is not None:
            in_flight = s.duration * self.names.duration_unit_s / step  # Little's law (includes the queue)
        else:
            parts = [a for a in (s.running, waiting) if a is not None]
            in_flight = nan.copy() if not parts else np.where(
                np.all([np.isnan(a) for a in parts], axis=0), np.nan, np.nansum(parts, axis=0)
            )
        queue_depth, running = 0.0, math.nan
        if waiting is not None and np.isfinite(waiting).any():
            last = int(np.flatnonzero(np.isfinite(waiting))[-1])
            queue_depth = float(waiting[last])
            # (the same step's: the pair says how many run while some wait; with a KV gauge, only where it has that
            # step too -- the batch learner divides the two, autoscaler/estimation/batch.py)
            if s.running is not None and (s.kv is None or np.flatnonzero(np.isfinite(s.kv))[-1:].tolist() == [last]):
                running = float(s.running[last])
        hist_name = self._histogram_for(spec.slo_metric)
        buckets = s.hist.get(hist_name) if hist_name is not None else None
        within_rate: np.ndarray | None = None
        latency = math.nan
        q = spec.slo_percentile / 100.0
        settled: np.ndarray | None = None  # the latency histogram's observations per step (its +Inf bucket)
        if hist_name is not None:
            within_rate = nan.copy()
            if buckets:
                scaled, counts, missing = self._buckets(buckets)
                within = np.asarray(bucket_count_below(spec.slo_latency_s, scaled, counts), dtype=float)
                within_rate = np.where(missing, np.nan, within / step)
                settled = counts[-1]
                if not missing[-1]:
                    latency = bucket_quantile(q, scaled, counts[:, -1].tolist())
        elif s.duration is not None and s.requests is not None:
            done = float(s.requests[-1])
            if done > 0 and math.isfinite(float(s.duration[-1])):
                latency = float(s.duration[-1]) * self.names.duration_unit_s / done  # a mean (documented)
        itl = math.nan
        itl_buckets = s.hist.get(self.names.itl_histogram) if self.names.itl_histogram else None
        if itl_buckets:
            scaled, counts, missing = self._buckets(itl_buckets)
            if not missing[-1]:
                itl = bucket_quantile(q, scaled, counts[:, -1].tolist())
            if spec.slo_itl_s is not None and within_rate is not None and settled is not None:
                # A request is in time when its TTFT and its ITL both are. The histograms are separate, so the joint
                # share is the capacity model's: the smaller of the two (a request that waited for a slot decodes in
                # a full batch, so the TTFT's misses are among the ITL's; capacity.attainment), per step.
                itl_in = np.asarray(bucket_count_below(spec.slo_itl_s, scaled, counts), dtype=float)
                with np.errstate(divide="ignore", invalid="ignore"):
                    itl_share = np.where(counts[-1] > 0, itl_in / counts[-1], 1.0)
                within_rate = np.fmin(within_rate, np.where(missing, np.nan, itl_share * settled / step))
        stale = now - s.newest > self.stale_after_s
        partial, observed = health if health is not None else (None, 1.0)
        return ModelMetrics(
            rate=rate,
            in_flight=in_flight,
            latency_s=latency,
            queue_depth=queue_depth,
            stale=bool(stale),
            within_rate=within_rate,
            partial=partial,
            observed_fraction=observed,
            kv_cache_usage=self._kv(spec, s.kv),
            itl_s=itl,
            running=running,
        )

    def _buckets(self, buckets: Mapping[float, np.ndarray]) -> tuple[list[float], np.ndarray, np.ndarray]:
        """A histogram's bounds in seconds, its per-step counts (one row per bound) and the steps without any."""
        bounds = sorted(buckets)
        counts = np.vstack([buckets[b] for b in bounds])
        return [b * self.names.histogram_unit_s for b in bounds], counts, np.isnan(counts).all(axis=0)

    def _kv(self, spec: ModelSpec, kv: np.ndarray | None) -> float:
        """The model's KV-cache use as a fraction: the newest step's mean over its replicas, or the newest step that
        has one within ``stale_after_s`` (a scrape interval longer than the step leaves steps without a sample; a
        saturation signal must not blink with them). NaN without one, and for a value no fraction can be (a percent
        gauge read as a fraction would hold every scale-down forever: warned once, ignored)."""
        if kv is None:
            return math.nan
        ok = np.flatnonzero(np.isfinite(kv))
        if ok.size == 0 or (kv.size - 1 - int(ok[-1])) * self.step_s > self.stale_after_s:
            return math.nan
        value = float(kv[ok[-1]]) * self.names.kv_cache_unit
        if not -0.01 <= value <= 1.01:
            if spec.key not in self._kv_warned:
                self._kv_warned.add(spec.key)
                log.warning("KV-cache gauge %s of %s reads %g, not a fraction 0..1: ignored (set kv_cache_unit to "
                            "0.01 for a percent gauge)", self.names.kv_cache, spec.key, value)
            return math.nan
        return min(max(value, 0.0), 1.0)


def serving_pods(snapshot: ClusterSnapshot) -> dict[str, list[str]]:
    """Each model's serving pods as the cluster shows them (its Ready replicas not draining; a group replica: its
    leader): what :meth:`PrometheusMetrics.expect_pods` is told each tick."""
    return {key: [r.replica_id for r in obs.replicas if r.ready and not r.draining]
            for key, obs in snapshot.models.items()}


__all__ = ["MetricNames", "PrometheusMetrics", "bucket_count_below", "bucket_quantile", "preset_names",
           "serving_pods"]
