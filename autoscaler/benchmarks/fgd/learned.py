"""The target workload learned from arrivals, and fragmentation that counts CPU and memory.

FGD (Weng et al., ATC'23) fixes its target workload to the shapes of the trace file and counts a
node's idle GPUs as fragmented for a shape whose CPU no longer fits there (memory is ignored).
A live fleet has no trace file, and on mixes where CPU or memory runs out before the GPUs do
(many CPU-only pods, memory-heavy pods) the GPUs such a node strands are the largest waste. So:

- :class:`LearnedWorkload` is a decayed histogram of the shapes that *arrive* (cpu, gpu milli,
  GPU count, spec), each with the decayed mean memory of its pods. A prior (e.g. FGD's own target
  shapes) seeds it so the first pods are not placed blind; arrivals outweigh it within a few
  half-lives. :meth:`LearnedWorkload.shapes` gives FGD's top-95% cut of the current histogram
  (with ``keep_prior``, plus every prior shape: the prior is a cut already, and cutting it again
  drops its rarest shapes, often the big multi-GPU ones).
- :class:`ResourceFrag` is F_n = sum_t w_t frag_n(t) over those shapes, where frag_n(t) is all idle
  GPU milli of node n when t is CPU-only, its model is not accepted, its GPU request does not fit,
  **or its CPU or its memory does not fit in the node's free CPU / memory**; otherwise the idle milli
  of GPUs with less free than t's per-GPU request. With CPU and memory plentiful it equals the
  GPU-only measure; otherwise it is never below it (a shape that stops fitting moves from "GPUs
  below its request" to "all idle GPUs").

Weights are integers (the decayed counts scaled and rounded) so F stays exact in float64 and an
unchanged node scores exactly 0 change, as in :class:`~autoscaler.benchmarks.fgd.policies.FragModel`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from autoscaler.benchmarks.fgd.policies import frag_deltas
from autoscaler.benchmarks.fgd.sim import PodView, State
from autoscaler.benchmarks.fgd.workload import MILLI, TARGET_COVERAGE, TargetShapes

WEIGHT_SCALE = 10000  # integer weights per unit of probability: F exact, resolution 1e-4


@dataclass(frozen=True)
class LearnedShapes:
    """A snapshot of the learned target workload (FGD's top-coverage cut), with memory per shape."""

    cpu: np.ndarray  # int64 milli
    mem: np.ndarray  # int64 MiB (decayed mean of the pods of the shape; 0 = not yet seen)
    gpu_milli: np.ndarray  # int64 per GPU
    num_gpu: np.ndarray  # int64
    spec: tuple[str, ...]
    weight: np.ndarray  # int64, proportional to the decayed count (sum ~ WEIGHT_SCALE)

    def __len__(self) -> int:
        return len(self.weight)

    @property
    def p(self) -> np.ndarray:
        w = self.weight.astype(np.float64)
        return w / w.sum() if w.sum() > 0 else w

    def access(self, models: tuple[str, ...]) -> np.ndarray:
        """Bool (n_models, n_shapes): the node model is acceptable to the shape."""
        out = np.zeros((len(models), len(self.weight)), dtype=bool)
        for j, s in enumerate(self.spec):
            allowed = {x for x in s.split("|") if x}
            for i, m in enumerate(models):
                out[i, j] = not allowed or m in allowed
        return out


class LearnedWorkload:
    """Decayed histogram of arrived shapes (half-life in arrivals), seeded by a prior.

    Decay is applied lazily: each arrival adds ``growth**t`` instead of shrinking every bin, and
    the bins are rescaled before that grows large.
    """

    def __init__(self, prior: TargetShapes | None = None, half_life: float = 2000.0, prior_weight: float = 500.0,
                 coverage: float = TARGET_COVERAGE, mem_mean: str = "arith", keep_prior: bool = False) -> None:
        self.mem_mean = mem_mean
        self.prior_keys: set[tuple[int, int, int, str]] = set()
        if half_life <= 0:
            raise ValueError("half_life must be > 0")
        self.growth = 2.0 ** (1.0 / half_life)
        self.coverage = coverage
        self.index: dict[tuple[int, int, int, str], int] = {}
        self.count: list[float] = []  # decayed weight (prior + arrivals)
        self.seen: list[float] = []  # decayed weight of arrivals only (memory is their mean)
        self.mem_sum: list[float] = []
        self.inc = 1.0
        if prior is not None and len(prior):
            p = prior.counts.astype(np.float64) / max(float(prior.counts.sum()), 1.0)
            for j in range(len(prior)):
                key = (int(prior.cpu[j]), int(prior.gpu_milli[j]), int(prior.num_gpu[j]), prior.spec[j])
                if keep_prior:
                    self.prior_keys.add(key)
                k = self._bin(key)
                self.count[k] += prior_weight * float(p[j])

    def _bin(self, key: tuple[int, int, int, str]) -> int:
        k = self.index.get(key)
        if k is None:
            k = self.index[key] = len(self.count)
            self.count.append(0.0)
            self.seen.append(0.0)
            self.mem_sum.append(0.0)
        return k

    def observe(self, cpu: int, mem: int, num_gpu: int, gpu_milli: int, spec: str) -> None:
        """One arrival (placed or not: the demand is what matters)."""
        k = self._bin((int(cpu), int(gpu_milli) if num_gpu > 0 else 0, int(num_gpu), spec if num_gpu > 0 else ""))
        self.count[k] += self.inc
        self.seen[k] += self.inc
        self.mem_sum[k] += self.inc * (float(np.log1p(mem)) if self.mem_mean == "geo" else float(mem))
        self.inc *= self.growth
        if self.inc > 1e12:  # rescale everything; ratios are unchanged
            s = 1.0 / self.inc
            self.count = [c * s for c in self.count]
            self.seen = [c * s for c in self.seen]
            self.mem_sum = [c * s for c in self.mem_sum]
            self.inc = 1.0

    def probabilities(self) -> dict[tuple[int, int, int, str], float]:
        """The full decayed distribution over every shape seen (sums to 1)."""
        total = sum(self.count)
        return {key: self.count[k] / total for key, k in self.index.items()} if total > 0 else {}

    def shapes(self) -> LearnedShapes:
        """FGD's cut of the current histogram: shapes by weight, the top ones covering ``coverage``."""
        total = sum(self.count)
        keys = sorted(self.index, key=lambda key: (self.count[self.index[key]], *key), reverse=True)
        kept: list[tuple[int, int, int, str]] = []
        acc = 0.0
        for key in keys:
            if self.count[self.index[key]] <= 0:
                break
            kept.append(key)
            acc += self.count[self.index[key]]
            if total > 0 and acc / total >= self.coverage:
                break
        # The prior is already a cut (FGD's): cutting it again drops its rarest shapes, which are
        # often the large ones (8-GPU pods that only the biggest nodes fit).
        kept += sorted(k for k in self.prior_keys - set(kept) if self.count[self.index[k]] > 0)
        ks = [self.index[key] for key in kept]
        w = np.array([self.count[k] for k in ks], dtype=np.float64)
        w = np.maximum(np.round(w / w.sum() * WEIGHT_SCALE), 1.0) if len(w) else w
        mem = [self.mem_sum[k] / self.seen[k] if self.seen[k] > 0 else 0.0 for k in ks]
        if self.mem_mean == "geo":
            mem = [float(np.expm1(m)) for m in mem]
        return LearnedShapes(
            cpu=np.array([key[0] for key in kept], dtype=np.int64),
            mem=np.array(mem, dtype=np.float64).round().astype(np.int64),
            gpu_milli=np.array([key[1] for key in kept], dtype=np.int64),
            num_gpu=np.array([key[2] for key in kept], dtype=np.int64),
            spec=tuple(key[3] for key in kept),
            weight=w.astype(np.int64),
        )


class ResourceFrag:
    """F_n over learned shapes with CPU *and memory* fit (module doc), kept incrementally per node.

    Same closed form as FGD's :class:`~autoscaler.benchmarks.fgd.policies.FragModel`: per node and
    GPU shape, ``below`` (idle milli on GPUs under the shape's request) and ``cnt`` (GPUs that hold
    it); a candidate placement changes both by a formula, and its CPU and memory are subtracted.
    """

    def __init__(self, shapes: LearnedShapes, models: tuple[str, ...]) -> None:
        gpu = shapes.num_gpu > 0
        self.shapes = shapes
        self.t = np.maximum(shapes.gpu_milli[gpu], 1)
        self.num = shapes.num_gpu[gpu]
        self.cpu = shapes.cpu[gpu]
        self.mem = shapes.mem[gpu]
        self.w = shapes.weight[gpu].astype(np.float64)
        self.w0 = float(shapes.weight[~gpu].sum())  # CPU-only shapes: every idle milli is fragment
        self.acc = shapes.access(models)[:, gpu]
        self.total = float(max(shapes.weight.sum(), 1))

    def bind(self, state: State) -> None:
        self.state = state
        n = len(state.cpu_left)
        self.model_acc = self.acc[state.model]
        self.below = np.zeros((n, len(self.t)), dtype=np.int64)
        self.cnt = np.zeros((n, len(self.t)), dtype=np.int64)
        self.F = np.zeros(n, dtype=np.float64)
        self.refresh(np.arange(n))

    def refresh(self, rows: np.ndarray) -> None:
        st = self.state
        g = st.gpu_left[rows][:, :, None]
        lt = g < self.t[None, None, :]
        self.below[rows] = (g * lt).sum(1)
        self.cnt[rows] = (~lt).sum(1)
        self.F[rows] = self._F(rows, self.below[rows], self.cnt[rows], st.gpu_sum[rows], st.cpu_left[rows],
                               st.mem_left[rows])

    def fits(self, rows: np.ndarray, cnt: np.ndarray, cpu: np.ndarray, mem: np.ndarray,
             resources: bool = True) -> np.ndarray:
        """Bool (rows, GPU shapes): the shape fits the node (model, GPUs; CPU and memory if ``resources``)."""
        ok = self.model_acc[rows] & (cnt >= self.num[None, :])
        if resources:
            ok &= (cpu[:, None] >= self.cpu[None, :]) & (mem[:, None] >= self.mem[None, :])
        return ok

    def _F(self, rows: np.ndarray, below: np.ndarray, cnt: np.ndarray, s: np.ndarray, cpu: np.ndarray,
           mem: np.ndarray, resources: bool = True) -> np.ndarray:
        frag = np.where(self.fits(rows, cnt, cpu, mem, resources), below, s[:, None]).astype(np.float64)
        return frag @ self.w + self.w0 * s

    def gpu_only(self, rows: np.ndarray) -> np.ndarray:
        """The same measure with CPU and memory ignored (for comparison: never above ``F``)."""
        st = self.state
        return self._F(rows, self.below[rows], self.cnt[rows], st.gpu_sum[rows], st.cpu_left[rows],
                       st.mem_left[rows], resources=False)

    def after(self, rows: np.ndarray, v: np.ndarray | int, g: int, r: np.ndarray | int, pod: PodView,
              resources: bool = True) -> np.ndarray:
        """F of nodes ``rows`` after the pod takes ``g`` milli from a GPU with ``v`` free, ``r`` times
        (``resources=False``: the GPU-only measure)."""
        st = self.state
        d_below, d_cnt, r = frag_deltas(self.t, v, g, r)
        s = st.gpu_sum[rows] - r[:, 0] * g
        return self._F(rows, self.below[rows] + d_below, self.cnt[rows] + d_cnt, s, st.cpu_left[rows] - pod.cpu,
                       st.mem_left[rows] - pod.mem, resources)

    def after_pod(self, rows: np.ndarray, pod: PodView) -> np.ndarray:
        """F after a CPU-only or whole-GPU pod (it takes fully free GPUs)."""
        if pod.gpu_milli > 0:
            return self.after(rows, MILLI, pod.gpu_milli, pod.num_gpu, pod)
        return self.after(rows, 0, 0, 0, pod)
