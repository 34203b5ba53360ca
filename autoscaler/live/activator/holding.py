"""Held requests: a bounded FIFO per model, and the Retry-After of a full queue. Pure (the clock is passed in).

Each held request is an entry (any object the proxy gives, with its arrival time); :meth:`HoldQueue.admit`
refuses past the limit, :meth:`HoldQueue.discard` drops one in O(1) (a client that went away, a timeout),
:meth:`HoldQueue.drain` hands them all back oldest first when a backend is ready.
"""

from __future__ import annotations

import math
from collections.abc import Hashable

RETRY_AFTER_MIN_S = 1
RETRY_AFTER_MAX_S = 60


class HoldQueue:
    """The held requests of one model, oldest first (a dict keeps insertion order and removes in O(1))."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"queue limit must be >= 1, got {limit}")
        self.limit = limit
        self._entries: dict[Hashable, float] = {}
        self.wake_started: float | None = None  # when the current stretch without backends began holding
        self.last_wake_s: float | None = None  # how long the last one lasted (first hold -> backend ready)

    def __len__(self) -> int:
        return len(self._entries)

    def admit(self, entry: Hashable, now: float) -> bool:
        """Hold ``entry``; False when the queue is full (nothing held)."""
        if len(self._entries) >= self.limit:
            return False
        if not self._entries:  # a stretch starts (discard and drain end the last one)
            self.wake_started = now
        self._entries[entry] = now
        return True

    def discard(self, entry: Hashable) -> float | None:
        """Drop ``entry`` if held; its arrival time, or None. The last one gone (timed out, abandoned) ends the
        stretch without a wake-up: the next hold starts a stretch of its own (else its Retry-After and the next
        ``last_wake_s`` would count from a start long past)."""
        at = self._entries.pop(entry, None)
        if not self._entries:
            self.wake_started = None
        return at

    def drain(self, now: float) -> list[tuple[Hashable, float]]:
        """Every held entry with its arrival, oldest first; the queue is empty afterwards."""
        out = list(self._entries.items())
        self._entries.clear()
        if self.wake_started is not None:
            self.last_wake_s = now - self.wake_started
            self.wake_started = None
        return out

    def abandon(self) -> list[Hashable]:
        """Every held entry, oldest first, the queue emptied without a wake-up (its model is gone)."""
        out = list(self._entries)
        self._entries.clear()
        self.wake_started = None
        return out

    def oldest_wait_s(self, now: float) -> float:
        for at in self._entries.values():
            return max(0.0, now - at)
        return 0.0

    def retry_after_s(self, now: float) -> int:
        """Seconds a caller refused with 503 should wait: what remains of the wake-up going on, estimated from the
        last wake-up of this model seen here (first hold -> backend ready) minus how long this one has lasted;
        never seen one: as long as this one has lasted so far (the remaining time of a wait of unknown length is
        of the order of its age). Clamped to [1, 60] s."""
        elapsed = now - self.wake_started if self.wake_started is not None else 0.0
        guess = self.last_wake_s - elapsed if self.last_wake_s is not None else elapsed
        return int(min(RETRY_AFTER_MAX_S, max(RETRY_AFTER_MIN_S, math.ceil(guess))))
