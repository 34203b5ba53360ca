"""The load a model is offered, as work rather than as a request count: what slotwise forecasts and sizes for.

A replica is kept busy by requests x how long each takes. On LLM traffic the two move against each other from
minute to minute: on the Azure LLM conversation trace the requests per minute range 280-507 while their mean
service time ranges 2.5-6 s the other way, and the work (server-seconds per second) stays within 22-28. A
forecast of the request rate times a slowly learned mean service time (the capacity learner's half-life is an hour
of ticks, as it must be to average out noise) charges every minute of many short requests as if each took the
average: measured there, 4.87 GPU-h where the same policy sized on the work needed 4.40 at 0 violating requests.

So, per metric sample, the offered work is read from what the replicas hold: the in-flight count inverted through
the queueing model (:meth:`autoscaler.estimation.learning.CapacityLearner.offered_work`, the same inversion that
learns the service-time scale), in requests/s of the model's *declared* (prior) service time -- a unit that does
not move when the learned scale does, so the forecaster's history stays comparable over days. The forecast is read
back in requests/s of the profile sizing uses (:func:`work_unit`: divide by it), so the queueing model's Poisson
arrivals are at the rate that carries the work at the learned mean service time.

Little's law reads the offered work only in steady state. Where it cannot (:func:`offered_rate` falls back to the
request rate x the learned scale, i.e. today's signal, sample by sample):

- arrivals over-dispersed at the sample scale (the policy's measured dispersion above Poisson): a burst's queue is
  transient, and in-flight then counts the queue, not the work (ungated, the Azure code model's bursts read as
  five times its work);
- a sample beyond the stable range (a growing queue), missing, or without a ready replica.
"""

from __future__ import annotations

import numpy as np

from autoscaler.api.snapshot import ModelMetrics
from autoscaler.estimation.learning import CapacityLearner


def work_unit(learner: CapacityLearner, mean_s: float) -> float:
    """Requests/s of the declared service time per request/s of a profile whose mean service is ``mean_s``
    (the profile sizing uses: the learned scale of its slot kind)."""
    return mean_s / learner.prior.mean_s


def offered_rate(m: ModelMetrics, ready: int, learner: CapacityLearner, unit: float, arrival_scv: float) -> np.ndarray:
    """The window's offered work per sample, in requests/s of the declared service time (aligned with
    ``m.rate``; NaN where the rate is missing). ``unit``: :func:`work_unit` of the profile in use, what the request
    rate is multiplied by where the work cannot be read (see the module docstring); ``arrival_scv``: the arrivals'
    measured dispersion (1: Poisson)."""
    fallback = m.rate * unit
    if arrival_scv > 1.0 or ready < 1 or m.in_flight.shape != m.rate.shape:
        return fallback
    work = learner.offered_work(m.in_flight, ready)
    with np.errstate(invalid="ignore"):
        ok = np.isfinite(work) & (m.rate > 0.0)
    return np.where(ok, work, fallback)
