"""``slotwise``: FGD's fragmentation score, with ties settled by CPU headroom and gap balance.

Measured on the FGD protocol (docs/sharing.md), the idle GPU left by FGD at 130% arrival is of two
kinds: GPUs whose node has run out of CPU (about 45 of 290 on ``default``) and per-GPU gaps too
small for most pods (the rest). FGD's integer score int(100 sigmoid(dF/1000)) makes most
candidate nodes tie, and the seeded node order then decides. slotwise keeps FGD's score as the
primary key (ranking by the raw dF instead was measured *worse*: the coarse score spreads load,
which the exact one does not) and replaces the arbitrary tie-break with two informed ones:

1. **CPU headroom.** A node's idle GPUs need CPU to be used; the target workload says how much
   per GPU milli (``cpu_per_milli``, its count-weighted average). The deficit
   max(0, need - CPU left) after the placement is minimised, so CPU-only and CPU-heavy pods stop
   stranding GPUs. This removed most CPU-stranded GPUs in our runs.
2. **Gap balance (sum of squares), for shared pods.** At 130% arrival almost all idle GPU is in per-GPU gaps too
   small for most pods. The Sum-of-Squares rule of online bin packing (Csirik et al., "On the
   Sum-of-Squares algorithm for bin packing", JACM 2006) keeps the count of GPUs per free-milli
   level N(h) flat, sum_h N(h)^2 small, so that the gaps future pods can fill are the ones that
   exist; for discrete size distributions it has provably small waste. Its change for moving one
   GPU from gap h to h-g is 2 (N(h-g) - N(h)) + 2, counted over 0 < gap < 1000 only (full and
   empty GPUs are not fragments).
3. Remaining ties go to the seeded node order, and the lowest GPU index.

Within one FGD score the secondary cost is ``ss_weight`` x 1000 x dSS + the CPU deficit in milli-CPU
(one SS unit weighs as much as 1 core of deficit); these weights were set on two seeds of two
variants and left alone.

Nothing here reads the trace being replayed beyond FGD's own input (the target shapes from the
original pod list), so it carries over to unseen variants.
"""

from __future__ import annotations

import numpy as np

from sharing.fgd.policies import FragModel, _Base, shared_candidates
from sharing.fgd.sim import PodView, State
from sharing.fgd.workload import MILLI, TargetShapes

GAP_STEP = 10  # milli per gap level; trace requests are multiples of 10


class SlotwisePolicy(_Base):
    name = "slotwise"

    def __init__(self, shapes: TargetShapes, ss_weight: float = 1.0, cpu_weight: float = 1.0) -> None:
        self.shapes = shapes
        self.ss_weight = ss_weight
        self.cpu_weight = cpu_weight

    def bind(self, state: State, rng: np.random.Generator) -> None:
        super().bind(state, rng)
        self.frag = FragModel(self.shapes, state.cluster.models)
        self.frag.bind(state)
        sh = self.shapes
        gpu = sh.num_gpu > 0
        demand = float((sh.counts[gpu] * sh.gpu_milli[gpu] * sh.num_gpu[gpu]).sum())
        self.cpu_per_milli = float((sh.counts[gpu] * sh.cpu[gpu]).sum()) / demand if demand else 0.0
        # N(h) per GPU model: gaps on a T4 cannot serve a pod pinned to G2, so counts are per model.
        self.levels = MILLI // GAP_STEP + 1
        k = state.gpu_left.shape[1]
        self.node_levels = np.where(np.arange(k)[None, :] < state.gpus[:, None], state.gpu_left // GAP_STEP, -1)
        self.gap_count = np.zeros((len(state.cluster.models), self.levels), dtype=np.float64)
        real = self.node_levels >= 0
        models = np.broadcast_to(state.model[:, None], real.shape)[real]
        np.add.at(self.gap_count, (models, self.node_levels[real]), 1)

    def _fgd_score(self, nodes: np.ndarray, after: np.ndarray) -> np.ndarray:
        x = (self.frag.F[nodes] - after) / self.frag.total / 1000.0
        return (100.0 / (1.0 + np.exp(-x))).astype(np.int64)

    def _cpu_deficit(self, state: State, nodes: np.ndarray, pod: PodView) -> np.ndarray:
        """CPU (milli) the node's idle GPUs would need beyond what is left, after the pod."""
        idle = state.gpu_sum[nodes] - pod.gpu_total
        return np.maximum(idle * self.cpu_per_milli - (state.cpu_left[nodes] - pod.cpu), 0.0)

    def choose(self, state: State, pod: PodView, feas: np.ndarray) -> tuple[int, np.ndarray]:
        fm = self.frag
        if pod.shared:
            ri, ci, v = shared_candidates(state, pod, feas)
            nodes = feas[ri]
            score = self._fgd_score(nodes, fm.after(nodes, v, pod.gpu_milli, 1, pod.cpu))
            second = 1000.0 * self.ss_weight * self._d_ss(state.model[nodes], v, pod.gpu_milli)
            second += self.cpu_weight * self._cpu_deficit(state, nodes, pod)
            k = _lex_first(score, second)  # candidates are in (node order, GPU index): first = tie rule
            return int(nodes[k]), np.array([int(ci[k])])
        if pod.gpu_milli > 0:
            after = fm.after(feas, MILLI, pod.gpu_milli, pod.num_gpu, pod.cpu)
        else:
            after = fm.after(feas, 0, 0, 0, pod.cpu)
        k = _lex_first(self._fgd_score(feas, after), self.cpu_weight * self._cpu_deficit(state, feas, pod))
        node = int(feas[k])
        return node, state.default_gpus(node, pod)

    def _d_ss(self, model: np.ndarray, v: np.ndarray, g: int) -> np.ndarray:
        """Change of sum_h N(h)^2 over partial gaps when a GPU goes from ``v`` to ``v - g`` free."""
        h = v // GAP_STEP
        h2 = (v - g) // GAP_STEP
        top = self.levels - 1
        part_h = (h > 0) & (h < top)
        part_h2 = (h2 > 0) & (h2 < top)
        n = self.gap_count
        out = np.where(part_h2, 2.0 * n[model, np.clip(h2, 0, top)] + 1.0, 0.0)
        out -= np.where(part_h, 2.0 * n[model, np.clip(h, 0, top)] - 1.0, 0.0)
        return out

    def placed(self, state: State, node: int) -> None:
        self.frag.refresh(np.array([node]))
        # Recount this node's gap levels: at most 8 GPUs, and never drifts from the state.
        old = self.node_levels[node]
        new = np.where(old >= 0, state.gpu_left[node] // GAP_STEP, -1)
        m = int(state.model[node])
        for o, nw in zip(old.tolist(), new.tolist(), strict=True):
            if o != nw:
                self.gap_count[m, o] -= 1
                self.gap_count[m, nw] += 1
        self.node_levels[node] = new


def _lex_first(score: np.ndarray, second: np.ndarray) -> int:
    """Index of the highest ``score``, ties to the lowest ``second``, then to the lowest index."""
    top = score == score.max()
    return int(np.argmin(np.where(top, second, np.inf)))
