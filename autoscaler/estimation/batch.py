"""The batch a model's engines really run, learned from their running, waiting and KV-cache gauges.

A replica runs at most its declared concurrency at once (vLLM's ``max_num_seqs``, SGLang's ``max_running_requests``,
TGI's ``max_batch_size``), and fewer where its KV cache does not hold that many requests' tokens: the engines admit a
waiting request only when its KV blocks fit (vLLM's scheduler, SGLang's token pool, TGI's
``max_batch_total_tokens``). How many that is depends on the prompts and outputs the model is sent, which the
declaration cannot know. Sizing at the declared concurrency then counts slots the engines never fill, and the
capacity learner, which fits a service-time scale under that concurrency, reads the cache's queue as slow service: it
cannot tell "eight slower slots" from "three slots".

The engines' gauges say it, two ways (:class:`BatchLearner` uses the first where it has it):

- **From the cache's use** (``ModelMetrics.kv_cache_usage``, a fraction): ``r`` requests running per replica fill a
  fraction ``u`` of its cache, so a request holds ``u / r`` of it and the cache admits ``r / u`` of them. This reads at
  any load, queue or none. The answer is the median of the last ``memory`` readings, rounded down (whole requests;
  a cache that admits 7.0 requests of the mean size runs 7, not 8).
- **From the queue** (``ModelMetrics.queue_depth``), for engines without a KV gauge (TGI): while requests wait, the
  requests running per ready replica are as many as the engines admit (a step with fewer than one running a replica
  is a burst arriving at its end, not a full batch, and is not read). The answer is the largest of the last
  ``memory`` readings, rounded up: every cause of a reading that is off makes it low, never high -- a step whose queue
  formed part-way (its mean running count includes the filling), one replica queueing while another idles (the mean
  over replicas is below the full one's) -- and the batch is a whole number at least the largest reading.

On a step whose requests wait while the cache is full (``full_kv``, the KV rail's saturation default), the cache's
reading is capped at the running count rounded up: the engines admit no more than they run then, though the cache may
show some room (vLLM keeps a watermark of free blocks, blocks are rounded up, the next prompt may not fit). Not below
that use: requests that arrive in a burst at a step's end wait in it while the step's mean running count is low,
and say nothing about admission. A step whose cache is nearly empty (under ``min_kv`` use: mostly rounding) gives no
reading; nor does the queue where the engines have a KV gauge (measured: the code model's burst-edge steps, 0.2
running a replica with 40-175 waiting at the tick's end, read its 5 as 1).

Either is capped at the declaration (the engine's own limit) and used once there are ``min_readings`` readings. A
batch comes down at once and goes up only once the readings clear the next whole request by ``raise_margin``: the
capacity learner starts over at each change (the factor it fit was for the old batch), so a reading that hovers at a
whole number must not flip it. A model sized at the learned batch rarely queues, so the queue's readings are kept
until it returns: the answer does not drift back to the declaration (which would oscillate: sized at 8, the queue
builds, learned 3, sized right, forgotten).
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass, field


@dataclass
class BatchLearner:
    """The requests a replica runs at once when it has more to run (module docstring).

    ``declared``: the spec's concurrency, the answer until enough readings; ``min_readings``: readings needed before a
    learned batch is used; ``memory``: how many of the latest readings the answer is read from. ``min_waiting``: the
    mean waiting count per ready replica from which a step counts as queueing (at least one request waiting per
    replica: one request queued for a moment is not a full batch). ``min_kv``: the cache's use below which a reading
    of it is not taken (a nearly empty cache's ratio is mostly rounding); ``full_kv``: the use from which a cache with
    requests waiting counts as admitting no more than run. ``raise_margin``: how far past the next whole
    request the readings must be to raise the batch."""

    declared: int
    min_readings: int = 3
    memory: int = 10
    min_waiting: float = 1.0
    min_kv: float = 0.05
    full_kv: float = 0.9
    raise_margin: float = 0.25
    _from_kv: deque[float] = field(default_factory=deque, repr=False)
    _from_queue: deque[float] = field(default_factory=deque, repr=False)
    _admitted: int = 0

    def __post_init__(self) -> None:
        if self.declared < 1 or self.min_readings < 1 or self.memory < self.min_readings:
            raise ValueError(f"need declared >= 1 and 1 <= min_readings <= memory, got {self!r}")
        self._admitted = self.declared

    @property
    def admitted(self) -> int:
        """The batch to size with: at most the declared concurrency, at least 1."""
        return self._admitted

    @property
    def readings(self) -> int:
        """Readings kept of the signal the answer is read from (the cache's when it has any)."""
        return len(self._from_kv) or len(self._from_queue)

    def observe(self, running: float, waiting: float, ready: int, kv_usage: float = math.nan) -> bool:
        """Learn from one step's gauges: requests ``running`` and ``waiting`` summed over the model's replicas, the
        ``ready`` replicas serving, and the cache's use (the mean over replicas; NaN: no gauge). Returns whether
        :attr:`admitted` changed. A missing running gauge (NaN) says nothing."""
        if ready < 1 or not (math.isfinite(running) and running >= 0.0):
            return False
        per = running / ready
        queueing = math.isfinite(waiting) and waiting >= self.min_waiting * ready
        if math.isfinite(kv_usage):
            if not (kv_usage >= self.min_kv and per > 0.0):
                return False  # (a nearly empty cache: its ratio is mostly rounding)
            fit = per / kv_usage
            if queueing and kv_usage >= self.full_kv:
                # a full cache with requests waiting admits no more than run, whatever room it shows (a watermark
                # of free blocks, blocks rounded up, the next prompt too large)
                fit = min(fit, float(math.ceil(per - 1e-9)))
            _push(self._from_kv, min(fit, float(self.declared)), self.memory)
        elif queueing and per >= 1.0:  # (fewer running than a request a replica: a burst arriving, not a full batch)
            _push(self._from_queue, min(per, float(self.declared)), self.memory)
        else:
            return False
        before = self._admitted
        if len(self._from_kv) >= self.min_readings:
            fit = statistics.median(self._from_kv)
            self._admitted = self._settle(math.floor(fit + 1e-9), math.floor(fit - self.raise_margin + 1e-9))
        elif not self._from_kv and len(self._from_queue) >= self.min_readings:
            top = max(self._from_queue)
            self._admitted = self._settle(math.ceil(top - 1e-9), math.ceil(top - self.raise_margin - 1e-9))
        return self._admitted != before

    def _settle(self, reading: int, clear_of_margin: int) -> int:
        """The batch from a reading: down to it at once, up only to what clears the margin."""
        now = self._admitted
        if reading < now:
            return max(1, reading)
        return max(now, min(self.declared, clear_of_margin))


def _push(readings: deque[float], value: float, memory: int) -> None:
    readings.append(value)
    if len(readings) > memory:
        readings.popleft()
