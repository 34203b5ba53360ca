"""Fragmentation for a learned target workload, CPU- and memory-aware: what :class:`~sharing.packer.CostAwarePacker`
weighs beside the GPU capacity a placement strands (issue 29).

FGD (Weng et al., ATC'23) scores a node by how much of its idle GPU capacity the *target workload* (the shapes of
pod expected, with their popularity) could no longer use: F_n = sum_t w_t frag_n(t), where frag_n(t) is

- **all** the node's free GPU capacity when shape t cannot run there at all (its GPU kind is not accepted, fewer
  GPUs have t's per-GPU demand free than t asks for, or -- the part FGD lacks for memory -- the node's free host CPU
  or memory is below t's), and
- otherwise the free capacity on GPUs with less free than t's per-GPU demand (gaps t cannot use).

A placement's cost is dF = F_after - F_before on its node (expected GPU capacity fragmented, once divided by the
total weight). A live fleet has no trace file to take shapes from, so :class:`TargetWorkload` learns them: a
decayed histogram of the requests that arrive (seeded by a prior when one is known), cut like FGD's to the shapes
covering 95 % of the weight. Each shape's host memory is the decayed mean of its requests'.

All of it is integer arithmetic in milli-GPUs (device free capacity floored to 1/1000 of a GPU, shape demands
rounded up, integer weights), so F is exact: the packer's array path (:class:`KindFragmentation`, kept per node as
devices change) and its reference (:func:`fragmentation_delta`, a loop over one node's devices) give the same
integers, and an unchanged node scores exactly 0.

Standard library only at import, like the rest of ``sharing``; the array path imports numpy on first use.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sharing.catalog import Catalog, GpuModel
from sharing.gap_plan import GapPlan
from sharing.slots import FREE_MILLI as MILLI  # a device's free milli: sharing.slots.free_milli

if TYPE_CHECKING:
    from sharing.slots import KindHostTable, SlotRequest

WEIGHT_SCALE = 10_000  # integer weights per unit of probability (resolution 1e-4)
TARGET_COVERAGE = 0.95  # FGD's cut: the most popular shapes covering this share of the weight
# A learned shape is (GPUs, a share's GPU memory or None for whole GPUs, compute fraction, CPU millis, accepted kinds).
ShapeKey = tuple[int, float | None, float, int, tuple[str, ...]]


@dataclass(frozen=True)
class TargetShape:
    """One shape of request the fleet expects, with its weight in the target workload."""

    gpus: int  # GPUs per pod; 0: a pod without GPUs (it only takes host CPU/memory)
    memory_gib: float | None  # a time-slice share's GPU memory; None: whole GPUs
    compute_fraction: float
    cpu_millis: int
    host_memory_gib: float
    gpu_models: tuple[str, ...]  # GPU kinds accepted, as requested; empty: any
    weight: int

    def demand_milli(self, gpu: GpuModel) -> int:
        """Per-GPU capacity one pod of the shape needs on ``gpu`` (milli, rounded up): a whole GPU, or a share's
        larger of compute and memory (memory is the hard limit of a time-slice share)."""
        if self.memory_gib is None:
            return MILLI
        share = max(self.compute_fraction, self.memory_gib / gpu.memory_gib)
        return max(1, min(MILLI, math.ceil(share * MILLI - 1e-9)))


@dataclass(frozen=True)
class WorkloadShapes:
    """A snapshot of the target workload: its shapes (FGD's cut) and the total weight, CPU-only shapes included."""

    shapes: tuple[TargetShape, ...]

    @property
    def total(self) -> int:
        return max(sum(s.weight for s in self.shapes), 1)


def shape_key(req: SlotRequest) -> ShapeKey:
    """The histogram bin of a request: everything about it but its host memory (learned as the bin's mean)."""
    if req.whole_only:
        return (req.gpus, None, 1.0, req.cpu_millis, tuple(req.gpu_models))
    return (1, req.memory_gib, req.compute_fraction, req.cpu_millis, tuple(req.gpu_models))


class TargetWorkload:
    """A decayed histogram of the shapes that arrive (half-life in arrivals), seeded by an optional prior.

    Decay is lazy: each arrival adds ``growth**k`` instead of shrinking every bin, and the bins are rescaled before
    that grows large. ``keep_prior``: every prior shape stays in the cut (a prior is usually a cut already, and
    cutting it again drops its rarest shapes -- often the large multi-GPU ones only the biggest nodes fit).
    """

    def __init__(self, prior: Iterable[tuple[ShapeKey, float, float]] = (), half_life: float = 8000.0,
                 prior_weight: float = 500.0, coverage: float = TARGET_COVERAGE, keep_prior: bool = True) -> None:
        if half_life <= 0:
            raise ValueError("half_life must be > 0")
        if not 0 < coverage <= 1:
            raise ValueError("coverage must be in (0, 1]")
        self.growth = 2.0 ** (1.0 / half_life)
        self.coverage = coverage
        self.index: dict[ShapeKey, int] = {}
        self.count: list[float] = []  # decayed weight (prior + arrivals)
        self.seen: list[float] = []  # decayed weight of arrivals with a host memory (its mean is theirs)
        self.mem_sum: list[float] = []
        self.prior_mem: list[float] = []
        self.prior_keys: set[ShapeKey] = set()
        self.inc = 1.0
        items = list(prior)  # (key, count, host memory GiB)
        total = sum(c for _, c, _ in items)
        for key, c, mem in items:
            k = self._bin(key)
            self.count[k] += prior_weight * c / total if total > 0 else 0.0
            self.prior_mem[k] = mem
            if keep_prior:
                self.prior_keys.add(key)

    def _bin(self, key: ShapeKey) -> int:
        k = self.index.get(key)
        if k is None:
            k = self.index[key] = len(self.count)
            self.count.append(0.0)
            self.seen.append(0.0)
            self.mem_sum.append(0.0)
            self.prior_mem.append(0.0)
        return k

    def observe(self, key: ShapeKey, host_memory_gib: float) -> None:
        """One arrival of shape ``key`` (placed or not: the demand is what matters)."""
        k = self._bin(key)
        self.count[k] += self.inc
        self.seen[k] += self.inc
        self.mem_sum[k] += self.inc * host_memory_gib
        self.inc *= self.growth
        if self.inc > 1e12:  # rescale everything; ratios are unchanged
            s = 1.0 / self.inc
            self.count = [c * s for c in self.count]
            self.seen = [c * s for c in self.seen]
            self.mem_sum = [c * s for c in self.mem_sum]
            self.inc = 1.0

    def observe_request(self, req: SlotRequest) -> None:
        self.observe(shape_key(req), req.host_memory_gib)

    def shapes(self) -> WorkloadShapes:
        """FGD's cut of the current histogram: shapes by weight, the top ones covering ``coverage`` (plus the prior's
        with ``keep_prior``), weights scaled to integers."""
        total = sum(self.count)
        keys = sorted(self.index, key=lambda key: (self.count[self.index[key]], _sortable(key)), reverse=True)
        kept: list[ShapeKey] = []
        acc = 0.0
        for key in keys:
            if self.count[self.index[key]] <= 0:
                break
            kept.append(key)
            acc += self.count[self.index[key]]
            if total > 0 and acc / total >= self.coverage:
                break
        have = set(kept)
        kept += sorted((k for k in self.prior_keys - have if self.count[self.index[k]] > 0), key=_sortable)
        if not kept:
            return WorkloadShapes(())
        w = [self.count[self.index[k]] for k in kept]
        s = sum(w)
        out = []
        for key, wk in zip(kept, w, strict=True):
            k = self.index[key]
            mem = self.mem_sum[k] / self.seen[k] if self.seen[k] > 0 else self.prior_mem[k]
            gpus, memory, compute, cpu, models = key
            out.append(TargetShape(gpus, memory, compute, cpu, mem, models, max(round(wk / s * WEIGHT_SCALE), 1)))
        return WorkloadShapes(tuple(out))


def _sortable(key: ShapeKey) -> tuple:
    gpus, memory, compute, cpu, models = key
    return (gpus, -1.0 if memory is None else memory, compute, cpu, models)


def allowed_kind(shape: TargetShape, gpu: GpuModel, catalog: Catalog) -> bool:
    """The shape accepts GPUs of ``gpu``'s kind."""
    return not shape.gpu_models or gpu.name in {catalog.resolve(m) for m in shape.gpu_models if m in catalog}


class KindShapes:
    """The target workload as one GPU kind sees it: per GPU shape its per-GPU demand there (milli), GPU count, host
    CPU / memory and weight; the weight that counts every free milli of the kind as fragmented (CPU-only shapes, and
    GPU shapes that do not accept the kind); and ``scale``, the cost per unit of F (the packer's weight over the
    total weight: dF x scale is expected GPU capacity fragmented)."""

    def __init__(self, workload: WorkloadShapes, gpu: GpuModel, catalog: Catalog, weight: float,
                 count_memory: bool = False) -> None:
        t, num, cpu, mem, w = [], [], [], [], []
        other = 0
        self.share_demand: dict[int, float] = {}  # share sizes (milli on this kind) -> weight: what the gap plan prices
        for s in workload.shapes:
            if s.gpus <= 0 or not allowed_kind(s, gpu, catalog):
                other += s.weight
                continue
            d = s.demand_milli(gpu)
            if s.gpus == 1 and s.memory_gib is not None and d < MILLI:
                self.share_demand[d] = self.share_demand.get(d, 0.0) + s.weight
            t.append(d)
            num.append(s.gpus)
            cpu.append(s.cpu_millis)
            mem.append(s.host_memory_gib if count_memory else 0.0)
            w.append(s.weight)
        self.t, self.num, self.cpu, self.mem, self.w = tuple(t), tuple(num), tuple(cpu), tuple(mem), tuple(w)
        self.other = other
        self.mem_counts = any(m > 0 for m in self.mem)
        self.catalog = catalog
        self.scale = weight / (workload.total * MILLI)  # F counts milli-GPUs; the cost is in GPUs
        self._arrays: tuple | None = None
        self._plan: GapPlan | None = None

    @property
    def plan(self) -> GapPlan:
        """The planned packing of this kind's time-slice shares (:class:`~sharing.gap_plan.GapPlan`)."""
        if self._plan is None:
            self._plan = GapPlan.for_demand(self.share_demand)
        return self._plan

    def arrays(self) -> tuple:
        if self._arrays is None:
            import numpy as np

            self._arrays = (np.array(self.t, dtype=np.int64), np.array(self.num, dtype=np.int64),
                            np.array(self.cpu, dtype=np.float64), np.array(self.mem, dtype=np.float64),
                            np.array(self.w, dtype=np.float64))
        return self._arrays

    def node_f(self, frees: Sequence[int], cpu_free: float, mem_free: float) -> int:
        """F of one node with devices' free milli ``frees`` and free host CPU / memory (``inf``: not declared)."""
        total = sum(frees)
        f = self.other * total
        for t, num, cpu, mem, w in zip(self.t, self.num, self.cpu, self.mem, self.w, strict=True):
            below = 0
            cnt = 0
            for v in frees:
                if v < t:
                    below += v
                else:
                    cnt += 1
            fits = cnt >= num and cpu_free >= cpu and (mem <= 0 or mem_free >= mem)
            f += w * (below if fits else total)
        return f


def fragmentation_delta(kind: KindShapes, frees: Sequence[int], cpu_free: float, mem_free: float, v: int, g: int,
                        r: int, cpu_millis: int, host_memory_gib: float) -> int:
    """dF of one node (the reference): ``r`` of its devices with ``v`` free milli each lose ``g`` milli, and the host
    requests leave its free CPU / memory."""
    after = list(frees)
    left = r
    for i, x in enumerate(after):
        if left and x == v:
            after[i] = v - g
            left -= 1
    if left:
        raise ValueError(f"the node has fewer than {r} devices with {v} milli free")
    return (kind.node_f(after, cpu_free - cpu_millis, mem_free - host_memory_gib)
            - kind.node_f(frees, cpu_free, mem_free))


class KindFragmentation:
    """F of every node of one kind, kept per node: for each node and GPU shape the free milli on GPUs below the shape's
    demand (``below``) and the GPUs at or above it (``cnt``), re-read for the nodes whose row of the kind's
    :class:`~sharing.slots.KindHostTable` changed (its ``version``). :meth:`deltas` gives dF for a placement on many
    nodes at once in closed form -- the same integers :func:`fragmentation_delta` computes one node at a time."""

    def __init__(self, kind: KindShapes, table: KindHostTable) -> None:
        import numpy as np

        self.kind = kind
        self.table = table
        n = len(table.nodes)
        t = kind.arrays()[0]
        # float64 holds these integers exactly (at most 8,000 milli x 10,000 weight x a few dozen shapes << 2**53)
        # and lets the weighted sum be one BLAS product.
        self.below = np.zeros((n, len(t)))
        self.cnt = np.zeros((n, len(t)))
        self.total = np.zeros(n)  # free milli per node
        self.cpu = np.zeros(n)  # free host CPU / memory per node (inf: not declared)
        self.mem = np.zeros(n)
        self.f = np.zeros(n)  # F per node
        self.seen = np.full(n, -1, dtype=np.int64)
        self._moves: dict[tuple[int, int, int], tuple] = {}  # (v, g, r) -> the change of below / cnt per shape
        self.t, self.num, self.scpu, self.smem, self.w = kind.arrays()
        self.refresh()

    def refresh(self) -> None:
        import numpy as np

        table = self.table
        rows = np.flatnonzero(table.version != self.seen)
        if rows.size == 0:
            return
        free = table.dev_free[rows]
        lt = free[:, :, None] < self.t[None, None, :]
        self.below[rows] = (free[:, :, None] * lt).sum(1)
        self.cnt[rows] = (~lt).sum(1)  # padding columns hold 0 free: below every demand (>= 1), never counted
        self.total[rows] = free.sum(1)
        self.cpu[rows] = table.cpu_cap[rows] - table.cpu_used[rows]
        self.mem[rows] = table.mem_cap[rows] - table.mem_used[rows]
        self.f[rows] = self._f(self.below[rows], self.cnt[rows], self.total[rows], self.cpu[rows], self.mem[rows])
        self.seen[rows] = table.version[rows]

    def _f(self, below: object, cnt: object, total: object, cpu: object, mem: object) -> object:
        import numpy as np

        fits = (cnt >= self.num) & (cpu[:, None] >= self.scpu)
        if self.kind.mem_counts:
            fits &= (self.smem <= 0) | (mem[:, None] >= self.smem)
        frag = np.where(fits, below, total[:, None])
        return frag @ self.w + self.kind.other * total

    def deltas(self, rows: object, v: int, g: int, r: int, cpu_millis: int, host_memory_gib: float) -> object:
        """dF per row of ``rows`` (integers, as float64) when ``r`` devices with ``v`` free lose ``g`` milli each, and
        the host requests are taken."""
        import numpy as np

        self.refresh()
        below, cnt = self.below[rows], self.cnt[rows]
        if g or r:
            move = self._moves.get((v, g, r))
            if move is None:
                t = self.t
                vg = v - g
                move = self._moves[(v, g, r)] = (r * (np.where(vg < t, vg, 0) - np.where(v < t, v, 0)),
                                                 r * ((vg >= t).astype(np.int64) - (v >= t)))
            below = below + move[0]
            cnt = cnt + move[1]
        after = self._f(below, cnt, self.total[rows] - r * g, self.cpu[rows] - cpu_millis,
                        self.mem[rows] - host_memory_gib)
        return after - self.f[rows]
