"""All PromQL slotwise sends, built here and nowhere else: the metrics window's, the warm start's, the report's.

Request rate -- one definition, for the live window and the forecaster's warm start alike
(:func:`step_increments`). The per-step count of finished requests is computed inside Prometheus, per raw
series, as the reset-aware difference of the counter between consecutive evaluation times, and only then
summed per model::

    sum by (namespace, model_name) (C - (C offset 15s) * ((C offset 15s) <= bool C))

For a series whose value did not drop this is ``C(t) - C(t - step)``; where it dropped (the process
restarted) it is ``C(t)``, the count since the restart -- what Prometheus' own ``increase`` does on a reset.
The rate of a step is that count / ``step_s``. Why this and not ``rate(C[1m])`` or ``increase(C[step])``:
those extrapolate from the samples inside each window to the window's edges, so per-step counts are
estimates, and a window holding fewer than two samples (step <= scrape interval) has no value at all.
Differences of the counter at the grid points telescope: the counts over a range add up EXACTLY to the
counter's growth, whatever the scrape interval (a step without a fresh scrape reads 0, the next one the
catch-up), and a coarse step's count is exactly the sum of the fine steps' inside it -- the warm start's
60 s steps and the live window's 15 s steps read the same load. Why not the raw series, to difference
locally: that ships every (pod, label, bucket) series of every model; the difference per series has to
happen before the sum (a sum of counters across pods is not reset-safe), and PromQL does exactly that
server-side, returning one series per model. What is lost: the requests a series had counted before its
first sample inside the range (a new pod's first scrape interval, as with ``increase``); on a restart those
between the step's start and the crash (so there a coarse step counts less than the fine steps inside it);
and across a gap in the samples the steps read 0 while Prometheus' lookback (5 min) still returns the last
sample, then NaN (no value), and a gap longer than the lookback loses its growth (a shorter one is caught up
by the step after it). Histogram buckets are counted the same way (``sum by (..., le)``).

Selectors are written ``{__name__="..."}`` so any metric name works (colons and all), with the configured
extra matchers (e.g. ``job="vllm"``) on every one. Durations are whole milliseconds (``15000ms``), so
sub-second and fractional steps work.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


def duration(seconds: float) -> str:
    """A PromQL duration: whole milliseconds (``1500ms``), at least 1 ms."""
    return f"{max(1, round(seconds * 1000))}ms"


def selector(metric: str, matchers: str = "") -> str:
    """``{__name__="metric", <matchers>}``, the name escaped."""
    extra = f", {matchers}" if matchers.strip() else ""
    return '{__name__="' + metric.replace("\\", "\\\\").replace('"', '\\"') + '"' + extra + "}"


def step_increments(
    counter: str, key_labels: Sequence[str], step_s: float, matchers: str = "", extra_by: Sequence[str] = ()
) -> str:
    """The reset-aware per-series difference of ``counter`` between evaluation times ``step_s`` apart, summed
    per model (``key_labels``, plus ``extra_by`` such as ``le``): the count of each step (module docstring).
    Evaluated as a range query with the same ``step_s``."""
    c = selector(counter, matchers)
    prev = f"({c} offset {duration(step_s)})"
    by = ", ".join((*key_labels, *extra_by))
    return f"sum by ({by}) ({c} - {prev} * ({prev} <= bool {c}))"


def gauge_mean(gauge: str, key_labels: Sequence[str], step_s: float, matchers: str = "") -> str:
    """The mean of ``gauge`` over each step, summed per model (``in_flight``)."""
    by = ", ".join(key_labels)
    return f"sum by ({by}) (avg_over_time({selector(gauge, matchers)}[{duration(step_s)}]))"


def gauge_avg(gauge: str, key_labels: Sequence[str], step_s: float, matchers: str = "") -> str:
    """The mean of ``gauge`` over each step, AVERAGED per model: a per-replica ratio (KV-cache use) whose sum over
    replicas means nothing. Every series counts once (a vLLM pod with several engines: each engine)."""
    by = ", ".join(key_labels)
    return f"avg by ({by}) (avg_over_time({selector(gauge, matchers)}[{duration(step_s)}]))"


def newest_sample(counter: str, key_labels: Sequence[str], matchers: str = "") -> str:
    """The timestamp of each model's newest ``counter`` sample (staleness), as an instant query."""
    by = ", ".join(key_labels)
    return f"max by ({by}) (timestamp({selector(counter, matchers)}))"


