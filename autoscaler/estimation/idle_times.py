"""Idle times learned online, per model: what the keep-alive policies (autoscaler/policies/keepalive.py) decide on.

An *idle time* is the gap from the end of one request activity (the last step with arrivals, requests in flight or
held) to the next arrival, as Shahrad et al. define it for the hybrid histogram policy ("Serverless in the Wild",
USENIX ATC'20, section 4.2). They are kept in one-minute bins up to a range (the model's ``keep_alive_s``, at least
a few minutes), plus one count for the idle times beyond it, exponentially decayed so that recent behaviour weighs
more (a half-life of a day by default). Beside the histogram: the mean number of requests that arrive in the first
``head_s`` seconds of an activity period (the *head*: how many requests one cold start would hold), and where the
current idle period began (its age).

Samples come from the metrics window, one per step; windows overlap between ticks, so each step is consumed once
(by its end time). A step counts as busy when requests arrived in it or were in flight at its end; a NaN rate is
unknown and consumed as idle-neutral (it neither starts nor ends activity). Requests *held* at a step's end (the
activator's report live, the simulator's held queue) are arrivals too: they open the activity at that step (live,
the pods' rate shows them only once forwarded, a cold start later, which would make the idle time one cold start
too long), and the head is at least the most requests held at once in it (forwarded after the head's window
closes, the rate alone would miss them; the larger of the two, so forwarded ones are not counted twice).
Everything the policies need from the histogram changes only when a new idle time arrives: ``version`` counts
them, and the policies cache by it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

BIN_S = 60.0  # the histogram's bin width: one minute, as in the paper
MIN_RANGE_S = 240.0  # the range is at least a few minutes whatever keep_alive_s is
DEFAULT_HALF_LIFE_S = 86_400.0


@dataclass
class IdleTimes:
    """One model's decayed idle-time histogram (``counts[k]``: idle times in ``[k, k+1)`` bins; ``overflow``: beyond
    the range), its head and its current idle period."""

    range_s: float = 600.0
    half_life_s: float = DEFAULT_HALF_LIFE_S
    head_s: float = 60.0  # the head is counted over this long after an activity starts (the caller's lead time)
    counts: np.ndarray = field(default_factory=lambda: np.zeros(0))
    overflow: float = 0.0
    n_idle: int = 0  # idle times seen (undecayed)
    head_sum: float = 0.0  # decayed sum of heads, and their decayed weight
    head_weight: float = 0.0
    version: int = 0  # incremented on every new idle time or head
    last_t: float = -math.inf  # end time of the last consumed step
    decayed_at: float = -math.inf
    active: bool = False
    idle_since: float | None = None  # when the current (or last) idle period began; None: never seen active
    first_t: float | None = None  # end time of the first consumed step
    _activity_start: float = 0.0
    _head_acc: float = 0.0
    _head_open: bool = False
    _head_held: float = 0.0  # the most requests held at once in the open head
    pool: IdleTimes | None = None  # the fleet's pooled idle times, fed alongside (ControllerState.idle_prior)

    def __post_init__(self) -> None:
        self.range_s = max(self.range_s, MIN_RANGE_S)
        if self.counts.size == 0:
            self.counts = np.zeros(math.ceil(self.range_s / BIN_S - 1e-9))

    @property
    def bins(self) -> int:
        return int(self.counts.size)

    @property
    def total(self) -> float:
        return float(self.counts.sum()) + self.overflow

    @property
    def head(self) -> float | None:
        """Mean requests in the first ``head_s`` of an activity period (None before the first)."""
        return self.head_sum / self.head_weight if self.head_weight > 0 else None

    def age(self, now: float) -> float:
        """How long the model has been idle at ``now`` (0 while active; since the first sample if never active)."""
        if self.active:
            return 0.0
        since = self.idle_since if self.idle_since is not None else self.first_t
        return 0.0 if since is None else max(0.0, now - since)

    def _decay(self, t: float) -> None:
        if self.decayed_at > -math.inf and t > self.decayed_at:
            f = 0.5 ** ((t - self.decayed_at) / self.half_life_s)
            self.counts *= f
            self.overflow *= f
            self.head_sum *= f
            self.head_weight *= f
        self.decayed_at = max(self.decayed_at, t)

    def add_idle(self, idle_s: float, t: float) -> None:
        """Record one idle time ending at ``t`` (also into the fleet pool)."""
        self._decay(t)
        k = int(idle_s // BIN_S)
        if k < self.bins:
            self.counts[k] += 1.0
        else:
            self.overflow += 1.0
        self.n_idle += 1
        self.version += 1
        if self.pool is not None:
            self.pool.add_idle(idle_s, t)

    def _add_head(self, n: float, t: float) -> None:
        self._decay(t)
        self.head_sum += n
        self.head_weight += 1.0
        self.version += 1
        if self.pool is not None:
            self.pool._add_head(n, t)

    def step(self, t_end: float, step_s: float, arrivals: float, busy_after: bool, held: float = 0.0) -> None:
        """Consume one step ending at ``t_end``: ``arrivals`` requests arrived in it (NaN: unknown), requests were
        in flight or held at its end (``busy_after``), ``held`` of them held (module docstring: arrivals too)."""
        if t_end <= self.last_t + 1e-9:
            return
        self.last_t = t_end
        if self.first_t is None:
            self.first_t = t_end
        start = t_end - step_s
        if not math.isfinite(arrivals):
            if held > 0:
                arrivals = 0.0  # (the held requests are known arrivals)
            else:
                return
        arrived = arrivals > 1e-9 or held > 0
        if arrived and not self.active:
            self._open(start, t_end)
        if self._head_open:
            if start < self._activity_start + self.head_s:
                self._head_acc += arrivals
                self._head_held = max(self._head_held, held)
            if t_end >= self._activity_start + self.head_s:
                self._close_head(t_end)
        if self.active and not (arrived or busy_after):
            self.active, self.idle_since = False, start  # (the end of the last busy step)
            if self._head_open:
                self._close_head(t_end)

    def _open(self, start: float, t: float) -> None:
        """An activity starts at ``start`` (seen at ``t``): the idle time before it, and its head opens."""
        if self.idle_since is not None:
            self.add_idle(max(0.0, start - self.idle_since), t)
        self.active, self._activity_start, self._head_acc, self._head_open = True, start, 0.0, True
        self._head_held = 0.0

    def _close_head(self, t: float) -> None:
        self._head_open = False
        self._add_head(max(self._head_acc, self._head_held), t)

    def hold(self, held: float, now: float) -> None:
        """Requests held at ``now`` with no fresh step to fold them into (a model at zero has nothing to scrape):
        they open the activity (at ``now``) and count toward its head."""
        if held <= 0:
            return
        if self.first_t is None:
            self.first_t = now
        if not self.active:
            self._open(now, now)
            self.last_t = max(self.last_t, now)  # (steps before the opening are not consumed after it)
        if self._head_open:
            self._head_held = max(self._head_held, held)

    def observe(self, rate: np.ndarray, in_flight: np.ndarray, held: float, step_s: float, now: float) -> None:
        """Fold in a metrics window's samples (oldest first, the last ending at ``now``); steps already consumed
        are skipped, so overlapping windows count each step once."""
        n = rate.size
        if n == 0 or step_s <= 0:
            self.hold(held, now)
            return
        fresh = int(min(n, max(0, math.floor((now - self.last_t) / step_s + 1e-6)))) if self.last_t > -math.inf else n
        if fresh == 0:
            self.hold(held, now)  # (the newest step already consumed: its held requests still open the activity)
            return
        rates = rate[n - fresh:].tolist()
        flights = in_flight[-fresh:].tolist() if in_flight.size >= fresh else [0.0] * fresh
        for i, (r, f) in enumerate(zip(rates, flights, strict=True)):
            t = now - (fresh - 1 - i) * step_s
            busy = (f > 1e-9) if math.isfinite(f) else False
            h = held if i == fresh - 1 else 0.0  # (held: at the newest step)
            self.step(t, step_s, r * step_s, busy or h > 0, h)

    @classmethod
    def from_rates(cls, rate: np.ndarray, step_s: float, end: float, *, keep_alive_s: float = 600.0,
                   head_s: float = 60.0, half_life_s: float = DEFAULT_HALF_LIFE_S) -> IdleTimes:
        """A warm start from a history of per-step request rates (oldest first, the last step ending at ``end``):
        the same learner fed the history as if observed (no in-flight samples: a step is busy when requests
        arrived in it). Pure."""
        it = cls(range_s=keep_alive_s, half_life_s=half_life_s, head_s=head_s)
        rate = np.asarray(rate, dtype=float)
        it.observe(rate, np.zeros(rate.size), 0.0, step_s, end)
        return it

    def rebin(self, range_s: float) -> None:
        """Change the range (a changed keep-alive-seconds): bins beyond the new range become overflow."""
        n = math.ceil(max(range_s, MIN_RANGE_S) / BIN_S - 1e-9)
        if n == self.bins:
            return
        old = self.counts
        self.range_s = max(range_s, MIN_RANGE_S)
        if n < old.size:
            self.overflow += float(old[n:].sum())
            self.counts = old[:n].copy()
        else:
            self.counts = np.concatenate([old, np.zeros(n - old.size)])
        self.version += 1


def fleet_pool(range_s: float = 4 * 3600.0, half_life_s: float = DEFAULT_HALF_LIFE_S) -> IdleTimes:
    """The fleet's pooled idle times (every model's idle times and heads, fed as they arrive): the prior a model
    with few idle times of its own borrows strength from (the learned keep-alive policy)."""
    return IdleTimes(range_s=range_s, half_life_s=half_life_s)


def merge_into(pool: IdleTimes, it: IdleTimes) -> None:
    """Add a warm-started model's idle times and heads to the fleet pool (those it learns later go there as they
    arrive, through ``IdleTimes.pool``)."""
    n = min(pool.bins, it.bins)
    pool.counts[:n] += it.counts[:n]
    pool.overflow += float(it.counts[n:].sum()) + it.overflow  # (beyond the smaller range: unknown where)
    pool.head_sum += it.head_sum
    pool.head_weight += it.head_weight
    pool.n_idle += it.n_idle
    pool.version += 1
