"""The activator's metrics (prometheus_client, its own registry), as in docs/scale-to-zero.md."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

HOLD_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600)


class ActivatorMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.held = Gauge("slotwise_activator_held_requests", "Requests held while their model has no ready "
                          "backend.", ["namespace", "model"], registry=r)
        self.hold_seconds = Histogram("slotwise_activator_hold_seconds", "How long held requests were held "
                                      "(released, timed out or abandoned).", buckets=HOLD_BUCKETS, registry=r)
        self.queue_full = Counter("slotwise_activator_queue_full", "Requests refused with 503: the model's hold "
                                  "queue was full.", registry=r)
        self.timeouts = Counter("slotwise_activator_timeouts", "Held requests answered 504 at the hold timeout.",
                                registry=r)
        self.reports_refused = Counter("slotwise_activator_reports_refused", "Activation reports a controller "
                                       "answered with an error (401: no or an invalid token; 403: not the "
                                       "activator's token, or not this pod's).", registry=r)
        self.forwarded = Counter("slotwise_activator_forwarded", "Requests forwarded to a backend.",
                                 ["namespace", "model"], registry=r)