def target_health(counter: str, key_labels: Sequence[str], lookback_s: float, matchers: str = "",
                  pod_labels: Sequence[str] = ()) -> str:
    """Which scrape targets serve each model and whether Prometheus scrapes them now, as ONE instant query for all
    models: a row per (model, target) -- ``key_labels`` plus ``job`` and ``instance`` -- whose ``counter`` had a
    sample within ``lookback_s``, valued with the target's ``up`` (1 scraped, 0 not answering), and a row per target
    down now (``up == 0``) that no such row covers, keyed by its target labels (so a model whose key labels are
    target labels is matched even when it never answered, and a target remembered from earlier ticks can be told
    down from gone).

    Why ``up`` and not the request series alone: a target that stops answering gets staleness markers, so its
    series vanish from the sums and the model's rate just drops -- a failed scrape reads exactly like less load.
    ``up`` is the one series Prometheus writes for every target, answering or not. Targets are joined on
    ``job, instance`` (every scraped series carries them); ``up`` is taken ``max by (job, instance)`` so that
    duplicate ``up`` series (several Prometheus replicas behind one query endpoint) cannot make the join
    many-to-many; the model ``matchers`` are not put on ``up`` (they may name labels only the model's series
    have). A target that left service discovery has no ``up`` and drops out: it is neither observed nor missing.

    ``pod_labels`` (namespace and pod, as Kubernetes service discovery relabels them onto targets) are kept on
    every row too: a target down now that never answered is matched to the Ready pod it names (the caller knows
    each model's pods), and a pod with a row for the model is one that did answer.
    """
    seen = f"count_over_time({selector(counter, matchers)}[{duration(lookback_s)}])"
    by = ", ".join(dict.fromkeys((*key_labels, *pod_labels, "job", "instance")))
    up = "max by (job, instance) (up)"
    return (f"(group by ({by}) ({seen}) * on (job, instance) group_left () {up})"
            f" or on (job, instance) (max by ({by}) (up) == 0)")


# -- slotwise report --prometheus: what the controller exported ----------------------------------------------

# Gauges are read from the LEADER only: a standby replica keeps the last values it had as leader.
LEADER = "and on(instance, job) (slotwise_is_leader == 1)"
SUBQUERY_STEP = "60s"  # resolution of the gauge averages


@dataclass(frozen=True)
class ReportQuery:
    """An instant query of the report: ``promql``, the labels that key its answer, and ``fallback``: asked
    when ``promql`` answers nothing (a gauge read from the leader, where no ``slotwise_is_leader`` series
    exist: then every replica counts)."""

    promql: str
    labels: tuple[str, ...]
    fallback: str | None = None


def _leader_gauge(template: str, gauge: str, labels: tuple[str, ...]) -> ReportQuery:
    return ReportQuery(template.format(sel=f"({gauge} {LEADER})"), labels, template.format(sel=gauge))


def report_queries(hours: float) -> dict[str, ReportQuery]:
    """The instant queries ``slotwise report --prometheus`` runs at the range's end, by name (see
    :mod:`~autoscaler.live.prometheus.report`). Counters are summed over replicas: only the leader ticks,
    so a standby's counters stay flat and add nothing."""
    r = f"{max(1, round(hours * 3600))}s"
    return {
        "slot_seconds": ReportQuery(
            f"sum by (team, namespace, model, gpu_model) (increase(slotwise_gpu_slot_seconds_total[{r}]))",
            ("team", "namespace", "model", "gpu_model"),
        ),
        "dollars": ReportQuery(
            f"sum by (team, namespace, model) (increase(slotwise_gpu_cost_dollars_total[{r}]))",
            ("team", "namespace", "model"),
        ),
        "idle_seconds": ReportQuery(
            f"sum by (gpu_model) (increase(slotwise_gpu_idle_seconds_total[{r}]))", ("gpu_model",)
        ),
        "prices": ReportQuery(
            f"max by (gpu_model) (last_over_time(slotwise_gpu_price_dollars_per_hour[{r}]))", ("gpu_model",)
        ),
        "requests": ReportQuery(f"sum by (model) (increase(slotwise_requests_total[{r}]))", ("model",)),
        "late": ReportQuery(f"sum by (model) (increase(slotwise_requests_late_total[{r}]))", ("model",)),
        "objective": ReportQuery(
            f"max by (model) (last_over_time(slotwise_slo_objective_ratio[{r}]))", ("model",)
        ),
        "fragmentation": _leader_gauge(
            f"avg_over_time(max({{sel}})[{r}:{SUBQUERY_STEP}])", "slotwise_fragmentation_ratio", ()
        ),
        "lent_gpus": _leader_gauge(
            f"avg_over_time((max by (gpu_model) ({{sel}}))[{r}:{SUBQUERY_STEP}])",
            'slotwise_gpu_slots{state="lent"}', ("gpu_model",),
        ),
    }
