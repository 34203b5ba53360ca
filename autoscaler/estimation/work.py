"""The load a model is offered, as work rather than as a request count: what slotwise forecasts and sizes for.

A replica is kept busy by requests x how long each takes. On LLM traffic the two move against each other from
minute to minute: on the Azure LLM conversation trace the requests per minute range 280-507 while their mean
service time ranges 2.5-6 s the other way, and the work (server-seconds per second) stays within 22-28. A
forecast of the request rate times a slowly learned mean service time (the capacity learner's half-life is an hour
of ticks, as it must be to average out noise) charges every minute of many short requests as if each took the
average: measured there, 4.87 GPU-h where the same policy sized on the work needed 4.40 at 0 violating requests.

So, per metric sample, the offered work is read from what the replicas hold: the in-flight count inverted through
the queueing model (:meth:`autoscaler.estimation.learning.CapacityLearner.offered_work`, the same inversion that
learns the service-time scale), and expressed in requests/s of the profile sizing uses (the learned mean service
time: :func:`work_unit`), so the queueing model's Poisson arrivals are at the rate that carries the work. In that
unit a request-rate history (Prometheus' at the controller's start, a rate-series trace) is the same signal where the
service time is steady, and the forecaster's seasonal members compare like with like. (Forecast in requests/s of the
declared service time instead, a rate history read as work at the declared speed for the whole of its day: on
ServeGen, 24 h of rate history, the first day after it ran 5 % short and doubled the violating requests.)

Little's law reads the offered work only in steady state. Where it cannot, :func:`offered_rate` falls back to the
request rate (the signal before issue 28), sample by sample:

- arrivals over-dispersed at the sample scale (the policy's measured dispersion above Poisson): a burst's queue is
  transient, and in-flight then counts the queue, not the work (ungated, the Azure code model's bursts read as
  five times its work);
- a sample beyond the stable range, missing, or without a ready replica; one whose queue waits beyond the SLO's
  budget reads at least the request rate (saturated replicas show what they serve, not what is offered).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from autoscaler.api.snapshot import ModelMetrics
from autoscaler.estimation.learning import CapacityLearner


def work_unit(learner: CapacityLearner, mean_s: float) -> float:
    """Requests/s of the declared service time per request/s of a profile whose mean service is ``mean_s``
    (the profile sizing uses: the learned scale of its slot kind)."""
    return mean_s / learner.prior.mean_s


def offered_rate(m: ModelMetrics, ready: int, learner: CapacityLearner, unit: float, arrival_scv: float,
                 budget_s: float) -> np.ndarray:
    """The window's offered work per sample, in requests/s of the profile in use (aligned with ``m.rate``; NaN where
    the rate is missing): the in-flight reading over ``unit`` (:func:`work_unit` of that profile), the request rate
    where the work cannot be read (see the module docstring). ``arrival_scv``: the arrivals' measured dispersion
    (1: Poisson); ``budget_s``: the wait the SLO leaves a request (the profile's median budget).

    A sample whose queue makes requests wait longer than ``budget_s`` (Little's law: the in-flight count beyond the
    busy servers, over the rate) is not the steady state of replicas that keep up: they are saturated, and the
    in-flight count then says what they can serve, not what is offered. There the work is at least the request
    rate.
    """
    rate = m.rate
    if not _reads_work(m, ready, arrival_scv):
        return rate
    return _read(rate, m.in_flight, learner.offered_work(m.in_flight, ready), learner.prior.mean_s, unit, budget_s)


@dataclass  # (never mutated; not frozen: one per model and tick, and a frozen __init__ costs 4x)
class WorkInputs:
    """One model's arguments of :func:`offered_rate`."""

    metrics: ModelMetrics
    ready: int
    learner: CapacityLearner
    unit: float
    arrival_scv: float
    budget_s: float


def offered_rates(rows: Sequence[WorkInputs]) -> list[np.ndarray]:
    """:func:`offered_rate` of every row, the fleet's windows read together: the rows whose learners share an
    inversion table (the same concurrency, dispersion and slowdown) and whose windows have the same shape are
    stacked and inverted in one pass of numpy calls, rather than one pass per model (per model and tick the calls'
    overhead, not their ~60 samples, was the cost: ~12 us a model). Elementwise the same operations on the same
    values: each row equals its :func:`offered_rate` exactly."""
    out = [r.metrics.rate for r in rows]  # (the rows whose work cannot be read keep their request rate)
    groups: dict[tuple[int, tuple[int, ...]], list[int]] = {}
    for i, r in enumerate(rows):
        m = r.metrics
        if _reads_work(m, r.ready, r.arrival_scv):
            groups.setdefault((id(r.learner.inversion), m.rate.shape), []).append(i)
    for members in groups.values():
        if len(members) == 1:
            r = rows[members[0]]
            out[members[0]] = offered_rate(r.metrics, r.ready, r.learner, r.unit, r.arrival_scv, r.budget_s)
            continue
        sel = [rows[i] for i in members]
        rate = np.stack([r.metrics.rate for r in sel])
        in_flight = np.stack([r.metrics.in_flight for r in sel])
        ready = np.array([float(r.ready) for r in sel])[:, None]
        # (per row as CapacityLearner.offered_work scales it: the ready replicas over the prior's mean)
        scale = np.array([r.ready / r.learner.prior.mean_s for r in sel])[:, None]
        erlangs = sel[0].learner.inversion.erlangs(in_flight / ready) * scale
        mean_s = np.array([r.learner.prior.mean_s for r in sel])[:, None]
        unit = np.array([r.unit for r in sel])[:, None]
        budget = np.array([r.budget_s for r in sel])[:, None]
        work = _read(rate, in_flight, erlangs, mean_s, unit, budget)
        for k, i in enumerate(members):
            out[i] = work[k]
    return out


def _reads_work(m: ModelMetrics, ready: int, arrival_scv: float) -> bool:
    """Whether the window's in-flight counts can say its work at all (the module docstring's first cases)."""
    return not (arrival_scv > 1.0 or ready < 1 or m.in_flight.shape != m.rate.shape)


def _read(rate: np.ndarray, in_flight: np.ndarray, erlangs_rps: np.ndarray, mean_s: float | np.ndarray,
          unit: float | np.ndarray, budget_s: float | np.ndarray) -> np.ndarray:
    """The work where the replicas keep up, at least the request rate where they are saturated, the request rate
    where the work is not read (:func:`offered_rate`); ``erlangs_rps``: the inverted in-flight counts in requests/s
    of the prior's mean service."""
    with np.errstate(invalid="ignore", divide="ignore"):
        ok = np.isfinite(erlangs_rps) & (rate > 0.0)
        wait = (in_flight - erlangs_rps * mean_s) / rate
        steady = ok & (wait <= budget_s)
        work = erlangs_rps / unit
    return np.where(steady, work, np.where(ok, np.maximum(work, rate), rate))
