"""The activation book: what the activators say they hold, and the wake-up of the tick loop (issue 18).

Each activator replica POSTs ``/v1/activations`` to every controller replica (the contract in
docs/scale-to-zero.md) on its first held request for a model and every second while it holds any::

    {"activator": "<pod name>", "models": [{"namespace": ns, "service": svc, "model": "<workload name>",
                                           "held": n, "oldest_wait_s": s}]}

:meth:`ActivationBook.report` records the counts per (activator, model) and, when a report holds requests for a
model the book is told has no active replica (none placed and not draining), or for a model new to the book, sets
:attr:`ActivationBook.wake` -- the event the leader's tick loop waits on with its tick timeout, so a scale from
zero is planned at once, not at the next tick. A model whose replica is starting (a cold start of minutes) has
nothing a tick could do sooner, so the reports that come every second from every activator meanwhile wake
nothing; and wakes are at most one per ``min_wake_interval_s`` whatever comes (a burst of reports is one tick).
A wake refused by that limit is not lost for a model still without an active replica: its activators report
again within a second. A count expires
``ttl_s`` after its activator's last report (an activator that died, or stopped holding, stops counting).
:meth:`held` sums them per model key (``"<namespace>/<workload name>"``): the controller merges that into the
metrics window as ``ModelMetrics.held_requests``.

Every replica books reports, the leader alone acts on them; a follower that becomes leader has the counts already.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

DEFAULT_TTL_S = 5.0  # a held count lives this long after its activator's last report (reports come every second)
MIN_WAKE_INTERVAL_S = 1.0  # at most one wake of the tick loop per this long (activators report every second)


class ActivationError(ValueError):
    """A report that is not the contract's JSON (the HTTP answer is 400 with this message)."""


@dataclass(frozen=True)
class Held:
    """One activator's last word about one model."""

    held: int
    oldest_wait_s: float
    at: float  # when it was reported (the book's clock)


def parse_report(body: Any) -> tuple[str, list[tuple[str, int, float]]]:
    """The contract's JSON -> (activator, [(model key, held, oldest_wait_s)]). Raises :class:`ActivationError`
    naming what is wrong."""
    if not isinstance(body, Mapping):
        raise ActivationError("expected a JSON object with 'activator' and 'models'")
    activator = body.get("activator")
    if not isinstance(activator, str) or not activator:
        raise ActivationError("'activator' must be a non-empty string (the activator's pod name)")
    models = body.get("models")
    if not isinstance(models, list):
        raise ActivationError("'models' must be a list")
    out = []
    for i, m in enumerate(models):
        if not isinstance(m, Mapping):
            raise ActivationError(f"models[{i}]: expected an object")
        ns, model = m.get("namespace"), m.get("model")
        if not isinstance(ns, str) or not ns or not isinstance(model, str) or not model:
            raise ActivationError(f"models[{i}]: 'namespace' and 'model' must be non-empty strings")
        held, wait = m.get("held"), m.get("oldest_wait_s", 0.0)
        if isinstance(held, bool) or not isinstance(held, (int, float)) or not math.isfinite(held) or held < 0:
            raise ActivationError(f"models[{i}]: 'held' must be a count >= 0, got {held!r}")
        if isinstance(wait, bool) or not isinstance(wait, (int, float)) or not math.isfinite(wait) or wait < 0:
            raise ActivationError(f"models[{i}]: 'oldest_wait_s' must be seconds >= 0, got {wait!r}")
        out.append((f"{ns}/{model}", int(held), float(wait)))
    return activator, out


class ActivationBook:
    """Held counts per (activator, model), expiring; ``wake`` set by a report that needs a scale from zero.

    ``active(model)`` says whether a model has an active replica now (placed and not draining: Ready or still
    starting; the controller answers from its last view: a model it does not know counts as without one, so a
    report never waits on a tick that could not know it)."""

    def __init__(self, ttl_s: float = DEFAULT_TTL_S, *, clock: Callable[[], float] = time.monotonic,
                 min_wake_interval_s: float = MIN_WAKE_INTERVAL_S) -> None:
        self.ttl_s = ttl_s
        self.clock = clock
        self.min_wake_interval_s = min_wake_interval_s
        self.wake = asyncio.Event()
        self.active: Callable[[str], bool] = lambda _model: False
        self._held: dict[tuple[str, str], Held] = {}
        self._woke_at: float | None = None
        self.reports = 0
        self.wakes = 0

    def report(self, body: Any) -> bool:
        """Book one report (the parsed JSON); True when it woke the loop. Raises :class:`ActivationError`."""
        activator, models = parse_report(body)
        now = self.clock()
        self.reports += 1
        # models any activator holds requests for now, before this report (the expired ones do not count)
        known = {m for (_, m), h in self._held.items() if now - h.at <= self.ttl_s}
        # the activator's report replaces its earlier one: a model it no longer lists holds nothing there
        for k in [k for k in self._held if k[0] == activator]:
            del self._held[k]
        wants = False
        for model, held, wait in models:
            if held > 0:
                self._held[(activator, model)] = Held(held, wait, now)
                if model not in known or not self.active(model):
                    wants = True
        if not wants or (self._woke_at is not None and now - self._woke_at < self.min_wake_interval_s):
            return False
        self._woke_at = now
        self.wakes += 1
        self.wake.set()
        return True

    def held(self) -> dict[str, float]:
        """Model key -> requests held for it now, summed over the activators whose report has not expired."""
        now = self.clock()
        for k in [k for k, h in self._held.items() if now - h.at > self.ttl_s]:
            del self._held[k]
        out: dict[str, float] = {}
        for (_, model), h in self._held.items():
            out[model] = out.get(model, 0.0) + h.held
        return out
