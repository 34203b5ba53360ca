"""The batch a model's engines really run (issue 28, item 2): learned from their running, waiting and KV-cache gauges
(autoscaler/estimation/batch.py), and what sizing does with it (ModelLearning)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from autoscaler.api.snapshot import ModelMetrics
from autoscaler.api.spec import ModelSpec
from autoscaler.estimation.batch import BatchLearner
from autoscaler.estimation.capacity import profile_from_spec
from autoscaler.estimation.model_learning import ModelLearning
from tests.estimation.test_learning import _obs, _rep


def test_the_caches_use_says_how_many_requests_it_admits() -> None:
    b = BatchLearner(8)
    # 3 running per replica fill 0.9 of the cache: a request holds 0.3 of it, the cache admits 3.33 -> 3
    assert not b.observe(6.0, 0.0, 2, kv_usage=0.9)
    assert not b.observe(6.0, 0.0, 2, kv_usage=0.9)
    assert b.admitted == 8  # (two readings: not yet)
    assert b.observe(6.0, 0.0, 2, kv_usage=0.9)
    assert b.admitted == 3
    # a cache that holds more than the engine's own limit leaves the declaration
    roomy = BatchLearner(8)
    for _ in range(5):
        roomy.observe(4.0, 0.0, 1, kv_usage=0.2)  # 20 would fit
    assert roomy.admitted == 8


def test_without_a_kv_gauge_the_queue_says_it() -> None:
    b = BatchLearner(8)
    for running in (2.4, 2.9, 2.7):  # requests wait while 3 replicas run fewer than 3 each (a queue part-way in)
        b.observe(3 * running, 10.0, 3)
    assert b.admitted == 3  # the largest reading rounded up: every error reads low
    # a step without a queue says nothing about the batch
    fresh = BatchLearner(8)
    for _ in range(5):
        assert not fresh.observe(3.0, 0.5, 3)  # less than one request waiting a replica
    assert fresh.admitted == 8 and fresh.readings == 0


@pytest.mark.parametrize("running, ready", [(math.nan, 2), (-1.0, 2), (4.0, 0), (math.inf, 2)])
def test_a_reading_that_says_nothing_is_skipped(running: float, ready: int) -> None:
    b = BatchLearner(8)
    for _ in range(5):
        assert not b.observe(running, 50.0, ready, kv_usage=0.9)
    assert b.admitted == 8 and b.readings == 0


def test_it_comes_down_at_once_and_goes_up_only_past_the_margin() -> None:
    b = BatchLearner(16)
    for _ in range(3):
        b.observe(5.0, 0.0, 1, kv_usage=0.5)  # admits 10
    assert b.admitted == 10
    for _ in range(10):
        b.observe(5.0, 0.0, 1, kv_usage=5.0 / 11.1)  # 11.1: past 11 but not by the margin
    assert b.admitted == 10
    for _ in range(10):
        b.observe(5.0, 0.0, 1, kv_usage=5.0 / 11.5)
    assert b.admitted == 11
    for _ in range(10):  # longer prompts: the cache admits 6, the median follows within the memory
        b.observe(3.0, 0.0, 1, kv_usage=0.5)
    assert b.admitted == 6


def test_the_queues_answer_stays_while_no_queue_shows() -> None:
    b = BatchLearner(8)
    for _ in range(3):
        b.observe(6.0, 20.0, 2)
    assert b.admitted == 3
    for _ in range(100):  # sized at 3, the queue is gone: nothing drifts back to the declaration
        b.observe(4.0, 0.0, 2)
    assert b.admitted == 3


@given(cap=st.integers(1, 64), declared=st.integers(1, 64),
       fills=st.lists(st.floats(0.05, 1.0), min_size=3, max_size=40), ready=st.integers(1, 20))
def test_the_queues_answer_is_never_above_the_batch_the_engines_run(cap: int, declared: int, fills: list[float],
                                                                    ready: int) -> None:
    # Each queueing step's engines run at most their batch, the limit the cache or the declaration sets (a step's mean
    # over part-filled replicas reads below it): the learned batch never exceeds that, never goes below 1.
    batch = min(cap, declared)
    b = BatchLearner(declared)
    for f in fills:
        b.observe(ready * batch * f, 2.0 * ready, ready)
        assert 1 <= b.admitted <= batch if b.readings >= b.min_readings else b.admitted == declared


@given(cap=st.integers(1, 64), declared=st.integers(1, 64),
       fills=st.lists(st.floats(0.05, 1.0), min_size=3, max_size=40))
def test_the_caches_answer_is_what_it_fits(cap: int, declared: int, fills: list[float]) -> None:
    # r running requests (at least one) of a cache that fits `cap` of them use r / cap of it
    b = BatchLearner(declared)
    for f in fills:
        r = max(1.0, f * cap)
        b.observe(2 * r, 0.0, 2, kv_usage=r / cap)
    assert b.admitted == min(cap, declared)


def _metrics(running: float, waiting: float, kv: float = math.nan) -> ModelMetrics:
    return ModelMetrics(rate=np.array([2.0, 2.0]), in_flight=np.array([running + waiting] * 2), queue_depth=waiting,
                        running=running, kv_cache_usage=kv)


SPEC = ModelSpec(name="m", concurrency=8, service_time_ms=1000.0, min_replicas=1, max_replicas=10)


def test_sizing_uses_the_batch_the_engines_run() -> None:
    learning = ModelLearning.start(SPEC, profile_from_spec(SPEC), 10.0)
    obs = _obs(_rep("r0", True, 0.0), _rep("r1", True, 0.0))
    before = learning.profile()
    assert before.concurrency == 8
    for k in range(6):  # (read once the replicas are as they are for two metric steps and a decision: from t = 40)
        learning.observe(obs, _metrics(6.0, 30.0, kv=1.0), 10.0 * (k + 1), 10.0, 10.0)
    assert learning.batch is not None and learning.batch.admitted == 3
    assert learning.profile().concurrency == 3
    # the capacity learner started over on the smaller batch: what it fit under 8 slots is not carried
    assert learning.capacity.prior.concurrency == 3 and learning.capacity.count == 1
    assert learning.capacity.prior.mean_s == pytest.approx(before.mean_s)  # the service as declared


def test_no_batch_is_learned_from_a_stale_or_partial_window_or_a_changing_count() -> None:
    learning = ModelLearning.start(SPEC, profile_from_spec(SPEC), 10.0)
    two = _obs(_rep("r0", True, 0.0), _rep("r1", True, 0.0))
    stale = ModelMetrics(rate=np.array([2.0]), in_flight=np.array([36.0]), queue_depth=30.0, running=6.0,
                         kv_cache_usage=1.0, stale=True)
    partial = ModelMetrics(rate=np.array([2.0]), in_flight=np.array([36.0]), queue_depth=30.0, running=6.0,
                           kv_cache_usage=1.0, partial="1 of 2 scrape targets not answering")
    for k in range(6):
        learning.observe(two, stale if k % 2 else partial, 10.0 * (k + 1), 10.0, 10.0)
    assert learning.batch is not None and learning.batch.readings == 0
    # the count changes every tick (a replica removed: its requests still in the last step's gauges) -> no reading
    one = _obs(_rep("r0", True, 0.0))
    for k in range(6):
        learning.observe(two if k % 2 else one, _metrics(6.0, 30.0, kv=1.0), 100.0 + 10.0 * k, 10.0, 10.0)
    assert learning.batch.readings == 0
    # a draining replica runs requests the ready ones do not
    draining = _obs(_rep("r0", True, 0.0), _rep("r1", True, 0.0), _rep("r2", False, 0.0, draining=True))
    for k in range(6):
        learning.observe(draining, _metrics(6.0, 30.0, kv=1.0), 200.0 + 10.0 * k, 10.0, 10.0)
    assert learning.batch.readings == 0 and learning.profile().concurrency == 8


def test_a_replica_that_drained_and_left_does_not_read_as_a_larger_batch() -> None:
    # Three replicas run 3 each with requests waiting (no KV gauge: the queue's reading). One drains and is gone; the
    # window's last step still holds its requests (9 running over the 2 left would read 4.5 -> 5). No reading is
    # taken until the two left have been the replicas for two metric steps and a decision.
    learning = ModelLearning.start(SPEC, profile_from_spec(SPEC), 10.0)
    three = _obs(_rep("r0", True, 0.0), _rep("r1", True, 0.0), _rep("r2", True, 0.0))
    for k in range(8):
        learning.observe(three, _metrics(9.0, 30.0), 10.0 * (k + 1), 10.0, 15.0)
    assert learning.batch is not None and learning.batch.admitted == 3
    draining = _obs(_rep("r0", True, 0.0), _rep("r1", True, 0.0), _rep("r2", False, 0.0, draining=True))
    learning.observe(draining, _metrics(9.0, 30.0), 90.0, 10.0, 15.0)
    two = _obs(_rep("r0", True, 0.0), _rep("r1", True, 0.0))
    stale_gauges = _metrics(9.0, 30.0)  # the step that still holds the drained replica's requests
    for now in (100.0, 110.0, 120.0, 130.0):
        learning.observe(two, stale_gauges, now, 10.0, 15.0)
        assert learning.batch.admitted == 3
    for now in (140.0, 150.0, 160.0):  # (two 15 s steps and a 10 s decision after the change: its own gauges)
        learning.observe(two, _metrics(6.0, 30.0), now, 10.0, 15.0)
    assert learning.batch.admitted == 3


def test_a_full_cache_with_requests_waiting_reads_what_runs() -> None:
    # 10 running a replica with requests waiting at 0.92 use: r/u says 10.9, but nothing more is admitted (a
    # watermark of free blocks, the next prompt too large): the batch is 10
    b = BatchLearner(16)
    for _ in range(3):
        b.observe(20.0, 8.0, 2, kv_usage=0.92)
    assert b.admitted == 10


def test_a_burst_arriving_at_a_steps_end_says_nothing_about_the_batch() -> None:
    # The step's mean running count is low while the burst waits at its end: neither the cache (not full) nor the
    # queue (under one running a replica) reads that as the batch
    b = BatchLearner(8)
    for _ in range(5):
        b.observe(0.2 * 25, 175.0, 25, kv_usage=0.04)  # a nearly empty cache: no reading, and no queue reading
    assert b.admitted == 8 and b.readings == 0
    for _ in range(3):
        b.observe(1.5 * 25, 175.0, 25, kv_usage=0.3)  # 1.5 running a replica fill 0.3: the cache admits 5
    assert b.admitted == 5
    tgi = BatchLearner(8)  # no KV gauge: the queue's reading, not under one running a replica
    for _ in range(5):
        tgi.observe(0.2 * 25, 175.0, 25)
    assert tgi.admitted == 8 and tgi.readings == 0
