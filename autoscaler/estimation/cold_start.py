"""Online learning of the cold start: how long a scale-up takes to become Ready, the forecast's lead time.

Pure (no I/O, no clock: ``now`` comes from the snapshot) and cheap, as everything the decision core calls per model
per tick (see :mod:`autoscaler.estimation.learning`).

- :class:`ReadyTracker` — turns successive snapshots into measured cold-start durations;
- :class:`ColdStartEstimator` — a high quantile of the recent ones, shrunk toward a prior.
"""

from __future__ import annotations

import math
from collections import deque

from autoscaler.api.snapshot import ModelObservation

__all__ = ["ColdStartEstimator", "ReadyTracker"]


class ColdStartEstimator:
    """Lead time to plan scale-ups with: a high quantile of recent measured cold starts.

    Sizing must add capacity ``lead_s`` before the load arrives, so the estimate errs high: it is the
    ``quantile`` (0.95) of the last ``window`` observations, blended with the declared ``prior_s`` as
    ``prior_weight`` pseudo-observations (``(w*prior + n*q) / (w + n)``) so that one lucky fast start does
    not shrink the lead. While fewer than ``1/(1 - quantile)`` starts were seen (20 for 0.95) the sample
    has on average not yet seen one tail event, so the empirical quantile under-estimates: then the
    lead is never below the slowest of the last ``recent`` starts (a cold start that once took 3 min,
    e.g. an image pull on a fresh node, can take 3 min again).

    Always within [min, max] of the prior and the observations in the window.
    """

    __slots__ = ("_lead", "_n", "_obs", "_prior", "_prior_weight", "_q", "_recent", "_small_n")

    def __init__(
        self,
        prior_s: float,
        *,
        quantile: float = 0.95,
        window: int = 64,
        prior_weight: float = 4.0,
        recent: int = 4,
    ) -> None:
        if not (math.isfinite(prior_s) and prior_s >= 0):
            raise ValueError(f"prior_s must be finite and >= 0, got {prior_s!r}")
        if not 0.0 < quantile < 1.0:
            raise ValueError(f"quantile must be in (0, 1), got {quantile!r}")
        if window < 1 or recent < 1:
            raise ValueError("window and recent must be >= 1")
        if not (math.isfinite(prior_weight) and prior_weight >= 0):
            raise ValueError(f"prior_weight must be finite and >= 0, got {prior_weight!r}")
        self._prior = float(prior_s)
        self._q = float(quantile)
        self._prior_weight = float(prior_weight)
        self._recent = min(int(recent), int(window))
        self._small_n = 1.0 / (1.0 - quantile)
        self._obs: deque[float] = deque(maxlen=int(window))
        self._n = 0
        self._lead = self._prior

    @property
    def prior_s(self) -> float:
        return self._prior

    @property
    def count(self) -> int:
        """Valid observations seen in total (not only those still in the window)."""
        return self._n

    @property
    def observations(self) -> tuple[float, ...]:
        """The window, oldest first."""
        return tuple(self._obs)

    @property
    def lead_s(self) -> float:
        """Current estimate (cached: recomputed only by :meth:`observe`, so reading it every tick is free)."""
        return self._lead

    def observe(self, duration_s: float) -> bool:
        """Record one measured scale-up-to-Ready time; False (and ignored) when not finite or negative."""
        d = float(duration_s)
        if not (math.isfinite(d) and d >= 0.0):
            return False
        self._obs.append(d)
        self._n += 1
        self._lead = self._estimate()
        return True

    def _estimate(self) -> float:
        # Pure Python: a window of <= 64 floats sorts faster than numpy's call overhead.
        xs = sorted(self._obs)
        k = len(xs)
        pos = self._q * (k - 1)  # numpy's default ("linear") quantile
        i = int(pos)
        j = min(i + 1, k - 1)
        q = xs[i] + (xs[j] - xs[i]) * (pos - i)
        n = self._n
        w = self._prior_weight
        lead = (w * self._prior + n * q) / (w + n)
        # Rounding must not step outside the two blended values.
        lead = min(max(lead, min(self._prior, q)), max(self._prior, q))
        if n < self._small_n:
            recent_max = max(self._obs[-m] for m in range(1, min(self._recent, k) + 1))
            lead = max(lead, recent_max)
        return lead


class ReadyTracker:
    """Measures cold starts from successive snapshots of one model's replicas.

    :meth:`update` returns, for each replica first seen Ready in this snapshot after having been seen
    not Ready before, ``now - started_at``. Granularity is the caller's tick: the replica became
    Ready somewhere since the previous call, so each duration over-estimates by up to one tick (a safe
    bias for a lead time). A replica already Ready when first seen is not counted (its start is
    unknown to us: it may predate the controller), replicas that vanished are forgotten, and an id that
    comes back with a different ``started_at`` is a new replica (StatefulSets reuse names).
    A replica that went Ready and then draining between two calls still counts: it did reach Ready.
    """

    __slots__ = ("_known", "_last")

    def __init__(self) -> None:
        # replica_id -> (started_at, settled); settled = counted, or Ready when first seen.
        self._known: dict[str, tuple[float, bool]] = {}
        # The observation of the last call: the simulated cluster hands out the same (immutable) object while the
        # model's replicas do not change, and seeing it again changes nothing (no replica can turn Ready in it).
        self._last: ModelObservation | None = None

    def __len__(self) -> int:
        return len(self._known)

    def update(self, observation: ModelObservation, now: float) -> list[float]:
        """Cold-start durations (s) of the replicas that became Ready since the last call."""
        if observation is self._last:
            return []
        self._last = observation
        known = self._known
        fresh: dict[str, tuple[float, bool]] = {}
        out: list[float] = []
        for r in observation.replicas:
            rid = r.replica_id
            prev = known.get(rid)
            if prev is None or prev[0] != r.started_at:  # first sight (NaN start: never counted)
                fresh[rid] = (r.started_at, r.ready)
            elif prev[1] or not r.ready:  # already counted, or still starting
                fresh[rid] = prev
            else:
                d = now - r.started_at
                if math.isfinite(d) and d >= 0.0:
                    out.append(d)
                fresh[rid] = (r.started_at, True)
        self._known = fresh
        return out
