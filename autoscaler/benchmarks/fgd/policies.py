"""The FGD paper's baselines and FGD itself, re-implemented from the protocol facts.

Scores are integers 0-100 as in the original plugins (``reference/fgd_protocol.md`` §4); the
simulator's node order makes ``argmax`` break ties to the smallest seeded prefix. cpuL is the
node's free CPU, gL its total free GPU milli.
"""

from __future__ import annotations

import numpy as np

from autoscaler.benchmarks.fgd.sim import PodView, State
from autoscaler.benchmarks.fgd.workload import MILLI, TargetShapes

MAX_CPU = 128000.0  # normalisers of the original plugins (largest node spec)
MAX_GPU = 8000.0
_EMPTY = np.empty(0, dtype=np.int64)


def _first_max(scores: np.ndarray) -> int:
    return int(np.argmax(scores))


class _Base:
    name = "base"

    def bind(self, state: State, rng: np.random.Generator) -> None:
        self.rng = rng

    def placed(self, state: State, node: int) -> None:
        pass

    def scores(self, state: State, pod: PodView, feas: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def choose(self, state: State, pod: PodView, feas: np.ndarray) -> tuple[int, np.ndarray]:
        node = int(feas[_first_max(self.scores(state, pod, feas))])
        return node, state.default_gpus(node, pod)


class RandomPolicy(_Base):
    """A uniformly random feasible node; a random fitting GPU for shared pods.

    The original draws from Go's global RNG during the run, so it is not bit-reproducible; this one
    draws from numpy's, seeded per experiment.
    """

    name = "random"

    def choose(self, state: State, pod: PodView, feas: np.ndarray) -> tuple[int, np.ndarray]:
        node = int(feas[self.rng.integers(len(feas))])
        if pod.shared:
            fits = np.flatnonzero(state.gpu_left[node] >= pod.gpu_milli)
            return node, np.array([fits[self.rng.integers(len(fits))]])
        return node, state.default_gpus(node, pod)


class DotProdPolicy(_Base):
    """Tetris-style alignment: the smallest dot product of free and requested (cpu, gpu) wins."""

    name = "dotprod"

    def scores(self, state: State, pod: PodView, feas: np.ndarray) -> np.ndarray:
        dot = (state.cpu_left[feas] / MAX_CPU) * (pod.cpu / MAX_CPU) + (state.gpu_sum[feas] / MAX_GPU) * (
            pod.gpu_total / MAX_GPU
        )
        return ((1.0 - dot / 2.0) * 100.0).astype(np.int64)


class ClusteringPolicy(_Base):
    """GPU clustering: keep pods of one GPU-count tag together, prefer fuller nodes within a band."""

    name = "clustering"

    def scores(self, state: State, pod: PodView, feas: np.ndarray) -> np.ndarray:
        tag = pod.tag
        if tag == 0:
            return np.zeros(len(feas), dtype=np.int64)
        base = 25 * (int(MAX_GPU) - state.gpu_sum[feas]) // int(MAX_GPU)
        tags = state.tags[feas]
        has = (tags & tag) != 0
        band = np.where(has, np.where(tags == tag, 75, 50), np.where(tags == 0, 25, 0))
        return base + band


class PackingPolicy(_Base):
    """GPU packing: shared GPUs first (fuller first), then free GPUs of used nodes, then free nodes."""

    name = "packing"

    def scores(self, state: State, pod: PodView, feas: np.ndarray) -> np.ndarray:
        if pod.gpu_milli <= 0:
            return np.zeros(len(feas), dtype=np.int64)
        gpus = state.gpus[feas]
        ff = state.full_free[feas]
        out = np.empty(len(feas), dtype=np.int64)
        free_node = ff == gpus
        out[free_node] = np.maximum(33 - gpus[free_node], gpus[free_node])
        used = ~free_node
        if pod.shared:
            rows = state.gpu_left[feas[used]]
            # The fitting GPU with the least free milli (ascending sort, first that fits).
            best = np.where(rows >= pod.gpu_milli, rows, MILLI + 1).min(1)
            shared = np.maximum(100 - (best * 100 // MILLI) // 10, 50)
            out[used] = np.where(best == MILLI, np.maximum(50 - 1, 33), shared)
        else:
            out[used] = max(50 - pod.num_gpu, 33)
        return out


class BestFitPolicy(_Base):
    """Least leftover (cpu, gpu) after placement, min-max normalised over the feasible nodes."""

    name = "bestfit"

    def scores(self, state: State, pod: PodView, feas: np.ndarray) -> np.ndarray:
        left = (state.cpu_left[feas] - pod.cpu) / MAX_CPU * 0.5 + (state.gpu_sum[feas] - pod.gpu_total) / MAX_GPU * 0.5
        raw = ((1.0 - left) * 100.0).astype(np.int64)
        hi, lo = int(raw.max()), int(raw.min())
        if hi == lo:
            return np.zeros(len(feas), dtype=np.int64)
        return (raw - lo) * 100 // (hi - lo)


class FragModel:
    """Expected GPU fragmentation per node, F_n(M) = sum_m p_m frag_n(m), kept incrementally.

    frag_n(m): all idle GPU milli of node n if shape m does not fit there (CPU-only shape, model not
    accepted, CPU short, or no GPU set for it); otherwise the idle milli of GPUs whose free milli is
    below m's per-GPU request. Weights are the shapes' *counts* (integers), so F is an exact integer
    in float64 and a placement that changes nothing gives exactly 0: the integer-truncated sigmoid
    score then lands on 50 as in the original, not on 49 by rounding noise. Divide by ``total`` for
    the original's F.

    Per node the model keeps, for each GPU shape m, ``below`` (idle milli on GPUs under m's request)
    and ``cnt`` (GPUs with at least m's request). A candidate placement (take ``g`` milli from a GPU
    with ``v`` free, ``r`` times, and ``c`` CPU) changes both by a closed form, so scoring every
    (node, GPU) candidate is a few array operations instead of a recount.
    """

    def __init__(self, shapes: TargetShapes, models: tuple[str, ...]) -> None:
        gpu = shapes.num_gpu > 0
        self.t = np.maximum(shapes.gpu_milli[gpu], 1)  # per-GPU request of each GPU shape
        self.num = shapes.num_gpu[gpu]
        self.cpu = shapes.cpu[gpu]
        self.w = shapes.counts[gpu].astype(np.float64)
        self.w0 = float(shapes.counts[~gpu].sum())  # CPU-only shapes: all idle milli is fragment
        self.acc = shapes.access(models)[:, gpu]  # (n_models, M)
        self.total = float(shapes.counts.sum())

    def bind(self, state: State) -> None:
        self.state = state
        n = len(state.cpu_left)
        self.model_acc = self.acc[state.model]  # (N, M)
        self.below = np.zeros((n, len(self.t)), dtype=np.int64)
        self.cnt = np.zeros((n, len(self.t)), dtype=np.int64)
        self.F = np.zeros(n, dtype=np.float64)
        self.refresh(np.arange(n))

    def refresh(self, rows: np.ndarray) -> None:
        g = self.state.gpu_left[rows][:, :, None]
        lt = g < self.t[None, None, :]
        self.below[rows] = (g * lt).sum(1)
        self.cnt[rows] = (~lt).sum(1)
        self.F[rows] = self._F(rows, self.below[rows], self.cnt[rows], self.state.gpu_sum[rows],
                               self.state.cpu_left[rows])

    def _F(self, rows: np.ndarray, below: np.ndarray, cnt: np.ndarray, s: np.ndarray, cpu: np.ndarray) -> np.ndarray:
        fit = self.model_acc[rows] & (cpu[:, None] >= self.cpu[None, :]) & (cnt >= self.num[None, :])
        frag = np.where(fit, below, s[:, None]).astype(np.float64)
        return frag @ self.w + self.w0 * s

    def after(self, rows: np.ndarray, v: np.ndarray | int, g: int, r: np.ndarray | int, c: int) -> np.ndarray:
        """F of nodes ``rows`` after taking ``g`` milli from a GPU with ``v`` free, ``r`` times, and ``c`` CPU."""
        d_below, d_cnt, r = frag_deltas(self.t, v, g, r)
        s = self.state.gpu_sum[rows] - r[:, 0] * g
        return self._F(rows, self.below[rows] + d_below, self.cnt[rows] + d_cnt, s, self.state.cpu_left[rows] - c)


def frag_deltas(t: np.ndarray, v: np.ndarray | int, g: int,
                r: np.ndarray | int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The closed-form change of ``below`` and ``cnt`` per GPU shape (per-GPU requests ``t``) when ``g`` milli are
    taken from a GPU with ``v`` free, ``r`` times; also ``r`` as a column. Shared by every incremental measure."""
    v = np.asarray(v, dtype=np.int64).reshape(-1, 1)
    r = np.asarray(r, dtype=np.int64).reshape(-1, 1)
    vg = v - g
    tt = t[None, :]
    d_below = r * (np.where(vg < tt, vg, 0) - np.where(v < tt, v, 0))
    d_cnt = r * ((vg >= tt).astype(np.int64) - (v >= tt))
    return d_below, d_cnt, r


def shared_candidates(state: State, pod: PodView, feas: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(feasible-row, GPU index, free milli) of every GPU a shared pod fits, one per distinct free
    value per node (equal values give equal outcomes; the lowest index is the one kept)."""
    rows = state.gpu_left[feas]
    k = rows.shape[1]
    fits = rows >= pod.gpu_milli
    if k > 1:
        eq = rows[:, :, None] == rows[:, None, :]  # eq[n, i, j]
        earlier = np.tril(np.ones((k, k), dtype=bool), -1)  # j < i
        fits &= ~(eq & earlier[None, :, :]).any(2)
    ri, ci = np.nonzero(fits)
    return ri, ci, rows[ri, ci]


def _segment_max(values: np.ndarray, seg: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Per segment id 0..n-1 (``seg`` ascending, every id present): max value and first position of it."""
    starts = np.flatnonzero(np.r_[True, seg[1:] != seg[:-1]])
    best = np.maximum.reduceat(values, starts)
    return best, starts


class FGDPolicy(_Base):
    """Fragmentation gradient descent: the node (and GPU) whose placement grows F(M) least.

    score = int(100 * sigmoid((F_before - F_after) / 1000)); shared pods try every fitting GPU and
    keep the best (lowest index on ties), other pods take the lowest-index free GPUs.
    """

    name = "fgd"

    def __init__(self, shapes: TargetShapes) -> None:
        self.shapes = shapes

    def bind(self, state: State, rng: np.random.Generator) -> None:
        super().bind(state, rng)
        self.frag = FragModel(self.shapes, state.cluster.models)
        self.frag.bind(state)

    def placed(self, state: State, node: int) -> None:
        self.frag.refresh(np.array([node]))

    def _score(self, before: np.ndarray, after: np.ndarray) -> np.ndarray:
        x = (before - after) / self.frag.total / 1000.0
        return (100.0 / (1.0 + np.exp(-x))).astype(np.int64)

    def choose(self, state: State, pod: PodView, feas: np.ndarray) -> tuple[int, np.ndarray]:
        fm = self.frag
        if pod.shared:
            ri, ci, v = shared_candidates(state, pod, feas)
            nodes = feas[ri]
            sc = self._score(fm.F[nodes], fm.after(nodes, v, pod.gpu_milli, 1, pod.cpu))
            best, starts = _segment_max(sc, ri, len(feas))
            j = _first_max(best)
            seg_end = starts[j + 1] if j + 1 < len(starts) else len(sc)
            k = starts[j] + int(np.argmax(sc[starts[j]:seg_end] == best[j]))
            return int(nodes[k]), np.array([int(ci[k])])
        if pod.gpu_milli > 0:  # whole GPUs: each taken GPU goes from fully free to 1000 - milli
            after = fm.after(feas, MILLI, pod.gpu_milli, pod.num_gpu, pod.cpu)
        else:
            after = fm.after(feas, 0, 0, 0, pod.cpu)
        node = int(feas[_first_max(self._score(fm.F[feas], after))])
        return node, state.default_gpus(node, pod)


BASELINES = ("random", "dotprod", "clustering", "packing", "bestfit", "fgd")
