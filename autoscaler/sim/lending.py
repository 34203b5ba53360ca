"""What the simulated cluster records about lending and training (:class:`~autoscaler.sim.cluster.SimCluster`
keeps them): each training run on lent or statically split GPUs, each reclaim carried out, and the totals.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from autoscaler.api.snapshot import TrainingWorkload
from autoscaler.sim.training import QueuedJob


@dataclass
class TrainingRun:
    """One run of a training job on some GPUs: from its start until it finishes or stops after a SIGTERM."""

    job: QueuedJob
    node: str
    devices: tuple[int, ...]
    started_at: float
    lent: bool  # on lent GPUs (preemptible); False: a static split's GPUs, never preempted
    sigterm_at: float | None = None
    stop_at: float | None = None  # set on SIGTERM: the GPUs stay taken until then
    # What the snapshot shows, kept until the next checkpoint changes it (building one per run per tick would
    # cost more than the rest of the snapshot).
    _view: TrainingWorkload | None = field(default=None, repr=False)
    _view_until: float = -math.inf

    def last_checkpoint_at(self, now: float) -> float | None:
        """When the run last wrote a checkpoint (every ``checkpoint_every_s`` of running), None before the first."""
        every = self.job.job.checkpoint_every_s
        n = math.floor((now - self.started_at) / every + 1e-9)
        return self.started_at + n * every if n >= 1 else None

    def view(self, now: float) -> TrainingWorkload:
        """The run as the decision core sees it at ``now`` (time only moves forward)."""
        if self._view is None or now >= self._view_until - 1e-9:
            ckpt = self.last_checkpoint_at(now)
            self._view = TrainingWorkload(self.job.name, "Job", float(len(self.devices)), (self.node,),
                                          running=True, grace_s=self.job.job.grace_s, started_at=self.started_at,
                                          last_checkpoint_at=ckpt)
            self._view_until = (self.started_at if ckpt is None else ckpt) + self.job.job.checkpoint_every_s
        return self._view


@dataclass
class Reclaim:
    """One ``ReclaimGpus`` carried out: from the decision until its last GPU is free."""

    node: str
    devices: tuple[int, ...]
    reason: str
    decided_at: float
    deadline_s: float
    pending: set[int] = field(default_factory=set)
    freed_at: float | None = None

    @property
    def duration_s(self) -> float | None:
        return None if self.freed_at is None else self.freed_at - self.decided_at


@dataclass
class LendingStats:
    """What lending did, in the scored period (from ``score_from``); GPU-seconds are whole GPUs x seconds."""

    reclaims: list[Reclaim] = field(default_factory=list)  # decided in the scored period
    lends: int = 0
    lent_gpus: int = 0  # GPUs lent (a GPU lent twice counts twice)
    reclaim_noops: int = 0  # devices named by a ReclaimGpus that were not lent, or already coming back
    goodput_lent_s: float = 0.0  # training work kept, on lent GPUs
    goodput_static_s: float = 0.0  # ... on a static split's GPUs
    lost_s: float = 0.0  # training work thrown away (since the last checkpoint) by preemption
    grace_s: float = 0.0  # GPU-seconds jobs spent stopping after SIGTERM
    jobs_started: int = 0  # runs started (a job resumed after a preemption counts again); from time 0
    jobs_finished: int = 0  # from time 0
    preemptions: int = 0
    # Scored period only: each job's wait (entered the backlog -> first start; see autoscaler/sim/training.py) for
    # the jobs first started in it, and the jobs that finished in it.
    job_waits_s: list[float] = field(default_factory=list)
    jobs_finished_scored: int = 0
