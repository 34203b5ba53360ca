"""Capacity model: predicted latency attainment of a model as a function of load and replicas.

First version: a queueing prior (each replica an M/G/c station with ``concurrency`` servers; load split
evenly, as kube-proxy's random routing does). The same math drives the simulator's fluid mode, so the
oracle baseline and the fluid simulator agree by construction. Issue "SLO sizing" learns it online.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from autoscaler.spec import ModelSpec


@dataclass(frozen=True)
class ServiceProfile:
    """How one replica of a model serves requests.

    ``occupancy_s``: sample of per-request service times (how long a request holds one of the replica's
    ``concurrency`` slots), as K representative quantile points. ``latency_part_s``: the matching sample of
    the part of service that counts toward the SLO latency (== occupancy for ``e2e``, prefill for ``ttft``).
    """

    occupancy_s: np.ndarray
    latency_part_s: np.ndarray
    concurrency: int
    slo_s: float
    percentile: float  # e.g. 95.0

    @property
    def mean_s(self) -> float:
        return float(np.mean(self.occupancy_s))

    @property
    def scv(self) -> float:
        """Squared coefficient of variation of the service time."""
        m = self.mean_s
        return float(np.var(self.occupancy_s) / (m * m)) if m > 0 else 0.0


def profile_from_spec(spec: ModelSpec, k: int = 32) -> ServiceProfile:
    """Prior profile from the declared spec only (exponential service around ``service_time_ms``)."""
    raise NotImplementedError


def attainment(rate: float, replicas: int, profile: ServiceProfile) -> float:
    """Steady-state fraction of requests whose latency is within the SLO."""
    raise NotImplementedError


def min_replicas_for_slo(rate: float, profile: ServiceProfile, max_replicas: int = 10_000) -> int:
    """Fewest replicas whose steady-state attainment at ``rate`` meets ``profile.percentile``."""
    raise NotImplementedError
