"""The write gate: no write to the cluster unless this process leads, in the term that decided it.

Every adapter that writes (the scale/status/event actuator, the lending actuator, the MIG re-layout gate) calls
:meth:`WriteGate.check` right before each request that changes the cluster. The gate answers from the elector's
time-based ``is_leader`` (false as soon as the renew deadline passes, even while a renew hangs) and from the term
the tick started in: a tick planned in term 3 writes nothing in term 4, even if this process leads again by then.

Why a check before *every* write and not once per tick: a tick's writes take time (many models, retries), the Lease
can be lost in the middle, and the follower may acquire ``lease_duration - renew_deadline`` seconds after the last
renew. Each request also carries a timeout shorter than that gap (``autoscaler/cli/run.py``), so a write already in
flight when leadership ends finishes (or is abandoned) before anyone else can lead.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


class LeadershipLost(Exception):
    """Raised by :meth:`WriteGate.check`: the write is not made and the rest of the tick is abandoned."""


@dataclass(frozen=True)
class WriteGate:
    """``leading()`` says whether this process holds the Lease now; ``term()`` counts the terms it has led
    (a new number each time it acquires). ``term_started`` pins the gate to one term (see :meth:`for_term`)."""

    leading: Callable[[], bool] = lambda: True
    term: Callable[[], int] = lambda: 0
    term_started: int | None = None

    def for_term(self) -> WriteGate:
        """The gate pinned to the current term: checks fail once the term ends, whatever comes after."""
        return WriteGate(self.leading, self.term, self.term())

    def open(self) -> bool:
        return self.leading() and (self.term_started is None or self.term() == self.term_started)

    def check(self, what: str) -> None:
        """Raise :class:`LeadershipLost` (naming ``what`` was not written) unless writing is allowed now."""
        if not self.open():
            raise LeadershipLost(f"not leading (term {self.term_started}, now {self.term()}): {what} not written")


ALWAYS_OPEN = WriteGate()  # for adapters used without an election (tests, one-off tools)
