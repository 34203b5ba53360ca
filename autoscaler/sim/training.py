"""Preemptible training for the simulator: the jobs, where they come from, and the backlog that feeds them.

A training job needs ``gpus`` whole GPUs (on one node when more than one) for ``work_s`` seconds of wall time
(GPU-seconds of work per GPU); it writes a checkpoint every ``checkpoint_every_s`` seconds of running; when told
to stop (SIGTERM) it loses the work since its last checkpoint and stops ``grace_s`` later (its termination grace
period). The backlog (:class:`TrainingQueue`) always wants more GPUs: it cycles through its jobs in order, so a
finished job is followed by the next one, and preempted jobs wait (with the work they kept) at its front.

Waits. Neither source has a submit time the backlog could use (an infinite backlog cycles through its source, so a
trace's creation times would not line up with the simulated period), so a job's wait is measured from when it
*entered the backlog queue*: the queue always holds one new job at its head, and the next job of the source enters
when the one ahead of it leaves the source (started, or set aside because it needs more GPUs than were offered).
The first job enters when the queue is created (time 0). So the wait (``QueuedJob.entered_at`` -> first start) is
how long training stood in line for GPUs: 0 while lent GPUs keep coming, the time until the next lend (or the next
job end on a static split) when none are free.

Job sources (:func:`load_training`):

- **an Alibaba GPU cluster pod list** (``cluster-trace-gpu-v2023``, e.g. ``openb_pod_list_default.csv``;
  ``alibaba-default`` names the bundled slice in ``autoscaler/data/training/``): its best-effort pods are the
  training jobs. Mapping, row by row in trace order:

  ============================  ==========================================================================
  ``qos``                       only ``BE`` (best effort) rows are jobs; LS / Burstable / Guaranteed are
                                latency-sensitive services, not training
  ``num_gpu``, ``gpu_milli``    ``num_gpu`` whole GPUs; a GPU-sharing pod (``gpu_milli`` < 1000) still
                                takes 1 whole GPU (a lent GPU is lent whole); ``num_gpu`` 0 or
                                ``gpu_milli`` 0 = a CPU-only pod: dropped
  ``deletion_time`` -            ``work_s``: the pod's lifetime in seconds; rows where either time is
  ``creation_time``             missing, or the difference is zero or negative, are dropped
  ``scheduled_time``            empty = the pod never ran (Pending when the trace was cut): no work was
                                observed, dropped (a present column only; files without it keep all rows)
  ``name``                      the job's name (``training/<name>``)
  ============================  ==========================================================================

  The trace has no checkpoint interval, grace period or priority: they are parameters
  (``checkpoint_every_s`` default :data:`DEFAULT_CHECKPOINT_EVERY_S`, ``grace_s`` default
  :data:`DEFAULT_GRACE_S`, Kubernetes' default ``terminationGracePeriodSeconds``; priority 0).

- **a job list**: CSV with a header ``gpus,work_s`` and optionally ``name``, ``checkpoint_every_s``,
  ``grace_s``, ``priority`` (empty cells or absent columns take the defaults above).

A malformed file raises :class:`~forecasting.traces.model.TraceFormatError` naming the file, line and field, as
the trace readers do.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from autoscaler.api.snapshot import DEFAULT_GRACE_S
from forecasting.traces._io import CsvTable, floats, ints, read_csv
from forecasting.traces.model import TraceFormatError

DEFAULT_CHECKPOINT_EVERY_S = 600.0  # ten minutes: a common periodic-checkpoint setting for preemptible training
BUNDLED = "alibaba-default"  # the bundled slice's name for --training
FULL_GPU_MILLI = 1000


@dataclass(frozen=True)
class TrainingJob:
    """One preemptible training job as its source describes it (nothing about a run of it)."""

    name: str  # namespace/name
    gpus: int  # whole GPUs, all on one node
    work_s: float  # seconds of running on ``gpus`` GPUs to finish (GPU-seconds of work per GPU)
    checkpoint_every_s: float = DEFAULT_CHECKPOINT_EVERY_S
    grace_s: float = DEFAULT_GRACE_S
    priority: int = 0

    def __post_init__(self) -> None:
        if self.gpus < 1:
            raise ValueError(f"{self.name}: gpus must be >= 1, got {self.gpus}")
        for name in ("work_s", "checkpoint_every_s"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v > 0):
                raise ValueError(f"{self.name}: {name} must be a finite number > 0, got {v!r}")
        if not (math.isfinite(self.grace_s) and self.grace_s >= 0):
            raise ValueError(f"{self.name}: grace_s must be a finite number >= 0, got {self.grace_s!r}")


def bundled_training_dir() -> Path:
    """``autoscaler/data/training`` (found through the imported package, like the bundled traces)."""
    import autoscaler

    for root in autoscaler.__path__:
        folder = Path(root) / "data" / "training"
        if folder.is_dir():
            return folder
    return Path(__file__).resolve().parents[1] / "data" / "training"


def bundled_training() -> dict[str, Path]:
    """Job sources shipped with the package, by name."""
    path = bundled_training_dir() / "alibaba_gpu_v2023_default_be.csv.gz"
    return {BUNDLED: path} if path.exists() else {}


def load_training(
    source: str | Path = BUNDLED,
    checkpoint_every_s: float = DEFAULT_CHECKPOINT_EVERY_S,
    grace_s: float = DEFAULT_GRACE_S,
) -> tuple[TrainingJob, ...]:
    """The jobs of a bundled source (by name) or a file: an Alibaba pod list or a job list (module docstring).

    ``checkpoint_every_s`` and ``grace_s`` are the defaults for jobs whose source does not say (all of an Alibaba
    pod list's). Raises ``FileNotFoundError`` for an unknown name, ``TraceFormatError`` for a bad file.
    """
    for name, v, low in (("checkpoint_every_s", checkpoint_every_s, 0.0), ("grace_s", grace_s, -1.0)):
        if not (math.isfinite(v) and v > low):
            raise ValueError(f"training {name} must be a finite number {'> 0' if low == 0 else '>= 0'}, got {v!r}")
    path = Path(source)
    if not path.exists():
        bundled = bundled_training()
        key = str(source).strip().lower()
        if key not in bundled:
            known = ", ".join(bundled) or "none"
            raise FileNotFoundError(f"{source}: no such file, nor a bundled training source ({known})")
        path = bundled[key]
    table = read_csv(path)
    if "qos" in table.header or "num_gpu" in table.header:
        jobs = _from_pod_list(table, checkpoint_every_s, grace_s)
        what = "no best-effort GPU pods with a positive lifetime (qos BE, num_gpu >= 1)"
    else:
        jobs = _from_job_list(table, checkpoint_every_s, grace_s)
        what = "no jobs"
    if not jobs:
        raise TraceFormatError(table.path, None, None, what)
    return tuple(jobs)


def _column(table: CsvTable, name: str) -> int:
    idx = table.index(name, required=True)
    assert idx is not None
    return idx


def _from_pod_list(table: CsvTable, checkpoint_every_s: float, grace_s: float) -> list[TrainingJob]:
    names = table.column(_column(table, "name"))
    qos = [q.strip() for q in table.column(_column(table, "qos"))]
    num_gpu = ints(table, _column(table, "num_gpu"), "num_gpu")
    gpu_milli = ints(table, _column(table, "gpu_milli"), "gpu_milli")
    over = gpu_milli > FULL_GPU_MILLI
    if over.any():
        raise table.error(int(np.argmax(over)), "gpu_milli", f"above {FULL_GPU_MILLI} (one whole GPU)")
    created = floats(table, _column(table, "creation_time"), "creation_time", allow_empty=True, min_value=0.0)
    deleted = floats(table, _column(table, "deletion_time"), "deletion_time", allow_empty=True, min_value=0.0)
    sched_idx = table.index("scheduled_time", required=False)
    ran = (np.array([bool(v.strip()) for v in table.column(sched_idx)]) if sched_idx is not None
           else np.ones(len(table), dtype=bool))
    lifetime = deleted - created  # NaN where either is missing
    jobs = []
    for i in range(len(table)):
        if qos[i] != "BE" or num_gpu[i] < 1 or gpu_milli[i] < 1 or not ran[i]:
            continue
        if not (np.isfinite(lifetime[i]) and lifetime[i] > 0):
            continue
        name = names[i].strip()
        if not name:
            raise table.error(i, "name", "missing value")
        jobs.append(TrainingJob(f"training/{name}", int(num_gpu[i]), float(lifetime[i]), checkpoint_every_s, grace_s))
    return jobs


def _optional(
    table: CsvTable, name: str, default: float, *, positive: bool, min_value: float | None = 0.0
) -> np.ndarray:
    """An optional column: absent, or an empty cell, takes ``default``."""
    idx = table.index(name, required=False)
    if idx is None:
        return np.full(len(table), default)
    arr = floats(table, idx, name, allow_empty=True, min_value=min_value)
    if positive:
        zero = arr == 0
        if zero.any():
            raise table.error(int(np.argmax(zero)), name, "must be > 0")
    return np.where(np.isnan(arr), default, arr)


def _from_job_list(table: CsvTable, checkpoint_every_s: float, grace_s: float) -> list[TrainingJob]:
    gpus = ints(table, _column(table, "gpus"), "gpus", min_value=1)
    work = floats(table, _column(table, "work_s"), "work_s", min_value=0.0)
    zero = work == 0
    if zero.any():
        raise table.error(int(np.argmax(zero)), "work_s", "must be > 0")
    ckpt = _optional(table, "checkpoint_every_s", checkpoint_every_s, positive=True)
    grace = _optional(table, "grace_s", grace_s, positive=False)
    prio = _optional(table, "priority", 0.0, positive=False, min_value=None)
    frac = prio != np.floor(prio)
    if frac.any():
        i = int(np.argmax(frac))
        raise table.error(i, "priority", f"not an integer: {prio[i]:g}")
    name_idx = table.index("name", required=False)
    names = [v.strip() for v in table.column(name_idx)] if name_idx is not None else [""] * len(table)
    return [
        TrainingJob(
            names[i] if "/" in names[i] else f"training/{names[i] or f'job-{i}'}",
            int(gpus[i]), float(work[i]), float(ckpt[i]), float(grace[i]), int(prio[i]),
        )
        for i in range(len(table))
    ]


@dataclass
class QueuedJob:
    """A job waiting in (or taken from) the backlog, with the work it has kept from earlier runs."""

    job: TrainingJob
    name: str  # unique per pass through the source: ``<job name>`` on the first pass, ``-c<pass>`` after
    seq: int  # order of first arrival: earlier jobs resume first
    done_s: float = 0.0  # seconds of work kept (checkpointed) so far
    preemptions: int = 0
    entered_at: float = 0.0  # when it entered the backlog queue (module docstring: Waits)
    first_started_at: float | None = None  # its first start (None: never started yet)

    @property
    def remaining_s(self) -> float:
        return max(0.0, self.job.work_s - self.done_s)


@dataclass
class TrainingQueue:
    """The training backlog: it always wants more GPUs.

    Jobs come in source order and cycle when the source runs out (a finished job is followed by the next).
    Preempted jobs, and jobs too big for the GPUs offered when they came up, wait at the front (highest priority
    first, then oldest), so a preempted job resumes with the work it kept before new work starts.
    """

    jobs: Sequence[TrainingJob]
    max_waiting: int = 256  # bound on jobs set aside for size: a scan never grows the queue past it
    waiting: list[QueuedJob] = field(default_factory=list)
    cursor: int = 0
    passes: int = 0
    seq: int = 0
    skipped_grace: int = 0  # source jobs passed over on lent GPUs: grace period longer than the reclaim deadline
    head_since: float = 0.0  # when the source's next job entered the queue (module docstring: Waits)

    def __post_init__(self) -> None:
        if not self.jobs:
            raise ValueError("a training queue needs at least one job")
        self.jobs = tuple(self.jobs)

    def _next_from_source(self, now: float) -> QueuedJob:
        job = self.jobs[self.cursor]
        name = job.name if self.passes == 0 else f"{job.name}-c{self.passes}"
        # It has been in line since the job ahead of it left the source; the one behind it enters now.
        q = QueuedJob(job, name, self.seq, entered_at=self.head_since)
        self.head_since = max(self.head_since, now)
        self.seq += 1
        self.cursor += 1
        if self.cursor == len(self.jobs):
            self.cursor, self.passes = 0, self.passes + 1
        return q

    def take(self, max_gpus: int, max_grace_s: float = math.inf, now: float = 0.0) -> QueuedJob | None:
        """The next job that fits ``max_gpus`` GPUs of one node and whose grace period is at most
        ``max_grace_s``, or None when none does (after one pass over the source). ``now``: the time of the offer
        (when the jobs it moves out of the source leave it; see Waits in the module docstring)."""
        if max_gpus < 1:
            return None
        for k, q in enumerate(self.waiting):
            if q.job.gpus <= max_gpus and q.job.grace_s <= max_grace_s:
                return self.waiting.pop(k)
        for _ in range(len(self.jobs)):
            head = self.jobs[self.cursor]
            if head.grace_s > max_grace_s:
                # Never started on capacity that must come back faster than the job can stop.
                self.skipped_grace += 1
                self._next_from_source(now)
                continue
            if head.gpus > max_gpus:
                if len(self.waiting) >= self.max_waiting:
                    return None
                self._wait(self._next_from_source(now))
                continue
            return self._next_from_source(now)
        return None

    def requeue(self, q: QueuedJob) -> None:
        """A preempted job comes back with the work it kept."""
        self._wait(q)

    def _wait(self, q: QueuedJob) -> None:
        key = (-q.job.priority, q.seq)
        k = len(self.waiting)
        while k > 0 and (-self.waiting[k - 1].job.priority, self.waiting[k - 1].seq) > key:
            k -= 1
        self.waiting.insert(k, q)


def describe(jobs: Sequence[TrainingJob]) -> str:
    """One line about a job source: how many jobs, how much work, how big."""
    gpus = np.array([j.gpus for j in jobs])
    work = np.array([j.work_s for j in jobs])
    return (f"{len(jobs)} jobs, {(gpus * work).sum() / 3600:,.1f} GPU-hours of work, median {np.median(work):.0f} s, "
            f"GPUs per job {sorted(set(gpus.tolist()))}")
